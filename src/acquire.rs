//! `zklock acquire` (and the first half of `zklock exec`): asks for a lock through the claim API
//! only — a LockClaim, no ZooKeeper access — and follows the claim until it is Held or ends,
//! saying on stderr where it waits. Needs create, get, watch and delete on lockclaims (and
//! patch, to take the finalizer off a claim of its own that no operator ever served).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};

use crate::api::conditions::{self, FINISHED, REVOKE_REQUESTED};
use crate::api::{Holder, LockClaim, LockClaimSpec, LockClaimStatus, LockRef, Phase};
use crate::recipe::Mode;

/// Exit codes besides the command's own (documented in docs/user-guide.md and `zklock exec --help`).
pub mod exit {
    /// zklock's own failure: bad flags, the API refused or is unreachable, the claim is Invalid.
    pub const ERROR: u8 = 1;
    /// The lock was not Held within the timeout.
    pub const TIMED_OUT: u8 = 75;
    /// The claim was revoked.
    pub const REVOKED: u8 = 76;
    /// The lock was lost (the claim ended Lost, or ended or vanished otherwise while held).
    pub const LOST: u8 = 77;
    /// A newer claim of the same supersede group took the claim's place while it waited.
    pub const SUPERSEDED: u8 = 78;
}

/// How long past its own timeout the client waits for the operator to say Expired (the
/// operator may be failing over) before it gives up by itself.
const OPERATOR_SLACK: Duration = Duration::from_secs(30);
/// How long a claim being withdrawn is waited for: the answer to its create when a signal came
/// first, and its deletion (retried) when the API is slow.
const WITHDRAW_WAIT: Duration = Duration::from_secs(20);
/// The annotation that ties a claim to the one `acquire` that made it (a random request id), so
/// that a claim whose create was interrupted is found and withdrawn by name, and no other.
pub const REQUEST_ID_ANNOTATION: &str = "zklock.io/request-id";

/// What to ask for.
pub struct Request {
    pub lock: String,
    pub mode: Mode,
    pub timeout: Option<Duration>,
    pub holder_pod: Option<String>,
    /// The holder pod's UID: the claim is then owned by the pod, and the garbage collector
    /// deletes it with the pod (as the claims of gated pods are).
    pub holder_pod_uid: Option<String>,
    pub namespace: String,
    /// The claim's name; default: generated from the lock's.
    pub name: Option<String>,
    /// The claim's revocation grace period; default: the operator's (30 s).
    pub grace: Option<Duration>,
    /// How often a wait says where it stands, also when nothing changed (see [`heartbeat`]).
    pub heartbeat: Duration,
    /// The claim's supersede group (`spec.supersede.group`): a newer claim of it ends this one
    /// while it waits.
    pub supersede: Option<String>,
}

/// The default of [`Request::heartbeat`].
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// The longest a heartbeat waits to read the claim ahead.
const HEARTBEAT_READ: Duration = Duration::from_secs(2);
/// The longest heartbeat: a day (a longer one is taken as this).
const MAX_HEARTBEAT: Duration = Duration::from_secs(86_400);

/// The lock, held.
#[derive(Clone, Debug)]
pub struct Held {
    pub claim: String,
    pub uid: String,
    /// The fencing token: the lock's; with several locks, theirs joined (`a=1,b=2`).
    pub fencing_token: String,
    /// With several locks, each lock's own token (lock name, token), in the claim's order.
    pub tokens: Vec<(String, String)>,
    /// The claim's revocation grace period.
    pub grace: Duration,
}

/// Why there is no lock (each with its exit code).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    Error(String),
    #[error("timed out: {0}")]
    TimedOut(String),
    #[error("revoked: {0}")]
    Revoked(String),
    #[error("lost: {0}")]
    Lost(String),
    #[error("superseded: {0}")]
    Superseded(String),
    #[error("interrupted by {0}")]
    Interrupted(&'static str, u8),
}

impl Failure {
    pub fn code(&self) -> u8 {
        match self {
            Failure::Error(_) => exit::ERROR,
            Failure::TimedOut(_) => exit::TIMED_OUT,
            Failure::Revoked(_) => exit::REVOKED,
            Failure::Lost(_) => exit::LOST,
            Failure::Superseded(_) => exit::SUPERSEDED,
            Failure::Interrupted(_, code) => *code,
        }
    }
}

