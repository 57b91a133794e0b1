//! How the engine reaches ZooKeeper.

use std::time::{Duration, Instant};

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
    /// Earlier digest credentials, while they are rotated out (docs/operations.md: rotating
    /// credentials): the session authenticates with them too, and every ACL the engine writes
    /// names them beside `digest_auth`, so that replicas not yet rolled keep writing, and every
    /// node made under them is taken over (see `acl::take_over`).
    pub previous_auth: Vec<String>,
    /// Which other ZooKeeper clients may contend in lock directories (needs `digest_auth` to
    /// close them: ZooKeeper has no identity to grant to otherwise).
    pub contenders: Contenders,
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
            previous_auth: vec![],
            contenders: Contenders::Anyone,
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
            .with_connection_timeout(connection_timeout(self.session_timeout))
            .with_fail_eagerly();
        for auth in self.digest_auth.iter().chain(&self.previous_auth) {
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
    /// (the marker of foreign clients) or change their ACL; the contenders may create and delete
    /// children (a Curator contender makes and deletes its own node there, and ZooKeeper checks a
    /// delete against the directory, so whoever may do that may also delete ours); everybody may
    /// read them. Without credentials, open to all.
    pub fn directory_acls(&self) -> Vec<zk::Acl> {
        self.acls(zk::Permission::READ | zk::Permission::CREATE | zk::Permission::DELETE)
    }

    /// The ACL of the directories above lock directories (the root, `locks`, each namespace's):
    /// the contenders may create in them (a Curator client may make a lock directory first),
    /// only our identity delete or write; everybody may read.
    pub fn parent_acls(&self) -> Vec<zk::Acl> {
        self.acls(zk::Permission::READ | zk::Permission::CREATE)
    }

    /// The ACL of contender nodes and of the leader epoch: with credentials, only our identity
    /// may change or delete them (nobody else can fence the leader); without, ZooKeeper has no
    /// identity to restrict to.
    pub fn node_acls(&self) -> Vec<zk::Acl> {
        self.acls(zk::Permission::READ)
    }

    /// Our identity all, the contenders `contend`, the world read (or, with `Contenders::Anyone`,
    /// `contend`). Our identity is named by its digest rather than ZooKeeper's `auth` scheme so
    /// that an ACL read back compares with the one wanted (`acl::protect`).
    fn acls(&self, contend: zk::Permission) -> Vec<zk::Acl> {
        let Some(own) = &self.digest_auth else { return zk::Acls::anyone_all().to_vec() };
        let own = digest_id(own);
        let mut acls = vec![zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", &own))];
        for previous in self.previous_auth.iter().map(|p| digest_id(p)).filter(|p| *p != own) {
            acls.push(zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", &previous)));
        }
        match &self.contenders {
            Contenders::Anyone => acls.push(zk::Acl::new(contend, zk::AuthId::anyone())),
            Contenders::Listed(peers) => {
                acls.extend(
                    peers
                        .iter()
                        .map(|peer| digest_id(peer))
                        .filter(|peer| *peer != own)
                        .map(|peer| zk::Acl::new(contend, zk::AuthId::new("digest", &peer))),
                );
                acls.push(zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()));
            }
        }
        acls
    }
}

/// Which ZooKeeper clients besides zklock may contend in lock directories (make their own nodes
/// there and delete them, as Curator's and kazoo's recipes do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Contenders {
    /// Any client, authenticated or not: lock directories are open for create and delete.
    #[default]
    Anyone,
    /// Only the clients that authenticate with these digest credentials (`user:password`):
    /// nobody else can make, or delete, a node in a lock directory.
    Listed(Vec<String>),
}

/// The identity ZooKeeper's digest scheme gives a session that authenticates with
/// `user:password`: `user:base64(sha1(user:password))`, as `DigestAuthenticationProvider` makes it.
pub fn digest_id(user_password: &str) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    let user = user_password.split_once(':').map_or(user_password, |(user, _)| user);
    let hash = sha1::Sha1::digest(user_password.as_bytes());
    format!("{user}:{}", base64::engine::general_purpose::STANDARD.encode(hash))
}

