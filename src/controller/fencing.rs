//! The operator's half of fencing enforced where the work lands (docs/design.md: "Beyond the
//! lock", 1; `crate::api::fencing_policy` is the API server's half): before a grant of a lock
//! whose fencing is `Enforced` is written `Held`, the lock's holds in force are written into the
//! policy's parameter, and the API server is seen judging by them — a dry-run create carrying the
//! new token admitted, one carrying a token no hold has refused. So from the moment the new
//! holder may start, every hold that ended before its grant is refused on every object the lock
//! guards, however late its write arrives.
//!
//! Why the holds in force and not only "never lower than the last accepted": a stale holder's
//! write that lands before the next holder's first write would pass that rule (Kleppmann's
//! limit); with the parameter, it is refused from the grant on. Why on the handoff's path: the
//! next holder's start must follow the refusal of the last one's token, and only this write
//! and its proof order them (per grant of a fenced lock: a read and a write of the parameter,
//! two dry-run creates or more while the API server's informer catches up; unfenced locks pay
//! a store lookup).
//!
//! The parameter's writes are tested against the version read (`numbers::change`), and carry
//! the writing term's leader epoch (`_epoch`): a term that finds a later epoch there writes
//! nothing, so a deposed leader's late write cannot put back a token a newer term took out, nor
//! drop a holder a newer term granted. Which holds are in force is the registry's last written
//! phase of each recorded holder (its own writes, or the API's copy at a term's start). A lock
//! turned `Off`, or deleted, is disarmed: its holds are taken out, so the objects it guarded
//! accept nobody until the label goes (fail closed).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::Api;
use parking_lot::Mutex;
use serde_json::json;

use super::base::{part_tokens, Error, Part, API_TIMEOUT};
use super::numbers::{self, Change, Data};
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
/// How long a namespace where the policy was found missing fails its fenced grants at once,
/// instead of each waiting out [`PROPAGATION`] in a reconcile slot.
const UNPROVEN_MEMORY: Duration = Duration::from_secs(30);
/// The key of the leader epoch of the parameter's last writer.
const EPOCH_KEY: &str = "_epoch";
/// The longest label value: a lock of a longer name cannot guard anything.
const MAX_LABEL_VALUE: usize = 63;

/// Where one installation keeps its fencing parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencingParam {
    /// The parameter of `Lock`s, in each namespace that has fenced locks.
    pub name: String,
    /// The operator's namespace: the parameter of `ClusterLock`s is there.
    pub namespace: String,
}

/// One term's fencing.
pub struct Fencing {
    param: FencingParam,
    /// This term's leader epoch (`None`: an operator without leader election).
    epoch: Option<i64>,
    /// (Claim namespace, label) → when and why the policy was last found not judging there.
    unproven: Mutex<HashMap<Seen, (Instant, String)>>,
    /// The locks whose parameter this term wrote: turned `Off` or deleted, they are disarmed.
    armed: Mutex<HashSet<Place>>,
    /// Claims told (by a Warning event) why their fenced grant waits.
    warned: Mutex<HashSet<String>>,
}

/// A namespace where the policy of a label was judged (or found missing).
type Seen = (String, &'static str);

/// Where a lock's holds in force are kept: the parameter's namespace and name, the label that
/// guards objects by the lock, and the key (the label's value).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Place {
    namespace: String,
    param: String,
    label: &'static str,
    key: String,
}

impl Fencing {
    pub fn new(param: FencingParam, epoch: Option<i64>) -> Self {
        Fencing {
            param,
            epoch,
            unproven: Mutex::new(HashMap::new()),
            armed: Mutex::new(HashSet::new()),
            warned: Mutex::new(HashSet::new()),
        }
    }

    /// Whether claim `uid` is to be told why its grant waits (once per term).
    pub fn first_warning(&self, uid: &str) -> bool {
        self.warned.lock().insert(uid.to_string())
    }

