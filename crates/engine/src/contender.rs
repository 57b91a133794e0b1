//! What the engine tells about contenders: who wants which lock, where each stands, and the
//! events that report every change. The event stream is the one way to follow a contender;
//! [`super::LockEngine::state`] answers where one stands now.

use std::fmt;
use std::sync::Arc;

use crate::recipe::{self, Mode};

/// Who wants which lock, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContenderSpec {
    /// Unique per contender and part of its node name (a claim UID): it lets the engine find
    /// the node it made when a create's answer was lost. Shared, so that the operator's many
    /// indexes of one claim hold one copy of it.
    pub id: Arc<str>,
    /// Absolute path of the lock directory, e.g. `/zklock/locks/shop/db-migrations`.
    pub lock: String,
    pub mode: Mode,
    /// Written into the node's data for people reading the queue, e.g. `shop/nightly`.
    pub description: String,
}

/// A contender to re-create after a new session, with what its owner recorded about it: the
/// engine puts recorded holders first, then the others in the order of their tickets (or, for
/// contenders recorded by an earlier release, of the nodes they had).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub spec: ContenderSpec,
    /// Recorded as holding the lock.
    pub held: bool,
    /// The node it had (full path or name), if one was recorded.
    pub node: Option<String>,
    /// Its ticket, if one was recorded: its place in the queue whatever session made its node
    /// (see [`super::LockEngine::ticket`]).
    pub ticket: Option<i64>,
}

/// Where a contender stands. `RevokeRequested` is sticky: once somebody asked the contender to
/// let go, it stays so (with the fencing token once it is granted) until it is released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContenderState {
    Waiting { ahead: usize, watching: String },
    Held { fencing_token: i64 },
    RevokeRequested { reason: String, fencing_token: Option<i64> },
    Lost { why: LostReason },
    Released,
}

impl ContenderState {
    /// The fencing token while the contender holds the lock.
    pub fn fencing_token(&self) -> Option<i64> {
        match self {
            ContenderState::Held { fencing_token } => Some(*fencing_token),
            ContenderState::RevokeRequested { fencing_token, .. } => *fencing_token,
            _ => None,
        }
    }

    pub fn is_held(&self) -> bool {
        self.fencing_token().is_some()
    }

    /// Lost or released: the node is gone and nothing more will happen.
    pub fn is_final(&self) -> bool {
        matches!(self, ContenderState::Lost { .. } | ContenderState::Released)
    }

    /// While waiting, the id of the zklock contender whose node it waits on to go away; `None`
    /// when it waits on a node of another client (or does not wait).
    pub fn waits_for_contender(&self) -> Option<&str> {
        match self {
            ContenderState::Waiting { watching, .. } => recipe::parse_child(watching)?.ours.map(|(id, _)| id),
            _ => None,
        }
    }

    /// While waiting, whether the node it waits on belongs to a client other than zklock.
    pub fn waits_for_foreign(&self) -> bool {
        match self {
            ContenderState::Waiting { watching, .. } => recipe::parse_child(watching).is_none_or(|c| c.ours.is_none()),
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// Somebody else deleted the node.
    DeletedByOther,
    /// The session ended, and ephemeral nodes with it.
    SessionExpired,
    /// ZooKeeper refused an operation the contender cannot do without.
    Failed(String),
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::DeletedByOther => f.write_str("the node was deleted by another client"),
            LostReason::SessionExpired => f.write_str("the ZooKeeper session ended"),
            LostReason::Failed(why) => write!(f, "ZooKeeper error: {why}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// A new session is up (the first one, or one made by `reconnect`).
    Connected {
        session_id: i64,
    },
    /// The connection dropped; the session (and every node) lives on if it comes back in time.
    Disconnected,
    Reconnected,
    /// The session ended: every contender of it is `Lost`.
    Lost {
        session_id: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    Contender {
        id: String,
        state: ContenderState,
    },
    Session(SessionEvent),
    /// What the clusters sharing the `ClusterLock` in `lock_path` declare changed (see
    /// [`super::LockEngine::declarations`]).
    Permits {
        lock_path: String,
    },
    /// A re-anchoring pass admitted `lock_path` ([`super::LockEngine::admit_lock`]): the
    /// contender events of that lock before this one were the pass's own doing (every node it
    /// re-made reports one), those after it are changes.
    Admitted {
        lock_path: String,
    },
}

/// What [`super::LockEngine::reanchor`] did.
#[derive(Debug)]
pub struct Reanchored {
    /// The re-created contenders in their new queue order, with their first state.
    pub contenders: Vec<(Arc<str>, ContenderState)>,
    /// A node not made by zklock was seen in the directory, now or ever before.
    pub foreign_seen: bool,
    /// Recorded holders in a `ClusterLock`'s directory other clusters share whose node of the
    /// earlier session was gone, so could not be put back in its place: another cluster may
    /// have held the lock in the gap.
    pub displaced: Vec<Arc<str>>,
}

/// One contender in a lock's queue, as [`super::LockEngine::queue`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueEntry {
    pub node: String,
    pub sequence: u64,
    pub id: Option<String>,
    pub mode: Mode,
}

/// The revocation reason given to holders in foreign-shared locks when the connection drops.
pub(super) const CONNECTION_LOST: &str =
    "the ZooKeeper connection dropped and this lock is shared with clients other than zklock, which may be granted it if the session expires";
