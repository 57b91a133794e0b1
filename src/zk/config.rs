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
}

/// PEM text of the TLS material (read from files by the caller).
#[derive(Clone, Debug)]
pub struct TlsPem {
    pub ca: String,
    pub identity: Option<(String, String)>,
}

impl ZkConfig {
    pub fn new(connect: impl Into<String>) -> Self {
        ZkConfig {
            connect: connect.into(),
            session_timeout: Duration::from_secs(10),
            digest_auth: None,
            tls: None,
            detached: false,
        }
    }

    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    pub fn with_digest_auth(mut self, user_password: impl Into<String>) -> Self {
        self.digest_auth = Some(user_password.into());
        self
    }

    /// Opens a new session. Fails once every host has been tried, so that a wrong address is
    /// reported at once instead of after the session timeout.
    pub async fn connect(&self) -> Result<zk::Client, Error> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(self.session_timeout.min(Duration::from_secs(5)))
            .with_fail_eagerly();
        if let Some(auth) = &self.digest_auth {
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        connector
            .connect(&self.connect)
            .await
            .map_err(|source| Error::Connect { connect: self.connect.clone(), source })
    }

    /// The ACL of contender nodes: with credentials, only our identity may change or delete
    /// them; without, ZooKeeper has no identity to restrict to.
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
