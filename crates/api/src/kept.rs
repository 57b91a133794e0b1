//! A claim as the operator keeps it between reconciles (its watch's store holds one per claim):
//! the metadata the operator reads, the spec, and the status in a compact form. Converting it
//! back gives the claim's status exactly as it was read, because status writes start from it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{ClaimLockStatus, LockClaim, LockClaimSpec, LockClaimStatus, Phase};

/// Annotations the operator reads all start with this; no other annotation is kept.
const OWN_ANNOTATIONS: &str = "zklock.io/";

#[derive(Resource, Clone, Debug, PartialEq, Deserialize, Serialize)]
#[resource(inherit = "LockClaim")]
#[serde(from = "Listed", into = "LockClaim")]
pub struct KeptClaim {
    /// Identity, resourceVersion, generation, creation and deletion times, finalizers, owners
    /// (a pod's claim names its pod), and the `zklock.io/` annotations; no labels, managed
    /// fields or other annotations.
    pub metadata: ObjectMeta,
    pub spec: LockClaimSpec,
    pub status: Option<KeptStatus>,
    /// Why the claim could not be read as a `LockClaim` (a field of the wrong type, stored under
    /// another version of the schema); the part that could not be read is then empty. It stays
    /// in the store all the same: a claim that left the store would be taken for deleted, and
    /// its node released under a holder that may still work.
    pub unreadable: Option<Box<str>>,
    /// The order in which this process's claim watch first delivered the claim (0 until its
    /// feed numbers it): a term is handed the store in that order. Kept here, not in a map of
    /// its own: the store's copy is a claim's only entry that lives as long as the claim.
    pub arrival: u64,
}

/// `LockClaimStatus` with boxed strings and conditions whose words are shared constants.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptStatus {
    pub phase: Option<Phase>,
    pub position: Option<i64>,
    pub leader_epoch: Option<i64>,
    pub znode: Option<Box<str>>,
    ticket: Option<Box<str>>,
    observed_generation: Option<i64>,
    waiting_for: Option<Box<str>>,
    /// What a grant recorded, apart: most claims in a store are waiting, and without these
    /// five a kept claim fits the allocator's next smaller size (768 bytes, not 896).
    held: Option<Box<HeldStatus>>,
    lock: Option<Box<str>>,
    /// Where a claim over several locks stands in each (empty for one lock).
    locks: Box<[ClaimLockStatus]>,
    conditions: Box<[KeptCondition]>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct HeldStatus {
    acquired_at: Option<Time>,
    lease_expires_at: Option<Time>,
    fencing_token: Option<Box<str>>,
    holder_uid: Option<Box<str>>,
    renewed: Option<Box<str>>,
}

#[derive(Clone, Debug, PartialEq)]
struct KeptCondition {
    type_: Word,
    status: Word,
    reason: Word,
    message: Box<str>,
    last_transition_time: Time,
    observed_generation: Option<i64>,
}

/// A condition's type, status or reason: almost always one of the words the operator writes,
/// kept without an allocation of its own.
#[derive(Clone, Debug, PartialEq)]
enum Word {
    Known(&'static str),
    Other(Box<str>),
}

/// Condition statuses, and the types and reasons `controller::plan` writes.
const KNOWN_WORDS: [&str; 22] = [
    "True",
    "False",
    "Unknown",
    super::conditions::HELD,
    super::conditions::FINISHED,
    super::conditions::REVOKE_REQUESTED,
    super::conditions::INVALID,
    "Acquired",
    "Waiting",
    "Pending",
    "Revoked",
    "Expired",
    "ClaimDeleted",
    "ConnectionLost",
    "HolderGone",
    "HolderPodNotFound",
    "InvalidSpec",
    "LeaseExpired",
    "NodeDeleted",
    "SessionLost",
    "Superseded",
    "ZooKeeperError",
];

impl Word {
    fn new(s: String) -> Self {
        match KNOWN_WORDS.iter().find(|w| **w == s) {
            Some(known) => Word::Known(known),
            None => Word::Other(s.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Word::Known(s) => s,
            Word::Other(s) => s,
        }
    }
}

impl KeptClaim {
    pub fn phase(&self) -> Option<Phase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    pub fn leader_epoch(&self) -> Option<i64> {
        self.status.as_ref().and_then(|s| s.leader_epoch)
    }

    pub fn znode(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.znode.as_deref())
    }

