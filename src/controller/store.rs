//! The claims the operator serves, as their watch last delivered them.
//!
//! Every served claim stays in memory, so each is kept as one small byte string rather than as
//! a `LockClaim` value (whose metadata alone is some 350 bytes of mostly empty fields, with a
//! separate allocation per string): its JSON, LZ4-compressed against a dictionary of typical
//! claims. Claims are alike (the same keys, conditions, finalizer and paths), so a claim of
//! about 850 bytes of JSON keeps in about a third of that. A reconcile unpacks the one claim it
//! works on, in microseconds; the operator's memory per claim is one of its design figures
//! (DESIGN.md §5).

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::{Mutex, MutexGuard};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::queue::{shrunk_capacity, Uid};
use crate::api::{conditions, LockClaim, LockClaimSpec, LockClaimStatus, Phase, FINALIZER};
use crate::recipe::Mode;

/// Annotations the operator never reads and that can be large.
const DROPPED_ANNOTATIONS: [&str; 1] = ["kubectl.kubernetes.io/last-applied-configuration"];

#[derive(Default)]
pub struct Store {
    claims: Mutex<HashMap<Uid, Entry>>,
}

struct Entry {
    /// Which watch delivered it (one per served namespace, or one for all).
    scope: u16,
    json: Box<[u8]>,
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, HashMap<Uid, Entry>> {
        self.claims.lock()
    }

    /// Keeps `claim` (what the operator reads of it) under `uid`, dropping what it never reads.
    pub fn put(&self, scope: u16, uid: &Uid, claim: &mut LockClaim) {
        claim.metadata.managed_fields = None;
        if let Some(annotations) = claim.metadata.annotations.as_mut() {
            for key in DROPPED_ANNOTATIONS {
                annotations.remove(key);
            }
        }
        let json = match serde_json::to_vec(claim) {
            Ok(json) => lz4_flex::block::compress_prepend_size_with_dict(&json, dictionary()).into_boxed_slice(),
            Err(e) => {
                // Serializing a value that was just deserialized does not fail; if it ever
                // did, the claim is not served rather than served from a wrong copy.
                tracing::error!(uid = %uid, error = %e, "could not keep a claim in memory");
                return;
            }
        };
        let mut claims = self.lock();
        match claims.get_mut(uid) {
            // Keep the map's key; only the copy changes.
            Some(entry) => *entry = Entry { scope, json },
            None => {
                claims.insert(uid.clone(), Entry { scope, json });
            }
        }
    }

    pub fn get(&self, uid: &str) -> Option<LockClaim> {
        // Copy the few hundred packed bytes out; the watch's writes need not wait for the decode.
        let packed = self.lock().get(uid)?.json.clone();
        let json = lz4_flex::block::decompress_size_prepended_with_dict(&packed, dictionary())
            .map_err(|e| e.to_string())
            .and_then(|json| serde_json::from_slice(&json).map_err(|e| e.to_string()));
        match json {
            Ok(claim) => Some(claim),
            Err(e) => {
                tracing::error!(uid, error = %e, "could not read back a claim kept in memory");
                None
            }
        }
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.lock().contains_key(uid)
    }

    /// The store's copy of a UID it keeps.
    pub fn key(&self, uid: &str) -> Option<Uid> {
        self.lock().get_key_value(uid).map(|(key, _)| key.clone())
    }

    pub fn remove(&self, uid: &str) -> bool {
        let mut claims = self.lock();
        let removed = claims.remove(uid).is_some();
        if let Some(keep) = shrunk_capacity(claims.len(), claims.capacity()) {
            claims.shrink_to(keep);
        }
        removed
    }

