//! A gated pod as the operator keeps it between reconciles: what it reads of the pod and
//! nothing else, because the watch of unscheduled pods stores every one of them.

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;

/// The pod condition the operator writes: True once the lock was granted and the gate removed.
pub const CONDITION: &str = "zklock.io/LockAcquired";

/// Pod annotations the operator reads all start with this; no other annotation is kept.
const OWN_ANNOTATIONS: &str = "zklock.io/";

#[derive(Resource, Clone, Debug, PartialEq, Deserialize)]
#[resource(inherit = "Pod")]
#[serde(from = "Pod")]
pub struct KeptPod {
    /// Identity, resourceVersion, creation and deletion times, and the `zklock.io/` annotations.
    pub metadata: ObjectMeta,
    /// `spec.schedulingGates`' names, in order (a gate is removed by its index).
    pub gates: Vec<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// The operator's condition on the pod, if it has written one.
    pub condition: Option<PodCondition>,
}

impl From<Pod> for KeptPod {
    fn from(pod: Pod) -> Self {
        let Pod { metadata, spec, status } = pod;
        let annotations = metadata
            .annotations
            .map(|a| {
                a.into_iter()
                    .filter(|(k, _)| k.starts_with(OWN_ANNOTATIONS))
                    .collect::<std::collections::BTreeMap<_, _>>()
            })
            .filter(|a| !a.is_empty());
        let metadata = ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            creation_timestamp: metadata.creation_timestamp,
            deletion_timestamp: metadata.deletion_timestamp,
            annotations,
            ..ObjectMeta::default()
        };
        let gates = spec.and_then(|s| s.scheduling_gates).unwrap_or_default().into_iter().map(|g| g.name).collect();
        let (phase, condition) = match status {
            Some(s) => (s.phase, s.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == CONDITION)),
            None => (None, None),
        };
        KeptPod { metadata, gates, phase, condition }
    }
}

impl KeptPod {
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_pod_holds_its_gates_phase_own_annotations_and_own_condition_only() {
        let pod: KeptPod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "migrate-x2k4p", "namespace": "shop", "uid": "u-1", "resourceVersion": "7",
                "creationTimestamp": "2026-11-23T10:00:00Z", "labels": {"job-name": "migrate"},
                "annotations": {"zklock.io/lock": "db", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
            },
            "spec": {
                "containers": [{"name": "main", "image": "busybox"}],
                "schedulingGates": [{"name": "example.com/quota"}, {"name": "zklock.io/lock"}],
            },
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"},
                {"type": "zklock.io/LockAcquired", "status": "False", "reason": "Waiting", "message": "m"},
            ]},
        }))
        .unwrap();
        assert_eq!(pod.gates, ["example.com/quota", "zklock.io/lock"]);
        assert_eq!(pod.phase.as_deref(), Some("Pending"));
        assert_eq!(pod.condition.as_ref().and_then(|c| c.reason.as_deref()), Some("Waiting"));
        assert_eq!(pod.annotation("zklock.io/lock"), Some("db"));
        assert_eq!(pod.metadata.annotations.as_ref().map(|a| a.len()), Some(1));
        assert_eq!((pod.name(), pod.namespace(), pod.uid()), ("migrate-x2k4p", "shop", "u-1"));
        assert_eq!(pod.metadata.labels, None);
    }
}