    /// The claim's ticket (its place across sessions), if one is recorded.
    pub fn ticket(&self) -> Option<i64> {
        self.status.as_ref().and_then(|s| s.ticket.as_deref()).and_then(|t| t.parse().ok())
    }

    pub fn fencing_token(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.held.as_ref()?.fencing_token.as_deref())
    }

    /// The UID of the holder pod the claim bound to (`status.holderUID`), if it did.
    pub fn holder_uid(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.held.as_ref()?.holder_uid.as_deref())
    }

    /// When the hold's lease runs out (`status.leaseExpiresAt`), in seconds since the epoch.
    pub fn lease_expires_at(&self) -> Option<i64> {
        self.status.as_ref().and_then(|s| s.held.as_ref()?.lease_expires_at.as_ref()).map(|t| t.0.as_second())
    }

    /// Where a claim over several locks stands in each, as its status records it.
    pub fn lock_statuses(&self) -> &[ClaimLockStatus] {
        self.status.as_ref().map(|s| &s.locks[..]).unwrap_or_default()
    }

    /// The message of condition `type_`, if the claim has it.
    pub fn condition_message(&self, type_: &str) -> Option<&str> {
        let conditions = self.status.as_ref().map(|s| &s.conditions[..]).unwrap_or_default();
        conditions.iter().find(|c| c.type_.as_str() == type_).map(|c| &*c.message)
    }

    /// Whether the claim has condition `type_` with status True.
    pub fn condition_true(&self, type_: &str) -> bool {
        let conditions = self.status.as_ref().map(|s| &s.conditions[..]).unwrap_or_default();
        conditions.iter().any(|c| c.type_.as_str() == type_ && c.status.as_str() == "True")
    }

    /// The whole claim again, for planning (the dropped metadata is never read).
    pub fn to_claim(&self) -> LockClaim {
        self.clone().into()
    }
}

impl From<LockClaim> for KeptClaim {
    fn from(claim: LockClaim) -> Self {
        let LockClaim { metadata, spec, status } = claim;
        KeptClaim {
            metadata: kept_metadata(metadata),
            spec,
            status: status.map(KeptStatus::from),
            unreadable: None,
            arrival: 0,
        }
    }
}

/// A claim as listed or watched, its spec and status decoded each on its own: one claim that
/// cannot be decoded must not stop its namespace's watch (a list fails whole), nor hide what
/// can still be read of it (a status written by the operator names the nodes it holds). The
/// model is kube's `DeserializeGuard`, which keeps only the metadata of an object it cannot
/// decode.
///
/// Only what is kept is decoded: every claim passes through here on each list and on each
/// change (a fresh operator's start decodes every claim twice, its list and its re-stamp), and
/// what a claim carries besides (its managed fields above all: a nested map per writer) made
/// ~115 short-lived allocations per claim, interleaved with the ~13 that live in the store.
/// Fields not named are skipped without being built; spec and status are held as their raw
/// text (one allocation each) until decoded into their types.
#[derive(Deserialize)]
struct Listed {
    metadata: ListedMeta,
    #[serde(default)]
    spec: Option<Box<RawValue>>,
    #[serde(default)]
    status: Option<Box<RawValue>>,
}

/// The metadata the operator reads; see [`KeptClaim::metadata`].
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ListedMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(deserialize_with = "own_annotations")]
    annotations: Option<BTreeMap<String, String>>,
}

impl From<ListedMeta> for ObjectMeta {
    fn from(m: ListedMeta) -> Self {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            generation: m.generation,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            owner_references: m.owner_references,
            annotations: m.annotations,
            ..ObjectMeta::default()
        }
    }
}

/// The `zklock.io/` annotations of a claim (`None` when it has none); the values of the others
/// are skipped unread (`kubectl apply`'s last-applied configuration is a whole copy).
fn own_annotations<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Own;
    impl<'de> serde::de::Visitor<'de> for Own {
        type Value = Option<BTreeMap<String, String>>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of annotations")
        }

        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut own = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if key.starts_with(OWN_ANNOTATIONS) {
                    own.insert(key, map.next_value()?);
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok((!own.is_empty()).then_some(own))
        }
    }
    d.deserialize_option(Own)
}

