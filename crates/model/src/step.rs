//! The actions the world may take in a state, and what each one changes: ZooKeeper and time,
//! a foreign client, users, and each cluster's operator as the code does it (each rule the
//! model can switch off is looked up where the code applies it).

use crate::rules::Rule;
use crate::state::{Claim, Foreign, Late, Link, Owner, Phase, Pod, Stage, State, Term};
use crate::ZklockModel;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    // ZooKeeper and time.
    /// The server expires a session whose client is gone or has been cut off past its timeout.
    Expire(u8),
    /// A cluster's operator loses its connection to ZooKeeper (it still reaches its API server).
    Cut(u8),
    /// Time passes for a cut operator: the serve bound, then the session timeout.
    Tick(u8),
    Reconnect(u8),
    // A foreign (Curator, kazoo) client.
    ForeignEnqueue,
    ForeignAcquire,
    ForeignRelease,
    // Users.
    Delete(u8, u8),
    /// The user asks a holder to let go (the `zklock.io/revoke` annotation).
    Revoke(u8, u8),
    /// The lock's permits raised in every cluster at once.
    Raise,
    // Each cluster's operator.
    Crash(u8),
    /// A term whose session expired while cut off gives the lease up.
    GiveUp(u8),
    Elect(u8),
    Fence(u8),
    Replay(u8),
    AnchorCreate(u8),
    AnchorJudge(u8),
    Grant(u8, u8),
    /// A grant's status write sent, then its sender crashes before the answer: it may land late.
    GrantThenCrash(u8, u8),
    /// A ZooKeeper write sent, then its sender stalls and loses the lease: it may land late.
    ZkWriteThenStall(u8, u8),
    LandLate(u8),
    /// A cut operator past its serve bound ends its holders of shared locks through the API.
    EndShared(u8),
    /// A revoked holder's grace runs out: its final status (`Revoked`), then its node goes.
    RevokeGrace(u8, u8),
    ReleaseStatus(u8, u8),
    ReleaseNode(u8, u8),
    Ungate(u8, u8),
}

impl Action {
    /// A step the environment may take or never take (a user's, a fault); every other step is
    /// the system's, which fairness says comes in time once it is possible.
    pub fn environment(&self) -> bool {
        matches!(
            self,
            Action::Delete(..)
                | Action::Revoke(..)
                | Action::Raise
                | Action::Crash(_)
                | Action::Cut(_)
                | Action::Reconnect(_)
                | Action::GrantThenCrash(..)
                | Action::ZkWriteThenStall(..)
                | Action::ForeignEnqueue
        )
    }
}

fn serving(t: &Term, s: &State) -> bool {
    t.stage == Stage::Anchored && t.link == Link::Up && s.zk.sessions[t.session as usize]
}

impl ZklockModel {
    pub(crate) fn on(&self, rule: Rule) -> bool {
        self.rules.has(rule)
    }

