//! A claim's pipeline. Its reconcile: served yet? (a term re-anchors first) → the finalizer
//! helper → a claim that cannot be read (`unreadable`) | one as it is (`apply`) | one being
//! deleted (`cleanup`). `apply` reads top to bottom: validate → admit to its `ClusterLock`s
//! (`enqueue`) → guard against copies that must not be planned from (`guard`) → decide: plan,
//! enqueue, reserve the grant (`decide`, the only caller of the pure `plan`, which reads where
//! the claim stands in its supersede group from `supersede`) → carry it out (`effects`, with the
//! status write and its bookkeeping in `status_write`).

mod decide;
mod effects;
mod enqueue;
mod guard;
mod inputs;
pub mod plan;
mod status_write;
mod supersede;
mod unreadable;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Error as FinalizerError, Event as Finalizer};
use kube::{Api, ResourceExt};
use tracing::Instrument;

use crate::api::{validate, KeptClaim, LockClaim, Phase, ValidSpec, FINALIZER};
use crate::controller::base::settings::{FINALIZER_RETRY, NEWER_COPY_BACKSTOP};
use crate::controller::base::{ids, Error, Part, Uid};
use crate::controller::context::Context;
use crate::controller::registry::Seen;
use decide::Decision;
use enqueue::Admission;
use plan::HolderView;

/// Reconciles one claim; the answer says when to look at it again (its next deadline, or a
/// retry after a refused write), besides the watch events that bring changes.
pub async fn reconcile(claim: Arc<KeptClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let uid = ctx.shared_uid(claim.metadata.uid.as_deref().ok_or(Error::Malformed("a uid"))?);
    if !ctx.serves_reconcile(&uid, &claim) {
        // Its locks are re-anchored first; every claim is reconciled when that is done. A walk
        // under way does not wait for it.
        tracing::trace!(
            claim = claim.metadata.name.as_deref().unwrap_or_default(),
            "waits for its locks to be re-anchored"
        );
        ctx.serving.reconciled(&uid);
        return Ok(Action::await_change());
    }
    let span = tracing::info_span!(
        "reconcile",
        claim = claim.metadata.name.as_deref().unwrap_or_default(),
        namespace = claim.metadata.namespace.as_deref().unwrap_or_default(),
    );
    ctx.metrics.reconciles_running.inc();
    let running = Running(&ctx.metrics.reconciles_running);
    let result = finalized(uid.clone(), claim.clone(), ctx.clone()).instrument(span).await;
    drop(running);
    ctx.serving.reconciled(&uid);
    if !ctx.is_served(&uid) {
        // Gone while it was reconciled (a node it was just given would outlive it): look again.
        ctx.orphan(&uid);
    }
    result
}

