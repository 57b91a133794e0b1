//! Fencing enforced where the work lands (docs/design.md: "Beyond the lock", 1): a Kubernetes
//! object labelled as guarded by a lock accepts a write only with a fencing token of a hold of
//! that lock in force, never lower than the token it last accepted. The API server judges it
//! (a ValidatingAdmissionPolicy), whatever client writes, so a stale holder's late write is
//! refused by Kubernetes itself.
//!
//! The holds in force come from a parameter the operator keeps: a ConfigMap per namespace
//! (`zklock-fencing`, one key per fenced `Lock` of the namespace) and one in the operator's
//! namespace for `ClusterLock`s (`zklock-fencing-cluster-locks`). Each value lists the tokens of
//! the lock's holds in force in this cluster as `,T1,T2,`, so that the policy tests a token with
//! one `contains` and no parsing. The operator rewrites a lock's value before it writes a grant
//! `Held`, and proves that the API server judges by the new value (a dry-run write carrying the
//! new token admitted) before the holder may start: from then on an ended hold's token is
//! refused, however late its write arrives.
//!
//! Two policies, one per label, so that each reads its own parameter: a namespaced `Lock` by
//! `zklock.io/fenced-by: <lock>`, a `ClusterLock` by `zklock.io/fenced-by-cluster-lock: <name>`
//! (a label value cannot say both in one: it has no `/`, and at most 63 characters). The chart
//! renders the very objects made here (a test compares them).

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use serde_json::json;

/// The label that guards an object by a `Lock` of its namespace; its value is the lock's name.
pub const FENCED_BY: &str = "zklock.io/fenced-by";
/// The label that guards an object by a `ClusterLock`; its value is the ClusterLock's name.
pub const FENCED_BY_CLUSTER_LOCK: &str = "zklock.io/fenced-by-cluster-lock";
/// The annotation a write of a guarded object carries: the writer's fencing token (what
/// `zklock exec` gives as `ZKLOCK_FENCING_TOKEN`, `status.fencingToken` of its claim).
pub const FENCING_TOKEN: &str = "zklock.io/fencing-token";
/// The default name of the policy for `Lock`s (the chart names it after its release).
pub const FENCING_POLICY: &str = "zklock-fencing";
/// The default name of the policy for `ClusterLock`s.
pub const CLUSTER_FENCING_POLICY: &str = "zklock-fencing-cluster-locks";
/// The default name of the parameter for `Lock`s, one in each namespace with fenced locks.
pub const FENCING_PARAM: &str = "zklock-fencing";
/// The parameter for `ClusterLock`s, in the operator's namespace, is named after the other.
pub fn cluster_fencing_param(param: &str) -> String {
    format!("{param}-cluster-locks")
}
/// Begins the message of every refusal of a write of a guarded object.
pub const FENCING_REFUSAL: &str = "zklock fencing";
/// The users whose writes are not judged: Kubernetes' own controllers (the garbage collector
/// and the namespace controller delete and update objects of any kind; a namespace must be
/// deletable, an owner's dependents collectable). Everything else is judged, the operator's
/// own dry-run probes included.
pub const EXEMPT_USERS: &[&str] = &["system:kube-controller-manager", "system:kube-scheduler", "system:apiserver"];
/// Service accounts of this namespace are Kubernetes' own controllers' (with
/// `--use-service-account-credentials`).
pub const EXEMPT_SERVICE_ACCOUNTS: &str = "system:serviceaccount:kube-system:";

/// The key of a lock's holders in the parameter's data, beside its tokens: `UID=TOKEN` pairs,
/// space-separated, for the operator only (the policy reads the tokens' key). A lock's name
/// has no `_`, so no lock's key can be this.
pub fn holders_key(lock: &str) -> String {
    format!("_holders.{lock}")
}

/// The value of a lock's key: its tokens in force, `,T1,T2,` (`,` when none).
pub fn tokens_value(tokens: impl IntoIterator<Item = i64>) -> String {
    let mut tokens: Vec<i64> = tokens.into_iter().collect();
    tokens.sort_unstable();
    tokens.dedup();
    tokens.iter().fold(",".to_string(), |s, t| format!("{s}{t},"))
}