    pub(crate) fn list_actions(&self, s: &State, out: &mut Vec<Action>) {
        for (session, alive) in s.zk.sessions.iter().enumerate() {
            let session = session as u8;
            let foreign = matches!(s.foreign, Foreign::Queued { session: f, .. } | Foreign::Holding { session: f, .. } if f == session);
            let used = s
                .clusters
                .iter()
                .any(|c| c.leader.as_ref().is_some_and(|t| t.session == session && t.link != Link::PastTimeout));
            if *alive && !foreign && !used {
                out.push(Action::Expire(session));
            }
        }
        match s.foreign {
            // Unless the model is told otherwise, a foreign client first queues while a zklock
            // session watches the directory (the continuity rule's premise; see `unwatched_foreign`).
            Foreign::Idle if self.unwatched_foreign || self.watcher(s).is_some() => out.push(Action::ForeignEnqueue),
            Foreign::Queued { seq, .. } if s.zk.within(seq, 1) => out.push(Action::ForeignAcquire),
            Foreign::Holding { .. } => out.push(Action::ForeignRelease),
            _ => {}
        }
        if s.raise_to.is_some() {
            out.push(Action::Raise);
        }
        for (k, c) in s.clusters.iter().enumerate() {
            let k = k as u8;
            for (i, claim) in c.claims.iter().enumerate() {
                if claim.deletable && !claim.deleted {
                    out.push(Action::Delete(k, i as u8));
                }
                if claim.revocable && !claim.revoke && claim.live() && claim.phase == Phase::Held {
                    out.push(Action::Revoke(k, i as u8));
                }
            }
            if c.late.is_some() {
                out.push(Action::LandLate(k));
            }
            let Some(t) = &c.leader else {
                if c.terms_left > 0 {
                    out.push(Action::Elect(k));
                }
                continue;
            };
            if c.crashes_left > 0 {
                out.push(Action::Crash(k));
            }
            match t.link {
                Link::Up if c.cuts_left > 0 && t.stage == Stage::Anchored => out.push(Action::Cut(k)),
                Link::Up => {}
                Link::Cut => out.push(Action::Tick(k)),
                Link::PastBound => {
                    if !self.urgent(s, k) {
                        out.push(Action::Tick(k));
                    }
                    if self.on(Rule::ServeBound) && self.shared_holders(s, k).next().is_some() {
                        out.push(Action::EndShared(k));
                    }
                }
                Link::PastTimeout => {}
            }
            if t.link != Link::Up {
                if s.zk.sessions[t.session as usize] {
                    out.push(Action::Reconnect(k));
                } else {
                    out.push(Action::GiveUp(k));
                }
            }
            let reach = t.link == Link::Up && s.zk.sessions[t.session as usize];
            match t.stage {
                Stage::Elected => out.push(Action::Fence(k)),
                Stage::Fenced => out.push(Action::Replay(k)),
                Stage::Replayed if reach => out.push(Action::AnchorCreate(k)),
                Stage::Anchoring if reach => out.push(Action::AnchorJudge(k)),
                _ => {}
            }
            for i in 0..c.claims.len() as u8 {
                if self.may_grant(s, k, i) {
                    out.push(Action::Grant(k, i));
                    if c.lates_left > 0 && c.crashes_left > 0 && c.late.is_none() {
                        out.push(Action::GrantThenCrash(k, i));
                    }
                }
                let claim = &c.claims[i as usize];
                if serving(t, s) && claim.revoke && claim.phase == Phase::Held {
                    out.push(Action::RevokeGrace(k, i));
                }
                if self.may_release_status(s, k, i) {
                    out.push(Action::ReleaseStatus(k, i));
                }
                if self.may_release_node(s, k, i) {
                    out.push(Action::ReleaseNode(k, i));
                }
                if self.may_ungate(s, k, i) {
                    out.push(Action::Ungate(k, i));
                }
                if self.scenario.zk_writes_late()
                    && serving(t, s)
                    && c.lates_left > 0
                    && c.late.is_none()
                    && claim.live()
                    && s.zk.node_of(k, i).is_some()
                {
                    out.push(Action::ZkWriteThenStall(k, i));
                }
            }
        }
    }

    /// A cluster whose term watches the directory now: connected, its session alive, its
    /// nodes re-made there (the session's watch on the lock's parent is set before).
    fn watcher(&self, s: &State) -> Option<u8> {
        (0..s.clusters.len() as u8).find(|&k| {
            s.clusters[k as usize]
                .leader
                .as_ref()
                .is_some_and(|t| t.link == Link::Up && s.zk.sessions[t.session as usize] && t.stage >= Stage::Anchoring)
        })
    }

