//! The pure heart of the reconciler: from what is known about a claim (its object, its validated
//! spec, its holder pod, its contender in the lock engine, the clock), the status it should have
//! and what must be done. No I/O, so every rule of docs/design.md is a unit test.

use std::ops::ControlFlow;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{self, FINISHED, HELD, INVALID, REVOKE_REQUESTED};
use crate::api::{ClaimLockStatus, LockClaim, LockClaimStatus, Phase, ValidSpec, RENEW_ANNOTATION, REVOKE_ANNOTATION};
use crate::zk::{ContenderState, LostReason};

use crate::controller::base::settings::{HOLDER_APPEAR_WINDOW, RESYNC};
pub use crate::controller::holders::HolderView;

/// What the lock engine says about the claim's contenders (one per lock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContenderView {
    /// The engine tracks none (never enqueued, or the nodes are gone).
    Untracked,
    Tracked {
        /// The claim's state as a whole (see [`aggregate`]).
        state: ContenderState,
        /// Each lock's part, in the order of the spec (one for a claim over one lock).
        parts: Vec<PartView>,
        /// Whom the claim waits for where it is furthest back.
        waiting_for: Option<String>,
    },
}

/// The claim's contender in one of its locks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartView {
    pub lock_name: String,
    /// Its node; `None` when the engine lost track of this part only.
    pub node: Option<String>,
    pub state: ContenderState,
    /// The claim (its name) or foreign node it waits for in this lock.
    pub waiting_for: Option<String>,
    /// The claim's ticket (its place across sessions), if the engine knows it.
    pub ticket: Option<i64>,
}

/// A claim's state from its parts' (docs/user-guide.md: several locks): lost if one is (or is gone), asked to let
/// go if one is, held only when every one is (its fencing token: the highest of them, each
/// lock's own goes into `status.locks`), else waiting where it is furthest back.
pub fn aggregate(parts: &[ContenderState]) -> ContenderState {
    if let Some(lost) = parts.iter().find(|s| s.is_final()) {
        return lost.clone();
    }
    let held = parts.iter().all(ContenderState::is_held);
    let token = held.then(|| parts.iter().filter_map(ContenderState::fencing_token).max().unwrap_or_default());
    if let Some(ContenderState::RevokeRequested { reason, .. }) =
        parts.iter().find(|s| matches!(s, ContenderState::RevokeRequested { .. }))
    {
        return ContenderState::RevokeRequested { reason: reason.clone(), fencing_token: token };
    }
    match token {
        Some(fencing_token) => ContenderState::Held { fencing_token },
        None => parts
            .iter()
            .filter(|s| matches!(s, ContenderState::Waiting { .. }))
            .max_by_key(|s| match s {
                ContenderState::Waiting { ahead, .. } => *ahead,
                _ => 0,
            })
            .cloned()
            .unwrap_or(ContenderState::Released),
    }
}

/// Everything `plan` looks at.
pub struct Inputs<'a> {
    pub claim: &'a LockClaim,
    pub spec: &'a ValidSpec,
    pub holder: HolderView,
    pub contender: ContenderView,
    /// False until the operator's session is re-anchored: nothing new may be enqueued, and an
    /// untracked claim recorded as Waiting or Held may still come back.
    pub admitting: bool,
    /// Set by re-anchoring when a recorded holder could not keep the lock (docs/design.md: re-anchoring).
    pub anchor_verdict: Option<String>,
    /// While ZooKeeper is out of reach and the claim holds a lock that other clients or
    /// clusters share: the moment by which it must be ended, before its session can expire on
    /// the server and another client be granted (docs/design.md: a lost connection).
    pub hold_until: Option<Timestamp>,
    /// A newer claim of the claim's supersede group (`spec.supersede`) that is waiting or
    /// holding: its name. The caller reads it only while the engine says the claim waits.
    pub superseded_by: Option<String>,
    pub now: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// What to do, in this order: enqueue (then plan again), write the revocation request into the
/// znode, annotate the holder pod, write the status, release the node, publish the events. The
/// status goes out before the release so that no other claim can be Held while this one still
/// reads Held.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub status: LockClaimStatus,
    pub enqueue: bool,
    pub write_revoke: Option<String>,
    pub annotate_pod: Option<String>,
    pub release: bool,
    pub events: Vec<Event>,
    pub requeue_after: Option<Duration>,
    /// Delete the claim (last): its time to live after finishing has passed.
    pub delete: bool,
    /// The cleanup of a deleted claim: its status is written only if this plan changes it (a
    /// write for the epoch alone would change nothing for anybody).
    pub cleanup: bool,
}

impl Plan {
    fn event(&mut self, warning: bool, reason: &'static str, note: String) {
        self.events.push(Event { warning, reason, note });
    }

    fn requeue_at(&mut self, now: Timestamp, at: Timestamp) {
        let wait = at.duration_since(now).unsigned_abs();
        // Deadlines are checked a little after they pass, so that the check sees them passed;
        // one further away than `RESYNC` is looked at again then, and planned anew (a time read
        // from status data may lie thousands of years ahead).
        let wait = wait.saturating_add(Duration::from_millis(50)).min(RESYNC);
        self.requeue_after = Some(self.requeue_after.map_or(wait, |w| w.min(wait)));
    }

    /// A final claim with a time to live (`spec.ttlSecondsAfterFinished`, or the operator's
    /// default): deleted once that long has passed since it finished (the Finished condition's
    /// transition, which this very plan may be making), else looked at again then.
    pub fn expire_after(mut self, ttl: Option<Duration>, now: Timestamp) -> Plan {
        let Some(ttl) = ttl.filter(|_| self.status.phase.is_some_and(Phase::is_terminal)) else { return self };
        let finished = conditions::get(&self.status.conditions, FINISHED)
            .filter(|c| c.status == "True")
            .map_or(now, |c| c.last_transition_time.0);
        let due = after(finished, ttl);
        if now >= due {
            self.delete = true;
        } else {
            self.requeue_at(now, due);
        }
        self
    }

