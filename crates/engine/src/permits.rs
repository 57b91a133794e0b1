//! Permits across clusters, the task (docs/design.md: permits every cluster agrees on): one per
//! shared `ClusterLock` this engine has a declaration or contenders for. It keeps this
//! cluster's declaration in `<shared>/permits/<lock>` (see [`super::declaration`]), an
//! ephemeral node of the current session, and reads the other clusters' with a children watch;
//! each change of the limit they add up to decides the lock's contenders again.
//!
//! Order matters: the others are taken as known only from a listing made after our own
//! declaration stood. Of two clusters declaring at once, the later write's listing then shows
//! the earlier one (ZooKeeper applies writes in one order, and a session reads its own writes),
//! so at least one of the two grants with both in view; until its listing, a cluster grants the
//! front of the queue only, which every limit grants.

use std::sync::{Arc, Weak};
use std::time::Duration;

use zookeeper_client as zk;

use super::core::Core;
use super::declaration::{self, Declaration};
use super::retry::{self, Backoff};
use super::rounds;
use super::Error;

/// How long the task waits for a change before it looks whether it is still needed (its
/// lock's last contender gone and no declaration to keep).
const RECHECK: Duration = Duration::from_secs(10);

/// Follows the declarations of the shared `ClusterLock` in `lock`, whose declarations are in
/// `dir`, for cluster `cluster`, while the book has an entry for it; removes the entry (and
/// ends) once it has neither a declaration of ours nor contenders.
pub(super) async fn follow(core: Weak<Core>, lock: Arc<str>, dir: String, cluster: String) {
    let mut backoff = Backoff::new();
    loop {
        let Some(strong) = core.upgrade() else { return };
        let Some((own, wake)) = strong.book.lock().declared.get(&lock).map(|d| (d.own, d.wake.clone())) else {
            return;
        };
        let client = match strong.client() {
            Ok(client) => client,
            Err(_) => {
                drop(strong);
                backoff.wait().await;
                continue;
            }
        };
        match round(&strong, &client, &lock, &dir, &cluster, own).await {
            Ok(Some(watcher)) => {
                backoff = Backoff::new();
                {
                    let mut book = strong.book.lock();
                    let idle = !book.locks.contains_key(&lock);
                    if idle && book.declared.get(&lock).is_some_and(|d| d.own.is_none() && d.own == own) {
                        book.declared.remove(&lock);
                        return;
                    }
                }
                drop(strong);
                tokio::select! {
                    _ = watcher.changed() => {}
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep(RECHECK) => {}
                }
            }
            // Changed our declaration: list again.
            Ok(None) => {}
            // A later leader of this cluster took the epoch: its engine declares from now on.
            Err(Error::Fenced { .. }) => {
                strong.book.lock().declared.remove(&lock);
                return;
            }
            Err(e) => {
                tracing::warn!(lock = %lock, error = %e, "could not follow the permits other clusters declare; retrying");
                drop(strong);
                backoff.wait().await;
            }
        }
    }
}

/// One listing of the declarations: makes ours right (answers `None`: list again), or takes
/// the others' as known and answers the watch on the listing.
async fn round(
    core: &Arc<Core>,
    client: &zk::Client,
    lock: &Arc<str>,
    dir: &str,
    cluster: &str,
    own: Option<crate::recipe::Limit>,
) -> Result<Option<zk::OneshotWatcher>, Error> {
    let parents_acls = core.config.parent_acls();
    let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&parents_acls));
    retry::idempotent(|| client.mkdir(dir, &parents)).await.map_err(|e| Error::zk("mkdir", dir, e))?;
    let (children, _, watcher) =
        retry::idempotent(|| client.get_and_watch_children(dir)).await.map_err(|e| Error::zk("list", dir, e))?;
    let session_id = client.session_id().0;
    let want = own.map(|limit| declaration::node_name(cluster, limit, session_id));
    let (ours, others) = declaration::read_listing(&children, cluster);
    let stale: Vec<&str> = ours.into_iter().filter(|name| want.as_deref() != Some(*name)).collect();
    for unread in children.iter().filter(|name| declaration::parse(name).is_none()) {
        tracing::warn!(dir, node = %unread, "a node that is no zklock declaration of permits: granting the front of the queue only while it stands");
    }
    let missing = want.filter(|w| !children.contains(w));
    if stale.is_empty() && missing.is_none() {
        publish(core, lock, others);
        return Ok(Some(watcher));
    }
    // Ours of earlier sessions (a previous leader's, gone or detached) go as the new one comes,
    // in one step: this cluster never declares nothing in between.
    let mut multi = core.fence.writer(client).map_err(|e| Error::zk("declare", dir, e))?;
    for name in &stale {
        let path = format!("{dir}/{name}");
        multi.add_delete(&path, None).map_err(|e| Error::zk("delete", &path, e))?;
    }
    if let Some(name) = &missing {
        let path = format!("{dir}/{name}");
        let options_acls = core.config.node_acls();
        let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::new(&options_acls));
        multi.add_create(&path, &[], &options).map_err(|e| Error::zk("create", &path, e))?;
    }
    match core.fence.commit(&mut multi).await {
        Ok(_) => Ok(None),
        // Changed meanwhile, or the answer was lost: the next listing tells.
        Err(zk::Error::NoNode | zk::Error::NodeExists) => Ok(None),
        Err(e) if retry::is_unknown_outcome(&e) => Ok(None),
        Err(e) => Err(Error::zk("declare", dir, e)),
    }
}

/// Takes the other clusters' declarations as known; decides the lock's contenders again if the
/// limit changed.
fn publish(core: &Arc<Core>, lock: &Arc<str>, others: Vec<Declaration>) {
    let changed = {
        let mut book = core.book.lock();
        let before = book.limit(lock);
        let Some(declared) = book.declared.get_mut(lock) else { return };
        if declared.others.as_ref() == Some(&others) {
            return;
        }
        declared.others = Some(others);
        before != book.limit(lock)
    };
    if changed {
        rounds::decide_again(core, lock);
    }
    core.emit(super::contender::EngineEvent::Permits { lock_path: lock.to_string() });
}