    /// The claims of cluster `k` that read `Held` in a lock others decide on too.
    fn shared_holders<'a>(&self, s: &'a State, k: u8) -> impl Iterator<Item = usize> + 'a {
        let shared = s.shared();
        s.clusters[k as usize]
            .claims
            .iter()
            .enumerate()
            .filter(move |(_, c)| shared && c.phase == Phase::Held)
            .map(|(i, _)| i)
    }

    /// Whether a cut operator must act before its session may expire: with the serve bound, its
    /// holders of shared locks end first (time does not pass a deadline with work due).
    fn urgent(&self, s: &State, k: u8) -> bool {
        self.on(Rule::ServeBound) && self.shared_holders(s, k).next().is_some()
    }

    fn may_grant(&self, s: &State, k: u8, i: u8) -> bool {
        let c = &s.clusters[k as usize];
        let Some(t) = c.leader.as_ref().filter(|t| serving(t, s)) else { return false };
        let Some(view) = &t.view else { return false };
        let claim = &c.claims[i as usize];
        let held_in_view = view.iter().filter(|(p, _)| *p == Phase::Held).count() as u8;
        view[i as usize].0 == Phase::Waiting
            && claim.phase == Phase::Waiting
            && claim.live()
            && held_in_view < s.limit
            && s.zk.node_of(k, i).is_some_and(|n| n.session == t.session && s.zk.within(n.seq, s.limit))
    }

    fn may_release_status(&self, s: &State, k: u8, i: u8) -> bool {
        let c = &s.clusters[k as usize];
        let Some(_) = c.leader.as_ref().filter(|t| serving(t, s)) else { return false };
        let claim = &c.claims[i as usize];
        claim.deleted && !claim.cleaned_up && claim.phase == Phase::Held
    }

    fn may_release_node(&self, s: &State, k: u8, i: u8) -> bool {
        let c = &s.clusters[k as usize];
        let Some(t) = c.leader.as_ref().filter(|t| serving(t, s)) else { return false };
        let claim = &c.claims[i as usize];
        let status_first = self.on(Rule::StatusBeforeRelease) && claim.phase == Phase::Held;
        match s.zk.node_of(k, i) {
            // A final claim's node, or a deleted claim's: released (the final status first).
            Some(n) => {
                ((claim.deleted && !claim.cleaned_up) || claim.phase.is_final())
                    && !status_first
                    && n.session == t.session
            }
            // A deleted claim without a node: only its finalizer is left to take off.
            None => claim.deleted && !claim.cleaned_up && claim.phase != Phase::Held,
        }
    }

    fn may_ungate(&self, s: &State, k: u8, i: u8) -> bool {
        let c = &s.clusters[k as usize];
        let Some(t) = &c.leader else { return false };
        let claim = &c.claims[i as usize];
        if claim.pod != Pod::Gated || claim.phase != Phase::Held {
            return false;
        }
        let revoked = self.on(Rule::NoGateWhileRevoked) && claim.revoke;
        let judged = !self.on(Rule::JudgedHold) || (serving(t, s) && claim.epoch == t.epoch && claim.live());
        judged && !revoked
    }

    /// The token of a grant decided now in cluster `k`.
    fn token(&self, s: &mut State, k: u8) -> u8 {
        let fresh = s.clusters.len() > 1 && self.on(Rule::FreshTokens);
        let c = &s.clusters[k as usize];
        // The grant book's own rule: never at or below a token this cluster handed out.
        let t = if fresh || s.zk.pzxid <= c.last_token { s.zk.write() } else { s.zk.pzxid };
        let c = &mut s.clusters[k as usize];
        c.last_token = c.last_token.max(t);
        t
    }

    pub(crate) fn apply(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Expire(session) => s.zk.expire(session),
            Action::Cut(k) => {
                let c = &mut s.clusters[k as usize];
                c.cuts_left -= 1;
                c.leader.as_mut()?.link = Link::Cut;
            }
            Action::Tick(k) => {
                let t = s.clusters[k as usize].leader.as_mut()?;
                t.link = if t.link == Link::Cut { Link::PastBound } else { Link::PastTimeout };
            }
            Action::Reconnect(k) => s.clusters[k as usize].leader.as_mut()?.link = Link::Up,
            Action::GiveUp(k) => s.clusters[k as usize].leader = None,
            Action::ForeignEnqueue => {
                let session = s.zk.new_session();
                let seq = s.zk.create(Owner::Foreign, session);
                s.foreign = Foreign::Queued { seq, session };
                if self.on(Rule::SeeForeignCreates) && self.watcher(&s).is_some() {
                    s.zk.marked = true;
                }
            }
            Action::ForeignAcquire => {
                if let Foreign::Queued { seq, session } = s.foreign {
                    s.foreign = Foreign::Holding { seq, session };
                }
            }
            Action::ForeignRelease => {
                if let Foreign::Holding { seq, .. } = s.foreign {
                    s.zk.delete(seq);
                    s.foreign = Foreign::Done;
                }
            }
            Action::Delete(k, i) => s.clusters[k as usize].claims[i as usize].deleted = true,
            Action::Revoke(k, i) => s.clusters[k as usize].claims[i as usize].revoke = true,
            Action::RevokeGrace(k, i) => write_status(&mut s, k, i, Phase::Released),
            Action::Raise => s.limit = s.raise_to.take()?,
            Action::Crash(k) => {
                let c = &mut s.clusters[k as usize];
                c.crashes_left -= 1;
                c.leader = None;
            }
            Action::Elect(k) => {
                let session = s.zk.new_session();
                let view = (!self.on(Rule::ReplayAfterFence)).then(|| replay(&s.clusters[k as usize].claims));
                let c = &mut s.clusters[k as usize];
                c.terms_left -= 1;
                c.leader = Some(Term { epoch: 0, session, stage: Stage::Elected, link: Link::Up, view });
            }
            Action::Fence(k) => {
                s.zk.write();
                s.zk.epochs[k as usize] += 1;
                let epoch = s.zk.epochs[k as usize];
                let policy = self.on(Rule::EpochPolicy);
                let c = &mut s.clusters[k as usize];
                if policy {
                    c.param = epoch;
                }
                let t = c.leader.as_mut()?;
                t.epoch = epoch;
                t.stage = if t.view.is_some() { Stage::Replayed } else { Stage::Fenced };
            }
            Action::Replay(k) => {
                let view = replay(&s.clusters[k as usize].claims);
                let t = s.clusters[k as usize].leader.as_mut()?;
                t.view = Some(view);
                t.stage = Stage::Replayed;
            }
            Action::AnchorCreate(k) => self.anchor_create(&mut s, k)?,
            Action::AnchorJudge(k) => self.anchor_judge(&mut s, k)?,
            Action::Grant(k, i) => {
                let token = self.token(&mut s, k);
                let epoch = s.clusters[k as usize].leader.as_ref()?.epoch;
                let seq = s.zk.node_of(k, i)?.seq;
                land_grant(&mut s, k, i, epoch, token, Some(seq));
                listed(&mut s);
                let rv = s.clusters[k as usize].claims[i as usize].rv;
                let t = s.clusters[k as usize].leader.as_mut()?;
                t.view.as_mut()?[i as usize] = (Phase::Held, rv);
                if self.ungate_on_answer && self.may_ungate(&s, k, i) {
                    ungate(&mut s, k, i);
                }
            }
            Action::GrantThenCrash(k, i) => {
                let token = self.token(&mut s, k);
                let c = &mut s.clusters[k as usize];
                let epoch = c.leader.as_ref()?.epoch;
                c.late = Some(Late::Held { claim: i, epoch, token, rv: c.claims[i as usize].rv });
                c.lates_left -= 1;
                c.crashes_left -= 1;
                c.leader = None;
            }
            Action::ZkWriteThenStall(k, i) => {
                let c = &mut s.clusters[k as usize];
                let t = c.leader.take()?;
                c.late = Some(Late::Zk { claim: i, epoch: t.epoch, session: t.session });
                c.lates_left -= 1;
            }
            Action::LandLate(k) => {
                let late = s.clusters[k as usize].late.take()?;
                let fenced_since = |epoch: u8, s: &State| epoch < s.zk.epochs[k as usize];
                match late {
                    Late::Held { claim, epoch, token, rv } => {
                        let c = &s.clusters[k as usize];
                        let admitted = !self.on(Rule::EpochPolicy) || epoch >= c.param;
                        if c.claims[claim as usize].rv == rv && admitted {
                            if fenced_since(epoch, &s) {
                                s.history.deposed_write_landed = true;
                            }
                            let node = s.clusters[k as usize].claims[claim as usize].node;
                            land_grant(&mut s, k, claim, epoch, token, node);
                        }
                    }
                    Late::Zk { claim, epoch, session } => {
                        let admitted = !self.on(Rule::ZkEpochGuard) || !fenced_since(epoch, &s);
                        if s.zk.sessions[session as usize] && admitted {
                            if fenced_since(epoch, &s) {
                                s.history.deposed_write_landed = true;
                            }
                            s.zk.create(Owner::Claim { cluster: k, claim }, session);
                        }
                    }
                }
            }
            Action::EndShared(k) => {
                let ended: Vec<usize> = self.shared_holders(&s, k).collect();
                for i in ended {
                    write_status(&mut s, k, i as u8, Phase::Lost);
                }
            }
            Action::ReleaseStatus(k, i) => {
                write_status(&mut s, k, i, Phase::Released);
                finish_cleanup(&mut s, k, i);
            }
            Action::ReleaseNode(k, i) => {
                if let Some(n) = s.zk.node_of(k, i) {
                    let seq = n.seq;
                    s.zk.delete(seq);
                    listed(&mut s);
                }
                finish_cleanup(&mut s, k, i);
            }
            Action::Ungate(k, i) => ungate(&mut s, k, i),
        }
        settle(&mut s);
        Some(s)
    }

    /// Re-anchoring's multi-ops: each claim the term's registry records with a node gets one
    /// back, holders first, then in ticket order (claim order here); a node of the earlier
    /// session that still stands is replaced in place (same name, same place); the earlier
    /// sessions' other nodes of this cluster go. A foreign node seen marks the directory.
    fn anchor_create(&self, s: &mut State, k: u8) -> Option<()> {
        let t = s.clusters[k as usize].leader.clone()?;
        let order = self.to_anchor(s, k, &t)?;
        let mut kept = vec![];
        for &i in &order {
            let recorded = s.clusters[k as usize].claims[i as usize].node;
            let owner = Owner::Claim { cluster: k, claim: i };
            match s.zk.nodes.iter_mut().find(|n| n.owner == owner && Some(n.seq) == recorded) {
                Some(n) => {
                    n.session = t.session;
                    kept.push(n.seq);
                }
                None => kept.push(s.zk.create(owner, t.session)),
            }
        }
        let stale: Vec<u8> =
            s.zk.nodes
                .iter()
                .filter(|n| matches!(n.owner, Owner::Claim { cluster, .. } if cluster == k) && !kept.contains(&n.seq))
                .map(|n| n.seq)
                .collect();
        for seq in stale {
            s.zk.delete(seq);
        }
        if s.zk.foreign_node().is_some() {
            s.zk.marked = true;
        }
        s.zk.write();
        s.clusters[k as usize].leader.as_mut()?.stage = Stage::Anchoring;
        Some(())
    }

    /// The claims a term re-anchors: those its registry records as holding or waiting.
    fn to_anchor(&self, s: &State, k: u8, t: &Term) -> Option<Vec<u8>> {
        let view = t.view.as_ref()?;
        let claims = &s.clusters[k as usize].claims;
        let skipped = |i: usize| self.on(Rule::SkipFinishedClaims) && claims[i].cleaned_up;
        let recorded = |i: usize| !view[i].0.is_final() && !skipped(i);
        let mut order: Vec<u8> = (0..claims.len()).filter(|&i| recorded(i)).map(|i| i as u8).collect();
        order.sort_by_key(|&i| view[i as usize].0 != Phase::Held);
        Some(order)
    }

    /// Re-anchoring's verdicts, written once the pass is over, and every claim stamped with the
    /// term's epoch: a recorded holder keeps the lock only where nobody else can have held it
    /// in the gap.
    fn anchor_judge(&self, s: &mut State, k: u8) -> Option<()> {
        let t = s.clusters[k as usize].leader.clone()?;
        let order = self.to_anchor(s, k, &t)?;
        let view = t.view.clone()?;
        let foreign_seen = self.on(Rule::Continuity) && s.foreign_known();
        for i in order {
            let (phase, rv) = view[i as usize];
            let claim = &s.clusters[k as usize].claims[i as usize];
            let recorded = claim.node;
            let mine = s.zk.node_of(k, i).filter(|n| n.session == t.session).copied();
            if claim.rv != rv {
                // The copy changed since the replay: the write is refused (its test of the
                // resourceVersion fails) and the registry learns the new copy.
                let now = (claim.phase, claim.rv);
                s.clusters[k as usize].leader.as_mut()?.view.as_mut()?[i as usize] = now;
                continue;
            }
            let phase = if phase == Phase::Held {
                let in_place = match mine {
                    Some(n) if self.on(Rule::PlaceIsRecordedNode) => Some(n.seq) == recorded,
                    Some(_) => true,
                    None => false,
                };
                let place_proven = if s.clusters.len() > 1 { in_place } else { mine.is_some() };
                let first = mine.is_some_and(|n| s.zk.within(n.seq, s.limit));
                if !foreign_seen && place_proven && first {
                    Phase::Held
                } else {
                    Phase::Lost
                }
            } else {
                phase
            };
            let epoch = t.epoch;
            let c = &mut s.clusters[k as usize].claims[i as usize];
            c.phase = phase;
            c.epoch = epoch;
            c.node = mine.map(|n| n.seq);
            c.rv += 1;
            let rv = c.rv;
            if phase == Phase::Lost {
                if let Some(n) = mine {
                    s.zk.delete(n.seq);
                }
            }
            s.clusters[k as usize].leader.as_mut()?.view.as_mut()?[i as usize] = (phase, rv);
        }
        s.clusters[k as usize].leader.as_mut()?.stage = Stage::Anchored;
        Some(())
    }
}

