//! How the engine reaches ZooKeeper.

use std::time::Duration;

use zookeeper_client as zk;

use super::Error;

/// Connection settings for one ZooKeeper session.
#[derive(Clone, Debug)]
pub struct ZkConfig {
    /// `host:port[,host:port...][/chroot]`, as every ZooKeeper client takes it.
    pub connect: String,
    /// The session timeout to ask for; the server may negotiate it into its own bounds.
    pub session_timeout: Duration,
    /// Digest credentials `user:password`. With them, contender nodes get the ACL
    /// "creator all, world read" so that other clients can see the queue but not tamper with it.
    pub digest_auth: Option<String>,
    /// TLS to the ensemble: CA bundle, and optionally a client certificate and key (PEM).
    pub tls: Option<TlsPem>,
    /// Keep the session when the client goes away (process exit, lost leadership) instead of
    /// closing it: its nodes then live until the session times out, and a new leader's
    /// re-anchoring replaces them in one step, so that no foreign waiter sees the lock free
    /// in between.
    pub detached: bool,
    /// How long a lock directory stays empty of our contenders before it is removed: locks in
    /// use come and go without the directory being made and removed each time.
    pub idle_directory_grace: Duration,
}

/// PEM text of the TLS material (read from files by the caller).
#[derive(Clone, Debug)]
pub struct TlsPem {
    pub ca: String,
    /// Client certificate and key, for servers that require one (`ssl.clientAuth=need`).
    pub identity: Option<(String, String)>,
}

impl TlsPem {
    fn options(&self) -> Result<zk::TlsOptions, String> {
        let options = zk::TlsOptions::new()
            .with_pem_ca(&self.ca)
            .map_err(|e| format!("the CA bundle (--zk-tls-ca) is not usable PEM: {e}"))?;
        match &self.identity {
            None => Ok(options),
            Some((cert, key)) => options.with_pem_identity(cert, key).map_err(|e| {
                format!("the client certificate and key (--zk-tls-cert, --zk-tls-key) are not usable PEM: {e}")
            }),
        }
    }
}

impl ZkConfig {
    pub fn new(connect: impl Into<String>) -> Self {
        ZkConfig {
            connect: connect.into(),
            session_timeout: Duration::from_secs(10),
            digest_auth: None,
            tls: None,
            detached: false,
            idle_directory_grace: Duration::from_secs(30),
        }
    }

    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    pub fn with_tls(mut self, tls: TlsPem) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Opens a new session. Fails once every host has been tried, so that a wrong address is
    /// reported at once instead of after the session timeout. With TLS, every host is reached
    /// over TLS, its certificate checked against the CA and its address.
    pub async fn connect(&self) -> Result<zk::Client, Error> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(self.session_timeout.min(Duration::from_secs(5)))
            .with_fail_eagerly();
        if let Some(auth) = &self.digest_auth {
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        if self.detached {
            connector = connector.with_detached();
        }
        let connected = match &self.tls {
            Some(tls) => connector.with_tls(tls.options().map_err(Error::Tls)?).secure_connect(&self.connect).await,
            None => connector.connect(&self.connect).await,
        };
        connected.map_err(|source| match &self.tls {
            Some(_) => Error::ConnectTls { connect: self.connect.clone(), source },
            None => Error::Connect { connect: self.connect.clone(), source },
        })
    }

    /// The ACL of lock directories: with credentials, only our identity may write their data
    /// (the marker of foreign clients) or change their ACL; everybody may read them and create
    /// and delete children (a Curator contender makes and deletes its own node there, and
    /// ZooKeeper checks a delete against the directory). Without credentials, open to all.
    pub fn directory_acls(&self) -> zk::Acls<'static> {
        static ACLS: std::sync::LazyLock<[zk::Acl; 2]> = std::sync::LazyLock::new(|| {
            let open = zk::Permission::READ | zk::Permission::CREATE | zk::Permission::DELETE;
            [zk::Acl::new_const(zk::Permission::ALL, "auth", ""), zk::Acl::new(open, zk::AuthId::anyone())]
        });
        if self.digest_auth.is_some() {
            zk::Acls::new(&*ACLS)
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// The ACL of the directories above lock directories (the root, `locks`, each namespace's):
    /// everybody may read them and create in them (a Curator client may make a lock
    /// directory first), only our identity delete or write.
    pub fn parent_acls(&self) -> zk::Acls<'static> {
        static ACLS: std::sync::LazyLock<[zk::Acl; 2]> = std::sync::LazyLock::new(|| {
            let open = zk::Permission::READ | zk::Permission::CREATE;
            [zk::Acl::new_const(zk::Permission::ALL, "auth", ""), zk::Acl::new(open, zk::AuthId::anyone())]
        });
        if self.digest_auth.is_some() {
            zk::Acls::new(&*ACLS)
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// The ACL of contender nodes and of the leader epoch: with credentials, only our identity
    /// may change or delete them (nobody else can fence the leader); without, ZooKeeper has no
    /// identity to restrict to.
    pub fn node_acls(&self) -> zk::Acls<'static> {
        if self.digest_auth.is_some() {
            static CREATOR_ALL_WORLD_READ: [zk::Acl; 2] = [
                zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
                zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
            ];
            zk::Acls::new(&CREATOR_ALL_WORLD_READ)
        } else {
            zk::Acls::anyone_all()
        }
    }
}