/// The claim for `request`, named before it is created (`<lock>-<5 random characters>`, as a
/// generated name would be, unless `--name` gave one) and marked with `request_id`: a signal
/// that interrupts its create must be able to find it.
pub fn claim_for(request: &Request, request_id: &str) -> LockClaim {
    // `a,b` names the claim `a-b-<random>`.
    let base: String = request.lock.replace(',', "-").chars().take(52).collect();
    let name = request.name.clone().unwrap_or_else(|| {
        let random = uuid::Uuid::new_v4().simple().to_string();
        format!("{}-{}", base.trim_end_matches(['.', '-']), &random[..5])
    });
    LockClaim {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(request.namespace.clone()),
            owner_references: owner(request).map(|o| vec![o]),
            annotations: Some([(REQUEST_ID_ANNOTATION.to_string(), request_id.to_string())].into()),
            // The operator's finalizer from the start: one API write less for it per claim.
            finalizers: Some(vec![crate::api::FINALIZER.to_string()]),
            ..ObjectMeta::default()
        },
        spec: LockClaimSpec {
            holder: request.holder_pod.clone().map(|pod_name| Holder { pod_name, namespace: None }),
            // Whole seconds, rounded up: never less patience than asked for.
            acquire_timeout_seconds: request.timeout.map(|t| t.as_secs() as i64 + i64::from(t.subsec_nanos() > 0)),
            revocation_grace_period_seconds: request.grace.map(|g| g.as_secs() as i64),
            supersede: request.supersede.clone().map(|group| Box::new(crate::api::Supersede { group })),
            ..lock_spec(&request.lock, request.mode)
        },
        status: None,
    }
}

/// The spec of a claim for `locks`: one lock name, or several separated by commas (`a,b`),
/// taken together, each in `mode`.
pub fn lock_spec(locks: &str, mode: Mode) -> LockClaimSpec {
    let names: Vec<&str> = locks.split(',').map(str::trim).collect();
    match &names[..] {
        [one] => LockClaimSpec::one(*one, mode),
        several => LockClaimSpec {
            lock_name: None,
            mode: None,
            locks: Some(several.iter().map(|name| LockRef::namespaced(*name, mode)).collect()),
            ..LockClaimSpec::one("", mode)
        },
    }
}

/// The environment variable of lock `name`'s fencing token: `ZKLOCK_FENCING_TOKEN_<NAME>`, the
/// name upper-cased, with `-` and `.` as `_`.
pub fn token_variable(name: &str) -> String {
    let name: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("ZKLOCK_FENCING_TOKEN_{name}")
}

/// The holder pod as the claim's owner, when its UID is known. Not a controller reference, and
/// it does not block the pod's deletion (which would need more RBAC than the claim's own).
fn owner(request: &Request) -> Option<OwnerReference> {
    let (name, uid) = (request.holder_pod.as_ref()?, request.holder_pod_uid.as_ref()?);
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.clone(),
        uid: uid.clone(),
        ..OwnerReference::default()
    })
}

