//! The operator: a controller over LockClaims, driven also by the lock engine's state changes
//! and by holder pods.
//!
//! Reconcile is a pipeline (see `reconcile`): dereference (the claim's holder pod and its
//! contender in the engine) → validate (pure, `api::validate`) → plan (pure, `plan`) → apply
//! (enqueue, znode writes, pod annotation, status, release) → events.
//!
//! The loop around it is the operator's own (`watch`, `store`, `queue`) rather than
//! kube-runtime's `Controller`: that one keeps every claim as a full object plus several
//! scheduler entries sized by the largest burst, some 2.3 KiB per claim in all, where the design
//! allows 2 KiB for everything (DESIGN.md §5). The rules it keeps are the same: one reconcile per
//! claim at a time, the earliest requested time wins, a bounded number at once.

pub mod anchor;
mod background;
pub mod events;
pub mod plan;
mod queue;
mod reconcile;
pub mod registry;
mod store;
mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kube::Api;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::api::LockClaim;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::zk::LockEngine;
use queue::{Queue, Uid};
pub use registry::Registry;
use store::Store;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(String),
    #[error("ZooKeeper: {0}")]
    ZooKeeper(#[from] crate::zk::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("object without {0}")]
    Malformed(&'static str),
    #[error("not the leader any more: no write")]
    NotLeading,
}

impl Error {
    /// A short label for the reconcile error metric.
    pub fn metric_label(&self) -> String {
        match self {
            Error::Kube(_) => "kubernetes".into(),
            Error::ZooKeeper(e) => format!("zookeeper_{}", e.kind()),
            Error::Finalizer(_) => "finalizer".into(),
            Error::Malformed(_) => "malformed".into(),
            Error::NotLeading => "not_leading".into(),
        }
    }
}

impl<E: std::fmt::Display> From<crate::metrics::ApiCallError<E>> for Error {
    fn from(e: crate::metrics::ApiCallError<E>) -> Self {
        Error::Kube(e.to_string())
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: kube::Client,
    pub engine: LockEngine,
    /// ZooKeeper root of zklock's tree; locks live at `<root>/locks/<namespace>/<lockName>`.
    pub zk_root: String,
    /// Namespaces served; empty = all.
    pub namespaces: Vec<String>,
    pub registry: Registry,
    pub metrics: Arc<Metrics>,
    pub events: events::EventWriter,
    /// The served claims, as their watch last delivered them.
    store: Store,
    /// Which claims to reconcile, and when.
    queue: Mutex<Queue>,
    /// Wakes the worker loop when something is scheduled.
    wake: Notify,
    /// Claim watches (scopes) that have not yet listed their claims once.
    unsynced: AtomicUsize,
    leadership: Leadership,
}

impl Context {
    pub fn lock_path(&self, namespace: &str, lock_name: &str) -> String {
        format!("{}/locks/{namespace}/{lock_name}", self.zk_root.trim_end_matches('/'))
    }

    /// Whether the engine's session is re-anchored: nothing new is enqueued, and no claim is
    /// judged by its contender, before. The engine's answer, so that it turns false the moment
    /// a session ends, before any of its contenders is reported lost.
    pub fn admitting(&self) -> bool {
        self.engine.admitting()
    }

    /// Runs one Kubernetes write, if this process still leads (DESIGN.md §5a), and gives up on
    /// it when the leadership ends first.
    pub async fn write<T, E: std::fmt::Display>(
        &self,
        call: &str,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, Error> {
        Ok(self.try_write(call, f).await??)
    }

    /// [`Context::write`], with the API's own answer kept apart (outer: not leading).
    pub async fn try_write<T, E: std::fmt::Display>(
        &self,
        call: &str,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<Result<T, crate::metrics::ApiCallError<E>>, Error> {
        let left = self.leadership.time_left().ok_or(Error::NotLeading)?;
        tokio::time::timeout(left, self.metrics.api_call(call, true, f)).await.map_err(|_| Error::NotLeading)
    }

    /// This leader's term (the token of its ZooKeeper leader epoch), stamped into every status
    /// it writes; none without leader election.
    pub fn epoch(&self) -> Option<i64> {
        self.engine.epoch()
    }

    /// Fails unless this process still leads.
    pub fn ensure_leading(&self) -> Result<(), Error> {
        if self.leadership.is_leading() {
            Ok(())
        } else {
            Err(Error::NotLeading)
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock()
    }

    /// One copy of a claim UID for all the operator's indexes: the engine's if it has one.
    fn shared_uid(&self, uid: &str) -> Uid {
        self.engine.id(uid).unwrap_or_else(|| uid.into())
    }

    /// Whether every claim watch has listed its claims: from then on, a claim missing from the
    /// store is missing from the API.
    fn synced(&self) -> bool {
        self.unsynced.load(Ordering::SeqCst) == 0
    }

    /// A claim watch listed its claims for the first time. Once all have, every contender the
    /// engine tracks is looked at: one whose claim went before it was listed (deleted while
    /// the operator started, or while it re-anchored) is released.
    fn scope_synced(&self) {
        if self.unsynced.fetch_sub(1, Ordering::SeqCst) == 1 {
            for uid in self.engine.ids() {
                self.trigger(&uid);
            }
        }
    }

    /// Asks for a reconcile of claim `uid` soon.
    pub fn trigger(&self, uid: &str) {
        self.schedule(uid, Duration::ZERO);
    }

    /// Asks for a reconcile of claim `uid` after `delay` (an earlier request stands).
    pub fn schedule(&self, uid: &str, delay: Duration) {
        let uid = self.store.key(uid).unwrap_or_else(|| self.shared_uid(uid));
        self.queue().schedule(&uid, Instant::now() + delay);
        self.wake.notify_one();
    }

    /// The APIs of the claims served: one per watched namespace, or one for all.
    pub fn claim_apis(&self) -> Vec<Api<LockClaim>> {
        if self.namespaces.is_empty() {
            vec![Api::all(self.client.clone())]
        } else {
            self.namespaces.iter().map(|ns| Api::namespaced(self.client.clone(), ns)).collect()
        }
    }
}

/// What the controller is run with, besides the engine.
pub struct Setup {
    pub client: kube::Client,
    pub zk_root: String,
    pub namespaces: Vec<String>,
    pub metrics: Arc<Metrics>,
    pub events: events::EventWriter,
    /// Set once re-anchoring is done (the readiness probe).
    pub ready: Arc<AtomicBool>,
    /// Claims reconciled at once.
    pub concurrency: u16,
    /// Whether this process may write; every Kubernetes write asks it first.
    pub leadership: Leadership,
}

/// Runs the controller until `shutdown` completes. The engine must hold a fresh session;
/// re-anchoring runs first, and again after every session loss.
pub async fn run(
    setup: Setup,
    engine: LockEngine,
    engine_events: mpsc::UnboundedReceiver<crate::zk::EngineEvent>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let Setup { client, zk_root, namespaces, metrics, events, ready, concurrency, leadership } = setup;
    let scopes = namespaces.len().max(1);
    let ctx = Arc::new(Context {
        client,
        engine,
        zk_root,
        namespaces,
        registry: Registry::default(),
        metrics,
        events,
        store: Store::default(),
        queue: Mutex::new(Queue::default()),
        wake: Notify::new(),
        unsynced: AtomicUsize::new(scopes),
        leadership,
    });
    anchor::reanchor_all(&ctx).await?;
    ready.store(true, Ordering::SeqCst);

    // Ended when dropped: when this future ends, or is dropped by a deposed leader.
    let mut tasks = JoinSet::new();
    background::spawn(&mut tasks, ctx.clone(), engine_events);
    for (scope, api) in ctx.claim_apis().into_iter().enumerate() {
        // At most one scope per namespace given on the command line.
        let scope = u16::try_from(scope).unwrap_or(u16::MAX);
        tasks.spawn(watch::follow_claims(ctx.clone(), scope, api));
    }
    work(&ctx, usize::from(concurrency.max(1)), shutdown).await;
    ready.store(false, Ordering::SeqCst);
    Ok(())
}

/// Starts the reconciles that are due, up to `limit` at once, until `shutdown`; then lets the
/// running ones finish.
async fn work(ctx: &Arc<Context>, limit: usize, shutdown: impl std::future::Future<Output = ()>) {
    let mut running: JoinSet<()> = JoinSet::new();
    let mut by_task: HashMap<tokio::task::Id, Uid> = HashMap::new();
    tokio::pin!(shutdown);
    loop {
        let next = {
            let mut queue = ctx.queue();
            while let Some(uid) = queue.start(Instant::now(), limit) {
                let task = running.spawn(reconcile_one(ctx.clone(), uid.clone()));
                by_task.insert(task.id(), uid);
            }
            ctx.metrics.reconcile_queue.set(queue.scheduled() as i64);
            ctx.metrics.reconciles_running.set(queue.running() as i64);
            queue.next_due(limit)
        };
        let sleep = tokio::time::sleep_until(next.map_or_else(far_future, Into::into));
        tokio::select! {
            _ = &mut shutdown => break,
            Some(done) = running.join_next_with_id() => finish(ctx, &mut by_task, done),
            _ = ctx.wake.notified() => {}
            _ = sleep => {}
        }
    }
    while let Some(done) = running.join_next_with_id().await {
        finish(ctx, &mut by_task, done);
    }
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(3600)
}

fn finish(
    ctx: &Context,
    by_task: &mut HashMap<tokio::task::Id, Uid>,
    done: Result<(tokio::task::Id, ()), tokio::task::JoinError>,
) {
    let id = match &done {
        Ok((id, ())) => *id,
        Err(e) => e.id(),
    };
    let Some(uid) = by_task.remove(&id) else { return };
    if let Err(e) = done {
        // A reconcile does not panic on any input; should one ever, the claim is retried
        // rather than left marked as running forever.
        tracing::error!(uid = %uid, error = %e, "reconcile task failed");
        ctx.queue().schedule(&uid, Instant::now() + Duration::from_secs(2));
    }
    ctx.queue().done(&uid);
    if let Some(keep) = queue::shrunk_capacity(by_task.len(), by_task.capacity()) {
        by_task.shrink_to(keep);
    }
}

async fn reconcile_one(ctx: Arc<Context>, uid: Uid) {
    let Some(claim) = ctx.store.get(&uid) else {
        if ctx.engine.state(&uid).is_some() && !ctx.synced() {
            // Maybe just not listed yet: look again once it could be.
            ctx.schedule(&uid, Duration::from_secs(1));
        } else if let Err(error) = release_orphan(&ctx, &uid).await {
            error_policy(&uid, &error.into(), &ctx);
        }
        return;
    };
    let span = tracing::info_span!(
        "reconcile",
        claim = claim.metadata.name.as_deref().unwrap_or_default(),
        namespace = claim.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let result = reconcile::reconcile(uid.clone(), Arc::new(claim), ctx.clone()).instrument(span).await;
    if !ctx.store.contains(&uid) {
        // Gone while it was reconciled (a node it was just given would outlive it): look again.
        ctx.trigger(&uid);
    }
    if let Err(error) = result {
        error_policy(&uid, &error, &ctx);
    }
}

/// Forgets a claim that is not in the API any more, releasing its node if the engine still
/// tracks one: a node must not outlive its claim. Only once every watch has listed its claims
/// (before, a claim missing from the store may simply not be listed yet).
async fn release_orphan(ctx: &Context, uid: &str) -> Result<(), crate::zk::Error> {
    if ctx.engine.state(uid).is_some() {
        tracing::warn!(uid, "a claim was deleted without its finalizer; releasing its znode");
        ctx.engine.release(uid).await?;
    }
    ctx.registry.forget(uid);
    ctx.metrics.set_phase_counts(&ctx.registry.phase_counts());
    Ok(())
}

fn error_policy(uid: &str, error: &Error, ctx: &Context) {
    ctx.metrics.reconcile_errors.get_or_create(&crate::metrics::ErrorLabel { error: error.metric_label() }).inc();
    tracing::warn!(uid, %error, "reconcile failed; retrying");
    ctx.schedule(uid, Duration::from_secs(2));
}
