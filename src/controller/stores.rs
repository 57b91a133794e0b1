//! The objects this term's watches keep: each scope's claims and `Lock`s, and the
//! `ClusterLock`s. Read-only here; each watch's reflector writes its own store.

use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};

use super::base::scopes::Scopes;
use crate::api::{ClusterLock, KeptClaim, Lock};

pub struct Stores {
    scopes: Scopes,
    /// Each scope's claims, as its watch last delivered them (index = scope).
    claims: Vec<Store<KeptClaim>>,
    /// Each scope's `Lock` objects.
    locks: Vec<Store<Lock>>,
    cluster_locks: Store<ClusterLock>,
}

impl Stores {
    pub fn new(
        scopes: Scopes,
        claims: Vec<Store<KeptClaim>>,
        locks: Vec<Store<Lock>>,
        cluster_locks: Store<ClusterLock>,
    ) -> Self {
        Stores { scopes, claims, locks, cluster_locks }
    }

    /// Each scope's claims.
    pub fn claims(&self) -> &[Store<KeptClaim>] {
        &self.claims
    }

    /// Every claim served, as the watches last delivered them.
    pub fn all_claims(&self) -> impl Iterator<Item = Arc<KeptClaim>> + '_ {
        self.claims.iter().flat_map(|store| store.state())
    }

    /// Claim `name` of `namespace` as its scope's watch last delivered it.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Arc<KeptClaim>> {
        let object = ObjectRef::new(name).within(namespace);
        self.scopes.of(Some(namespace)).and_then(|scope| self.claims.get(scope)).and_then(|store| store.get(&object))
    }

    /// Whether a store has claim `object` with UID `uid` (`None`: any UID).
    pub fn has_claim(&self, object: &ObjectRef<KeptClaim>, uid: Option<&str>) -> bool {
        self.claims
            .iter()
            .any(|store| store.get(object).is_some_and(|c| uid.is_none() || c.metadata.uid.as_deref() == uid))
    }

    /// Whether a store has a claim of UID `uid`: a scan of every store (for a claim not known
    /// by name).
    pub fn has_uid(&self, uid: &str) -> bool {
        self.claims.iter().any(|store| store.find(|c| c.metadata.uid.as_deref() == Some(uid)).is_some())
    }

    /// Whether its scope's watch has `Lock` `lock`.
    pub fn has_lock(&self, lock: &ObjectRef<Lock>) -> bool {
        let scope = self.scopes.of(lock.namespace.as_deref());
        scope.and_then(|scope| self.locks.get(scope)).is_some_and(|store| store.get(lock).is_some())
    }

    /// `Lock` `name` of `namespace`, if its scope's watch has it.
    pub fn lock(&self, namespace: &str, name: &str) -> Option<Arc<Lock>> {
        let object = ObjectRef::new(name).within(namespace);
        self.scopes.of(Some(namespace)).and_then(|scope| self.locks.get(scope)).and_then(|store| store.get(&object))
    }

    /// `ClusterLock` `name`, if its watch has it.
    pub fn cluster_lock(&self, name: &str) -> Option<Arc<ClusterLock>> {
        self.cluster_locks.get(&ObjectRef::new(name))
    }
}
