//! The worlds the checker starts from: each small enough to walk completely, each with the
//! parties one family of holes needs (a foreign client, two clusters, permits, a deleted
//! waiter), and a deep variant with more faults allowed.

use crate::state::{Claim, Cluster, Foreign, History, Link, Owner, Phase, Pod, Stage, State, Term, Zk};
use crate::step::Action;

/// A cluster's claims as `(phase, deletable, pod)`, and its bounds: terms that may begin,
/// crashes, cuts, late writes.
type ClusterSpec = (Vec<(Phase, bool, Pod)>, [u8; 4]);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// One cluster and a Curator client on one lock; claim `c0` has a gated pod; the leader
    /// may crash, stall, be cut off, and one more term may begin.
    Foreign,
    /// A `ClusterLock` two clusters share: `a0` (cluster a) holds, `b0` (cluster b) waits;
    /// cluster a's leader may crash or be cut off, and one more term may begin there.
    Clusters,
    /// A `ClusterLock` of one permit raised to two in both clusters at once; `a0` and `b0` wait.
    Permits,
    /// One cluster: `h` holds, `k` and `n` wait; `k` may be deleted while another finalizer
    /// keeps it; the leader may crash and one more term begin.
    Ghost,
    /// One cluster: `c0` holds a lock only zklock has used so far; a Curator client may come
    /// and queue behind it at any time; the leader may crash or be cut off, and one more term
    /// may begin.
    ForeignArrives,
}

impl Scenario {
    pub const ALL: [Scenario; 5] =
        [Scenario::Foreign, Scenario::Clusters, Scenario::Permits, Scenario::Ghost, Scenario::ForeignArrives];

    fn claim_names(self) -> &'static [&'static [&'static str]] {
        match self {
            Scenario::Foreign | Scenario::ForeignArrives => &[&["c0"]],
            Scenario::Clusters | Scenario::Permits => &[&["a0"], &["b0"]],
            Scenario::Ghost => &[&["h", "k", "n"]],
        }
    }

    /// The scenario's first state; `more` allows that many more of every fault (a crash, a term,
    /// a cut, a late write, a deletion).
    pub fn init(self, more: u8) -> State {
        let mut zk =
            Zk { nodes: vec![], next_seq: 0, zxid: 0, pzxid: 0, sessions: vec![], epochs: vec![], marked: false };
        let mut clusters = vec![];
        let mut foreign = Foreign::Absent;
        let limit = 1;
        let mut raise_to = None;
        // Each cluster's first term, already serving: (its claims as (phase, deletable, pod), bounds).
        let specs: Vec<ClusterSpec> = match self {
            Scenario::Foreign => {
                vec![(vec![(Phase::Waiting, more > 0, Pod::Gated)], [1 + more, 1 + more, 1, 1 + more])]
            }
            Scenario::Clusters => vec![
                (vec![(Phase::Held, true, Pod::None)], [1 + more, 1 + more, 1, more]),
                (vec![(Phase::Waiting, true, Pod::None)], [more, more, 0, 0]),
            ],
            Scenario::Permits => {
                raise_to = Some(2);
                vec![
                    (vec![(Phase::Waiting, more > 0, Pod::None)], [1 + more, 1 + more, 0, 0]),
                    (vec![(Phase::Waiting, more > 0, Pod::None)], [more, more, 0, 0]),
                ]
            }
            Scenario::ForeignArrives => vec![(vec![(Phase::Held, more > 0, Pod::None)], [1 + more, 1 + more, 1, 0])],
            Scenario::Ghost => vec![(
                vec![
                    (Phase::Held, true, Pod::None),
                    (Phase::Waiting, true, Pod::None),
                    (Phase::Waiting, more > 0, Pod::None),
                ],
                [1 + more, 1 + more, more, 0],
            )],
        };
        let mut max_token = 0;
        for (k, (claims, [terms, crashes, cuts, lates])) in specs.into_iter().enumerate() {
            let session = zk.new_session();
            zk.epochs.push(1);
            let mut made = vec![];
            for (i, (phase, deletable, pod)) in claims.into_iter().enumerate() {
                let seq = zk.create(Owner::Claim { cluster: k as u8, claim: i as u8 }, session);
                let token = if phase == Phase::Held { zk.pzxid } else { 0 };
                max_token = max_token.max(token);
                made.push(Claim {
                    phase,
                    epoch: 1,
                    token,
                    node: Some(seq),
                    rv: 1,
                    deleted: false,
                    cleaned_up: false,
                    deletable,
                    revocable: pod == Pod::Gated,
                    revoke: false,
                    pod,
                    taken_over: false,
                });
            }
            let view = made.iter().map(|c| (c.phase, c.rv)).collect();
            clusters.push(Cluster {
                claims: made,
                param: 1,
                leader: Some(Term { epoch: 1, session, stage: Stage::Anchored, link: Link::Up, view: Some(view) }),
                terms_left: terms,
                crashes_left: crashes,
                cuts_left: cuts,
                late: None,
                lates_left: lates,
                last_token: max_token,
            });
        }
        if self == Scenario::ForeignArrives {
            foreign = Foreign::Idle;
        }
        if self == Scenario::Foreign {
            // A Curator client queued behind `c0`, seen by the serving term (the marker).
            let session = zk.new_session();
            let seq = zk.create(Owner::Foreign, session);
            foreign = Foreign::Queued { seq, session };
            zk.marked = true;
        }
        State { zk, clusters, foreign, limit, raise_to, history: History { max_token, ..History::default() } }
    }

