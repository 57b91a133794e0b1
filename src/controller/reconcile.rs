//! Reconcile one claim: dereference → validate → plan → apply → events.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Error as FinalizerError, Event as Finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::admission::Turn;
use super::parts::{self, Part};
use super::plan::{self, ContenderView, HolderView, Inputs, PartView, Plan};
use super::registry::GrantBlocked;
use super::Uid;
use super::{Context, Error, API_TIMEOUT};
use crate::api::epoch_policy::PARAM_MISSING;
use crate::api::{
    pod_revoke_annotation, validate, KeptClaim, LockClaim, LockClaimStatus, Phase, EPOCH_REFUSAL, FINALIZER,
};
use crate::metrics::SourceLabel;
use crate::recipe::Mode;
use crate::zk::{ContenderSpec, ContenderState};

/// How soon a grant that waits for another claim's write is tried again at the latest: the
/// registry wakes it the moment that write is made, so this is only a backstop.
const GRANT_BACKSTOP: Duration = Duration::from_secs(1);

/// How long a grant waits within its reconcile for the previous holder's finalizer removal to be
/// answered, before it leaves that to the wake-up (`GRANT_BACKSTOP`): a reconcile slot is held
/// meanwhile, so only briefly.
const HOLDER_DEPARTURE: Duration = Duration::from_millis(200);

/// Reconciles one claim; the answer says when to look at it again (its next deadline, or a
/// retry after a refused write), besides the watch events that bring changes.
pub async fn reconcile(uid: Uid, claim: Arc<KeptClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    // Its turn came: where it waits at an admission gate, its patience runs from now.
    ctx.registry.reconciling(&uid, claim.creation_timestamp().map_or(0, |t| t.0.as_second()));
    let namespace = claim.namespace().ok_or(Error::Malformed("a namespace"))?;
    let api: Api<KeptClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    // The finalizer helper writes without asking: ask for it.
    ctx.leadership.time_left().ok_or(Error::NotLeading)?;
    let cleaned = std::sync::atomic::AtomicBool::new(false);
    let result = finalizer(&api, FINALIZER, claim, |event| async {
        match event {
            // Planned from the whole claim again (the store keeps a compact copy).
            Finalizer::Apply(claim) => match claim.unreadable.as_deref() {
                Some(why) => super::unreadable::report(&uid, &claim, why, &ctx).await,
                None => apply(&uid, claim.to_claim(), &ctx).await,
            },
            Finalizer::Cleanup(claim) => {
                let action = match claim.unreadable {
                    Some(_) => super::unreadable::release(&uid, &ctx).await?,
                    None => cleanup(&uid, claim.to_claim(), &ctx).await?,
                };
                cleaned.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(action)
            }
        }
    })
    .await;
    let gone = || {
        // The finalizer is gone (the helper's removal was answered, or it had gone before):
        // the claim holds nothing any more, in the API either, and grants of its locks that
        // waited for it are made now.
        ctx.registry.forget(&uid);
        ctx.metrics.set_phase_counts(&ctx.registry.phase_counts());
    };
    match result {
        Ok(action) => {
            if cleaned.load(std::sync::atomic::Ordering::Relaxed) {
                gone();
            }
            Ok(action)
        }
        // Our own errors keep their metric label.
        Err(FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e)) => Err(e),
        // Gone already: an earlier reconcile removed the finalizer and the claim went with it.
        Err(
            FinalizerError::RemoveFinalizer(kube::Error::Api(s)) | FinalizerError::AddFinalizer(kube::Error::Api(s)),
        ) if s.code == 404 => {
            gone();
            Ok(Action::await_change())
        }
        // The finalizer patch tests the list it read; a cached copy older than our own last
        // write fails that test. The watch event that carries the write is on its way.
        Err(FinalizerError::AddFinalizer(kube::Error::Api(s))) if s.code == 422 || s.code == 409 => {
            tracing::debug!(status = %s.message, "finalizer patch met a newer object; retrying soon");
            Ok(Action::requeue(Duration::from_millis(500)))
        }
        Err(FinalizerError::AddFinalizer(e) | FinalizerError::RemoveFinalizer(e)) => Err(Error::Finalizer(e)),
        Err(FinalizerError::UnnamedObject) => Err(Error::Malformed("a name")),
        Err(FinalizerError::InvalidFinalizer) => Err(Error::Malformed("valid finalizer name")),
    }
}

