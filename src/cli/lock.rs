//! `zklock acquire` and `zklock exec`: clients of the claim API.

use std::time::Duration;

#[derive(clap::Args)]
pub struct LockArgs {
    /// The lock's name (the lockName claims share), or several separated by commas (a,b):
    /// taken together, all or none, without deadlock
    #[arg(value_parser = parse_locks)]
    lock: String,
    /// Exclusive, or Shared (with other Shared holders)
    #[arg(long, default_value = "Exclusive", value_parser = ["Exclusive", "Shared"])]
    mode: String,
    /// Give up when not Held after this long (e.g. 90s, 10m; 0 = try once, never queue).
    /// Default: wait as long as it takes
    #[arg(long, value_parser = zklock::durations::parse_timeout)]
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
    #[arg(long, value_parser = zklock::durations::parse_timeout)]
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

/// What both commands start from: the signals handled (installed first), a client, and the
/// request; or the exit code when one of them cannot be had.
async fn start(args: LockArgs) -> Result<(zklock::signals::Signals, kube::Client, zklock::acquire::Request), u8> {
    let signals = signals()?;
    let client = kube_client().await?;
    let request = args.into_request(&client);
    Ok((signals, client, request))
}

pub async fn acquire(args: LockArgs, env_file: Option<std::path::PathBuf>) -> u8 {
    let (mut signals, client, request) = match start(args).await {
        Ok(started) => started,
        Err(code) => return code,
    };
    match zklock::acquire::acquire(client.clone(), &request, signals.ending()).await {
        Ok(held) => zklock::acquire::announce(client, &request, &held, env_file.as_deref()).await,
        Err(failure) => {
            eprintln!("zklock: {failure}");
            failure.code()
        }
    }
}

pub async fn exec(args: LockArgs, command: Vec<String>) -> u8 {
    match start(args).await {
        Ok((signals, client, request)) => zklock::exec::run(client, request, command, signals).await,
        Err(code) => code,
    }
}
