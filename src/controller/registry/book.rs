//! The grant book: what the registry keeps about each claim's grant and status writes (its last
//! written phase, this term's stamp, the copy the last write was planned from, re-anchoring's
//! verdict), the grant ledger that decides who may be written Held, the tokens used, and the
//! handoff clock. Under the registry's one lock, beside the claims' index: a grant is reserved
//! against the holders the index's claims record, in one step.

use std::collections::HashMap;
use std::time::Instant;

use super::{Inner, Registry};
use crate::api::{KeptClaim, Phase};
use crate::controller::base::Uid;
use crate::controller::ledger::{GrantBlocked, Ledger, Locks, Wanted};

/// How long a release waits in the registry for the grant that ends its handoff.
const RELEASE_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

/// The book's part under the registry's lock.
#[derive(Default)]
pub(super) struct Book {
    /// Who may be written Held: see [`crate::controller::ledger`].
    pub(super) ledger: Ledger,
    /// Claims per recorded phase, kept as phases change (the claims metric), so that no
    /// reconcile has to count all claims.
    counts: HashMap<Phase, i64>,
    /// Lock path → when its last holder let go (for the handoff histogram).
    released_at: HashMap<String, Instant>,
}

/// What the book keeps of one claim, in the claim's entry of the index.
#[derive(Default)]
pub(super) struct Grant {
    /// The phase last written by the operator, or the one the claim had when first seen.
    pub(super) phase: Option<Phase>,
    /// Its status was written in this leader's term: a copy without this term's epoch is
    /// older than that write.
    written: bool,
    /// The resourceVersion of the copy the operator's last successful status write was planned
    /// from: a copy with this version is older than that write (the watch brings the newer one).
    planned_from: Option<Box<str>>,
    /// The claim waits, in the `unstamped` sets of its locks, for this term's first write.
    pub(super) unstamped: bool,
    /// Why re-anchoring could not keep its hold.
    verdict: Option<Box<str>>,
}

impl Registry {
    pub fn set_phase(&self, uid: &str, phase: Option<Phase>) {
        self.lock().set_phase(uid, phase);
    }

    /// The phase last written by the operator (or first seen): a copy of the claim that reads
    /// otherwise is older than the operator's own write.
    pub fn known_phase(&self, uid: &str) -> Option<Phase> {
        self.lock().claims.get(uid).and_then(|c| c.grant.phase)
    }

    /// The claim's phase as last recorded: the operator's own last write is newer than any copy
    /// the watch may not have delivered yet.
    pub fn recorded_phase(&self, claim: &KeptClaim) -> Option<Phase> {
        kube::ResourceExt::uid(claim).and_then(|uid| self.known_phase(&uid)).or(claim.phase())
    }

