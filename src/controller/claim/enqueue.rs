//! How a claim enters its locks' queues: its `ClusterLock`s must admit its namespace first (a
//! first-time claim only), claims created earlier go first (the creation-order gates, see
//! `admission`), and then every lock at once in one multi-op.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};

use crate::api::{admits, ClusterLock, LockClaim, Phase, ValidSpec};
use crate::controller::admission::Turn;
use crate::controller::base::{ids, Error, Part, Uid};
use crate::controller::context::Context;
use crate::zk::ContenderSpec;

/// How long a claim naming a `ClusterLock` this cluster does not have waits for it to appear
/// (made in the same `kubectl apply`, its watch event may come after the claim's) before it
/// ends Invalid.
const MISSING_GRACE: Duration = Duration::from_secs(30);

/// Whether a claim in a namespace may take the cluster locks its spec names.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// A `ClusterLock` is not in the store yet: look again soon.
    NotYet,
    /// The message of the claim's Invalid condition.
    Refused(String),
}

/// Whether a first-time claim may take its `ClusterLock`s; `Admitted` for any other claim (one
/// queued already, final, being deleted, or naming none).
pub async fn admit_cluster_locks(
    ctx: &Context,
    claim: &LockClaim,
    spec: &ValidSpec,
    parts: &[Part],
    now: Timestamp,
) -> Result<Admission, Error> {
    let phase = claim.status.as_ref().and_then(|s| s.phase);
    if spec.cluster_locks().next().is_none()
        || !matches!(phase, None | Some(Phase::Pending))
        || claim.metadata.deletion_timestamp.is_some()
        || parts.iter().any(|p| ctx.engine.state(&p.id).is_some())
    {
        return Ok(Admission::Admitted);
    }
    // Not queued yet: its ClusterLocks must admit its namespace first.
    let age = claim
        .creation_timestamp()
        .map_or(Duration::ZERO, |t| Duration::try_from(now.duration_since(t.0)).unwrap_or(Duration::ZERO));
    admit(ctx, &claim.namespace().unwrap_or_default(), spec, age).await
}

/// Whether the claim `spec` of `namespace`, created `age` ago, may take its cluster locks: each
/// must exist in this cluster and select the namespace.
async fn admit(ctx: &Context, namespace: &str, spec: &ValidSpec, age: Duration) -> Result<Admission, Error> {
    let names: Vec<&str> = spec.cluster_locks().collect();
    if names.is_empty() {
        return Ok(Admission::Admitted);
    }
    let locks: Vec<Option<Arc<ClusterLock>>> = names.iter().map(|name| ctx.stores.cluster_lock(name)).collect();
    if locks.iter().any(Option::is_none) && age < MISSING_GRACE {
        return Ok(Admission::NotYet);
    }
    let namespaces: Api<Namespace> = Api::all(ctx.writer.client().clone());
    let found = ctx.writer.read("get_namespace", namespaces.get_opt(namespace)).await.into_result()?;
    let labels = found.map(|n| n.labels().clone()).unwrap_or_default();
    for (name, lock) in names.iter().zip(&locks) {
        if let Err(message) = admits(name, lock.as_deref(), namespace, &labels) {
            return Ok(Admission::Refused(message));
        }
    }
    Ok(Admission::Admitted)
}

/// Enqueues the claim in every lock at once, unless a claim created earlier is to enter first:
/// then how long to wait at the gate at most (it asks for this one when it leaves the gate).
pub async fn enqueue(ctx: &Context, uid: &Uid, claim: &LockClaim, parts: &[Part]) -> Result<Option<Duration>, Error> {
    let created = claim.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
    let (turn, overtaken) = ctx.registry.may_enqueue(uid, created);
    ctx.metrics.count_overtaken(&overtaken);
    if let Turn::Behind(wait) = turn {
        return Ok(Some(wait));
    }
    let description = ids::describe_claim(&ctx.layout, &claim.namespace().unwrap_or_default(), &claim.name_any());
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
    leave_gates(ctx, uid);
    enqueued?;
    Ok(None)
}

/// The claim leaves the creation-order gates: the claims behind it there are asked for.
pub fn leave_gates(ctx: &Context, uid: &Uid) {
    for next in ctx.registry.leave_gates(uid) {
        ctx.trigger(&next);
    }
}
