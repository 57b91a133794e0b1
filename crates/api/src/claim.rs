// kube-derive takes one `printcolumn(...)` per column; clippy reads the repeated `type_ = "string"`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use zklock_engine::recipe::Mode;

/// A request to hold a lock, or several locks together: one acquisition attempt. Claims with
/// the same lock name in a namespace contend; the spec cannot change after creation.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "zklock.io",
    version = "v1alpha1",
    kind = "LockClaim",
    namespaced,
    shortname = "lc",
    derive = "PartialEq",
    category = "zklock",
    status = "LockClaimStatus",
    doc = "LockClaim asks zklock for a lock (or several, taken together) backed by ZooKeeper; its status says Waiting or Held in queue order.",
    printcolumn(name = "Lock", type_ = "string", json_path = ".status.lock"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Position", type_ = "integer", json_path = ".status.position"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".spec.holder.podName"),
    printcolumn(name = "Fence", type_ = "string", json_path = ".status.fencingToken"),
    printcolumn(name = "Waiting For", type_ = "string", json_path = ".status.waitingFor", priority = 1),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Finished\")].reason",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec is immutable: a claim is one acquisition attempt; create a new claim instead"))]
#[x_kube(validation = Rule::new("[has(self.lockName), has(self.clusterLockName), has(self.locks)].filter(x, x).size() == 1").message("give exactly one of spec.lockName (one lock), spec.clusterLockName (one ClusterLock) and spec.locks (several locks, taken together)"))]
#[x_kube(validation = Rule::new("!has(self.locks) || self.locks.all(a, self.locks.filter(b, (has(a.lockName) && has(b.lockName) && a.lockName == b.lockName) || (has(a.clusterLockName) && has(b.clusterLockName) && a.clusterLockName == b.clusterLockName)).size() <= 1)").message("spec.locks names a lock twice: name each lock once (with the mode it is needed in)"))]
#[x_kube(validation = Rule::new("!has(self.locks) || !has(self.mode)").message("spec.mode goes with spec.lockName or spec.clusterLockName: give each entry of spec.locks its own mode"))]
#[x_kube(validation = Rule::new("!has(self.locks) || !has(self.supersede)").message("spec.supersede goes with spec.lockName or spec.clusterLockName: a claim over several locks cannot be superseded"))]
#[x_kube(validation = Rule::new("!has(self.supersede) || !has(self.acquireTimeoutSeconds) || self.acquireTimeoutSeconds > 0").message("spec.supersede with acquireTimeoutSeconds 0: a claim that never waits supersedes nothing; give a timeout above 0 or no group"))]
#[serde(rename_all = "camelCase")]
pub struct LockClaimSpec {
    /// The one lock this claim asks for: claims with the same lockName in a namespace contend.
    /// Exactly one of lockName and locks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"))]
    pub lock_name: Option<String>,

    /// The one `ClusterLock` this claim asks for: shared by the namespaces its namespaceSelector
    /// admits, and by every cluster whose operators name the same shared ZooKeeper root.
    /// Exactly one of lockName, clusterLockName and locks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"))]
    pub cluster_lock_name: Option<String>,

    /// With lockName or clusterLockName: Exclusive (one holder, the default) or Shared (any
    /// number of Shared holders, no Exclusive one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,

    /// Several locks, taken together: the claim is Held only while it holds every one of them,
    /// and holds none before that; it keeps its place in each lock's queue meanwhile (1 to 16
    /// distinct locks, namespaced ones and ClusterLocks alike). Exactly one of lockName,
    /// clusterLockName and locks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_LOCKS), extend("x-kubernetes-list-type" = "atomic"))]
    pub locks: Option<Vec<LockRef>>,

    /// The pod the claim lives and dies with: released when the pod is deleted, finishes, or is
    /// replaced by a new pod of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,

    /// Give up (phase Expired) if not Held after this many seconds; 0 = try once, never queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31_536_000))]
    pub acquire_timeout_seconds: Option<i64>,

    /// Longest hold without renewal (annotation zklock.io/renew); then phase Released with
    /// reason LeaseExpired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub lease_duration_seconds: Option<i64>,

    /// Time a revoked holder gets to let go before the lock is taken away (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86_400))]
    pub revocation_grace_period_seconds: Option<i64>,

    /// Delete the claim this many seconds after it reached a final phase (as in Job); unset:
    /// keep it (or the operator's default, for claims that have no owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31_536_000))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Newest wins: while this claim waits, a newer claim of the same lock, namespace and group
    /// ends it (phase Superseded, the newer claim named). A holder is never superseded. Only
    /// with lockName or clusterLockName.
    // Boxed: the store keeps every claim's spec, and one more inline string would take each
    // kept claim past the allocator's 768-byte size (see `kept`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersede: Option<Box<Supersede>>,
}

/// How a waiting claim gives way to newer ones (`spec.supersede`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Supersede {
    /// Claims of the same lock and namespace that share this group supersede each other while
    /// they wait: the one that entered the queue last stays (a deploy pipeline's group: only
    /// the newest waiting deploy of an environment is worth running).
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"))]
    pub group: String,
}

