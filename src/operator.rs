//! `zklock run`: the operator process. Serves probes and metrics, waits for leadership (unless
//! leader election is off), then holds a ZooKeeper session and runs the controller until
//! leadership is lost or SIGTERM arrives.

use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::controller::supervisor::{self, Term};
use crate::http::{self, Health};
use crate::leader::{Leadership, LeaseLock};
use crate::metrics::Metrics;
use crate::zk::ZkConfig;

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
    /// Time to live after finishing for claims that set none and have no owner.
    pub default_ttl: Option<std::time::Duration>,
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
    let metrics = Arc::new(Metrics::default());
    let client = crate::client::client(metrics.clone()).await.map_err(RunError::Kube)?;
    // Fail at once, with a message that says what to fix, if ZooKeeper cannot be reached.
    ensure_chroot(&options.zk).await?;
    let mut probe = options.zk.clone();
    // A probe: its session is closed at once rather than left to time out.
    probe.detached = false;
    drop(probe.connect().await?);

    let health = Arc::new(Health::default());
    let (addr, _server) = http::serve(options.metrics_addr, metrics.clone(), health.clone())
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
        let term = Term::begin(&health.readiness);
        let leadership = if options.leader_election { lease.leadership() } else { Leadership::always() };
        let connected = supervisor::connect(&options.zk, &options.zk_root, &options.identity, &leadership).await;
        let (engine, events) = match connected {
            Ok(connected) => connected,
            Err(e) => {
                tracing::error!(error = %e, "cannot open a ZooKeeper session and take the leader epoch; retrying");
                metrics.leader.set(0);
                term.end();
                lease.step_down();
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        metrics.engine.follow(Some(engine.clone()));
        let setup = crate::controller::Setup {
            client: client.clone(),
            zk_root: options.zk_root.clone(),
            namespaces: options.namespaces.clone(),
            metrics: metrics.clone(),
            events: crate::controller::events::EventWriter::new(client.clone(), &options.identity),
            term: term.clone(),
            concurrency: options.concurrency,
            default_ttl: options.default_ttl,
            leadership: leadership.clone(),
        };
        let mut fenced = engine.fenced();
        let controller = crate::controller::run(setup, engine, events, shutdown.clone().cancelled_owned());
        tokio::pin!(controller);
        // Deposed (the lease lost or not renewed in time, or another leader's epoch in
        // ZooKeeper): the controller is dropped at once, with every reconcile and re-anchoring
        // in flight, and the engine with it; nothing is awaited that could write. A SIGTERM
        // instead lets the running reconciles finish, as the leader still.
        let holding = async {
            if options.leader_election {
                lease.hold().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            result = &mut controller => result,
            _ = holding => {
                tracing::warn!("stepped down: lost the lease");
                Ok(())
            }
            _ = fenced.wait_for(|f| *f) => {
                tracing::warn!("stepped down: another leader took the leader epoch in ZooKeeper");
                Ok(())
            }
        };
        lease.step_down();
        metrics.engine.follow(None);
        metrics.leader.set(0);
        term.end();
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
