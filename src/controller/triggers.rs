//! Requests to reconcile: one claim, one gated pod, one `Lock`'s or `ClusterLock`'s status,
//! every claim (the paced walk), or a claim that may have left the API (the orphan release).
//! Each goes to the channel its controller or task reads (`reconcile_on`); a request for an
//! object of a namespace not served goes nowhere.

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use super::base::kept_pod::KeptPod;
use super::base::scopes::Scopes;
use super::base::Uid;
use crate::api::{ClusterLock, KeptClaim, Lock};

pub struct Triggers {
    pub(super) scopes: Scopes,
    /// Each scope's requests to reconcile one claim.
    pub(super) claims: Vec<UnboundedSender<ObjectRef<KeptClaim>>>,
    /// Each scope's requests to reconcile one gated pod.
    pub(super) pods: Vec<UnboundedSender<ObjectRef<KeptPod>>>,
    /// Each scope's requests to refresh one `Lock`'s status.
    pub(super) locks: Vec<UnboundedSender<ObjectRef<Lock>>>,
    pub(super) cluster_locks: UnboundedSender<ObjectRef<ClusterLock>>,
    /// Requests to reconcile every claim (see `pace`).
    pub(super) walks: mpsc::UnboundedSender<()>,
    /// Claims that may have left the API with a node still tracked (see `watch::release_orphans`).
    pub(super) orphans: mpsc::UnboundedSender<Uid>,
}

// Every channel is closed only when its controller or task has stopped, and the term's
// capabilities with it: a send that fails has nobody to tell.
impl Triggers {
    /// Asks for a reconcile of claim `object` soon.
    pub fn claim(&self, object: ObjectRef<KeptClaim>) {
        if let Some(claims) = self.scopes.of(object.namespace.as_deref()).and_then(|scope| self.claims.get(scope)) {
            let _ = claims.unbounded_send(object);
        }
    }

    /// Asks for a reconcile of gated pod `pod` soon (nothing happens if no watch has it).
    pub fn pod(&self, pod: ObjectRef<KeptPod>) {
        if let Some(pods) = self.scopes.of(pod.namespace.as_deref()).and_then(|scope| self.pods.get(scope)) {
            let _ = pods.unbounded_send(pod);
        }
    }

    /// Asks for a status refresh of `Lock` `lock`.
    pub fn lock(&self, lock: ObjectRef<Lock>) {
        if let Some(locks) = self.scopes.of(lock.namespace.as_deref()).and_then(|scope| self.locks.get(scope)) {
            let _ = locks.unbounded_send(lock);
        }
    }

    /// Asks for a status refresh of `ClusterLock` `name`.
    pub fn cluster_lock(&self, name: &str) {
        let _ = self.cluster_locks.unbounded_send(ObjectRef::new(name));
    }

    /// Asks for a reconcile of every claim served, paced (see `pace`).
    pub fn all(&self) {
        let _ = self.walks.send(());
    }

    /// Asks the orphan release to look at claim `uid`.
    pub fn orphan(&self, uid: Uid) {
        let _ = self.orphans.send(uid);
    }
}