/// Most locks one claim may take together.
pub const MAX_LOCKS: usize = 16;

/// How a `ClusterLock`'s name starts in a claim's status and `kubectl get` (`cluster/NAME`).
pub const CLUSTER_LABEL_PREFIX: &str = "cluster/";

/// One of the locks of a claim over several (`spec.locks`): a lock of the claim's namespace
/// (`lockName`) or a `ClusterLock` (`clusterLockName`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.lockName) != has(self.clusterLockName)").message("give each entry of spec.locks exactly one of lockName and clusterLockName"))]
#[serde(rename_all = "camelCase")]
pub struct LockRef {
    /// A lock of the claim's namespace: claims naming the same lock in a namespace contend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"))]
    pub lock_name: Option<String>,
    /// A `ClusterLock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"))]
    pub cluster_lock_name: Option<String>,
    /// Exclusive (the default) or Shared, in this lock.
    #[serde(default)]
    pub mode: Mode,
}

impl LockClaimSpec {
    /// The spec of a claim for one lock.
    pub fn one(lock_name: impl Into<String>, mode: Mode) -> Self {
        LockClaimSpec {
            lock_name: Some(lock_name.into()),
            cluster_lock_name: None,
            mode: Some(mode),
            locks: None,
            holder: None,
            acquire_timeout_seconds: None,
            lease_duration_seconds: None,
            revocation_grace_period_seconds: None,
            ttl_seconds_after_finished: None,
            supersede: None,
        }
    }

    /// The spec of a claim for one `ClusterLock`.
    pub fn one_cluster_lock(name: impl Into<String>, mode: Mode) -> Self {
        LockClaimSpec { lock_name: None, cluster_lock_name: Some(name.into()), ..LockClaimSpec::one("", mode) }
    }

    /// The locks asked for, each with its mode, as written (not validated): `lockName` or
    /// `clusterLockName` and `mode` as one, or the entries of `locks`.
    pub fn lock_refs(&self) -> Vec<LockRef> {
        let mode = self.mode.unwrap_or_default();
        match (&self.lock_name, &self.cluster_lock_name, &self.locks) {
            (Some(name), _, _) => vec![LockRef::namespaced(name, mode)],
            (None, Some(name), _) => vec![LockRef::cluster(name, mode)],
            (None, None, Some(locks)) => locks.clone(),
            (None, None, None) => vec![],
        }
    }

    /// The locks asked for as [`Self::lock_refs`] gives them, borrowed from the spec: for
    /// readers of every claim at once (a metrics scrape), which should not copy each name.
    pub fn lock_names(&self) -> impl Iterator<Item = LockName<'_>> {
        let one = match (&self.lock_name, &self.cluster_lock_name) {
            (Some(name), _) => Some(LockName::Namespaced(name)),
            (None, Some(name)) => Some(LockName::Cluster(name)),
            (None, None) => None,
        };
        let several = match one {
            Some(_) => None,
            None => self.locks.as_deref(),
        };
        one.into_iter().chain(several.into_iter().flatten().map(LockRef::name))
    }

    /// Whether the claim names lock `name` of its namespace.
    pub fn names_lock(&self, name: &str) -> bool {
        self.lock_refs().iter().any(|l| l.lock_name.as_deref() == Some(name))
    }

    /// Whether the claim names `ClusterLock` `name`.
    pub fn names_cluster_lock(&self, name: &str) -> bool {
        self.lock_refs().iter().any(|l| l.cluster_lock_name.as_deref() == Some(name))
    }

    /// The lock names, joined with commas (what `kubectl get lc` shows, `a,b`; a `ClusterLock`
    /// as `cluster/NAME`).
    pub fn lock_label(&self) -> String {
        self.lock_refs().iter().map(LockRef::label).collect::<Vec<_>>().join(",")
    }
}

impl LockRef {
    /// An entry for lock `name` of the claim's namespace.
    pub fn namespaced(name: impl Into<String>, mode: Mode) -> Self {
        LockRef { lock_name: Some(name.into()), cluster_lock_name: None, mode }
    }

    /// An entry for `ClusterLock` `name`.
    pub fn cluster(name: impl Into<String>, mode: Mode) -> Self {
        LockRef { lock_name: None, cluster_lock_name: Some(name.into()), mode }
    }