/// The holders recorded under [`holders_key`]: `(uid, token)` pairs; what cannot be read is
/// left out (the operator writes the whole value again from what it keeps).
pub fn parse_holders(value: &str) -> Vec<(String, i64)> {
    value
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(uid, token)| Some((uid.to_string(), token.parse().ok()?)))
        .collect()
}

/// The value under [`holders_key`] for `holders`.
pub fn holders_value(holders: &[(String, i64)]) -> String {
    holders.iter().map(|(uid, token)| format!("{uid}={token}")).collect::<Vec<_>>().join(" ")
}

/// The policy judging writes of objects guarded by `label` ([`FENCED_BY`] or
/// [`FENCED_BY_CLUSTER_LOCK`]), against a ConfigMap parameter whose key is the label's value.
///
/// CREATE and UPDATE (an UPDATE that removes the label too: it is judged by the old object's
/// lock) must carry [`FENCING_TOKEN`]: a token listed under the lock's key (a hold in force),
/// and on UPDATE no lower than the token the object carried before. DELETE is not judged: it
/// carries no token of its own (the old object's is whoever wrote last), so no rule could tell
/// a stale holder's delete from the current holder's; RBAC decides who may delete.
/// `failurePolicy: Fail` and the binding's `parameterNotFoundAction: Deny`: a write the policy
/// cannot judge is refused.
pub fn fencing_policy(name: &str, label: &str) -> ValidatingAdmissionPolicy {
    let exempt = EXEMPT_USERS.iter().map(|u| format!("'{u}'")).collect::<Vec<_>>().join(", ");
    let judged = format!(
        "!(request.userInfo.username in [{exempt}]) && \
         !request.userInfo.username.startsWith('{EXEMPT_SERVICE_ACCOUNTS}')"
    );
    let labelled = |o: &str| format!("({o} != null && has({o}.metadata.labels) && '{label}' in {o}.metadata.labels)");
    let guarded = format!("{} || {}", labelled("object"), labelled("oldObject"));
    let lock =
        format!("{} ? object.metadata.labels['{label}'] : oldObject.metadata.labels['{label}']", labelled("object"));
    let token_of = |o: &str| {
        format!(
            "has({o}.metadata.annotations) && '{FENCING_TOKEN}' in {o}.metadata.annotations ? \
             {o}.metadata.annotations['{FENCING_TOKEN}'] : ''"
        )
    };
    let last = format!("oldObject != null ? ({}) : ''", token_of("oldObject"));
    let held = "variables.lock in params.data ? params.data[variables.lock] : ','";
    let what = format!("'{FENCING_REFUSAL}: ' + request.resource.resource + ' ' + request.name + ' is guarded by lock ' + variables.lock");
    let validations = json!([
        {
            "expression": "variables.token.matches('^[0-9]{1,18}$')",
            "messageExpression": format!(
                "{what} + ': the write must carry annotation {FENCING_TOKEN} with the fencing token of a hold of it \
                 (zklock exec gives it as ZKLOCK_FENCING_TOKEN, or ZKLOCK_FENCING_TOKEN_<LOCK> when it holds several \
                 locks)'"
            ),
            "reason": "Forbidden",
        },
        {
            "expression": "variables.held.contains(',' + variables.token + ',')",
            "messageExpression": format!(
                "{what} + ': fencing token ' + variables.token + ' is not a hold of it in force (holds in force: ' \
                 + (variables.held == ',' ? 'none' : variables.held) + ')'"
            ),
            "reason": "Forbidden",
        },
        {
            "expression": "variables.last == '' || !variables.last.matches('^[0-9]{1,18}$') || int(variables.token) >= int(variables.last)",
            "messageExpression": format!(
                "{what} + ': fencing token ' + variables.token + ' is below token ' + variables.last + \
                 ' the object last accepted'"
            ),
            "reason": "Forbidden",
        },
    ]);
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
                    "apiGroups": ["*"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["*"],
                }],
            },
            "matchConditions": [
                { "name": "guarded", "expression": guarded },
                { "name": "not-a-kubernetes-controller", "expression": judged },
            ],
            "variables": [
                { "name": "lock", "expression": lock },
                { "name": "token", "expression": token_of("object") },
                { "name": "last", "expression": last },
                { "name": "held", "expression": held },
            ],
            "validations": validations,
        },
    }))
    .unwrap_or_default()
}

