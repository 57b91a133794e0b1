//! `zklock run`: the operator process. Serves probes and metrics, waits for leadership (unless
//! leader election is off), then holds a ZooKeeper session and runs the controller until
//! leadership is lost or SIGTERM arrives.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::http::{self, Health};
use crate::leader::LeaseLock;
use crate::metrics::Metrics;
use crate::zk::{LockEngine, ZkConfig};

/// Name of the Lease the replicas elect a leader on.
pub const LEASE_NAME: &str = "zklock-leader";

pub struct Options {
    pub zk: ZkConfig,
    pub zk_root: String,
    pub metrics_addr: SocketAddr,
    pub namespaces: Vec<String>,
    pub lease_namespace: Option<String>,
    pub leader_election: bool,
    /// Claims reconciled at once.
    pub concurrency: u16,
    pub identity: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no Kubernetes API: {0} (set KUBECONFIG, or run in a cluster)")]
    Kube(String),
    #[error("{0}")]
    ZooKeeper(#[from] crate::zk::Error),
    #[error("cannot serve metrics on {addr}: {source} (choose another --metrics-addr)")]
    Metrics { addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Controller(#[from] crate::controller::Error),
}

pub async fn run(options: Options, shutdown: CancellationToken) -> Result<(), RunError> {
    let client = crate::audit::client().await.map_err(RunError::Kube)?;
    // Fail at once, with a message that says what to fix, if ZooKeeper cannot be reached.
    ensure_chroot(&options.zk).await?;
    drop(options.zk.connect().await?);

    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    health.ready.store(true, Ordering::SeqCst);
    let current_engine: Arc<Mutex<Option<LockEngine>>> = Arc::default();
    let stats_source = current_engine.clone();
    let engine_stats = Arc::new(move || stats_source.lock().ok().and_then(|e| e.as_ref().map(|e| e.stats())));
    let (addr, _server) = http::serve(options.metrics_addr, metrics.clone(), health.clone(), engine_stats)
        .await
        .map_err(|source| RunError::Metrics { addr: options.metrics_addr, source })?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");

    let lease_namespace = options.lease_namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    let mut lease =
        LeaseLock::new(Api::<Lease>::namespaced(client.clone(), &lease_namespace), LEASE_NAME, &options.identity);

    while !shutdown.is_cancelled() {
        if options.leader_election {
            tracing::info!(identity = %options.identity, lease = %format!("{lease_namespace}/{LEASE_NAME}"), "waiting to lead");
            tokio::select! {
                _ = lease.acquire() => {}
                _ = shutdown.cancelled() => break,
            }
        }
        tracing::info!(identity = %options.identity, "leading");
        metrics.leader.set(1);
        health.ready.store(false, Ordering::SeqCst);
        let (engine, events) = match LockEngine::connect_with_events(options.zk.clone()).await {
            Ok(connected) => connected,
            Err(e) => {
                tracing::error!(error = %e, "cannot open a ZooKeeper session; retrying");
                metrics.leader.set(0);
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        *current_engine.lock().unwrap_or_else(|p| p.into_inner()) = Some(engine.clone());
        let stop = shutdown.child_token();
        let setup = crate::controller::Setup {
            client: client.clone(),
            zk_root: options.zk_root.clone(),
            namespaces: options.namespaces.clone(),
            metrics: metrics.clone(),
            events: crate::controller::events::EventWriter::new(client.clone(), &options.identity),
            ready: health.ready.clone(),
            concurrency: options.concurrency,
        };
        let controller = crate::controller::run(setup, engine, events, stop.clone().cancelled_owned());
        tokio::pin!(controller);
        let result = if options.leader_election {
            tokio::select! {
                result = &mut controller => result,
                _ = lease.hold() => {
                    // Lost the lease: stop writing at once, before anybody else can lead.
                    stop.cancel();
                    controller.await
                }
            }
        } else {
            controller.await
        };
        *current_engine.lock().unwrap_or_else(|p| p.into_inner()) = None;
        metrics.leader.set(0);
        health.ready.store(true, Ordering::SeqCst);
        if let Err(e) = result {
            tracing::error!(error = %e, "controller stopped");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    if options.leader_election {
        if let Err(e) = lease.release().await {
            tracing::warn!(error = %e, "could not give the lease up; the next leader waits for it to expire");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// With a chroot in the connect string, the chroot node must exist before a chrooted client can
/// create anything; make it (and its parents) with a client without the chroot.
async fn ensure_chroot(config: &ZkConfig) -> Result<(), crate::zk::Error> {
    let Some(slash) = config.connect.find('/') else { return Ok(()) };
    let chroot = &config.connect[slash..];
    if chroot == "/" {
        return Ok(());
    }
    let mut plain = config.clone();
    plain.connect = config.connect[..slash].to_string();
    plain.detached = false;
    let client = plain.connect().await?;
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    client.mkdir(chroot, &options).await.map_err(|source| crate::zk::Error::ZooKeeper {
        op: "mkdir",
        path: chroot.to_string(),
        source,
    })
}
