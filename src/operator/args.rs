//! `zklock run`'s flags (and their environment variables), beside the options they make.

use std::time::Duration;

use crate::zk::ZkConfig;

#[derive(clap::Args)]
pub struct RunArgs {
    /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
    #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
    zk_connect: String,
    /// Root of zklock's tree; locks live at <root>/locks/<namespace>/<lockName>
    #[arg(long, env = "ZKLOCK_ZK_ROOT", default_value = "/zklock", value_parser = crate::zk::Layout::new)]
    zk_root: crate::zk::Layout,
    /// Root every cluster that shares ClusterLocks names alike (e.g. /zklock-shared): their
    /// queues live at <root>/locks/<name>. Without it, ClusterLocks are shared by this cluster's
    /// namespaces only, under <zk-root>/cluster-locks. Needs --cluster-name
    #[arg(long, env = "ZKLOCK_ZK_CLUSTER_ROOT", requires = "cluster_name")]
    zk_cluster_root: Option<String>,
    /// This cluster's name among the clusters sharing --zk-cluster-root (a DNS label such as
    /// eu-1): unique among them, and shown in the waitingFor of the other clusters' claims
    #[arg(long, env = "ZKLOCK_CLUSTER_NAME", requires = "zk_cluster_root")]
    cluster_name: Option<String>,
    /// Session timeout to ask ZooKeeper for (e.g. 10s, 4000ms)
    #[arg(long, env = "ZKLOCK_ZK_SESSION_TIMEOUT", default_value = "10s", value_parser = crate::durations::parse_duration)]
    zk_session_timeout: Duration,
    /// Digest credentials: digest:USER:PASS. The operator's nodes then get the ACL "zklock all,
    /// world read"; who else may contend in lock directories is --zk-contenders
    #[arg(long, env = "ZKLOCK_ZK_AUTH", conflicts_with_all = ["zk_auth_file", "zk_auth_secret"], value_parser = parse_digest)]
    zk_auth: Option<String>,
    /// File holding digest:USER:PASS (e.g. a mounted Secret)
    #[arg(long, env = "ZKLOCK_ZK_AUTH_FILE", conflicts_with = "zk_auth_secret")]
    zk_auth_file: Option<std::path::PathBuf>,
    /// Secret, in the lease namespace, holding the operator's credentials (key `operator`) and
    /// the listed contenders' (key `contender`), both digest:USER:PASS; the operator makes it,
    /// with random credentials, when it is missing, and never replaces it (GitOps renders hold no
    /// secret). Needs get and create on Secrets there
    #[arg(long, env = "ZKLOCK_ZK_AUTH_SECRET", value_parser = object_name)]
    zk_auth_secret: Option<String>,
    /// Earlier credentials of the operator (digest:USER:PASS), while they are rotated out: the
    /// operator authenticates with them too and names them in every ACL it writes beside
    /// --zk-auth, and takes over every node made under them. Drop them once every replica runs
    /// with the new --zk-auth (docs/operations.md: rotating ZooKeeper credentials)
    #[arg(long, env = "ZKLOCK_ZK_PREVIOUS_AUTH", value_delimiter = ',', value_parser = parse_digest)]
    zk_previous_auth: Vec<String>,
    /// File holding earlier credentials digest:USER:PASS (e.g. a key of the mounted Secret)
    #[arg(long, env = "ZKLOCK_ZK_PREVIOUS_AUTH_FILE")]
    zk_previous_auth_file: Option<std::path::PathBuf>,
    /// Which other ZooKeeper clients may make and delete nodes in lock directories (Curator's
    /// and kazoo's recipes do): `anyone` (open, as ZooKeeper's recipes expect), or `listed`: only
    /// those that authenticate with a --zk-contender-auth-file credential; every other client may
    /// only read. `listed` needs --zk-auth (ZooKeeper checks a delete against the directory, so
    /// whoever may contend may also delete zklock's nodes)
    #[arg(long, env = "ZKLOCK_ZK_CONTENDERS", default_value = "anyone", value_parser = ["anyone", "listed"])]
    zk_contenders: String,
    /// File holding digest:USER:PASS of clients that may contend beside zklock (repeat the flag;
    /// comma-separated in the env var); their identity is computed from it
    #[arg(long, env = "ZKLOCK_ZK_CONTENDER_AUTH_FILE", value_delimiter = ',')]
    zk_contender_auth_file: Vec<std::path::PathBuf>,
    /// CA bundle (PEM) to verify the ensemble's TLS certificates; turns TLS on
    #[arg(long, env = "ZKLOCK_ZK_TLS_CA")]
    zk_tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for TLS client authentication
    #[arg(long, env = "ZKLOCK_ZK_TLS_CERT", requires = "zk_tls_key", requires = "zk_tls_ca")]
    zk_tls_cert: Option<std::path::PathBuf>,
    /// Client key (PEM) for TLS client authentication
    #[arg(long, env = "ZKLOCK_ZK_TLS_KEY", requires = "zk_tls_cert")]
    zk_tls_key: Option<std::path::PathBuf>,
    /// Address of /metrics, /healthz and /readyz
    #[arg(long, env = "ZKLOCK_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    /// Serve only these namespaces (repeat the flag; comma-separated in the env var). Default: all
    #[arg(long, env = "ZKLOCK_WATCH_NAMESPACE", value_delimiter = ',')]
    watch_namespace: Vec<String>,
    /// Namespace of the leader-election Lease (default: the client's namespace)
    #[arg(long, env = "ZKLOCK_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Name of the leader-election Lease: every replica of one installation elects on the same,
    /// two installations in one namespace on names of their own
    #[arg(long, env = "ZKLOCK_LEASE_NAME", default_value = super::LEASE_NAME, value_parser = object_name)]
    lease_name: String,
    /// Run without leader election (one replica only!)
    #[arg(long, env = "ZKLOCK_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Name of the ConfigMap, in the lease namespace, that holds the leader epoch in force: the
    /// parameter of the admission policy zklock-leader-epoch (the chart installs both), which
    /// refuses status writes of a deposed leader that arrive late
    #[arg(long, env = "ZKLOCK_EPOCH_PARAM", default_value = crate::api::epoch_policy::EPOCH_PARAM)]
    epoch_param: String,
    /// Run without that admission policy (clusters before Kubernetes 1.30, or where it cannot
    /// be installed). A status write of a deposed leader that arrives late can then land, until
    /// the new leader has written that claim (the docs say what that means)
    #[arg(long, env = "ZKLOCK_NO_EPOCH_POLICY")]
    no_epoch_policy: bool,
    /// Name of the ConfigMaps that list the holds in force of locks whose fencing is Enforced:
    /// the parameters of the fencing admission policies (the chart installs both). One in each
    /// namespace with such Locks, and <NAME>-cluster-locks in the lease namespace for ClusterLocks
    #[arg(long, env = "ZKLOCK_FENCING_PARAM", default_value = crate::api::fencing_policy::FENCING_PARAM, value_parser = object_name)]
    fencing_param: String,
    /// Claims reconciled at once. Bounds the operator's concurrent API requests (and so its
    /// connections and memory) during bursts; handoffs are never queued behind more than this
    #[arg(long, env = "ZKLOCK_MAX_CONCURRENT_RECONCILES", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    max_concurrent_reconciles: u16,
    /// How often every claim is reconciled again, in batches of --max-concurrent-reconciles, as a
    /// safety net against an event that never came. A claim unchanged since is not written
    #[arg(long, env = "ZKLOCK_RESYNC_PERIOD", default_value = "5m", value_parser = crate::durations::parse_duration)]
    resync_period: Duration,
    /// Delete final claims that set no spec.ttlSecondsAfterFinished this many seconds after they
    /// finished. Claims with an owner (those made for gated pods) are left to the garbage
    /// collector. Default: kept
    #[arg(long, env = "ZKLOCK_DEFAULT_TTL_SECONDS_AFTER_FINISHED", value_parser = clap::value_parser!(u32).range(0..=31_536_000))]
    default_ttl_seconds_after_finished: Option<u32>,
    /// Bring zklock's CRDs to this version at start (server-side apply; a CRD of a later
    /// revision is left alone). Helm never upgrades a chart's crds/: this does
    #[arg(long, env = "ZKLOCK_MANAGE_CRDS", default_value_t = true, action = clap::ArgAction::Set)]
    manage_crds: bool,
    /// Log format
    #[arg(long, env = "ZKLOCK_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

impl RunArgs {
    /// The operator's options, with the files the flags name read.
    pub fn into_options(self) -> Result<super::Options, String> {
        let mut zk = ZkConfig::new(self.zk_connect).with_session_timeout(self.zk_session_timeout);
        zk.detached = true;
        zk.digest_auth = match (self.zk_auth, self.zk_auth_file) {
            (Some(auth), _) => Some(auth),
            (None, Some(file)) => {
                Some(parse_digest(&read(&file, "--zk-auth-file")?).map_err(|e| format!("{}: {e}", file.display()))?)
            }
            (None, None) => None,
        };
        zk.previous_auth = self.zk_previous_auth;
        if let Some(file) = &self.zk_previous_auth_file {
            let previous = read(file, "--zk-previous-auth-file")?;
            // An empty key: no rotation under way (the chart mounts the key either way).
            if !previous.trim().is_empty() {
                zk.previous_auth.push(parse_digest(&previous).map_err(|e| format!("{}: {e}", file.display()))?);
            }
        }
        let has_auth = zk.digest_auth.is_some() || self.zk_auth_secret.is_some();
        if !zk.previous_auth.is_empty() && !has_auth {
            return Err(
                "--zk-previous-auth needs --zk-auth, --zk-auth-file or --zk-auth-secret: the credentials rotated to"
                    .into(),
            );
        }
        zk.contenders = match self.zk_contenders.as_str() {
            "listed" if !has_auth => {
                return Err(
                    "--zk-contenders listed needs --zk-auth, --zk-auth-file or --zk-auth-secret: without credentials \
                            ZooKeeper has no identity to keep lock directories for"
                        .into(),
                );
            }
            "listed" => crate::zk::Contenders::Listed(
                self.zk_contender_auth_file
                    .iter()
                    .filter(|f| !f.as_os_str().is_empty())
                    .map(|file| {
                        parse_digest(&read(file, "--zk-contender-auth-file")?)
                            .map_err(|e| format!("{}: {e}", file.display()))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            _ if self.zk_contender_auth_file.iter().any(|f| !f.as_os_str().is_empty()) => {
                return Err("--zk-contender-auth-file names who may contend when lock directories are closed: \
                            give --zk-contenders listed with it"
                    .into());
            }
            _ => crate::zk::Contenders::Anyone,
        };
        if let Some(ca) = &self.zk_tls_ca {
            let identity = match (&self.zk_tls_cert, &self.zk_tls_key) {
                (Some(cert), Some(key)) => Some((read(cert, "--zk-tls-cert")?, read(key, "--zk-tls-key")?)),
                _ => None,
            };
            zk.tls = Some(crate::zk::TlsPem { ca: read(ca, "--zk-tls-ca")?, identity });
        }
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| format!("zklock-{}", std::process::id()));
        let layout = match (&self.zk_cluster_root, &self.cluster_name) {
            (Some(shared), Some(cluster)) => {
                let layout = self.zk_root.with_shared_root(shared, cluster)?;
                if zk.session_timeout <= crate::leader::LEASE_DURATION + Duration::from_secs(5) {
                    tracing::warn!(
                        session_timeout = ?zk.session_timeout,
                        "with a shared root, a leader that crashes keeps its ClusterLocks' places only while its \
                         ZooKeeper session outlasts the takeover (the lease's {:?} and a re-anchoring): give \
                         --zk-session-timeout 30s (and a server maxSessionTimeout that allows it)",
                        crate::leader::LEASE_DURATION
                    );
                }
                layout
            }
            _ => self.zk_root,
        };
        Ok(super::Options {
            zk,
            layout,
            metrics_addr: self.metrics_addr,
            namespaces: self.watch_namespace.into_iter().filter(|n| !n.is_empty()).collect(),
            lease_namespace: self.lease_namespace,
            lease_name: self.lease_name,
            leader_election: !self.no_leader_election,
            epoch_param: (!self.no_leader_election && !self.no_epoch_policy).then_some(self.epoch_param),
            fencing_param: self.fencing_param,
            concurrency: self.max_concurrent_reconciles,
            resync_period: self.resync_period,
            default_ttl: self.default_ttl_seconds_after_finished.map(|s| Duration::from_secs(s.into())),
            manage_crds: self.manage_crds,
            credentials_secret: self.zk_auth_secret,
            identity,
        })
    }
}

fn object_name(s: &str) -> Result<String, String> {
    crate::api::is_dns_subdomain(s)
        .then(|| s.to_string())
        .ok_or_else(|| format!("{s:?} is no object name (lower-case letters, digits, '-' and '.')"))
}

pub(super) fn parse_digest(s: &str) -> Result<String, String> {
    match s.trim().strip_prefix("digest:") {
        Some(cred) if cred.split_once(':').is_some_and(|(u, p)| !u.is_empty() && !p.is_empty()) => Ok(cred.to_string()),
        _ => Err("expected digest:USER:PASS".into()),
    }
}

fn read(path: &std::path::Path, what: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}