    /// Whether a leader's ZooKeeper write may be left on its way (only where the epoch guard's
    /// hole is looked for: it adds states everywhere).
    pub fn zk_writes_late(self) -> bool {
        self == Scenario::Foreign
    }

    fn cluster(k: u8) -> char {
        (b'a' + k) as char
    }

    fn claim(self, k: u8, i: u8) -> &'static str {
        self.claim_names().get(k as usize).and_then(|c| c.get(i as usize)).copied().unwrap_or("?")
    }

    /// An action as a trace shows it: clusters by letter, claims by name.
    pub fn describe(self, action: &Action) -> String {
        let c = Scenario::cluster;
        let n = |k: u8, i: u8| self.claim(k, i);
        match *action {
            Action::Expire(s) => format!("Expire(session {s})"),
            Action::Cut(k) => format!("Cut({})", c(k)),
            Action::Tick(k) => format!("Tick({})", c(k)),
            Action::Reconnect(k) => format!("Reconnect({})", c(k)),
            Action::ForeignEnqueue => "ForeignEnqueue".into(),
            Action::ForeignAcquire => "ForeignAcquire".into(),
            Action::ForeignRelease => "ForeignRelease".into(),
            Action::Delete(k, i) => format!("Delete({})", n(k, i)),
            Action::Revoke(k, i) => format!("Revoke({})", n(k, i)),
            Action::RevokeGrace(k, i) => format!("RevokeGrace({})", n(k, i)),
            Action::Raise => "Raise".into(),
            Action::Crash(k) => format!("Crash({})", c(k)),
            Action::GiveUp(k) => format!("GiveUp({})", c(k)),
            Action::Elect(k) => format!("Elect({})", c(k)),
            Action::Fence(k) => format!("Fence({})", c(k)),
            Action::Replay(k) => format!("Replay({})", c(k)),
            Action::AnchorCreate(k) => format!("AnchorCreate({})", c(k)),
            Action::AnchorJudge(k) => format!("AnchorJudge({})", c(k)),
            Action::Grant(k, i) => format!("Grant({})", n(k, i)),
            Action::GrantThenCrash(k, i) => format!("GrantThenCrash({})", n(k, i)),
            Action::ZkWriteThenStall(k, i) => format!("ZkWriteThenStall({})", n(k, i)),
            Action::LandLate(k) => format!("LandLate({})", c(k)),
            Action::EndShared(k) => format!("EndShared({})", c(k)),
            Action::ReleaseStatus(k, i) => format!("ReleaseStatus({})", n(k, i)),
            Action::ReleaseNode(k, i) => format!("ReleaseNode({})", n(k, i)),
            Action::Ungate(k, i) => format!("Ungate({})", n(k, i)),
        }
    }
}
