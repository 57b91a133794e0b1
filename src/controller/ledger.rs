//! The grant ledger: every rule about which claim may be written Held, in one place. The lock
//! engine decides who holds in ZooKeeper; the ledger keeps the API from ever showing what
//! ZooKeeper does not allow, while status writes are in flight and terms change:
//!
//! - **no two conflicting holders**: a grant waits until every claim recorded Held in a lock
//!   that conflicts with it (one of the two exclusive; with permits, all of them taken) has had
//!   its final status written;
//! - **stamped**: no grant in a lock while a claim there may still receive a deposed leader's
//!   late status write (listed at the term's start without this term's epoch) — not before each
//!   was written once in this term (docs/design.md: fencing);
//! - **one grant in flight per lock with permits**, and **fresh tokens**: the highest token
//!   granted or ended is kept per lock, so that a grant written after a hold ended carries a
//!   higher one.
//!
//! A grant is a small transaction: [`Ledger::reserve`] checks and records it in one step (two
//! grants in flight cannot both pass), then [`Ledger::commit`] when its write is answered, or
//! [`Ledger::let_go`] when it did not happen (abandoned). Claims refused are woken (sent to be reconciled)
//! the moment what they waited for goes. Pure bookkeeping, no I/O: the registry keeps it under
//! its lock, with the claims' locks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::base::Uid;
use crate::recipe::Limit;

/// Why a grant has to wait.
#[derive(Debug, PartialEq, Eq)]
pub enum GrantBlocked {
    /// This claim, recorded Held in one of the locks, conflicts with the grant: its final
    /// status first.
    Holder(Uid),
    /// These claims' statuses may still receive a deposed leader's write: this term's first
    /// (every such claim in the locks wanted, so that all are asked for at once).
    Unstamped(Vec<Uid>),
    /// This claim's grant in a lock with permits is being written: one at a time there.
    Granting(Uid),
}

/// One lock a grant is asked in: its path, whether it is wanted exclusively, and its limit.
pub type Wanted<'a> = (&'a str, bool, Limit);

/// A claim's locks (interned paths), each with whether it wants it exclusively: one, without
/// an allocation of its own, or several.
#[derive(Clone, Debug)]
pub enum Locks {
    One(Arc<str>, bool),
    Several(Box<[(Arc<str>, bool)]>),
}

impl Locks {
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, bool)> {
        let (one, several) = match self {
            Locks::One(lock, exclusive) => (Some((lock, *exclusive)), &[][..]),
            Locks::Several(locks) => (None, &locks[..]),
        };
        one.into_iter().chain(several.iter().map(|(lock, exclusive)| (lock, *exclusive)))
    }

    pub fn same(&self, locks: &[(String, bool)]) -> bool {
        self.iter().count() == locks.len() && self.iter().zip(locks).all(|((a, x), (b, y))| **a == **b && x == *y)
    }
}

#[derive(Default)]
pub struct Ledger {
    /// Lock path → the claims recorded Held there, each with whether it holds exclusively: a
    /// grant waits until no conflicting claim reads Held any more (the API must never show two).
    held: HashMap<Arc<str>, Vec<(Uid, bool)>>,
    /// Lock path → claims listed at the start of this leader's term, not final, whose status
    /// does not carry this term's epoch yet: an earlier leader's late status write could still
    /// land on any of them, so no grant is made in their lock until each was written once in
    /// this term (its epoch test then fails every such write).
    unstamped: HashMap<Arc<str>, HashSet<Uid>>,
    /// Lock path → claims whose grant was refused: each is reconciled again the moment a hold
    /// or a stamp it waited for goes, instead of polling.
    blocked: HashMap<Arc<str>, HashSet<Uid>>,
    /// Where woken claims are sent (to be reconciled); none in unit tests.
    waker: Option<tokio::sync::mpsc::UnboundedSender<Uid>>,
    /// Lock path → the highest fencing token of a grant written (or tried) or of a hold whose
    /// final status was written: a grant with permits recorded after it must carry a higher
    /// one. Kept while a claim names the lock.
    tokens: HashMap<Arc<str>, i64>,
    /// Lock path (of a lock with permits) → the claim whose grant's status write is not
    /// answered yet. Grants of such a lock are written one at a time: a grant written after a
    /// hold ended then always carries a higher token than that hold, even when grants are
    /// decided out of queue order (a claim over several locks waits for its other locks
    /// meanwhile) or a write is held up in flight.
    granting: HashMap<Arc<str>, Uid>,
}

