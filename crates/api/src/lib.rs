//! The user-facing API: the `LockClaim`, `Lock`, `ClusterLock` and `LockHistory` custom resources (`zklock.io/v1alpha1`), the claims' phases and
//! conditions, and the validation of what the schema cannot check. It knows the lock recipe's
//! modes and nothing else of the engine, and no metrics or controller: the compiler keeps it so.
#![forbid(unsafe_code)]

mod claim;
mod cluster_lock;
pub mod conditions;
pub mod epoch_policy;
pub mod fencing_policy;
pub mod finalizer_policy;
pub mod gate_policy;
pub mod history;
mod kept;
mod lock;
mod validate;

pub use claim::{
    ClaimLockStatus, Holder, LockClaim, LockClaimSpec, LockClaimStatus, LockName, LockRef, Phase, Supersede,
    CLUSTER_LABEL_PREFIX, MAX_LOCKS,
};
pub use cluster_lock::{admits, ClusterLock, ClusterLockHolder, ClusterLockSpec, ClusterLockStatus};
pub use epoch_policy::EPOCH_REFUSAL;
pub use history::{GrantRecord, LockHistory, LockHistorySpec, LockHistoryStatus};
pub use kept::{KeptClaim, KeptStatus};
pub use lock::{Fencing, Lock, LockSpec, LockStatus, MAX_LISTED_HOLDERS, MAX_PERMITS};
pub use validate::{check_group, check_lock_name, is_dns_subdomain, validate, validate_spec, ValidLock, ValidSpec};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Finalizer that keeps a claim until its znode is deleted.
pub const FINALIZER: &str = "zklock.io/release";
/// Annotation a user writes on a claim to request revocation; its value is the reason.
pub const REVOKE_ANNOTATION: &str = "zklock.io/revoke";
/// Annotation on the operator's leader Lease while its installation is being removed (`zklock
/// admin before-uninstall --delete-claims`): no claim is made for a gated pod, no gate removed,
/// nothing new granted; claims are only released.
pub const UNINSTALLING_ANNOTATION: &str = "zklock.io/uninstalling";
/// Annotation a user changes to restart the lease timer of a held claim.
pub const RENEW_ANNOTATION: &str = "zklock.io/renew";
/// Prefix of the annotation written on a holder pod when its claim is to be revoked (see
/// [`pod_revoke_annotation`]).
pub const POD_REVOKE_ANNOTATION_PREFIX: &str = "revoke.zklock.io/";

/// The annotation a holder pod gets when its claim is to be revoked: key
/// `revoke.zklock.io/<claim name>`, value `{"claim":"<claim name>","reason":"<reason>"}`, which a
/// reader of the pod's downward-API volume parses for both. An annotation key's name part has at
/// most 63 characters while a claim's name may have 253 (pods named by Jobs make long ones): a
/// longer name is cut to 54 characters and ends in 8 hex digits of its hash, so the key is always
/// valid and one pod holding several claims gets one key per claim.
pub fn pod_revoke_annotation(claim: &str, reason: &str) -> (String, String) {
    const MAX_NAME: usize = 63;
    let name = if claim.len() <= MAX_NAME {
        claim.to_string()
    } else {
        // FNV-1a: stable across builds and platforms, which std's hasher is not.
        let hash =
            claim.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        let head = claim[..54].trim_end_matches(['-', '.']);
        format!("{head}-{:08x}", hash as u32)
    };
    let value = serde_json::json!({ "claim": claim, "reason": reason }).to_string();
    (format!("{POD_REVOKE_ANNOTATION_PREFIX}{name}"), value)
}

/// The namespace selector of an admission policy binding for the namespaces one installation
/// serves (every namespace when none is named).
fn served_namespaces(namespaces: &[String]) -> serde_json::Value {
    if namespaces.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::json!({
            "matchExpressions": [{ "key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces }]
        })
    }
}

/// The binding of one installation to MutatingAdmissionPolicy `policy`, for the objects of
/// `namespaces` (every namespace when empty), as the operator serves them.
fn mutating_policy_binding(
    name: &str,
    policy: &str,
    namespaces: &[String],
) -> k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBinding {
    // Plain data in the shape the type describes: it deserialises.
    serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": { "name": name },
        "spec": { "policyName": policy, "matchResources": { "namespaceSelector": served_namespaces(namespaces) } },
    }))
    .unwrap_or_default()
}

