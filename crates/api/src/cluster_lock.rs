// kube-derive takes one `printcolumn(...)` per column; clippy reads the repeated `type_ = ...`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::core::{Selector, SelectorExt};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A lock every selected namespace of this cluster may claim, and every cluster whose operators
/// name the same shared ZooKeeper root (docs/user-guide.md: locks across clusters). Cluster-scoped,
/// made by a cluster admin, as a `ClusterRole` is; the claims name it with `clusterLockName`.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "zklock.io",
    version = "v1alpha1",
    kind = "ClusterLock",
    derive = "PartialEq",
    category = "zklock",
    shortname = "clk",
    status = "ClusterLockStatus",
    doc = "ClusterLock is a zklock lock shared by namespaces, and by every cluster whose operators name the same shared ZooKeeper root; claims name it by clusterLockName.",
    printcolumn(name = "Permits", type_ = "integer", json_path = ".spec.permits"),
    printcolumn(name = "Held", type_ = "integer", json_path = ".status.held"),
    printcolumn(name = "Queue", type_ = "integer", json_path = ".status.queueLength"),
    printcolumn(name = "Clusters", type_ = "string", json_path = ".status.clusters"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLockSpec {
    /// Which namespaces of this cluster may claim the lock: `{}` selects every namespace;
    /// without it, none may (a claim from a namespace not selected ends Invalid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// How many claims may hold the lock at once, across every cluster that shares it (every
    /// cluster's ClusterLock should say the same: each grants as the smallest allows, and the
    /// PermitsAgree condition tells). Without it, a mutex (Exclusive and Shared claims).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub permits: Option<u32>,
    /// `Enforced`: objects labelled `zklock.io/fenced-by-cluster-lock: <this lock>` (in any
    /// namespace, or cluster-scoped) accept a write only with the fencing token of a hold in
    /// force granted in this cluster, never lower than the last they accepted. Default `Off`.
    #[serde(default, skip_serializing_if = "crate::Fencing::is_off")]
    pub fencing: crate::Fencing,
}

/// What the operator last saw of the lock's queue, in every cluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLockStatus {
    /// Contenders holding the lock now.
    #[serde(default)]
    pub held: u32,
    /// The holders, wherever they are (at most 50 are named), oldest grant first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<ClusterLockHolder>,
    /// Contenders queued and not holding, in every cluster.
    #[serde(default)]
    pub queue_length: u32,
    /// The clusters whose operators serve the lock now (they declare its permits), and any
    /// with a contender in the queue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    /// `Ready`: this cluster serves the lock; `PermitsAgree`: every cluster sharing it declares
    /// the same permits (when not, each grants as the smallest allows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One holder of a cluster lock.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLockHolder {
    /// The holder's cluster (its operator's --cluster-name); empty for a client other than zklock.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The claim, or for a client other than zklock its znode.
    pub claim: String,
    /// The holder's fencing token, for the holders of the cluster whose operator wrote this
    /// status (the others' are in their own cluster's claims).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<String>,
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
