//! The term's serving state: which listings are still to come, whether re-anchoring has begun
//! or is done, the reconciles turned away meanwhile, and the paced walk's batch in flight.
//! Owned here so that only its methods change it; which claim may be served is decided here too,
//! from this, the claim's locks and the engine's admission.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch as channel;

use super::base::Uid;
use super::registry::Registry;
use crate::zk::LockEngine;

pub struct Serving {
    /// Listings not yet made once: each scope's `Lock` objects and the `ClusterLock` objects
    /// (what the permits of a lock are). Counted here rather than asked of the reflector
    /// stores: their readiness is a one-shot channel that wakes one waiter only.
    limits_unlisted: channel::Sender<usize>,
    /// Scopes whose claims are not yet all replayed into the term (see `watch::claims`): the
    /// first pass does not wait for them (it notes every claim of the stores itself before it
    /// judges any lock: see `anchor::listed_holds`), the rest of the term does.
    claims_unreplayed: channel::Sender<usize>,
    /// Set once the first re-anchoring is done: every claim is reconciled from then on.
    anchored: AtomicBool,
    /// Set once a re-anchoring pass began: before the first is done, a claim is reconciled
    /// once its locks are re-anchored (see `Context::serves`).
    reanchoring: AtomicBool,
    /// Claims whose reconcile came before the first pass re-anchored their locks: asked for
    /// again when it has (see `Context::serve_deferred`).
    deferred: parking_lot::Mutex<HashSet<Uid>>,
    /// The claims asked for by the walk's batch in flight, not reconciled since; and who waits
    /// for the batch to be done.
    walked: parking_lot::Mutex<HashSet<String>>,
    walk_done: tokio::sync::Notify,
}

impl Serving {
    /// A term's state before anything was listed: `limit_listings` listings of `Lock`s and
    /// `ClusterLock`s and `claim_scopes` replays of claims are still to come.
    pub fn new(limit_listings: usize, claim_scopes: usize) -> Self {
        Serving {
            limits_unlisted: channel::Sender::new(limit_listings),
            claims_unreplayed: channel::Sender::new(claim_scopes),
            anchored: AtomicBool::new(false),
            reanchoring: AtomicBool::new(false),
            deferred: Default::default(),
            walked: Default::default(),
            walk_done: Default::default(),
        }
    }

    /// One listing of `Lock`s or `ClusterLock`s was made for the first time.
    pub fn mark_limits_listed(&self) {
        self.limits_unlisted.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// One scope's claims were all replayed into the term for the first time.
    pub fn mark_claims_replayed(&self) {
        self.claims_unreplayed.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Whether every listing was made once and every claim replayed (from then on, an object
    /// missing from the stores is missing from the API).
    pub fn synced(&self) -> bool {
        *self.limits_unlisted.borrow() == 0 && *self.claims_unreplayed.borrow() == 0
    }

    /// Until every listing was made once and every claim replayed.
    pub async fn wait_synced(&self) {
        self.wait_limits_listed().await;
        // The sender lives in this state, so the channel cannot close while it is awaited.
        let _ = self.claims_unreplayed.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Until the `Lock`s and `ClusterLock`s were listed once: what a lock's permits are.
    pub async fn wait_limits_listed(&self) {
        let _ = self.limits_unlisted.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Whether the first re-anchoring is done.
    pub fn anchored(&self) -> bool {
        self.anchored.load(Ordering::SeqCst)
    }

    /// The first re-anchoring is done: every claim is reconciled now (the caller's walk), and
    /// none waits as deferred any more.
    pub fn set_anchored(&self) {
        self.anchored.store(true, Ordering::SeqCst);
        self.deferred.lock().clear();
    }

    /// Whether claim `uid` may be reconciled now: every claim once the term's first
    /// re-anchoring is done; while it runs, a claim the pass has re-anchored every lock of (and
    /// admitted them: see `anchor::reanchor_all`). Others are reconciled when it is over.
    pub fn serves(&self, uid: &str, registry: &Registry, engine: &LockEngine) -> bool {
        if self.anchored() {
            return true;
        }
        self.reanchoring()
            && registry
                .lock_paths(uid)
                .is_some_and(|locks| !locks.is_empty() && engine.admitting_in(locks.iter().map(|lock| &**lock)))
    }

    /// Whether a re-anchoring pass began.
    pub fn reanchoring(&self) -> bool {
        self.reanchoring.load(Ordering::SeqCst)
    }

    pub fn begin_reanchoring(&self) {
        self.reanchoring.store(true, Ordering::SeqCst);
    }

    /// Claim `uid`'s reconcile was turned away: asked for again once it is served.
    pub fn defer(&self, uid: &Uid) {
        self.deferred.lock().insert(uid.clone());
    }

    pub fn undefer(&self, uid: &Uid) {
        self.deferred.lock().remove(uid);
    }

    /// The claims turned away meanwhile.
    pub fn deferred(&self) -> Vec<Uid> {
        self.deferred.lock().iter().cloned().collect()
    }

    /// Takes the deferred claims that `served` now serves.
    pub fn take_served(&self, served: impl Fn(&Uid) -> bool) -> Vec<Uid> {
        let mut deferred = self.deferred.lock();
        let taken: Vec<Uid> = deferred.iter().filter(|uid| served(uid)).cloned().collect();
        for uid in &taken {
            deferred.remove(uid);
        }
        taken
    }

    /// The walk asks for `uids` as its next batch.
    pub fn walk_batch(&self, uids: HashSet<String>) {
        *self.walked.lock() = uids;
    }

    /// Claim `uid` was reconciled (whatever the outcome).
    pub fn reconciled(&self, uid: &str) {
        let mut walked = self.walked.lock();
        if walked.remove(uid) && walked.is_empty() {
            self.walk_done.notify_waiters();
        }
    }

    /// Waits until every claim of the walk's batch was reconciled, at most `bound`; the claims
    /// of the batch not reconciled by then (0: all were).
    pub async fn batch_done(&self, bound: Duration) -> usize {
        let done = async {
            loop {
                let notified = self.walk_done.notified();
                if self.walked.lock().is_empty() {
                    return;
                }
                notified.await;
            }
        };
        match tokio::time::timeout(bound, done).await {
            Ok(()) => 0,
            Err(_) => self.walked.lock().len(),
        }
    }

    /// The walk is over: no batch is in flight.
    pub fn walk_over(&self) {
        self.walked.lock().clear();
    }
}