/// The generated CRDs as YAML, each with the file name `crds/` holds it under.
pub fn crds() -> [(&'static str, String); 4] {
    // Serialising a CRD (plain data) to YAML cannot fail.
    crd_objects().map(|(file, crd)| (file, serde_yaml::to_string(&crd).unwrap_or_default()))
}

/// The annotation that says which revision of zklock's CRDs an object is: an operator never
/// replaces a CRD of a later revision than its own (an older operator during a rollback must not
/// take fields away from a newer one's claims).
pub const CRD_REVISION_ANNOTATION: &str = "zklock.io/crd-revision";
/// This build's revision of the CRDs: one more whenever a generated schema changes (2: ClusterLock;
/// 3: its Ready and PermitsAgree conditions, status.clusters as the clusters serving it; 4: the
/// LockClaim's Waiting For and Reason columns in `kubectl get -o wide`; 5: conditions as
/// list-maps keyed by type, the short name `lk` for Lock; 6: `fencing` on Lock and ClusterLock,
/// a Lock's permits optional; 7: LockHistory; 8: a claim's spec.supersede and phase Superseded).
pub const CRD_REVISION: u32 = 8;

/// The generated CRDs (what `crds/` holds), each with its file name: only formats the API
/// server knows, and this build's revision annotated.
pub fn crd_objects() -> [(&'static str, CustomResourceDefinition); 4] {
    use kube::CustomResourceExt;
    let finish = |crd: CustomResourceDefinition| {
        // A CRD is plain data: it serialises and reads back.
        let mut value = serde_json::to_value(&crd).unwrap_or_default();
        kubernetes_formats_only(&mut value);
        let mut crd: CustomResourceDefinition = serde_json::from_value(value).unwrap_or(crd);
        crd.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CRD_REVISION_ANNOTATION.into(), CRD_REVISION.to_string());
        crd
    };
    [
        ("lockclaims.zklock.io.yaml", finish(LockClaim::crd())),
        ("locks.zklock.io.yaml", finish(Lock::crd())),
        ("clusterlocks.zklock.io.yaml", finish(ClusterLock::crd())),
        ("lockhistories.zklock.io.yaml", finish(LockHistory::crd())),
    ]
}

/// The string formats kube-apiserver knows (k8s.io/apiextensions-apiserver's
/// `supportedFormats`); integers and numbers: int32, int64, float, double.
const KUBERNETES_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "date-time",
    "int32",
    "int64",
    "float",
    "double",
];

/// Drops every `format` the API server does not know from a generated schema (schemars writes
/// `uint32` for a `u32`, whose range it also writes as `minimum: 0`): each such format makes
/// every `kubectl apply` of the CRD print `Warning: unrecognized format "uint32"`.
fn kubernetes_formats_only(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let unknown = map.get("format").and_then(|f| f.as_str()).is_some_and(|f| !KUBERNETES_FORMATS.contains(&f));
            // Only a schema's format: a property named "format" is a schema itself, not a string.
            if unknown {
                map.remove("format");
            }
            map.values_mut().for_each(kubernetes_formats_only);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(kubernetes_formats_only),
        _ => {}
    }
}

/// Every generated CRD as one YAML stream (what `zklock crd` prints).
pub fn crd_yaml() -> String {
    crds().map(|(_, yaml)| yaml).join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crds_carry_only_formats_the_api_server_knows() {
        for (file, yaml) in crds() {
            let formats: Vec<&str> = yaml
                .lines()
                .filter_map(|l| l.trim().strip_prefix("format: "))
                .filter(|f| !KUBERNETES_FORMATS.contains(f))
                .collect();
            assert!(formats.is_empty(), "{file}: {formats:?}");
        }
        let mut schema = serde_json::json!({ "type": "integer", "format": "uint32", "minimum": 0,
            "properties": { "format": { "type": "string", "format": "date-time" } } });
        kubernetes_formats_only(&mut schema);
        assert_eq!(
            schema,
            serde_json::json!({ "type": "integer", "minimum": 0,
                "properties": { "format": { "type": "string", "format": "date-time" } } })
        );
    }

    #[test]
    fn the_pods_revocation_annotation_key_is_valid_for_every_claim_name() {
        let (key, value) = pod_revoke_annotation("short", "maintenance");
        assert_eq!(key, "revoke.zklock.io/short");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&value).unwrap(),
            serde_json::json!({"claim": "short", "reason": "maintenance"})
        );
        let long = format!("{}.x-y", "migrate-7f9c-".repeat(19));
        let (key, value) = pod_revoke_annotation(&long, "r");
        let name = key.strip_prefix(POD_REVOKE_ANNOTATION_PREFIX).unwrap();
        assert!(name.len() <= 63, "{name}");
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        assert!(
            name.chars().all(valid)
                && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name.ends_with(|c: char| c.is_ascii_alphanumeric()),
            "{name}"
        );
        assert!(value.contains(&long), "the value names the whole claim");
        let (other, _) = pod_revoke_annotation(&format!("{long}z"), "r");
        assert_ne!(key, other, "names cut to the same head keep their own keys");
    }
}
