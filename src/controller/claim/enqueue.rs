//! How a claim enters its locks' queues: its `ClusterLock`s must admit its namespace first (a
//! first-time claim only), claims created earlier go first (the creation-order gates, see
//! `admission`), and then every lock at once in one multi-op.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::core::{Selector, SelectorExt};
use kube::{Api, ResourceExt};

use crate::api::{ClusterLock, LockClaim, Phase, ValidSpec};
use crate::controller::admission::Turn;
use crate::controller::base::{ids, Error, Part, Uid};
use crate::controller::context::Context;
use crate::zk::ContenderSpec;

/// How long a claim naming a `ClusterLock` this cluster does not have waits for it to appear
/// (made in the same `kubectl apply`, its watch event may come after the claim's) before it
/// ends Invalid.
const MISSING_GRACE: Duration = Duration::from_secs(30);

/// Whether a claim in a namespace may take the cluster locks its spec names.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// A `ClusterLock` is not in the store yet: look again soon.
    NotYet,
    /// The message of the claim's Invalid condition.
    Refused(String),
}

/// Whether a first-time claim may take its `ClusterLock`s; `Admitted` for any other claim (one
/// queued already, final, being deleted, or naming none).
pub async fn admit_cluster_locks(
    ctx: &Context,
    claim: &LockClaim,
    spec: &ValidSpec,
    parts: &[Part],
    now: Timestamp,
) -> Result<Admission, Error> {
    let phase = claim.status.as_ref().and_then(|s| s.phase);
    if spec.cluster_locks().next().is_none()
        || !matches!(phase, None | Some(Phase::Pending))
        || claim.metadata.deletion_timestamp.is_some()
        || parts.iter().any(|p| ctx.engine.state(&p.id).is_some())
    {
        return Ok(Admission::Admitted);
    }
    // Not queued yet: its ClusterLocks must admit its namespace first.
    let age = claim
        .creation_timestamp()
        .map_or(Duration::ZERO, |t| Duration::try_from(now.duration_since(t.0)).unwrap_or(Duration::ZERO));
    admit(ctx, &claim.namespace().unwrap_or_default(), spec, age).await
}

/// Whether `ClusterLock` `name` (`None`: this cluster has none of that name) admits a claim of
/// namespace `namespace` with labels `labels` (pure).
pub fn admits(
    name: &str,
    lock: Option<&ClusterLock>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    let Some(lock) = lock else {
        return Err(format!(
            "no ClusterLock {name:?} in this cluster: a cluster admin makes it (kubectl get clusterlocks), in every \
             cluster that shares it"
        ));
    };
    let Some(selector) = &lock.spec.namespace_selector else {
        return Err(format!(
            "ClusterLock {name:?} admits no namespace: it has no spec.namespaceSelector (a cluster admin gives one, \
             {{}} for every namespace)"
        ));
    };
    let selector = Selector::try_from(selector.clone()).map_err(|e| {
        format!("ClusterLock {name:?} has a spec.namespaceSelector that cannot be read ({e}): a cluster admin fixes it")
    })?;
    if selector.matches(labels) {
        Ok(())
    } else {
        Err(format!(
            "ClusterLock {name:?} does not admit namespace {namespace:?}: its spec.namespaceSelector does not select \
             it (kubectl get clusterlock {name} -o yaml)"
        ))
    }
}

/// Whether the claim `spec` of `namespace`, created `age` ago, may take its cluster locks: each
/// must exist in this cluster and select the namespace.
async fn admit(ctx: &Context, namespace: &str, spec: &ValidSpec, age: Duration) -> Result<Admission, Error> {
    let names: Vec<&str> = spec.cluster_locks().collect();
    if names.is_empty() {
        return Ok(Admission::Admitted);
    }
    let locks: Vec<Option<Arc<ClusterLock>>> = names.iter().map(|name| ctx.stores.cluster_lock(name)).collect();
    if locks.iter().any(Option::is_none) && age < MISSING_GRACE {
        return Ok(Admission::NotYet);
    }
    let namespaces: Api<Namespace> = Api::all(ctx.writer.client().clone());
    let found = ctx
        .writer
        .read("get_namespace", namespaces.get_opt(namespace))
        .await?
        .map_err(|source| Error::Write { call: "get namespace", source })?;
    let labels = found.map(|n| n.labels().clone()).unwrap_or_default();
    for (name, lock) in names.iter().zip(&locks) {
        if let Err(message) = admits(name, lock.as_deref(), namespace, &labels) {
            return Ok(Admission::Refused(message));
        }
    }
    Ok(Admission::Admitted)
}