/// A part decoded from its raw text, or why it could not be (absent: its default).
fn decode<T: serde::de::DeserializeOwned + Default>(raw: Option<Box<RawValue>>) -> Result<T, String> {
    raw.map_or(Ok(T::default()), |raw| serde_json::from_str(raw.get()).map_err(|e| e.to_string()))
}

impl From<Listed> for KeptClaim {
    fn from(listed: Listed) -> Self {
        let spec = decode::<LockClaimSpec>(listed.spec);
        let status = decode::<Option<LockClaimStatus>>(listed.status);
        let why: Vec<String> = [("spec", spec.as_ref().err()), ("status", status.as_ref().err())]
            .into_iter()
            .filter_map(|(part, error)| error.map(|e| format!("{part}: {e}")))
            .collect();
        KeptClaim {
            metadata: listed.metadata.into(),
            spec: spec.unwrap_or_default(),
            status: status.ok().flatten().map(KeptStatus::from),
            unreadable: (!why.is_empty()).then(|| why.join("; ").into()),
            arrival: 0,
        }
    }
}

/// The metadata the operator reads; see [`KeptClaim::metadata`].
fn kept_metadata(metadata: ObjectMeta) -> ObjectMeta {
    let annotations = metadata
        .annotations
        .map(|a| a.into_iter().filter(|(k, _)| k.starts_with(OWN_ANNOTATIONS)).collect::<BTreeMap<_, _>>())
        .filter(|a| !a.is_empty());
    ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        uid: metadata.uid,
        resource_version: metadata.resource_version,
        generation: metadata.generation,
        creation_timestamp: metadata.creation_timestamp,
        deletion_timestamp: metadata.deletion_timestamp,
        finalizers: metadata.finalizers,
        owner_references: metadata.owner_references,
        annotations,
        ..ObjectMeta::default()
    }
}

impl From<KeptClaim> for LockClaim {
    fn from(kept: KeptClaim) -> Self {
        LockClaim { metadata: kept.metadata, spec: kept.spec, status: kept.status.map(LockClaimStatus::from) }
    }
}

impl From<LockClaimStatus> for KeptStatus {
    fn from(s: LockClaimStatus) -> Self {
        KeptStatus {
            phase: s.phase,
            position: s.position,
            leader_epoch: s.leader_epoch,
            znode: s.znode.map(Into::into),
            ticket: s.ticket.map(Into::into),
            observed_generation: s.observed_generation,
            waiting_for: s.waiting_for.map(Into::into),
            held: HeldStatus {
                acquired_at: s.acquired_at,
                lease_expires_at: s.lease_expires_at,
                fencing_token: s.fencing_token.map(Into::into),
                holder_uid: s.holder_uid.map(Into::into),
                renewed: s.renewed.map(Into::into),
            }
            .kept(),
            lock: s.lock.map(Into::into),
            locks: s.locks.into(),
            conditions: s
                .conditions
                .into_iter()
                .map(|c| KeptCondition {
                    type_: Word::new(c.type_),
                    status: Word::new(c.status),
                    reason: Word::new(c.reason),
                    message: c.message.into(),
                    last_transition_time: c.last_transition_time,
                    observed_generation: c.observed_generation,
                })
                .collect(),
        }
    }
}

impl HeldStatus {
    /// Boxed if anything is set.
    fn kept(self) -> Option<Box<Self>> {
        (self != HeldStatus::default()).then(|| Box::new(self))
    }
}

