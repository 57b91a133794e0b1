//! The operator's half of fencing enforced where the work lands (docs/design.md: "Beyond the
//! lock", 1; `crate::api::fencing_policy` is the API server's half): before a grant of a lock
//! whose fencing is `Enforced` is written `Held`, the lock's holds in force are written into the
//! policy's parameter, and the API server is seen judging by them — a dry-run write carrying the
//! new token admitted. So from the moment the new holder may start, every hold that ended before
//! its grant is refused on every object the lock guards, however late its write arrives.
//!
//! Why the holds in force and not only "never lower than the last accepted": a stale holder's
//! write that lands before the next holder's first write would pass that rule (Kleppmann's
//! limit); with the parameter, it is refused from the grant on. Why on the handoff's path: the
//! next holder's start must follow the refusal of the last one's token, and only this write
//! and its proof order them (one parameter write and one or two dry-run creates per grant of a fenced
//! lock; unfenced locks pay nothing).
//!
//! The parameter is written tested against the version read (`numbers::change`): a deposed
//! leader's late write cannot put back a token a newer term took out. Which holds are in force
//! is the registry's last written phase of each recorded holder (its own writes, or the API's
//! copy at a term's start): a holder ended since is left out, a holder still `Held` kept.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::Api;
use serde_json::json;

use super::base::{part_tokens, Error, Part, API_TIMEOUT};
use super::numbers::{self, Change};
use super::registry::Registry;
use super::stores::Stores;
use crate::api::fencing_policy::{
    cluster_fencing_param, holders_key, holders_value, parse_holders, tokens_value, FENCED_BY, FENCED_BY_CLUSTER_LOCK,
    FENCING_REFUSAL, FENCING_TOKEN,
};
use crate::api::{Fencing as Enforcement, LockClaimStatus, Phase, CLUSTER_LABEL_PREFIX};

/// How long the API server may take to judge by a new parameter (it reads parameters from an
/// informer) before the grant is given up on for now (and tried again).
const PROPAGATION: Duration = Duration::from_secs(15);

/// Where one installation keeps its fencing parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencingParam {
    /// The parameter of `Lock`s, in each namespace that has fenced locks.
    pub name: String,
    /// The operator's namespace: the parameter of `ClusterLock`s is there.
    pub namespace: String,
}

/// One term's fencing: where the parameters are, and the parameters seen enforcing.
pub struct Fencing {
    param: FencingParam,
    /// (Namespace, label) whose policy was seen refusing a token not in force in this term: a
    /// missing policy or binding is found once, not taken for a proof.
    enforced: Mutex<HashSet<(String, &'static str)>>,
}

/// One fenced part of a grant: where its parameter is, what it is keyed by, and its token.
struct Guarded {
    namespace: String,
    param: String,
    label: &'static str,
    key: String,
    token: i64,
}

impl Fencing {
    pub fn new(param: FencingParam) -> Self {
        Fencing { param, enforced: Mutex::new(HashSet::new()) }
    }

    /// Before claim `uid` of `namespace` is written `Held` with `status`: for each of its locks
    /// whose fencing is enforced, the parameter lists the holds in force with this grant among
    /// them, and the API server judges by it.
    pub async fn grant(
        &self,
        (client, stores, registry): (&kube::Client, &Stores, &Registry),
        uid: &str,
        namespace: &str,
        parts: &[Part],
        status: &LockClaimStatus,
    ) -> Result<(), Error> {
        for (part, token) in parts.iter().zip(part_tokens(status, parts)) {
            let Some(guarded) = self.guarded(stores, namespace, part, token) else { continue };
            let guarded = guarded?;
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &guarded.namespace);
            self.write(registry, &api, uid, &guarded).await?;
            self.prove(&Api::namespaced(client.clone(), namespace), namespace, &guarded).await?;
        }
        Ok(())
    }

    /// The part's fencing, if its lock's object enforces it (`None`: not fenced).
    fn guarded(
        &self,
        stores: &Stores,
        namespace: &str,
        part: &Part,
        token: Option<i64>,
    ) -> Option<Result<Guarded, Error>> {
        let (enforcement, guarded) = match part.name.strip_prefix(CLUSTER_LABEL_PREFIX) {
            Some(name) => (
                stores.cluster_lock(name)?.spec.fencing,
                Guarded {
                    namespace: self.param.namespace.clone(),
                    param: cluster_fencing_param(&self.param.name),
                    label: FENCED_BY_CLUSTER_LOCK,
                    key: name.to_string(),
                    token: 0,
                },
            ),
            None => (
                stores.lock(namespace, &part.name)?.spec.fencing,
                Guarded {
                    namespace: namespace.to_string(),
                    param: self.param.name.clone(),
                    label: FENCED_BY,
                    key: part.name.clone(),
                    token: 0,
                },
            ),
        };
        if enforcement != Enforcement::Enforced {
            return None;
        }
        Some(match token {
            Some(token) => Ok(Guarded { token, ..guarded }),
            None => Err(Error::FencingUnproven(format!("the grant of lock {} carries no fencing token", part.name))),
        })
    }

