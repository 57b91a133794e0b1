// kube-derive takes one `printcolumn(...)` per column; clippy reads the repeated `type_ = ...`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most permits a lock may declare: far beyond any real semaphore, and small enough that a
/// first waiter's window of nodes stays cheap to judge.
pub const MAX_PERMITS: u32 = 10_000;
/// Holders named in a `Lock`'s status; the count is always whole.
pub const MAX_LISTED_HOLDERS: usize = 50;

/// Declares a lock's policy: its permits, and whether the API server enforces its fencing
/// tokens. Its name is the `lockName` the claims give; a lock without a `Lock` object (or
/// whose object declares no permits) is a mutex (Exclusive and Shared claims, as in LockClaim).
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "zklock.io",
    version = "v1alpha1",
    kind = "Lock",
    shortname = "lk",
    namespaced,
    derive = "PartialEq",
    category = "zklock",
    status = "LockStatus",
    doc = "Lock declares the permits of a zklock lock (a counting semaphore); claims name it by lockName.",
    printcolumn(name = "Permits", type_ = "integer", json_path = ".spec.permits"),
    printcolumn(name = "Held", type_ = "integer", json_path = ".status.held"),
    printcolumn(name = "Queue", type_ = "integer", json_path = ".status.queueLength"),
    printcolumn(name = "Holders", type_ = "string", json_path = ".status.holders"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct LockSpec {
    /// How many claims may hold the lock at once, one permit each whatever their mode. Raising
    /// it grants the waiters it lets in at once; lowering it takes nothing away, it only stops
    /// grants until fewer claims hold. Without it, a mutex (Exclusive and Shared claims).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub permits: Option<u32>,
    /// `Enforced`: objects of this namespace labelled `zklock.io/fenced-by: <this lock>` accept
    /// a write only with the fencing token of a hold in force (annotation
    /// `zklock.io/fencing-token`), never lower than the last they accepted; the API server
    /// refuses the rest (the chart's fencing admission policy). Each grant then waits until the
    /// API server judges by it. Default `Off`.
    #[serde(default, skip_serializing_if = "Fencing::is_off")]
    pub fencing: Fencing,
}

/// Whether the API server enforces a lock's fencing tokens on the objects it guards.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Fencing {
    /// Tokens are handed out; checking them is the resource's business.
    #[default]
    Off,
    /// Objects labelled as guarded by the lock accept only writes with a token of a hold in force.
    Enforced,
}

impl Fencing {
    pub fn is_off(&self) -> bool {
        *self == Fencing::Off
    }
}

/// What the operator last saw of the lock's claims (refreshed at most about twice a second).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockStatus {
    /// The permits in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// Claims Held.
    #[serde(default)]
    pub held: u32,
    /// The Held claims' names, oldest grant first (at most 50 are named).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
    /// Claims queued and not Held (Pending or Waiting).
    #[serde(default)]
    pub queue_length: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
