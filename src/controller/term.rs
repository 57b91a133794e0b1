//! A leader's term: builds the context once, runs the four controllers (claims, gated pods,
//! `Lock` statuses, `ClusterLock` statuses) and the term's tasks, and ends them together.

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{Action, Config, Controller, Error as ControllerError};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::Api;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::base::kept_pod::KeptPod;
use super::base::scopes::Scopes;
use super::base::settings::{STATUS_INTERVAL, STATUS_SPACING, STATUS_WINDOW};
use super::base::{Error, Uid};
use super::context::Context;
use super::serving::Serving;
use super::status::{cluster_locks, limits_feed, locks};
use super::stores::Stores;
use super::throttle::Throttle;
use super::triggers::Triggers;
use super::writer::ApiWriter;
use super::{
    api_fence, claim, events, feed, fencing, gated, history, holders, pace, positions, report, supervisor, token_floor,
    watch, EpochParam, FencingParam, Registry,
};

/// How long a stopping term spends on its last history batch, while it still holds the
/// leadership: the history must not hold up the next leader. With 3 s, a graceful stop under a
/// backlog (10,000 locks' first grants, written at 50 a second) took 3.1 s to hand the lease on
/// instead of 0.07 s (`operator_bench --only failover`).
const HISTORY_AT_STOP: Duration = Duration::from_millis(250);
use crate::api::{ClusterLock, KeptClaim, Lock};
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
    /// Where fenced locks' holds in force are kept for the fencing policy (see `fencing`).
    pub fencing_param: FencingParam,
}

/// Runs the controller until `shutdown` completes, then lets the running reconciles finish.
/// The engine must hold a fresh session: the claims are listed by their watches, re-anchored
/// from those lists, and only then reconciled; re-anchoring runs again after every session loss.
pub async fn run(
    setup: Setup,
    engine: LockEngine,
    mut engine_events: mpsc::UnboundedReceiver<crate::zk::EngineEvent>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (ctx, ends, settings) = build(setup, engine);
    // Scrapes read this term's waiters (the term's end lets go of them: see operator.rs).
    ctx.metrics.waiters.follow(ctx.stores.claims().to_vec());
    let shutdown = shutdown.shared();
    if ctx.fence.is_some() {
        ctx.writer.leadership().time_left().ok_or(Error::NotLeading)?;
    }
    let began = std::time::Instant::now();
    let Some(()) = until(shutdown.clone(), fence_and_sync(&ctx, &settings.feeds)).await? else { return Ok(()) };
    tracing::debug!(took = ?began.elapsed(), "the term's fence raised and its claim feeds synced; replaying the claims");
    // Only now: every earlier term's write is in the stores, and so in the replay each claim's
    // first copy in this term's registry comes from (see `feed::ClaimFeeds::subscribe`).
    let subscribed = settings.feeds.subscribe();
    // Ended when dropped: when this future ends, or is dropped by a deposed leader (which
    // aborts the reconciles in flight with their controller).
    let mut controllers = JoinSet::new();
    let concurrency = Config::default().concurrency(settings.concurrency.max(1));
    spawn_claims_and_gated(&mut controllers, &ctx, ends.scopes, subscribed, &concurrency, &shutdown);
    spawn_statuses(&mut controllers, &ctx, ends.locks, ends.cluster_locks, &shutdown);
    let mut tasks = JoinSet::new();
    tasks.spawn(watch::release_orphans(ctx.clone(), ends.orphans).map(Ok));
    let walking = usize::from(settings.concurrency);
    tasks.spawn(pace::walks(ctx.clone(), ends.walks, walking, settings.resync_period).map(Ok));
    let (woken, woken_rx) = mpsc::unbounded_channel();
    ctx.registry.wake_into(woken);
    tasks.spawn(wake_granted(ctx.clone(), woken_rx));
    let first = supervisor::first_anchor(&ctx, &settings.term, &mut engine_events);
    let Some(kept) = until(shutdown.clone(), first).await? else { return Ok(()) };
    tracing::debug!(took = ?began.elapsed(), "the term's first re-anchoring pass done");
    tasks.spawn(supervisor::follow(ctx.clone(), engine_events, kept, settings.term));
    tasks.spawn(positions::refresh(ctx.clone()).map(Ok));
    let keeper = ctx.clone();
    tasks.spawn(async move { history::keep(&keeper.history, &keeper.writer).await });
    let ended = supervise(controllers, tasks, || shutdown.peek().is_some()).await;
    // Stopped, or failed: the reconciles that ran to their end have recorded their grants and
    // ends; what they recorded is written while this process still leads (the writer writes
    // nothing once it does not), within the stop's grace.
    if tokio::time::timeout(HISTORY_AT_STOP, history::write_waiting(&ctx.history, &ctx.writer)).await.is_err() {
        tracing::info!("the last history batch was not written within {HISTORY_AT_STOP:?}");
    }
    ended
}

