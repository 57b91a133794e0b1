//! Standard `metav1.Condition`s on a claim and on a `ClusterLock`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// True exactly while the phase is Held: what `kubectl wait --for=condition=Held` waits on.
pub const HELD: &str = "Held";
/// True on every terminal phase, so scripts can wait for either outcome.
pub const FINISHED: &str = "Finished";
/// True once a revocation was requested (annotation, or a request written into the znode).
pub const REVOKE_REQUESTED: &str = "RevokeRequested";
/// True when the spec cannot be served; the message says what to fix.
pub const INVALID: &str = "Invalid";

/// On a `ClusterLock`: whether this cluster's operator serves it (a selector that admits
/// namespaces, the other clusters' permits known).
pub const READY: &str = "Ready";
/// On a `ClusterLock`: whether every cluster that shares it declares the same permits (when not,
/// each grants as the smallest allows).
pub const PERMITS_AGREE: &str = "PermitsAgree";

/// Sets condition `type_` in `conditions`, keeping its lastTransitionTime when the status did
/// not change (as the API conventions ask).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let mut new = Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: now.clone(),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(old) if old.status == new.status => {
            new.last_transition_time = old.last_transition_time.clone();
            *old = new;
        }
        Some(old) => *old = new,
        None => conditions.push(new),
    }
}

/// Keeps the first condition of each type: conditions are a list-map keyed by type (CRD revision
/// 5), so a status holding a type twice (written by hand, or before) would refuse every write.
pub fn dedup(conditions: &mut Vec<Condition>) {
    let mut seen = std::collections::HashSet::new();
    conditions.retain(|c| seen.insert(c.type_.clone()));
}

pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}
