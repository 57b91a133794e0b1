//! What the operator checks before serving a claim. The CRD schema refuses most bad input at
//! admission, but claims can predate the schema or come through an API server that does not
//! enforce it, so every rule is checked again here — and produces a message that says what to
//! fix.

use std::time::Duration;

use super::{LockClaim, LockClaimSpec, MAX_LOCKS};
use zklock_engine::recipe::Mode;

/// Revocation grace period when the spec gives none.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
const MAX_SECONDS: i64 = 31_536_000;
const MAX_GRACE_SECONDS: i64 = 86_400;

/// A spec the operator can serve: every field checked, defaults applied. The reconciler only
/// takes this type, so an unchecked field cannot reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidSpec {
    /// The locks, in the order the spec gives them: one for `lockName`, 1 to 16 distinct ones
    /// for `locks`.
    pub locks: Vec<ValidLock>,
    /// Whether the claim asked for several locks (`spec.locks`), even if it names one.
    pub several: bool,
    pub holder_pod: Option<String>,
    /// `Some(ZERO)` means: try once, never queue.
    pub acquire_timeout: Option<Duration>,
    pub lease: Option<Duration>,
    pub grace: Duration,
    /// How long after its final phase the claim is deleted.
    pub ttl_after_finished: Option<Duration>,
    /// `spec.supersede.group`: newer claims of this group, lock and namespace end it while it
    /// waits. Only on a claim over one lock.
    pub supersede_group: Option<String>,
}

/// One lock of a valid spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidLock {
    pub name: String,
    pub mode: Mode,
    /// A `ClusterLock` (`clusterLockName`), not a lock of the claim's namespace.
    pub cluster: bool,
}

impl ValidLock {
    /// The name as status shows it: `NAME`, or `cluster/NAME` for a `ClusterLock`.
    pub fn label(&self) -> String {
        if self.cluster {
            format!("{}{}", crate::claim::CLUSTER_LABEL_PREFIX, self.name)
        } else {
            self.name.clone()
        }
    }
}

impl ValidSpec {
    /// The lock names, joined with commas (`a,b,cluster/c`).
    pub fn lock_label(&self) -> String {
        self.locks.iter().map(ValidLock::label).collect::<Vec<_>>().join(",")
    }

    /// The `ClusterLock`s the claim names.
    pub fn cluster_locks(&self) -> impl Iterator<Item = &str> {
        self.locks.iter().filter(|l| l.cluster).map(|l| l.name.as_str())
    }
}

/// Checks a claim's spec; the error is the message for the Invalid condition.
pub fn validate(claim: &LockClaim) -> Result<ValidSpec, String> {
    validate_spec(&claim.spec, claim.metadata.namespace.as_deref().unwrap_or_default())
}

/// [`validate`], for the spec of a claim in `namespace`.
pub fn validate_spec(spec: &LockClaimSpec, namespace: &str) -> Result<ValidSpec, String> {
    const EXACTLY_ONE: &str = "give exactly one of spec.lockName (one lock), spec.clusterLockName (one ClusterLock) \
                               and spec.locks (several locks, taken together)";
    let named = [spec.lock_name.is_some(), spec.cluster_lock_name.is_some(), spec.locks.is_some()];
    if named.iter().filter(|n| **n).count() != 1 {
        return Err(EXACTLY_ONE.into());
    }
    let locks = match (&spec.lock_name, &spec.cluster_lock_name, &spec.locks) {
        (Some(name), _, _) => {
            check_lock_name("spec.lockName", name)?;
            vec![ValidLock { name: name.clone(), mode: spec.mode.unwrap_or_default(), cluster: false }]
        }
        (None, Some(name), _) => {
            check_lock_name("spec.clusterLockName", name)?;
            vec![ValidLock { name: name.clone(), mode: spec.mode.unwrap_or_default(), cluster: true }]
        }
        (None, None, Some(locks)) => {
            if spec.mode.is_some() {
                return Err(
                    "spec.mode goes with spec.lockName or spec.clusterLockName: give each entry of spec.locks \
                            its own mode"
                        .into(),
                );
            }
            if locks.is_empty() || locks.len() > MAX_LOCKS {
                return Err(format!("spec.locks has {} entries: give 1 to {MAX_LOCKS} locks", locks.len()));
            }
            let mut valid: Vec<ValidLock> = Vec::with_capacity(locks.len());
            for (i, lock) in locks.iter().enumerate() {
                let (field, name, cluster) = match (&lock.lock_name, &lock.cluster_lock_name) {
                    (Some(name), None) => ("lockName", name, false),
                    (None, Some(name)) => ("clusterLockName", name, true),
                    _ => {
                        return Err(format!(
                            "spec.locks[{i}] must give exactly one of lockName (a lock of the namespace) and \
                             clusterLockName (a ClusterLock)"
                        ))
                    }
                };
                check_lock_name(&format!("spec.locks[{i}].{field}"), name)?;
                if valid.iter().any(|v| v.name == *name && v.cluster == cluster) {
                    return Err(format!(
                        "spec.locks names {field} {name:?} twice: name each lock once (with the mode it is needed in)"
                    ));
                }
                valid.push(ValidLock { name: name.clone(), mode: lock.mode, cluster });
            }
            valid
        }
        (None, None, None) => return Err(EXACTLY_ONE.into()),
    };
    let holder_pod = match &spec.holder {
        None => None,
        Some(holder) => {
            if let Some(ns) = holder.namespace.as_deref().filter(|ns| *ns != namespace) {
                return Err(format!(
                    "spec.holder.namespace {ns:?} differs from the claim's namespace {namespace:?}: a claim can only \
                     bind to a pod in its own namespace; create the claim in {ns:?} instead"
                ));
            }
            check_dns_subdomain("spec.holder.podName", &holder.pod_name)?;
            Some(holder.pod_name.clone())
        }
    };
    let supersede_group = match &spec.supersede {
        None => None,
        Some(_) if spec.locks.is_some() => {
            return Err("spec.supersede goes with spec.lockName or spec.clusterLockName: a claim over several locks \
                        cannot be superseded"
                .into())
        }
        Some(_) if spec.acquire_timeout_seconds == Some(0) => {
            return Err("spec.supersede with acquireTimeoutSeconds 0: a claim that never waits supersedes nothing; \
                        give a timeout above 0 or no group"
                .into())
        }
        Some(s) => {
            check_group(&s.group)?;
            Some(s.group.clone())
        }
    };
    Ok(ValidSpec {
        supersede_group,
        several: spec.locks.is_some(),
        locks,
        holder_pod,
        acquire_timeout: seconds("spec.acquireTimeoutSeconds", spec.acquire_timeout_seconds, 0, MAX_SECONDS)?,
        lease: seconds("spec.leaseDurationSeconds", spec.lease_duration_seconds, 1, MAX_SECONDS)?,
        grace: seconds(
            "spec.revocationGracePeriodSeconds",
            spec.revocation_grace_period_seconds,
            0,
            MAX_GRACE_SECONDS,
        )?
        .unwrap_or(DEFAULT_GRACE),
        ttl_after_finished: seconds("spec.ttlSecondsAfterFinished", spec.ttl_seconds_after_finished, 0, MAX_SECONDS)?,
    })
}

