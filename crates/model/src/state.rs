//! What the model's world holds: one lock directory in ZooKeeper with its sessions, each
//! cluster's claims in its API server and its operator's term, a foreign client, and the
//! history variables the properties read.

/// A session's number, an index into [`Zk::sessions`].
pub type Session = u8;

/// Who made a node of the lock directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A claim's node, made by its cluster's operator.
    Claim { cluster: u8, claim: u8 },
    /// A Curator or kazoo client's node.
    Foreign,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// Its sequence number: its place in the queue.
    pub seq: u8,
    pub owner: Owner,
    pub session: Session,
}

/// ZooKeeper: one lock directory, the sessions, each root's leader epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Zk {
    /// The directory's children, in sequence order.
    pub nodes: Vec<Node>,
    pub next_seq: u8,
    /// The zxid of the last write, and of the directory's last child change.
    pub zxid: u8,
    pub pzxid: u8,
    /// Whether each session is alive on the server.
    pub sessions: Vec<bool>,
    /// The leader epoch of each cluster's root (the version of its `leader-epoch` node).
    pub epochs: Vec<u8>,
    /// The directory's marker: a foreign node was seen here by a live session.
    pub marked: bool,
}

impl Zk {
    /// Whether the node `seq` is among the first `limit` of the queue.
    pub fn within(&self, seq: u8, limit: u8) -> bool {
        self.nodes.iter().position(|n| n.seq == seq).is_some_and(|i| i < limit as usize)
    }

    pub fn node_of(&self, cluster: u8, claim: u8) -> Option<&Node> {
        self.nodes.iter().find(|n| n.owner == Owner::Claim { cluster, claim })
    }

    pub fn write(&mut self) -> u8 {
        self.zxid += 1;
        self.zxid
    }

    pub fn create(&mut self, owner: Owner, session: Session) -> u8 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.nodes.push(Node { seq, owner, session });
        self.pzxid = self.write();
        seq
    }

    pub fn delete(&mut self, seq: u8) {
        let before = self.nodes.len();
        self.nodes.retain(|n| n.seq != seq);
        if self.nodes.len() != before {
            self.pzxid = self.write();
        }
    }

    pub fn expire(&mut self, session: Session) {
        self.sessions[session as usize] = false;
        let before = self.nodes.len();
        self.nodes.retain(|n| n.session != session);
        if self.nodes.len() != before {
            self.pzxid = self.write();
        }
    }

    pub fn new_session(&mut self) -> Session {
        self.sessions.push(true);
        (self.sessions.len() - 1) as Session
    }

    pub fn foreign_node(&self) -> Option<&Node> {
        self.nodes.iter().find(|n| n.owner == Owner::Foreign)
    }
}

/// A claim's phase as its status says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Waiting,
    Held,
    /// Final: ended without a release (`Lost`), or released (`Released`, `Revoked`…).
    Lost,
    Released,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Lost | Phase::Released)
    }
}

/// A gated pod of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pod {
    None,
    Gated,
    Running,
}

/// A `LockClaim` in its cluster's API server.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    pub phase: Phase,
    /// `status.leaderEpoch`.
    pub epoch: u8,
    /// The fencing token of its hold.
    pub token: u8,
    /// The node its status records (its place).
    pub node: Option<u8>,
    /// The object's resourceVersion, which every status write tests.
    pub rv: u8,
    /// Deleted by its user (a deletion timestamp).
    pub deleted: bool,
    /// The operator's cleanup of a deleted claim is over: its node and its finalizer are gone,
    /// another party's finalizer keeps the object.
    pub cleaned_up: bool,
    /// The user may delete it in this scenario.
    pub deletable: bool,
    /// The user may ask for its revocation in this scenario, and has (`zklock.io/revoke`).
    pub revocable: bool,
    pub revoke: bool,
    pub pod: Pod,
    /// History: since its last grant landed, somebody else (a foreign client, another cluster)
    /// was among the holders in ZooKeeper while its own node was not.
    pub taken_over: bool,
}

impl Claim {
    pub fn live(&self) -> bool {
        !self.deleted
    }
}

