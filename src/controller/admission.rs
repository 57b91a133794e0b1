//! The admission gate: claims of one lock enter its queue in creation order, although they are
//! reconciled concurrently, in whatever order kube-runtime's scheduler picks them (under a
//! backlog that is no order at all). A claim waits at its lock's gate from the moment the watch
//! first delivers it until it is enqueued (or cannot be now); only the first one at the gate
//! may enqueue, and the one behind it is asked for the moment it leaves. Creation times have
//! whole seconds only, so claims of one second go in the order the watch delivered them.
//!
//! A claim first at the gate that cannot enter must not hold the others up for good. Its
//! patience is counted from its first reconcile since it arrived that could enter (one that
//! only adds the finalizer cannot: see `claim::finalized`), not from its arrival: a claim
//! not reconciled yet is waiting for its turn behind a backlog of other reconciles, which says
//! nothing about whether it can enter (counted from the arrival, a backlog longer than the
//! patience let every claim go ahead of the ones seen before it). Once reconciled, a claim that
//! stays at the gate for [`PATIENCE`] without entering (its reconcile keeps failing, say) no
//! longer holds the others up; one never reconciled with its finalizer on (not at all, or its
//! finalizer cannot be added), after [`UNTRIED_PATIENCE`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::base::Uid;

/// How long a claim that was reconciled holds back the claims created after it.
pub const PATIENCE: Duration = Duration::from_secs(5);
/// How long a claim seen but not reconciled since (with its finalizer on) holds them back: a
/// backstop only, against a claim whose turn never comes (every claim seen is reconciled; its
/// finalizer fails to go on only where the operator may not patch claims). Long, because
/// a claim's turn can be long in coming: kube-runtime's scheduler takes the due reconciles out
/// of a hash set, in no order, so under a burst one claim may wait far longer than the others
/// (1,000 locks of ten claims made at once: with a minute here, 108 locks took a claim out of
/// its creation place).
pub const UNTRIED_PATIENCE: Duration = Duration::from_secs(300);

/// A claim's place at a gate: (creation second, first-seen order).
pub type Place = (i64, u64);

/// Whether a claim may enqueue now.
#[derive(Debug, PartialEq, Eq)]
pub enum Turn {
    First,
    /// Behind a claim created before it: it is asked for when that one leaves; at the latest
    /// it looks again after this long (when the one ahead may have run out of patience).
    Behind(Duration),
}

struct Entry {
    uid: Uid,
    arrived: Instant,
    /// The claim's first reconcile since it arrived that could enter (its finalizer on).
    tried: Option<Instant>,
}

impl Entry {
    /// When this claim stops holding back the claims behind it.
    fn expires(&self) -> Instant {
        match self.tried {
            Some(tried) => tried + PATIENCE,
            None => self.arrived + UNTRIED_PATIENCE,
        }
    }
}

/// Claims that stopped holding back those behind them (left their gate without entering), by
/// why.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Overtaken {
    /// Reconciled as the first at the gate, and not entered within [`PATIENCE`].
    pub patience: u64,
    /// Not reconciled (with its finalizer on) within [`UNTRIED_PATIENCE`] of being seen.
    pub untried: u64,
}

/// The gates of the locks with claims waiting at them (no empty gate is kept).
#[derive(Default)]
pub struct Gates {
    locks: HashMap<String, BTreeMap<Place, Entry>>,
    overtaken: Overtaken,
}

impl Gates {
    /// Claim `uid` arrives at `lock`'s gate (unless it is there already).
    pub fn arrive(&mut self, lock: &str, place: Place, uid: &Uid, now: Instant) {
        let gate = self.locks.entry(lock.to_string()).or_default();
        gate.entry(place).or_insert_with(|| Entry { uid: uid.clone(), arrived: now, tried: None });
    }

    /// Claim `uid` is being reconciled: if it is first at the gate of each of its `locks`
    /// where it waits (it may enter now), its patience runs from now, unless it had begun.
    pub fn reconciling(&mut self, locks: &[impl AsRef<str>], place: Place, uid: &str, now: Instant) {
        let first_where_waiting = locks.iter().all(|lock| {
            let Some(gate) = self.locks.get(lock.as_ref()) else { return true };
            gate.get(&place).is_none_or(|e| &*e.uid != uid)
                || gate.first_key_value().is_some_and(|(first, _)| *first == place)
        });
        if first_where_waiting {
            self.tried(locks, place, uid, now);
        }
    }

    fn tried(&mut self, locks: &[impl AsRef<str>], place: Place, uid: &str, now: Instant) {
        for lock in locks {
            let entry = self.locks.get_mut(lock.as_ref()).and_then(|gate| gate.get_mut(&place));
            if let Some(entry) = entry.filter(|e| &*e.uid == uid) {
                entry.tried.get_or_insert(now);
            }
        }
    }