/// Creates the claim and waits until it is Held (or ends, or `interrupt` fires, which withdraws
/// it, also while its create is under way). Progress goes to stderr.
pub async fn acquire(
    client: kube::Client,
    request: &Request,
    interrupt: impl std::future::Future<Output = (&'static str, u8)>,
) -> Result<Held, Failure> {
    let api: Api<LockClaim> = Api::namespaced(client, &request.namespace);
    let request_id = uuid::Uuid::new_v4().simple().to_string();
    let claim = claim_for(request, &request_id);
    let mut interrupt = std::pin::pin!(interrupt);
    let params = PostParams::default();
    let mut create = std::pin::pin!(api.create(&params, &claim));
    let created = tokio::select! {
        created = &mut create => created,
        (signal, code) = &mut interrupt => {
            // The create may reach the API server still: its answer says what to withdraw, and
            // without one the claim is looked up by its name and request id.
            let name = claim.name_any();
            match tokio::time::timeout(WITHDRAW_WAIT, &mut create).await {
                Ok(Ok(created)) => delete(&api, &created.name_any(), &created.uid().unwrap_or_default()).await,
                _ => withdraw_by_request_id(&api, &name, &request_id).await,
            }
            return Err(Failure::Interrupted(signal, code));
        }
    };
    let created = created
        .map_err(|e| Failure::Error(format!("cannot create a LockClaim in namespace {}: {e}", request.namespace)))?;
    let name = created.name_any();
    let uid = created.uid().unwrap_or_default();
    if request.supersede.is_some() && created.spec.supersede.is_none() {
        // The installed CRD predates spec.supersede (revision 8) and pruned it: the claim would
        // queue as a plain one, which is not what was asked.
        delete(&api, &name, &uid).await;
        return Err(Failure::Error(
            "the installed LockClaim CRD does not know spec.supersede (it is older than this zklock's): upgrade \
             zklock's CRDs (`zklock crd | kubectl apply -f -`), or run without --supersede"
                .into(),
        ));
    }
    eprintln!("zklock: LockClaim {}/{name} asks for lock {} ({})", request.namespace, request.lock, request.mode);
    let deadline = request.timeout.map(|t| tokio::time::Instant::now() + t + OPERATOR_SLACK);
    let outcome = tokio::select! {
        outcome = follow(&api, &name, &uid, request.heartbeat) => outcome,
        (signal, code) = &mut interrupt => Err(Failure::Interrupted(signal, code)),
        _ = sleep_until(deadline) => Err(Failure::TimedOut(format!(
            "no answer from the operator within the timeout and {}s more", OPERATOR_SLACK.as_secs()
        ))),
    };
    if outcome.is_err() {
        delete(&api, &name, &uid).await;
    }
    outcome
}

/// Withdraws the claim named `name` if this very request made it (its request id says so).
async fn withdraw_by_request_id(api: &Api<LockClaim>, name: &str, request_id: &str) {
    let found = tokio::time::timeout(WITHDRAW_WAIT, api.get_opt(name)).await;
    match found {
        Ok(Ok(Some(claim))) => {
            let ours = claim.annotations().get(REQUEST_ID_ANNOTATION).is_some_and(|id| id == request_id);
            if ours {
                delete(api, name, &claim.uid().unwrap_or_default()).await;
            }
        }
        Ok(Ok(None)) => {}
        _ => eprintln!(
            "zklock: could not find out whether LockClaim {name} was created; if it was, delete it to release the lock"
        ),
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

/// Tells the caller the lock is held: `ZKLOCK_CLAIM=` and `ZKLOCK_FENCING_TOKEN=` lines (one
/// token line per lock of several) on stdout and into `env_file`, and on stderr what holds it
/// until when. Held, but the caller cannot learn it as asked (stdout closed, the file not
/// writable): the claim is deleted rather than held blind. The answer is the exit code.
pub async fn announce(client: kube::Client, request: &Request, held: &Held, env_file: Option<&std::path::Path>) -> u8 {
    use std::io::Write;
    let mut lines = format!("ZKLOCK_CLAIM={}\nZKLOCK_FENCING_TOKEN={}\n", held.claim, held.fencing_token);
    for (lock, token) in &held.tokens {
        lines.push_str(&format!("{}={token}\n", token_variable(lock)));
    }
    let mut stdout = std::io::stdout().lock();
    let printed = stdout.write_all(lines.as_bytes()).and_then(|()| stdout.flush());
    let written = match env_file {
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
        let api = Api::namespaced(client, &request.namespace);
        delete(&api, &held.claim, &held.uid).await;
        return exit::ERROR;
    }
    let until = match &request.holder_pod {
        Some(pod) => format!("until pod {pod} finishes or the claim is deleted"),
        None => format!("until the claim is deleted: kubectl delete lockclaim -n {} {}", request.namespace, held.claim),
    };
    eprintln!("zklock: holding lock {} (fencing token {}) {until}", request.lock, held.fencing_token);
    0
}

/// Deletes the claim (this very one: a new claim of the same name is not touched); the
/// operator releases its node. Retried with backoff for a while: a claim left behind would
/// hold the lock for nobody.
pub async fn delete(api: &Api<LockClaim>, name: &str, uid: &str) {
    use backon::{ExponentialBuilder, Retryable};
    let only = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
        ..DeleteParams::default()
    };
    let attempt = || async {
        match tokio::time::timeout(Duration::from_secs(5), api.delete(name, &only)).await {
            // Still there (its finalizer waits for an operator), and never served by one.
            Ok(Ok(answer)) => Ok(answer.left().filter(|left| left.status.is_none())),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => Ok(None),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 5s".to_string()),
        }
    };
    let delays = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(3))
        .with_total_delay(Some(WITHDRAW_WAIT))
        .without_max_times();
    let deleted = attempt
        .retry(delays)
        .sleep(tokio::time::sleep)
        .notify(|e, after| eprintln!("zklock: deleting LockClaim {name} failed ({e}); again in {after:?}"))
        .await;
    match deleted {
        Err(e) => eprintln!("zklock: could not delete LockClaim {name} ({e}); delete it to release the lock"),
        Ok(Some(_)) => let_go_if_unserved(api, name, uid).await,
        Ok(None) => {}
    }
}

/// How long a deleted claim no operator ever wrote may wait for one before its creator takes
/// the operator's finalizer off itself.
const UNSERVED_WAIT: Duration = Duration::from_secs(3);

/// A claim this command made carries the operator's finalizer from creation (one API write less
/// for the operator). In a namespace no operator serves, nothing would ever remove it: the
/// deleted claim stayed Terminating for good and held up the namespace's deletion. If it is
/// still there after [`UNSERVED_WAIT`] with no status at all (no operator ever wrote it), the
/// finalizer goes, tested against the copy read: a claim that got a status meanwhile is left to
/// its operator. Safe even if an operator enqueued it without writing yet: a claim that leaves
/// without its finalizer has its node released by the operator's orphan release. Needs `patch`
/// on lockclaims; without it the claim stays, and the message says so.
async fn let_go_if_unserved(api: &Api<LockClaim>, name: &str, uid: &str) {
    tokio::time::sleep(UNSERVED_WAIT).await;
    let Ok(Ok(Some(now))) = tokio::time::timeout(Duration::from_secs(5), api.get_opt(name)).await else { return };
    if now.metadata.uid.as_deref() != Some(uid) || now.status.is_some() {
        return;
    }
    let Some(version) = now.metadata.resource_version.clone() else { return };
    let kept: Vec<String> = now.finalizers().iter().filter(|f| *f != crate::api::FINALIZER).cloned().collect();
    let patch = serde_json::json!([
        { "op": "test", "path": "/metadata/uid", "value": uid },
        { "op": "test", "path": "/metadata/resourceVersion", "value": version },
        { "op": "replace", "path": "/metadata/finalizers", "value": kept },
    ]);
    let Ok(patch) = serde_json::from_value::<json_patch::Patch>(patch) else { return };
    let (params, patch) = (kube::api::PatchParams::default(), kube::api::Patch::Json::<()>(patch));
    match tokio::time::timeout(Duration::from_secs(5), api.patch(name, &params, &patch)).await {
        Ok(Ok(_)) => eprintln!("zklock: no operator served LockClaim {name}; took its finalizer off"),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 || s.code == 422 => {}
        Ok(Err(e)) => eprintln!(
            "zklock: no operator served LockClaim {name}, and its finalizer could not be taken off ({e}): it stays \
             Terminating until an operator serves namespace {} or somebody removes finalizer {}",
            api.namespace().unwrap_or_default(),
            crate::api::FINALIZER
        ),
        Err(_) => eprintln!("zklock: could not take the finalizer off LockClaim {name} (no answer within 5s)"),
    }
}

/// The claim as a watch sees it, or None once it is gone.
pub fn watch(api: &Api<LockClaim>, name: &str) -> impl futures::Stream<Item = Option<LockClaim>> + Send + 'static {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // Whether the listing under way has shown the claim: a watch sends no deletion for a claim
    // deleted while it was down, only a listing without it.
    let mut listed = false;
    watcher(api.clone(), config).default_backoff().filter_map(move |event| {
        let seen = match event {
            Ok(watcher::Event::Apply(c)) => Some(Some(c)),
            Ok(watcher::Event::InitApply(c)) => {
                listed = true;
                Some(Some(c))
            }
            Ok(watcher::Event::Init) => {
                listed = false;
                None
            }
            Ok(watcher::Event::InitDone) => (!listed).then_some(None),
            Ok(watcher::Event::Delete(_)) => Some(None),
            Err(e) => {
                eprintln!("zklock: watching the claim failed ({e}); retrying");
                None
            }
        };
        futures::future::ready(seen)
    })
}

