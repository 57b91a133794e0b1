//! A leader's term: builds the context once, runs the four controllers (claims, gated pods,
//! `Lock` statuses, `ClusterLock` statuses) and the term's tasks, and ends them together.

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{Action, Config, Controller, Error as ControllerError};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::Api;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::base::scopes::Scopes;
use super::base::settings::{STATUS_INTERVAL, STATUS_SPACING, STATUS_WINDOW};
use super::base::Error;
use super::context::Context;
use super::serving::Serving;
use super::status::{cluster_locks, limits_feed, locks};
use super::stores::Stores;
use super::throttle::Throttle;
use super::triggers::Triggers;
use super::writer::ApiWriter;
use super::{
    api_fence, claim, events, feed, gated, holders, pace, positions, report, supervisor, token_floor, watch,
    EpochParam, Registry,
};
use crate::api::{ClusterLock, Lock};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::zk::{Layout, LockEngine};

/// What the controller is run with, besides the engine.
pub struct Setup {
    pub client: kube::Client,
    pub watch_client: kube::Client,
    pub layout: Layout,
    pub namespaces: Vec<String>,
    pub metrics: Arc<Metrics>,
    pub events: events::EventWriter,
    /// This leader's term, for readiness: the session supervisor marks it serving.
    pub term: supervisor::Term,
    /// Claims reconciled at once, per scope.
    pub concurrency: u16,
    /// How often every claim is looked at again (see `pace`).
    pub resync_period: Duration,
    /// Time to live after finishing for claims that set none and have no owner.
    pub default_ttl: Option<Duration>,
    /// Whether this process may write; every Kubernetes write asks it first.
    pub leadership: Leadership,
    /// Where the epoch the API server enforces is kept (docs/design.md: fencing); none without the policy.
    pub epoch_param: Option<EpochParam>,
    /// The claims, watched for the life of the process (see `feed`).
    pub feeds: Arc<feed::ClaimFeeds>,
    /// Above every number this installation hands out (see `token_floor`).
    pub token_floor: Arc<token_floor::TokenFloor>,
}