    /// The name as status and `kubectl get` show it: `NAME`, or `cluster/NAME` for a
    /// `ClusterLock` (a lock name has no `/`, so the two cannot be confused).
    pub fn label(&self) -> String {
        self.name().label()
    }

    /// The lock this entry names, borrowed.
    pub fn name(&self) -> LockName<'_> {
        match (&self.lock_name, &self.cluster_lock_name) {
            (Some(name), _) => LockName::Namespaced(name),
            (None, Some(name)) => LockName::Cluster(name),
            // Refused by the schema's rule; shown as an empty name, as written.
            (None, None) => LockName::Namespaced(""),
        }
    }
}

/// A lock a claim names, borrowed from its spec. Ordered as its label's text.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum LockName<'a> {
    /// A lock of the claim's namespace.
    Namespaced(&'a str),
    /// A `ClusterLock`.
    Cluster(&'a str),
}

impl<'a> LockName<'a> {
    /// `NAME`, or `cluster/NAME` for a `ClusterLock` (see [`LockRef::label`]).
    pub fn label(&self) -> String {
        let (prefix, name) = self.label_parts();
        format!("{prefix}{name}")
    }

    fn label_parts(&self) -> (&'static str, &'a str) {
        match *self {
            LockName::Namespaced(name) => ("", name),
            LockName::Cluster(name) => (CLUSTER_LABEL_PREFIX, name),
        }
    }
}

impl Ord for LockName<'_> {
    /// As the labels' text compares, without making them (a lock name has no `/`, so two
    /// different names never have the same label).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let ((pa, na), (pb, nb)) = (self.label_parts(), other.label_parts());
        pa.bytes().chain(na.bytes()).cmp(pb.bytes().chain(nb.bytes()))
    }
}

impl PartialOrd for LockName<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// Name of the pod, in the claim's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub pod_name: String,
    /// Must be the claim's namespace if given (a claim cannot bind to another namespace's pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Where a claim stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Accepted; node not created yet.
    Pending,
    /// Node created; something ahead of it.
    Waiting,
    /// Granted.
    Held,
    /// Final: the holder pod went away, or the lease ran out.
    Released,
    /// Final: revocation requested and the grace period ran out (or it was still waiting).
    Revoked,
    /// Final: not Held within acquireTimeoutSeconds.
    Expired,
    /// Final: the node vanished without a release and continuity cannot be proven.
    Lost,
    /// Final: the spec cannot be served; the Invalid condition says why.
    Invalid,
    /// Final: while it waited, a newer claim of its group (spec.supersede) took its place.
    Superseded,
}

impl Phase {
    pub fn is_terminal(self) -> bool {
        !matches!(self, Phase::Pending | Phase::Waiting | Phase::Held)
    }

    pub const ALL: [Phase; 9] = [
        Phase::Pending,
        Phase::Waiting,
        Phase::Held,
        Phase::Released,
        Phase::Revoked,
        Phase::Expired,
        Phase::Lost,
        Phase::Invalid,
        Phase::Superseded,
    ];
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Contenders ahead of this claim (0 when Held). Refreshed in batches for long queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<i64>,
    /// The claim, or foreign znode, this claim is queued behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// czxid of the node at acquisition, as a decimal string; increases with every grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<String>,
    /// The claim's znode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub znode: Option<String>,
    /// The claim's place in its locks' queues, as a decimal string: the zxid of its first
    /// enqueue. Kept when a new ZooKeeper session or leader re-creates the claim's nodes, which
    /// it re-creates in this order (their sequence numbers start anew each time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
    /// UID of the holder pod the claim bound to on first sight.
    #[serde(default, rename = "holderUID", skip_serializing_if = "Option::is_none")]
    pub holder_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<Time>,
    /// The zklock.io/renew value the lease timer was last restarted for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed: Option<String>,
    /// Keyed by type (a list-map): server-side apply and strategic tools merge them by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The term of the operator leader that wrote this status (the zxid of its leader-epoch
    /// bump). A status below the epoch in force is refused by the API server (the chart's
    /// admission policy), so that a deposed leader's late writes fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_epoch: Option<i64>,
    /// The lock names, comma-separated (the LOCK column of `kubectl get lockclaims`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// A claim over several locks (spec.locks): where it stands in each, in the order of
    /// spec.locks. position and waitingFor above say where it is furthest back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<ClaimLockStatus>,
}

/// Where a claim over several locks stands in one of them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLockStatus {
    pub lock_name: String,
    /// The fencing token of this lock's grant, once the claim is Held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<String>,
    /// The claim's znode in this lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub znode: Option<String>,
    /// Contenders ahead of the claim in this lock (0 when it holds this lock's part).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<i64>,
    /// The claim, or foreign znode, it is queued behind in this lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}
