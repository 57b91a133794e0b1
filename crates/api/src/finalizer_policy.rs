//! A MutatingAdmissionPolicy (GA in Kubernetes 1.36) that puts the operator's finalizer on
//! every LockClaim as it is created, so that the operator does not spend an API write (and the
//! API server a request, a write to etcd and a watch event to every watcher) adding it to each
//! claim. Without it, or on an older cluster, the operator adds the finalizer itself, as
//! before: the policy only saves work. Its failure policy is therefore `Ignore`: a policy that
//! fails must never refuse a claim.
//!
//! The policy is the same for every installation; a binding per installation names the
//! namespaces it serves. The chart renders the very objects made here (a test compares them).

use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
use serde_json::json;

use super::FINALIZER;

/// The default name of the policy and of its binding (the chart names them after its release).
pub const FINALIZER_POLICY: &str = "zklock-finalizer";

/// The policy: a LockClaim created without the operator's finalizer gets it.
pub fn finalizer_policy(name: &str) -> MutatingAdmissionPolicy {
    let missing =
        format!("!has(object.metadata.finalizers) || !object.metadata.finalizers.exists(f, f == '{FINALIZER}')");
    let patch = format!(
        "has(object.metadata.finalizers) ? \
         [JSONPatch{{op: 'add', path: '/metadata/finalizers/-', value: '{FINALIZER}'}}] : \
         [JSONPatch{{op: 'add', path: '/metadata/finalizers', value: ['{FINALIZER}']}}]"
    );
    // Plain data in the shape the type describes: it deserialises.
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": { "name": name },
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": ["zklock.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE"],
                    "resources": ["lockclaims"],
                }],
            },
            "matchConditions": [{ "name": "without-the-finalizer", "expression": missing }],
            "mutations": [{ "patchType": "JSONPatch", "jsonPatch": { "expression": patch } }],
        },
    }))
    .unwrap_or_default()
}

/// The binding of one installation to `policy`, for the claims of `namespaces` (every
/// namespace when empty), as the operator serves them.
pub fn finalizer_policy_binding(name: &str, policy: &str, namespaces: &[String]) -> MutatingAdmissionPolicyBinding {
    super::mutating_policy_binding(name, policy, namespaces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_and_a_binding_are_whole() {
        let policy = finalizer_policy("p");
        let spec = policy.spec.expect("a spec");
        assert_eq!(spec.failure_policy.as_deref(), Some("Ignore"), "it never refuses a claim");
        assert_eq!(spec.mutations.map(|m| m.len()), Some(1));
        assert_eq!(spec.match_conditions.map(|m| m.len()), Some(1));
        let binding = finalizer_policy_binding("b", "p", &["shop".into()]);
        let spec = binding.spec.expect("a spec");
        assert_eq!(spec.policy_name.as_deref(), Some("p"));
        let selector = spec.match_resources.and_then(|m| m.namespace_selector).expect("a selector");
        assert_eq!(selector.match_expressions.map(|e| e[0].values.clone()), Some(Some(vec!["shop".to_string()])));
    }
}