/// Checks a lock name; `field` says where it was read (the message names it).
pub fn check_lock_name(field: &str, name: &str) -> Result<(), String> {
    if !is_plain_name(name, 253) {
        return Err(format!(
            "{field} {name:?} is not a valid lock name: use 1-253 characters of lower-case letters, digits, \
             '.' and '-', starting and ending with a letter or digit (e.g. \"db-migrations\")"
        ));
    }
    // Lock names become znode path segments.
    if name == "." || name == ".." || name == "zookeeper" {
        return Err(format!("{field} {name:?} is reserved: choose another name"));
    }
    Ok(())
}

/// 1 to `max` characters of lower-case letters, digits, `.` and `-`, starting and ending with a
/// letter or digit: lock names and supersede groups.
fn is_plain_name(name: &str, max: usize) -> bool {
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    let ok_ends =
        name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    !name.is_empty() && name.len() <= max && ok_chars && ok_ends
}

/// Checks a supersede group (`spec.supersede.group`, the pod annotation
/// `zklock.io/supersede-group`, `--supersede`).
pub fn check_group(group: &str) -> Result<(), String> {
    if !is_plain_name(group, 63) {
        return Err(format!(
            "supersede group {group:?} is not valid: use 1-63 characters of lower-case letters, digits, '.' and '-', \
             starting and ending with a letter or digit (e.g. \"deploy-prod\")"
        ));
    }
    Ok(())
}

/// Whether `name` is a lower-case RFC 1123 subdomain (what most object names must be).
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn check_dns_subdomain(field: &str, name: &str) -> Result<(), String> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(format!("{field} {name:?} is not a valid pod name (lower-case RFC 1123 subdomain, at most 253 characters)"))
    }
}

