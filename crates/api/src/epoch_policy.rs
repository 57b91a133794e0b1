//! The API server's half of fencing a deposed leader (docs/design.md: fencing): a
//! ValidatingAdmissionPolicy that refuses a LockClaim status whose `leaderEpoch` is below the
//! epoch in force, kept in a ConfigMap (the policy's parameter) that each new leader raises
//! before it grants anything.
//!
//! Why the API server and not the writer: a status write sent by a leader just before it was
//! deposed can reach the API server at any later time (a hung connection, a slow proxy). The
//! writer can no longer stop it; the status write's resourceVersion test stops it only once the
//! new leader has written that claim. The policy stops it whatever claim it is for.
//!
//! The policy is cluster-wide and the same for every installation; a binding per installation
//! names the parameter (in the operator's namespace) and the namespaces it serves. The chart
//! renders the very objects made here (a test compares them).

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use serde_json::json;

/// The default name of the policy (the chart names it after its release).
pub const EPOCH_POLICY: &str = "zklock-leader-epoch";
/// The default name of the ConfigMap, in the operator's namespace, that holds the epoch in
/// force (`data.epoch`, a decimal string): the policy's parameter.
pub const EPOCH_PARAM: &str = "zklock-leader-epoch";
/// The key of the epoch in the parameter's data.
pub const EPOCH_KEY: &str = "epoch";
/// Begins the message of every refusal, so that the operator tells it from other 403s.
pub const EPOCH_REFUSAL: &str = "zklock: status written in a leader term that is over";
/// In the API server's refusal of every status write while a binding's parameter is missing
/// (`parameterNotFoundAction: Deny`): someone deleted the ConfigMap, or the API server's
/// informer has not seen it yet.
pub const PARAM_MISSING: &str = "no params found";

/// The policy: a LockClaim status that carries a `leaderEpoch` below the parameter's is
/// refused. A status without one (an operator run without leader election) passes. A missing
/// or unreadable parameter refuses every status write (`failurePolicy: Fail` and the binding's
/// `parameterNotFoundAction: Deny`): safety over availability until the leader writes it.
pub fn epoch_policy(name: &str) -> ValidatingAdmissionPolicy {
    let check = "!has(object.status) || !has(object.status.leaderEpoch) || \
                 object.status.leaderEpoch >= int(params.data.epoch)";
    let message = format!(
        "'{EPOCH_REFUSAL}: its leaderEpoch ' + string(object.status.leaderEpoch) + ' is below the epoch in force, ' \
         + params.data.epoch"
    );
    // Plain data in the shape the type describes: it deserialises.
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": name },
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": { "apiVersion": "v1", "kind": "ConfigMap" },
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": ["zklock.io"],
                    "apiVersions": ["*"],
                    "operations": ["UPDATE"],
                    "resources": ["lockclaims/status"],
                }],
            },
            "validations": [{ "expression": check, "messageExpression": message, "reason": "Forbidden" }],
        },
    }))
    .unwrap_or_default()
}

/// The binding of one installation to `policy`: its parameter is ConfigMap `param` in
/// `param_namespace`; it covers the claims of `namespaces` (every namespace when empty), as the
/// operator serves them.
pub fn epoch_policy_binding(
    name: &str,
    policy: &str,
    param: &str,
    param_namespace: &str,
    namespaces: &[String],
) -> ValidatingAdmissionPolicyBinding {
    let selector = super::served_namespaces(namespaces);
    // Plain data in the shape the type describes: it deserialises.
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": name },
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
            "paramRef": { "name": param, "namespace": param_namespace, "parameterNotFoundAction": "Deny" },
            "matchResources": { "namespaceSelector": selector },
        },
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_and_a_binding_are_whole() {
        let policy = epoch_policy("p");
        let spec = policy.spec.expect("a spec");
        assert_eq!(spec.param_kind.and_then(|k| k.kind).as_deref(), Some("ConfigMap"));
        assert_eq!(spec.validations.map(|v| v.len()), Some(1));
        let binding = epoch_policy_binding("b", "p", "param", "zklock-system", &["shop".into()]);
        let spec = binding.spec;
        assert_eq!(spec.param_ref.and_then(|p| p.namespace).as_deref(), Some("zklock-system"));
        let selector = spec.match_resources.and_then(|m| m.namespace_selector).expect("a selector");
        assert_eq!(selector.match_expressions.map(|e| e[0].values.clone()), Some(Some(vec!["shop".to_string()])));
    }
}
