//! The lock engine: ZooKeeper's lock recipe on one session, for many contenders.
//!
//! Its files in layers, each readable knowing only the layers under it (none imports one
//! above it):
//! 1. what everything shares, without tasks: `layout` (where everything is in ZooKeeper),
//!    `data` (what nodes and directories hold), `contender` (what the engine tells), `config`,
//!    `retry`, `stats`, `declaration` (the permits each cluster declares for a shared
//!    `ClusterLock`), `book` (the bookkeeping, pure), `acl` (who may change our nodes), `fence`
//!    (the leader epoch every write is guarded by), `token_base` (what every zxid handed out
//!    is raised by, so that tokens never go back) and `core` (the session, the book and the
//!    fence, as the tasks share them);
//! 2. `ops`: the ZooKeeper operations, each retried through connection loss and guarded, and
//!    `root` (the one installation that serves the root);
//! 3. the tasks, each using only those before it: `anchor` (re-anchoring after a new
//!    session), `rounds` (a lock's reads and decisions), `session` (the watches and the
//!    session's state), `enqueue` (made nodes become contenders and get their first decision),
//!    `permits` (this cluster's declarations kept, the other clusters' followed);
//! 4. `engine`, its face.
//!
//! Below them all, [`recipe`]: the pure lock recipe (which node holds, which node to watch),
//! with no I/O. The crate knows no Kubernetes: the compiler keeps it so.
#![forbid(unsafe_code)]

mod acl;
mod anchor;
mod book;
mod config;
mod contender;
mod core;
pub mod data;
mod declaration;
mod engine;
mod enqueue;
mod fence;
mod layout;
mod ops;
mod permits;
pub mod recipe;
mod retry;
mod root;
mod rounds;
mod session;
mod stats;
pub mod token_base;

pub use config::{digest_id, Contenders, TlsPem, ZkConfig};
pub use contender::{
    ContenderSpec, ContenderState, EngineEvent, LostReason, QueueEntry, Reanchored, Recorded, SessionEvent,
};
pub use declaration::Declaration;
pub use engine::LockEngine;
pub use layout::Layout;
pub use retry::{Contention, CONTENDED_ATTEMPTS};
pub use root::Installation;
pub use stats::StatsSnapshot;

