//! The user-facing API: the `LockClaim` custom resource (`zklock.io/v1alpha1`), its phases and
//! conditions, and the validation of what the schema cannot check.

mod claim;
pub mod conditions;
mod kept;
mod validate;

pub use claim::{Holder, LockClaim, LockClaimSpec, LockClaimStatus, Phase};
pub use kept::{KeptClaim, KeptStatus};
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

/// The generated CRD as YAML (what `zklock crd` prints and `crds/` holds).
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    // Serialising a CRD (plain data) to YAML cannot fail.
    serde_yaml::to_string(&LockClaim::crd()).unwrap_or_default()
}