    /// The lock's holds in force, written: those recorded before that are still `Held` in the
    /// registry, and this grant.
    async fn write(
        &self,
        registry: &Registry,
        api: &Api<ConfigMap>,
        uid: &str,
        guarded: &Guarded,
    ) -> Result<(), Error> {
        let (tokens_key, holders_key) = (guarded.key.clone(), holders_key(&guarded.key));
        numbers::change(api, &guarded.param, ("get_fencing_param", "write_fencing_param"), |data| {
            let data = data.unwrap_or_default();
            let recorded = data.get(&holders_key).map(|v| parse_holders(v)).unwrap_or_default();
            let mut holders: Vec<(String, i64)> = recorded
                .into_iter()
                .filter(|(holder, _)| holder != uid && registry.known_phase(holder) == Some(Phase::Held))
                .collect();
            holders.push((uid.to_string(), guarded.token));
            let tokens = tokens_value(holders.iter().map(|(_, token)| *token));
            let holders = holders_value(&holders);
            let change = if data.get(&tokens_key) == Some(&tokens) && data.get(&holders_key) == Some(&holders) {
                Change::Keep
            } else {
                Change::Write([(tokens_key.clone(), tokens), (holders_key.clone(), holders)].into())
            };
            std::future::ready(Ok::<_, Error>(change))
        })
        .await?;
        Ok(())
    }

    /// Waits until the API server judges writes of the lock's objects by the parameter just
    /// written: a dry-run write carrying the new token is admitted (`api`: the claim's
    /// namespace's ConfigMaps). The first time in a term for
    /// a parameter, a dry-run carrying a token no hold can have (0) must be refused, so that a
    /// policy or binding that is missing is not taken for one that admits.
    async fn prove(&self, api: &Api<ConfigMap>, namespace: &str, guarded: &Guarded) -> Result<(), Error> {
        let place = (namespace.to_string(), guarded.label);
        let lock = &guarded.key;
        let deadline = Instant::now() + PROPAGATION;
        let mut pause = Duration::from_millis(5);
        let enforced = self.enforced.lock().map(|seen| seen.contains(&place)).unwrap_or(false);
        if !enforced {
            loop {
                match self.probe(api, guarded, 0).await? {
                    Err(message) if message.contains(FENCING_REFUSAL) => break,
                    answer => {
                        if Instant::now() > deadline {
                            let answer = match answer {
                                Ok(()) => "a token no hold has was admitted".to_string(),
                                Err(message) => message,
                            };
                            return Err(Error::FencingUnproven(format!(
                                "lock {lock} enforces fencing, but the API server does not judge the writes of the \
                                 objects it guards in namespace {namespace} ({answer}): install the chart's fencing policies \
                                 (fencing.admissionPolicy=true) and their bindings for this namespace, or print them \
                                 with `zklock admin fencing-policy`"
                            )));
                        }
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            if let Ok(mut seen) = self.enforced.lock() {
                seen.insert(place);
            }
        }
        let mut pause = Duration::from_millis(5);
        loop {
            let last = match self.probe(api, guarded, guarded.token).await? {
                Ok(()) => return Ok(()),
                Err(message) => message,
            };
            if Instant::now() > deadline {
                return Err(Error::FencingUnproven(format!(
                    "the API server did not judge by lock {lock}'s new fencing token {} within {PROPAGATION:?} (its \
                     last answer: {last}); the grant waits",
                    guarded.token
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// A dry-run create of an object guarded by the lock, carrying `token`, in the claim's
    /// namespace (served, so covered by the bindings; the ClusterLocks' parameter lives in the
    /// operator's namespace, which may not be): `Ok(Ok(()))` admitted, `Ok(Err(message))`
    /// refused by the API server.
    async fn probe(&self, api: &Api<ConfigMap>, guarded: &Guarded, token: i64) -> Result<Result<(), String>, Error> {
        let probe: ConfigMap = serde_json::from_value(json!({
            "metadata": {
                "name": format!("{}-probe", self.param.name),
                "labels": { guarded.label: guarded.key },
                "annotations": { FENCING_TOKEN: token.to_string() },
            },
        }))
        .map_err(|e| Error::FencingUnproven(format!("the probe of lock {}: {e}", guarded.key)))?;
        let params = PostParams { dry_run: true, ..PostParams::default() };
        let call = "dry_run_fencing_probe";
        match tokio::time::timeout(API_TIMEOUT, api.create(&params, &probe)).await {
            Err(_) => Err(Error::Timeout { call }),
            Ok(Ok(_)) => Ok(Ok(())),
            // (409: a probe of that name stands — somebody made one for real; it tells nothing.)
            Ok(Err(kube::Error::Api(status))) if matches!(status.code, 400 | 403 | 409 | 422) => {
                Ok(Err(status.message))
            }
            Ok(Err(source)) => Err(Error::Write { call, source }),
        }
    }
}
