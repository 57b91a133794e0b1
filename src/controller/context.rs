//! What the claims' reconciles and the term's tasks work with: the engine, the registry, the
//! stores the watches fill, and the triggers that ask for a reconcile. The gated pods' and the
//! lock statuses' controllers have contexts of their own, of the same capabilities.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;

use super::base::ids::{claim_of, Part};
use super::base::scopes::Scopes;
use super::base::{claim_facts, Uid};
use super::registry::Registry;
use super::serving::Serving;
use super::stores::Stores;
use super::triggers::Triggers;
use super::writer::ApiWriter;
use super::{api_fence, fencing, history, holders, token_floor};
use crate::api::{KeptClaim, Lock};
use crate::metrics::Metrics;
use crate::zk::{Layout, LockEngine};

/// What the claims' pipeline and the term's tasks share.
pub struct Context {
    /// Every request, each with a deadline; writes only while this process leads.
    pub writer: Arc<ApiWriter>,
    /// Watches.
    pub(super) watch_client: kube::Client,
    pub engine: LockEngine,
    /// Where zklock's nodes are in ZooKeeper.
    pub layout: Layout,
    /// The namespaces served.
    pub scopes: Scopes,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Time to live after finishing for claims that set none and have no owner.
    pub default_ttl: Option<Duration>,
    /// The objects this term's watches keep.
    pub stores: Arc<Stores>,
    /// Requests to reconcile.
    pub triggers: Arc<Triggers>,
    /// What of the term is served yet, and the walk's batch in flight.
    pub serving: Arc<Serving>,
    /// Each scope's pods, as this term's watch has them, for the claims' holder pods.
    pub(super) holder_pods: holders::HolderPods,
    /// This term's fence in the API server, if the admission policy is used (docs/design.md: fencing).
    pub(super) fence: Option<api_fence::Fence>,
    /// Covers every number a status carries before it is written (see `token_floor`).
    pub(super) token_floor: Arc<token_floor::TokenFloor>,
    /// Fenced locks' holds in force, in the API server's policy, before each grant (see `fencing`).
    pub fencing: fencing::Fencing,
    /// The locks' history, written in batches off the grants' path (see `history`).
    pub history: history::History,
}

impl AsRef<Metrics> for Context {
    fn as_ref(&self) -> &Metrics {
        &self.metrics
    }
}

impl Context {
    /// Whether the engine's session is re-anchored: nothing new is enqueued, and no claim is
    /// judged by its contender, before. The engine's answer, so that it turns false the moment
    /// a session ends, before any of its contenders is reported lost.
    pub fn admitting(&self) -> bool {
        self.engine.admitting()
    }

    /// This leader's term (the token of its ZooKeeper leader epoch), stamped into every status
    /// it writes; none without leader election.
    pub fn epoch(&self) -> Option<i64> {
        self.engine.epoch()
    }

    /// One copy of a claim UID for all the operator's indexes: the registry's or the engine's if
    /// either has one.
    pub(super) fn shared_uid(&self, uid: &str) -> Uid {
        self.registry.shared_uid(uid, &self.engine)
    }

    pub(super) fn object_ref(&self, uid: &str) -> Option<ObjectRef<KeptClaim>> {
        let (namespace, name) = self.registry.object(uid)?;
        Some(ObjectRef::new(&name).within(&namespace))
    }

    /// Claim `uid`'s copy in its scope's store, when the registry knows where to look.
    pub(super) fn stored(&self, uid: &str) -> Option<Arc<KeptClaim>> {
        let (namespace, name) = self.registry.object(uid)?;
        self.stores.claim(&namespace, &name).filter(|c| c.metadata.uid.as_deref() == Some(uid))
    }

    /// Whether claim `uid`'s copy in its scope's store is being deleted.
    pub(super) fn is_being_deleted(&self, uid: &str) -> bool {
        self.stored(uid).is_some_and(|c| c.metadata.deletion_timestamp.is_some())
    }

    /// Whether claim `uid` is in its scope's store, i.e. in the API as far as its watch knows.
    pub(super) fn is_served(&self, uid: &str) -> bool {
        if self.registry.object(uid).is_none() {
            // Not delivered to this term yet (it may be in the store all the same): only a store
            // without it proves it gone. A rare path (a claim this term never saw), so a scan.
            return self.stores.has_uid(uid);
        }
        self.stored(uid).is_some()
    }

