//! Holder pods as this term's watch has them: what a reconcile may read of its holder pod
//! without asking the API, and the watch that keeps it.
//!
//! The store answers only what it can prove. A pod's UID is never reused and a finished pod
//! (Succeeded or Failed) never runs again, so "the pod with the claim's UID is in the store,
//! running or finished" and "the watch saw the pod with the claim's UID deleted" are facts however
//! far the store lags; a store that lags can only make a release come later (the event it lags
//! behind reconciles the claim again when it arrives). Everything else — a pod not in the store
//! (not listed yet, or created a moment ago), a pod of the same name with another UID (a newer
//! one the claim may be about, or an older one the store still shows), and a claim that is not
//! bound to a UID yet — is read from the API: a store that lags must never release a holder
//! whose pod exists, nor bind a claim to a pod that is gone.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use serde::Deserialize;

use crate::api::LockClaim;

/// What the API says about the holder pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HolderView {
    /// The claim names no holder.
    NotRequested,
    /// No pod of that name.
    Missing,
    /// The pod, with its UID and whether it has finished (Succeeded or Failed).
    Present { uid: String, finished: Option<String> },
}

/// A pod as the holder store keeps it: identity and phase, nothing else (the store holds every
/// pod of the served scopes).
#[derive(Resource, Clone, Debug, PartialEq, Deserialize)]
#[resource(inherit = "Pod")]
#[serde(from = "Pod")]
pub struct HolderPod {
    /// Name, namespace, UID, resourceVersion and deletion time.
    pub metadata: ObjectMeta,
    /// `status.phase`.
    pub phase: Option<String>,
}

impl From<Pod> for HolderPod {
    fn from(pod: Pod) -> Self {
        let Pod { metadata, status, .. } = pod;
        let metadata = ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            deletion_timestamp: metadata.deletion_timestamp,
            ..ObjectMeta::default()
        };
        HolderPod { metadata, phase: status.and_then(|s| s.phase) }
    }
}

impl HolderPod {
    fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }

    /// The view of this pod: present, finished or not. A pod being deleted is present: its
    /// containers may still run.
    pub fn view(&self) -> HolderView {
        let finished = self.phase.clone().filter(|phase| phase == "Succeeded" || phase == "Failed");
        HolderView::Present { uid: self.uid().to_string(), finished }
    }
}

/// What the store proves about the holder pod the claim is bound to (`expected`: its UID), or
/// `None` when only the API can tell (see the module's comment).
pub fn proven(expected: Option<&str>, stored: Option<&HolderPod>, deleted: Option<&str>) -> Option<HolderView> {
    let expected = expected.filter(|uid| !uid.is_empty())?;
    if deleted == Some(expected) {
        return Some(HolderView::Missing);
    }
    stored.filter(|pod| pod.uid() == expected).map(HolderPod::view)
}

/// The UID the claim is about: the one it is bound to, else the one its owner reference names
/// (the CLI's claims in a pod, and gated pods' claims, are owned by their pod).
pub fn expected_uid<'a>(claim: &'a LockClaim, pod: &str) -> Option<&'a str> {
    let bound = claim.status.as_ref().and_then(|s| s.holder_uid.as_deref());
    bound.or_else(|| {
        let owners = claim.metadata.owner_references.iter().flatten();
        owners.filter(|o| o.kind == "Pod" && o.api_version == "v1" && o.name == pod).map(|o| o.uid.as_str()).next()
    })
}

/// Each scope's holder pods, and the UIDs the watch saw deleted last under each name that
/// claims name as holder.
pub struct HolderPods {
    stores: Vec<Store<HolderPod>>,
    gone: Mutex<Gone>,
}

#[derive(Default)]
struct Gone {
    /// (namespace, name) → UID of the pod of that name the watch saw deleted last.
    uids: HashMap<(String, String), String>,
    /// Size after the last pruning: the next comes when it has doubled.
    pruned_at: usize,
}

impl HolderPods {
    pub fn new(stores: Vec<Store<HolderPod>>) -> Self {
        HolderPods { stores, gone: Mutex::default() }
    }

