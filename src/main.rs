#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use zklock::zk::{LockEngine, ZkConfig};

/// Shown under `zklock --help`: the commands people type most.
const EXAMPLES: &str = "Examples:
  zklock exec deploy-production --timeout 30m -- ./deploy.sh   run a command while holding a lock
  zklock acquire db-migrations --env-file /shared/lock.env      wait for a lock (an init container)
  zklock queue --zk-connect zk:2181 /zklock/locks/shop/db-migrations
  zklock run --zk-connect zk:2181                               the operator (the chart runs it)

Docs: docs/getting-started.md, docs/user-guide.md (claims, the CLI, exit codes),
docs/operations.md (install, metrics, troubleshooting).";

/// zklock: lease-style locks as Kubernetes custom resources, backed by ZooKeeper.
#[derive(Parser)]
#[command(version, about, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator (leader-elected; the Kubernetes client comes from KUBECONFIG or the
    /// in-cluster config).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions (LockClaim, Lock) as YAML, or write them into a
    /// directory one file each (what crds/ and the chart hold).
    Crd {
        /// Write `<plural>.zklock.io.yaml` files here instead of printing
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Print the admission policy that refuses a deposed leader's late status writes, and its
    /// binding, as YAML (the chart installs both; this is for installs without it; Kubernetes
    /// 1.30 or later)
    EpochPolicy {
        /// Namespace of the operator's epoch ConfigMap: its lease namespace
        #[arg(long)]
        param_namespace: String,
        /// Namespaces the operator serves (repeat the flag); default: all
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
        /// Name of the policy, its binding and the ConfigMap (the operator's --epoch-param)
        #[arg(long, default_value = zklock::api::epoch_policy::EPOCH_PARAM)]
        name: String,
    },
    /// Print the admission policy that puts the operator's finalizer on each LockClaim as it is
    /// created (one API write less per claim), and its binding, as YAML (the chart installs both;
    /// this is for installs without it; Kubernetes 1.36 or later)
    FinalizerPolicy {
        /// Namespaces the operator serves (repeat the flag); default: all
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
        /// Name of the policy and its binding
        #[arg(long, default_value = zklock::api::finalizer_policy::FINALIZER_POLICY)]
        name: String,
    },
    /// Print the queue of one lock, holders first, as ZooKeeper has it.
    Queue {
        /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
        #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
        zk_connect: String,
        /// Absolute path of the lock directory, e.g. /zklock/locks/shop/db-migrations
        lock: String,
        /// The permits of the lock's `Lock` object, if it has one (a mutex without)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        permits: Option<u32>,
    },
    /// Wait for a lock, or several (a LockClaim, through the Kubernetes API only); when it is
    /// Held, print ZKLOCK_CLAIM=<claim> and ZKLOCK_FENCING_TOKEN=<token> (with several locks also
    /// ZKLOCK_FENCING_TOKEN_<LOCK>=<token> for each) and exit 0. The claim then holds the lock
    /// until it is deleted or its holder pod (--holder-pod, or POD_NAME) finishes. Exit codes:
    /// 1 error or invalid claim, 75 timed out, 76 revoked, 77 lost, 128+N interrupted by signal N
    Acquire {
        #[command(flatten)]
        lock: LockArgs,
        /// Also write the two lines to this file (e.g. on a volume the pod's main container reads)
        #[arg(long, value_name = "FILE")]
        env_file: Option<std::path::PathBuf>,
    },
    /// Run a command while holding a lock; delete the claim when it exits. The command gets
    /// ZKLOCK_CLAIM, ZKLOCK_FENCING_TOKEN, ZKLOCK_LOCK and ZKLOCK_NAMESPACE, and the signals
    /// zklock receives; on a revocation request SIGTERM, then SIGKILL shortly before the grace
    /// period ends. Exits with the command's status, or 75 timed out waiting, 76 revoked, 77 lost
    /// (the lock went while the command ran), 1 error, 126/127 command not runnable/found
    Exec {
        #[command(flatten)]
        lock: LockArgs,
        /// The command and its arguments, after --
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Ask the holder of a lock node to let go, by writing a revocation request into its data.
    Revoke {
        /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
        #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
        zk_connect: String,
        /// Full path of the node to revoke (`zklock queue` lists a lock's nodes)
        node: String,
        /// Why: the holder's claim shows it in its RevokeRequested condition
        #[arg(long, default_value = "revoked with zklock revoke")]
        reason: String,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
    #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
    zk_connect: String,
    /// Root of zklock's tree; locks live at <root>/locks/<namespace>/<lockName>
    #[arg(long, env = "ZKLOCK_ZK_ROOT", default_value = "/zklock", value_parser = parse_zk_root)]
    zk_root: String,
    /// Session timeout to ask ZooKeeper for (e.g. 10s, 4000ms)
    #[arg(long, env = "ZKLOCK_ZK_SESSION_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    zk_session_timeout: Duration,
    /// Digest credentials: digest:USER:PASS. The operator's nodes then get the ACL "creator all,
    /// world read"; lock directories stay open to all for create (so Curator clients can contend)
    #[arg(long, env = "ZKLOCK_ZK_AUTH", conflicts_with = "zk_auth_file", value_parser = parse_digest)]
    zk_auth: Option<String>,
    /// File holding digest:USER:PASS (e.g. a mounted Secret)
    #[arg(long, env = "ZKLOCK_ZK_AUTH_FILE")]
    zk_auth_file: Option<std::path::PathBuf>,
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
    /// Run without leader election (one replica only!)
    #[arg(long, env = "ZKLOCK_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Name of the ConfigMap, in the lease namespace, that holds the leader epoch in force: the
    /// parameter of the admission policy zklock-leader-epoch (the chart installs both), which
    /// refuses status writes of a deposed leader that arrive late
    #[arg(long, env = "ZKLOCK_EPOCH_PARAM", default_value = zklock::api::epoch_policy::EPOCH_PARAM)]
    epoch_param: String,
    /// Run without that admission policy (clusters before Kubernetes 1.30, or where it cannot
    /// be installed). A status write of a deposed leader that arrives late can then land, until
    /// the new leader has written that claim (the docs say what that means)
    #[arg(long, env = "ZKLOCK_NO_EPOCH_POLICY")]
    no_epoch_policy: bool,
    /// Claims reconciled at once. Bounds the operator's concurrent API requests (and so its
    /// connections and memory) during bursts; handoffs are never queued behind more than this
    #[arg(long, env = "ZKLOCK_MAX_CONCURRENT_RECONCILES", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    max_concurrent_reconciles: u16,
    /// Delete final claims that set no spec.ttlSecondsAfterFinished this many seconds after they
    /// finished. Claims with an owner (those made for gated pods) are left to the garbage
    /// collector. Default: kept
    #[arg(long, env = "ZKLOCK_DEFAULT_TTL_SECONDS_AFTER_FINISHED", value_parser = clap::value_parser!(u32).range(0..=31_536_000))]
    default_ttl_seconds_after_finished: Option<u32>,
    /// Log format
    #[arg(long, env = "ZKLOCK_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(clap::Args)]
struct LockArgs {
    /// The lock's name (the lockName claims share), or several separated by commas (a,b):
    /// taken together, all or none, without deadlock
    #[arg(value_parser = parse_locks)]
    lock: String,
    /// Exclusive, or Shared (with other Shared holders)
    #[arg(long, default_value = "Exclusive", value_parser = ["Exclusive", "Shared"])]
    mode: String,
    /// Give up when not Held after this long (e.g. 90s, 10m; 0 = try once, never queue).
    /// Default: wait as long as it takes
    #[arg(long, value_parser = parse_timeout)]
    timeout: Option<Duration>,
    /// The pod the claim lives and dies with (in an init container: the pod's own name)
    #[arg(long, env = "POD_NAME")]
    holder_pod: Option<String>,
    /// The holder pod's UID (in an init container: POD_UID from the downward API's
    /// metadata.uid): the claim is then owned by the pod and deleted with it
    #[arg(long, env = "POD_UID", requires = "holder_pod")]
    holder_pod_uid: Option<String>,
    /// Namespace of the claim (default: the kubeconfig context's, or the pod's own in a cluster)
    #[arg(long, short = 'n', env = "ZKLOCK_NAMESPACE")]
    namespace: Option<String>,
    /// Name of the claim (default: generated from the lock's name)
    #[arg(long)]
    name: Option<String>,
    /// Time the holder gets to let go when the claim is revoked (default 30s)
    #[arg(long, value_parser = parse_timeout)]
    revocation_grace_period: Option<Duration>,
}

impl LockArgs {
    fn into_request(self, client: &kube::Client) -> zklock::acquire::Request {
        zklock::acquire::Request {
            mode: if self.mode == "Shared" { zklock::recipe::Mode::Shared } else { zklock::recipe::Mode::Exclusive },
            namespace: self.namespace.unwrap_or_else(|| client.default_namespace().to_string()),
            lock: self.lock,
            timeout: self.timeout,
            holder_pod: self.holder_pod.filter(|p| !p.is_empty()),
            holder_pod_uid: self.holder_pod_uid.filter(|u| !u.is_empty()),
            name: self.name,
            grace: self.revocation_grace_period,
        }
    }
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    if s.trim_end_matches(['s', 'm', 'h']) == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = number.parse().map_err(|_| format!("{s:?} is not a duration like 10s, 4000ms, 10m or 1h"))?;
    let too_long = || format!("{s:?} is too long a duration");
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_long)?),
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use ms, s, m or h")),
    };
    if d.is_zero() {
        return Err("the duration must be more than zero".into());
    }
    Ok(d)
}