    /// The engine's contenders of claim `uid`, whatever its spec says (it may not be readable
    /// any more): to release them.
    pub(super) fn parts_tracked(&self, uid: &str) -> Vec<Part> {
        self.engine
            .ids()
            .into_iter()
            .filter(|id| claim_of(id) == uid)
            .map(|id| {
                let node = self.engine.node(&id).unwrap_or_default();
                let lock = node.rsplit_once('/').map_or_else(String::new, |(dir, _)| dir.to_string());
                // Its name as status shows it, from the directory (the history keeps it by that).
                let last = lock.rsplit('/').next().unwrap_or_default();
                let cluster = lock.strip_prefix(&self.layout.cluster_locks()).is_some_and(|r| r.starts_with('/'));
                let name =
                    if cluster { format!("{}{last}", crate::api::CLUSTER_LABEL_PREFIX) } else { last.to_string() };
                Part { lock, name, mode: crate::recipe::Mode::Exclusive, id }
            })
            .collect()
    }

    /// Asks for a reconcile of claim `uid` (or of the claim contender `uid` stands for) soon. A
    /// claim no watch knows (any more) is looked at by the orphan release instead.
    pub fn trigger(&self, uid: &str) {
        let uid = claim_of(uid);
        let Some(object) = self.object_ref(uid) else {
            self.orphan(uid);
            return;
        };
        self.triggers.claim(object);
    }

    /// Asks for a status refresh of `ClusterLock` `name`, if its watch has it.
    pub(super) fn trigger_cluster_lock(&self, name: &str) {
        if self.stores.cluster_lock(name).is_some() {
            self.triggers.cluster_lock(name);
        }
    }

    /// Asks for a status refresh of `Lock` `lock`, if its watch has it.
    pub(super) fn trigger_lock(&self, lock: ObjectRef<Lock>) {
        if self.stores.has_lock(&lock) {
            self.triggers.lock(lock);
        }
    }

    /// See [`Serving::serves`].
    pub(super) fn serves(&self, uid: &str) -> bool {
        self.serving.serves(uid, &self.registry, &self.engine)
    }

    /// [`Context::serves`] for a reconcile of `claim`: one turned away that asks for something
    /// (see `claim_facts::asks`: deleted, new, revoked) is noted first, so that the pass, when it
    /// admits the claim's locks, asks for it again (noted after the check, it could miss an
    /// admission made in between). The others wait for the walk after the pass: at a term's
    /// start every claim's reconcile comes once, and they would all stand in the queue again.
    pub(super) fn serves_reconcile(&self, uid: &Uid, claim: &KeptClaim) -> bool {
        if self.serving.anchored() {
            return true;
        }
        // A holder whose pod may be gone asks for its release: served as soon as its locks are,
        // not after the walk (which takes Held claims last).
        let asks = claim_facts::asks(claim, self.registry.recorded_phase(claim)) || self.holder_may_be_gone(claim);
        if asks {
            self.serving.defer(uid);
        }
        let serves = self.serves(uid);
        if serves && asks {
            self.serving.undefer(uid);
        }
        serves
    }

    /// Whether `claim` names a holder pod that may be gone (see `HolderPods::may_be_gone`).
    pub(super) fn holder_may_be_gone(&self, claim: &KeptClaim) -> bool {
        let (Some(holder), Some(namespace)) = (claim.spec.holder.as_ref(), claim.metadata.namespace.as_deref()) else {
            return false;
        };
        self.holder_pods.may_be_gone(namespace, &holder.pod_name, claim.holder_uid())
    }

    /// Asks again for the reconciles turned away (see [`Context::serves_reconcile`]) of claims
    /// served now: called by the pass each time it admits a lock.
    pub(super) fn serve_deferred(&self) {
        let served = self.serving.take_served(|uid| self.serves(uid));
        if !served.is_empty() {
            tracing::debug!(claims = served.len(), "claims that asked meanwhile: their locks are re-anchored");
        }
        for uid in served {
            self.trigger(&uid);
        }
    }

    pub(super) fn orphan(&self, uid: &str) {
        self.triggers.orphan(self.shared_uid(claim_of(uid)));
    }

    /// Once every scope has listed its claims (from then on, a claim missing from the stores is
    /// missing from the API): every claim the registry or the engine knows
    /// that no store has any more is looked at by the orphan release (deleted while the
    /// operator started, re-anchored, or while a watch was down).
    pub(super) fn sweep(&self) {
        if !self.serving.synced() {
            return;
        }
        let mut known = self.registry.all();
        known.extend(self.engine.ids().iter().map(|id| claim_of(id).to_string()));
        for uid in known {
            if !self.is_served(&uid) {
                self.orphan(&uid);
            }
        }
    }
}