    /// Whether the holder pod `namespace/name` of a claim bound to `expected` may be gone: seen
    /// deleted, or not in a store that has listed every pod (absent, or another pod of its
    /// name). Before the list is in, only its deletion seen tells (the list's end looks at
    /// every claim with a holder again: see [`watch`]).
    pub fn may_be_gone(&self, namespace: &str, name: &str, expected: Option<&str>) -> bool {
        use futures::FutureExt;
        match self.proven(namespace, name, expected) {
            Some(HolderView::Present { .. } | HolderView::NotRequested) => false,
            Some(HolderView::Missing) => true,
            None => {
                expected.is_some()
                    && self
                        .stores
                        .iter()
                        .all(|store| store.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok()))
            }
        }
    }

    /// What the store proves about `namespace/name` for a claim bound to `expected`.
    pub fn proven(&self, namespace: &str, name: &str, expected: Option<&str>) -> Option<HolderView> {
        let key = ObjectRef::new(name).within(namespace);
        let stored = self.stores.iter().find_map(|store| store.get(&key));
        let gone = self.gone.lock();
        let deleted = gone.uids.get(&(namespace.to_string(), name.to_string())).map(String::as_str);
        proven(expected, stored.as_deref(), deleted)
    }

    /// The watch saw `pod` deleted. Kept while a claim names it (`claimed`); the names no
    /// claim names any more are dropped whenever the map has doubled since the last time.
    pub fn deleted(&self, pod: &HolderPod, claimed: impl Fn(&(String, String)) -> bool) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        if !claimed(&key) {
            return;
        }
        let mut gone = self.gone.lock();
        gone.uids.insert(key, pod.uid().to_string());
        if gone.uids.len() > 2 * gone.pruned_at.max(32) {
            gone.uids.retain(|key, _| claimed(key));
            gone.pruned_at = gone.uids.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, phase: Option<&str>) -> HolderPod {
        let metadata = ObjectMeta { name: Some("p".into()), uid: Some(uid.into()), ..ObjectMeta::default() };
        HolderPod { metadata, phase: phase.map(String::from) }
    }

    #[test]
    fn the_store_answers_only_for_the_bound_uid() {
        let running = pod("u1", Some("Running"));
        let present =
            |finished: Option<&str>| HolderView::Present { uid: "u1".into(), finished: finished.map(String::from) };
        assert_eq!(proven(Some("u1"), Some(&running), None), Some(present(None)));
        assert_eq!(proven(Some("u1"), Some(&pod("u1", Some("Failed"))), None), Some(present(Some("Failed"))));
        assert_eq!(proven(Some("u1"), Some(&pod("u1", Some("Succeeded"))), None), Some(present(Some("Succeeded"))));
        assert_eq!(proven(Some("u1"), None, Some("u1")), Some(HolderView::Missing), "seen deleted");
        assert_eq!(proven(Some("u1"), Some(&pod("u2", None)), Some("u1")), Some(HolderView::Missing), "replaced");
    }

    #[test]
    fn what_the_store_cannot_prove_is_left_to_the_api() {
        let running = pod("u1", Some("Running"));
        assert_eq!(proven(None, Some(&running), None), None, "not bound: the store may show an older pod");
        assert_eq!(proven(Some(""), Some(&pod("", None)), None), None, "no UID is no binding");
        assert_eq!(proven(Some("u1"), None, None), None, "not in the store: maybe not listed yet");
        assert_eq!(proven(Some("u1"), None, Some("u0")), None, "an earlier pod's deletion says nothing of this one");
        assert_eq!(proven(Some("u2"), Some(&running), None), None, "another UID: newer or older, the API knows");
    }

    #[test]
    fn a_claim_is_about_its_bound_uid_else_its_owner_pod() {
        let mut claim: LockClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": "c", "namespace": "n", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "other", "uid": "o1"},
                {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "o2"},
            ]},
            "spec": {"lockName": "l", "holder": {"podName": "p"}},
        }))
        .expect("a valid claim");
        assert_eq!(expected_uid(&claim, "p"), Some("o2"), "the owner of the holder's name");
        assert_eq!(expected_uid(&claim, "q"), None);
        claim.status = Some(crate::api::LockClaimStatus { holder_uid: Some("b1".into()), ..Default::default() });
        assert_eq!(expected_uid(&claim, "p"), Some("b1"), "the bound UID first");
    }

    #[test]
    fn deletions_are_kept_while_a_claim_names_the_pod() {
        let pods = HolderPods::new(vec![]);
        let with_ns = |uid: &str, name: &str| {
            let mut p = pod(uid, None);
            p.metadata.name = Some(name.into());
            p.metadata.namespace = Some("n".into());
            p
        };
        pods.deleted(&with_ns("u1", "p"), |_| false);
        assert_eq!(pods.proven("n", "p", Some("u1")), None, "nobody's holder: not kept");
        pods.deleted(&with_ns("u1", "p"), |_| true);
        assert_eq!(pods.proven("n", "p", Some("u1")), Some(HolderView::Missing));
        // Many more, of which only `p` stays claimed: the map is pruned as it grows.
        for i in 0..100 {
            let name = format!("p{i}");
            pods.deleted(&with_ns(&format!("x{i}"), &name), |(_, n)| n == "p" || *n == name);
        }
        assert!(pods.gone.lock().uids.len() < 100, "pruned");
        assert_eq!(pods.proven("n", "p", Some("u1")), Some(HolderView::Missing), "the claimed one stays");
    }
}