/// The term's end, as each controller waits for it.
trait Shutdown: std::future::Future<Output = ()> + Clone + Send + Sync + 'static {}
impl<S: std::future::Future<Output = ()> + Clone + Send + Sync + 'static> Shutdown for S {}

/// What of the setup is used after the context is built.
struct Settings {
    feeds: Arc<feed::ClaimFeeds>,
    term: supervisor::Term,
    concurrency: u16,
    resync_period: Duration,
}

/// The ends of the term's channels and stores that its controllers and tasks read from or fill
/// (the other ends are in the context).
struct Ends {
    /// Per scope: the claims' store and their trigger stream, the gated pods' triggers, and the
    /// holder pods' store to fill.
    scopes: Vec<ScopeEnds>,
    /// Per scope: the `Lock`s' store, to fill and read, and their trigger stream.
    locks: Vec<(Writer<Lock>, Store<Lock>, Triggered<Lock>)>,
    cluster_locks: (Writer<ClusterLock>, Store<ClusterLock>, Triggered<ClusterLock>),
    orphans: mpsc::UnboundedReceiver<Uid>,
    walks: mpsc::UnboundedReceiver<()>,
}

type Triggered<K> = futures::channel::mpsc::UnboundedReceiver<ObjectRef<K>>;

struct ScopeEnds {
    claims: Store<KeptClaim>,
    claim_triggers: Triggered<KeptClaim>,
    pod_triggers: Triggered<KeptPod>,
    holder_pods: Writer<holders::HolderPod>,
}

/// The term's context: its stores and the triggers of its controllers, one each per scope.
fn build(setup: Setup, engine: LockEngine) -> (Arc<Context>, Ends, Settings) {
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
        fencing_param,
    } = setup;
    let scopes = Scopes::new(namespaces);
    let (orphans, orphans_rx) = mpsc::unbounded_channel();
    let (walks, walks_rx) = mpsc::unbounded_channel();
    let (mut claims, mut claim_triggers, mut pod_triggers, mut scope_ends) = (vec![], vec![], vec![], vec![]);
    let (mut locks, mut lock_triggers, mut lock_ends) = (vec![], vec![], vec![]);
    let mut holder_stores = vec![];
    for reader in feeds.stores() {
        let (holder_reader, holder_writer) = reflector::store();
        holder_stores.push(holder_reader);
        let (one, one_rx) = futures::channel::mpsc::unbounded();
        let (pod, pod_rx) = futures::channel::mpsc::unbounded();
        claims.push(reader.clone());
        claim_triggers.push(one);
        pod_triggers.push(pod);
        scope_ends.push(ScopeEnds {
            claims: reader,
            claim_triggers: one_rx,
            pod_triggers: pod_rx,
            holder_pods: holder_writer,
        });
        let (lock_reader, lock_writer) = reflector::store();
        let (lock, lock_rx) = futures::channel::mpsc::unbounded();
        locks.push(lock_reader.clone());
        lock_triggers.push(lock);
        lock_ends.push((lock_writer, lock_reader, lock_rx));
    }
    let (cluster_lock_reader, cluster_lock_writer) = reflector::store();
    let (cluster_lock_triggers, cluster_lock_rx) = futures::channel::mpsc::unbounded();
    let engine_epoch = engine.epoch();
    let history = history::History::new(fencing_param.namespace.clone(), layout.cluster().map(str::to_string));
    // Each scope's `Lock`s, and the `ClusterLock`s; each scope's claims.
    let (limit_listings, claim_scopes) = (scopes.count() + 1, scopes.count());
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
        triggers: Arc::new(Triggers {
            scopes,
            claims: claim_triggers,
            pods: pod_triggers,
            locks: lock_triggers,
            cluster_locks: cluster_lock_triggers,
            walks,
            orphans,
        }),
        holder_pods: holders::HolderPods::new(holder_stores),
        serving: Arc::new(Serving::new(limit_listings, claim_scopes)),
        fence: epoch_param.zip(engine_epoch).map(|(param, mine)| api_fence::Fence::new(param, mine)),
        token_floor,
        fencing: fencing::Fencing::new(fencing_param, engine_epoch),
        history,
    });
    let ends = Ends {
        scopes: scope_ends,
        locks: lock_ends,
        cluster_locks: (cluster_lock_writer, cluster_lock_reader, cluster_lock_rx),
        orphans: orphans_rx,
        walks: walks_rx,
    };
    (ctx, ends, Settings { feeds, term, concurrency, resync_period })
}