/// How long the client waits for any answer from a server before it calls the connection lost:
/// 2/5 of the session timeout (zookeeper-client's own default), at most 5 s. Short enough that a
/// lost connection is noticed while most of the session is still left on the server: holders
/// of locks that others share must be ended before it can expire there (see
/// [`hold_deadline_after`]).
pub fn connection_timeout(session_timeout: Duration) -> Duration {
    (session_timeout * 2 / 5).min(Duration::from_secs(5))
}

/// The moment by which a holder of a lock others share must be ended, for a connection found
/// lost at `detected` in a session whose negotiated timeout is `session_timeout`.
///
/// The server expires the session `session_timeout` after the last request it received from
/// us, and that request was answered no later than the last byte we read; the client calls the
/// connection lost at most the connection timeout plus one of its ticks (1/8 of it) after that
/// last byte: counted with 1/4 to spare. So the server cannot expire the session, and so no
/// other client can be granted the lock, before `detected + session_timeout - detection`; the
/// margin (a tenth of the session, at least 1 s) covers the final status write and the round
/// trip of that last request.
pub fn hold_deadline_after(detected: Instant, session_timeout: Duration) -> Instant {
    let detection = connection_timeout(session_timeout) * 5 / 4;
    let margin = (session_timeout / 10).max(Duration::from_secs(1));
    let left = session_timeout.saturating_sub(detection).saturating_sub(margin);
    detected + left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_identity_is_the_one_zookeeper_computes() {
        // `java -cp zookeeper.jar org.apache.zookeeper.server.auth.DigestAuthenticationProvider
        // zklock:s3cret` (ZooKeeper 3.8) prints `zklock:s3cret->zklock:IeO22ylkrotgYAlDvEA09F4WNIs=`.
        assert_eq!(digest_id("zklock:s3cret"), "zklock:IeO22ylkrotgYAlDvEA09F4WNIs=");
    }

    #[test]
    fn listed_contenders_may_contend_and_the_world_only_read() {
        let mut config = ZkConfig::new("127.0.0.1:2181");
        config.digest_auth = Some("zklock:s3cret".into());
        config.contenders = Contenders::Listed(vec!["curator:pw".into(), "zklock:s3cret".into()]);
        let acls = config.directory_acls();
        let ids: Vec<_> = acls.iter().map(|a| (a.scheme(), a.id(), a.permission())).collect();
        let contend = zk::Permission::READ | zk::Permission::CREATE | zk::Permission::DELETE;
        assert_eq!(
            ids,
            [
                ("digest", "zklock:IeO22ylkrotgYAlDvEA09F4WNIs=", zk::Permission::ALL),
                ("digest", digest_id("curator:pw").as_str(), contend),
                ("world", "anyone", zk::Permission::READ),
            ],
            "our own identity listed again is not given less than all"
        );
        config.contenders = Contenders::Anyone;
        assert_eq!(config.directory_acls()[1].permission(), contend);
        config.digest_auth = None;
        assert_eq!(config.directory_acls(), zk::Acls::anyone_all().to_vec());
    }

    #[test]
    fn holders_of_shared_locks_are_ended_before_the_session_can_expire_on_the_server() {
        let at = Instant::now();
        let left = |session: u64| hold_deadline_after(at, Duration::from_secs(session)) - at;
        // The chart's 10 s: lost at most 5 s after the last byte read, 1 s to write.
        assert_eq!(connection_timeout(Duration::from_secs(10)), Duration::from_secs(4));
        assert_eq!(left(10), Duration::from_secs(4));
        // The chaos suite's 4 s sessions: 2 s to detect, 1 s to write, 1 s left.
        assert_eq!(left(4), Duration::from_secs(1));
        // Long sessions: detected within 6.25 s, 3 s to spare.
        assert_eq!(left(30), Duration::from_millis(20_750));
        for ms in (1_000..120_000).step_by(250) {
            let session = Duration::from_millis(ms);
            let detection = connection_timeout(session) + connection_timeout(session) / 8;
            let deadline = hold_deadline_after(at, session) - at;
            assert!(deadline + detection < session, "{session:?}: ended after the session could expire");
        }
    }
}