/// Runs the controller until `shutdown` completes, then lets the running reconciles finish.
/// The engine must hold a fresh session: the claims are listed by their watches, re-anchored
/// from those lists, and only then reconciled; re-anchoring runs again after every session loss.
pub async fn run(
    setup: Setup,
    engine: LockEngine,
    engine_events: mpsc::UnboundedReceiver<crate::zk::EngineEvent>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let Setup {
        client,
        watch_client,
        layout,
        namespaces,
        metrics,
        events,
        term,
        concurrency,
        resync_period,
        default_ttl,
        leadership,
        epoch_param,
        feeds,
        token_floor,
    } = setup;
    let scopes = Scopes::new(namespaces);
    let (orphans, orphans_rx) = mpsc::unbounded_channel();
    let (walks, walks_rx) = mpsc::unbounded_channel();
    // Per scope: its store, and its triggers (the senders go into the context).
    let (mut claims, mut triggers, mut pod_triggers, mut scoped) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut locks, mut lock_triggers, mut lock_scoped) = (Vec::new(), Vec::new(), Vec::new());
    let (mut holder_stores, mut holder_writers) = (Vec::new(), Vec::new());
    for reader in feeds.stores() {
        let (holder_reader, holder_writer) = reflector::store();
        holder_stores.push(holder_reader);
        holder_writers.push(holder_writer);
        let (one, one_rx) = futures::channel::mpsc::unbounded();
        let (pod, pod_rx) = futures::channel::mpsc::unbounded();
        claims.push(reader.clone());
        triggers.push(one);
        pod_triggers.push(pod);
        scoped.push((reader, one_rx, pod_rx));
        let (lock_reader, lock_writer) = reflector::store();
        let (lock, lock_rx) = futures::channel::mpsc::unbounded();
        locks.push(lock_reader.clone());
        lock_triggers.push(lock);
        lock_scoped.push((lock_writer, lock_reader, lock_rx));
    }
    let (cluster_lock_reader, cluster_lock_writer) = reflector::store();
    let (cluster_lock_triggers, cluster_lock_rx) = futures::channel::mpsc::unbounded();
    let engine_epoch = engine.epoch();
    let listings = 2 * scopes.count() + 1;
    let ctx = Arc::new(Context {
        writer: Arc::new(ApiWriter::new(client, leadership, events)),
        watch_client,
        engine,
        layout,
        scopes: scopes.clone(),
        registry: Arc::new(Registry::default()),
        metrics,
        default_ttl,
        stores: Arc::new(Stores::new(scopes.clone(), claims, locks, cluster_lock_reader.clone())),
        triggers: Triggers {
            scopes: scopes.clone(),
            claims: triggers,
            pods: pod_triggers,
            locks: lock_triggers,
            cluster_locks: cluster_lock_triggers,
            walks,
            orphans,
        },
        holder_pods: holders::HolderPods::new(holder_stores),
        arrivals: Default::default(),
        serving: Arc::new(Serving::new(listings)),
        fence: epoch_param.clone().zip(engine_epoch).map(|(param, mine)| api_fence::Fence::new(param, mine)),
        token_floor,
    });

    // Scrapes read this term's waiters (the term's end lets go of them: see operator.rs).
    ctx.metrics.waiters.follow(ctx.stores.claims().to_vec());
    let shutdown = shutdown.shared();
    // The API server refuses every status write of earlier terms before a single claim is
    // listed: whatever such a write changed before is in the list this term plans from.
    if let Some(fence) = &ctx.fence {
        ctx.writer.leadership().time_left().ok_or(Error::NotLeading)?;
        let scopes = ctx.scopes.apis::<crate::api::LockClaim>(ctx.writer.client());
        tokio::select! {
            raised = api_fence::raise(ctx.writer.client(), fence, &scopes, &ctx.engine) => raised?,
            _ = shutdown.clone() => return Ok(()),
        }
    }
    // A term plans from a state no older than its start, though its store was filled while it
    // stood by (see `feed`).
    if let Some(epoch) = ctx.epoch() {
        tokio::select! {
            synced = feeds.sync(epoch, ctx.writer.leadership()) => synced?,
            _ = shutdown.clone() => return Ok(()),
        }
    }
    // Only now: every earlier term's write is in the stores, and so in the replay each claim's
    // first copy in this term's registry comes from (see `feed::ClaimFeeds::subscribe`).
    let subscribed = feeds.subscribe();
    // Ended when dropped: when this future ends, or is dropped by a deposed leader (which
    // aborts the reconciles in flight with their controller).
    let mut controllers = JoinSet::new();
    let apis = ctx.scopes.apis::<holders::HolderPod>(&ctx.watch_client);
    let apis = apis.into_iter().zip(ctx.scopes.apis(&ctx.watch_client)).zip(holder_writers);
    for (((reader, one_rx, pod_rx), events), ((pod_api, gated_api), holder_writer)) in
        scoped.into_iter().zip(subscribed).zip(apis)
    {
        let pods_ctx = ctx.clone();
        let holder_pods = watch::holder_pods(ctx.clone(), pod_api, holder_writer);
        let controller = Controller::for_shared_stream(watch::claims(ctx.clone(), events), reader)
            .watches_stream(holder_pods, move |pod| watch::claims_of_pod(&pods_ctx, &pod))
            .reconcile_on(one_rx)
            .with_config(Config::default().concurrency(concurrency.max(1)))
            .graceful_shutdown_on(shutdown.clone())
            .run(claim::reconcile, report::error_policy, ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(controller);
        let (gated_reader, gated_writer) = reflector::store();
        let gated = Controller::for_stream(gated::pods(ctx.clone(), gated_api, gated_writer), gated_reader)
            .reconcile_on(pod_rx)
            .with_config(Config::default().concurrency(concurrency.max(1)))
            .graceful_shutdown_on(shutdown.clone())
            .run(gated::reconcile, report::error_policy, ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(gated);
    }
    // The status controllers work with what they need only.
    let lock_ctx = Arc::new(locks::Ctx {
        engine: ctx.engine.clone(),
        layout: ctx.layout.clone(),
        registry: ctx.registry.clone(),
        stores: ctx.stores.clone(),
        writer: ctx.writer.clone(),
        serving: ctx.serving.clone(),
        metrics: ctx.metrics.clone(),
        refreshes: Throttle::new(STATUS_WINDOW, STATUS_SPACING, STATUS_INTERVAL),
    });
    let cluster_lock_ctx = Arc::new(cluster_locks::Ctx {
        engine: ctx.engine.clone(),
        layout: ctx.layout.clone(),
        stores: ctx.stores.clone(),
        writer: ctx.writer.clone(),
        serving: ctx.serving.clone(),
        metrics: ctx.metrics.clone(),
        refreshes: Throttle::new(STATUS_WINDOW, STATUS_SPACING, STATUS_INTERVAL),
    });
    for (scope, ((writer, reader, lock_rx), api)) in
        lock_scoped.into_iter().zip(ctx.scopes.apis::<Lock>(&ctx.watch_client)).enumerate()
    {
        let directories = locks::directories(&ctx.layout, ctx.scopes.namespace(scope));
        let feed = limits_feed::feed(ctx.clone(), api, writer, reader.clone(), directories);
        let controller = Controller::for_stream(feed, reader)
            .reconcile_on(lock_rx)
            .graceful_shutdown_on(shutdown.clone())
            .run(locks::reconcile, report::error_policy, lock_ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(controller);
    }
    let api: Api<ClusterLock> = Api::all(ctx.watch_client.clone());
    let directories = cluster_locks::directories(&ctx.layout);
    let feed = limits_feed::feed(ctx.clone(), api, cluster_lock_writer, cluster_lock_reader.clone(), directories);
    let controller = Controller::for_stream(feed, cluster_lock_reader)
        .reconcile_on(cluster_lock_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(cluster_locks::reconcile, report::error_policy, cluster_lock_ctx)
        .for_each(|result| async move { report(result) });
    controllers.spawn(controller);
    let mut tasks = JoinSet::new();
    tasks.spawn(watch::release_orphans(ctx.clone(), orphans_rx).map(Ok));
    tasks.spawn(pace::walks(ctx.clone(), walks_rx, usize::from(concurrency), resync_period).map(Ok));
    let (woken, mut woken_rx) = mpsc::unbounded_channel();
    ctx.registry.wake_into(woken);
    let waking = ctx.clone();
    tasks.spawn(async move {
        // Claims whose grant waited for another claim's write: that write was made.
        while let Some(uid) = woken_rx.recv().await {
            waking.trigger(&uid);
        }
        Ok(())
    });

    let mut engine_events = engine_events;
    let kept = tokio::select! {
        anchored = supervisor::first_anchor(&ctx, &term, &mut engine_events) => anchored?,
        _ = shutdown.clone() => return Ok(()),
    };
    tasks.spawn(supervisor::follow(ctx.clone(), engine_events, kept, term));
    tasks.spawn(positions::refresh(ctx.clone()).map(Ok));
    supervise(controllers, tasks, || shutdown.peek().is_some()).await
}

/// Waits for the term's controllers and tasks. Every one of them runs for the whole term: one
/// that ends before the term is being stopped (`stopping`), a panic say, would leave its part of
/// the work undone while the rest looks healthy. The term ends with it instead, as an error the
/// caller does not retry (the process ends, and its restarts show). A task that ends with an
/// error of its own (the session supervisor's [`Error::CannotServe`]) ends the term with that
/// error. Once stopping, it returns when every controller has (each after its running
/// reconciles).
async fn supervise(
    mut controllers: JoinSet<()>,
    mut tasks: JoinSet<Result<(), Error>>,
    stopping: impl Fn() -> bool,
) -> Result<(), Error> {
    loop {
        let (what, ended) = tokio::select! {
            ended = controllers.join_next() => ("a controller", ended.map(|r| r.map(Ok))),
            ended = tasks.join_next(), if !tasks.is_empty() => ("a task of the controller", ended),
        };
        match ended {
            None => return Ok(()),
            Some(Ok(Err(e))) if !stopping() => return Err(e),
            Some(Ok(_)) if stopping() => {}
            Some(Err(e)) if e.is_panic() => {
                let why = e.into_panic();
                let why =
                    why.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| why.downcast_ref::<String>().cloned());
                return Err(Error::TaskPanicked(format!("{what} panicked: {}", why.unwrap_or_default())));
            }
            Some(_) if stopping() => {}
            Some(_) => return Err(Error::TaskPanicked(format!("{what} stopped before the term ended"))),
        }
    }
}

/// What the controller's stream reports besides reconciles (those report through
/// `error_policy`): a trigger for a claim that has left, or a watch error (the watchers retry).
fn report<K: kube::Resource>(result: Result<(ObjectRef<K>, Action), ControllerError<Error, watcher::Error>>)
where
    ObjectRef<K>: std::fmt::Display,
{
    match result {
        Ok(_) | Err(ControllerError::ReconcilerFailed(..)) => {}
        Err(ControllerError::ObjectNotFound(object)) => tracing::debug!(%object, "triggered claim is gone"),
        Err(e) => tracing::debug!(error = %e, "controller stream"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_or_stops_ends_the_term_and_a_stopped_term_ends_quietly() {
        let forever = || async { std::future::pending::<()>().await };
        let task_forever = || async { std::future::pending::<Result<(), Error>>().await };
        let mut controllers = JoinSet::new();
        controllers.spawn(forever());
        let mut tasks = JoinSet::new();
        tasks.spawn(task_forever());
        tasks.spawn(async { panic!("a bug on some data") });
        let ended = supervise(controllers, tasks, || false).await;
        assert!(matches!(&ended, Err(Error::TaskPanicked(why)) if why.contains("a bug on some data")), "{ended:?}");

        let mut controllers = JoinSet::new();
        controllers.spawn(async {});
        let ended = supervise(controllers, JoinSet::new(), || false).await;
        assert!(matches!(&ended, Err(Error::TaskPanicked(why)) if why.contains("stopped before")), "{ended:?}");

        let mut controllers = JoinSet::new();
        controllers.spawn(async {});
        let mut tasks = JoinSet::new();
        tasks.spawn(task_forever());
        assert!(supervise(controllers, tasks, || true).await.is_ok(), "stopping: the controllers' end is the term's");

        let mut controllers = JoinSet::new();
        controllers.spawn(forever());
        let mut tasks = JoinSet::new();
        tasks.spawn(async { Err(Error::CannotServe("ZooKeeper is out of reach".into())) });
        let ended = supervise(controllers, tasks, || false).await;
        assert!(matches!(&ended, Err(Error::CannotServe(why)) if why.contains("out of reach")), "{ended:?}");
    }
}
