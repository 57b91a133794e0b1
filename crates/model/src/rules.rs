//! The rules of the protocol the model can switch off one at a time, each with the functions in
//! the code that implement it (a test fails when one of those names no longer exists).

use std::fmt;

/// One rule of zklock's protocol. With every rule on, every property holds; with one off, the
/// checker finds the counterexample of the hole it closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// Every create, delete and data write of a term's engine is a multi-op that first checks
    /// the root's leader epoch: a deposed term changes nothing in ZooKeeper.
    ZkEpochGuard,
    /// The admission policy refuses a status write whose `leaderEpoch` is below the epoch in
    /// force, which each new term raises (and proves) before it plans: a deposed term's late
    /// `Held` does not land.
    EpochPolicy,
    /// A term takes its replay of the claims (the phases its registry starts from) after the
    /// fence, so a grant of the earlier term that landed before the fence is in it.
    ReplayAfterFence,
    /// In a directory a foreign client uses, a recorded holder cannot prove continuity across a
    /// session change: it ends `Lost`.
    Continuity,
    /// In a directory other clusters share, a recorded holder keeps the lock only in the place
    /// its status names (the old node, replaced in place), never in a node made anew behind
    /// others (a retried re-anchoring finds one of its own).
    PlaceIsRecordedNode,
    /// A term cut off from ZooKeeper ends its holders of shared locks (`Lost`, through the API)
    /// before its session can expire on the server.
    ServeBound,
    /// A gated pod's gate goes only under a `Held` this term judged (re-anchored, stamped with
    /// its epoch, ZooKeeper within reach).
    JudgedHold,
    /// A gated pod's gate stays while its holder is asked to let go (a revocation asked for, by
    /// annotation or in the znode): the pod would start only to be told to stop.
    NoGateWhileRevoked,
    /// A grant in a lock other clusters share takes a token written to ZooKeeper just before
    /// its status write, instead of the directory's last change.
    FreshTokens,
    /// A claim's final status is written before its node is deleted.
    StatusBeforeRelease,
    /// A deleted claim whose cleanup is over (its node gone, only another party's finalizer
    /// keeps the object) is not re-anchored by a new term.
    SkipFinishedClaims,
    /// A foreign node's creation in a lock directory is heard on the session's watch and marks
    /// the directory at once, so that the lock counts as shared from then on (the serve bound
    /// and the continuity rule apply), not only once a later read happens to list it.
    SeeForeignCreates,
}

impl Rule {
    pub const ALL: [Rule; 12] = [
        Rule::ZkEpochGuard,
        Rule::EpochPolicy,
        Rule::ReplayAfterFence,
        Rule::Continuity,
        Rule::PlaceIsRecordedNode,
        Rule::ServeBound,
        Rule::JudgedHold,
        Rule::NoGateWhileRevoked,
        Rule::FreshTokens,
        Rule::StatusBeforeRelease,
        Rule::SkipFinishedClaims,
        Rule::SeeForeignCreates,
    ];

    /// The functions that implement the rule, as `(file, function name)` from the workspace's
    /// root.
    pub fn code(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Rule::ZkEpochGuard => &[("crates/engine/src/fence.rs", "writer"), ("crates/engine/src/fence.rs", "commit")],
            Rule::EpochPolicy => &[("src/controller/api_fence.rs", "raise"), ("src/controller/api_fence.rs", "prove")],
            Rule::ReplayAfterFence => {
                &[("src/controller/feed.rs", "subscribe"), ("src/controller/registry/mod.rs", "first_seen")]
            }
            Rule::Continuity => &[
                ("crates/engine/src/anchor.rs", "recreate"),
                ("src/controller/anchor.rs", "reanchor_lock"),
                ("src/controller/claim/plan.rs", "anchor_verdict"),
            ],
            Rule::PlaceIsRecordedNode => &[("crates/engine/src/engine.rs", "reanchor")],
            Rule::ServeBound => &[
                ("src/controller/supervisor.rs", "serve_bound"),
                ("crates/engine/src/core.rs", "suspend_shared_holds"),
                ("src/controller/claim/plan.rs", "out_of_reach"),
            ],
            Rule::JudgedHold => {
                &[("src/controller/gated/mod.rs", "judged_hold"), ("src/controller/gated/plan.rs", "judged_here")]
            }
            Rule::NoGateWhileRevoked => &[("src/controller/gated/plan.rs", "judged_here")],
            Rule::FreshTokens => &[("src/controller/claim/status_write.rs", "fresh_tokens")],
            Rule::StatusBeforeRelease => {
                &[("src/controller/claim/plan.rs", "deleted"), ("src/controller/claim/mod.rs", "cleanup")]
            }
            Rule::SkipFinishedClaims => &[("src/controller/base/claim_facts.rs", "cleaned_up")],
            Rule::SeeForeignCreates => &[("crates/engine/src/session.rs", "on_node_event")],
        }
    }

    /// The hole the rule closed, as a reader would report it.
    pub fn hole(self) -> &'static str {
        match self {
            Rule::ZkEpochGuard => "a deposed leader's ZooKeeper write lands after the next term fenced it",
            Rule::EpochPolicy => "a deposed leader's late Held lands on a claim the new term has not written yet",
            Rule::ReplayAfterFence => "a new term's registry keeps the phase of a replay taken before the fence",
            Rule::Continuity => "a holder kept across a session it cannot prove, in a lock a foreign client uses",
            Rule::PlaceIsRecordedNode => {
                "a re-anchoring retried after a partial commit takes its own new node for the old place"
            }
            Rule::ServeBound => "a cluster cut off from ZooKeeper keeps its holder Held while another cluster is granted",
            Rule::JudgedHold => "a new term ungates a gated pod whose claim it then judges Lost",
            Rule::NoGateWhileRevoked => "a gated pod whose claim is asked to let go is started only to be told to stop",
            Rule::FreshTokens => "permits raised in two clusters at once grant two holders one token",
            Rule::StatusBeforeRelease => "a holder's node deleted before its final status: the next is Held beside it",
            Rule::SkipFinishedClaims => "the ghost waiter: a deleted waiter re-anchored by a new term blocks its lock",
            Rule::SeeForeignCreates => {
                "a foreign client queued behind a holder goes unheard: a cut-off operator keeps the holder Held past its session"
            }
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Which rules are on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules(u16);

impl Rules {
    pub fn all() -> Self {
        Rules(u16::MAX)
    }

    pub fn without(self, rule: Rule) -> Self {
        Rules(self.0 & !(1 << rule as u16))
    }

    pub fn has(self, rule: Rule) -> bool {
        self.0 & (1 << rule as u16) != 0
    }

    pub fn off(self) -> Vec<Rule> {
        Rule::ALL.into_iter().filter(|r| !self.has(*r)).collect()
    }
}