/// Counts a reconcile as running until it ends, also when it is aborted (a deposed leader's
/// controller is dropped with its reconciles in flight; the gauge outlives it).
struct Running<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The finalizer helper around the pipeline: a claim being deleted is cleaned up before its
/// finalizer goes.
async fn finalized(uid: Uid, claim: Arc<KeptClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    // Its turn came: where it waits at an admission gate, its patience runs from now — unless
    // this reconcile only adds the finalizer (the finalizer helper ends it there; the claim's
    // next reconcile, which may come after a backlog of other claims', is the first that can
    // enter). Counted from the finalizer's addition, a backlog over the patience let claims
    // created later go first wherever no admission policy puts the finalizer on at creation
    // (Kubernetes before 1.36: one claim of a burst of 30 six places late on 1.33). A claim
    // whose finalizer cannot be added holds the others back for the untried patience.
    let finalized = claim.finalizers().iter().any(|f| f == FINALIZER);
    if finalized || claim.metadata.deletion_timestamp.is_some() {
        ctx.registry.reconciling(&uid, claim.creation_timestamp().map_or(0, |t| t.0.as_second()));
    }
    let namespace = claim.namespace().ok_or(Error::Malformed("a namespace"))?;
    let api: Api<KeptClaim> = Api::namespaced(ctx.writer.client().clone(), &namespace);
    // The finalizer helper writes without asking: ask for it.
    ctx.writer.leadership().time_left().ok_or(Error::NotLeading)?;
    let cleaned = std::sync::atomic::AtomicBool::new(false);
    let result = finalizer(&api, FINALIZER, claim, |event| async {
        match event {
            // Planned from the whole claim again (the store keeps a compact copy).
            Finalizer::Apply(claim) => match claim.unreadable.as_deref() {
                Some(why) => unreadable::report(&uid, &claim, why, &ctx).await,
                None => apply(&uid, claim.arrival, claim.to_claim(), &ctx).await,
            },
            Finalizer::Cleanup(claim) => {
                let action = match claim.unreadable {
                    Some(_) => unreadable::release(&uid, &ctx).await?,
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
            Ok(Action::requeue(FINALIZER_RETRY))
        }
        Err(FinalizerError::AddFinalizer(e) | FinalizerError::RemoveFinalizer(e)) => Err(Error::Finalizer(e)),
        Err(FinalizerError::UnnamedObject) => Err(Error::Malformed("a name")),
        Err(FinalizerError::InvalidFinalizer) => Err(Error::Malformed("valid finalizer name")),
    }
}

/// A claim as it is (not being deleted): validate → admit to its `ClusterLock`s → guard
/// against copies that must not be planned from → decide (plan, enqueue, reserve the grant) →
/// carry the plan out. `arrival`: its place in the order the claim watch first delivered the
/// claims.
async fn apply(uid: &Uid, arrival: u64, claim: LockClaim, ctx: &Context) -> Result<Action, Error> {
    let namespace = claim.namespace().ok_or(Error::Malformed("a namespace"))?;
    let now = Timestamp::now();
    // An invalid spec (or a ClusterLock that refuses it) ends like any final plan; it names no
    // lock, so only what the engine tracks of it goes.
    let invalid = |message: String, parts: Vec<Part>| {
        let name = claim.name_any();
        ctx.registry.observe(uid, Seen { name: &name, namespace: &namespace, locks: &[], pod: None, arrival });
        let ttl = time_to_live(&claim, None, ctx);
        (plan::invalid(&claim, message, now).expire_after(ttl, now), parts)
    };
    let spec = match validate(&claim) {
        Ok(spec) => spec,
        Err(message) => {
            let (plan, parts) = invalid(message, ctx.parts_tracked(uid));
            return effects::run(ctx, uid, &parts, &claim, plan).await;
        }
    };
    let parts = ids::parts_of(&ctx.layout, &namespace, uid, &spec);
    match enqueue::admit_cluster_locks(ctx, &claim, &spec, &parts, now).await? {
        Admission::Admitted => {}
        Admission::NotYet => return Ok(Action::requeue(NEWER_COPY_BACKSTOP)),
        Admission::Refused(message) => {
            let (plan, parts) = invalid(message, vec![]);
            return effects::run(ctx, uid, &parts, &claim, plan).await;
        }
    }
    let (name, locks) = (claim.name_any(), ids::locks(&parts));
    let pod = spec.holder_pod.as_deref();
    ctx.registry.observe(uid, Seen { name: &name, namespace: &namespace, locks: &locks, pod, arrival });
    if let Some(action) = guard::check(ctx, uid, &claim, &parts).await? {
        return Ok(action);
    }
    let terminal = claim.status.as_ref().and_then(|s| s.phase).is_some_and(Phase::is_terminal);
    let holder = match terminal {
        true => HolderView::NotRequested,
        false => inputs::holder_view(ctx, &claim, &namespace, spec.holder_pod.as_deref()).await?,
    };
    let ttl = time_to_live(&claim, Some(&spec), ctx);
    match decide::decide(ctx, uid, &claim, &spec, &parts, holder, ttl).await? {
        Decision::Write(plan) => effects::run(ctx, uid, &parts, &claim, plan).await,
        Decision::StampThenWait(stamp, action) => {
            effects::run(ctx, uid, &parts, &claim, stamp).await?;
            Ok(action)
        }
        Decision::Wait(action) => Ok(action),
    }
}

/// How long the claim is kept once final: its own `ttlSecondsAfterFinished` (if valid), else the
/// operator's default for claims without an owner (an owner's deletion takes its claims along).
fn time_to_live(claim: &LockClaim, spec: Option<&ValidSpec>, ctx: &Context) -> Option<Duration> {
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
        Ok(spec) => ids::parts_of(&ctx.layout, &claim.namespace().unwrap_or_default(), uid, &spec),
        Err(_) => ctx.parts_tracked(uid),
    };
    if guard::stale_copy(&claim, ctx, uid).await?.is_some() {
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
    // A holder whose end is no status write (its node's deletion ends it): its history's end.
    let before = claim.status.clone().unwrap_or_default();
    let ends_unwritten = before.phase == Some(Phase::Held) && !plan.status.phase.is_some_and(Phase::is_terminal);
    effects::run(ctx, uid, &parts, &claim, plan).await?;
    if ends_unwritten {
        ctx.history.ended(&claim, &parts, &before, Phase::Released);
    }
    tracing::debug!(held, "deleted: released, final status written");
    // Forgotten (and its locks' grants let go on) once the finalizer is gone: see `finalized`.
    Ok(Action::await_change())
}
