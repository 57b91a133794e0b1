//! The one place a claim's plan is made (`plan::plan`), and re-made where its inputs change:
//! after the claim enters its queues (at most once), and after the previous holder's departure
//! was awaited (at most once). A grant is then reserved in the registry before anything is
//! written: the API must never show two conflicting holders, so a grant that conflicts with a
//! claim whose final status is not written yet waits for that write.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;

use super::enqueue;
use super::inputs::{self, Snapshot};
use super::plan::{self, HolderView, Inputs, Plan};
use super::supersede;
use crate::api::{LockClaim, Phase, ValidSpec};
use crate::controller::base::settings::{DRAINING_RECHECK, GRANT_BACKSTOP, HOLDER_DEPARTURE};
use crate::controller::base::{Error, Part, Uid};
use crate::controller::context::Context;
use crate::controller::registry::GrantBlocked;
use crate::recipe::Mode;

/// What the claim's reconcile does next.
#[derive(Debug)]
pub enum Decision {
    /// Carry the plan out.
    Write(Plan),
    /// Write the claim's status as it is, stamped with this term's epoch, then look again.
    StampThenWait(Plan, Action),
    /// Nothing to write now: look again then.
    Wait(Action),
}

/// What a grant blocked in the registry does (pure: see the tests).
#[derive(Debug, PartialEq, Eq)]
pub enum Blocked {
    /// The previous holder's finalizer is about to go: wait for it here, briefly, then plan
    /// again.
    AwaitDeparture(Uid),
    /// Look again after [`GRANT_BACKSTOP`] (the registry wakes the claim sooner), having asked
    /// for `trigger`'s reconciles; `stamp`: this claim's status is stamped first.
    Backstop { trigger: Vec<Uid>, stamp: bool },
}

/// `waited`: the departure was awaited once already; `being_deleted`: whether a claim's
/// deletion is under way; `stamped`: whether this claim's copy carries this term's epoch.
pub fn blocked(why: GrantBlocked, waited: bool, being_deleted: impl Fn(&Uid) -> bool, stamped: bool) -> Blocked {
    match why {
        // Its cleanup is under way (its node's deletion is what woke this claim): the removal of
        // its finalizer is answered within milliseconds. Waited for here, once and briefly, the
        // grant follows it at once; woken instead, it came a trip through kube-runtime's queue
        // later (1-2 ms of a 17 ms floor).
        GrantBlocked::Holder(other) if !waited && being_deleted(&other) => Blocked::AwaitDeparture(other),
        // The grant waits until the other's final status is written (by its own reconcile). A
        // holder being deleted is reconciled already (its deletion's event; a failed cleanup is
        // retried by the error policy): asked again, it ran its cleanup a second time right
        // behind the first, a finalizer removal answered 404, in about half the handoffs, next
        // to the grant's write.
        GrantBlocked::Holder(other) => {
            let trigger = if being_deleted(&other) { vec![] } else { vec![other] };
            Blocked::Backstop { trigger, stamp: false }
        }
        // Grants of a lock with permits are written one at a time, each with a token above the
        // last (see `status_write::fresh_tokens`); this one is woken when that write is answered.
        GrantBlocked::Granting(_) => Blocked::Backstop { trigger: vec![], stamp: false },
        // A deposed leader's late write could still make another claim of this lock Held: not
        // before every one of them carries this term's epoch (docs/design.md: fencing). All of
        // them are asked for at once (one by one, each a reconcile behind the last, ten claims
        // held a grant up for 10 s after a leader change); this one's status is stamped as it
        // is, so that it holds no grant up either (two claims waiting for each other's stamp
        // would wait for ever).
        GrantBlocked::Unstamped(others) => Blocked::Backstop { trigger: others, stamp: !stamped },
    }
}

/// Whether the engine says the claim waits (where newest wins can end it).
fn waiting(view: &plan::ContenderView) -> bool {
    matches!(view, plan::ContenderView::Tracked { state: crate::zk::ContenderState::Waiting { .. }, .. })
}

