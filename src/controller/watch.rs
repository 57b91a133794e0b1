//! The claim watch: keeps the store current and schedules a reconcile for every change.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

use super::queue::Uid;
use super::registry::Seen;
use super::Context;
use crate::api::LockClaim;
use crate::recipe::Mode;

/// Follows the claims of one scope (a namespace, or all) until the task is aborted. The
/// watcher lists and then watches, re-lists after a gap it cannot resume from, and backs off on
/// errors.
pub async fn follow_claims(ctx: Arc<Context>, scope: u16, api: Api<LockClaim>) {
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    // The claims a re-list delivered; the ones kept from before and not among them are gone.
    let mut relisted: HashSet<Uid> = HashSet::new();
    let mut synced = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitApply(claim)) => {
                if let Some(uid) = admit(&ctx, scope, claim) {
                    relisted.insert(uid);
                }
            }
            Ok(watcher::Event::InitDone) => {
                for uid in ctx.store.uids_in(scope) {
                    if !relisted.contains(&uid) {
                        gone(&ctx, &uid);
                    }
                }
                relisted = HashSet::new();
                if !std::mem::replace(&mut synced, true) {
                    ctx.scope_synced();
                }
            }
            Ok(watcher::Event::Apply(claim)) => {
                admit(&ctx, scope, claim);
            }
            Ok(watcher::Event::Delete(claim)) => {
                if let Some(uid) = claim.metadata.uid.as_deref() {
                    gone(&ctx, uid);
                }
            }
            Err(e) => tracing::warn!(error = %e, "claim watch failed; retrying"),
        }
    }
}

/// A claim as the watch delivers it: noted in delivery order, kept, and reconciled soon.
fn admit(ctx: &Context, scope: u16, mut claim: LockClaim) -> Option<Uid> {
    let uid = ctx.shared_uid(claim.metadata.uid.as_deref()?);
    ctx.store.put(scope, &uid, &mut claim);
    // The watch delivers new claims in creation order: note it before reconciling.
    if let (Some(name), Some(namespace)) = (claim.metadata.name.as_deref(), claim.metadata.namespace.as_deref()) {
        let phase = claim.status.as_ref().and_then(|s| s.phase);
        let lock = ctx.lock_path(namespace, &claim.spec.lock_name);
        let created = claim.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
        let exclusive = claim.spec.mode == Mode::Exclusive;
        ctx.registry.first_seen(&uid, Seen { name, namespace, lock: &lock, exclusive }, created, phase);
    }
    ctx.trigger(&uid);
    Some(uid)
}

/// A claim left the API. Normally its node went first (the finalizer). If somebody removed
/// the finalizer by hand, the node would hold the lock for a claim nobody can see any more and
/// block every waiter for good: the worker, finding the claim gone, releases the node (see
/// `release_orphan`). That runs in the worker, not here, so that a ZooKeeper outage never holds
/// up the watch, and never beside another reconcile of the same claim.
fn gone(ctx: &Context, uid: &str) {
    ctx.store.remove(uid);
    ctx.trigger(uid);
}
