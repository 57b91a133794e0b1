//! What a reconcile step can fail with: each variant names its step, gives the metric label
//! of the reconcile error counter, and says when the error policy looks at the claim again.

use std::time::Duration;

/// Every call to the Kubernetes API gives up after this long (and is retried by the caller).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// How soon a claim whose reconcile failed is looked at again.
const RETRY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading holder pod {pod}: {source}")]
    GetPod { pod: String, source: kube::Error },
    #[error("writing the claim's status: {0}")]
    PatchStatus(kube::Error),
    #[error("serialising the claim's status: {0}")]
    StatusPatch(serde_json::Error),
    #[error("{call}: no answer from the Kubernetes API within {API_TIMEOUT:?}")]
    Timeout { call: &'static str },
    #[error("adding or removing the finalizer: {0}")]
    Finalizer(kube::Error),
    #[error("ZooKeeper: {0}")]
    ZooKeeper(#[from] crate::zk::Error),
    #[error("the claim has no {0}")]
    Malformed(&'static str),
    #[error("{call}: {source}")]
    Write { call: &'static str, source: kube::Error },
    /// The token floor cannot be kept (see `token_floor`): nothing is handed out.
    #[error("the token floor: {0}")]
    TokenFloor(String),
    #[error("not the leader any more: no write")]
    NotLeading,
    /// The API server's fence for this leader's term could not be set up (docs/design.md: fencing).
    #[error("fencing earlier terms in the API server: {0}")]
    ApiFence(String),
    /// A controller or one of its tasks ended before the term did (a bug: it is not retried).
    #[error("{0}")]
    TaskPanicked(String),
    /// The admission policy's fence is not proven in the claim's namespace: nothing is written
    /// there (docs/design.md: fencing).
    #[error("no status is written in this namespace: {0}")]
    Unfenced(String),
    /// The admission policy's fence is being proven in the claim's namespace: tried again soon.
    #[error("{0}: the leader epoch policy is being proven there")]
    Proving(String),
    /// A status write was refused because the epoch policy's parameter is missing.
    #[error("the epoch policy's parameter is missing: {0}")]
    EpochParam(String),
    /// This leader cannot serve (ZooKeeper unreachable from it, say): the term ends, and the
    /// lease is given up for a replica that can.
    #[error("cannot serve: {0}")]
    CannotServe(String),
    /// The status write's test failed: the copy planned from is older than the claim.
    #[error("the status write was refused ({0}); planning again from a newer copy")]
    StatusRefused(String),
    /// A deleted claim's copy is older than the operator's own last write: its cleanup waits for
    /// the newer one (an error, so that the finalizer stays until the cleanup is done).
    #[error("this copy of the deleted claim is older than the operator's last write; waiting for the newer one")]
    OutdatedCopy,
    /// Other writers kept changing an object this read and wrote back (`numbers.rs`).
    #[error("{0}")]
    Contended(String),
    /// A grant of a lock whose fencing is enforced waits: the API server does not judge by its
    /// new token yet, or does not enforce the lock's fencing at all (`fencing.rs`).
    #[error("fencing: {0}")]
    FencingUnproven(String),
}

impl Error {
    /// The label of the reconcile error counter.
    pub fn metric_label(&self) -> String {
        match self {
            Error::GetPod { .. } => "get_pod".into(),
            Error::PatchStatus(_) | Error::StatusPatch(_) => "patch_status".into(),
            Error::Timeout { .. } => "timeout".into(),
            Error::Finalizer(_) => "finalizer".into(),
            Error::ZooKeeper(e) => format!("zookeeper_{}", e.kind()),
            Error::Malformed(_) => "malformed".into(),
            Error::Write { call, .. } => (*call).into(),
            Error::NotLeading => "not_leading".into(),
            Error::TokenFloor(_) => "token_floor".into(),
            Error::StatusRefused(_) => "status_conflict".into(),
            Error::OutdatedCopy => "outdated_copy".into(),
            Error::Contended(_) => "contended".into(),
            Error::ApiFence(_) => "api_fence".into(),
            Error::TaskPanicked(_) => "task_panicked".into(),
            Error::CannotServe(_) => "cannot_serve".into(),
            Error::EpochParam(_) => "epoch_param".into(),
            Error::Unfenced(_) => "unfenced".into(),
            Error::FencingUnproven(_) => "fencing_unproven".into(),
            Error::Proving(_) => "proving".into(),
        }
    }

    /// Whether the error is routine: the copy planned from was older than the object (the
    /// watch brings the newer one).
    pub fn is_routine(&self) -> bool {
        matches!(self, Error::StatusRefused(_) | Error::OutdatedCopy)
    }

    /// When to reconcile the claim again; `None`: not before it changes (nothing else helps).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Malformed(_) => None,
            // The watch brings the newer copy (and a reconcile) soon; this is the backstop.
            Error::StatusRefused(_) | Error::OutdatedCopy | Error::EpochParam(_) | Error::Proving(_) => {
                Some(Duration::from_millis(500))
            }
            // Tried again after a while: see api_fence's PROOF_RETRY.
            Error::Unfenced(_) => Some(Duration::from_secs(30)),
            // A policy that is missing is not installed within seconds; a slow informer is
            // waited for inside the proof.
            Error::FencingUnproven(_) => Some(Duration::from_secs(10)),
            _ => Some(RETRY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_has_its_label_and_a_malformed_claim_waits_for_a_change() {
        let refused = kube::Error::Api(Box::new(kube::core::Status::failure("forbidden", "Forbidden").with_code(403)));
        let failed = Error::GetPod { pod: "p".into(), source: refused };
        assert_eq!(failed.metric_label(), "get_pod");
        assert!(failed.to_string().starts_with("reading holder pod p: "), "{failed}");
        assert_eq!(Error::Timeout { call: "get_pod" }.metric_label(), "timeout");
        assert_eq!(Error::Malformed("a uid").retry_after(), None);
        assert_eq!(failed.retry_after(), Some(RETRY));
    }
}
