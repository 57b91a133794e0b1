//! A new leader's term in the API server (docs/design.md: fencing): before it lists a claim, the leader
//! raises the epoch in force — the parameter of the admission policy of [`crate::api::epoch_policy`]
//! — to its own, and proves the policy enforces it: a dry-run status write carrying the epoch
//! just below its own must be refused. From then on every status write of an earlier term,
//! however late it arrives, is refused by the API server itself; and since the claims are listed
//! only after that, whatever such a write changed before is in the list the leader plans from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde_json::json;
use tokio::sync::watch;

use super::base::{Error, API_TIMEOUT};
use super::numbers::{self, Change, NumbersError};
use crate::api::epoch_policy::{EPOCH_KEY, EPOCH_REFUSAL, PARAM_MISSING};
use crate::api::LockClaim;
use crate::zk::LockEngine;

/// How long the policy may take to see a raised epoch (its parameter is read from an informer
/// of the API server's) before the leader gives up on this term.
const PROPAGATION: Duration = Duration::from_secs(15);

/// Where the epoch in force is kept: a ConfigMap, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochParam {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("{call}: no answer from the Kubernetes API within {API_TIMEOUT:?}")]
    Timeout { call: &'static str },
    #[error("the epoch in force ({found}) is above this leader's ({mine}): a newer leader took over")]
    Deposed { found: i64, mine: i64 },
    #[error("this leader's epoch ({mine}) is no longer the latest in ZooKeeper: a newer leader took over")]
    Superseded { mine: i64 },
    #[error(
        "the admission policy zklock-leader-epoch does not refuse a status of an earlier term in namespace {namespace} \
         (claim {claim}) within {PROPAGATION:?}: install the chart's policy and its binding for this namespace, or \
         run with --no-epoch-policy (see the docs for what that gives up){}",
        last.as_deref().map(|l| format!("; the API server's last answer: {l}")).unwrap_or_default()
    )]
    NotEnforced { namespace: String, claim: String, last: Option<String> },
    #[error("another repair of the epoch parameter is under way")]
    Busy,
    /// The namespace's proof failed (recently): nothing is written there.
    #[error("{0}")]
    Unproven(String),
    /// The namespace's proof is under way.
    #[error("the leader epoch policy is being proven in namespace {0}")]
    Proving(String),
    /// The namespace's proof met an error that tells nothing of the policy (a timeout, the
    /// claim gone): the next reconcile there proves it again.
    #[error("proving the leader epoch policy: {0}")]
    ProofBroken(String),
    #[error("the epoch parameter {0} holds no epoch number")]
    Malformed(String),
    #[error("{0}")]
    ZooKeeper(#[from] crate::zk::Error),
    #[error("{0}")]
    Numbers(#[from] NumbersError),
}

impl From<FenceError> for Error {
    fn from(e: FenceError) -> Self {
        match e {
            FenceError::Deposed { .. } | FenceError::Superseded { .. } => Error::NotLeading,
            FenceError::Busy => Error::EpochParam("being made again by another reconcile".into()),
            FenceError::Unproven(why) => Error::Unfenced(why),
            FenceError::Proving(namespace) => Error::Proving(namespace),
            other => Error::ApiFence(other.to_string()),
        }
    }
}

async fn timed<T>(
    call: &'static str,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, FenceError> {
    tokio::time::timeout(API_TIMEOUT, f).await.map_err(|_| FenceError::Timeout { call })?.map_err(FenceError::Api)
}

/// Raises the epoch in force to `mine`, then proves it is enforced where claims are: in the
/// namespace of a claim of each served scope (each served namespace, or one namespace when all
/// are served). Every namespace not proven here is proven before this term writes a claim
/// status there ([`Fence::ready`]); one where the proof fails fails alone.
pub async fn raise(
    client: &kube::Client,
    fence: &Fence,
    scopes: &[Api<LockClaim>],
    engine: &LockEngine,
) -> Result<(), FenceError> {
    write_epoch(client, &fence.param, engine, fence.mine).await?;
    for scope in scopes {
        match prove(scope, &fence.param, fence.mine).await {
            Ok(Some(namespace)) => fence.note(&namespace, Ok(())),
            Ok(None) => {}
            Err(FenceError::NotEnforced { namespace, claim, last }) => {
                let failed = FenceError::NotEnforced { namespace: namespace.clone(), claim, last };
                tracing::error!(%namespace, error = %failed, "no claim status is written in this namespace");
                fence.note(&namespace, Err(failed.to_string()));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `mine` into the parameter unless a higher epoch is there: only a newer leader's (then
/// this one is deposed), or one from before ZooKeeper's data were made anew (zxids start over
/// then; ZooKeeper's epoch node tells). Every write tests the version read, so two leaders
/// cannot both succeed, and an earlier one's late write cannot lower it.
async fn write_epoch(
    client: &kube::Client,
    param: &EpochParam,
    engine: &LockEngine,
    mine: i64,
) -> Result<(), FenceError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &param.namespace);
    let decide = |current: Option<numbers::Data>| async move {
        let Some(current) = current else {
            // Made with this term's epoch only while it is the latest: a deposed leader's
            // repair of a deleted parameter must not lower the fence below its successor's.
            if !engine.epoch_is_current().await? {
                return Err(FenceError::Superseded { mine });
            }
            return Ok(Change::Write([(EPOCH_KEY.to_string(), mine.to_string())].into()));
        };
        // Rubbish there (somebody else's) is replaced by ours.
        match current.get(EPOCH_KEY).and_then(|f| f.parse::<i64>().ok()) {
            Some(found) if found == mine => Ok(Change::Keep),
            Some(found) if found > mine && !engine.epoch_is_current().await? => {
                Err(FenceError::Deposed { found, mine })
            }
            _ => Ok(Change::Write([(EPOCH_KEY.to_string(), mine.to_string())].into())),
        }
    };
    numbers::change(&api, &param.name, ("get_epoch_param", "raise_epoch_param"), decide).await.map(drop)
}

/// Proves that the policy refuses a status of the term just before `mine`: a dry-run status
/// write on any claim of the scope, repeated until refused (the policy reads its parameter from
/// an informer). Answers the namespace proven, if the scope has a claim.
async fn prove(scope: &Api<LockClaim>, param: &EpochParam, mine: i64) -> Result<Option<String>, FenceError> {
    let listed = timed("list_claims", scope.list_metadata(&ListParams::default().limit(1))).await?;
    let Some(claim) = listed.items.into_iter().next() else { return Ok(None) };
    let (Some(name), Some(namespace)) = (claim.metadata.name, claim.metadata.namespace) else { return Ok(None) };
    let api: Api<LockClaim> = Api::namespaced(scope.clone().into_client(), &namespace);
    match prove_on(&api, param, &name, &namespace, mine).await {
        Ok(()) => Ok(Some(namespace)),
        // Deleted meanwhile: another claim, if any, proves it.
        Err(FenceError::Api(kube::Error::Api(s))) if s.code == 404 => Box::pin(prove(scope, param, mine)).await,
        Err(e) => Err(e),
    }
}

/// The proof on claim `name` of `namespace`: a dry-run status write carrying the epoch below
/// `mine`, repeated until the policy refuses it for its epoch. A refusal for a missing parameter
/// (the API server's informer has not seen the ConfigMap just made) is waited out like an
/// answer that lets the write through.
async fn prove_on(
    api: &Api<LockClaim>,
    param: &EpochParam,
    name: &str,
    namespace: &str,
    mine: i64,
) -> Result<(), FenceError> {
    let probe = json!({ "status": { "leaderEpoch": mine - 1 } });
    let dry_run = PatchParams { dry_run: true, ..PatchParams::default() };
    let deadline = tokio::time::Instant::now() + PROPAGATION;
    let mut pause = Duration::from_millis(20);
    loop {
        let last = match timed("probe_epoch_policy", api.patch_status(name, &dry_run, &Patch::Merge(&probe))).await {
            Err(FenceError::Api(kube::Error::Api(s))) if s.code == 403 && s.message.contains(EPOCH_REFUSAL) => {
                tracing::info!(namespace, epoch = mine, "the API server refuses status writes of earlier terms");
                return Ok(());
            }
            // (422: the API server cannot configure the binding.)
            Err(FenceError::Api(kube::Error::Api(s))) if s.message.contains(PARAM_MISSING) => Some(s.message),
            Err(e) => return Err(e),
            Ok(_) => None,
        };
        if tokio::time::Instant::now() >= deadline {
            let last = match last {
                Some(last) if last.contains(PARAM_MISSING) => Some(explain_missing(api, param, last).await),
                last => last,
            };
            return Err(FenceError::NotEnforced { namespace: namespace.into(), claim: name.into(), last });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// The API server kept answering that the policy's parameter is missing: if it is there, its
/// parameter cache lost it. kube-apiserver (1.36 and before) stops the informer of a built-in
/// parameter kind for good once no binding names that kind for a moment (a `helm uninstall`
/// of the last such policy), and from then on refuses every write the binding matches until it
/// is restarted (kubernetes/kubernetes#130887). Nothing the operator writes mends that: the
/// message says what will.
async fn explain_missing(api: &Api<LockClaim>, param: &EpochParam, last: String) -> String {
    let params: Api<ConfigMap> = Api::namespaced(api.clone().into_client(), &param.namespace);
    match timed("get_epoch_param", params.get_opt(&param.name)).await {
        Ok(Some(_)) => format!(
            "{last} (yet the parameter {}/{} exists: the API server's cache of ConfigMap parameters is stale, \
             kubernetes/kubernetes#130887; restart kube-apiserver)",
            param.namespace, param.name
        ),
        _ => last,
    }
}

/// This term's fence in the API server: the parameter the leader raised, the epoch it raised it
/// to, and the namespaces where the policy was proven to enforce it.
pub struct Fence {
    param: EpochParam,
    mine: i64,
    /// One repair at a time; reconciles that meet the same refusal meanwhile retry later.
    repairing: tokio::sync::Mutex<()>,
    /// Namespace → its proof: done, under way, or failed (why, and when, to try again after a
    /// while). Shared with the proofs running in the background.
    proofs: Arc<parking_lot::Mutex<HashMap<String, Proof>>>,
    /// Claims told (by a Warning event) that their namespace is not served: once each per term.
    warned: parking_lot::Mutex<std::collections::HashSet<String>>,
}

#[derive(Clone)]
enum Proof {
    Done,
    /// Under way: its outcome is sent here (`None` until then).
    Running(watch::Receiver<Option<Result<(), Failure>>>),
    Failed {
        why: String,
        at: tokio::time::Instant,
    },
}

/// How long a namespace where the fence could not be proven waits before the next attempt.
const PROOF_RETRY: Duration = Duration::from_secs(30);
/// How long a reconcile waits for its namespace's proof before it gives its slot up (and is
/// tried again): a covered namespace is proven in milliseconds, one that is not only after
/// [`PROPAGATION`], which must not hold up the claims of other namespaces.
const PROOF_WAIT: Duration = Duration::from_secs(1);

impl Fence {
    pub fn new(param: EpochParam, mine: i64) -> Fence {
        Fence {
            param,
            mine,
            repairing: tokio::sync::Mutex::new(()),
            proofs: Default::default(),
            warned: Default::default(),
        }
    }

    /// True the first time it is asked for claim `uid` in this term.
    pub fn first_warning(&self, uid: &str) -> bool {
        self.warned.lock().insert(uid.to_string())
    }

    /// Records a namespace proven (`Ok`) or proven not to be fenced (`Err`, why).
    fn note(&self, namespace: &str, proof: Result<(), String>) {
        note(&self.proofs, namespace, &proof.map_err(Failure::NotEnforced));
    }

    /// Before this term writes a claim status in `namespace`: the policy must be proven to
    /// refuse earlier terms' statuses there (docs/design.md: fencing). An installation without the policy,
    /// or whose binding does not cover the namespace, used to serve it unfenced until the next
    /// failover found out, and then serve nothing at all. Proven once per namespace and term, on
    /// claim `claim` (a dry-run write), in the background: each namespace on its own, so that
    /// one that cannot be proven (which takes [`PROPAGATION`] to tell) holds up no other. A
    /// namespace where it fails fails alone, with the reason, and is tried again after
    /// [`PROOF_RETRY`].
    pub async fn ready(&self, client: &kube::Client, namespace: &str, claim: &str) -> Result<(), FenceError> {
        let mut outcome = {
            let mut proofs = self.proofs.lock();
            match proofs.get(namespace) {
                Some(Proof::Done) => return Ok(()),
                Some(Proof::Failed { why, at }) if at.elapsed() < PROOF_RETRY => {
                    return Err(FenceError::Unproven(why.clone()));
                }
                Some(Proof::Running(outcome)) => outcome.clone(),
                Some(Proof::Failed { .. }) | None => {
                    let (sender, outcome) = watch::channel(None);
                    proofs.insert(namespace.to_string(), Proof::Running(outcome.clone()));
                    let api: Api<LockClaim> = Api::namespaced(client.clone(), namespace);
                    let (proofs, param, namespace, claim, mine) =
                        (self.proofs.clone(), self.param.clone(), namespace.to_string(), claim.to_string(), self.mine);
                    tokio::spawn(async move {
                        let proved = match prove_on(&api, &param, &claim, &namespace, mine).await {
                            Ok(()) => Ok(()),
                            Err(e @ FenceError::NotEnforced { .. }) => {
                                let why = e.to_string();
                                tracing::error!(%namespace, error = %why, "no claim status is written in this namespace");
                                Err(Failure::NotEnforced(why))
                            }
                            Err(e) => Err(Failure::Broken(e.to_string())),
                        };
                        note(&proofs, &namespace, &proved);
                        sender.send_replace(Some(proved));
                    });
                    outcome
                }
            }
        };
        let proved = match tokio::time::timeout(PROOF_WAIT, outcome.wait_for(Option::is_some)).await {
            Ok(Ok(proved)) => proved.clone(),
            // The proof's task ended without an answer (the runtime is stopping), or it takes
            // longer: this claim is tried again soon.
            Ok(Err(_)) | Err(_) => None,
        };
        match proved {
            Some(Ok(())) => Ok(()),
            Some(Err(Failure::NotEnforced(why))) => Err(FenceError::Unproven(why)),
            Some(Err(Failure::Broken(why))) => Err(FenceError::ProofBroken(why)),
            None => Err(FenceError::Proving(namespace.to_string())),
        }
    }

    /// A status write was refused for a missing parameter: someone deleted the ConfigMap (a
    /// `kubectl delete`, a namespace clean-up), and from then on the API server refuses every
    /// status write, this leader's too, for ever. Makes it again with this term's epoch (or
    /// finds a newer leader's: deposed) and proves the fence again on the refused claim.
    pub async fn repair(
        &self,
        client: &kube::Client,
        engine: &LockEngine,
        claim: &str,
        namespace: &str,
    ) -> Result<(), FenceError> {
        let Ok(_one) = self.repairing.try_lock() else { return Err(FenceError::Busy) };
        tracing::warn!(param = %format!("{}/{}", self.param.namespace, self.param.name), "a status write was refused \
            for a missing epoch parameter; making it again");
        write_epoch(client, &self.param, engine, self.mine).await?;
        let api: Api<LockClaim> = Api::namespaced(client.clone(), namespace);
        prove_on(&api, &self.param, claim, namespace, self.mine).await?;
        self.note(namespace, Ok(()));
        Ok(())
    }
}

/// Why a namespace's proof did not succeed.
#[derive(Clone, Debug)]
enum Failure {
    /// The policy does not refuse an earlier term's status there: not tried again for
    /// [`PROOF_RETRY`].
    NotEnforced(String),
    /// Something else went wrong: the next reconcile tries again.
    Broken(String),
}

/// Records namespace `namespace`'s proof.
fn note(proofs: &parking_lot::Mutex<HashMap<String, Proof>>, namespace: &str, proof: &Result<(), Failure>) {
    let mut proofs = proofs.lock();
    match proof {
        Ok(()) => proofs.insert(namespace.to_string(), Proof::Done),
        Err(Failure::NotEnforced(why)) => {
            proofs.insert(namespace.to_string(), Proof::Failed { why: why.clone(), at: tokio::time::Instant::now() })
        }
        Err(Failure::Broken(_)) => proofs.remove(namespace),
    };
}
