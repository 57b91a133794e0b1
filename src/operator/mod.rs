//! `zklock run`: the operator process. Serves probes and metrics, waits for leadership (unless
//! leader election is off), then holds a ZooKeeper session and runs the controller until
//! leadership is lost or SIGTERM arrives.

mod args;
pub mod crds;
pub mod credentials;

pub use args::RunArgs;

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
use crate::zk::{Installation, ZkConfig};

/// The default name of the Lease the replicas elect a leader on (`--lease-name`).
pub const LEASE_NAME: &str = "zklock-leader";

/// How long a replica that gave up a term it could not serve keeps out of the next election: a
/// standby asks for the lease every second (`leader::RETRY_PERIOD`) and takes it within that
/// time; with none, this replica tries again then.
const COOL_DOWN: Duration = Duration::from_secs(3);
/// How long a stop signal waits for the reconciles running then. Past it the term ends without
/// them, as a crash would end it (which the lock survives by design): a stop must end well
/// within the pod's `terminationGracePeriodSeconds` (30 s by default), with the root and the
/// lease given up after it, and a wait inside kube-runtime's graceful shutdown once held a
/// stopping operator, lease and all, for good.
const STOP_GRACE: Duration = Duration::from_secs(10);

pub struct Options {
    pub zk: ZkConfig,
    pub layout: crate::zk::Layout,
    pub metrics_addr: SocketAddr,
    pub namespaces: Vec<String>,
    pub lease_namespace: Option<String>,
    pub lease_name: String,
    pub leader_election: bool,
    /// The ConfigMap (in the lease namespace) holding the epoch the API server's admission policy
    /// enforces; `None`: no policy (no leader election, or run without it).
    pub epoch_param: Option<String>,
    /// The ConfigMaps holding fenced locks' holds in force (see `controller::fencing`): this name
    /// in each namespace with fenced `Lock`s, and `<name>-cluster-locks` in the lease namespace.
    pub fencing_param: String,
    /// Claims reconciled at once.
    pub concurrency: u16,
    /// How often every claim is looked at again (see `controller::pace`).
    pub resync_period: std::time::Duration,
    /// Time to live after finishing for claims that set none and have no owner.
    pub default_ttl: Option<std::time::Duration>,
    /// Bring zklock's CRDs to this version at start (see [`crds`]).
    pub manage_crds: bool,
    /// `--zk-auth-secret`: the ZooKeeper credentials are read from (or made into) this Secret in
    /// the lease namespace at start (see [`credentials`]).
    pub credentials_secret: Option<String>,
    pub identity: String,
}