async fn apply(uid: &Uid, claim: LockClaim, ctx: &Context) -> Result<Action, Error> {
    let namespace = claim.namespace().ok_or(Error::Malformed("a namespace"))?;
    let mut now = Timestamp::now();
    let spec = match validate(&claim) {
        Ok(spec) => spec,
        Err(message) => {
            ctx.registry.observe(uid, &claim.name_any(), &namespace, &[], None);
            let ttl = time_to_live(&claim, None, ctx);
            let plan = plan::invalid(&claim, message, now).expire_after(ttl, now);
            let parts = ctx.parts_tracked(uid);
            return execute(&claim, ctx, uid, &parts, plan).await;
        }
    };
    let parts = parts::of(ctx, &namespace, uid, &spec);
    let phase = claim.status.as_ref().and_then(|s| s.phase);
    if spec.cluster_locks().next().is_some()
        && matches!(phase, None | Some(Phase::Pending))
        && claim.metadata.deletion_timestamp.is_none()
        && parts.iter().all(|p| ctx.engine.state(&p.id).is_none())
    {
        // Not queued yet: its ClusterLocks must admit its namespace first.
        let age = claim
            .creation_timestamp()
            .map_or(Duration::ZERO, |t| Duration::try_from(now.duration_since(t.0)).unwrap_or(Duration::ZERO));
        match super::cluster_locks::admit(ctx, &namespace, &spec, age).await? {
            super::cluster_locks::Admission::Admitted => {}
            super::cluster_locks::Admission::NotYet => return Ok(Action::requeue(Duration::from_secs(1))),
            super::cluster_locks::Admission::Refused(message) => {
                ctx.registry.observe(uid, &claim.name_any(), &namespace, &[], None);
                let ttl = time_to_live(&claim, None, ctx);
                let plan = plan::invalid(&claim, message, now).expire_after(ttl, now);
                return execute(&claim, ctx, uid, &[], plan).await;
            }
        }
    }
    ctx.registry.observe(uid, &claim.name_any(), &namespace, &parts::locks(&parts), spec.holder_pod.as_deref());
    let terminal = phase.is_some_and(Phase::is_terminal);
    if let Some(waiting) = stale_copy(&claim, ctx, uid).await? {
        return Ok(waiting);
    }
    if terminal {
        // Final: no grant waits for this claim's stamp (docs/design.md: fencing).
        ctx.registry.stamped(uid, false);
    }
    if claim.status.as_ref().and_then(|s| s.phase) == Some(Phase::Held) {
        // Its grant landed (whichever of its writes did): none of them is in flight any more.
        ctx.registry.commit_grant(uid);
    }
    if !terminal && ctx.registry.known_phase(uid).is_some_and(Phase::is_terminal) {
        // Final is final: this copy is older than the operator's own final write, and planning
        // from it could bring the claim back. Only make sure the nodes are gone; the watch
        // delivers the write (the backstop below is for a lost event).
        ctx.engine.release_group(&parts::ids(&parts)).await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let holder = if terminal {
        HolderView::NotRequested
    } else {
        holder_view(ctx, &claim, &namespace, spec.holder_pod.as_deref()).await?
    };
    // Admission is asked before the contenders are read and again after (the closure's
    // argument first), and counts only if it held both times: a session that ends in between
    // reads "not admitting", never "admitting, node gone"; and a lock that a re-anchoring pass
    // admits in between (the claims' nodes re-made meanwhile) does not meet a view read before
    // its nodes were re-made: "admitting, node gone" again, a holder turned Lost by mistake.
    let admitting = || ctx.engine.admitting_in(parts.iter().map(|p| p.lock.as_str()));
    let inputs = |(admitting_before, contender): (bool, _), now: Timestamp| Inputs {
        claim: &claim,
        spec: &spec,
        holder: holder.clone(),
        contender,
        admitting: admitting_before && admitting(),
        anchor_verdict: ctx.registry.verdict(uid),
        hold_until: hold_until(ctx, &parts, now),
        now,
    };
    let view = (admitting(), contender_view(ctx, &parts).await);
    if deleted_by_another(&view.1) && !ctx.engine.epoch_is_current().await? {
        // Deleted by the next leader's re-anchoring (a rollout of unelected operators, say):
        // this process is deposed and writes nothing, least of all Lost for a hold the next
        // leader keeps.
        return Err(Error::NotLeading);
    }
    let mut plan = plan::plan(inputs(view, now));
    let enqueue = plan.enqueue;
    if enqueue {
        let created = claim.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
        let (turn, overtaken) = ctx.registry.may_enqueue(uid, created);
        ctx.metrics.count_overtaken(&overtaken);
        if let Turn::Behind(wait) = turn {
            // A claim created earlier enters the queue first; it asks for us when it leaves the
            // gate (the requeue: for when it runs out of patience there instead).
            return Ok(Action::requeue(wait));
        }
        let description = ctx.describe_claim(&namespace, &claim.name_any());
        let specs = parts
            .iter()
            .map(|p| ContenderSpec {
                id: p.id.clone(),
                lock: p.lock.clone(),
                mode: p.mode,
                description: description.clone(),
            })
            .collect();
        // Every lock at once (one multi-op): two claims stand in the same order in every lock
        // they share, so no cycle of waiting can form (docs/user-guide.md: several locks).
        let enqueued = ctx.engine.enqueue_group(specs).await;
        for next in ctx.registry.leave_gates(uid) {
            ctx.trigger(&next);
        }
        enqueued?;
        plan = plan::plan(inputs((admitting(), contender_view(ctx, &parts).await), now));
    }
    let granting = plan.status.phase == Some(Phase::Held) && ctx.registry.known_phase(uid) != Some(Phase::Held);
    if granting && claim.status.as_ref().and_then(|s| s.phase) != Some(Phase::Held) && ctx.leadership.draining() {
        // The installation is being removed and every claim deleted: a grant now would start a
        // gated pod while the pods of the holders just deleted still run. Its node stays first
        // in ZooKeeper, unknown to anybody, until its own deletion releases it.
        tracing::info!("not granted: the installation is being uninstalled");
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let mut waited = false;
    while plan.status.phase == Some(Phase::Held) && ctx.registry.known_phase(uid) != Some(Phase::Held) {
        let grant: Vec<(&str, bool, crate::recipe::Limit)> =
            parts.iter().map(|p| (p.lock.as_str(), p.mode == Mode::Exclusive, ctx.engine.limit(&p.lock))).collect();
        match ctx.registry.reserve_grant(uid, &grant) {
            Ok(()) => break,
            Err(GrantBlocked::Holder(other)) if !waited && ctx.is_being_deleted(&other) => {
                // Its cleanup is under way (its node's deletion is what woke this claim): the
                // removal of its finalizer is answered within milliseconds. Waited for here,
                // once and briefly, the grant follows it at once; woken instead, it came a
                // trip through kube-runtime's queue later (1-2 ms of a 17 ms floor).
                waited = true;
                tracing::debug!(other = %other, "grant waits for the previous holder's finalizer to go");
                if ctx.registry.departure(&other, HOLDER_DEPARTURE).await {
                    now = Timestamp::now();
                    plan = plan::plan(inputs((admitting(), contender_view(ctx, &parts).await), now));
                }
            }
            Err(GrantBlocked::Holder(other)) => {
                // The API must never show two conflicting holders, not even for a moment: this
                // grant waits until the other's final status is written (by its own reconcile).
                tracing::debug!(other = %other, "grant waits for the previous holder's final status");
                // A holder being deleted is reconciled already (its deletion's event; a failed
                // cleanup is retried by the error policy): asked again, it ran its cleanup a
                // second time right behind the first, a finalizer removal answered 404, in about
                // half the handoffs, next to the grant's write.
                if !ctx.is_being_deleted(&other) {
                    ctx.trigger(&other);
                }
                return Ok(Action::requeue(GRANT_BACKSTOP));
            }
            Err(GrantBlocked::Granting(other)) => {
                // Grants of a lock with permits are written one at a time, each with a token
                // above the last (see `fresh_tokens`); this one is woken when that write is
                // answered.
                tracing::debug!(other = %other, "grant waits for another grant of the lock to be written");
                return Ok(Action::requeue(GRANT_BACKSTOP));
            }
            Err(GrantBlocked::Unstamped(others)) => {
                // A deposed leader's late write could still make another claim of this lock
                // Held: not before every one of them carries this term's epoch (docs/design.md: fencing).
                // All of them are asked for at once (one by one, each a reconcile behind the
                // last, ten claims held a grant up for 10 s after a leader change).
                let names: Vec<String> = others.iter().filter_map(|o| ctx.registry.name(o)).collect();
                tracing::debug!(others = ?names, "grant waits until every claim of the lock carries this term's epoch");
                for other in &others {
                    ctx.trigger(other);
                }
                if claim.status.as_ref().and_then(|s| s.leader_epoch) != ctx.epoch() {
                    // This one's status as it is, stamped, so that it holds no grant up either
                    // (two claims waiting for each other's stamp would wait for ever).
                    let stamp = Plan { status: claim.status.clone().unwrap_or_default(), ..Plan::default() };
                    execute(&claim, ctx, uid, &parts, stamp).await?;
                }
                return Ok(Action::requeue(GRANT_BACKSTOP));
            }
        }
    }
    if !enqueue
        && ctx.engine.admitting_in(parts.iter().map(|p| p.lock.as_str()))
        && !matches!(plan.status.phase, Some(Phase::Waiting | Phase::Held))
    {
        // Not enqueueable now (waiting for its holder pod, or final): others go first.
        for next in ctx.registry.leave_gates(uid) {
            ctx.trigger(&next);
        }
    }
    let plan = plan.expire_after(time_to_live(&claim, Some(&spec), ctx), now);
    execute(&claim, ctx, uid, &parts, plan).await
}

/// How long the claim is kept once final: its own `ttlSecondsAfterFinished` (if valid), else the
/// operator's default for claims without an owner (an owner's deletion takes its claims along).
fn time_to_live(claim: &LockClaim, spec: Option<&crate::api::ValidSpec>, ctx: &Context) -> Option<Duration> {
    let own = match spec {
        Some(spec) => spec.ttl_after_finished,
        None => claim.spec.ttl_seconds_after_finished.and_then(|s| u64::try_from(s).ok()).map(Duration::from_secs),
    };
    let owned = claim.metadata.owner_references.as_ref().is_some_and(|o| !o.is_empty());
    own.or(ctx.default_ttl.filter(|_| !owned))
}

/// The claim is being deleted: a holder's final status first, then its node, then (the helper)
/// the finalizer.
async fn cleanup(uid: &Uid, claim: LockClaim, ctx: &Context) -> Result<Action, Error> {
    let parts = match validate(&claim) {
        Ok(spec) => parts::of(ctx, &claim.namespace().unwrap_or_default(), uid, &spec),
        Err(_) => ctx.parts_tracked(uid),
    };
    if stale_copy(&claim, ctx, uid).await?.is_some() {
        // Not Ok: the finalizer helper would take that for a finished cleanup and remove the
        // finalizer while the nodes still hold.
        return Err(Error::OutdatedCopy);
    }
    // Held as far as the operator knows: its own Held write may be newer than this copy.
    let held = ctx.registry.known_phase(uid) == Some(Phase::Held);
    let kept_by_others = claim.finalizers().iter().any(|f| f != FINALIZER);
    // Another cluster's next holder is granted the moment the node goes: the API must read
    // this one final before.
    let shared = parts.iter().any(|p| ctx.layout.is_shared_lock(&p.lock));
    let plan = plan::deleted(&claim, held, kept_by_others || shared, Timestamp::now());
    execute(&claim, ctx, uid, &parts, plan).await?;
    tracing::debug!(held, "deleted: released, final status written");
    // Forgotten (and its locks' grants let go on) once the finalizer is gone: see `reconcile`.
    Ok(Action::await_change())
}

/// Checks the copy against the operator's own writes (docs/design.md: fencing). The copy the last status
/// write was planned from is older than that write: nothing is planned from it (the watch
/// brings the newer one; the schedule is the backstop). A copy that carries a later leader's
/// epoch means this process is deposed: nothing is written.
///
/// A copy without this term's epoch is not taken for an old one: the store only moves forward,
/// and after a status write that landed it holds the copy that write was planned from (caught
/// above) or a newer one. So such a copy is somebody else's edit made after the operator's
/// write (an admin's `kubectl patch --subresource=status` that dropped `leaderEpoch`, a restore
/// tool): it is planned from like any other, and the next write stamps the epoch again. Waiting
/// for a copy with the epoch instead would wait for ever, and a claim next in its queue would
/// stall the lock. An old copy planned from by mistake costs no safety either: every status write
/// tests the resourceVersion it was planned from.
async fn stale_copy(claim: &LockClaim, ctx: &Context, uid: &str) -> Result<Option<Action>, Error> {
    if ctx.registry.outdated(uid, claim.metadata.resource_version.as_deref()) {
        // The very copy the last status write was planned from: that write landed, and the
        // watch brings it (and with it a reconcile) any moment; the requeue is a backstop.
        tracing::debug!("this copy is older than the operator's own last write; waiting for the newer one");
        return Ok(Some(Action::requeue(Duration::from_secs(1))));
    }
    let Some(mine) = ctx.epoch() else { return Ok(None) };
    let copy = claim.status.as_ref().and_then(|s| s.leader_epoch);
    // A later term's epoch, unless ZooKeeper's data were made anew since (its zxids start over
    // then): ZooKeeper's epoch node tells.
    if copy.is_some_and(|copy| copy > mine) && !ctx.engine.epoch_is_current().await? {
        return Err(Error::NotLeading);
    }
    if copy == Some(mine) {
        ctx.registry.stamped(uid, false);
    } else if ctx.registry.written(uid) {
        tracing::info!(
            leader_epoch = ?copy,
            "the claim's status was written by someone else after this term's write; planning from it"
        );
    }
    Ok(None)
}

/// The holder pod: from this term's watch where that proves what it says (see `holders`), else
/// as the API has it now. A pod being deleted still counts as present: its containers may
/// still run, and the lock must not move before they stop.
async fn holder_view(
    ctx: &Context,
    claim: &LockClaim,
    namespace: &str,
    pod: Option<&str>,
) -> Result<HolderView, Error> {
    let Some(pod) = pod else { return Ok(HolderView::NotRequested) };
    if let Some(view) = ctx.holder_pods.proven(namespace, pod, super::holders::expected_uid(claim, pod)) {
        ctx.metrics.holder_pod_views.get_or_create(&SourceLabel { source: "watch" }).inc();
        return Ok(view);
    }
    ctx.metrics.holder_pod_views.get_or_create(&SourceLabel { source: "api" }).inc();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let found = tokio::time::timeout(API_TIMEOUT, pods.get_opt(pod))
        .await
        .map_err(|_| Error::Timeout { call: "get_pod" })?
        .map_err(|source| Error::GetPod { pod: pod.to_string(), source })?;
    Ok(found.map_or(HolderView::Missing, |p| super::holders::HolderPod::from(p).view()))
}

/// Whether another ZooKeeper client deleted one of the claim's nodes.
fn deleted_by_another(view: &ContenderView) -> bool {
    let lost = ContenderState::Lost { why: crate::zk::LostReason::DeletedByOther };
    matches!(view, ContenderView::Tracked { parts, .. } if parts.iter().any(|p| p.state == lost))
}

/// While ZooKeeper is out of reach: by when the claim must be ended, if it holds a lock that
/// others share (the earliest of its parts'; see `LockEngine::hold_deadline`), on the clock
/// the plan reads.
fn hold_until(ctx: &Context, parts: &[Part], now: Timestamp) -> Option<Timestamp> {
    let deadline = parts.iter().filter_map(|p| ctx.engine.hold_deadline(&p.id)).min()?;
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    // A span no clock can add is no deadline worth keeping: the hold ends now.
    Some(now.checked_add(left).unwrap_or(now))
}

/// The claim's contenders in the engine (one per lock), each with the claim it waits for named.
async fn contender_view(ctx: &Context, parts: &[Part]) -> ContenderView {
    let mut views: Vec<PartView> = Vec::with_capacity(parts.len());
    for part in parts {
        let Some(state) = ctx.engine.state(&part.id) else { continue };
        let waiting_for = match &state {
            crate::zk::ContenderState::Waiting { watching, .. } => {
                Some(match state.waits_for_contender().map(|id| (id, ctx.registry.name(parts::claim_of(id)))) {
                    Some((_, Some(name))) => name,
                    // A claim this operator does not serve: another cluster's (a ClusterLock),
                    // named by what its node says, `<cluster>/<namespace>/<claim>`. The node
                    // name if that cannot be read (it went meanwhile: the next decision says).
                    Some((_, None)) => ctx
                        .engine
                        .describe(&format!("{}/{watching}", part.lock))
                        .await
                        .ok()
                        .flatten()
                        .unwrap_or_else(|| watching.clone()),
                    None => watching.clone(),
                })
            }
            _ => None,
        };
        views.push(PartView {
            lock_name: part.name.clone(),
            node: ctx.engine.node(&part.id),
            state,
            waiting_for,
            ticket: ctx.engine.ticket(&part.id),
        });
    }
    if views.is_empty() {
        return ContenderView::Untracked;
    }
    // A part the engine lost track of alone (the others tracked) went with its session.
    let mut states: Vec<ContenderState> = views.iter().map(|v| v.state.clone()).collect();
    if views.len() < parts.len() {
        states.push(ContenderState::Lost { why: crate::zk::LostReason::SessionExpired });
    }
    let state = plan::aggregate(&states);
    let waiting_for = views
        .iter()
        .filter_map(|v| match &v.state {
            ContenderState::Waiting { ahead, .. } => Some((*ahead, v.waiting_for.clone())),
            _ => None,
        })
        .max_by_key(|(ahead, _)| *ahead)
        .and_then(|(_, who)| who);
    ContenderView::Tracked { state, parts: views, waiting_for }
}

/// The highest of the numbers out of ZooKeeper a status hands out: fencing tokens, ticket,
/// leader epoch.
fn highest_number(status: &LockClaimStatus) -> i64 {
    let parse = |s: Option<&String>| s.and_then(|s| s.parse::<i64>().ok());
    let tokens = status.locks.iter().map(|l| parse(l.fencing_token.as_ref()));
    [parse(status.fencing_token.as_ref()), parse(status.ticket.as_ref()), status.leader_epoch]
        .into_iter()
        .chain(tokens)
        .flatten()
        .max()
        .unwrap_or(0)
}

async fn execute(claim: &LockClaim, ctx: &Context, uid: &str, parts: &[Part], mut plan: Plan) -> Result<Action, Error> {
    let unchanged =
        plan.cleanup && claim.status.as_ref().map_or(plan.status == Default::default(), |s| *s == plan.status);
    if let Some(epoch) = ctx.epoch().filter(|_| !unchanged) {
        plan.status.leader_epoch = Some(epoch);
    }
    let namespace = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    if let Some(reason) = &plan.write_revoke {
        for part in parts {
            if let Some(node) = ctx.engine.node(&part.id) {
                ctx.engine.request_revocation(&node, reason).await?;
            }
        }
    }
    if let (Some(reason), Some(pod)) = (&plan.annotate_pod, claim.spec.holder.as_ref().map(|h| &h.pod_name)) {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let (key, value) = pod_revoke_annotation(&name, reason);
        let patch = json!({ "metadata": { "annotations": { key: value } } });
        let result = ctx.write("annotate_pod", pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))).await;
        if let Some(e) = write_error(result) {
            // The pod may be gone already; the revocation goes on regardless.
            tracing::info!(pod, error = %e, "could not annotate the holder pod");
        }
    }
    let before = claim.status.clone().unwrap_or_default();
    let granting = plan.status.phase == Some(Phase::Held) && before.phase != Some(Phase::Held);
    if granting {
        fresh_tokens(ctx, parts, &mut plan).await?;
    }
    if plan.status != before {
        // Tokens never go back, also across a ZooKeeper whose data are made anew: what this
        // status hands out is below the floor kept in the API before it is written.
        ctx.token_floor.cover(highest_number(&plan.status)).await?;
        fenced_here(claim, ctx, uid, &namespace, &name).await?;
        // The answer is read as the store reads a claim: only what is kept is decoded.
        let api: Api<KeptClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        let version = claim.metadata.resource_version.as_deref().ok_or(Error::Malformed("a resourceVersion"))?;
        let patch = status_patch(uid, &plan.status, version)?;
        let answer = ctx
            .write("patch_status", api.patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(patch)))
            .await;
        let refused = matches!(answer, Ok(Err(_)));
        if matches!(&answer, Ok(Ok(_)) | Ok(Err(kube::Error::Api(_)))) {
            // Answered: this write landed or never will, and a grant written earlier (tested
            // against the same copy or an older one) cannot land after it.
            ctx.registry.commit_grant(uid);
        }
        if refused && granting && !grant_landed(ctx, &api, &name, uid, &answer).await {
            // A grant reserved for this write did not happen. (One whose answer did not come
            // stays reserved: it may still land, until a newer write of the claim lands.)
            ctx.registry.abandon_grant(uid, before.phase);
        }
        match answer {
            Ok(Ok(_)) => {}
            // The policy's parameter is gone: every status write is refused until it is back (the
            // API server answers 422 for a binding it cannot configure).
            Ok(Err(kube::Error::Api(s))) if s.message.contains(PARAM_MISSING) => {
                let Some(fence) = &ctx.fence else { return Err(Error::EpochParam(s.message)) };
                let repaired = fence.repair(&ctx.client, &ctx.engine, &name, &namespace).await;
                return Err(match repaired {
                    Ok(()) => Error::EpochParam(format!("{} (made again; the write is tried again)", s.message)),
                    Err(e) => Error::from(e),
                });
            }
            // The test of the version failed: this copy is older than the claim (the watch
            // brings the newer one).
            Ok(Err(kube::Error::Api(s))) if s.code == 409 || s.code == 422 => {
                tracing::info!(claim = %name, answer = %s.message, "status write refused; planning again from a newer copy");
                return Err(Error::StatusRefused(s.message));
            }
            // The API server's admission policy refused a term that is over (docs/design.md: fencing).
            Ok(Err(kube::Error::Api(s))) if s.code == 403 && s.message.contains(EPOCH_REFUSAL) => {
                tracing::warn!(claim = %name, answer = %s.message, "status write refused: a newer leader's term is in force");
                return Err(Error::NotLeading);
            }
            Ok(Err(e)) => return Err(Error::PatchStatus(e)),
            Err(e) => return Err(e),
        }
        tracing::debug!(phase = ?plan.status.phase, position = ?plan.status.position, "status written");
        ctx.registry.planned_from(uid, version);
        ctx.registry.stamped(uid, true);
        if granting {
            observe_grant(claim, ctx, parts);
        }
        if before.phase == Some(Phase::Held) && plan.status.phase.is_some_and(Phase::is_terminal) {
            for (part, token) in parts.iter().zip(tokens(&plan.status, parts)) {
                if let Some(token) = token {
                    ctx.registry.token_used(&part.lock, token);
                }
            }
        }
        // The registry's phase is the operator's own last write, never a copy's.
        ctx.registry.set_phase(uid, plan.status.phase);
    }
    if plan.release {
        let was_held = before.phase == Some(Phase::Held);
        // Every lock at once (one multi-op), after the final status.
        if ctx.engine.release_group(&parts::ids(parts)).await? && was_held {
            for part in parts {
                ctx.registry.note_release(&part.lock);
            }
        }
    }
    ctx.metrics.set_phase_counts(&ctx.registry.phase_counts());
    let reference = claim.object_ref(&());
    for event in &plan.events {
        let publish = ctx.events.publish(&reference, event.warning, event.reason, &event.note);
        let published = ctx.write("publish_event", publish).await;
        if let Some(e) = write_error(published) {
            // Events are for people; the claim's status carries the truth.
            tracing::info!(claim = %name, error = %e, "could not publish an event");
        }
    }
    if plan.delete {
        // Preconditioned on the UID: a new claim of the same name is not this one.
        let api: Api<LockClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        let only_this = DeleteParams {
            preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            ..DeleteParams::default()
        };
        match ctx.write("delete_claim", api.delete(&name, &only_this)).await? {
            Ok(_) => tracing::info!(claim = %name, "deleted: its time to live after finishing has passed"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(source) => return Err(Error::Write { call: "delete_claim", source }),
        }
        return Ok(Action::await_change());
    }
    Ok(plan.requeue_after.map_or_else(Action::await_change, Action::requeue))
}