impl From<KeptStatus> for LockClaimStatus {
    fn from(s: KeptStatus) -> Self {
        let HeldStatus { acquired_at, lease_expires_at, fencing_token, holder_uid, renewed } =
            s.held.map(|held| *held).unwrap_or_default();
        LockClaimStatus {
            phase: s.phase,
            position: s.position,
            waiting_for: s.waiting_for.map(Into::into),
            fencing_token: fencing_token.map(Into::into),
            znode: s.znode.map(Into::into),
            ticket: s.ticket.map(Into::into),
            holder_uid: holder_uid.map(Into::into),
            acquired_at,
            lease_expires_at,
            renewed: renewed.map(Into::into),
            conditions: s
                .conditions
                .into_vec()
                .into_iter()
                .map(|c| Condition {
                    type_: c.type_.as_str().into(),
                    status: c.status.as_str().into(),
                    reason: c.reason.as_str().into(),
                    message: c.message.into(),
                    last_transition_time: c.last_transition_time,
                    observed_generation: c.observed_generation,
                })
                .collect(),
            observed_generation: s.observed_generation,
            leader_epoch: s.leader_epoch,
            lock: s.lock.map(Into::into),
            locks: s.locks.into_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_claim_that_cannot_be_read_is_kept_with_what_can_be_and_why() {
        let listed = serde_json::json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": "bad", "namespace": "shop", "uid": "u-1", "finalizers": ["zklock.io/release"] },
            "spec": { "lockName": 7 },
            "status": { "phase": "Held", "znode": "/zklock/locks/shop/db/write-u-1-lock-0000000003" },
        });
        let kept: KeptClaim = serde_json::from_value(listed).expect("a claim that cannot be read still decodes");
        let why = kept.unreadable.as_deref().expect("it says why");
        assert!(why.starts_with("spec: ") && why.contains("invalid type"), "{why}");
        assert_eq!(kept.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(kept.metadata.finalizers, Some(vec!["zklock.io/release".to_string()]));
        assert_eq!(
            (kept.phase(), kept.znode()),
            (Some(Phase::Held), Some("/zklock/locks/shop/db/write-u-1-lock-0000000003"))
        );
        assert_eq!(kept.spec, LockClaimSpec::default());

        let readable = serde_json::to_value(demo_claim()).unwrap();
        let kept: KeptClaim = serde_json::from_value(readable).unwrap();
        assert_eq!(kept.unreadable, None);
    }

    #[test]
    fn absent_or_null_parts_read_as_their_defaults_and_other_annotations_are_skipped() {
        let listed = serde_json::json!({
            "metadata": {
                "name": "bare", "namespace": "shop", "annotations": null, "labels": {"a": "b"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {".": {}}}}],
            },
            "status": null,
        });
        let kept: KeptClaim = serde_json::from_value(listed).unwrap();
        assert_eq!((kept.unreadable, kept.spec, kept.status), (None, LockClaimSpec::default(), None));
        assert_eq!((kept.metadata.annotations, kept.metadata.labels, kept.metadata.managed_fields), (None, None, None));