/// Follows the claim until it is Held or ends; says on stderr where it waits when that changes,
/// and every `heartbeat` in any case.
async fn follow(api: &Api<LockClaim>, name: &str, uid: &str, heartbeat: Duration) -> Result<Held, Failure> {
    let mut claims = std::pin::pin!(watch(api, name));
    let mut shown = None;
    let started = tokio::time::Instant::now();
    let heartbeat = heartbeat.min(MAX_HEARTBEAT);
    let mut beat = tokio::time::interval_at(started + heartbeat, heartbeat);
    // The locks it waits for, by label, once the claim has been seen.
    let mut locks: Vec<String> = vec![];
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = LockClaimStatus::default();
    loop {
        let seen = tokio::select! {
            seen = claims.next() => seen,
            _ = beat.tick() => {
                eprintln!("zklock: {}", waiting_line(api, name, &locks, &last, started.elapsed()).await);
                continue;
            }
        };
        let Some(seen) = seen else { break };
        let Some(claim) = seen.filter(|c| c.uid().as_deref() == Some(uid)) else {
            return Err(Failure::Lost(format!("LockClaim {name} was deleted before it was Held")));
        };
        let status = claim.status.clone().unwrap_or_default();
        locks = claim.spec.lock_refs().iter().map(|l| l.label()).collect();
        match status.phase {
            Some(Phase::Held) => {
                let grace = claim.spec.revocation_grace_period_seconds.unwrap_or(30).max(0) as u64;
                let tokens: Vec<(String, String)> = status
                    .locks
                    .iter()
                    .map(|l| (l.lock_name.clone(), l.fencing_token.clone().unwrap_or_default()))
                    .collect();
                let fencing_token = match status.fencing_token {
                    Some(token) => token,
                    None => tokens.iter().map(|(lock, token)| format!("{lock}={token}")).collect::<Vec<_>>().join(","),
                };
                return Ok(Held {
                    claim: name.to_string(),
                    uid: uid.to_string(),
                    fencing_token,
                    tokens,
                    grace: Duration::from_secs(grace),
                });
            }
            Some(phase) if phase.is_terminal() => return Err(ended(name, phase, &status)),
            _ => {}
        }
        let now = (status.phase, status.position, status.waiting_for.clone());
        if shown.as_ref() != Some(&now) {
            match (&now.1, &now.2) {
                (Some(position), Some(ahead)) => {
                    eprintln!("zklock: waiting: {position} ahead, behind {ahead}")
                }
                (Some(position), None) => eprintln!("zklock: waiting: {position} ahead"),
                _ => eprintln!(
                    "zklock: {}",
                    now.0.map_or("not looked at by the operator yet".into(), |p| format!("{p:?}"))
                ),
            }
            shown = Some(now);
        }
        last = status;
    }
    Err(Failure::Error("the claim watch ended".into()))
}