/// No status is written in a namespace before the admission policy is proven to refuse earlier
/// terms' statuses there (see [`super::api_fence::Fence::ready`]). Where it cannot be, the
/// namespace fails alone: each of its claims gets one Warning event per term saying why.
async fn fenced_here(claim: &LockClaim, ctx: &Context, uid: &str, namespace: &str, name: &str) -> Result<(), Error> {
    let Some(fence) = &ctx.fence else { return Ok(()) };
    let Err(e) = fence.ready(&ctx.client, namespace, name).await else { return Ok(()) };
    let e = Error::from(e);
    if let Error::Unfenced(why) = &e {
        if fence.first_warning(uid) {
            let note = format!("no status is written for claims of this namespace: {why}");
            let reference = claim.object_ref(&());
            let published = ctx.write("publish_event", ctx.events.publish(&reference, true, "Unfenced", &note)).await;
            if let Some(e) = write_error(published) {
                tracing::info!(claim = %name, error = %e, "could not publish an event");
            }
        }
    }
    Err(e)
}

/// Whether a grant whose write was refused for a changed claim (409/422) is in the API anyway:
/// an earlier attempt of the same grant, given up on after its timeout, may have landed since
/// and changed the claim. Then the registry must keep it Held, not roll it back to Waiting while
/// the API says Held. Settled by a read; a read that fails keeps the reservation (the safe side:
/// it only holds back other grants until this claim's next reconcile plans again).
async fn grant_landed(
    ctx: &Context,
    api: &Api<KeptClaim>,
    name: &str,
    uid: &str,
    answer: &Result<Result<KeptClaim, kube::Error>, Error>,
) -> bool {
    if !matches!(answer, Ok(Err(kube::Error::Api(s))) if s.code == 409 || s.code == 422) {
        return false;
    }
    match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
        Ok(Ok(Some(now))) => {
            now.metadata.uid.as_deref() == Some(uid)
                && now.phase() == Some(Phase::Held)
                && now.leader_epoch() == ctx.epoch()
        }
        Ok(Ok(None)) => false,
        Ok(Err(_)) | Err(_) => true,
    }
}