    /// Ends the claim: phase, conditions, and a release of its node.
    fn finish(
        mut self,
        phase: Phase,
        reason: &'static str,
        message: String,
        generation: Option<i64>,
        now: &Time,
    ) -> Plan {
        let st = &mut self.status;
        st.phase = Some(phase);
        st.position = None;
        st.waiting_for = None;
        for lock in &mut st.locks {
            lock.position = None;
            lock.waiting_for = None;
        }
        conditions::set(&mut st.conditions, HELD, false, reason, &message, generation, now);
        conditions::set(&mut st.conditions, FINISHED, true, reason, &message, generation, now);
        if phase == Phase::Invalid {
            conditions::set(&mut st.conditions, INVALID, true, reason, &message, generation, now);
        }
        self.release = true;
        self.enqueue = false;
        self.requeue_after = None;
        let warning = matches!(phase, Phase::Lost | Phase::Invalid | Phase::Expired);
        let event_reason = match phase {
            Phase::Released => "Released",
            Phase::Revoked => "Revoked",
            Phase::Expired => "Expired",
            Phase::Lost => "Lost",
            Phase::Superseded => "Superseded",
            _ => "Invalid",
        };
        self.event(warning, event_reason, message);
        self
    }
}

/// A claim being deleted: its nodes go, then (the finalizer helper) the operator's finalizer.
/// The API must never show it Held beside the next holder. When the operator's finalizer is the
/// last one, the claim leaves the API the moment it goes, and no grant of its locks is written
/// before that (the registry counts it Held until the removal is answered): no status write.
/// When another finalizer keeps the claim after ours, a holder reads `Released` before its node
/// goes, as for every other release; so does the holder of a `ClusterLock` other clusters
/// share (`final_first`), whose next holder may be another cluster's operator's, which counts
/// nothing of ours and writes its grant the moment the node goes. A claim that does not hold
/// keeps its status (nobody is granted because it leaves). No event: the object is on its way
/// out.
pub fn deleted(claim: &LockClaim, known_held: bool, final_first: bool, now: Timestamp) -> Plan {
    let mut plan =
        Plan { status: claim.status.clone().unwrap_or_default(), release: true, cleanup: true, ..Plan::default() };
    let terminal = plan.status.phase.is_some_and(Phase::is_terminal);
    if final_first && !terminal && (plan.status.phase == Some(Phase::Held) || known_held) {
        let message = "the claim was deleted".to_string();
        plan = plan.finish(Phase::Released, "ClaimDeleted", message, claim.metadata.generation, &Time(now));
        plan.events.clear();
    }
    plan
}

/// A claim whose spec cannot be served.
pub fn invalid(claim: &LockClaim, message: String, now: Timestamp) -> Plan {
    let mut plan = Plan { status: claim.status.clone().unwrap_or_default(), ..Plan::default() };
    if plan.status.phase.is_some_and(Phase::is_terminal) {
        return plan;
    }
    plan = plan.finish(Phase::Invalid, "InvalidSpec", message, claim.metadata.generation, &Time(now));
    plan.status.observed_generation = claim.metadata.generation;
    plan.status.lock = Some(claim.spec.lock_label()).filter(|l| !l.is_empty());
    plan
}

/// The claim's plan: the rules that can end it whatever it waits for or holds come first
/// (each ends the plan when it applies), then the rules of the phase the lock engine says it is
/// in. Each rule is one function below, in the order they are applied.
pub fn plan(input: Inputs<'_>) -> Plan {
    let facts = Facts::of(&input);
    let mut plan = Plan { status: input.claim.status.clone().unwrap_or_default(), ..Plan::default() };
    conditions::dedup(&mut plan.status.conditions);
    let ended = || -> ControlFlow<Plan, Plan> {
        let plan = already_final(plan, &facts)?;
        let plan = out_of_reach(plan, &facts)?;
        let plan = coming_back(plan, &facts)?;
        let plan = anchor_verdict(plan, &facts)?;
        let plan = holder_pod(plan, &facts)?;
        let plan = node_lost(plan, &facts)?;
        revocation(plan, &facts)
    };
    let mut plan = match ended() {
        ControlFlow::Break(plan) => return plan,
        ControlFlow::Continue(plan) => plan,
    };
    plan = match facts.state {
        None => pending(plan, &facts),
        Some(ContenderState::Waiting { .. }) | Some(ContenderState::RevokeRequested { fencing_token: None, .. }) => {
            match waiting(plan, &facts) {
                ControlFlow::Break(plan) => return plan,
                ControlFlow::Continue(plan) => plan,
            }
        }
        Some(s) if s.is_held() => match held(plan, &facts, s) {
            ControlFlow::Break(plan) => return plan,
            ControlFlow::Continue(plan) => plan,
        },
        // Released, or lost during a session change: nothing to record until re-anchored.
        Some(_) => plan,
    };
    if facts.spec.several {
        record_parts(&mut plan.status, facts.parts, facts.recorded == Some(Phase::Held));
    } else {
        let node = facts.parts.first().and_then(|p| p.node.clone());
        plan.status.znode = node.or(plan.status.znode.take());
    }
    // Recorded with the claim's first status after its enqueue (no write of its own): every
    // part of a claim over several locks was made by one multi-op, and shares it.
    if let Some(ticket) = facts.parts.iter().find_map(|p| p.ticket) {
        plan.status.ticket = Some(ticket.to_string());
    }
    // No backstop entry in the controller's scheduler for a claim without a deadline: a change
    // comes as a watch event or an engine trigger, and the walk every `RESYNC` is the safety net.
    plan
}

/// What the rules read, derived once from [`Inputs`].
struct Facts<'a> {
    claim: &'a LockClaim,
    spec: &'a ValidSpec,
    holder: &'a HolderView,
    contender: &'a ContenderView,
    admitting: bool,
    anchor_verdict: Option<&'a str>,
    hold_until: Option<Timestamp>,
    superseded_by: Option<&'a str>,
    now: Timestamp,
    now_t: Time,
    generation: Option<i64>,
    /// The phase the claim's status records (what this plan starts from).
    recorded: Option<Phase>,
    created: Timestamp,
    /// The holder pod's name, for messages.
    pod: &'a str,
    state: Option<&'a ContenderState>,
    parts: &'a [PartView],
    waiting_for: Option<String>,
    held_now: bool,
}