impl Ledger {
    /// Sends the claims woken from now on to `waker`.
    pub fn wake_into(&mut self, waker: tokio::sync::mpsc::UnboundedSender<Uid>) {
        self.waker = Some(waker);
    }

    /// Checks a grant to `uid` in `wanted` and, when nothing conflicts, reserves it: the claim
    /// is recorded Held in each of `locks` (its locks as interned, with its mode in each) and,
    /// in those with permits, its write in flight. Refused, it records nothing but that the
    /// claim waits (in each of `locks`) to be woken.
    pub fn reserve(&mut self, uid: &Uid, wanted: &[Wanted<'_>], locks: &Locks) -> Result<(), GrantBlocked> {
        let holder = wanted.iter().find_map(|(lock, exclusive, limit)| self.conflict(uid, lock, *exclusive, *limit));
        let unstamped = || {
            let others: Vec<Uid> = wanted
                .iter()
                .filter_map(|(lock, _, _)| self.unstamped.get(*lock))
                .flatten()
                .filter(|c| ***c != **uid)
                .cloned()
                .collect();
            (!others.is_empty()).then_some(others)
        };
        let granting = || {
            wanted.iter().find_map(|(lock, _, limit)| {
                let other = self.granting.get(*lock).filter(|other| ***other != **uid);
                other.filter(|_| matches!(limit, Limit::Permits(_))).cloned()
            })
        };
        let blocked = match (holder, unstamped(), granting()) {
            (Some(other), _, _) => GrantBlocked::Holder(other),
            (None, Some(other), _) => GrantBlocked::Unstamped(other),
            (None, None, Some(other)) => GrantBlocked::Granting(other),
            (None, None, None) => {
                self.hold(uid, locks);
                for (lock, _, limit) in wanted {
                    if matches!(limit, Limit::Permits(_)) {
                        if let Some((interned, _)) = locks.iter().find(|(l, _)| ***l == **lock) {
                            self.granting.insert(interned.clone(), uid.clone());
                        }
                    }
                }
                return Ok(());
            }
        };
        for (lock, _) in locks.iter() {
            self.blocked.entry(lock.clone()).or_default().insert(uid.clone());
        }
        Err(blocked)
    }

    /// The grant's write was answered (it landed or never will), a newer write of the claim
    /// landed (the grant's, which tests the same copy, cannot land after it), or the claim
    /// reads Held: it is no longer in flight in any of `locks`.
    pub fn commit(&mut self, uid: &str, locks: &Locks) {
        for (lock, _) in locks.iter() {
            if self.granting.get(lock).is_some_and(|g| **g == *uid) {
                self.granting.remove(lock);
                self.wake_blocked(lock);
            }
        }
    }

    /// Claim `uid` is recorded Held in `locks` (first seen Held, or its grant reserved).
    pub fn hold(&mut self, uid: &Uid, locks: &Locks) {
        for (lock, exclusive) in locks.iter() {
            let holders = self.held.entry(lock.clone()).or_default();
            if !holders.iter().any(|(h, _)| **h == **uid) {
                holders.push((uid.clone(), exclusive));
            }
        }
    }

    /// Claim `uid` no longer reads Held: its final status was written, or the write of a grant
    /// reserved for it did not happen (the grant is abandoned). Grants that waited are woken.
    pub fn let_go(&mut self, uid: &str, locks: &Locks) {
        self.commit(uid, locks);
        for (lock, _) in locks.iter() {
            if let Some(holders) = self.held.get_mut(lock) {
                holders.retain(|(h, _)| **h != *uid);
                if holders.is_empty() {
                    self.held.remove(lock);
                }
            }
            self.wake_blocked(lock);
        }
    }

    /// Claim `uid` was listed at the start of this term, not final, without this term's epoch
    /// in its status: no grant in its locks until its first write in this term.
    pub fn expect_stamp(&mut self, uid: &Uid, locks: &Locks) {
        for (lock, _) in locks.iter() {
            self.unstamped.entry(lock.clone()).or_default().insert(uid.clone());
        }
    }

    /// Claim `uid` waits for no stamp any more (written in this term, or final, or gone).
    pub fn stamped(&mut self, uid: &str, locks: &Locks) {
        for (lock, _) in locks.iter() {
            if let Some(claims) = self.unstamped.get_mut(lock) {
                claims.remove(uid);
                if claims.is_empty() {
                    self.unstamped.remove(lock);
                }
            }
            self.wake_blocked(lock);
        }
    }

    /// Claim `uid` is gone: it waits to be woken in none of `locks`.
    pub fn forget(&mut self, uid: &str, locks: &Locks) {
        for (lock, _) in locks.iter() {
            if let Some(blocked) = self.blocked.get_mut(lock) {
                blocked.remove(uid);
                if blocked.is_empty() {
                    self.blocked.remove(lock);
                }
            }
        }
    }

    /// A grant of `lock` with `token` is being written, or the final status of a hold with
    /// `token` was written.
    pub fn token_used(&mut self, lock: &Arc<str>, token: i64) {
        let highest = self.tokens.entry(lock.clone()).or_insert(token);
        *highest = (*highest).max(token);
    }

    /// The highest token of `lock` granted or ended so far (0: none known).
    pub fn highest_token(&self, lock: &str) -> i64 {
        self.tokens.get(lock).copied().unwrap_or(0)
    }

    /// How many references to `lock` the ledger keeps once no claim names it any more.
    pub fn references(&self, lock: &str) -> usize {
        usize::from(self.tokens.contains_key(lock)) + usize::from(self.granting.contains_key(lock))
    }

    /// No claim names `lock` any more: what the ledger kept of it goes.
    pub fn drop_lock(&mut self, lock: &str) {
        self.tokens.remove(lock);
        self.granting.remove(lock);
    }

    /// Whether the ledger records nothing at all (for tests of what is left behind).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.held.is_empty() && self.unstamped.is_empty() && self.granting.is_empty() && self.blocked.is_empty()
    }