/// Each part's fencing token as the status records it, in the order of `parts`.
fn tokens(status: &LockClaimStatus, parts: &[Part]) -> Vec<Option<i64>> {
    parts
        .iter()
        .map(|part| {
            let token = match status.locks.iter().find(|l| l.lock_name == part.name) {
                Some(lock) => lock.fencing_token.as_deref(),
                None => status.fencing_token.as_deref(),
            };
            token.and_then(|t| t.parse().ok())
        })
        .collect()
}

/// A grant is written with a token above every token of its lock granted or ended before.
/// Holders of a lock with permits are not granted in queue order (a claim over several locks may
/// sit among the first N of one while it waits for another, and a grant's write may be held up
/// and made again while other holds began and ended), so a part's first token could read as
/// older than a hold that ended before it. Such a part gets a fresh token from the engine,
/// above every token issued so far. Grants of a lock with permits are written one at a time
/// (the registry's reservation), so no other grant comes between the check and the write.
///
/// The check does not ask for the lock's limit now: a part granted under permits keeps its
/// hold when the permits are lowered or its `Lock` object is deleted (the lock is a mutex
/// again), and its first token is as old as before (chaos run, seed 1795586562701459641: the
/// `Lock` went 0.2 s before such a claim's grant was written, which then carried 8589934793
/// after a hold with 8589934806 had ended). On a mutex that was one all along, only a Shared
/// holder granted beside another can come out below (it takes a fresh one, needlessly but
/// harmlessly); an Exclusive grant waits for every hold it conflicts with, and its token is
/// above theirs.
///
/// In a `ClusterLock` other clusters share, their grants and ends are in no registry here, and
/// each cluster decides from the same directory states: raised permits granted in two clusters
/// from one state carried one token, and a grant whose write was held up landed with a token
/// below a hold another cluster had ended meanwhile. There every attempt of a grant write takes
/// a token written just before it (one ZooKeeper write per grant): ZooKeeper orders those
/// writes, so tokens are unique and grow in the order the grants are written, across clusters.
async fn fresh_tokens(ctx: &Context, parts: &[Part], plan: &mut Plan) -> Result<(), Error> {
    for (i, (part, token)) in parts.iter().zip(tokens(&plan.status, parts)).enumerate() {
        let Some(mut token) = token else { continue };
        // Tokens with permits are each a zxid of their own: an equal one is this grant's own,
        // recorded by an earlier attempt of this write.
        let shared = ctx.layout.is_shared_lock(&part.lock);
        if shared || token < ctx.registry.highest_token(&part.lock) {
            let fresh = ctx.engine.refresh_token(&part.id).await?;
            tracing::debug!(lock = %part.lock, old = token, new = fresh, "a grant takes a fresh fencing token");
            token = fresh;
            match plan.status.locks.get_mut(i).filter(|l| l.lock_name == part.name) {
                Some(lock) => lock.fencing_token = Some(fresh.to_string()),
                None => plan.status.fencing_token = Some(fresh.to_string()),
            }
        }
        ctx.registry.token_used(&part.lock, token);
    }
    Ok(())
}

