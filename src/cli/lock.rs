//! `zklock acquire` and `zklock exec`: clients of the claim API.

use std::time::Duration;

#[derive(clap::Args)]
pub struct LockArgs {
    /// The lock's name (the lockName claims share), or several separated by commas (a,b):
    /// taken together, all or none, without deadlock
    #[arg(value_parser = parse_locks)]
    lock: String,
    /// Exclusive, or Shared (with other Shared holders); any case
    #[arg(long, default_value = "Exclusive", value_parser = parse_mode)]
    mode: zklock::recipe::Mode,
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
    /// Newest wins: while this claim waits, a newer claim of the same lock, namespace and GROUP
    /// ends it (exit 78). For deploys where only the latest matters; one lock only
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    supersede: Option<String>,
    /// While waiting, say where the claim stands this often even when nothing changed (how long
    /// it has waited, the claim ahead and how long that one has held; without a status, what to
    /// run to see why)
    #[arg(long, default_value = "30s", value_parser = zklock::durations::parse_duration)]
    heartbeat: Duration,
    #[command(flatten)]
    api: super::api::ApiArgs,
}

impl LockArgs {
    fn into_request(self, client: &kube::Client) -> zklock::acquire::Request {
        zklock::acquire::Request {
            mode: self.mode,
            namespace: self.namespace.unwrap_or_else(|| client.default_namespace().to_string()),
            lock: self.lock,
            timeout: self.timeout,
            holder_pod: self.holder_pod.filter(|p| !p.is_empty()),
            holder_pod_uid: self.holder_pod_uid.filter(|u| !u.is_empty()),
            name: self.name,
            grace: self.revocation_grace_period,
            heartbeat: self.heartbeat,
            supersede: self.supersede,
        }
    }
}

/// A mode in any case: `shared`, `Shared`, `SHARED`.
pub fn parse_mode(s: &str) -> Result<zklock::recipe::Mode, String> {
    match s.to_ascii_lowercase().as_str() {
        "exclusive" => Ok(zklock::recipe::Mode::Exclusive),
        "shared" => Ok(zklock::recipe::Mode::Shared),
        _ => Err(format!("{s:?} is no mode: Exclusive or Shared")),
    }
}

fn parse_group(s: &str) -> Result<String, String> {
    zklock::api::check_group(s)?;
    Ok(s.to_string())
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

async fn kube_client(api: &super::api::ApiArgs) -> Result<kube::Client, u8> {
    api.client().await.map_err(|e| {
        eprintln!("zklock: {e}");
        zklock::acquire::exit::ERROR
    })
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
    if args.supersede.is_some() && args.lock.contains(',') {
        eprintln!("zklock: --supersede goes with one lock: a claim over several locks cannot be superseded");
        return Err(zklock::acquire::exit::ERROR);
    }
    if args.supersede.is_some() && args.timeout == Some(Duration::ZERO) {
        eprintln!(
            "zklock: --supersede with --timeout 0: a claim that never waits supersedes nothing and is never superseded"
        );
        return Err(zklock::acquire::exit::ERROR);
    }
    let signals = signals()?;
    let client = kube_client(&args.api).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use zklock::recipe::Mode;

    #[test]
    fn modes_are_read_in_any_case_and_a_wrong_one_is_named() {
        for (text, mode) in [("Shared", Mode::Shared), ("shared", Mode::Shared), ("EXCLUSIVE", Mode::Exclusive)] {
            assert_eq!(parse_mode(text), Ok(mode), "{text}");
        }
        assert_eq!(parse_mode("shard"), Err("\"shard\" is no mode: Exclusive or Shared".to_string()));
    }
}