/// How an operator's connection to ZooKeeper stands, in the steps time takes after a cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Link {
    Up,
    /// Cut; the serve bound (session timeout − detection delay − margin) not yet reached.
    Cut,
    /// Cut past the serve bound: the session may not have expired yet.
    PastBound,
    /// Cut past the session timeout: the server may expire the session.
    PastTimeout,
}

/// How far a term has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Elected (holds the Lease), not fenced yet.
    Elected,
    /// Its epoch bumped in ZooKeeper and raised in the API's policy parameter.
    Fenced,
    /// Its replay of the claims taken: it may re-anchor.
    Replayed,
    /// Re-anchoring's creates committed, verdicts not yet written.
    Anchoring,
    /// Re-anchored and every claim judged: it serves.
    Anchored,
}

/// A leader's term in one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// Its epoch (0 until fenced).
    pub epoch: u8,
    pub session: Session,
    pub stage: Stage,
    pub link: Link,
    /// Its registry's phase of each claim, and the resourceVersion of the copy it was read
    /// from (`None`: not replayed yet).
    pub view: Option<Vec<(Phase, u8)>>,
}

/// A write sent before its sender was deposed or crashed, still on its way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Late {
    /// A grant: status `Held` planned from the copy at `rv`.
    Held { claim: u8, epoch: u8, token: u8, rv: u8 },
    /// A ZooKeeper write (a node made for a claim) in session `session`.
    Zk { claim: u8, epoch: u8, session: Session },
}

/// One cluster: its API server's claims and policy parameter, its operator.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cluster {
    pub claims: Vec<Claim>,
    /// The admission policy's parameter: the lowest `leaderEpoch` a status write may carry.
    pub param: u8,
    pub leader: Option<Term>,
    /// Terms that may still begin, crashes and cuts that may still happen (the model's bounds).
    pub terms_left: u8,
    pub crashes_left: u8,
    pub cuts_left: u8,
    pub late: Option<Late>,
    pub lates_left: u8,
    /// The highest token this cluster's grant book handed out.
    pub last_token: u8,
}

/// A Curator or kazoo client contending for the same lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Foreign {
    Absent,
    Idle,
    Queued { seq: u8, session: Session },
    Holding { seq: u8, session: Session },
    Done,
}

/// What happened that a property must know of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct History {
    /// The highest token of any grant that landed, in any cluster.
    pub max_token: u8,
    /// A grant landed with a token not above every earlier grant's.
    pub token_not_growing: bool,
    /// A pod was ungated while its claim did not hold the lock.
    pub pod_started_without_hold: bool,
    /// A write of a term landed after a later term of its cluster fenced it.
    pub deposed_write_landed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub zk: Zk,
    pub clusters: Vec<Cluster>,
    pub foreign: Foreign,
    /// The permits every cluster grants with.
    pub limit: u8,
    /// The permits may still be raised to this (a `Lock`'s edit in every cluster at once).
    pub raise_to: Option<u8>,
    pub history: History,
}

impl State {
    /// Whether the lock is one others decide on too: other clusters, or a foreign client.
    pub fn shared(&self) -> bool {
        self.clusters.len() > 1 || self.foreign_known()
    }

    /// Whether a foreign client's use of the directory is visible: its node, or the marker.
    pub fn foreign_known(&self) -> bool {
        self.zk.marked || self.zk.foreign_node().is_some()
    }

    /// Whether a claim's `Held` stands behind a live term that has judged every claim: a `Held`
    /// left by a term that ended is excused until the next term judged it (fencing tokens are
    /// for a holder nobody can tell).
    pub fn answerable(&self, cluster: u8) -> bool {
        self.clusters[cluster as usize].leader.as_ref().is_some_and(|t| t.stage == Stage::Anchored)
    }

    /// Whether any party other than `(cluster, claim)` that decides on its own — a foreign
    /// client or another cluster's claim — is among the holders in ZooKeeper.
    pub fn other_decider_holds(&self, cluster: u8, claim: u8) -> bool {
        let limit = self.limit as usize;
        self.zk.nodes.iter().take(limit).any(|n| match n.owner {
            Owner::Foreign => matches!(self.foreign, Foreign::Holding { .. }),
            Owner::Claim { cluster: c, claim: k } => c != cluster && (c, k) != (cluster, claim),
        })
    }
}