/// The binding of one installation to `policy` for objects carrying `label`: its parameter is
/// ConfigMap `param` in `param_namespace`, or in the namespace of the object judged when `None`
/// (a cluster-scoped object then cannot be judged, and is refused). It covers `namespaces`
/// (every namespace when empty; cluster-scoped objects always: the API server never skips a
/// policy for them by namespace).
pub fn fencing_policy_binding(
    name: &str,
    policy: &str,
    label: &str,
    param: &str,
    param_namespace: Option<&str>,
    namespaces: &[String],
) -> ValidatingAdmissionPolicyBinding {
    let mut param_ref = json!({ "name": param, "parameterNotFoundAction": "Deny" });
    if let Some(namespace) = param_namespace {
        param_ref["namespace"] = json!(namespace);
    }
    // Plain data in the shape the type describes: it deserialises.
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": name },
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
            "paramRef": param_ref,
            "matchResources": {
                "namespaceSelector": super::served_namespaces(namespaces),
                "objectSelector": { "matchExpressions": [{ "key": label, "operator": "Exists" }] },
            },
        },
    }))
    .unwrap_or_default()
}

/// The four objects of one installation: the policy and binding for `Lock`s (parameter `param`
/// in each object's namespace) and for `ClusterLock`s (its parameter in `operator_namespace`).
/// Both bindings cover the namespaces served (and cluster-scoped objects): an object another
/// installation guards is none of this one's business, and would be refused for want of this
/// one's parameter.
pub fn fencing_policies(
    name: &str,
    param: &str,
    operator_namespace: &str,
    namespaces: &[String],
) -> ([ValidatingAdmissionPolicy; 2], [ValidatingAdmissionPolicyBinding; 2]) {
    let cluster_name = format!("{name}-cluster-locks");
    let cluster_param = cluster_fencing_param(param);
    (
        [fencing_policy(name, FENCED_BY), fencing_policy(&cluster_name, FENCED_BY_CLUSTER_LOCK)],
        [
            fencing_policy_binding(name, name, FENCED_BY, param, None, namespaces),
            fencing_policy_binding(
                &cluster_name,
                &cluster_name,
                FENCED_BY_CLUSTER_LOCK,
                &cluster_param,
                Some(operator_namespace),
                namespaces,
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_listed_so_that_one_contains_tests_one() {
        assert_eq!(tokens_value([]), ",");
        assert_eq!(tokens_value([12, 3, 12]), ",3,12,");
        // ",3,12," holds 12 and 3, never 1 or 2.
        let value = tokens_value([12, 3]);
        assert!(value.contains(",12,") && value.contains(",3,"));
        assert!(!value.contains(",1,") && !value.contains(",2,"));
    }

    #[test]
    fn holders_read_back_and_what_cannot_be_read_is_left_out() {
        let holders = vec![("u-1".to_string(), 7), ("u-2".to_string(), 9)];
        assert_eq!(parse_holders(&holders_value(&holders)), holders);
        assert_eq!(parse_holders("u-1=7 junk u-3=x u-2=9"), holders);
        assert!(!holders_key("a.b").contains('/'), "a ConfigMap key");
    }

    #[test]
    fn the_policies_refuse_what_they_cannot_judge_and_skip_deletes() {
        let ([namespaced, cluster], [binding, cluster_binding]) = fencing_policies("f", "p", "zklock-system", &[]);
        for policy in [&namespaced, &cluster] {
            let spec = policy.spec.clone().expect("a spec");
            assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
            let rules = spec.match_constraints.and_then(|m| m.resource_rules).expect("rules");
            assert_eq!(rules[0].operations.as_deref(), Some(&["CREATE".to_string(), "UPDATE".to_string()][..]));
            assert_eq!(spec.validations.map(|v| v.len()), Some(3));
        }
        let namespaced_ref = binding.spec.param_ref.expect("a paramRef");
        assert_eq!(namespaced_ref.namespace, None, "each object's own namespace");
        assert_eq!(namespaced_ref.parameter_not_found_action.as_deref(), Some("Deny"));
        let cluster_ref = cluster_binding.spec.param_ref.expect("a paramRef");
        assert_eq!(cluster_ref.namespace.as_deref(), Some("zklock-system"));
        assert_eq!(cluster_ref.name.as_deref(), Some("p-cluster-locks"));
    }
}
