//! What the operator checks before serving a claim. The CRD schema refuses most bad input at
//! admission, but claims can predate the schema or come through an API server that does not
//! enforce it, so every rule is checked again here — and produces a message that says what to
//! fix.

use std::time::Duration;

use super::{LockClaim, LockClaimSpec};
use crate::recipe::Mode;

/// Revocation grace period when the spec gives none.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
const MAX_SECONDS: i64 = 31_536_000;
const MAX_GRACE_SECONDS: i64 = 86_400;

/// A spec the operator can serve: every field checked, defaults applied. The reconciler only
/// takes this type, so an unchecked field cannot reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidSpec {
    pub lock_name: String,
    pub mode: Mode,
    pub holder_pod: Option<String>,
    /// `Some(ZERO)` means: try once, never queue.
    pub acquire_timeout: Option<Duration>,
    pub lease: Option<Duration>,
    pub grace: Duration,
    /// How long after its final phase the claim is deleted.
    pub ttl_after_finished: Option<Duration>,
}

/// Checks a claim's spec; the error is the message for the Invalid condition.
pub fn validate(claim: &LockClaim) -> Result<ValidSpec, String> {
    validate_spec(&claim.spec, claim.metadata.namespace.as_deref().unwrap_or_default())
}

/// [`validate`], for the spec of a claim in `namespace`.
pub fn validate_spec(spec: &LockClaimSpec, namespace: &str) -> Result<ValidSpec, String> {
    check_lock_name("spec.lockName", &spec.lock_name)?;
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
    Ok(ValidSpec {
        lock_name: spec.lock_name.clone(),
        mode: spec.mode,
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
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    let ok_ends =
        name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > 253 || !ok_chars || !ok_ends {
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

fn check_dns_subdomain(field: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok {
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
    use crate::api::Holder;

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
}
