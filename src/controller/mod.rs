//! The operator: kube-runtime's `Controller` over LockClaims (one per served scope: a namespace,
//! or all), driven also by the lock engine's state changes and by holder pods.
//!
//! Reconcile is a pipeline (see `reconcile`): dereference (the claim's holder pod and its
//! contender in the engine) → validate (pure, `api::validate`) → plan (pure, `plan`) → apply
//! (enqueue, znode writes, pod annotation, status, release) → events. It answers with the
//! `Action` that says when to look again; other claims it affects are triggered through
//! `reconcile_on`.

pub mod admission;
pub mod anchor;
mod api_fence;
pub mod cluster_locks;
mod error;
pub mod events;
pub mod feed;
pub mod gated;
mod holders;
mod ledger;
pub mod locks;
mod pace;
pub mod parts;
pub mod plan;
mod positions;
mod reconcile;
pub mod registry;
pub mod supervisor;
mod throttle;
pub mod token_floor;
mod unreadable;
mod watch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{Action, Config, Controller, Error as ControllerError};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::Api;
use tokio::sync::{mpsc, watch as channel};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::api::{ClusterLock, KeptClaim, Lock};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::zk::{Layout, LockEngine};
pub use api_fence::EpochParam;
pub use registry::Registry;

/// Every call to the Kubernetes API gives up after this long (and is retried by the caller).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// A claim UID, one copy shared by the registry and the engine.
pub type Uid = Arc<str>;

pub use error::Error;

/// What every reconcile shares.
pub struct Context {
    /// Reads and writes, each with a deadline (see [`crate::client::Clients`]).
    pub client: kube::Client,
    /// Watches.
    watch_client: kube::Client,
    pub engine: LockEngine,
    /// Where zklock's nodes are in ZooKeeper.
    pub layout: Layout,
    /// Namespaces served; empty = all.
    pub namespaces: Vec<String>,
    pub registry: Registry,
    pub metrics: Arc<Metrics>,
    pub events: events::EventWriter,
    /// Time to live after finishing for claims that set none and have no owner.
    pub default_ttl: Option<Duration>,
    /// Each scope's claims, as its watch last delivered them (index = scope).
    claims: Vec<Store<KeptClaim>>,
    /// Each scope's requests to reconcile one claim.
    triggers: Vec<Triggers>,
    /// Requests to reconcile every claim (see `pace`), and the walk's batch in flight.
    walks: mpsc::UnboundedSender<()>,
    paced: pace::Paced,
    /// Each scope's pods, as this term's watch has them, for the claims' holder pods.
    holder_pods: holders::HolderPods,
    /// Each scope's requests to reconcile one gated pod.
    pod_triggers: Vec<UnboundedSender<ObjectRef<gated::KeptPod>>>,
    /// Each scope's `Lock` objects, and requests to refresh one's status.
    locks: Vec<Store<Lock>>,
    lock_triggers: Vec<UnboundedSender<ObjectRef<Lock>>>,
    /// When each `Lock`'s status was last written (see `throttle`).
    lock_refreshes: throttle::Throttle<ObjectRef<Lock>>,
    /// The `ClusterLock` objects, and requests to refresh one's status.
    cluster_locks: Store<ClusterLock>,
    cluster_lock_triggers: UnboundedSender<ObjectRef<ClusterLock>>,
    /// When each `ClusterLock`'s queue was last looked at.
    cluster_lock_refreshes: throttle::Throttle<String>,
    /// Gated pods waiting to have their claims made, in creation order.
    arrivals: parking_lot::Mutex<gated::Arrivals>,
    /// Claims that may have left the API with a node still tracked (see `watch::release_orphans`).
    orphans: mpsc::UnboundedSender<Uid>,
    /// Listings not yet made once: each scope's claims and its `Lock` objects, and the
    /// `ClusterLock` objects. Counted here
    /// rather than asked of the reflector stores: their readiness is a one-shot channel that
    /// wakes one waiter only.
    unsynced: channel::Sender<usize>,
    /// Set once the first re-anchoring is done: every claim is reconciled from then on.
    anchored: AtomicBool,
    /// Set once a re-anchoring pass began: before the first is done, a claim is reconciled
    /// once its locks are re-anchored (see [`Context::serves`]).
    reanchoring: AtomicBool,
    /// Claims whose reconcile came before the first pass re-anchored their locks: asked for
    /// again when it has (see [`Context::serve_deferred`]).
    deferred: parking_lot::Mutex<std::collections::HashSet<Uid>>,
    leadership: Leadership,
    /// This term's fence in the API server, if the admission policy is used (docs/design.md: fencing).
    fence: Option<api_fence::Fence>,
    /// Covers every number a status carries before it is written (see `token_floor`).
    token_floor: Arc<token_floor::TokenFloor>,
}