/// The gate goes: the pod runs (the history notes a start while its claim did not hold, or
/// while its holder was asked to let go: it would start only to be told to stop).
fn ungate(s: &mut State, k: u8, i: u8) {
    let claim = &s.clusters[k as usize].claims[i as usize];
    let holds = claim.phase == Phase::Held
        && !claim.revoke
        && !claim.taken_over
        && s.zk.node_of(k, i).is_some_and(|n| s.zk.within(n.seq, s.limit));
    if !holds {
        s.history.pod_started_without_hold = true;
    }
    s.clusters[k as usize].claims[i as usize].pod = Pod::Running;
}

/// A round read the directory's children: a foreign node among them marks it.
fn listed(s: &mut State) {
    if s.zk.foreign_node().is_some() {
        s.zk.marked = true;
    }
}

fn replay(claims: &[Claim]) -> Vec<(Phase, u8)> {
    claims.iter().map(|c| (c.phase, c.rv)).collect()
}

/// A grant's status write lands: the history of tokens and of the claim's hold start here.
fn land_grant(s: &mut State, k: u8, i: u8, epoch: u8, token: u8, node: Option<u8>) {
    if token <= s.history.max_token {
        s.history.token_not_growing = true;
    }
    s.history.max_token = s.history.max_token.max(token);
    let c = &mut s.clusters[k as usize].claims[i as usize];
    c.phase = Phase::Held;
    c.epoch = epoch;
    c.token = token;
    c.node = node;
    c.rv += 1;
    c.taken_over = false;
}