    /// Where lock `name` (a `ClusterLock` when `namespace` is `None`) keeps its holds.
    fn place(&self, namespace: Option<&str>, name: &str) -> Place {
        match namespace {
            None => Place {
                namespace: self.param.namespace.clone(),
                param: cluster_fencing_param(&self.param.name),
                label: FENCED_BY_CLUSTER_LOCK,
                key: name.to_string(),
            },
            Some(namespace) => Place {
                namespace: namespace.to_string(),
                param: self.param.name.clone(),
                label: FENCED_BY,
                key: name.to_string(),
            },
        }
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
            let (enforcement, place) = match part.name.strip_prefix(CLUSTER_LABEL_PREFIX) {
                Some(name) => (stores.cluster_lock(name).map(|l| l.spec.fencing), self.place(None, name)),
                None => (
                    stores.lock(namespace, &part.name).map(|l| l.spec.fencing),
                    self.place(Some(namespace), &part.name),
                ),
            };
            if enforcement != Some(Enforcement::Enforced) {
                continue;
            }
            if place.key.len() > MAX_LABEL_VALUE {
                return Err(Error::FencingUnproven(format!(
                    "lock {} enforces fencing, but its name is longer than {MAX_LABEL_VALUE} characters and cannot be \
                     the value of label {} on the objects it would guard: set its spec.fencing to Off, or use a \
                     shorter name",
                    part.name, place.label
                )));
            }
            let Some(token) = token else {
                return Err(Error::FencingUnproven(format!(
                    "the grant of lock {} carries no fencing token",
                    part.name
                )));
            };
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &place.namespace);
            self.armed.lock().insert(place.clone());
            write(&api, &place, self.epoch, |recorded| {
                let mut holders: Vec<(String, i64)> = recorded
                    .into_iter()
                    .filter(|(holder, _)| holder != uid && registry.known_phase(holder) == Some(Phase::Held))
                    .collect();
                holders.push((uid.to_string(), token));
                holders
            })
            .await?;
            self.prove(&Api::namespaced(client.clone(), namespace), namespace, &place, token).await?;
        }
        Ok(())
    }

    /// Lock `name` (a `ClusterLock` when `namespace` is `None`) enforces fencing no more, or is
    /// gone: if this term wrote its holds, they are taken out (in the background), so that
    /// objects still labelled with it accept nobody rather than the holds last listed.
    pub fn disarm(&self, client: &kube::Client, namespace: Option<&str>, name: &str) {
        let place = self.place(namespace, name);
        if !self.armed.lock().remove(&place) {
            return;
        }
        let (client, epoch) = (client.clone(), self.epoch);
        tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::namespaced(client, &place.namespace);
            match write(&api, &place, epoch, |_| vec![]).await {
                Ok(()) => {
                    tracing::info!(lock = %place.key, "fencing off: its holds taken out of the fencing parameter")
                }
                Err(e) => tracing::warn!(
                    lock = %place.key, error = %e,
                    "fencing off, but its holds could not be taken out of the fencing parameter: objects labelled \
                     with it keep accepting them until the key is removed from ConfigMap {}/{}",
                    place.namespace, place.param
                ),
            }
        });
    }

    /// Waits until the API server judges writes of the lock's objects by the parameter just
    /// written: a dry-run create in `namespace` (the claim's: served, so covered by the
    /// bindings, where the ClusterLocks' parameter's namespace may not be) carrying the new
    /// token is admitted, and one carrying a token no hold has (0) is refused by the policy —
    /// both every time, so that a policy or binding that is missing, or was deleted since, is
    /// never taken for one that admits.
    async fn prove(&self, api: &Api<ConfigMap>, namespace: &str, place: &Place, token: i64) -> Result<(), Error> {
        let seen = (namespace.to_string(), place.label);
        if let Some((at, why)) = self.unproven.lock().get(&seen).cloned() {
            if at.elapsed() < UNPROVEN_MEMORY {
                return Err(Error::FencingUnproven(why));
            }
        }
        let deadline = Instant::now() + PROPAGATION;
        let mut pause = Duration::from_millis(5);
        loop {
            let (none, new) = tokio::join!(probe(api, place, 0), probe(api, place, token));
            let (none, new) = (none?, new?);
            let enforced = matches!(&none, Err(message) if message.contains(FENCING_REFUSAL));
            if enforced && new.is_ok() {
                self.unproven.lock().remove(&seen);
                return Ok(());
            }
            if Instant::now() > deadline {
                let why = if enforced {
                    format!(
                        "the API server did not judge by lock {}'s new fencing token {token} within {PROPAGATION:?} \
                         (its last answer: {}); the grant waits",
                        place.key,
                        new.err().unwrap_or_default()
                    )
                } else {
                    let answer = none.err().unwrap_or_else(|| "a token no hold has was admitted".to_string());
                    let why = format!(
                        "lock {} enforces fencing, but the API server does not judge the writes of the objects it \
                         guards in namespace {namespace} ({answer}): install the chart's fencing policies \
                         (fencing.admissionPolicy=true) and their bindings for this namespace, or print them with \
                         `zklock admin fencing-policy`",
                        place.key
                    );
                    self.unproven.lock().insert(seen, (Instant::now(), why.clone()));
                    why
                };
                return Err(Error::FencingUnproven(why));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// Writes the holds of `place` as `holders` says from those recorded, with `epoch`; nothing
/// when a later term wrote last (`Error::NotLeading`).
async fn write(
    api: &Api<ConfigMap>,
    place: &Place,
    epoch: Option<i64>,
    mut holders: impl FnMut(Vec<(String, i64)>) -> Vec<(String, i64)>,
) -> Result<(), Error> {
    let (tokens_key, holders_key) = (place.key.clone(), holders_key(&place.key));
    numbers::change(api, &place.param, ("get_fencing_param", "write_fencing_param"), |data| {
        let data = data.unwrap_or_default();
        let change = decide(&data, epoch, (&tokens_key, &holders_key), &mut holders);
        std::future::ready(change)
    })
    .await?;
    Ok(())
}

/// What to write into a parameter holding `data`: `keys` (the lock's tokens, its holders) as
/// `holders` makes them from those recorded, and `epoch`; refused when the epoch found is later.
fn decide(
    data: &Data,
    epoch: Option<i64>,
    (tokens_key, holders_key): (&str, &str),
    holders: &mut impl FnMut(Vec<(String, i64)>) -> Vec<(String, i64)>,
) -> Result<Change, Error> {
    let found = data.get(EPOCH_KEY).and_then(|e| e.trim().parse::<i64>().ok());
    if let (Some(found), Some(mine)) = (found, epoch) {
        if found > mine {
            // A newer leader's term wrote it: what this term knows of the holds is older.
            return Err(Error::NotLeading);
        }
    }
    let recorded = data.get(holders_key).map(|v| parse_holders(v)).unwrap_or_default();
    let holders = holders(recorded);
    let tokens = tokens_value(holders.iter().map(|(_, token)| *token));
    let holders = holders_value(&holders);
    let mut write = Data::new();
    if data.get(tokens_key) != Some(&tokens) {
        write.insert(tokens_key.to_string(), tokens);
    }
    if data.get(holders_key) != Some(&holders) {
        write.insert(holders_key.to_string(), holders);
    }
    if write.is_empty() {
        return Ok(Change::Keep);
    }
    if let Some(mine) = epoch.filter(|mine| found.is_none_or(|found| found < *mine)) {
        write.insert(EPOCH_KEY.to_string(), mine.to_string());
    }
    Ok(Change::Write(write))
}

/// A dry-run create of an object guarded by the lock of `place`, carrying `token`, named by the
/// API server (no object of the namespace can collide with it): `Ok(Ok(()))` admitted,
/// `Ok(Err(message))` refused by the API server.
async fn probe(api: &Api<ConfigMap>, place: &Place, token: i64) -> Result<Result<(), String>, Error> {
    let probe: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "generateName": "zklock-fencing-probe-",
            "labels": { place.label: place.key },
            "annotations": { FENCING_TOKEN: token.to_string() },
        },
    }))
    .map_err(|e| Error::FencingUnproven(format!("the probe of lock {}: {e}", place.key)))?;
    let params = PostParams { dry_run: true, ..PostParams::default() };
    let call = "dry_run_fencing_probe";
    match tokio::time::timeout(API_TIMEOUT, api.create(&params, &probe)).await {
        Err(_) => Err(Error::Timeout { call }),
        Ok(Ok(_)) => Ok(Ok(())),
        Ok(Err(kube::Error::Api(status))) if matches!(status.code, 400 | 403 | 422) => Ok(Err(status.message)),
        Ok(Err(source)) => Err(Error::Write { call, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holders(
        keep: &'static [&'static str],
        add: (&'static str, i64),
    ) -> impl FnMut(Vec<(String, i64)>) -> Vec<(String, i64)> {
        move |recorded| {
            let mut h: Vec<(String, i64)> =
                recorded.into_iter().filter(|(u, _)| u != add.0 && keep.contains(&u.as_str())).collect();
            h.push((add.0.to_string(), add.1));
            h
        }
    }

    #[test]
    fn a_grant_lists_the_holders_still_held_and_itself_with_its_terms_epoch() {
        let data: Data = [("db".into(), ",5,7,".into()), ("_holders.db".into(), "a=5 b=7".into())].into();
        let Ok(Change::Write(written)) = decide(&data, Some(3), ("db", "_holders.db"), &mut holders(&["b"], ("c", 9)))
        else {
            panic!("a write")
        };
        assert_eq!(written.get("db").map(String::as_str), Some(",7,9,"), "a's hold ended: out");
        assert_eq!(written.get("_holders.db").map(String::as_str), Some("b=7 c=9"));
        assert_eq!(written.get(EPOCH_KEY).map(String::as_str), Some("3"));
    }

    #[test]
    fn a_term_that_finds_a_later_epoch_writes_nothing() {
        // A deposed leader's late grant must neither put back an ended token nor drop the
        // newer term's holder.
        let data: Data =
            [("db".into(), ",9,".into()), ("_holders.db".into(), "b=9".into()), (EPOCH_KEY.into(), "4".into())].into();
        let answer = decide(&data, Some(3), ("db", "_holders.db"), &mut holders(&[], ("a", 5)));
        assert!(matches!(answer, Err(Error::NotLeading)), "{answer:?}");
        let again = decide(&data, Some(4), ("db", "_holders.db"), &mut holders(&["b"], ("b", 9)));
        assert!(matches!(again, Ok(Change::Keep)), "the same holds: nothing to write");
    }

    #[test]
    fn a_lock_disarmed_lists_no_hold() {
        let data: Data = [("db".into(), ",9,".into()), ("_holders.db".into(), "b=9".into())].into();
        let Ok(Change::Write(written)) = decide(&data, None, ("db", "_holders.db"), &mut |_| vec![]) else {
            panic!("a write")
        };
        assert_eq!(written.get("db").map(String::as_str), Some(","), "every token refused");
        assert_eq!(written.get(EPOCH_KEY), None, "no epoch without leader election");
    }
}