/// `step`'s result, or `None` when `shutdown` comes first.
async fn until<T>(
    shutdown: impl std::future::Future<Output = ()>,
    step: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<Option<T>, Error> {
    tokio::select! {
        done = step => done.map(Some),
        _ = shutdown => Ok(None),
    }
}

/// The API server refuses every status write of earlier terms before a single claim is
/// listed: whatever such a write changed before is in the list this term plans from. And a term
/// plans from a state no older than its start, though its store was filled while it stood by
/// (see `feed`).
async fn fence_and_sync(ctx: &Context, feeds: &feed::ClaimFeeds) -> Result<(), Error> {
    if let Some(fence) = &ctx.fence {
        let scopes = ctx.scopes.apis::<crate::api::LockClaim>(ctx.writer.client());
        api_fence::raise(ctx.writer.client(), fence, &scopes, &ctx.engine).await?;
    }
    if let Some(epoch) = ctx.epoch() {
        feeds.sync(epoch, ctx.writer.leadership()).await?;
    }
    Ok(())
}

/// Per scope, the claims' controller (also reconciling the claims of holder pods the pod watch
/// sees go) and the gated pods' controller, with a context of its own.
fn spawn_claims_and_gated<S: Shutdown>(
    controllers: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    scopes: Vec<ScopeEnds>,
    subscribed: Vec<mpsc::UnboundedReceiver<feed::Event>>,
    config: &Config,
    shutdown: &S,
) {
    let gated_ctx = Arc::new(gated::Ctx {
        writer: ctx.writer.clone(),
        engine: ctx.engine.clone(),
        layout: ctx.layout.clone(),
        metrics: ctx.metrics.clone(),
        registry: ctx.registry.clone(),
        serving: ctx.serving.clone(),
        stores: ctx.stores.clone(),
        triggers: ctx.triggers.clone(),
        arrivals: Default::default(),
    });
    let apis = ctx.scopes.apis::<holders::HolderPod>(&ctx.watch_client);
    let apis = apis.into_iter().zip(ctx.scopes.apis(&ctx.watch_client));
    for ((ends, events), (pod_api, gated_api)) in scopes.into_iter().zip(subscribed).zip(apis) {
        let pods_ctx = ctx.clone();
        let holder_pods = watch::holder_pods(ctx.clone(), pod_api, ends.holder_pods);
        let controller = Controller::for_shared_stream(watch::claims(ctx.clone(), events), ends.claims)
            .watches_stream(holder_pods, move |pod| watch::claims_of_pod(&pods_ctx, &pod))
            .reconcile_on(ends.claim_triggers)
            .with_config(config.clone())
            .graceful_shutdown_on(shutdown.clone())
            .run(claim::reconcile, report::error_policy, ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(controller);
        let (gated_reader, gated_writer) = reflector::store();
        let pods = gated::pods(gated_ctx.clone(), gated_api, gated_writer);
        let gated = Controller::for_stream(pods, gated_reader)
            .reconcile_on(ends.pod_triggers)
            .with_config(config.clone())
            .graceful_shutdown_on(shutdown.clone())
            .run(gated::reconcile, report::error_policy, gated_ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(gated);
    }
}

/// The `Lock` statuses' controllers (one per scope) and the `ClusterLock` statuses'
/// controller, each with a context of what it needs only.
fn spawn_statuses<S: Shutdown>(
    controllers: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    lock_ends: Vec<(Writer<Lock>, Store<Lock>, Triggered<Lock>)>,
    cluster_lock_ends: (Writer<ClusterLock>, Store<ClusterLock>, Triggered<ClusterLock>),
    shutdown: &S,
) {
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
        lock_ends.into_iter().zip(ctx.scopes.apis::<Lock>(&ctx.watch_client)).enumerate()
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
    let (writer, reader, cluster_lock_rx) = cluster_lock_ends;
    let api: Api<ClusterLock> = Api::all(ctx.watch_client.clone());
    let directories = cluster_locks::directories(&ctx.layout);
    let feed = limits_feed::feed(ctx.clone(), api, writer, reader.clone(), directories);
    let controller = Controller::for_stream(feed, reader)
        .reconcile_on(cluster_lock_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(cluster_locks::reconcile, report::error_policy, cluster_lock_ctx)
        .for_each(|result| async move { report(result) });
    controllers.spawn(controller);
}

/// Claims whose grant waited for another claim's write: that write was made.
async fn wake_granted(ctx: Arc<Context>, mut woken_rx: mpsc::UnboundedReceiver<Uid>) -> Result<(), Error> {
    while let Some(uid) = woken_rx.recv().await {
        ctx.trigger(&uid);
    }
    Ok(())
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