impl Options {
    /// Takes `credentials` as the operator's own and, when contenders are listed, as theirs.
    pub fn with_credentials(mut self, credentials: credentials::Credentials) -> Self {
        self.zk.digest_auth = Some(credentials.operator);
        if let crate::zk::Contenders::Listed(listed) = &mut self.zk.contenders {
            if !listed.contains(&credentials.contender) {
                listed.push(credentials.contender);
            }
        }
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no Kubernetes API: {0} (set KUBECONFIG, or run in a cluster)")]
    Kube(String),
    #[error("{0}")]
    ZooKeeper(#[from] crate::zk::Error),
    #[error("ZooKeeper credentials: {0}")]
    Credentials(String),
    #[error("cannot serve metrics on {addr}: {source} (choose another --metrics-addr)")]
    Metrics { addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Controller(#[from] crate::controller::Error),
}

pub async fn run(options: Options, shutdown: CancellationToken) -> Result<(), RunError> {
    let metrics = Arc::new(Metrics::default());
    let clients = crate::client::clients(metrics.clone()).await.map_err(RunError::Kube)?;
    let client = clients.requests.clone();
    let lease_namespace = options.lease_namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    let options = match &options.credentials_secret {
        Some(name) => {
            let made =
                credentials::get_or_make(&client, &lease_namespace, name).await.map_err(RunError::Credentials)?;
            options.with_credentials(made)
        }
        None => options,
    };
    if options.manage_crds {
        crds::apply_and_report(&client).await;
    }
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

    let mut lease = LeaseLock::new(
        Api::<Lease>::namespaced(client.clone(), &lease_namespace),
        &options.lease_name,
        &options.identity,
    );

    // Listed and followed from now on, also while this replica stands by (see `feed`).
    let feeds = Arc::new(crate::controller::feed::ClaimFeeds::start(
        &clients.watches,
        &clients.requests,
        &options.namespaces,
        metrics.clone(),
    ));
    let listing = {
        let (feeds, readiness) = (feeds.clone(), health.readiness.clone());
        tokio::spawn(async move {
            feeds.listed().await;
            readiness.listed();
        })
    };
    let _listing = AbortOnDrop(listing);
    let mut fatal = None;
    while !shutdown.is_cancelled() {
        if options.leader_election {
            tracing::info!(identity = %options.identity, lease = %format!("{lease_namespace}/{}", options.lease_name), "waiting to lead");
            tokio::select! {
                _ = lease.acquire() => {}
                _ = shutdown.cancelled() => break,
            }
        }
        tracing::info!(identity = %options.identity, "leading");
        metrics.leader.set(1);
        let term = Term::begin(&health.readiness);
        let leadership = if options.leader_election { lease.leadership() } else { Leadership::always() };
        let epoch_param = options
            .epoch_param
            .as_ref()
            .map(|name| crate::controller::EpochParam { namespace: lease_namespace.clone(), name: name.clone() });
        // Who serves the root: every replica of this installation elects on one Lease (its UID);
        // an operator without leader election is one process, and stands for itself alone, so
        // that a second one beside it (a rollout that overlaps) waits instead of taking over.
        let installation = Installation {
            installation: match lease.uid().filter(|_| options.leader_election) {
                Some(uid) => format!("{lease_namespace}/{} (Lease {uid})", options.lease_name),
                None => format!("{lease_namespace}/{} (without leader election)", options.identity),
            },
            holder: options.identity.clone(),
        };
        let served = async {
            let token_floor = Arc::new(
                crate::controller::token_floor::TokenFloor::read(
                    &client,
                    &lease_namespace,
                    &crate::controller::token_floor::floor_configmap(&options.lease_name),
                )
                .await
                .map_err(Ended::Connect)?,
            );
            let (engine, events) =
                supervisor::connect(&options.zk, &options.layout, installation, &leadership, &token_floor)
                    .await
                    .map_err(Ended::Connect)?;
            metrics.engine.follow(Some(engine.clone()));
            let setup = crate::controller::Setup {
                client: client.clone(),
                watch_client: clients.watches.clone(),
                layout: options.layout.clone(),
                namespaces: options.namespaces.clone(),
                metrics: metrics.clone(),
                events: crate::controller::events::EventWriter::new(client.clone(), &options.identity),
                term: term.clone(),
                concurrency: options.concurrency,
                resync_period: options.resync_period,
                default_ttl: options.default_ttl,
                leadership: leadership.clone(),
                epoch_param,
                feeds: feeds.clone(),
                token_floor,
                fencing_param: crate::controller::FencingParam {
                    name: options.fencing_param.clone(),
                    namespace: lease_namespace.clone(),
                },
            };
            let mut fenced = engine.fenced();
            let serving = engine.clone();
            let controller = crate::controller::run(setup, engine, events, shutdown.clone().cancelled_owned());
            let grace_over = async {
                shutdown.cancelled().await;
                tokio::time::sleep(STOP_GRACE).await;
            };
            let ended = tokio::select! {
                result = controller => result.map_err(Ended::Controller),
                _ = grace_over => {
                    // How many claim reconciles were still running tells a reconcile that hangs
                    // from a controller that does not end without one.
                    let running = metrics.reconciles_running.get();
                    tracing::warn!(grace = ?STOP_GRACE, running, "the term did not end after the stop signal; stopping without it");
                    Ok(())
                }
                _ = fenced.wait_for(|f| *f) => {
                    tracing::warn!("stepped down: another leader took the leader epoch in ZooKeeper");
                    Ok(())
                }
            };
            if shutdown.is_cancelled() {
                // A graceful stop: the root goes at once, so that this installation's next
                // process need not wait for this session to end (the nodes stay until the next
                // leader re-anchors them).
                let _ = tokio::time::timeout(Duration::from_secs(2), serving.leave_root()).await;
            }
            ended
        };
        // The lease is renewed from the moment it is taken, also while the ZooKeeper session is
        // opened and the epoch taken (a slow connect must not outlast it). Deposed (the lease
        // lost or not renewed in time, or another leader's epoch in ZooKeeper): everything of
        // the term is dropped at once, with every reconcile and re-anchoring in flight, and the
        // engine with it; nothing is awaited that could write. A SIGTERM instead lets the
        // running reconciles finish, as the leader still.
        let holding = async {
            if options.leader_election {
                lease.hold().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            result = served => result,
            _ = holding => {
                tracing::warn!("stepped down: lost the lease");
                Ok(())
            }
        };
        lease.step_down();
        metrics.engine.follow(None);
        metrics.waiters.follow(vec![]);
        metrics.leader.set(0);
        term.end();
        match result {
            Ok(()) => {}
            Err(Ended::Controller(crate::controller::Error::TaskPanicked(why))) => {
                // A bug, not a condition to wait out: the process ends (its pod is restarted,
                // and the restarts show), rather than serve with part of its work undone.
                tracing::error!(%why, "a part of the controller died; stopping");
                health.readiness.fail();
                fatal = Some(RunError::Controller(crate::controller::Error::TaskPanicked(why)));
                break;
            }
            Err(e) => {
                // A term this replica could not serve (ZooKeeper out of its reach, an API fence
                // it cannot set up): the lease goes at once, and this replica keeps out of the
                // next election for a while, so that a standby that can serve takes over. Kept,
                // the lease was renewed for as long as the cause lasted, and every lock froze.
                let why = e.to_string();
                health.readiness.set_unable(Some(why.clone()));
                metrics.step_downs.inc();
                if options.leader_election {
                    tracing::error!(error = %why, pause = ?COOL_DOWN, "cannot serve as the leader; giving the lease up");
                    if let Err(e) = lease.release().await {
                        tracing::warn!(error = %e, "could not give the lease up; a standby takes it once it expires");
                    }
                } else {
                    tracing::error!(error = %why, pause = ?COOL_DOWN, "cannot serve; trying again after a pause");
                }
                tokio::select! {
                    _ = tokio::time::sleep(COOL_DOWN) => {}
                    _ = shutdown.cancelled() => break,
                }
                health.readiness.set_unable(None);
            }
        }
    }
    if options.leader_election {
        if let Err(e) = lease.release().await {
            tracing::warn!(error = %e, "could not give the lease up; the next leader waits for it to expire");
        }
    }
    tracing::info!("stopped");
    fatal.map_or(Ok(()), Err)
}

/// Ends a task when its owner ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a leader's term ended early.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("cannot open a ZooKeeper session and take the leader epoch: {0}")]
    Connect(crate::controller::Error),
    #[error("the controller stopped: {0}")]
    Controller(crate::controller::Error),
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
    // As the directories above lock directories: with credentials, only zklock may delete in it.
    let acls = config.parent_acls();
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::new(&acls));
    client.mkdir(chroot, &options).await.map_err(|source| crate::zk::Error::ZooKeeper {
        op: "mkdir",
        path: chroot.to_string(),
        source,
    })
}
