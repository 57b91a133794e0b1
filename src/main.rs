#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cli;

use cli::lock::LockArgs;
use zklock::operator::RunArgs;

/// One allocator for every build (glibc's and musl's mallocs differ), and one that keeps what
/// is freed apart by size: with glibc's, the reconciles' short-lived buffers (12 KiB futures,
/// 8 KiB reads) interleaved with the claims' long-lived entries held twice the live heap
/// resident (docs/benchmarks.md, "Memory at scale").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Shown under `zklock --help`: the commands people type most.
const EXAMPLES: &str = "Examples:
  zklock exec deploy-production --timeout 30m -- ./deploy.sh   run a command while holding a lock
  zklock acquire db-migrations --env-file /shared/lock.env      wait for a lock (an init container)
  zklock queue db-migrations -n shop                            who holds a lock, who waits
  zklock revoke migrate-7f2 -n shop --reason maintenance        ask a claim's holder to let go
  zklock status migrate-7f2 -n shop                             where a claim stands, and why
  zklock check -n shop                                          is zklock ready to serve claims here?
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
    /// Print a lock's queue through the Kubernetes API: its claims, holders first (phase,
    /// position, mode, fencing token, the claim waited for, the holder pod). LOCK is a lockName
    /// in the namespace, or cluster/NAME for a ClusterLock (its claims in every namespace you
    /// may list).
    Queue {
        /// The lock: a lockName, or cluster/NAME
        lock: String,
        /// Namespace of the lock (default: the kubeconfig context's)
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// Output format
        #[arg(long, short = 'o', value_enum, default_value_t = cli::api::Output::Table)]
        output: cli::api::Output,
        #[command(flatten)]
        api: cli::api::ApiArgs,
    },
    /// Print a lock's last grants from its LockHistory: who held it, when, for how long, how
    /// it ended, how long each waited (written by the operator about a second after each grant
    /// and end). LOCK is a lockName in the namespace, or cluster/NAME for a ClusterLock (the
    /// grants made in this cluster, kept in the operator's namespace)
    History {
        /// The lock: a lockName, or cluster/NAME
        lock: String,
        /// Namespace of the lock (default: the kubeconfig context's)
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// Namespace zklock is installed in, for a ClusterLock's history (default: found by name)
        #[arg(long)]
        operator_namespace: Option<String>,
        /// Output format
        #[arg(long, short = 'o', value_enum, default_value_t = cli::history::Output::Table)]
        output: cli::history::Output,
        #[command(flatten)]
        api: cli::api::ApiArgs,
    },
    /// Ask the holder of a claim to let go, through the Kubernetes API (the zklock.io/revoke
    /// annotation): the claim gets RevokeRequested, a `zklock exec` holding it stops its command.
    Revoke {
        /// The LockClaim
        claim: String,
        /// Namespace of the claim (default: the kubeconfig context's)
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// Why: the holder's claim shows it in its RevokeRequested condition
        #[arg(long, default_value = "revoked with zklock revoke")]
        reason: String,
        #[command(flatten)]
        api: cli::api::ApiArgs,
    },
    /// Where one claim stands, in words: its phase and since when, what it holds (token, lease)
    /// or waits for (position, the claim ahead and how long that one has held), a revocation
    /// asked for, how it ended; for a claim with no status, why (what `zklock check` finds)
    Status {
        /// The LockClaim
        claim: String,
        /// Namespace of the claim (default: the kubeconfig context's)
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        #[command(flatten)]
        operator: cli::check::OperatorRef,
        #[command(flatten)]
        api: cli::api::ApiArgs,
    },
    /// Is zklock ready to serve claims in a namespace? Checks the CRDs (at this binary's
    /// revision), the operator's leader (renewing its Lease, ready), that the namespace is
    /// served, and the admission policies bound where the API server serves them; each line that
    /// is not ready says what to do. Exit codes: 0 ready, 1 not ready
    Check {
        /// Namespace the claims are in (default: the kubeconfig context's)
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        #[command(flatten)]
        operator: cli::check::OperatorRef,
        /// Look again every two seconds until ready, for at most this long (e.g. 2m)
        #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "2m",
              value_parser = zklock::durations::parse_duration)]
        wait: Option<std::time::Duration>,
        #[command(flatten)]
        api: cli::api::ApiArgs,
    },
    /// Print a shell completion script: `source <(zklock completion bash)`, or into your shell's
    /// completion directory (zsh: `zklock completion zsh > "${fpath[1]}/_zklock"`)
    Completion {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Commands for those who run zklock: manifests for installs without the chart, and a
    /// lock's queue and revocations straight in ZooKeeper.
    #[command(subcommand)]
    Admin(Admin),
    /// Print the CustomResourceDefinitions (LockClaim, Lock, ClusterLock) as YAML, or write them
    /// into a directory one file each (what crds/ and the chart hold); also `zklock admin crd`.
    Crd {
        /// Write `<plural>.zklock.io.yaml` files here instead of printing
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Wait for a lock, or several (a LockClaim, through the Kubernetes API only); when it is
    /// Held, print ZKLOCK_CLAIM=<claim> and ZKLOCK_FENCING_TOKEN=<token> (with several locks also
    /// ZKLOCK_FENCING_TOKEN_<LOCK>=<token> for each) and exit 0. The claim then holds the lock
    /// until it is deleted or its holder pod (--holder-pod, or POD_NAME) finishes. Exit codes:
    /// 1 error or invalid claim, 75 timed out, 76 revoked, 77 lost, 78 superseded, 128+N interrupted by
    /// signal N
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
    /// (the lock went while the command ran), 78 superseded while waiting (--supersede), 1 error,
    /// 126/127 command not runnable/found
    Exec {
        #[command(flatten)]
        lock: LockArgs,
        /// The command and its arguments, after --
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

/// The manifests the chart installs, for installs without it.
#[derive(Subcommand)]
enum Manifests {
    /// Print the CustomResourceDefinitions (LockClaim, Lock, ClusterLock) as YAML, or write them
    /// into a directory one file each (what crds/ and the chart hold).
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
    /// Print the admission policies that make the API server enforce fencing tokens on objects
    /// labelled zklock.io/fenced-by (a Lock whose spec.fencing is Enforced) or
    /// zklock.io/fenced-by-cluster-lock (a ClusterLock), and their bindings, as YAML (the chart
    /// installs them; this is for installs without it; Kubernetes 1.30 or later)
    FencingPolicy {
        /// The operator's namespace (its lease namespace): the ClusterLocks' parameter is there
        #[arg(long)]
        param_namespace: String,
        /// Namespaces the operator serves (repeat the flag); default: all
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
        /// Name of the policies, their bindings and parameters (the operator's --fencing-param)
        #[arg(long, default_value = zklock::api::fencing_policy::FENCING_PARAM)]
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
    /// Print the admission policy that gives every pod created with the annotation
    /// zklock.io/lock the scheduling gate zklock.io/lock (the annotation alone then gates a pod),
    /// and its binding, as YAML (the chart installs both; Kubernetes 1.36 or later)
    GatePolicy {
        /// Namespaces the operator serves (repeat the flag); default: all
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
        /// Name of the policy and its binding
        #[arg(long, default_value = zklock::api::gate_policy::GATE_POLICY)]
        name: String,
    },
}

#[derive(Subcommand)]
enum Admin {
    #[command(flatten)]
    Manifests(Manifests),
    /// Write a man page per command (zklock.1, zklock-queue.1, …) into a directory
    Man {
        /// Where the pages go (e.g. /usr/local/share/man/man1)
        #[arg(long)]
        dir: std::path::PathBuf,
    },
    /// Print the command-line reference as Markdown (docs/cli.md is this)
    CliReference,
    /// Before the operator is uninstalled (the chart's pre-delete step): fail, naming them, while
    /// LockClaims carry the operator's finalizer (without the operator they, and their
    /// namespaces, could not be deleted); with --delete-claims, delete them and wait until the
    /// operator has released each
    BeforeUninstall {
        /// Namespaces the operator serves (repeat the flag); default: all
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
        /// Delete the claims and wait for their release instead of failing
        #[arg(long)]
        delete_claims: bool,
        /// How long --delete-claims waits for the operator to release them
        #[arg(long, default_value = "5m", value_parser = zklock::durations::parse_duration)]
        timeout: std::time::Duration,
        /// Namespace of the operator's leader Lease: with --delete-claims, the Lease is marked
        /// first, and the operator then makes no claim for a gated pod, removes no gate and
        /// grants nothing new while the claims are deleted
        #[arg(long)]
        lease_namespace: Option<String>,
        /// Name of the operator's leader Lease (its --lease-name)
        #[arg(long, default_value = zklock::operator::LEASE_NAME)]
        lease_name: String,
        #[command(flatten)]
        api: cli::api::ApiArgs,
    },
    /// Print the queue of one lock, holders first, as ZooKeeper has it (foreign clients' nodes
    /// included).
    ZkQueue {
        /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
        #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
        zk_connect: String,
        /// Absolute path of the lock directory, e.g. /zklock/locks/shop/db-migrations
        lock: String,
        /// The permits of the lock's `Lock` object, if it has one (a mutex without)
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        permits: Option<u32>,
    },
    /// Raise the token base in ZooKeeper so that every fencing token, ticket and leader epoch
    /// from now on is above a token floor: after moving to a new ensemble (or restoring or
    /// wiping its data) where clusters share ClusterLocks. Stop every sharing cluster's
    /// operator first; N is the highest `data.floor` of their ConfigMaps zklock-token-floor
    RaiseTokenBase {
        /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
        #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
        zk_connect: String,
        /// The operator's --zk-auth (digest:USER:PASS), where it uses credentials
        #[arg(long, env = "ZKLOCK_ZK_AUTH")]
        zk_auth: Option<String>,
        /// The operator's --zk-root
        #[arg(long, default_value = "/zklock")]
        zk_root: String,
        /// The operators' shared root (--zk-cluster-root), where ClusterLocks are shared
        #[arg(long)]
        zk_cluster_root: Option<String>,
        /// Every number handed out from now on is above this (the highest token floor)
        #[arg(long, value_name = "N")]
        above: i64,
    },
    /// Ask the holder of a lock node to let go, by writing a revocation request into its data
    /// (also a foreign client's node).
    ZkRevoke {
        /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
        #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
        zk_connect: String,
        /// Full path of the node to revoke (`zklock admin zk-queue` lists a lock's nodes)
        node: String,
        /// Why: the holder's claim shows it in its RevokeRequested condition
        #[arg(long, default_value = "revoked with zklock admin zk-revoke")]
        reason: String,
    },
}

/// What the binary is called as: `kubectl zklock` when kubectl runs it as a plugin (its file
/// named `kubectl-zklock`), else `zklock`.
fn invoked_as() -> &'static str {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let file = std::path::Path::new(&argv0).file_name().unwrap_or_default().to_string_lossy().into_owned();
    if file.starts_with("kubectl-zklock") {
        "kubectl zklock"
    } else {
        "zklock"
    }
}

/// The command line, its usage and examples named as the binary is invoked.
fn command(bin: &'static str) -> clap::Command {
    let examples =
        if bin == "zklock" { EXAMPLES.to_string() } else { EXAMPLES.replace("\n  zklock ", &format!("\n  {bin} ")) };
    Cli::command().bin_name(bin).display_name(bin).after_help(examples)
}

/// The tracing target of the audit lines (`controller::history`).
const AUDIT_TARGET: &str = "zklock::audit";

#[tokio::main]
async fn main() -> ExitCode {
    let bin = invoked_as();
    let cli = match Cli::from_arg_matches(&command(bin).get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // The audit lines (a lock's grants and ends) are kept at any log level unless RUST_LOG
    // names their target itself (`zklock::audit=off`).
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains(AUDIT_TARGET)) {
        // A constant directive: it parses.
        if let Ok(audit) = format!("{AUDIT_TARGET}=info").parse() {
            filter = filter.add_directive(audit);
        }
    }
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
    match cli.command {
        Command::Run(args) => cli::operator::run(*args).await,
        Command::Crd { dir } => cli::manifests::crd(dir),
        Command::Admin(Admin::Manifests(manifests)) => print_manifests(manifests),
        Command::Completion { shell } => cli::reference::completion(command("zklock"), shell, "zklock"),
        Command::Admin(Admin::Man { dir }) => cli::reference::man_pages(command("zklock"), &dir),
        Command::Admin(Admin::CliReference) => {
            print!("{}", cli::reference::markdown(command("zklock")));
            Ok(0)
        }
        Command::Acquire { lock, env_file } => Ok(cli::lock::acquire(lock, env_file).await),
        Command::Exec { lock, command } => Ok(cli::lock::exec(lock, command).await),
        Command::Queue { lock, namespace, output, api } => cli::claims::queue(api, namespace, lock, output).await,
        Command::History { lock, namespace, operator_namespace, output, api } => {
            cli::history::history(api, namespace, operator_namespace, lock, output).await
        }
        Command::Revoke { claim, namespace, reason, api } => cli::claims::revoke(api, namespace, claim, reason).await,
        Command::Status { claim, namespace, operator, api } => {
            cli::status::status(api, namespace, claim, &operator).await
        }
        Command::Check { namespace, operator, wait, api } => cli::check::check(api, namespace, &operator, wait).await,
        Command::Admin(Admin::BeforeUninstall {
            namespaces,
            delete_claims,
            timeout,
            lease_namespace,
            lease_name,
            api,
        }) => {
            cli::uninstall::before_uninstall(api, namespaces, delete_claims, timeout, lease_namespace, lease_name).await
        }
        Command::Admin(Admin::ZkQueue { zk_connect, lock, permits }) => {
            cli::zookeeper::queue(zk_connect, &lock, permits).await
        }
        Command::Admin(Admin::RaiseTokenBase { zk_connect, zk_auth, zk_root, zk_cluster_root, above }) => {
            let zk_auth = zk_auth.map(|a| a.strip_prefix("digest:").unwrap_or(&a).to_string());
            cli::zookeeper::raise_token_base(zk_connect, zk_auth, &zk_root, zk_cluster_root.as_deref(), above).await
        }
        Command::Admin(Admin::ZkRevoke { zk_connect, node, reason }) => {
            cli::zookeeper::revoke(zk_connect, &node, &reason).await
        }
    }
}

fn print_manifests(manifests: Manifests) -> Result<u8, String> {
    match manifests {
        Manifests::Crd { dir } => cli::manifests::crd(dir),
        Manifests::EpochPolicy { param_namespace, namespaces, name } => {
            cli::manifests::epoch_policy(&param_namespace, &namespaces, &name)
        }
        Manifests::FencingPolicy { param_namespace, namespaces, name } => {
            cli::manifests::fencing_policy(&param_namespace, &namespaces, &name)
        }
        Manifests::FinalizerPolicy { namespaces, name } => cli::manifests::finalizer_policy(&namespaces, &name),
        Manifests::GatePolicy { namespaces, name } => cli::manifests::gate_policy(&namespaces, &name),
    }
}