    /// Whether a grant anywhere waits for a claim's stamp (for tests).
    #[cfg(test)]
    pub fn awaits_stamps(&self) -> bool {
        !self.unstamped.is_empty()
    }

    /// Asks for claim `uid` to be reconciled (what it waited for went away).
    pub fn wake(&self, uid: Uid) {
        if let Some(waker) = &self.waker {
            // Closed only when the controller has stopped.
            let _ = waker.send(uid);
        }
    }

    /// Something a refused grant in `lock` waited for went away: those claims are reconciled
    /// again (each decides anew, and waits again if it must).
    fn wake_blocked(&mut self, lock: &str) {
        let Some(blocked) = self.blocked.remove(lock) else { return };
        if let Some(waker) = &self.waker {
            for uid in blocked {
                // Closed only when the controller has stopped.
                let _ = waker.send(uid);
            }
        }
    }

    /// The claim recorded Held in `lock` that a grant to `uid` (exclusive or not, under
    /// `limit`) conflicts with, if any.
    fn conflict(&self, uid: &str, lock: &str, exclusive: bool, limit: Limit) -> Option<Uid> {
        let holders = self.held.get(lock)?;
        let mut others = holders.iter().filter(|(other, _)| **other != *uid);
        match limit {
            Limit::Permits(n) => {
                let taken = others.clone().count();
                (taken >= n.get() as usize).then(|| others.next().map(|(o, _)| o.clone())).flatten()
            }
            Limit::Mutex => others.find(|(_, other_exclusive)| exclusive || *other_exclusive).map(|(o, _)| o.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(path: &str, exclusive: bool) -> Locks {
        Locks::One(path.into(), exclusive)
    }

    fn uid(s: &str) -> Uid {
        s.into()
    }

    #[test]
    fn a_reservation_holds_until_abandoned_and_conflicts_by_mode() {
        let mut l = Ledger::default();
        let (x, s) = (lock("/l", true), lock("/l", false));
        assert_eq!(l.reserve(&uid("a"), &[("/l", true, Limit::Mutex)], &x), Ok(()));
        assert_eq!(l.reserve(&uid("b"), &[("/l", false, Limit::Mutex)], &s), Err(GrantBlocked::Holder(uid("a"))));
        assert_eq!(l.reserve(&uid("a"), &[("/l", true, Limit::Mutex)], &x), Ok(()), "not against itself");
        l.let_go("a", &x);
        assert_eq!(l.reserve(&uid("b"), &[("/l", false, Limit::Mutex)], &s), Ok(()));
        assert_eq!(l.reserve(&uid("c"), &[("/l", false, Limit::Mutex)], &s), Ok(()), "shared beside shared");
        assert_eq!(l.reserve(&uid("d"), &[("/l", true, Limit::Mutex)], &x), Err(GrantBlocked::Holder(uid("b"))));
        l.let_go("b", &s);
        l.let_go("c", &s);
        l.forget("d", &x);
        assert!(l.is_empty(), "nothing left behind");
    }

    #[test]
    fn permits_are_counted_and_their_grants_written_one_at_a_time() {
        let mut l = Ledger::default();
        let two = Limit::from_permits(Some(2));
        let p = lock("/p", true);
        assert_eq!(l.reserve(&uid("a"), &[("/p", true, two)], &p), Ok(()));
        assert_eq!(l.reserve(&uid("b"), &[("/p", true, two)], &p), Err(GrantBlocked::Granting(uid("a"))));
        l.commit("a", &p);
        assert_eq!(l.reserve(&uid("b"), &[("/p", true, two)], &p), Ok(()));
        l.commit("b", &p);
        assert_eq!(l.reserve(&uid("c"), &[("/p", true, two)], &p), Err(GrantBlocked::Holder(uid("a"))), "both taken");
        l.let_go("a", &p);
        assert_eq!(l.reserve(&uid("c"), &[("/p", true, two)], &p), Ok(()));

        let key: Arc<str> = "/p".into();
        l.token_used(&key, 7);
        l.token_used(&key, 5);
        assert_eq!((l.highest_token("/p"), l.highest_token("/q")), (7, 0));
        assert_eq!(l.references("/p"), 2, "its token, and c's grant in flight");
        l.drop_lock("/p");
        assert_eq!(l.references("/p"), 0);
    }

    #[test]
    fn no_grant_in_a_lock_until_every_claim_there_is_stamped_and_the_refused_are_woken() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut l = Ledger::default();
        l.wake_into(tx);
        let x = lock("/l", true);
        l.expect_stamp(&uid("old"), &x);
        assert_eq!(
            l.reserve(&uid("new"), &[("/l", true, Limit::Mutex)], &x),
            Err(GrantBlocked::Unstamped(vec![uid("old")]))
        );
        assert_eq!(
            l.reserve(&uid("old"), &[("/l", true, Limit::Mutex)], &x),
            Ok(()),
            "its own stamp is its grant's write"
        );
        assert!(rx.try_recv().is_err(), "nothing went yet");
        l.stamped("old", &x);
        assert_eq!(rx.try_recv().ok(), Some(uid("new")), "woken when the stamp it waited for came");
        assert_eq!(l.reserve(&uid("new"), &[("/l", true, Limit::Mutex)], &x), Err(GrantBlocked::Holder(uid("old"))));
        l.let_go("old", &x);
        assert_eq!(rx.try_recv().ok(), Some(uid("new")), "woken when the hold it waited for went");
    }

    #[test]
    fn a_grant_over_several_locks_is_reserved_in_all_or_none() {
        let mut l = Ledger::default();
        let both = Locks::Several(vec![("/a".into(), true), ("/b".into(), false)].into());
        l.hold(&uid("s"), &lock("/b", true));
        let wanted = [("/a", true, Limit::Mutex), ("/b", false, Limit::Mutex)];
        assert_eq!(l.reserve(&uid("m"), &wanted, &both), Err(GrantBlocked::Holder(uid("s"))));
        assert_eq!(
            l.reserve(&uid("t"), &[("/a", true, Limit::Mutex)], &lock("/a", true)),
            Ok(()),
            "nothing of m in /a"
        );
        l.let_go("t", &lock("/a", true));
        l.let_go("s", &lock("/b", true));
        assert_eq!(l.reserve(&uid("m"), &wanted, &both), Ok(()));
        assert_eq!(l.reserve(&uid("x"), &[("/b", false, Limit::Mutex)], &lock("/b", false)), Ok(()));
    }
}