/// The status write: the whole new status, for this very claim, landing only on the copy it
/// was planned from. A JSON patch replaces the status as a whole (a merge patch would keep the
/// fields the new status leaves out: a new holder kept naming whom it had waited for). Its
/// first operation tests the UID, since the write goes by name: a claim deleted without its
/// finalizer and re-created under the same name must not receive its predecessor's status. Its
/// second tests the resourceVersion planned from: a write that lands late (its answer timed
/// out, it was retried, newer writes followed) or a deposed leader's write (docs/design.md: fencing) is
/// refused once anything else was written to the claim.
fn status_patch(uid: &str, status: &LockClaimStatus, version: &str) -> Result<json_patch::Patch, Error> {
    use json_patch::{jsonptr::Pointer, AddOperation, PatchOperation, TestOperation};
    let test = |path: &'static str, value: serde_json::Value| {
        PatchOperation::Test(TestOperation { path: Pointer::from_static(path).to_buf(), value })
    };
    let value = serde_json::to_value(status).map_err(Error::StatusPatch)?;
    Ok(json_patch::Patch(vec![
        test("/metadata/uid", uid.into()),
        test("/metadata/resourceVersion", version.into()),
        PatchOperation::Add(AddOperation { path: Pointer::from_static("/status").to_buf(), value }),
    ]))
}