    /// Reserves a grant: records `uid` as Held in all its locks unless, in one of them (given
    /// with its limit), another claim recorded Held conflicts with it (one of the two
    /// exclusive; with permits, all of them taken), or another claim may still receive a
    /// deposed leader's status write, or (with permits) another grant's write is in flight.
    /// Check and record are one step, so two grants in flight cannot both pass. A grant whose
    /// write fails is abandoned with [`Registry::abandon_grant`] (back to the phase it had); one
    /// whose write is answered, or whose claim reads Held, is committed with
    /// [`Registry::commit_grant`].
    pub fn reserve_grant(&self, uid: &str, wanted: &[Wanted<'_>]) -> Result<(), GrantBlocked> {
        let mut inner = self.lock();
        let Some((key, locks)) = inner.claims.get_key_value(uid).map(|(k, c)| (k.clone(), c.locks.clone())) else {
            // A claim the registry does not know is checked, and nothing is recorded for it.
            return inner.book.ledger.reserve(&Uid::from(uid), wanted, &Locks::Several(Box::new([])));
        };
        inner.book.ledger.reserve(&key, wanted, &locks)?;
        inner.set_phase(uid, Some(Phase::Held));
        Ok(())
    }

    /// Sends the claims woken from now on to `waker`: those whose grant waited for another
    /// claim's write (see `Ledger::wake_into`).
    pub fn wake_into(&self, waker: tokio::sync::mpsc::UnboundedSender<Uid>) {
        self.lock().book.ledger.wake_into(waker);
    }

    /// Claim `uid` was listed at the start of this term, not final, without this term's epoch
    /// in its status: see [`Grant::unstamped`].
    pub fn expect_stamp(&self, uid: &Uid) {
        let mut inner = self.lock();
        let Some((key, claim)) = inner.claims.get_key_value(uid).map(|(k, c)| (k.clone(), c.locks.clone())) else {
            return;
        };
        inner.book.ledger.expect_stamp(&key, &claim);
        if let Some(claim) = inner.claims.get_mut(uid) {
            claim.grant.unstamped = true;
        }
    }

    /// Claim `uid`'s status carries this term's epoch now (`written`: by this operator's own
    /// write), or it is final: no deposed leader's write can land on it any more.
    pub fn stamped(&self, uid: &str, written: bool) {
        let mut inner = self.lock();
        let Some(claim) = inner.claims.get_mut(uid) else { return };
        claim.grant.written |= written;
        inner.unstamp(uid);
    }

    /// Whether the operator wrote claim `uid`'s status in this term.
    pub fn written(&self, uid: &str) -> bool {
        self.lock().claims.get(uid).is_some_and(|c| c.grant.written)
    }

    /// A status write planned from the copy with `version` landed.
    pub fn planned_from(&self, uid: &str, version: &str) {
        if let Some(claim) = self.lock().claims.get_mut(uid) {
            claim.grant.planned_from = Some(version.into());
        }
    }

    /// Whether the copy with `version` is older than the operator's last status write (it was
    /// planned from that very copy): planning from it again could undo the write.
    pub fn outdated(&self, uid: &str, version: Option<&str>) -> bool {
        let inner = self.lock();
        let planned = inner.claims.get(uid).and_then(|c| c.grant.planned_from.as_deref());
        planned.is_some() && planned == version
    }

    pub fn phase_counts(&self) -> HashMap<Phase, i64> {
        self.lock().book.counts.clone()
    }

    pub fn set_verdict(&self, uid: &str, why: String) {
        if let Some(claim) = self.lock().claims.get_mut(uid) {
            claim.grant.verdict = Some(why.into());
        }
    }

    pub fn verdict(&self, uid: &str) -> Option<String> {
        self.lock().claims.get(uid).and_then(|c| c.grant.verdict.as_deref().map(String::from))
    }

    /// A grant of `lock` with `token` is being written, or the final status of a hold with
    /// `token` was written.
    pub fn token_used(&self, lock: &str, token: i64) {
        let mut inner = self.lock();
        let Some(key) = inner.strings.get(lock).cloned() else { return };
        inner.book.ledger.token_used(&key, token);
    }

    /// The highest token of `lock` granted or ended so far (0: none known).
    pub fn highest_token(&self, lock: &str) -> i64 {
        self.lock().book.ledger.highest_token(lock)
    }

    /// Claim `uid`'s grant is no longer in flight: its status write was answered, a newer write
    /// of the claim landed (the grant's write, which tests the same copy, cannot land after it),
    /// or the claim reads Held.
    pub fn commit_grant(&self, uid: &str) {
        self.lock().settle(uid);
    }

    /// The write of the grant reserved for claim `uid` did not happen: its phase goes back to
    /// `phase`, and it holds nothing.
    pub fn abandon_grant(&self, uid: &str, phase: Option<Phase>) {
        self.lock().set_phase(uid, phase);
    }

    /// Notes a holder's release for the handoff histogram. Entries no grant took within a
    /// minute go (the lock had no waiter): the map stays as small as the locks recently handed on.
    pub fn note_release(&self, lock: &str) {
        let mut inner = self.lock();
        inner.book.released_at.retain(|_, at| at.elapsed() < RELEASE_MEMORY);
        inner.book.released_at.insert(lock.to_string(), Instant::now());
    }

    /// How long ago the lock's last holder let go, once: the next grant takes it.
    pub fn take_release(&self, lock: &str) -> Option<std::time::Duration> {
        self.lock().book.released_at.remove(lock).map(|at| at.elapsed())
    }
}

impl Inner {
    /// Claim `uid` waits for no stamp any more.
    pub(super) fn unstamp(&mut self, uid: &str) {
        let Some(claim) = self.claims.get_mut(uid) else { return };
        if !std::mem::replace(&mut claim.grant.unstamped, false) {
            return;
        }
        let locks = claim.locks.clone();
        self.book.ledger.stamped(uid, &locks);
    }

    /// Claim `uid`'s grant is no longer in flight in any of its locks.
    pub(super) fn settle(&mut self, uid: &str) {
        let Some(locks) = self.claims.get(uid).map(|c| c.locks.clone()) else { return };
        self.book.ledger.commit(uid, &locks);
    }

    pub(super) fn set_phase(&mut self, uid: &str, phase: Option<Phase>) {
        let Some(c) = self.claims.get_mut(uid) else { return };
        let old = std::mem::replace(&mut c.grant.phase, phase);
        if old == phase {
            return;
        }
        let locks = c.locks.clone();
        self.count(old, -1);
        self.count(phase, 1);
        if phase == Some(Phase::Held) {
            if let Some(key) = self.claims.get_key_value(uid).map(|(k, _)| k.clone()) {
                self.book.ledger.hold(&key, &locks);
            }
        } else if old == Some(Phase::Held) {
            self.book.ledger.let_go(uid, &locks);
        }
    }

    pub(super) fn count(&mut self, phase: Option<Phase>, by: i64) {
        if let Some(phase) = phase {
            *self.book.counts.entry(phase).or_insert(0) += by;
        }
    }
}