    /// Whether claim `uid` is first at the gate of every one of its `locks` (it arrives at
    /// each if it was not). Claims ahead of it whose patience ran out leave the gate. First
    /// everywhere, its own patience runs from now (unless it had begun): it may enter.
    pub fn may_enqueue(&mut self, locks: &[impl AsRef<str>], place: Place, uid: &Uid, now: Instant) -> Turn {
        let mut turn = Turn::First;
        for lock in locks {
            turn = turn.and(self.turn_at(lock.as_ref(), place, uid, now));
        }
        if turn == Turn::First {
            self.tried(locks, place, uid, now);
        }
        turn
    }

    fn turn_at(&mut self, lock: &str, place: Place, uid: &Uid, now: Instant) -> Turn {
        let gate = self.locks.entry(lock.to_string()).or_default();
        let overtaken = &mut self.overtaken;
        gate.retain(|_, e| {
            let keep = e.uid == *uid || e.expires() > now;
            if !keep {
                *match e.tried {
                    Some(_) => &mut overtaken.patience,
                    None => &mut overtaken.untried,
                } += 1;
            }
            keep
        });
        gate.entry(place).or_insert_with(|| Entry { uid: uid.clone(), arrived: now, tried: None });
        match gate.first_key_value() {
            Some((_, first)) if first.uid == *uid => Turn::First,
            // Another claim created earlier.
            _ => {
                let soonest = gate.range(..place).map(|(_, e)| e.expires()).min().unwrap_or(now);
                Turn::Behind(soonest.saturating_duration_since(now).clamp(Duration::from_millis(100), PATIENCE))
            }
        }
    }

    /// The claims that stopped holding others back since the last asking.
    pub fn take_overtaken(&mut self) -> Overtaken {
        std::mem::take(&mut self.overtaken)
    }

    /// Claim `uid` leaves `lock`'s gate; answers the claim first there now, if it was there.
    pub fn leave(&mut self, lock: &str, uid: &str) -> Option<Uid> {
        let gate = self.locks.get_mut(lock)?;
        let before = gate.len();
        gate.retain(|_, e| *e.uid != *uid);
        if gate.len() == before {
            return None;
        }
        let next = gate.first_key_value().map(|(_, e)| e.uid.clone());
        if gate.is_empty() {
            self.locks.remove(lock);
        }
        next
    }

    /// No claim waits at any gate.
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    /// Locks with a gate.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.locks.len()
    }
}