/// Enqueues the claim in every lock at once, unless a claim created earlier is to enter first:
/// then how long to wait at the gate at most (it asks for this one when it leaves the gate).
pub async fn enqueue(ctx: &Context, uid: &Uid, claim: &LockClaim, parts: &[Part]) -> Result<Option<Duration>, Error> {
    let created = claim.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
    let (turn, overtaken) = ctx.registry.may_enqueue(uid, created);
    ctx.metrics.count_overtaken(&overtaken);
    if let Turn::Behind(wait) = turn {
        return Ok(Some(wait));
    }
    let description = ids::describe_claim(&ctx.layout, &claim.namespace().unwrap_or_default(), &claim.name_any());
    let specs = parts
        .iter()
        .map(|p| ContenderSpec {
            id: p.id.clone(),
            lock: p.lock.clone(),
            mode: p.mode,
            description: description.clone(),
        })
        .collect();
    // Every lock at once (one multi-op): two claims stand in the same order in every lock
    // they share, so no cycle of waiting can form (docs/user-guide.md: several locks).
    let enqueued = ctx.engine.enqueue_group(specs).await;
    leave_gates(ctx, uid);
    enqueued?;
    Ok(None)
}

/// The claim leaves the creation-order gates: the claims behind it there are asked for.
pub fn leave_gates(ctx: &Context, uid: &Uid) {
    for next in ctx.registry.leave_gates(uid) {
        ctx.trigger(&next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster_lock(selector: Option<serde_json::Value>) -> ClusterLock {
        let mut spec = json!({});
        if let Some(selector) = selector {
            spec["namespaceSelector"] = selector;
        }
        serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "ClusterLock", "metadata": { "name": "pay" }, "spec": spec,
        }))
        .unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_namespace_is_admitted_only_by_a_selector_that_selects_it() {
        let payments = labels(&[("team", "payments"), ("kubernetes.io/metadata.name", "pay")]);
        assert_eq!(admits("pay", Some(&cluster_lock(Some(json!({})))), "pay", &payments), Ok(()), "{{}}: every one");
        let team = cluster_lock(Some(json!({ "matchLabels": { "team": "payments" } })));
        assert_eq!(admits("pay", Some(&team), "pay", &payments), Ok(()));
        let err = admits("pay", Some(&team), "shop", &labels(&[("team", "shop")])).unwrap_err();
        assert!(err.contains("ClusterLock \"pay\" does not admit namespace \"shop\""), "{err}");
        let err = admits("pay", Some(&cluster_lock(None)), "pay", &payments).unwrap_err();
        assert!(err.contains("admits no namespace"), "{err}");
        let err = admits("pay", None, "pay", &payments).unwrap_err();
        assert!(err.contains("no ClusterLock \"pay\" in this cluster"), "{err}");
        let odd =
            cluster_lock(Some(json!({ "matchExpressions": [{ "key": "team", "operator": "Near", "values": ["x"] }] })));
        let err = admits("pay", Some(&odd), "pay", &payments).unwrap_err();
        assert!(err.contains("cannot be read"), "{err}");
        let not_in = cluster_lock(Some(
            json!({ "matchExpressions": [{ "key": "team", "operator": "NotIn", "values": ["shop"] }] }),
        ));
        assert_eq!(admits("pay", Some(&not_in), "pay", &payments), Ok(()));
    }
}
