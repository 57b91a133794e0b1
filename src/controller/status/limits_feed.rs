//! The watch of the objects that give locks their permits, `Lock`s (one watch per served
//! scope) and `ClusterLock`s (one for the cluster), as one feed: each change goes to the lock
//! engine the moment the watch delivers it (every contender of the lock is decided again: a
//! raise grants at once); after every listing the locks whose object went while the watch was
//! down lose what it declared; the first listing counts among those a term waits for before it
//! decides any claim (a lock's first decisions under a mutex's rules could grant Shared claims
//! beyond its permits).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::Store;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use crate::controller::context::Context;
use crate::zk::{Layout, LockEngine};

/// An object that gives a lock its permits.
pub trait LimitSource: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static {
    /// Whether a listing the API server refuses for want of the kind or of the right to list
    /// it (403, 404: the CRD or RBAC of an earlier release) counts as a listing of none, so
    /// that it holds up no other claim.
    const OPTIONAL: bool;
    /// The lock directory the object gives permits to.
    fn directory(&self, layout: &Layout) -> String;
    /// Tells the engine the object's permits.
    fn declare(&self, engine: &LockEngine, layout: &Layout);
    /// Tells the engine that the object of directory `path` is gone.
    fn undeclare(engine: &LockEngine, path: &str);
    /// The lock's namespace (`None`: a `ClusterLock`) and name, and whether its fencing is
    /// enforced.
    fn fencing(&self) -> (Option<String>, String, bool);
}

/// The objects of one watch, kept in `writer`'s store (`store` reads it), as a controller's
/// trigger stream. `prefix`: the directories this watch covers (its scope's).
pub fn feed<K: LimitSource>(
    ctx: Arc<Context>,
    api: Api<K>,
    writer: Writer<K>,
    store: Store<K>,
    prefix: String,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    let kind = K::kind(&());
    let mut listed_once = false;
    watcher(api, watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECONDS))
        .default_backoff()
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::InitApply(object) | watcher::Event::Apply(object)) => {
                object.declare(&ctx.engine, &ctx.layout);
                if let (namespace, name, false) = object.fencing() {
                    ctx.fencing.disarm(ctx.writer.client(), namespace.as_deref(), &name);
                }
            }
            Ok(watcher::Event::Delete(object)) => {
                K::undeclare(&ctx.engine, &object.directory(&ctx.layout));
                let (namespace, name, _) = object.fencing();
                ctx.fencing.disarm(ctx.writer.client(), namespace.as_deref(), &name);
            }
            Ok(watcher::Event::InitDone) => {
                forget_unlisted(&ctx, &store, &prefix);
                if !std::mem::replace(&mut listed_once, true) {
                    ctx.serving.mark_limits_listed();
                }
            }
            Ok(watcher::Event::Init) => {}
            // Counted as listed (none); claims that name one end Invalid; the watch goes on
            // trying.
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s)))
                if K::OPTIONAL && (s.code == 403 || s.code == 404) =>
            {
                tracing::error!(
                    status = %s.message,
                    "cannot list {kind} objects: grant the operator list and watch on {}.{} and apply zklock's \
                     CRDs (the chart does both); serving every other claim meanwhile",
                    K::plural(&()),
                    K::group(&()),
                );
                if !std::mem::replace(&mut listed_once, true) {
                    ctx.serving.mark_limits_listed();
                }
            }
            Err(e) => tracing::warn!(%kind, error = %e, "watch failed; retrying"),
        })
        .applied_objects()
}

/// After a (re-)listing: the directories under `prefix` whose object went while the watch was
/// down lose what it declared.
fn forget_unlisted<K: LimitSource>(ctx: &Context, store: &Store<K>, prefix: &str) {
    let listed: BTreeSet<String> = store.state().iter().map(|o| o.directory(&ctx.layout)).collect();
    for (path, _) in ctx.engine.limits() {
        if path.starts_with(prefix) && !listed.contains(&path) {
            K::undeclare(&ctx.engine, &path);
        }
    }
}