/// A live term's status write (it planned from the copy it last wrote or read).
fn write_status(s: &mut State, k: u8, i: u8, phase: Phase) {
    let epoch = s.clusters[k as usize].leader.as_ref().map_or(0, |t| t.epoch);
    let c = &mut s.clusters[k as usize].claims[i as usize];
    c.phase = phase;
    c.epoch = epoch;
    c.rv += 1;
    let rv = c.rv;
    if let Some(view) = s.clusters[k as usize].leader.as_mut().and_then(|t| t.view.as_mut()) {
        view[i as usize] = (phase, rv);
    }
}

/// A deleted claim whose node is gone and whose status holds nothing has its finalizer taken
/// off: its cleanup is over (another party's finalizer may keep the object).
fn finish_cleanup(s: &mut State, k: u8, i: u8) {
    let gone = s.zk.node_of(k, i).is_none();
    let c = &mut s.clusters[k as usize].claims[i as usize];
    if c.deleted && gone && c.phase != Phase::Held {
        c.cleaned_up = true;
    }
}

/// What follows from every step: a holder whose node is not among the holders while another
/// party's is has had the lock taken over.
fn settle(s: &mut State) {
    for k in 0..s.clusters.len() as u8 {
        for i in 0..s.clusters[k as usize].claims.len() as u8 {
            let within = s.zk.node_of(k, i).is_some_and(|n| s.zk.within(n.seq, s.limit));
            let other = s.other_decider_holds(k, i);
            let c = &mut s.clusters[k as usize].claims[i as usize];
            if c.phase == Phase::Held && !within && other {
                c.taken_over = true;
            }
        }
    }
}
