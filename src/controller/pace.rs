//! Every claim reconciled once after a re-anchoring (the start of a term, a new session): its
//! status stamped with this term's epoch, and whatever changed while nobody served it looked at.
//! Asked of kube-runtime all at once (`reconcile_all_on`), 10,000 reconciles stood in its queue
//! ahead of a claim made meanwhile and of the one grant a released lock waited for: 42 s at
//! 10,000 claims after a graceful leader change. Paced instead: a batch as large as the
//! reconciles that run at once, the claims whose reconcile changes something first (being
//! deleted, not yet queued), the next batch once the last one's are done (or after a bound, so
//! that one slow reconcile holds nothing up). A claim that changes meanwhile, or a grant, never
//! waits for the walk: its own trigger goes into a queue at most one batch long, and a grant
//! asks for the stamps of its own lock's claims itself (`GrantBlocked::Unstamped`).
//!
//! The same walk is the safety net against a lost event: made every `--resync-period`
//! ([`RESYNC`](super::base::settings::RESYNC) unless told otherwise) for the whole term, it looks at every
//! claim again. It replaces a backstop requeue per claim in kube-runtime's scheduler, which kept
//! an entry (two copies of the claim's reference, a slab slot, a timer) for every live claim:
//! some 500 bytes per claim, a sixth of the operator's memory at 10,000 claims
//! (docs/benchmarks.md, "Memory at scale"), and a burst of every claim's reconcile at once, five
//! minutes after a restart, where the walk is paced.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tokio::sync::mpsc;

use super::context::Context;
use crate::api::{KeptClaim, Phase};

/// How long one batch may take before the next is asked for all the same.
const BATCH_BOUND: Duration = Duration::from_secs(10);

/// Walks every claim served, in batches of `batch`, each time a walk is asked for (walks asked
/// for during one are made once, after it), and `period` after the last walk ended. Runs for
/// the term.
pub(super) async fn walks(ctx: Arc<Context>, mut asked: mpsc::UnboundedReceiver<()>, batch: usize, period: Duration) {
    loop {
        let cause = tokio::select! {
            more = asked.recv() => match more {
                Some(()) => "reanchored",
                None => return,
            },
            () = tokio::time::sleep(period) => {
                if !ctx.serving.anchored() {
                    // Its reconciles would be turned away: the re-anchoring asks for a walk
                    // when it is done.
                    continue;
                }
                tracing::debug!("every claim looked at again, as a safety net");
                "period"
            }
        };
        while asked.try_recv().is_ok() {}
        walk(&ctx, batch.max(1)).await;
        ctx.metrics.walks.get_or_create(&crate::metrics::CauseLabel { cause }).inc();
    }
}

async fn walk(ctx: &Context, batch: usize) {
    // The store's own copies, not references cloned out of them: 8 bytes a claim while the walk
    // lasts (a copy replaced meanwhile is let go of when its batch is asked for).
    let mut claims: Vec<Arc<KeptClaim>> = ctx.stores.all_claims().collect();
    claims.sort_by_cached_key(|claim| urgency(claim));
    let total = claims.len();
    let started = std::time::Instant::now();
    let mut claims = claims.into_iter();
    loop {
        // A claim deleted since the snapshot has no reconcile to wait for.
        let chunk: Vec<Arc<KeptClaim>> = claims.by_ref().filter(|claim| in_store(ctx, claim)).take(batch).collect();
        if chunk.is_empty() {
            break;
        }
        ctx.serving.walk_batch(chunk.iter().filter_map(|claim| claim.uid()).collect());
        for claim in chunk {
            ctx.triggers.claim(ObjectRef::from_obj(&*claim));
        }
        let left = ctx.serving.batch_done(BATCH_BOUND).await;
        if left > 0 {
            tracing::debug!(left, "a batch of the walk took long; going on");
        }
    }
    ctx.serving.walk_over();
    tracing::info!(claims = total, took = ?started.elapsed(), "reconciled every claim once");
}

/// Whether `claim` is still in its store (this copy or a newer one).
fn in_store(ctx: &Context, claim: &KeptClaim) -> bool {
    let object = ObjectRef::from_obj(claim);
    ctx.stores.has_claim(&object, claim.uid().as_deref())
}

/// The order of the walk: claims being deleted first (a lock waits for their release), then
/// those not yet queued (made while nobody served them), then the rest (their stamp only), the
/// nearest deadline first (a lease that runs out, an acquire timeout): an earlier term had a
/// requeue waiting for it, and this term's is set by the claim's first reconcile. (A claim's
/// holder pod deleted meanwhile reconciles it at once: see `Registry::first_seen`.)
fn urgency(claim: &KeptClaim) -> (u8, i64) {
    if claim.metadata.deletion_timestamp.is_some() {
        (0, 0)
    } else if !matches!(claim.phase(), Some(Phase::Held | Phase::Waiting)) {
        (1, 0)
    } else {
        (2, deadline(claim).unwrap_or(i64::MAX))
    }
}

/// When the claim's phase runs out by itself, in seconds: its lease while Held, its acquire
/// timeout while Waiting.
fn deadline(claim: &KeptClaim) -> Option<i64> {
    match claim.phase() {
        Some(Phase::Held) => claim.lease_expires_at(),
        Some(Phase::Waiting) => {
            let created = claim.metadata.creation_timestamp.as_ref()?.0.as_second();
            created.checked_add(claim.spec.acquire_timeout_seconds?)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, spec: serde_json::Value, status: serde_json::Value, deleting: bool) -> KeptClaim {
        let mut metadata = serde_json::json!({
            "name": name, "namespace": "ns", "uid": name, "creationTimestamp": "2026-11-28T09:00:00Z" });
        if deleting {
            metadata["deletionTimestamp"] = "2026-11-28T09:30:00Z".into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": metadata, "spec": spec, "status": status
        }))
        .unwrap_or_else(|e| panic!("claim {name}: {e}"))
    }

    #[test]
    fn the_walk_takes_deletions_then_new_claims_then_the_nearest_deadline_first() {
        let lock = serde_json::json!({ "lockName": "l" });
        let held = |expires: &str| serde_json::json!({ "phase": "Held", "leaseExpiresAt": expires });
        let mut claims = [
            claim("held-no-lease", lock.clone(), serde_json::json!({ "phase": "Held" }), false),
            claim("held-late", lock.clone(), held("2026-11-28T11:00:00Z"), false),
            claim(
                "waiting-30s",
                serde_json::json!({ "lockName": "l", "acquireTimeoutSeconds": 30 }),
                serde_json::json!({ "phase": "Waiting" }),
                false,
            ),
            claim("new", lock.clone(), serde_json::json!({}), false),
            claim("held-soon", lock.clone(), held("2026-11-28T09:10:00Z"), false),
            claim("deleting", lock.clone(), serde_json::json!({ "phase": "Held" }), true),
        ];
        claims.sort_by_cached_key(urgency);
        let order: Vec<&str> = claims.iter().map(|c| c.metadata.name.as_deref().unwrap_or_default()).collect();
        assert_eq!(order, ["deleting", "new", "waiting-30s", "held-soon", "held-late", "held-no-lease"]);
    }
}
