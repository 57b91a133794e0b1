//! A MutatingAdmissionPolicy (GA in Kubernetes 1.36) that gives every pod created with the
//! annotation `zklock.io/lock` the scheduling gate `zklock.io/lock`, so that one edit (the
//! annotation, in a Job's pod template say) gates a pod on a lock, as Kueue users write one
//! label. Without it, or on an older cluster, the pod spec names the gate itself (two edits).
//!
//! Its failure policy is `Fail`, unlike the finalizer's: a pod that asks for a lock must not run
//! without it, so a pod the policy cannot gate is refused (with the API server's message) rather
//! than admitted ungated. Safety over convenience: a refused pod is retried by its controller; a
//! pod run without its lock may break what the lock guards.
//!
//! The policy is the same for every installation; a binding per installation names the
//! namespaces it serves (a gated pod in a namespace no operator serves would wait for ever). The
//! chart renders the very objects made here (a test compares them).

use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
use serde_json::json;

/// The annotation that names a pod's lock, and the scheduling gate that holds the pod back
/// until its claim is Held (the same name).
pub const POD_LOCK: &str = "zklock.io/lock";

/// The default name of the policy and of its binding (the chart names them after its release).
pub const GATE_POLICY: &str = "zklock-gate";

/// The policy: a pod created with the lock annotation and without the gate gets the gate.
pub fn gate_policy(name: &str) -> MutatingAdmissionPolicy {
    let asks = format!(
        "has(object.metadata.annotations) && '{POD_LOCK}' in object.metadata.annotations && \
         (!has(object.spec.schedulingGates) || !object.spec.schedulingGates.exists(g, g.name == '{POD_LOCK}'))"
    );
    let patch = format!(
        "has(object.spec.schedulingGates) ? \
         [JSONPatch{{op: 'add', path: '/spec/schedulingGates/-', value: {{'name': '{POD_LOCK}'}}}}] : \
         [JSONPatch{{op: 'add', path: '/spec/schedulingGates', value: [{{'name': '{POD_LOCK}'}}]}}]"
    );
    // Plain data in the shape the type describes: it deserialises.
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": { "name": name },
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }],
            },
            "matchConditions": [{ "name": "asks-for-a-lock-without-the-gate", "expression": asks }],
            "mutations": [{ "patchType": "JSONPatch", "jsonPatch": { "expression": patch } }],
        },
    }))
    .unwrap_or_default()
}

/// The binding of one installation to `policy`, for the pods of `namespaces` (every namespace
/// when empty), as the operator serves them.
pub fn gate_policy_binding(name: &str, policy: &str, namespaces: &[String]) -> MutatingAdmissionPolicyBinding {
    super::mutating_policy_binding(name, policy, namespaces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_refuses_rather_than_admit_a_pod_it_cannot_gate() {
        let spec = gate_policy("p").spec.expect("a spec");
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"), "never an ungated pod that asks for a lock");
        let rules = spec.match_constraints.and_then(|m| m.resource_rules).expect("rules");
        assert_eq!(rules[0].resources.as_deref(), Some(&["pods".to_string()][..]));
        assert_eq!(spec.mutations.map(|m| m.len()), Some(1));
        let binding = gate_policy_binding("b", "p", &[]);
        assert_eq!(binding.spec.and_then(|s| s.policy_name).as_deref(), Some("p"));
    }
}