    /// The claims a watch delivered.
    pub fn uids_in(&self, scope: u16) -> Vec<Uid> {
        self.lock().iter().filter(|(_, e)| e.scope == scope).map(|(uid, _)| uid.clone()).collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

/// What claims are made of, serialized as the store serializes them: a waiting claim, a held
/// one with a holder pod, and a finished one. Built once; it never leaves the process, so only
/// its being the same for packing and unpacking matters.
fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        let at = Time(Timestamp::UNIX_EPOCH);
        let example = |phase: Phase, reason: &str, message: &str, held: bool, finished: bool| {
            let mut c = LockClaim::new(
                "example",
                LockClaimSpec {
                    lock_name: "example".into(),
                    mode: Mode::Exclusive,
                    holder: None,
                    acquire_timeout_seconds: None,
                    lease_duration_seconds: None,
                    revocation_grace_period_seconds: None,
                },
            );
            c.metadata.creation_timestamp = Some(at.clone());
            c.metadata.finalizers = Some(vec![FINALIZER.into()]);
            c.metadata.generation = Some(1);
            c.metadata.namespace = Some("default".into());
            c.metadata.resource_version = Some("1".into());
            c.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
            let mut status = LockClaimStatus {
                phase: Some(phase),
                position: Some(1),
                znode: Some(
                    "/zklock/locks/default/example/_c_00000000-0000-0000-0000-000000000000-lock-0000000001".into(),
                ),
                observed_generation: Some(1),
                leader_epoch: Some(4294967296),
                ..Default::default()
            };
            conditions::set(&mut status.conditions, conditions::HELD, held, reason, message, Some(1), &at);
            conditions::set(&mut status.conditions, conditions::FINISHED, finished, reason, message, Some(1), &at);
            c.status = Some(status);
            c
        };
        let waiting = example(Phase::Waiting, "Waiting", "1 contender(s) ahead", false, false);
        let mut held = example(Phase::Held, "Acquired", "the lock is held", true, false);
        held.spec.holder = Some(crate::api::Holder { pod_name: "example".into(), namespace: None });
        if let Some(s) = held.status.as_mut() {
            s.fencing_token = Some("1".into());
            s.holder_uid = Some("00000000-0000-0000-0000-000000000000".into());
            s.acquired_at = Some(at.clone());
        }
        let done = example(Phase::Released, "HolderGone", "holder pod example was deleted", false, true);
        [waiting, held, done].iter().flat_map(|c| serde_json::to_vec(c).unwrap_or_default()).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LockClaimSpec, LockClaimStatus, Phase};
    use crate::recipe::Mode;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn claim(uid: &str) -> LockClaim {
        let mut c = LockClaim::new(
            "job-a",
            LockClaimSpec {
                lock_name: "db".into(),
                mode: Mode::Shared,
                holder: None,
                acquire_timeout_seconds: Some(3),
                lease_duration_seconds: None,
                revocation_grace_period_seconds: None,
            },
        );
        c.metadata.namespace = Some("shop".into());
        c.metadata.uid = Some(uid.into());
        c.metadata.finalizers = Some(vec!["zklock.io/release".into()]);
        c.metadata.annotations = Some(
            [
                ("zklock.io/revoke".to_string(), "maintenance".to_string()),
                ("kubectl.kubernetes.io/last-applied-configuration".to_string(), "{...}".to_string()),
            ]
            .into(),
        );
        c.metadata.managed_fields =
            Some(vec![ManagedFieldsEntry { manager: Some("kubectl".into()), ..Default::default() }]);
        c.status = Some(LockClaimStatus { phase: Some(Phase::Waiting), position: Some(4), ..Default::default() });
        c
    }

    #[test]
    fn keeps_what_the_operator_reads_and_drops_the_rest() {
        let store = Store::default();
        store.put(0, &"u-1".into(), &mut claim("u-1"));
        let back = store.get("u-1").unwrap();
        let mut expected = claim("u-1");
        expected.metadata.managed_fields = None;
        expected.metadata.annotations.as_mut().unwrap().remove("kubectl.kubernetes.io/last-applied-configuration");
        assert_eq!(serde_json::to_value(back).unwrap(), serde_json::to_value(expected).unwrap());
    }

    #[test]
    fn a_newer_copy_replaces_the_old_and_scopes_are_kept_apart() {
        let store = Store::default();
        store.put(0, &"u-1".into(), &mut claim("u-1"));
        let mut newer = claim("u-1");
        newer.status.as_mut().unwrap().position = Some(1);
        store.put(0, &"u-1".into(), &mut newer);
        store.put(1, &"u-2".into(), &mut claim("u-2"));
        assert_eq!(store.len(), 2);
        assert_eq!(store.get("u-1").unwrap().status.unwrap().position, Some(1));
        assert_eq!(store.uids_in(1).iter().map(|u| &**u).collect::<Vec<_>>(), ["u-2"]);
        assert!(store.remove("u-1"));
        assert!(!store.remove("u-1"));
        assert!(store.get("u-1").is_none());
    }

    #[test]
    fn a_typical_claim_keeps_in_under_a_third_of_its_json() {
        let mut c = claim("0b5cdb41-7d7e-4f4e-9a3e-2a7e1d2c3b4a");
        c.metadata.annotations = None;
        c.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_795_000_000).unwrap()));
        let at = Time(Timestamp::from_second(1_795_000_100).unwrap());
        let status = c.status.as_mut().unwrap();
        status.znode = Some("/zklock/locks/shop/db/_c_0b5cdb41-7d7e-4f4e-9a3e-2a7e1d2c3b4a-lock-0000000045".into());
        status.waiting_for = Some("job-b".into());
        conditions::set(
            &mut status.conditions,
            conditions::HELD,
            false,
            "Waiting",
            "45 contender(s) ahead",
            Some(1),
            &at,
        );
        conditions::set(
            &mut status.conditions,
            conditions::FINISHED,
            false,
            "Waiting",
            "45 contender(s) ahead",
            Some(1),
            &at,
        );
        let json = serde_json::to_vec(&c).unwrap().len();
        let store = Store::default();
        store.put(0, &"u".into(), &mut c);
        let kept = store.lock()["u"].json.len();
        // Measured: 807 bytes of JSON kept in 224.
        assert!(kept * 3 < json, "{json} bytes of JSON kept in {kept}");
    }
}