use zookeeper_client as zk;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach ZooKeeper at {connect}: {source} (check the connect string and that the ensemble is up)")]
    Connect { connect: String, source: zk::Error },
    #[error(
        "cannot reach ZooKeeper over TLS at {connect}: {source} (check that these are TLS client ports \
         (secureClientPort), that --zk-tls-ca holds the CA that signed the servers' certificates and that they \
         name the addresses connected to, and whether the servers require a client certificate)"
    )]
    ConnectTls { connect: String, source: zk::Error },
    #[error("TLS settings: {0}")]
    Tls(String),
    #[error("the ZooKeeper session is lost; call reconnect() before enqueueing again")]
    SessionLost,
    #[error("the new ZooKeeper session is not re-anchored yet; nothing new joins a queue before (call admit())")]
    NotAdmitted,
    #[error("contender id {0:?} must be 1-64 characters of [a-z0-9-] without \"lock-\" (a Kubernetes UID is)")]
    BadContenderId(String),
    #[error("lock path {0:?} must be an absolute ZooKeeper path like /zklock/locks/ns/name")]
    BadLockPath(String),
    #[error("{op} {path}: {source}")]
    ZooKeeper { op: &'static str, path: String, source: zk::Error },
    #[error("no contender with id {0:?}")]
    UnknownContender(String),
    #[error("{op} {path}: fenced: another leader took the leader epoch, so this process may not change any lock")]
    Fenced { op: &'static str, path: String },
    #[error(
        "the ZooKeeper root {root} serves another zklock installation ({}, its leader {}): give each installation \
         a root of its own (--zk-root, or a chroot in --zk-connect; the chart's zookeeper.chroot)",
        other.installation, other.holder
    )]
    RootInUse { root: String, other: Installation },
    #[error(
        "the cluster name {cluster:?} is taken on the shared root {shared} by the cluster whose own root is \
         {other_root}: give each cluster sharing ClusterLocks a name of its own (--cluster-name, the chart's \
         clusterName)"
    )]
    ClusterNameInUse { cluster: String, shared: String, other_root: String },
    #[error(
        "the shared root {shared} was made by an operator with other ZooKeeper credentials (its ACL: {acl}), so this \
         one could not keep the directories of ClusterLocks there (their foreign-client marker, permits, cluster \
         name): every leader change would end its holders Lost. Give every cluster sharing the root the same \
         --zk-auth identity (the chart's zookeeper.auth secret), or a shared root of their own"
    )]
    SharedRootCredentials { shared: String, acl: String },
    #[error(
        "ZooKeeper's zxids, raised by the token base at {path}, reach {ensemble} only, not above {floor}, handed out \
         before (the Kubernetes API keeps it: ConfigMap zklock-token-floor): the ensemble's data were made anew, and \
         its base is shared with other clusters, so this operator may not raise it alone. Stop the operator of every cluster \
         sharing the root, run `zklock admin raise-token-base --above N` with N the highest floor among them, then \
         start them again (docs/operations.md: moving to a new ensemble)"
    )]
    TokensBehindFloor { path: String, floor: i64, ensemble: i64 },
    #[error(
        "the root {root} was made under other ZooKeeper credentials than this operator's (its ACL: {acl}), so it \
         could never write its leader epoch there: when rotating the operator's credentials, run with the old ones \
         as --zk-previous-auth (the chart's zookeeper.auth.previousKey) until every node is taken over, then \
         without (docs/operations.md: rotating ZooKeeper credentials)"
    )]
    RootCredentials { root: String, acl: String },
    #[error(
        "ZooKeeper's zxids went back below the tokens this term handed out ({ensemble} now, {handed} handed out): its \
         data were restored from an older snapshot; the next term raises the token base above the token floor"
    )]
    ZxidsWentBack { handed: i64, ensemble: i64 },
    #[error("the token base {path} cannot be read: {why}; write the base it should hold with `zklock admin raise-token-base`")]
    TokenBase { path: String, why: String },
    #[error(
        "{op} {path}: other writers changed the node {} times in a row while this one read and wrote it; \
         look for another process writing it (an operator of another installation on the same root?)",
        retry::CONTENDED_ATTEMPTS
    )]
    Contended { op: &'static str, path: String },
}

impl Error {
    fn zk(op: &'static str, path: &str, source: zk::Error) -> Self {
        if source == fence::FENCED {
            return Error::Fenced { op, path: path.to_string() };
        }
        Error::ZooKeeper { op, path: path.to_string(), source }
    }

    /// Whether the error ends everything done in this session (or by this leader), rather than
    /// one operation on one lock.
    pub fn ends_session(&self) -> bool {
        match self {
            Error::SessionLost | Error::NotAdmitted | Error::Fenced { .. } | Error::Connect { .. } => true,
            Error::RootInUse { .. } | Error::ClusterNameInUse { .. } | Error::SharedRootCredentials { .. } => true,
            Error::TokensBehindFloor { .. } | Error::TokenBase { .. } | Error::RootCredentials { .. } => true,
            Error::ZxidsWentBack { .. } => true,
            Error::ConnectTls { .. } | Error::Tls(_) => true,
            Error::ZooKeeper { source, .. } => retry::is_session_end(source) || retry::is_unknown_outcome(source),
            Error::BadContenderId(_) | Error::BadLockPath(_) | Error::UnknownContender(_) => false,
            Error::Contended { .. } => false,
        }
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Connect { .. } | Error::ConnectTls { .. } | Error::Tls(_) => "connect",
            Error::SessionLost => "session_lost",
            Error::NotAdmitted => "not_admitted",
            Error::BadContenderId(_) | Error::BadLockPath(_) => "bad_input",
            Error::ZooKeeper { .. } => "zookeeper",
            Error::UnknownContender(_) => "unknown_contender",
            Error::Fenced { .. } => "fenced",
            Error::RootInUse { .. } => "root_in_use",
            Error::ClusterNameInUse { .. } => "cluster_name_in_use",
            Error::SharedRootCredentials { .. } => "shared_root_credentials",
            Error::TokensBehindFloor { .. } => "tokens_behind_floor",
            Error::TokenBase { .. } => "token_base",
            Error::RootCredentials { .. } => "root_credentials",
            Error::ZxidsWentBack { .. } => "zxids_went_back",
            Error::Contended { .. } => "contended",
        }
    }
}
