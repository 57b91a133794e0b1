//! `Lock` objects: per served scope, a kube-runtime `Controller` over them. Their permits go to
//! the lock engine as each lock's limit the moment the watch delivers them (see `limits_feed`);
//! their status (permits, holders, queue
//! length) is refreshed from the claim watch's store, spaced (`throttle`), so that a burst of
//! handoffs costs at most two status writes; the claims looked at are the lock's own, from the registry's index by
//! lock path (a scan of the whole store took 6 ms per refresh at 100,000 claims).
//!

use std::sync::Arc;
use std::time::Instant;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::limits_feed::LimitSource;
use crate::api::{KeptClaim, Lock, LockStatus, Phase, MAX_LISTED_HOLDERS};
use crate::controller::base::settings::NEWER_COPY_BACKSTOP;
use crate::controller::base::Error;
use crate::controller::context::Context;
use crate::controller::registry::Registry;
use crate::controller::serving::Serving;
use crate::controller::stores::Stores;
use crate::controller::throttle::Throttle;
use crate::controller::writer::ApiWriter;
use crate::metrics::Metrics;
use crate::recipe::Limit;
use crate::zk::{Layout, LockEngine};

impl LimitSource for Lock {
    const OPTIONAL: bool = false;

    fn directory(&self, layout: &Layout) -> String {
        layout.lock(&self.namespace().unwrap_or_default(), &self.name_any())
    }

    fn declare(&self, engine: &LockEngine, layout: &Layout) {
        engine.set_limit(&self.directory(layout), Limit::from_permits(self.spec.permits));
    }

    fn undeclare(engine: &LockEngine, path: &str) {
        engine.set_limit(path, Limit::Mutex);
    }

    fn fencing(&self) -> (Option<String>, String, bool) {
        (self.namespace(), self.name_any(), self.spec.fencing == crate::api::Fencing::Enforced)
    }
}

/// The directories of the `Lock`s a watch of `namespace` (none: all namespaces) covers.
pub fn directories(layout: &Layout, namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => layout.lock(namespace, ""),
        None => layout.lock("", "").trim_end_matches('/').to_string(),
    }
}

/// A claim changed: its lock's status may have to follow.
pub fn claim_changed(ctx: &Context, claim: &KeptClaim) {
    let Some(namespace) = claim.metadata.namespace.as_deref() else { return };
    for lock in claim.spec.lock_refs() {
        if let Some(name) = &lock.lock_name {
            ctx.trigger_lock(ObjectRef::new(name).within(namespace));
        }
        if let Some(name) = &lock.cluster_lock_name {
            ctx.trigger_cluster_lock(name);
        }
    }
}

/// What the `Lock` status controller works with.
pub struct Ctx {
    pub engine: LockEngine,
    pub layout: Layout,
    pub registry: Arc<Registry>,
    pub stores: Arc<Stores>,
    pub writer: Arc<ApiWriter>,
    pub serving: Arc<Serving>,
    pub metrics: Arc<Metrics>,
    /// When each `Lock`'s status was last written (see `throttle`).
    pub refreshes: Throttle<ObjectRef<Lock>>,
}

impl AsRef<Metrics> for Ctx {
    fn as_ref(&self) -> &Metrics {
        &self.metrics
    }
}

pub async fn reconcile(lock: Arc<Lock>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if !ctx.serving.anchored() {
        // Claims' phases are not judged yet; every claim's first reconcile triggers this again.
        return Ok(Action::requeue(NEWER_COPY_BACKSTOP));
    }
    let namespace = lock.namespace().ok_or(Error::Malformed("a namespace"))?;
    let name = lock.name_any();
    // The permits are the watch feed's to declare (`limits_feed`), in the order the watch
    // delivers changes: this copy may be older than a lower limit or the Lock's deletion, and
    // declaring from it would hand out permits the Lock no longer gives.
    let key = ObjectRef::from_obj(&*lock);
    // Made from memory, so looked at first: only a status with news takes a turn (the event of
    // this operator's own write, for one, has none).
    let status = status_of(&lock, &claims_of_lock(&ctx, &namespace, &name));
    if lock.status.as_ref() == Some(&status) {
        ctx.refreshes.unchanged(&key);
        return Ok(Action::await_change());
    }
    if let Some(wait) = ctx.refreshes.wait(key.clone(), Instant::now()) {
        // Once the window (or the spacing after the last write, or its turn) is over, with
        // whatever changed by then: a trigger meanwhile runs this again, and it answers the
        // same, sooner.
        return Ok(Action::requeue(wait));
    }
    ctx.refreshes.refreshed(key, Instant::now());
    let api: Api<Lock> = Api::namespaced(ctx.writer.client().clone(), &namespace);
    let patch = Patch::Merge(json!({ "status": status }));
    // 404: deleted meanwhile; its watch says so.
    ctx.writer
        .write("lock status", api.patch_status(&name, &PatchParams::default(), &patch))
        .await
        .expecting(&[404])?;
    Ok(Action::await_change())
}

