//! The admission gate: claims of one lock enter its queue in creation order, although they are
//! reconciled concurrently. A claim waits at its lock's gate from the moment the watch first
//! delivers it until it is enqueued (or cannot be now); only the first one at the gate may
//! enqueue. Creation times have whole seconds only, so claims of one second go in the order
//! the watch delivered them. A claim that stays at the gate for [`PATIENCE`] without entering
//! the queue (its reconcile keeps failing, say) no longer holds the others up.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::Uid;

/// How long a claim that asked to be enqueued holds back the claims created after it.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// A claim's place at a gate: (creation second, first-seen order).
pub type Place = (i64, u64);

/// The gates of the locks with claims waiting at them (no empty gate is kept).
#[derive(Default)]
pub struct Gates {
    locks: HashMap<String, BTreeMap<Place, (Uid, Instant)>>,
}

impl Gates {
    /// Claim `uid` arrives at `lock`'s gate.
    pub fn arrive(&mut self, lock: &str, place: Place, uid: &Uid) {
        self.locks.entry(lock.to_string()).or_default().insert(place, (uid.clone(), Instant::now()));
    }

    /// Whether claim `uid` is first at `lock`'s gate (it arrives there if it was not).
    pub fn may_enqueue(&mut self, lock: &str, place: Place, uid: &Uid) -> bool {
        let gate = self.locks.entry(lock.to_string()).or_default();
        gate.retain(|_, (other, since)| other == uid || since.elapsed() < PATIENCE);
        if !gate.values().any(|(other, _)| other == uid) {
            gate.insert(place, (uid.clone(), Instant::now()));
        }
        gate.first_key_value().is_some_and(|(_, (first, _))| first == uid)
    }

    /// Claim `uid` leaves `lock`'s gate; answers the claim first there now, if it was there.
    pub fn leave(&mut self, lock: &str, uid: &str) -> Option<Uid> {
        let gate = self.locks.get_mut(lock)?;
        let before = gate.len();
        gate.retain(|_, (other, _)| **other != *uid);
        if gate.len() == before {
            return None;
        }
        let next = gate.first_key_value().map(|(_, (next, _))| next.clone());
        if gate.is_empty() {
            self.locks.remove(lock);
        }
        next
    }

    /// Locks with a gate.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.locks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_created_goes_first_then_the_first_seen_and_a_leaver_lets_the_next_go() {
        let mut gates = Gates::default();
        let (a, b, c): (Uid, Uid, Uid) = ("a".into(), "b".into(), "c".into());
        gates.arrive("/l", (10, 3), &c);
        gates.arrive("/l", (10, 2), &b);
        assert!(!gates.may_enqueue("/l", (11, 1), &a), "created a second later, a waits");
        assert!(gates.may_enqueue("/l", (10, 2), &b), "same second as c, seen first");
        assert_eq!(gates.leave("/l", "b").as_deref(), Some("c"));
        assert_eq!(gates.leave("/l", "b"), None, "not there any more");
        assert!(gates.may_enqueue("/other", (99, 9), &a), "gates are per lock");
        gates.leave("/l", "c");
        gates.leave("/l", "a");
        gates.leave("/other", "a");
        assert_eq!(gates.len(), 0, "no empty gate is kept");
    }
}
