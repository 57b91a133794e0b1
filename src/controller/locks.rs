//! `Lock` objects: per served scope, a kube-runtime `Controller` over them. Their permits go to
//! the lock engine as each lock's limit the moment the watch delivers them (every contender of
//! the lock is decided again: a raise grants at once); their status (permits, holders, queue
//! length) is refreshed from the claim watch's store, spaced (`throttle`), so that a burst of
//! handoffs costs at most two status writes; the claims looked at are the lock's own, from the registry's index by
//! lock path (a scan of the whole store took 6 ms per refresh at 100,000 claims).
//!
//! No claim is decided before every scope has listed its `Lock` objects (they count among the
//! listings `Context::wait_synced` waits for): a lock's first decisions under a mutex's rules
//! could grant Shared claims beyond its permits.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::base::Error;
use super::context::Context;
use crate::api::{KeptClaim, Lock, LockStatus, Phase, MAX_LISTED_HOLDERS};
use crate::recipe::Limit;

/// A `Lock`'s status is written this long after the first change of its claims after a quiet
/// spell (a handoff's release and grant, a few milliseconds apart, make one write) ...
pub const STATUS_WINDOW: Duration = Duration::from_millis(50);
/// ... and its writes are at least this far apart, however often its claims change (for a
/// `ClusterLock`: its looks at the queue) ...
pub const STATUS_SPACING: Duration = Duration::from_millis(500);
/// ... and the status writes of all `Lock` objects at least this far apart (at most 50 a second:
/// when more than 25 locks are busy each one's refreshes come further apart; for
/// `ClusterLock`s, their looks). A `Lock`'s status is for people and dashboards: it must not
/// take the API server from the grants.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(20);

/// The `Lock` objects of one scope, kept in `writer`'s store, as the controller's trigger
/// stream; the engine learns every change of permits from here.
pub fn objects(
    ctx: Arc<Context>,
    scope: usize,
    api: Api<Lock>,
    writer: Writer<Lock>,
) -> impl Stream<Item = Result<Lock, watcher::Error>> + Send + 'static {
    let mut synced = false;
    watcher(api, watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECONDS))
        .default_backoff()
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::InitApply(lock) | watcher::Event::Apply(lock)) => {
                let path = ctx.layout.lock(&lock.namespace().unwrap_or_default(), &lock.name_any());
                ctx.engine.set_limit(&path, Limit::from_permits(Some(lock.spec.permits)));
            }
            Ok(watcher::Event::Delete(lock)) => {
                let path = ctx.layout.lock(&lock.namespace().unwrap_or_default(), &lock.name_any());
                ctx.engine.set_limit(&path, Limit::Mutex);
            }
            Ok(watcher::Event::InitDone) => {
                forget_unlisted(&ctx, scope);
                if !std::mem::replace(&mut synced, true) {
                    ctx.serving.mark_listed();
                }
            }
            Ok(watcher::Event::Init) => {}
            Err(e) => tracing::warn!(error = %e, "watch of Lock objects failed; retrying"),
        })
        .applied_objects()
}

/// After a (re-)listing: locks of this scope whose `Lock` object went while the watch was down
/// are mutexes again.
fn forget_unlisted(ctx: &Context, scope: usize) {
    let Some(store) = ctx.locks.get(scope) else { return };
    let listed: BTreeSet<String> =
        store.state().iter().map(|l| ctx.layout.lock(&l.namespace().unwrap_or_default(), &l.name_any())).collect();
    let prefix = match ctx.scopes.namespace(scope) {
        Some(namespace) => ctx.layout.lock(namespace, ""),
        None => ctx.layout.lock("", "").trim_end_matches('/').to_string(),
    };
    for (path, _) in ctx.engine.limits() {
        if path.starts_with(&prefix) && !listed.contains(&path) {
            ctx.engine.set_limit(&path, Limit::Mutex);
        }
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

pub async fn reconcile(lock: Arc<Lock>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.serving.anchored() {
        // Claims' phases are not judged yet; every claim's first reconcile triggers this again.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let namespace = lock.namespace().ok_or(Error::Malformed("a namespace"))?;
    let name = lock.name_any();
    ctx.engine.set_limit(&ctx.layout.lock(&namespace, &name), Limit::from_permits(Some(lock.spec.permits)));
    let key = ObjectRef::from_obj(&*lock);
    // Made from memory, so looked at first: only a status with news takes a turn (the event of
    // this operator's own write, for one, has none).
    let status = status_of(&lock, &ctx.claims_of_lock(&namespace, &name));
    if lock.status.as_ref() == Some(&status) {
        ctx.lock_refreshes.unchanged(&key);
        return Ok(Action::await_change());
    }
    if let Some(wait) = ctx.lock_refreshes.wait(key.clone(), Instant::now()) {
        // Once the window (or the spacing after the last write, or its turn) is over, with
        // whatever changed by then: a trigger meanwhile runs this again, and it answers the
        // same, sooner.
        return Ok(Action::requeue(wait));
    }
    ctx.lock_refreshes.refreshed(key, Instant::now());
    let api: Api<Lock> = Api::namespaced(ctx.writer.client().clone(), &namespace);
    let patch = Patch::Merge(json!({ "status": status }));
    match ctx.writer.write("lock status", api.patch_status(&name, &PatchParams::default(), &patch)).await? {
        Ok(_) => Ok(Action::await_change()),
        // Deleted meanwhile: its watch says so.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(source) => Err(Error::Write { call: "lock status", source }),
    }
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
        permits: Some(lock.spec.permits),
        held: u32::try_from(held.len()).unwrap_or(u32::MAX),
        holders: held.iter().take(MAX_LISTED_HOLDERS).map(|(_, name)| name.to_string()).collect(),
        queue_length: queued,
        observed_generation: lock.metadata.generation,
    }
}

pub fn error_policy(lock: Arc<Lock>, error: &Error, ctx: Arc<Context>) -> Action {
    refresh_failed("Lock", &lock.name_any(), error, &ctx)
}

/// A status refresh of a `Lock` or `ClusterLock` failed: counted, logged, tried again when the
/// error says.
pub fn refresh_failed(kind: &str, name: &str, error: &Error, ctx: &Context) -> Action {
    ctx.metrics.reconcile_errors.get_or_create(&crate::metrics::ErrorLabel { error: error.metric_label() }).inc();
    tracing::warn!(kind, name, %error, "status refresh failed");
    error.retry_after().map_or_else(Action::await_change, Action::requeue)
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