impl<'a> Facts<'a> {
    fn of(input: &'a Inputs<'a>) -> Facts<'a> {
        let (state, parts, waiting_for) = match &input.contender {
            ContenderView::Tracked { state, parts, waiting_for } => (Some(state), &parts[..], waiting_for.clone()),
            ContenderView::Untracked => (None, &[][..], None),
        };
        Facts {
            claim: input.claim,
            spec: input.spec,
            holder: &input.holder,
            contender: &input.contender,
            admitting: input.admitting,
            anchor_verdict: input.anchor_verdict.as_deref(),
            hold_until: input.hold_until,
            superseded_by: input.superseded_by.as_deref(),
            now: input.now,
            now_t: Time(input.now),
            generation: input.claim.metadata.generation,
            recorded: input.claim.status.as_ref().and_then(|s| s.phase),
            created: input.claim.metadata.creation_timestamp.as_ref().map_or(input.now, |t| t.0),
            pod: input.spec.holder_pod.as_deref().unwrap_or_default(),
            state,
            parts,
            waiting_for,
            held_now: state.is_some_and(ContenderState::is_held),
        }
    }

    /// Ends the claim in `phase`.
    fn finish(&self, plan: Plan, phase: Phase, reason: &'static str, message: String) -> ControlFlow<Plan, Plan> {
        ControlFlow::Break(plan.finish(phase, reason, message, self.generation, &self.now_t))
    }
}

/// Final: only make sure the node is gone.
fn already_final(mut plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    if !facts.recorded.is_some_and(Phase::is_terminal) {
        return ControlFlow::Continue(plan);
    }
    plan.release = matches!(facts.contender, ContenderView::Tracked { .. });
    ControlFlow::Break(plan)
}

/// ZooKeeper is out of reach and the claim holds a lock that other clients or clusters share:
/// once its session expires on the server one of them is granted, and this side cannot see it
/// happen. So the claim ends `Lost` (its final status needs the Kubernetes API only) by the
/// moment the session could first have expired, whether or not the connection comes back
/// later: the merged history of every cluster never shows two holders. Safety over an
/// uninterrupted hold: a cut shorter than the session would have let it keep the lock, but no
/// one can tell in time which cut that is.
fn out_of_reach(mut plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    let Some(until) = facts.hold_until else { return ControlFlow::Continue(plan) };
    if facts.recorded != Some(Phase::Held) && !facts.held_now {
        return ControlFlow::Continue(plan);
    }
    if facts.now >= until {
        let msg = "ZooKeeper was out of reach and this lock is shared with other clients or clusters, which are \
                   granted it once the session expires: ended before that could happen"
            .to_string();
        plan.status.observed_generation = facts.generation;
        return facts.finish(plan, Phase::Lost, "ConnectionLost", msg);
    }
    plan.requeue_at(facts.now, until);
    ControlFlow::Continue(plan)
}

/// While a new session is being re-anchored, a claim that was queued may not be back yet:
/// leave its status alone (never turn Held into anything but a final phase). Past this rule the
/// status is the plan's to write.
fn coming_back(mut plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    if !facts.admitting && matches!(facts.recorded, Some(Phase::Held | Phase::Waiting)) && !facts.held_now {
        // Sooner if a rule before asked (a hold that must end while out of reach).
        let soon = Duration::from_secs(1);
        plan.requeue_after = Some(plan.requeue_after.map_or(soon, |w| w.min(soon)));
        return ControlFlow::Break(plan);
    }
    plan.status.observed_generation = facts.generation;
    plan.status.lock = Some(facts.spec.lock_label());
    ControlFlow::Continue(plan)
}

/// Re-anchoring found that a recorded holder cannot prove it kept the lock.
fn anchor_verdict(plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    match facts.anchor_verdict {
        Some(why) => facts.finish(plan, Phase::Lost, "SessionLost", why.to_string()),
        None => ControlFlow::Continue(plan),
    }
}

/// The holder pod: bound at first sight; gone, replaced or finished releases the claim; one
/// that does not appear within [`HOLDER_APPEAR_WINDOW`] makes it Invalid.
fn holder_pod(mut plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    let pod = facts.pod;
    match facts.holder {
        HolderView::NotRequested => {}
        HolderView::Missing if plan.status.holder_uid.is_some() => {
            let msg = format!("holder pod {pod} was deleted");
            return facts.finish(plan, Phase::Released, "HolderGone", msg);
        }
        HolderView::Missing => {
            let deadline = after(facts.created, HOLDER_APPEAR_WINDOW);
            if facts.now >= deadline {
                let msg = format!(
                    "holder pod {pod:?} does not exist in namespace {:?} (waited {}s for it to appear): create the \
                     pod first, or fix spec.holder.podName in a new claim",
                    facts.claim.metadata.namespace.as_deref().unwrap_or_default(),
                    HOLDER_APPEAR_WINDOW.as_secs()
                );
                return facts.finish(plan, Phase::Invalid, "HolderPodNotFound", msg);
            }
            let msg = format!("waiting for holder pod {pod} to appear");
            set_phase(&mut plan, Phase::Pending, "HolderPodNotFound", &msg, facts.generation, &facts.now_t);
            plan.requeue_at(facts.now, deadline);
            return ControlFlow::Break(plan);
        }
        HolderView::Present { uid, finished } => {
            match plan.status.holder_uid.as_deref() {
                None => plan.status.holder_uid = Some(uid.clone()),
                Some(bound) if bound != uid => {
                    let msg = format!("holder pod {pod} was replaced by a new pod of the same name (uid {uid})");
                    return facts.finish(plan, Phase::Released, "HolderGone", msg);
                }
                Some(_) => {}
            }
            if let Some(phase) = finished {
                let msg = format!("holder pod {pod} finished (phase {phase})");
                return facts.finish(plan, Phase::Released, "HolderGone", msg);
            }
        }
    }
    ControlFlow::Continue(plan)
}

/// The contender's node vanished (or never came back after a new session).
fn node_lost(plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    if let Some(ContenderState::Lost { why }) = facts.state {
        let (reason, msg) = match why {
            LostReason::SessionExpired => ("SessionLost", "the ZooKeeper session ended with the node".to_string()),
            LostReason::DeletedByOther => ("NodeDeleted", "the znode was deleted by another ZooKeeper client".into()),
            LostReason::Failed(e) => ("ZooKeeperError", format!("ZooKeeper refused an operation: {e}")),
        };
        if *why != LostReason::SessionExpired || facts.admitting {
            return facts.finish(plan, Phase::Lost, reason, msg);
        }
    }
    if facts.recorded == Some(Phase::Held) && !facts.held_now && facts.admitting {
        // Never silently from Held to anything but a final phase: a holder that is not held any
        // more lost the lock (its node came back behind somebody, or not at all).
        let msg = match facts.state {
            None => "the znode is gone and the claim could not be re-anchored".to_string(),
            Some(_) => "after a new ZooKeeper session the claim's node could not come back first".to_string(),
        };
        return facts.finish(plan, Phase::Lost, "SessionLost", msg);
    }
    ControlFlow::Continue(plan)
}

