//! The operator: a kube-runtime controller over LockClaims, driven also by the lock engine's
//! state changes and by holder pods.
//!
//! Reconcile is a pipeline (see `reconcile`): dereference (the claim's holder pod and its
//! contender in the engine) → validate (pure, `api::validate`) → plan (pure, `plan`) → apply
//! (enqueue, znode writes, pod annotation, status, release) → events.

pub mod anchor;
mod background;
pub mod events;
pub mod plan;
mod reconcile;
pub mod registry;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;

use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::mpsc;

use crate::api::LockClaim;
use crate::metrics::Metrics;
use crate::zk::LockEngine;
pub use registry::Registry;

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
}

impl Error {
    /// A short label for the reconcile error metric.
    pub fn metric_label(&self) -> String {
        match self {
            Error::Kube(_) => "kubernetes".into(),
            Error::ZooKeeper(e) => format!("zookeeper_{}", e.kind()),
            Error::Finalizer(_) => "finalizer".into(),
            Error::Malformed(_) => "malformed".into(),
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
    /// False until the session is re-anchored: nothing new is enqueued before.
    admitting: AtomicBool,
    /// One trigger channel per controller: per watched namespace, or one for all (`None`).
    triggers: Vec<(Option<String>, mpsc::UnboundedSender<ObjectRef<LockClaim>>)>,
}

impl Context {
    pub fn lock_path(&self, namespace: &str, lock_name: &str) -> String {
        format!("{}/locks/{namespace}/{lock_name}", self.zk_root.trim_end_matches('/'))
    }

    pub fn admitting(&self) -> bool {
        self.admitting.load(Ordering::SeqCst)
    }

    pub fn set_admitting(&self, on: bool) {
        self.admitting.store(on, Ordering::SeqCst);
    }

    /// Asks the controller to reconcile a claim soon.
    pub fn trigger(&self, object: ObjectRef<LockClaim>) {
        let target = self.triggers.iter().find(|(ns, _)| ns.is_none() || *ns == object.namespace);
        if let Some((_, tx)) = target {
            // The receiver lives as long as the controller; after it, nothing needs reconciling.
            let _ = tx.send(object);
        }
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
    /// Claims reconciled at once (per controller).
    pub concurrency: u16,
}

/// Runs the controller until `shutdown` completes. The engine must hold a fresh session;
/// re-anchoring runs first, and again after every session loss.
pub async fn run(
    setup: Setup,
    engine: LockEngine,
    engine_events: mpsc::UnboundedReceiver<crate::zk::EngineEvent>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let Setup { client, zk_root, namespaces, metrics, events, ready, concurrency } = setup;
    // One controller per watched namespace (each with its own cache), or one for all.
    let scopes: Vec<Option<String>> =
        if namespaces.is_empty() { vec![None] } else { namespaces.iter().cloned().map(Some).collect() };
    let (triggers, receivers): (Vec<_>, Vec<_>) = scopes
        .iter()
        .map(|ns| {
            let (tx, rx) = mpsc::unbounded_channel();
            ((ns.clone(), tx), rx)
        })
        .unzip();
    let ctx = Arc::new(Context {
        client,
        engine,
        zk_root,
        namespaces,
        registry: Registry::default(),
        metrics,
        events,
        admitting: AtomicBool::new(false),
        triggers,
    });
    anchor::reanchor_all(&ctx).await?;
    ready.store(true, Ordering::SeqCst);

    let background = background::spawn(ctx.clone(), engine_events);
    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let controllers = ctx.claim_apis().into_iter().zip(receivers).map(|(api, rx)| {
        let (reader, writer) = reflector::store();
        let seen = ctx.clone();
        // The claim watch delivers new claims in creation order: note it before reconciling.
        // The cache keeps every claim: drop what the operator never reads (managed fields, the
        // last-applied copy kubectl keeps) so that it costs little per claim.
        let slim = watcher::watcher(api, watcher::Config::default()).modify(|claim: &mut LockClaim| {
            claim.metadata.managed_fields = None;
            if let Some(a) = claim.metadata.annotations.as_mut() {
                a.remove("kubectl.kubernetes.io/last-applied-configuration");
            }
        });
        let claims = reflector(writer, slim).applied_objects().inspect_ok(move |claim: &LockClaim| {
            if let Some(uid) = claim.metadata.uid.as_deref() {
                let phase = claim.status.as_ref().and_then(|s| s.phase);
                let pending = matches!(phase, None | Some(crate::api::Phase::Pending));
                let lock = claim.metadata.namespace.as_deref().map(|ns| seen.lock_path(ns, &claim.spec.lock_name));
                let created = claim.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
                seen.registry.first_seen(uid, &ObjectRef::from_obj(claim), lock.as_deref(), created, pending);
            }
        });
        Controller::for_stream(claims, reader)
            .with_config(controller::Config::default().concurrency(concurrency))
            .reconcile_on(stream_of(rx))
            .graceful_shutdown_on(shutdown.clone())
            .run(reconcile::reconcile, error_policy, ctx.clone())
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "reconcile failed");
                }
            })
    });
    futures::future::join_all(controllers).await;
    ready.store(false, Ordering::SeqCst);
    for task in background {
        task.abort();
    }
    Ok(())
}

fn stream_of<T: Send + 'static>(mut rx: mpsc::UnboundedReceiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn error_policy(_claim: Arc<LockClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_errors.get_or_create(&crate::metrics::ErrorLabel { error: error.metric_label() }).inc();
    tracing::warn!(%error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}
