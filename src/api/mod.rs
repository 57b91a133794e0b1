//! The user-facing API: the `LockClaim` custom resource (`zklock.io/v1alpha1`), its phases and
//! conditions, and the validation of what the schema cannot check.

mod claim;
pub mod conditions;
pub mod epoch_policy;
mod kept;
mod lock;
mod validate;

pub use claim::{Holder, LockClaim, LockClaimSpec, LockClaimStatus, Phase};
pub use epoch_policy::EPOCH_REFUSAL;
pub use kept::{KeptClaim, KeptStatus};
pub use lock::{Lock, LockSpec, LockStatus, MAX_LISTED_HOLDERS, MAX_PERMITS};
pub use validate::{check_lock_name, validate, validate_spec, ValidSpec};

/// Finalizer that keeps a claim until its znode is deleted.
pub const FINALIZER: &str = "zklock.io/release";
/// Annotation a user writes on a claim to request revocation; its value is the reason.
pub const REVOKE_ANNOTATION: &str = "zklock.io/revoke";
/// Annotation a user changes to restart the lease timer of a held claim.
pub const RENEW_ANNOTATION: &str = "zklock.io/renew";
/// Prefix of the annotation written on a holder pod when its claim is to be revoked:
/// `revoke.zklock.io/<claim name>: <reason>`.
pub const POD_REVOKE_ANNOTATION_PREFIX: &str = "revoke.zklock.io/";

/// The generated CRDs as YAML, each with the file name `crds/` holds it under.
pub fn crds() -> [(&'static str, String); 2] {
    use kube::CustomResourceExt;
    // Serialising a CRD (plain data) to YAML cannot fail.
    let yaml = |crd| serde_yaml::to_string(&crd).unwrap_or_default();
    [("lockclaims.zklock.io.yaml", yaml(LockClaim::crd())), ("locks.zklock.io.yaml", yaml(Lock::crd()))]
}

/// Every generated CRD as one YAML stream (what `zklock crd` prints).
pub fn crd_yaml() -> String {
    crds().map(|(_, yaml)| yaml).join("---\n")
}