/// Revocation: by annotation, or written into the znode by another client. A waiting claim
/// leaves the queue; a holder is asked, and loses the lock when the grace period runs out.
fn revocation(mut plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    let (generation, now, now_t, spec) = (facts.generation, facts.now, &facts.now_t, facts.spec);
    let annotation = facts.claim.metadata.annotations.as_ref().and_then(|a| a.get(REVOKE_ANNOTATION));
    let from_znode = match facts.state {
        Some(ContenderState::RevokeRequested { reason, .. }) => Some(reason.clone()),
        _ => None,
    };
    let revoke =
        annotation.map(|r| if r.is_empty() { "revoked".to_string() } else { r.clone() }).or(from_znode.clone());
    let Some(reason) = revoke else { return ControlFlow::Continue(plan) };
    if !facts.held_now {
        let msg = format!("revoked while not holding the lock: {reason}");
        return facts.finish(plan, Phase::Revoked, "Revoked", msg);
    }
    let requested_at = conditions::get(&plan.status.conditions, REVOKE_REQUESTED)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0);
    match requested_at {
        None => {
            conditions::set(
                &mut plan.status.conditions,
                REVOKE_REQUESTED,
                true,
                "RevokeRequested",
                &reason,
                generation,
                now_t,
            );
            if from_znode.is_none() {
                plan.write_revoke = Some(reason.clone());
            }
            if spec.holder_pod.is_some() {
                plan.annotate_pod = Some(reason.clone());
            }
            let note = format!("revocation requested ({reason}); force release in {}s", spec.grace.as_secs());
            plan.event(false, "RevokeRequested", note);
            plan.requeue_at(now, after(now, spec.grace));
        }
        Some(at) => {
            let deadline = after(at, spec.grace);
            if now >= deadline {
                let msg = format!("revoked ({reason}); the grace period of {}s ran out", spec.grace.as_secs());
                return facts.finish(plan, Phase::Revoked, "Revoked", msg);
            }
            plan.requeue_at(now, deadline);
        }
    }
    ControlFlow::Continue(plan)
}

/// Not in the engine: to be enqueued. A claim recorded Waiting that the engine does not track
/// never held anything, so it is queued again (at the back) rather than failed. This is how a
/// deposed leader's late status write ends: sent before it stepped down, delivered after this
/// term listed and re-anchored the claims (the chaos suite's API hang).
fn pending(mut plan: Plan, facts: &Facts) -> Plan {
    let (reason, message) = if facts.recorded == Some(Phase::Waiting) {
        ("Requeued", "queued again: its znode is gone (a new ZooKeeper session or leader)")
    } else {
        ("Pending", "accepted; the znode is not created yet")
    };
    set_phase(&mut plan, Phase::Pending, reason, message, facts.generation, &facts.now_t);
    plan.enqueue = facts.admitting;
    plan
}

/// Waiting in the queue: its place and whom it waits for, until its acquire timeout or a newer
/// claim of its supersede group.
fn waiting(mut plan: Plan, facts: &Facts) -> ControlFlow<Plan, Plan> {
    let (spec, now) = (facts.spec, facts.now);
    let ahead = match facts.state {
        Some(ContenderState::Waiting { ahead, .. }) => *ahead as i64,
        _ => plan.status.position.unwrap_or(0),
    };
    if let (Some(newer), Some(group)) = (facts.superseded_by, spec.supersede_group.as_deref()) {
        let msg = format!("superseded by the newer claim {newer} of group {group} while waiting");
        return facts.finish(plan, Phase::Superseded, "Superseded", msg);
    }
    if spec.acquire_timeout == Some(Duration::ZERO) {
        let msg = "the lock was busy and acquireTimeoutSeconds is 0 (try once)".to_string();
        return facts.finish(plan, Phase::Expired, "Expired", msg);
    }
    if let Some(timeout) = spec.acquire_timeout {
        let deadline = after(facts.created, timeout);
        if now >= deadline {
            let msg = format!("not held within acquireTimeoutSeconds ({}s)", timeout.as_secs());
            return facts.finish(plan, Phase::Expired, "Expired", msg);
        }
        plan.requeue_at(now, deadline);
    }
    if facts.recorded != Some(Phase::Waiting) {
        plan.event(false, "Waiting", format!("queued behind {} contender(s)", ahead));
    }
    let msg = format!("{ahead} contender(s) ahead");
    set_phase(&mut plan, Phase::Waiting, "Waiting", &msg, facts.generation, &facts.now_t);
    plan.status.position = Some(ahead);
    plan.status.waiting_for = facts.waiting_for.clone();
    ControlFlow::Continue(plan)
}

/// Held: the grant (token, acquiredAt, the lease), then the lease's renewals and its end.
fn held(mut plan: Plan, facts: &Facts, state: &ContenderState) -> ControlFlow<Plan, Plan> {
    let (claim, spec, now, now_t) = (facts.claim, facts.spec, facts.now, &facts.now_t);
    let token = state.fencing_token().unwrap_or_default();
    if facts.recorded != Some(Phase::Held) {
        // A claim over several locks has a token per lock (in status.locks), none of its own.
        plan.status.fencing_token = (!spec.several).then(|| token.to_string());
        plan.status.acquired_at = Some(now_t.clone());
        plan.status.lease_expires_at = spec.lease.map(|l| Time(after(now, l)));
        plan.status.renewed = renew_value(claim);
        let note = if spec.several {
            let tokens: Vec<String> = facts
                .parts
                .iter()
                .map(|p| format!("{} {}", p.lock_name, p.state.fencing_token().unwrap_or_default()))
                .collect();
            format!("locks held with fencing tokens {}", tokens.join(", "))
        } else {
            format!("lock held with fencing token {token}")
        };
        // An event for a grant after a wait, which a person may want explained; a grant
        // at once is in the status alone (acquiredAt), one write less per claim.
        if facts.recorded == Some(Phase::Waiting) {
            let waited = now.duration_since(facts.created).as_secs_f64().max(0.0);
            plan.event(false, "Acquired", format!("{note}, after waiting {waited:.1}s"));
        }
    }
    set_phase(&mut plan, Phase::Held, "Acquired", "the lock is held", facts.generation, now_t);
    plan.status.position = Some(0);
    plan.status.waiting_for = None;
    if let Some(lease) = spec.lease {
        let renew = renew_value(claim);
        if renew != plan.status.renewed {
            plan.status.renewed = renew;
            plan.status.lease_expires_at = Some(Time(after(now, lease)));
        }
        let expires = plan.status.lease_expires_at.as_ref().map_or(after(now, lease), |t| t.0);
        if now >= expires {
            let msg = format!("the lease of {}s ran out without renewal", lease.as_secs());
            return facts.finish(plan, Phase::Released, "LeaseExpired", msg);
        }
        plan.requeue_at(now, expires);
    }
    ControlFlow::Continue(plan)
}