/// Plans the claim, enqueues it if the plan says so, and reserves its grant.
pub async fn decide(
    ctx: &Context,
    uid: &Uid,
    claim: &LockClaim,
    spec: &ValidSpec,
    parts: &[Part],
    holder: HolderView,
    ttl: Option<Duration>,
) -> Result<Decision, Error> {
    let mut now = Timestamp::now();
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let inputs = |snapshot: Snapshot, now: Timestamp| {
        // Read only for a claim that waits, the one state the rule ends (no lookups for others).
        let superseded_by =
            waiting(&snapshot.view).then(|| supersede::read(ctx, uid, namespace, spec, parts).newer).flatten();
        Inputs {
            claim,
            spec,
            holder: holder.clone(),
            admitting: snapshot.admitting(ctx, parts),
            contender: snapshot.view,
            anchor_verdict: ctx.registry.verdict(uid),
            hold_until: inputs::hold_until(ctx, parts, now),
            superseded_by,
            now,
        }
    };
    let snapshot = Snapshot::read(ctx, parts).await;
    if inputs::deleted_by_another(&snapshot.view) && !ctx.engine.epoch_is_current().await? {
        // Deleted by the next leader's re-anchoring (a rollout of unelected operators, say):
        // this process is deposed and writes nothing, least of all Lost for a hold the next
        // leader keeps.
        return Err(Error::NotLeading);
    }
    let mut plan = plan::plan(inputs(snapshot, now));
    let enqueue = plan.enqueue;
    if enqueue {
        if let Some(wait) = enqueue::enqueue(ctx, uid, claim, parts).await? {
            // A claim created earlier enters the queue first; it asks for us when it leaves the
            // gate (the requeue: for when it runs out of patience there instead).
            return Ok(Decision::Wait(Action::requeue(wait)));
        }
        plan = plan::plan(inputs(Snapshot::read(ctx, parts).await, now));
    }
    let copy_held = claim.status.as_ref().and_then(|s| s.phase) == Some(Phase::Held);
    let granting = plan.status.phase == Some(Phase::Held) && ctx.registry.known_phase(uid) != Some(Phase::Held);
    if granting && !copy_held && ctx.writer.leadership().draining() {
        // The installation is being removed and every claim deleted: a grant now would start a
        // gated pod while the pods of the holders just deleted still run. Its node stays first
        // in ZooKeeper, unknown to anybody, until its own deletion releases it.
        tracing::info!("not granted: the installation is being uninstalled");
        return Ok(Decision::Wait(Action::requeue(DRAINING_RECHECK)));
    }
    let mut waited = false;
    while plan.status.phase == Some(Phase::Held) && ctx.registry.known_phase(uid) != Some(Phase::Held) {
        let grant: Vec<(&str, bool, crate::recipe::Limit)> =
            parts.iter().map(|p| (p.lock.as_str(), p.mode == Mode::Exclusive, ctx.engine.limit(&p.lock))).collect();
        let why = match ctx.registry.reserve_grant(uid, &grant) {
            Ok(()) => break,
            Err(why) => why,
        };
        let stamped = claim.status.as_ref().and_then(|s| s.leader_epoch) == ctx.epoch();
        match blocked(why, waited, |other| ctx.is_being_deleted(other), stamped) {
            Blocked::AwaitDeparture(other) => {
                waited = true;
                tracing::debug!(other = %other, "grant waits for the previous holder's finalizer to go");
                if ctx.registry.departure(&other, HOLDER_DEPARTURE).await {
                    now = Timestamp::now();
                    plan = plan::plan(inputs(Snapshot::read(ctx, parts).await, now));
                }
            }
            Blocked::Backstop { trigger, stamp } => {
                let names: Vec<String> = trigger.iter().filter_map(|o| ctx.registry.name(o)).collect();
                tracing::debug!(others = ?names, "grant waits for other claims' writes");
                for other in &trigger {
                    ctx.trigger(other);
                }
                let again = Action::requeue(GRANT_BACKSTOP);
                if stamp {
                    let stamp = Plan { status: claim.status.clone().unwrap_or_default(), ..Plan::default() };
                    return Ok(Decision::StampThenWait(stamp, again));
                }
                return Ok(Decision::Wait(again));
            }
        }
    }
    if matches!(plan.status.phase, Some(Phase::Waiting | Phase::Held)) {
        // Newest wins: the group's older waiting claims end, each by its own reconcile.
        for older in supersede::read(ctx, uid, namespace, spec, parts).older {
            ctx.trigger(&older);
        }
    }
    if !enqueue && inputs::admitting(ctx, parts) && !matches!(plan.status.phase, Some(Phase::Waiting | Phase::Held)) {
        // Not enqueueable now (waiting for its holder pod, or final): others go first.
        enqueue::leave_gates(ctx, uid);
    }
    Ok(Decision::Write(plan.expire_after(ttl, now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> Uid {
        s.into()
    }

    #[test]
    fn each_blocked_grant_waits_for_what_blocks_it() {
        let deleting = |u: &Uid| &**u == "leaving";
        assert_eq!(
            blocked(GrantBlocked::Holder(uid("leaving")), false, deleting, true),
            Blocked::AwaitDeparture(uid("leaving")),
            "a holder being deleted is awaited here, once"
        );
        assert_eq!(
            blocked(GrantBlocked::Holder(uid("leaving")), true, deleting, true),
            Blocked::Backstop { trigger: vec![], stamp: false },
            "awaited once already: woken by the registry; its reconcile runs already, so not asked for"
        );
        assert_eq!(
            blocked(GrantBlocked::Holder(uid("holder")), false, deleting, true),
            Blocked::Backstop { trigger: vec![uid("holder")], stamp: false },
            "a holder not being deleted is asked for its final status"
        );
        assert_eq!(
            blocked(GrantBlocked::Granting(uid("other")), false, deleting, false),
            Blocked::Backstop { trigger: vec![], stamp: false },
            "another grant of a lock with permits is being written: woken when it is answered"
        );
        let others = vec![uid("a"), uid("b")];
        assert_eq!(
            blocked(GrantBlocked::Unstamped(others.clone()), false, deleting, true),
            Blocked::Backstop { trigger: others.clone(), stamp: false },
            "every unstamped claim asked for at once"
        );
        assert_eq!(
            blocked(GrantBlocked::Unstamped(others.clone()), false, deleting, false),
            Blocked::Backstop { trigger: others, stamp: true },
            "and this one stamped, so that two claims never wait for each other's stamp"
        );
    }
}