        let text = r#"{"metadata": {"name": "noted", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\":{\"lockName\":\"x\"}}",
            "zklock.io/renew": "2", "zklock.io/revoke": "maintenance"}}, "spec": {"lockName": "db"}}"#;
        let kept: KeptClaim = serde_json::from_str(text).unwrap();
        let own = [("zklock.io/renew", "2"), ("zklock.io/revoke", "maintenance")];
        let own = own.map(|(k, v)| (k.to_string(), v.to_string())).into();
        assert_eq!(kept.metadata.annotations, Some(own));
        assert_eq!(kept.spec.lock_name.as_deref(), Some("db"));
        let none = r#"{"metadata": {"name": "plain", "annotations": {"team": "db"}}}"#;
        assert_eq!(serde_json::from_str::<KeptClaim>(none).unwrap().metadata.annotations, None);
    }

    fn demo_claim() -> LockClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": {
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"spec\":{}}",
                    "zklock.io/revoke": "maintenance",
                },
                "labels": {"team": "db"},
                "creationTimestamp": "2026-11-23T17:59:06Z", "finalizers": ["zklock.io/release"],
                "generation": 1, "name": "table-rebuild", "namespace": "demo", "resourceVersion": "20",
                "uid": "4bf87072-2c81-4629-9a8b-bffc030bb21d",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "rebuild-0", "uid": "p-1", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            },
            "spec": {"lockName": "sales-tables", "mode": "Exclusive", "holder": {"podName": "rebuild-0"}},
            "status": {
                "conditions": [
                    {"lastTransitionTime": "2026-11-23T17:59:06Z", "message": "2 contender(s) ahead",
                     "observedGeneration": 1, "reason": "Waiting", "status": "False", "type": "Held"},
                    {"lastTransitionTime": "2026-11-23T17:59:07Z", "message": "set by hand",
                     "reason": "SomeoneElses", "status": "Maybe", "type": "example.com/Custom"},
                ],
                "leaderEpoch": 10, "observedGeneration": 1, "phase": "Waiting", "position": 2,
                "waitingFor": "report-reader-2", "fencingToken": "17", "holderUID": "p-1", "renewed": "3",
                "ticket": "4294967301",
                "acquiredAt": "2026-11-23T17:59:06Z", "leaseExpiresAt": "2026-11-23T18:59:06Z",
                "lock": "sales-tables",
                "locks": [{"lockName": "sales-tables", "fencingToken": "17", "position": 2, "waitingFor": "report-reader-2"}],
                "znode": "/zklock/locks/demo/sales-tables/write-4bf87072-2c81-4629-9a8b-bffc030bb21d-lock-0000000002",
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_kept_claim_gives_back_its_status_spec_and_the_metadata_the_operator_reads() {
        let claim = demo_claim();
        let kept = KeptClaim::from(claim.clone());
        let back = kept.to_claim();
        assert_eq!(back.status, claim.status);
        assert_eq!(back.spec, claim.spec);
        let (m, o) = (&back.metadata, &claim.metadata);
        assert_eq!(
            (&m.name, &m.namespace, &m.uid, &m.resource_version),
            (&o.name, &o.namespace, &o.uid, &o.resource_version)
        );
        assert_eq!(
            (&m.generation, &m.creation_timestamp, &m.finalizers, &m.owner_references),
            (&o.generation, &o.creation_timestamp, &o.finalizers, &o.owner_references)
        );
        assert_eq!(m.annotations, Some([("zklock.io/revoke".to_string(), "maintenance".to_string())].into()));
        assert_eq!((&m.labels, &m.managed_fields), (&None, &None));
        assert_eq!(kept.phase(), Some(Phase::Waiting));
        assert_eq!(kept.leader_epoch(), Some(10));
        assert!(kept.znode().is_some_and(|z| z.ends_with("lock-0000000002")));
        assert_eq!(kept.ticket(), Some(4294967301));
    }

    #[test]
    fn a_kept_claim_reads_from_the_api_as_a_claim_does() {
        let json = serde_json::to_string(&demo_claim()).unwrap();
        let kept: KeptClaim = serde_json::from_str(&json).unwrap();
        assert_eq!(kept, KeptClaim::from(demo_claim()));
    }

    fn word() -> impl Strategy<Value = String> {
        prop_oneof![prop::sample::select(KNOWN_WORDS.to_vec()).prop_map(String::from), "[A-Za-z/.]{0,12}"]
    }

    proptest! {
        #[test]
        fn conditions_come_back_exactly(
            words in prop::collection::vec((word(), word(), word(), ".{0,20}", prop::option::of(any::<i64>())), 0..4)
        ) {
            let conditions: Vec<Condition> = words
                .into_iter()
                .map(|(type_, status, reason, message, observed_generation)| Condition {
                    type_, status, reason, message, observed_generation,
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                })
                .collect();
            let status = LockClaimStatus { conditions, ..LockClaimStatus::default() };
            prop_assert_eq!(LockClaimStatus::from(KeptStatus::from(status.clone())), status);
        }

        #[test]
        fn what_a_grant_recorded_comes_back_exactly(
            token in prop::option::of("[0-9]{1,6}"),
            holder in prop::option::of("[a-z0-9-]{1,12}"),
            renewed in prop::option::of("[0-9]{1,3}"),
            acquired in prop::option::of(0i64..4_000_000_000),
            expires in prop::option::of(0i64..4_000_000_000),
        ) {
            let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default());
            let status = LockClaimStatus {
                phase: Some(Phase::Held),
                fencing_token: token.clone(),
                holder_uid: holder,
                renewed,
                acquired_at: acquired.map(at),
                lease_expires_at: expires.map(at),
                ..LockClaimStatus::default()
            };
            let kept = KeptStatus::from(status.clone());
            prop_assert_eq!(kept.held.is_some(), status != LockClaimStatus { phase: Some(Phase::Held), ..Default::default() });
            let claim = KeptClaim { metadata: ObjectMeta::default(), spec: LockClaimSpec::default(), status: Some(kept.clone()), unreadable: None, arrival: 0 };
            prop_assert_eq!(claim.fencing_token(), token.as_deref());
            prop_assert_eq!(LockClaimStatus::from(kept), status);
        }
    }

    /// The store holds one `Arc<KeptClaim>` per claim: its 16-byte header and the claim fit
    /// the allocator's 768-byte size (mimalloc's sizes step by an eighth: 640, 768, 896).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_kept_claim_fits_768_bytes_with_its_arc() {
        let size = std::mem::size_of::<KeptClaim>() + 16;
        assert!(size <= 768, "an Arc<KeptClaim> takes {size} bytes");
    }
}