/// `t` plus `d`, the last representable time if that is later: times read from status data (a
/// condition's transition, a lease's end) may be anything, and must not overflow.
fn after(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

/// Where a claim over several locks stands in each (`status.locks`, in the order of the spec):
/// its node and, while it waits, its place and whom it waits for; once held, each lock's
/// fencing token, kept from the first grant (a re-anchored holder's new nodes have new ones).
fn record_parts(status: &mut crate::api::LockClaimStatus, parts: &[PartView], was_held: bool) {
    if parts.is_empty() {
        return;
    }
    let before = std::mem::take(&mut status.locks);
    status.locks = parts
        .iter()
        .map(|part| {
            let old = before.iter().find(|l| l.lock_name == part.lock_name);
            let held = part.state.is_held();
            let token = match (was_held, old.and_then(|o| o.fencing_token.clone())) {
                (true, Some(kept)) => Some(kept),
                _ => part
                    .state
                    .fencing_token()
                    .filter(|_| held && status.phase == Some(Phase::Held))
                    .map(|t| t.to_string()),
            };
            let ahead = match &part.state {
                ContenderState::Waiting { ahead, .. } => Some(*ahead as i64),
                _ if held => Some(0),
                _ => old.and_then(|o| o.position),
            };
            ClaimLockStatus {
                lock_name: part.lock_name.clone(),
                fencing_token: token,
                znode: part.node.clone().or_else(|| old.and_then(|o| o.znode.clone())),
                position: ahead.filter(|_| !status.phase.is_some_and(Phase::is_terminal)),
                waiting_for: part.waiting_for.clone().filter(|_| !held),
            }
        })
        .collect();
}

fn renew_value(claim: &LockClaim) -> Option<String> {
    claim.metadata.annotations.as_ref().and_then(|a| a.get(RENEW_ANNOTATION)).cloned()
}

fn set_phase(plan: &mut Plan, phase: Phase, reason: &str, message: &str, generation: Option<i64>, now: &Time) {
    plan.status.phase = Some(phase);
    let held = phase == Phase::Held;
    conditions::set(&mut plan.status.conditions, HELD, held, reason, message, generation, now);
    conditions::set(&mut plan.status.conditions, FINISHED, false, reason, message, generation, now);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{validate, LockClaimSpec};

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn claim(spec: LockClaimSpec) -> LockClaim {
        let mut c = LockClaim::new("job-a", spec);
        c.metadata.namespace = Some("shop".into());
        c.metadata.generation = Some(1);
        c.metadata.creation_timestamp = Some(Time(t(0)));
        c
    }

    fn spec() -> LockClaimSpec {
        serde_json::from_value(serde_json::json!({ "lockName": "db" })).unwrap()
    }

    fn tracked(state: ContenderState) -> ContenderView {
        let part = PartView {
            lock_name: "db".into(),
            node: Some("/zklock/locks/shop/db/write-x-lock-0000000001".into()),
            state: state.clone(),
            waiting_for: None,
            ticket: None,
        };
        ContenderView::Tracked { state, parts: vec![part], waiting_for: None }
    }

    fn run(c: &LockClaim, holder: HolderView, contender: ContenderView, now: Timestamp) -> Plan {
        run_as(c, holder, contender, now, true)
    }

    fn run_as(c: &LockClaim, holder: HolderView, contender: ContenderView, now: Timestamp, admitting: bool) -> Plan {
        let spec = validate(c).unwrap();
        plan(Inputs {
            claim: c,
            spec: &spec,
            holder,
            contender,
            admitting,
            anchor_verdict: None,
            hold_until: None,
            superseded_by: None,
            now,
        })
    }

    fn with_status(mut c: LockClaim, p: &Plan) -> LockClaim {
        c.status = Some(p.status.clone());
        c
    }

    #[test]
    fn a_new_claim_is_pending_and_enqueued_only_when_admitting() {
        let c = claim(spec());
        let p = run(&c, HolderView::NotRequested, ContenderView::Untracked, t(1));
        assert_eq!((p.status.phase, p.enqueue), (Some(Phase::Pending), true));
        let p = run_as(&c, HolderView::NotRequested, ContenderView::Untracked, t(1), false);
        assert!(!p.enqueue, "nothing is enqueued before re-anchoring");
    }

    #[test]
    fn only_a_claim_with_a_deadline_is_looked_at_again_on_its_own() {
        // Held or waiting without a deadline: no entry in the controller's scheduler (the walk
        // every RESYNC is the safety net); with one (a holder pod still to appear), a requeue.
        let c = claim(spec());
        let held = run(&c, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 1 }), t(1));
        assert_eq!((held.status.phase, held.requeue_after), (Some(Phase::Held), None));
        let waiting = ContenderState::Waiting { ahead: 1, watching: "n-1".into() };
        let waiting = run(&c, HolderView::NotRequested, tracked(waiting), t(1));
        assert_eq!((waiting.status.phase, waiting.requeue_after), (Some(Phase::Waiting), None));
        let mut s = spec();
        s.holder = Some(crate::api::Holder { pod_name: "later".into(), namespace: None });
        let pending = run(&claim(s), HolderView::Missing, ContenderView::Untracked, t(5));
        assert!(pending.requeue_after.is_some_and(|d| d <= Duration::from_secs(26)), "{:?}", pending.requeue_after);
        let mut revoked = with_status(c, &held);
        revoked.metadata.annotations = Some([(REVOKE_ANNOTATION.to_string(), "done".to_string())].into());
        revoked.spec.revocation_grace_period_seconds = Some(0);
        let done = run(&revoked, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 1 }), t(2));
        let done = run(&with_status(revoked, &done), HolderView::NotRequested, ContenderView::Untracked, t(3));
        assert!(done.status.phase.is_some_and(Phase::is_terminal), "{:?}", done.status.phase);
        assert_eq!(done.requeue_after, None);
    }

    #[test]
    fn held_sets_token_once_and_keeps_it() {
        let c = claim(spec());
        let p = run(&c, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 42 }), t(5));
        assert_eq!(p.status.phase, Some(Phase::Held));
        assert_eq!(p.status.fencing_token.as_deref(), Some("42"));
        assert!(conditions::is_true(&p.status.conditions, HELD));
        assert!(!conditions::is_true(&p.status.conditions, FINISHED));
        assert!(p.events.is_empty(), "a grant at once is in the status alone");
        // Re-anchored with a new node (new czxid): the recorded token stays.
        let c = with_status(c, &p);
        let p2 = run(&c, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 99 }), t(9));
        assert_eq!(p2.status.fencing_token.as_deref(), Some("42"));
        assert!(p2.events.is_empty());
    }

    #[test]
    fn a_grant_after_a_wait_is_an_event_that_says_how_long() {
        let c = claim(spec());
        let waiting = ContenderState::Waiting { ahead: 1, watching: "_c_x-lock-0000000009".into() };
        let p = run(&c, HolderView::NotRequested, tracked(waiting), t(1));
        assert_eq!(p.events.iter().map(|e| e.reason).collect::<Vec<_>>(), vec!["Waiting"]);
        let c = with_status(c, &p);
        let p = run(&c, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 7 }), t(9));
        assert_eq!(p.events.iter().map(|e| e.reason).collect::<Vec<_>>(), vec!["Acquired"]);
        assert!(p.events[0].note.contains("fencing token 7, after waiting"), "{}", p.events[0].note);
    }

    #[test]
    fn a_holder_that_comes_back_waiting_is_lost_never_waiting() {
        let c = claim(spec());
        let p = run(&c, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 1 }), t(1));
        let c = with_status(c, &p);
        let waiting = ContenderState::Waiting { ahead: 1, watching: "_c_x-lock-0000000009".into() };
        let p = run(&c, HolderView::NotRequested, tracked(waiting), t(2));
        assert_eq!(p.status.phase, Some(Phase::Lost));
        assert!(p.release && conditions::is_true(&p.status.conditions, FINISHED));
    }

    #[test]
    fn a_waiter_the_engine_does_not_track_is_queued_again_not_lost() {
        let c = claim(spec());
        let waiting = ContenderState::Waiting { ahead: 1, watching: "_c_x-lock-0000000009".into() };
        let p = run(&c, HolderView::NotRequested, tracked(waiting), t(1));
        let c = with_status(c, &p);
        assert_eq!(p.status.phase, Some(Phase::Waiting));
        let p = run(&c, HolderView::NotRequested, ContenderView::Untracked, t(2));
        assert_eq!((p.status.phase, p.enqueue), (Some(Phase::Pending), true));
        assert!(!conditions::is_true(&p.status.conditions, FINISHED));
    }

    #[test]
    fn a_deleted_holder_kept_by_another_finalizer_reads_released_before_its_node_goes() {
        let c = claim(spec());
        let p = run(&c, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 1 }), t(1));
        let held = with_status(c.clone(), &p);
        let p = deleted(&held, false, true, t(2));
        assert_eq!(p.status.phase, Some(Phase::Released));
        assert!(!conditions::is_true(&p.status.conditions, HELD));
        assert!(conditions::is_true(&p.status.conditions, FINISHED));
        assert!(p.release && p.events.is_empty());
        let p = deleted(&held, false, false, t(2));
        assert_eq!(p.status, held.status.clone().unwrap(), "no write when it leaves with the operator's finalizer");
        assert!(p.release);

        let waiting = ContenderState::Waiting { ahead: 1, watching: "_c_x-lock-0000000009".into() };
        let p = run(&c, HolderView::NotRequested, tracked(waiting), t(1));
        let waiter = with_status(c, &p);
        let p = deleted(&waiter, false, true, t(2));
        assert_eq!(p.status, waiter.status.clone().unwrap(), "no write for a claim that does not hold");
        assert!(p.release);
        let p = deleted(&waiter, true, true, t(2));
        assert_eq!(p.status.phase, Some(Phase::Released), "held as the operator last wrote, the copy is older");
    }

    #[test]
    fn nothing_is_demoted_while_a_new_session_is_re_anchored() {
        let c = claim(spec());
        let p = run(&c, HolderView::NotRequested, tracked(ContenderState::Held { fencing_token: 1 }), t(1));
        let c = with_status(c, &p);
        let waiting = ContenderState::Waiting { ahead: 1, watching: "_c_x-lock-0000000009".into() };
        for contender in [tracked(waiting), ContenderView::Untracked] {
            let p = run_as(&c, HolderView::NotRequested, contender, t(2), false);
            assert_eq!(p.status, c.status.clone().unwrap(), "status untouched until re-anchored");
            assert!(!p.release && !p.enqueue && p.events.is_empty());
        }
    }

    #[test]
    fn holder_pod_binding_replacement_and_completion() {
        let mut s = spec();
        s.holder = Some(crate::api::Holder { pod_name: "worker-0".into(), namespace: None });
        let c = claim(s);
        let present = |uid: &str| HolderView::Present { uid: uid.into(), finished: None };
        let p = run(&c, present("u1"), ContenderView::Untracked, t(1));
        assert_eq!(p.status.holder_uid.as_deref(), Some("u1"));
        let c = with_status(c, &p);
        let p = run(&c, present("u2"), tracked(ContenderState::Held { fencing_token: 3 }), t(2));
        assert_eq!(p.status.phase, Some(Phase::Released));
        assert!(p.release);
        assert!(conditions::get(&p.status.conditions, HELD).unwrap().reason == "HolderGone");
        let p = run(
            &c,
            HolderView::Present { uid: "u1".into(), finished: Some("Failed".into()) },
            tracked(ContenderState::Held { fencing_token: 3 }),
            t(2),
        );
        assert_eq!(p.status.phase, Some(Phase::Released));
        let p = run(&c, HolderView::Missing, tracked(ContenderState::Held { fencing_token: 3 }), t(2));
        assert_eq!(p.status.phase, Some(Phase::Released));
    }

    #[test]
    fn a_holder_pod_may_appear_late_but_not_too_late() {
        let mut s = spec();
        s.holder = Some(crate::api::Holder { pod_name: "later".into(), namespace: None });
        let c = claim(s);
        let p = run(&c, HolderView::Missing, ContenderView::Untracked, t(5));
        assert_eq!((p.status.phase, p.enqueue), (Some(Phase::Pending), false));
        assert!(p.requeue_after.unwrap() <= Duration::from_secs(26));
        let p = run(&c, HolderView::Missing, ContenderView::Untracked, t(31));
        assert_eq!(p.status.phase, Some(Phase::Invalid));
        assert!(conditions::get(&p.status.conditions, INVALID).unwrap().message.contains("does not exist"));
    }

    #[test]
    fn a_shared_hold_out_of_reach_of_zookeeper_ends_lost_before_the_session_could_expire() {
        let c = claim(spec());
        let held = ContenderState::Held { fencing_token: 7 };
        let c = with_status(c.clone(), &run(&c, HolderView::NotRequested, tracked(held), t(1)));
        let asked = ContenderState::RevokeRequested { reason: "connection lost".into(), fencing_token: Some(7) };
        let out = |contender: ContenderView, now: Timestamp, admitting: bool| {
            let spec = validate(&c).unwrap();
            let (holder, hold_until) = (HolderView::NotRequested, Some(t(5)));
            let superseded_by = None;
            plan(Inputs {
                claim: &c,
                spec: &spec,
                holder,
                contender,
                admitting,
                anchor_verdict: None,
                hold_until,
                superseded_by,
                now,
            })
        };
        // Asked to let go, still Held: looked at again by the deadline, not after the grace.
        let p = out(tracked(asked.clone()), t(2), true);
        assert_eq!(p.status.phase, Some(Phase::Held));
        assert!(conditions::is_true(&p.status.conditions, REVOKE_REQUESTED));
        assert!(p.requeue_after.is_some_and(|d| d <= Duration::from_millis(3_100)), "{:?}", p.requeue_after);
        // By the deadline it is final, whatever the engine says, and before re-anchoring too.
        for contender in [tracked(asked), ContenderView::Untracked] {
            for admitting in [true, false] {
                let p = out(contender.clone(), t(5), admitting);
                assert_eq!(p.status.phase, Some(Phase::Lost), "{contender:?} admitting {admitting}");
                assert_eq!(conditions::get(&p.status.conditions, FINISHED).unwrap().reason, "ConnectionLost");
                assert!(p.release);
            }
        }
        // While the session is being replaced, the 1 s look keeps the deadline if it is nearer.
        let p = out(ContenderView::Untracked, t(4) + Duration::from_millis(500), false);
        assert!(p.requeue_after.is_some_and(|d| d < Duration::from_secs(1)), "{:?}", p.requeue_after);
    }

    #[test]
    fn revocation_waits_the_grace_period_then_revokes() {
        let mut s = spec();
        s.revocation_grace_period_seconds = Some(10);
        let c = claim(s);
        let held = ContenderState::Held { fencing_token: 7 };
        let p = run(&c, HolderView::NotRequested, tracked(held.clone()), t(1));
        let mut c = with_status(c, &p);
        c.metadata.annotations = Some([(REVOKE_ANNOTATION.to_string(), "maintenance".to_string())].into());
        let p = run(&c, HolderView::NotRequested, tracked(held.clone()), t(2));
        assert_eq!(p.write_revoke.as_deref(), Some("maintenance"));
        assert_eq!(p.status.phase, Some(Phase::Held));
        assert!(conditions::is_true(&p.status.conditions, REVOKE_REQUESTED));
        assert!(p.requeue_after.unwrap() <= Duration::from_secs(11));
        let c = with_status(c, &p);
        let asked = ContenderState::RevokeRequested { reason: "maintenance".into(), fencing_token: Some(7) };
        let p = run(&c, HolderView::NotRequested, tracked(asked.clone()), t(6));
        assert_eq!((p.status.phase, p.write_revoke.clone(), p.events.len()), (Some(Phase::Held), None, 0));
        let p = run(&c, HolderView::NotRequested, tracked(asked), t(13));
        assert_eq!(p.status.phase, Some(Phase::Revoked));
        assert!(p.release);
    }

    #[test]
    fn a_waiting_claim_that_is_revoked_leaves_the_queue() {
        let mut c = claim(spec());
        c.metadata.annotations = Some([(REVOKE_ANNOTATION.to_string(), String::new())].into());
        let waiting = ContenderState::Waiting { ahead: 2, watching: "n".into() };
        let p = run(&c, HolderView::NotRequested, tracked(waiting), t(1));
        assert_eq!(p.status.phase, Some(Phase::Revoked));
        assert!(p.release);
    }

    #[test]
    fn acquire_timeouts_expire_waiting_claims() {
        let mut s = spec();
        s.acquire_timeout_seconds = Some(0);
        let c = claim(s);
        let waiting = ContenderState::Waiting { ahead: 1, watching: "n".into() };
        let p = run(&c, HolderView::NotRequested, tracked(waiting.clone()), t(1));
        assert_eq!(p.status.phase, Some(Phase::Expired));
        let mut s = spec();
        s.acquire_timeout_seconds = Some(60);
        let c = claim(s);
        let p = run(&c, HolderView::NotRequested, tracked(waiting.clone()), t(30));
        assert_eq!(p.status.phase, Some(Phase::Waiting));
        assert!(p.requeue_after.unwrap() <= Duration::from_secs(31));
        let p = run(&c, HolderView::NotRequested, tracked(waiting), t(61));
        assert_eq!(p.status.phase, Some(Phase::Expired));
    }

    #[test]
    fn a_newer_claim_of_its_group_supersedes_a_waiting_claim_never_a_holder() {
        let mut s = spec();
        s.supersede = Some(Box::new(crate::api::Supersede { group: "deploy-prod".into() }));
        let c = claim(s);
        let spec = validate(&c).unwrap();
        let judge = |contender: ContenderView, newer: Option<&str>| {
            plan(Inputs {
                claim: &c,
                spec: &spec,
                holder: HolderView::NotRequested,
                contender,
                admitting: true,
                anchor_verdict: None,
                hold_until: None,
                superseded_by: newer.map(str::to_string),
                now: t(1),
            })
        };
        let waiting = ContenderState::Waiting { ahead: 1, watching: "n".into() };
        let p = judge(tracked(waiting.clone()), Some("job-b"));
        assert_eq!(p.status.phase, Some(Phase::Superseded));
        let finished = conditions::get(&p.status.conditions, FINISHED).unwrap();
        assert_eq!(finished.reason, "Superseded");
        assert!(finished.message.contains("job-b") && finished.message.contains("deploy-prod"), "{}", finished.message);
        assert!(p.release, "its node leaves the queue");
        assert_eq!(p.events[0].reason, "Superseded");
        assert_eq!(judge(tracked(waiting), None).status.phase, Some(Phase::Waiting), "nobody newer: it waits");
        let held = judge(tracked(ContenderState::Held { fencing_token: 3 }), Some("job-b"));
        assert_eq!(held.status.phase, Some(Phase::Held), "a holder is never superseded");
        assert!(!held.release);
        // Without a group of its own, a claim is not superseded by anybody's.
        let plain = claim(super::tests::spec());
        let plain_spec = validate(&plain).unwrap();
        let p = plan(Inputs {
            claim: &plain,
            spec: &plain_spec,
            holder: HolderView::NotRequested,
            contender: tracked(ContenderState::Waiting { ahead: 1, watching: "n".into() }),
            admitting: true,
            anchor_verdict: None,
            hold_until: None,
            superseded_by: Some("job-b".into()),
            now: t(1),
        });
        assert_eq!(p.status.phase, Some(Phase::Waiting));
    }

    #[test]
    fn leases_expire_unless_renewed() {
        let mut s = spec();
        s.lease_duration_seconds = Some(100);
        let c = claim(s);
        let held = ContenderState::Held { fencing_token: 5 };
        let p = run(&c, HolderView::NotRequested, tracked(held.clone()), t(0));
        assert_eq!(p.status.lease_expires_at, Some(Time(t(100))));
        let mut c = with_status(c, &p);
        c.metadata.annotations = Some([(RENEW_ANNOTATION.to_string(), "1".to_string())].into());
        let p = run(&c, HolderView::NotRequested, tracked(held.clone()), t(90));
        assert_eq!(p.status.lease_expires_at, Some(Time(t(190))));
        let c = with_status(c, &p);
        let p = run(&c, HolderView::NotRequested, tracked(held.clone()), t(150));
        assert_eq!(p.status.phase, Some(Phase::Held));
        let p = run(&c, HolderView::NotRequested, tracked(held), t(191));
        assert_eq!(p.status.phase, Some(Phase::Released));
        assert_eq!(conditions::get(&p.status.conditions, FINISHED).unwrap().reason, "LeaseExpired");
    }

    #[test]
    fn a_final_claim_is_deleted_its_time_to_live_after_it_finished() {
        let ttl = Some(Duration::from_secs(60));
        let c = claim(spec());
        let waiting = run(&c, HolderView::NotRequested, ContenderView::Untracked, t(1));
        assert_eq!(waiting.clone().expire_after(ttl, t(1)), waiting, "a live claim has no time to live");
        let finished = invalid(&c, "bad".into(), t(10)).expire_after(ttl, t(10));
        assert!(!finished.delete);
        assert!(finished.requeue_after.is_some_and(|d| d >= Duration::from_secs(60) && d < Duration::from_secs(61)));
        let c = with_status(c, &finished);
        let later = run(&c, HolderView::NotRequested, ContenderView::Untracked, t(40)).expire_after(ttl, t(40));
        assert!(!later.delete && later.requeue_after.is_some_and(|d| d <= Duration::from_secs(31)), "{later:?}");
        let due = run(&c, HolderView::NotRequested, ContenderView::Untracked, t(70)).expire_after(ttl, t(70));
        assert!(due.delete);
        let kept = run(&c, HolderView::NotRequested, ContenderView::Untracked, t(9_999)).expire_after(None, t(9_999));
        assert!(!kept.delete && kept.requeue_after.is_none(), "no time to live: kept for good");
        let at_once = invalid(&claim(spec()), "bad".into(), t(10)).expire_after(Some(Duration::ZERO), t(10));
        assert!(at_once.delete, "0 deletes it as soon as it is final");
    }

    #[test]
    fn times_at_the_end_of_the_calendar_in_status_data_do_not_overflow() {
        let mut s = spec();
        s.lease_duration_seconds = Some(100);
        s.revocation_grace_period_seconds = Some(10);
        let mut c = claim(s);
        let end = Timestamp::MAX;
        let mut status =
            LockClaimStatus { phase: Some(Phase::Held), lease_expires_at: Some(Time(end)), ..Default::default() };
        conditions::set(&mut status.conditions, REVOKE_REQUESTED, true, "RevokeRequested", "x", None, &Time(end));
        c.status = Some(status);
        c.metadata.annotations = Some([(REVOKE_ANNOTATION.to_string(), "x".to_string())].into());
        let held = ContenderState::RevokeRequested { reason: "x".into(), fencing_token: Some(1) };
        let p = run(&c, HolderView::NotRequested, tracked(held), t(1));
        assert_eq!(p.status.phase, Some(Phase::Held));
        assert!(p.requeue_after.is_some_and(|d| d <= RESYNC), "{:?}", p.requeue_after);
        let finished = invalid(&c, "bad".into(), end).expire_after(Some(Duration::from_secs(60)), t(1));
        assert!(finished.requeue_after.is_some_and(|d| d <= RESYNC));
    }

    #[test]
    fn terminal_claims_stay_terminal() {
        let c = claim(spec());
        let p = invalid(&c, "bad".into(), t(1));
        let c = with_status(c, &p);
        let p = run(&c, HolderView::NotRequested, ContenderView::Untracked, t(2));
        assert_eq!((p.status.phase, p.enqueue, p.release), (Some(Phase::Invalid), false, false));
    }
}