struct Triggers {
    one: UnboundedSender<ObjectRef<KeptClaim>>,
}

impl Context {
    pub fn lock_path(&self, namespace: &str, lock_name: &str) -> String {
        self.layout.lock(namespace, lock_name)
    }

    /// The directory of a claim's lock: one of its namespace, or a `ClusterLock`'s.
    pub fn path_of(&self, namespace: &str, name: &str, cluster: bool) -> String {
        if cluster {
            self.layout.cluster_lock(name)
        } else {
            self.layout.lock(namespace, name)
        }
    }

    /// The directory of a lock as a spec names it (not validated: a name that is neither is
    /// `None`).
    pub fn path_of_ref(&self, namespace: &str, lock: &crate::api::LockRef) -> Option<String> {
        match (&lock.lock_name, &lock.cluster_lock_name) {
            (Some(name), _) => Some(self.layout.lock(namespace, name)),
            (None, Some(name)) => Some(self.layout.cluster_lock(name)),
            (None, None) => None,
        }
    }

    /// What a claim's nodes say they stand for (`zkCli get`, and the waitingFor of a claim
    /// behind it in another cluster): `<cluster>/<namespace>/<name>`, or `<namespace>/<name>`
    /// without a cluster name.
    pub fn describe_claim(&self, namespace: &str, name: &str) -> String {
        match self.layout.cluster() {
            Some(cluster) => format!("{cluster}/{namespace}/{name}"),
            None => format!("{namespace}/{name}"),
        }
    }

    /// Whether the engine's session is re-anchored: nothing new is enqueued, and no claim is
    /// judged by its contender, before. The engine's answer, so that it turns false the moment
    /// a session ends, before any of its contenders is reported lost.
    pub fn admitting(&self) -> bool {
        self.engine.admitting()
    }