impl Turn {
    /// Both turns at once (a claim over several locks): first only if first at both.
    pub fn and(self, other: Turn) -> Turn {
        match (self, other) {
            (Turn::First, Turn::First) => Turn::First,
            (Turn::Behind(a), Turn::Behind(b)) => Turn::Behind(a.min(b)),
            (Turn::Behind(wait), Turn::First) | (Turn::First, Turn::Behind(wait)) => Turn::Behind(wait),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: [&str; 1] = ["/l"];

    fn behind(turn: Turn) -> bool {
        matches!(turn, Turn::Behind(_))
    }

    #[test]
    fn the_earliest_created_goes_first_then_the_first_seen_and_a_leaver_lets_the_next_go() {
        let mut gates = Gates::default();
        let now = Instant::now();
        let (a, b, c): (Uid, Uid, Uid) = ("a".into(), "b".into(), "c".into());
        gates.arrive("/l", (10, 3), &c, now);
        gates.arrive("/l", (10, 2), &b, now);
        assert!(behind(gates.may_enqueue(&L, (11, 1), &a, now)), "created a second later, a waits");
        assert_eq!(gates.may_enqueue(&L, (10, 2), &b, now), Turn::First, "same second as c, seen first");
        assert_eq!(gates.leave("/l", "b").as_deref(), Some("c"));
        assert_eq!(gates.leave("/l", "b"), None, "not there any more");
        assert_eq!(gates.may_enqueue(&["/other"], (99, 9), &a, now), Turn::First, "gates are per lock");
        gates.leave("/l", "c");
        gates.leave("/l", "a");
        gates.leave("/other", "a");
        assert_eq!(gates.len(), 0, "no empty gate is kept");
    }

    #[test]
    fn a_claim_not_reconciled_yet_holds_the_later_ones_back_however_long_the_backlog() {
        let mut gates = Gates::default();
        let start = Instant::now();
        let (early, late): (Uid, Uid) = ("early".into(), "late".into());
        gates.arrive("/l", (10, 1), &early, start);
        gates.arrive("/l", (10, 2), &late, start);
        let later = start + PATIENCE * 6;
        assert_eq!(
            gates.may_enqueue(&L, (10, 2), &late, later),
            Turn::Behind(PATIENCE),
            "30 s behind a backlog: early has not had its turn, so late still waits (and looks again in 5 s)"
        );
        gates.reconciling(&L, (10, 1), "early", later);
        assert_eq!(gates.may_enqueue(&L, (10, 1), &early, later), Turn::First);
        assert_eq!(gates.leave("/l", "early").as_deref(), Some("late"), "late is asked for");
    }

    #[test]
    fn a_claim_behind_another_has_no_patience_counted_until_it_is_first() {
        let mut gates = Gates::default();
        let start = Instant::now();
        let (a, b, c): (Uid, Uid, Uid) = ("a".into(), "b".into(), "c".into());
        for (uid, seen) in [(&a, 1), (&b, 2), (&c, 3)] {
            gates.arrive("/l", (10, seen), uid, start);
        }
        gates.reconciling(&L, (10, 2), "b", start);
        assert!(behind(gates.may_enqueue(&L, (10, 2), &b, start)), "b waits behind a");
        let later = start + PATIENCE * 2;
        assert_eq!(gates.may_enqueue(&L, (10, 1), &a, later), Turn::First);
        assert_eq!(gates.leave("/l", "a").as_deref(), Some("b"));
        assert!(
            behind(gates.may_enqueue(&L, (10, 3), &c, later)),
            "b, asked for and not reconciled yet, still goes before c: its wait behind a was no failure of its own"
        );
    }

    #[test]
    fn a_claim_that_was_reconciled_and_cannot_enter_lets_the_others_go_after_its_patience() {
        let mut gates = Gates::default();
        let start = Instant::now();
        let (stuck, next): (Uid, Uid) = ("stuck".into(), "next".into());
        gates.arrive("/l", (10, 1), &stuck, start);
        gates.arrive("/l", (10, 2), &next, start);
        let tried = start + Duration::from_secs(20);
        gates.reconciling(&L, (10, 1), "stuck", tried);
        gates.reconciling(&L, (10, 1), "stuck", tried + Duration::from_secs(3));
        assert_eq!(
            gates.may_enqueue(&L, (10, 2), &next, tried + Duration::from_secs(1)),
            Turn::Behind(Duration::from_secs(4)),
            "its patience runs from its first reconcile, not from its later ones"
        );
        assert_eq!(gates.may_enqueue(&L, (10, 2), &next, tried + PATIENCE), Turn::First);
        assert_eq!(gates.take_overtaken(), Overtaken { patience: 1, untried: 0 });
        assert_eq!(gates.take_overtaken(), Overtaken::default(), "counted once");
    }

    #[test]
    fn a_claim_never_reconciled_lets_the_others_go_after_the_backstop() {
        let mut gates = Gates::default();
        let start = Instant::now();
        let (never, next): (Uid, Uid) = ("never".into(), "next".into());
        gates.arrive("/l", (10, 1), &never, start);
        let almost = start + UNTRIED_PATIENCE - Duration::from_secs(1);
        assert!(behind(gates.may_enqueue(&L, (10, 2), &next, almost)));
        assert_eq!(gates.may_enqueue(&L, (10, 2), &next, start + UNTRIED_PATIENCE), Turn::First);
        assert_eq!(gates.take_overtaken(), Overtaken { patience: 0, untried: 1 });
    }

    #[test]
    fn over_several_locks_patience_runs_only_once_first_at_every_gate() {
        let mut gates = Gates::default();
        let start = Instant::now();
        let (a, both, b): (Uid, Uid, Uid) = ("a".into(), "both".into(), "b".into());
        gates.arrive("/a", (10, 1), &a, start);
        gates.arrive("/a", (10, 2), &both, start);
        gates.arrive("/b", (10, 2), &both, start);
        gates.arrive("/b", (10, 3), &b, start);
        gates.reconciling(&["/a", "/b"], (10, 2), "both", start);
        assert!(behind(gates.may_enqueue(&["/a", "/b"], (10, 2), &both, start)), "behind a at /a");
        assert!(
            behind(gates.may_enqueue(&["/b"], (10, 3), &b, start + PATIENCE * 2)),
            "both is first at /b but waits at /a: that counts no patience at /b"
        );
    }

    #[test]
    fn turns_over_several_locks() {
        let wait = |ms| Turn::Behind(Duration::from_millis(ms));
        assert_eq!(Turn::First.and(Turn::First), Turn::First);
        assert_eq!(Turn::First.and(wait(300)), wait(300));
        assert_eq!(wait(300).and(wait(100)), wait(100));
    }
}