/// The heartbeat's line: how long the wait has lasted and where it stands; the claim ahead
/// with how long it has held; without a status, the command that says what zklock lacks.
async fn waiting_line(
    api: &Api<LockClaim>,
    name: &str,
    locks: &[String],
    status: &LockClaimStatus,
    waited: Duration,
) -> String {
    let waited = crate::durations::brief(waited);
    let namespace = api.namespace().unwrap_or_default().to_string();
    let Some(phase) = status.phase else {
        return format!(
            "still waiting after {waited}: LockClaim {namespace}/{name} has no status yet; \
             `zklock check -n {namespace}` says what zklock lacks"
        );
    };
    let position = status.position.map(|p| format!(", {p} ahead")).unwrap_or_default();
    let ahead = match status.waiting_for.as_deref() {
        Some(ahead) => {
            // A claim of this cluster is named bare; another cluster's, or a foreign client's
            // node, with slashes.
            let held = if ahead.contains('/') {
                String::new()
            } else {
                // Briefly: the watch is not read meanwhile, and a grant must not wait for a line.
                match tokio::time::timeout(HEARTBEAT_READ, api.get_opt(ahead)).await {
                    // A bare name may also be a claim of another namespace (a ClusterLock): the one
                    // here counts only if it queues for one of the same locks.
                    Ok(Ok(Some(c))) if c.spec.lock_refs().iter().any(|l| locks.contains(&l.label())) => c
                        .status
                        .and_then(|s| s.acquired_at)
                        .map(|at| {
                            let held = k8s_openapi::jiff::Timestamp::now().duration_since(at.0);
                            format!(
                                " (Held for {})",
                                crate::durations::brief(Duration::try_from(held).unwrap_or_default())
                            )
                        })
                        .unwrap_or_default(),
                    _ => String::new(),
                }
            };
            format!(", behind {ahead}{held}")
        }
        None => String::new(),
    };
    format!("still waiting after {waited}: {phase:?}{position}{ahead}")
}