    /// Runs one Kubernetes write, if this process still leads (docs/design.md: fencing), and gives up on
    /// it when the leadership ends first (the outer error) or after [`API_TIMEOUT`]; the inner
    /// result is the API's.
    pub async fn write<T>(
        &self,
        call: &'static str,
        f: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, Error> {
        let left = self.leadership.time_left().ok_or(Error::NotLeading)?;
        match tokio::time::timeout(left.min(API_TIMEOUT), f).await {
            Ok(answer) => Ok(answer),
            // Renewals may have extended the leadership meanwhile: only a lost one is NotLeading.
            Err(_) if !self.leadership.is_leading() => Err(Error::NotLeading),
            Err(_) => Err(Error::Timeout { call }),
        }
    }

    /// This leader's term (the token of its ZooKeeper leader epoch), stamped into every status
    /// it writes; none without leader election.
    pub fn epoch(&self) -> Option<i64> {
        self.engine.epoch()
    }

    /// One copy of a claim UID for all the operator's indexes: the registry's or the engine's if
    /// either has one.
    fn shared_uid(&self, uid: &str) -> Uid {
        self.registry.key(uid).or_else(|| self.engine.id(uid)).unwrap_or_else(|| uid.into())
    }

    /// The scope that serves the claim.
    fn scope_of(&self, object: &ObjectRef<KeptClaim>) -> Option<usize> {
        if self.namespaces.is_empty() {
            Some(0)
        } else {
            self.namespaces.iter().position(|n| Some(n) == object.namespace.as_ref())
        }
    }

    fn object_ref(&self, uid: &str) -> Option<ObjectRef<KeptClaim>> {
        let (namespace, name) = self.registry.object(uid)?;
        Some(ObjectRef::new(&name).within(&namespace))
    }

    /// Claim `uid`'s copy in its scope's store, when the registry knows where to look.
    fn stored(&self, uid: &str) -> Option<Arc<KeptClaim>> {
        let (namespace, name) = self.registry.object(uid)?;
        self.claim(&namespace, &name).filter(|c| c.metadata.uid.as_deref() == Some(uid))
    }

    /// Whether claim `uid`'s copy in its scope's store is being deleted.
    fn is_being_deleted(&self, uid: &str) -> bool {
        self.stored(uid).is_some_and(|c| c.metadata.deletion_timestamp.is_some())
    }

    /// Whether claim `uid` is in its scope's store, i.e. in the API as far as its watch knows.
    fn is_served(&self, uid: &str) -> bool {
        if self.registry.object(uid).is_none() {
            // Not delivered to this term yet (it may be in the store all the same): only a store
            // without it proves it gone. A rare path (a claim this term never saw), so a scan.
            return self.claims.iter().any(|store| store.find(|c| c.metadata.uid.as_deref() == Some(uid)).is_some());
        }
        self.stored(uid).is_some()
    }

    /// The engine's contenders of claim `uid`, whatever its spec says (it may not be readable
    /// any more): to release them.
    fn parts_tracked(&self, uid: &str) -> Vec<parts::Part> {
        self.engine
            .ids()
            .into_iter()
            .filter(|id| parts::claim_of(id) == uid)
            .map(|id| {
                let node = self.engine.node(&id).unwrap_or_default();
                let lock = node.rsplit_once('/').map_or_else(String::new, |(dir, _)| dir.to_string());
                parts::Part { lock, name: String::new(), mode: crate::recipe::Mode::Exclusive, id }
            })
            .collect()
    }

    /// Asks for a reconcile of claim `uid` (or of the claim contender `uid` stands for) soon. A
    /// claim no watch knows (any more) is looked at by the orphan release instead.
    pub fn trigger(&self, uid: &str) {
        let uid = parts::claim_of(uid);
        let Some(object) = self.object_ref(uid) else {
            self.orphan(uid);
            return;
        };
        self.trigger_object(object);
    }

    /// Asks for a reconcile of every claim served, paced (see `pace`).
    pub fn trigger_all(&self) {
        // Closed only when the term's tasks have stopped, and this context with them.
        let _ = self.walks.send(());
    }

    /// Asks for a reconcile of claim `object` soon.
    fn trigger_object(&self, object: ObjectRef<KeptClaim>) {
        if let Some(triggers) = self.scope_of(&object).and_then(|scope| self.triggers.get(scope)) {
            // Closed only when the controller has stopped, and this context with it.
            let _ = triggers.one.unbounded_send(object);
        }
    }

    /// Asks for a reconcile of gated pod `pod` soon (nothing happens if no watch has it).
    fn trigger_pod(&self, pod: ObjectRef<gated::KeptPod>) {
        let scope = if self.namespaces.is_empty() {
            Some(0)
        } else {
            self.namespaces.iter().position(|n| Some(n) == pod.namespace.as_ref())
        };
        if let Some(triggers) = scope.and_then(|scope| self.pod_triggers.get(scope)) {
            // Closed only when the controller has stopped.
            let _ = triggers.unbounded_send(pod);
        }
    }

    /// Asks for a status refresh of `ClusterLock` `name`, if its watch has it.
    fn trigger_cluster_lock(&self, name: &str) {
        let lock = ObjectRef::new(name);
        if self.cluster_locks.get(&lock).is_some() {
            // Closed only when the controller has stopped.
            let _ = self.cluster_lock_triggers.unbounded_send(lock);
        }
    }

    fn trigger_lock(&self, lock: ObjectRef<Lock>) {
        let scope = if self.namespaces.is_empty() {
            Some(0)
        } else {
            self.namespaces.iter().position(|n| Some(n) == lock.namespace.as_ref())
        };
        let Some(scope) = scope else { return };
        if self.locks.get(scope).is_some_and(|store| store.get(&lock).is_some()) {
            if let Some(triggers) = self.lock_triggers.get(scope) {
                // Closed only when the controller has stopped.
                let _ = triggers.unbounded_send(lock);
            }
        }
    }

    /// The claims of lock `name` in `namespace` (alone or with other locks), as the claim
    /// watch last delivered them: those the registry counts in it (see `Registry::claims_of_lock`).
    fn claims_of_lock(&self, namespace: &str, name: &str) -> Vec<Arc<KeptClaim>> {
        let path = self.lock_path(namespace, name);
        self.registry
            .claims_of_lock(&path)
            .into_iter()
            .filter_map(|(namespace, claim)| self.claim(&namespace, &claim))
            .filter(|c| c.spec.names_lock(name))
            .collect()
    }

    /// Claim `name` of `namespace` as its scope's watch last delivered it.
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<KeptClaim>> {
        let object = ObjectRef::new(name).within(namespace);
        self.scope_of(&object).and_then(|scope| self.claims.get(scope)).and_then(|store| store.get(&object))
    }

    /// Whether the first re-anchoring is done.
    fn anchored(&self) -> bool {
        self.anchored.load(Ordering::SeqCst)
    }

    /// Whether claim `uid` may be reconciled now: every claim once the term's first
    /// re-anchoring is done; while it runs, a claim the pass has re-anchored every lock of (and
    /// admitted them: see `anchor::reanchor_all`). Others are reconciled when it is over.
    fn serves(&self, uid: &str) -> bool {
        if self.anchored() {
            return true;
        }
        self.reanchoring.load(Ordering::SeqCst)
            && self
                .registry
                .lock_paths(uid)
                .is_some_and(|locks| !locks.is_empty() && self.engine.admitting_in(locks.iter().map(|lock| &**lock)))
    }

    /// [`Context::serves`] for a reconcile of `claim`: one turned away that asks for something
    /// (see `anchor::asks`: deleted, new, revoked) is noted first, so that the pass, when it
    /// admits the claim's locks, asks for it again (noted after the check, it could miss an
    /// admission made in between). The others wait for the walk after the pass: at a term's
    /// start every claim's reconcile comes once, and they would all stand in the queue again.
    fn serves_reconcile(&self, uid: &Uid, claim: &KeptClaim) -> bool {
        if self.anchored() {
            return true;
        }
        // A holder whose pod may be gone asks for its release: served as soon as its locks are,
        // not after the walk (which takes Held claims last).
        let asks = anchor::asks(claim, anchor::recorded_phase(self, claim)) || self.holder_may_be_gone(claim);
        if asks {
            self.deferred.lock().insert(uid.clone());
        }
        let serves = self.serves(uid);
        if serves && asks {
            self.deferred.lock().remove(uid);
        }
        serves
    }

    /// Whether `claim` names a holder pod that may be gone (see `HolderPods::may_be_gone`).
    pub(super) fn holder_may_be_gone(&self, claim: &KeptClaim) -> bool {
        let (Some(holder), Some(namespace)) = (claim.spec.holder.as_ref(), claim.metadata.namespace.as_deref()) else {
            return false;
        };
        self.holder_pods.may_be_gone(namespace, &holder.pod_name, claim.holder_uid())
    }

    /// Asks again for the reconciles turned away (see [`Context::serves_reconcile`]) of claims
    /// served now: called by the pass each time it admits a lock.
    fn serve_deferred(&self) {
        let served: Vec<Uid> = {
            let mut deferred = self.deferred.lock();
            let served: Vec<Uid> = deferred.iter().filter(|uid| self.serves(uid)).cloned().collect();
            for uid in &served {
                deferred.remove(uid);
            }
            served
        };
        if !served.is_empty() {
            tracing::debug!(claims = served.len(), "claims that asked meanwhile: their locks are re-anchored");
        }
        for uid in served {
            self.trigger(&uid);
        }
    }

    fn orphan(&self, uid: &str) {
        // Closed only when the controller has stopped.
        let _ = self.orphans.send(self.shared_uid(parts::claim_of(uid)));
    }

    async fn wait_synced(&self) {
        // The sender lives in this context, so the channel cannot close while it is awaited.
        let _ = self.unsynced.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Once every scope has listed its claims (from then on, a claim missing from the stores is
    /// missing from the API): every claim the registry or the engine knows
    /// that no store has any more is looked at by the orphan release (deleted while the
    /// operator started, re-anchored, or while a watch was down).
    fn sweep(&self) {
        if *self.unsynced.borrow() != 0 {
            return;
        }
        let mut known = self.registry.all();
        known.extend(self.engine.ids().iter().map(|id| parts::claim_of(id).to_string()));
        for uid in known {
            if !self.is_served(&uid) {
                self.orphan(&uid);
            }
        }
    }

    /// The APIs of the claims served, for requests: one per watched namespace, or one for all.
    fn scoped<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(&self) -> Vec<Api<K>> {
        Self::scopes_of(&self.client, &self.namespaces)
    }

    /// The same APIs, for watches.
    fn watched<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(&self) -> Vec<Api<K>> {
        Self::scopes_of(&self.watch_client, &self.namespaces)
    }

    fn scopes_of<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(
        client: &kube::Client,
        namespaces: &[String],
    ) -> Vec<Api<K>> {
        if namespaces.is_empty() {
            vec![Api::all(client.clone())]
        } else {
            namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
        }
    }
}

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
    let scopes = namespaces.len().max(1);
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
        triggers.push(Triggers { one });
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
    let ctx = Arc::new(Context {
        client,
        watch_client,
        engine,
        layout,
        namespaces,
        registry: Registry::default(),
        metrics,
        events,
        default_ttl,
        claims,
        triggers,
        pod_triggers,
        holder_pods: holders::HolderPods::new(holder_stores),
        locks,
        lock_triggers,
        lock_refreshes: throttle::Throttle::new(locks::STATUS_WINDOW, locks::STATUS_SPACING, locks::STATUS_INTERVAL),
        cluster_locks: cluster_lock_reader.clone(),
        cluster_lock_triggers,
        cluster_lock_refreshes: throttle::Throttle::new(
            locks::STATUS_WINDOW,
            locks::STATUS_SPACING,
            locks::STATUS_INTERVAL,
        ),
        arrivals: Default::default(),
        orphans,
        unsynced: channel::Sender::new(2 * scopes + 1),
        anchored: AtomicBool::new(false),
        reanchoring: AtomicBool::new(false),
        deferred: Default::default(),
        walks,
        paced: Default::default(),
        leadership,
        fence: epoch_param.clone().zip(engine_epoch).map(|(param, mine)| api_fence::Fence::new(param, mine)),
        token_floor,
    });

    // Scrapes read this term's waiters (the term's end lets go of them: see operator.rs).
    ctx.metrics.waiters.follow(ctx.claims.clone());
    let shutdown = shutdown.shared();
    // The API server refuses every status write of earlier terms before a single claim is
    // listed: whatever such a write changed before is in the list this term plans from.
    if let Some(fence) = &ctx.fence {
        ctx.leadership.time_left().ok_or(Error::NotLeading)?;
        let scopes = ctx.scoped::<crate::api::LockClaim>();
        tokio::select! {
            raised = api_fence::raise(&ctx.client, fence, &scopes, &ctx.engine) => raised?,
            _ = shutdown.clone() => return Ok(()),
        }
    }
    // A term plans from a state no older than its start, though its store was filled while it
    // stood by (see `feed`).
    if let Some(epoch) = ctx.epoch() {
        tokio::select! {
            synced = feeds.sync(epoch, &ctx.leadership) => synced?,
            _ = shutdown.clone() => return Ok(()),
        }
    }
    // Only now: every earlier term's write is in the stores, and so in the replay each claim's
    // first copy in this term's registry comes from (see `feed::ClaimFeeds::subscribe`).
    let subscribed = feeds.subscribe();
    // Ended when dropped: when this future ends, or is dropped by a deposed leader (which
    // aborts the reconciles in flight with their controller).
    let mut controllers = JoinSet::new();
    let apis = ctx.watched::<holders::HolderPod>().into_iter().zip(ctx.watched()).zip(holder_writers);
    for (((reader, one_rx, pod_rx), events), ((pod_api, gated_api), holder_writer)) in
        scoped.into_iter().zip(subscribed).zip(apis)
    {
        let pods_ctx = ctx.clone();
        let holder_pods = holders::watch(ctx.clone(), pod_api, holder_writer);
        let controller = Controller::for_shared_stream(watch::claims(ctx.clone(), events), reader)
            .watches_stream(holder_pods, move |pod| watch::claims_of_pod(&pods_ctx, &pod))
            .reconcile_on(one_rx)
            .with_config(Config::default().concurrency(concurrency.max(1)))
            .graceful_shutdown_on(shutdown.clone())
            .run(reconcile_claim, error_policy, ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(controller);
        let (gated_reader, gated_writer) = reflector::store();
        let gated = Controller::for_stream(gated::pods(ctx.clone(), gated_api, gated_writer), gated_reader)
            .reconcile_on(pod_rx)
            .with_config(Config::default().concurrency(concurrency.max(1)))
            .graceful_shutdown_on(shutdown.clone())
            .run(gated::reconcile, gated::error_policy, ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(gated);
    }
    for (scope, ((writer, reader, lock_rx), api)) in lock_scoped.into_iter().zip(ctx.watched::<Lock>()).enumerate() {
        let controller = Controller::for_stream(locks::objects(ctx.clone(), scope, api, writer), reader)
            .reconcile_on(lock_rx)
            .graceful_shutdown_on(shutdown.clone())
            .run(locks::reconcile, locks::error_policy, ctx.clone())
            .for_each(|result| async move { report(result) });
        controllers.spawn(controller);
    }
    let api: Api<ClusterLock> = Api::all(ctx.watch_client.clone());
    let controller =
        Controller::for_stream(cluster_locks::objects(ctx.clone(), api, cluster_lock_writer), cluster_lock_reader)
            .reconcile_on(cluster_lock_rx)
            .graceful_shutdown_on(shutdown.clone())
            .run(cluster_locks::reconcile, cluster_locks::error_policy, ctx.clone())
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

async fn reconcile_claim(claim: Arc<KeptClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let uid = ctx.shared_uid(claim.metadata.uid.as_deref().ok_or(Error::Malformed("a uid"))?);
    if !ctx.serves_reconcile(&uid, &claim) {
        // Its locks are re-anchored first; every claim is reconciled when that is done. A walk
        // under way does not wait for it.
        tracing::trace!(
            claim = claim.metadata.name.as_deref().unwrap_or_default(),
            "waits for its locks to be re-anchored"
        );
        ctx.paced.reconciled(&uid);
        return Ok(Action::await_change());
    }
    let span = tracing::info_span!(
        "reconcile",
        claim = claim.metadata.name.as_deref().unwrap_or_default(),
        namespace = claim.metadata.namespace.as_deref().unwrap_or_default(),
    );
    ctx.metrics.reconciles_running.inc();
    let running = Running(&ctx.metrics.reconciles_running);
    let result = reconcile::reconcile(uid.clone(), claim.clone(), ctx.clone()).instrument(span).await;
    drop(running);
    ctx.paced.reconciled(&uid);
    if !ctx.is_served(&uid) {
        // Gone while it was reconciled (a node it was just given would outlive it): look again.
        ctx.orphan(&uid);
    }
    result
}

/// Counts a reconcile as running until it ends, also when it is aborted (a deposed leader's
/// controller is dropped with its reconciles in flight; the gauge outlives it).
struct Running<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn error_policy(claim: Arc<KeptClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_errors.get_or_create(&crate::metrics::ErrorLabel { error: error.metric_label() }).inc();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    match error {
        // Routine: the copy planned from was older than the claim.
        Error::StatusRefused(_) | Error::OutdatedCopy => {
            tracing::debug!(claim = name, %error, "reconcile met a newer claim")
        }
        _ => tracing::warn!(claim = name, %error, "reconcile failed"),
    }
    error.retry_after().map_or_else(Action::await_change, Action::requeue)
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