/// A write's failure, for a log line: refused, timed out, or not written (not leading).
pub(super) fn write_error<T>(result: Result<Result<T, kube::Error>, Error>) -> Option<String> {
    result.map_or_else(|e| Some(e.to_string()), |r| r.err().map(|e| e.to_string()))
}

fn observe_grant(claim: &LockClaim, ctx: &Context, parts: &[Part]) {
    if let Some(created) = &claim.metadata.creation_timestamp {
        let waited = Timestamp::now().duration_since(created.0).as_secs_f64();
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        for part in parts {
            ctx.metrics.acquire_wait.observe(namespace, &part.name, waited);
        }
    }
    // The handoff that ends here: the latest release among the claim's locks.
    let released = parts.iter().filter_map(|p| ctx.registry.take_release(&p.lock)).min();
    if let Some(since_release) = released {
        ctx.metrics.handoff.observe(since_release.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_write_replaces_the_status_of_the_copy_it_was_planned_from_only() {
        let held = LockClaimStatus { phase: Some(Phase::Held), position: Some(0), ..Default::default() };
        let patch = serde_json::to_value(status_patch("u-1", &held, "41").unwrap()).unwrap();
        assert_eq!(
            patch,
            json!([
                { "op": "test", "path": "/metadata/uid", "value": "u-1" },
                { "op": "test", "path": "/metadata/resourceVersion", "value": "41" },
                { "op": "add", "path": "/status", "value": { "phase": "Held", "position": 0 } },
            ])
        );
    }
}