/// The failure a final phase means.
pub fn ended(name: &str, phase: Phase, status: &LockClaimStatus) -> Failure {
    let why = conditions::get(&status.conditions, FINISHED).map(|c| c.message.clone()).unwrap_or_default();
    let what = format!("LockClaim {name} ended {phase:?}: {why}");
    match phase {
        Phase::Expired => Failure::TimedOut(what),
        Phase::Revoked => Failure::Revoked(what),
        Phase::Invalid => Failure::Error(what),
        Phase::Superseded => Failure::Superseded(what),
        _ => Failure::Lost(what),
    }
}

/// Whether the claim's holder was asked to let go.
pub fn revoke_requested(claim: &LockClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, REVOKE_REQUESTED))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: Option<&str>, timeout: Option<Duration>) -> Request {
        Request {
            lock: "db-migrations".into(),
            mode: Mode::Shared,
            timeout,
            holder_pod: Some("init-pod".into()),
            holder_pod_uid: None,
            namespace: "shop".into(),
            name: name.map(Into::into),
            grace: None,
            heartbeat: HEARTBEAT,
            supersede: None,
        }
    }

    #[test]
    fn the_claim_asks_for_what_the_flags_say() {
        let claim = claim_for(&request(None, Some(Duration::from_millis(1500))), "r-1");
        let name = claim.metadata.name.clone().expect("named before it is created");
        assert!(name.starts_with("db-migrations-") && name.len() == "db-migrations-".len() + 5, "{name}");
        assert_eq!(claim.annotations().get(REQUEST_ID_ANNOTATION).map(String::as_str), Some("r-1"));
        assert_eq!(claim.spec.acquire_timeout_seconds, Some(2), "rounded up");
        assert_eq!(claim.spec.mode, Some(Mode::Shared));
        assert_eq!(claim.spec.holder.map(|h| h.pod_name).as_deref(), Some("init-pod"));
        let named = claim_for(&request(Some("mine"), None), "r-2");
        assert_eq!((named.metadata.name.as_deref(), named.metadata.generate_name), (Some("mine"), None));
        assert_eq!(named.spec.acquire_timeout_seconds, None);
        assert_eq!(named.metadata.owner_references, None, "no owner without the pod's UID");
        let owned = claim_for(&Request { holder_pod_uid: Some("u-1".into()), ..request(None, None) }, "r-3");
        let owner = &owned.metadata.owner_references.expect("owned by its holder pod")[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Pod", "init-pod", "u-1"));
        assert_eq!((owner.controller, owner.block_owner_deletion), (None, None));
        let long = Request { lock: format!("{}-x", "a".repeat(51)), ..request(None, None) };
        let name = claim_for(&long, "r-4").metadata.name.unwrap();
        assert!(name.starts_with(&format!("{}-", "a".repeat(51))) && name.len() == 57, "{name}");
    }

    #[test]
    fn several_locks_make_one_claim_over_all_and_a_token_variable_each() {
        let claim = claim_for(&Request { lock: "db,search.index".into(), ..request(None, None) }, "r-5");
        assert!(claim.metadata.name.unwrap().starts_with("db-search.index-"));
        let locks: Vec<String> = claim.spec.locks.unwrap().into_iter().map(|l| l.label()).collect();
        assert_eq!(locks, ["db", "search.index"]);
        assert_eq!(claim.spec.lock_name, None);
        assert_eq!(token_variable("search.index-2"), "ZKLOCK_FENCING_TOKEN_SEARCH_INDEX_2");
    }

    #[test]
    fn each_end_has_its_exit_code() {
        let status = LockClaimStatus::default();
        assert_eq!(ended("c", Phase::Expired, &status).code(), exit::TIMED_OUT);
        assert_eq!(ended("c", Phase::Revoked, &status).code(), exit::REVOKED);
        assert_eq!(ended("c", Phase::Lost, &status).code(), exit::LOST);
        assert_eq!(ended("c", Phase::Released, &status).code(), exit::LOST);
        assert_eq!(ended("c", Phase::Invalid, &status).code(), exit::ERROR);
        assert_eq!(ended("c", Phase::Superseded, &status).code(), exit::SUPERSEDED);
    }
}