/// The claims of lock `name` in `namespace` (alone or with other locks), as the claim
/// watch last delivered them: those the registry counts in it (see `Registry::claims_of_lock`).
fn claims_of_lock(ctx: &Ctx, namespace: &str, name: &str) -> Vec<Arc<KeptClaim>> {
    let path = ctx.layout.lock(namespace, name);
    ctx.registry
        .claims_of_lock(&path)
        .into_iter()
        .filter_map(|(namespace, claim)| ctx.stores.claim(&namespace, &claim))
        .filter(|c| c.spec.names_lock(name))
        .collect()
}

/// The status a `Lock` shows for its claims (pure).
pub fn status_of(lock: &Lock, claims: &[Arc<KeptClaim>]) -> LockStatus {
    // Holders in queue order: the order their nodes were made in (grants with permits are
    // written one at a time, in whatever order their reconciles come, and a late one takes a
    // fresh token, so tokens need not follow the queue).
    let mut held: Vec<(Option<u64>, &str)> = vec![];
    let mut queued = 0u32;
    let name = lock.metadata.name.as_deref().unwrap_or_default();
    for claim in claims {
        match claim.phase() {
            Some(Phase::Held) => {
                // A claim over several locks: its node in this lock.
                let own = claim.lock_statuses().iter().find(|l| l.lock_name == name).and_then(|l| l.znode.as_deref());
                let node = own.or(claim.znode()).and_then(|path| path.rsplit('/').next());
                let sequence = node.and_then(crate::recipe::parse_child).map(|child| child.sequence);
                held.push((sequence, claim.metadata.name.as_deref().unwrap_or_default()));
            }
            None | Some(Phase::Pending | Phase::Waiting) if claim.metadata.deletion_timestamp.is_none() => queued += 1,
            _ => {}
        }
    }
    let base = crate::recipe::wrap_base(held.iter().filter_map(|(sequence, _)| *sequence));
    held.sort_unstable_by_key(|(sequence, name)| {
        (sequence.map_or(u64::MAX, |s| crate::recipe::queue_key(s, base)), *name)
    });
    LockStatus {
        permits: lock.spec.permits,
        held: u32::try_from(held.len()).unwrap_or(u32::MAX),
        holders: held.iter().take(MAX_LISTED_HOLDERS).map(|(_, name)| name.to_string()).collect(),
        queue_length: queued,
        observed_generation: lock.metadata.generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockClaim;
    use serde_json::json;

    fn held(name: &str, sequence: u32, token: u32, several: bool) -> Arc<KeptClaim> {
        let node = format!("/zklock/locks/ns/sem/write-{name}-lock-{sequence:010}");
        let status = if several {
            json!({ "phase": "Held", "locks": [
                { "lockName": "other", "fencingToken": "1", "znode": "/zklock/locks/ns/other/write-x-lock-0000000009" },
                { "lockName": "sem", "fencingToken": token.to_string(), "znode": node },
            ]})
        } else {
            json!({ "phase": "Held", "fencingToken": token.to_string(), "znode": node })
        };
        let claim: LockClaim = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": name, "namespace": "ns" }, "spec": { "lockName": "sem" }, "status": status,
        }))
        .unwrap();
        Arc::new(KeptClaim::from(claim))
    }

    #[test]
    fn holders_are_listed_in_queue_order_whatever_their_tokens() {
        let lock: Lock = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "Lock", "metadata": { "name": "sem" }, "spec": { "permits": 3 },
        }))
        .unwrap();
        // c0 was granted last, with a fresh token; c2 is over two locks.
        let claims = [held("c2", 7, 40, true), held("c0", 5, 90, false), held("c1", 6, 30, false)];
        let status = status_of(&lock, &claims);
        assert_eq!(status.holders, ["c0", "c1", "c2"]);
        assert_eq!((status.held, status.permits), (3, Some(3)));
    }
}