fn seconds(field: &str, value: Option<i64>, min: i64, max: i64) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(v) if (min..=max).contains(&v) => Ok(Some(Duration::from_secs(v as u64))),
        Some(v) => Err(format!("{field} is {v}; it must be between {min} and {max} seconds")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Holder;

    fn claim(spec: LockClaimSpec) -> LockClaim {
        let mut c = LockClaim::new("c", spec);
        c.metadata.namespace = Some("shop".into());
        c
    }

    fn spec(lock: &str) -> LockClaimSpec {
        serde_json::from_value(serde_json::json!({ "lockName": lock })).unwrap()
    }

    #[test]
    fn good_specs_pass_with_defaults() {
        let v = validate(&claim(spec("db-migrations"))).unwrap();
        assert_eq!(v.grace, DEFAULT_GRACE);
        assert_eq!(v.acquire_timeout, None);
        let mut s = spec("a.b");
        s.acquire_timeout_seconds = Some(0);
        s.holder = Some(Holder { pod_name: "migrate-7f9c-abcde".into(), namespace: Some("shop".into()) });
        let v = validate(&claim(s)).unwrap();
        assert_eq!(v.acquire_timeout, Some(Duration::ZERO));
        assert_eq!(v.holder_pod.as_deref(), Some("migrate-7f9c-abcde"));
    }

    #[test]
    fn bad_specs_say_what_to_fix() {
        for (s, needle) in [
            (spec("Bad_Name"), "not a valid lock name"),
            (spec(""), "not a valid lock name"),
            (spec("-x"), "not a valid lock name"),
            (spec(&"a".repeat(254)), "not a valid lock name"),
            (spec("zookeeper"), "reserved"),
        ] {
            let err = validate(&claim(s)).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
        let mut s = spec("x");
        s.holder = Some(Holder { pod_name: "p".into(), namespace: Some("other".into()) });
        assert!(validate(&claim(s)).unwrap_err().contains("own namespace"));
        let mut s = spec("x");
        s.holder = Some(Holder { pod_name: "Not A Pod".into(), namespace: None });
        assert!(validate(&claim(s)).unwrap_err().contains("not a valid pod name"));
        let mut s = spec("x");
        s.lease_duration_seconds = Some(0);
        assert!(validate(&claim(s)).unwrap_err().contains("between 1 and"));
        let mut s = spec("x");
        s.acquire_timeout_seconds = Some(-5);
        assert!(validate(&claim(s)).unwrap_err().contains("acquireTimeoutSeconds is -5"));
        let mut s = spec("x");
        s.ttl_seconds_after_finished = Some(-1);
        assert!(validate(&claim(s)).unwrap_err().contains("ttlSecondsAfterFinished is -1"));
    }

    fn several(locks: serde_json::Value) -> LockClaimSpec {
        serde_json::from_value(serde_json::json!({ "locks": locks })).unwrap()
    }

    #[test]
    fn cluster_locks_are_told_from_namespaced_ones_of_the_same_name() {
        let v = validate(&claim(several(serde_json::json!([
            { "lockName": "db" }, { "clusterLockName": "db", "mode": "Shared" }
        ]))))
        .unwrap();
        assert_eq!(v.lock_label(), "db,cluster/db");
        assert_eq!(v.cluster_locks().collect::<Vec<_>>(), ["db"]);
        let one = validate(&claim(LockClaimSpec::one_cluster_lock("payments", Mode::Exclusive))).unwrap();
        assert_eq!((one.several, one.lock_label()), (false, "cluster/payments".to_string()));
        assert_eq!(one.lock_label(), one.locks[0].label());
    }

    #[test]
    fn several_locks_keep_their_order_and_modes_and_bad_lists_say_what_to_fix() {
        let v =
            validate(&claim(several(serde_json::json!([{ "lockName": "b", "mode": "Shared" }, { "lockName": "a" }]))))
                .unwrap();
        assert!(v.several);
        assert_eq!(
            v.locks,
            [
                ValidLock { name: "b".into(), mode: Mode::Shared, cluster: false },
                ValidLock { name: "a".into(), mode: Mode::Exclusive, cluster: false }
            ]
        );
        assert_eq!(v.lock_label(), "b,a");
        let one = validate(&claim(spec("db"))).unwrap();
        assert_eq!((one.several, one.lock_label()), (false, "db".to_string()));

        let many: Vec<serde_json::Value> =
            (0..17).map(|i| serde_json::json!({ "lockName": format!("l{i}") })).collect();
        let mut both = several(serde_json::json!([{ "lockName": "a" }]));
        both.lock_name = Some("b".into());
        let mut with_mode = several(serde_json::json!([{ "lockName": "a" }]));
        with_mode.mode = Some(Mode::Shared);
        let mut neither = spec("x");
        neither.lock_name = None;
        for (s, needle) in [
            (
                several(serde_json::json!([{ "lockName": "a" }, { "lockName": "a", "mode": "Shared" }])),
                "names lockName \"a\" twice",
            ),
            (several(serde_json::json!([])), "give 1 to 16 locks"),
            (several(serde_json::Value::Array(many)), "17 entries"),
            (several(serde_json::json!([{ "lockName": "Not_A_Label" }])), "spec.locks[0].lockName"),
            (both, "exactly one of"),
            (neither, "exactly one of"),
            (with_mode, "give each entry of spec.locks its own mode"),
            (several(serde_json::json!([{ "lockName": "a", "clusterLockName": "a" }])), "spec.locks[0] must give"),
            (several(serde_json::json!([{ "mode": "Shared" }])), "spec.locks[0] must give"),
            (
                several(serde_json::json!([{ "clusterLockName": "a" }, { "clusterLockName": "a" }])),
                "names clusterLockName \"a\" twice",
            ),
            (
                serde_json::from_value(serde_json::json!({ "lockName": "a", "clusterLockName": "b" })).unwrap(),
                "exactly one of",
            ),
            (LockClaimSpec::one_cluster_lock("Bad", Mode::Exclusive), "spec.clusterLockName \"Bad\""),
        ] {
            let err = validate(&claim(s)).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }
}