fn parse_locks(s: &str) -> Result<String, String> {
    let names: Vec<&str> = s.split(',').map(str::trim).collect();
    for name in &names {
        zklock::api::check_lock_name("the lock", name)?;
    }
    if names.len() > zklock::api::MAX_LOCKS {
        return Err(format!("{} locks: take at most {}", names.len(), zklock::api::MAX_LOCKS));
    }
    if let Some(twice) = names.iter().enumerate().find_map(|(i, n)| names[..i].contains(n).then_some(n)) {
        return Err(format!("lock {twice:?} is named twice: name each lock once"));
    }
    Ok(names.join(","))
}

fn parse_digest(s: &str) -> Result<String, String> {
    match s.trim().strip_prefix("digest:") {
        Some(cred) if cred.split_once(':').is_some_and(|(u, p)| !u.is_empty() && !p.is_empty()) => Ok(cred.to_string()),
        _ => Err("expected digest:USER:PASS".into()),
    }
}

fn parse_zk_root(s: &str) -> Result<String, String> {
    let ok = s.starts_with('/') && !s.ends_with('/') && !s.contains("//") && s.len() > 1;
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an absolute ZooKeeper path like /zklock"))
    }
}

fn read(path: &std::path::Path, what: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

impl RunArgs {
    fn into_options(self) -> Result<zklock::operator::Options, String> {
        let mut zk = ZkConfig::new(self.zk_connect).with_session_timeout(self.zk_session_timeout);
        zk.detached = true;
        zk.digest_auth = match (self.zk_auth, self.zk_auth_file) {
            (Some(auth), _) => Some(auth),
            (None, Some(file)) => {
                Some(parse_digest(&read(&file, "--zk-auth-file")?).map_err(|e| format!("{}: {e}", file.display()))?)
            }
            (None, None) => None,
        };
        if let Some(ca) = &self.zk_tls_ca {
            let identity = match (&self.zk_tls_cert, &self.zk_tls_key) {
                (Some(cert), Some(key)) => Some((read(cert, "--zk-tls-cert")?, read(key, "--zk-tls-key")?)),
                _ => None,
            };
            zk.tls = Some(zklock::zk::TlsPem { ca: read(ca, "--zk-tls-ca")?, identity });
        }
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| format!("zklock-{}", std::process::id()));
        Ok(zklock::operator::Options {
            zk,
            zk_root: self.zk_root,
            metrics_addr: self.metrics_addr,
            namespaces: self.watch_namespace.into_iter().filter(|n| !n.is_empty()).collect(),
            lease_namespace: self.lease_namespace,
            leader_election: !self.no_leader_election,
            epoch_param: (!self.no_leader_election && !self.no_epoch_policy).then_some(self.epoch_param),
            concurrency: self.max_concurrent_reconciles,
            default_ttl: self.default_ttl_seconds_after_finished.map(|s| Duration::from_secs(s.into())),
            identity,
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    match &cli.command {
        Command::Run(args) if args.log_format == "json" => {
            tracing_subscriber::fmt().json().with_env_filter(filter).init()
        }
        _ => tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init(),
    }
    match run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("zklock: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; the answer is the exit code (or the one line that says what went wrong).
async fn run(cli: Cli) -> Result<u8, String> {
    let config = |connect: String| ZkConfig::new(connect).with_session_timeout(Duration::from_secs(10));
    match cli.command {
        Command::Run(args) => {
            let options = args.into_options()?;
            let shutdown = tokio_util::sync::CancellationToken::new();
            let on_signal = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                tracing::info!("shutting down");
                on_signal.cancel();
            });
            zklock::operator::run(options, shutdown).await.map_err(|e| e.to_string())?;
            Ok(0)
        }
        Command::Crd { dir: None } => {
            print!("{}", zklock::api::crd_yaml());
            Ok(0)
        }
        Command::Crd { dir: Some(dir) } => {
            for (file, yaml) in zklock::api::crds() {
                let path = dir.join(file);
                std::fs::write(&path, yaml).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            Ok(0)
        }
        Command::EpochPolicy { param_namespace, namespaces, name } => {
            use zklock::api::epoch_policy::{epoch_policy, epoch_policy_binding};
            let policy = serde_yaml::to_string(&epoch_policy(&name)).map_err(|e| e.to_string())?;
            let binding = epoch_policy_binding(&name, &name, &name, &param_namespace, &namespaces);
            let binding = serde_yaml::to_string(&binding).map_err(|e| e.to_string())?;
            print!("{policy}---\n{binding}");
            Ok(0)
        }
        Command::FinalizerPolicy { namespaces, name } => {
            use zklock::api::finalizer_policy::{finalizer_policy, finalizer_policy_binding};
            let policy = serde_yaml::to_string(&finalizer_policy(&name)).map_err(|e| e.to_string())?;
            let binding = serde_yaml::to_string(&finalizer_policy_binding(&name, &name, &namespaces))
                .map_err(|e| e.to_string())?;
            print!("{policy}---\n{binding}");
            Ok(0)
        }
        Command::Acquire { lock, env_file } => Ok(acquire(lock, env_file).await),
        Command::Exec { lock, command } => Ok(exec(lock, command).await),
        Command::Queue { zk_connect, lock, permits } => {
            let engine = LockEngine::connect(config(zk_connect)).await.map_err(|e| e.to_string())?;
            let queue = engine.queue(&lock).await.map_err(|e| e.to_string())?;
            let names: Vec<&str> = queue.iter().map(|e| e.node.as_str()).collect();
            println!("{:<4} {:<10} {:<38} NODE", "POS", "MODE", "CONTENDER");
            for (position, entry) in queue.iter().enumerate() {
                let id = entry.id.as_deref().unwrap_or("(foreign)");
                let held = matches!(
                    zklock::recipe::decide(&names, &entry.node, zklock::recipe::Limit::from_permits(permits)),
                    zklock::recipe::Decision::Held
                );
                let pos = if held { "held".to_string() } else { position.to_string() };
                println!("{pos:<4} {:<10} {id:<38} {}", entry.mode.to_string(), entry.node);
            }
            Ok(0)
        }
        Command::Revoke { zk_connect, node, reason } => {
            let engine = LockEngine::connect(config(zk_connect)).await.map_err(|e| e.to_string())?;
            engine.request_revocation(&node, &reason).await.map_err(|e| e.to_string())?;
            Ok(0)
        }
    }
}

async fn kube_client() -> Result<kube::Client, u8> {
    let no_api = |e: &dyn std::fmt::Display| {
        eprintln!("zklock: no Kubernetes API: {e} (set KUBECONFIG, or run in a cluster)");
        zklock::acquire::exit::ERROR
    };
    let config = kube::Config::infer().await.map_err(|e| no_api(&e))?;
    Ok(zklock::client::builder(config).map_err(|e| no_api(&e))?.build())
}

/// The signals `acquire` and `exec` handle, installed before anything else (see
/// `zklock::signals`).
fn signals() -> Result<zklock::signals::Signals, u8> {
    zklock::signals::Signals::install().map_err(|e| {
        eprintln!("zklock: {e}");
        zklock::acquire::exit::ERROR
    })
}

async fn acquire(args: LockArgs, env_file: Option<std::path::PathBuf>) -> u8 {
    use std::io::Write;
    let mut signals = match signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let client = match kube_client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let request = args.into_request(&client);
    match zklock::acquire::acquire(client.clone(), &request, signals.ending()).await {
        Ok(held) => {
            let mut lines = format!("ZKLOCK_CLAIM={}\nZKLOCK_FENCING_TOKEN={}\n", held.claim, held.fencing_token);
            for (lock, token) in &held.tokens {
                lines.push_str(&format!("{}={token}\n", zklock::acquire::token_variable(lock)));
            }
            // Held, but the caller cannot learn it as asked (stdout closed, the file not
            // writable): let go rather than hold blind.
            let mut stdout = std::io::stdout().lock();
            let printed = stdout.write_all(lines.as_bytes()).and_then(|()| stdout.flush());
            let written = match &env_file {
                Some(file) => std::fs::write(file, &lines).map_err(|e| format!("cannot write {}: {e}", file.display())),
                None => Ok(()),
            };
            let failed = match (printed, written) {
                (Err(e), _) => Some(format!("cannot write to stdout: {e}")),
                (_, Err(e)) => Some(e),
                _ => None,
            };
            if let Some(why) = failed {
                eprintln!("zklock: {why}; releasing the lock");
                let api = kube::Api::namespaced(client, &request.namespace);
                zklock::acquire::delete(&api, &held.claim, &held.uid).await;
                return zklock::acquire::exit::ERROR;
            }
            let until = match &request.holder_pod {
                Some(pod) => format!("until pod {pod} finishes or the claim is deleted"),
                None => format!(
                    "until the claim is deleted: kubectl delete lockclaim -n {} {}",
                    request.namespace, held.claim
                ),
            };
            eprintln!("zklock: holding lock {} (fencing token {}) {until}", request.lock, held.fencing_token);
            0
        }
        Err(failure) => {
            eprintln!("zklock: {failure}");
            failure.code()
        }
    }
}

async fn exec(args: LockArgs, command: Vec<String>) -> u8 {
    let signals = match signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let client = match kube_client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let request = args.into_request(&client);
    zklock::exec::run(client, request, command, signals).await
}

/// SIGINT, or SIGTERM (what Kubernetes sends a pod it stops).
/// True for SIGTERM.
async fn wait_for_signal() -> bool {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        return tokio::select! { _ = tokio::signal::ctrl_c() => false, _ = term.recv() => true };
    }
    let _ = tokio::signal::ctrl_c().await;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_units_the_examples_use_and_refuse_the_rest_clearly() {
        assert_eq!(parse_duration("4000ms"), Ok(Duration::from_millis(4000)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_timeout("0h"), Ok(Duration::ZERO));
        assert!(parse_duration("2d").is_err_and(|e| e.contains("use ms, s, m or h")));
        assert!(parse_duration("99999999999999999999h").is_err_and(|e| e.contains("like 10s")));
        assert!(parse_duration("9999999999999999h").is_err_and(|e| e.contains("too long")));
        assert!(parse_duration("0s").is_err());
    }
}
