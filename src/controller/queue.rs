//! Which claims to reconcile, and when: a small work queue keyed by claim UID.
//!
//! It keeps the rules of kube-runtime's scheduler that the operator relies on: a claim asked for
//! twice runs once, at the earlier time; a claim is never reconciled twice at once (asked for
//! while it runs, it runs again afterwards); at most `limit` reconciles run together. Unlike
//! that scheduler, it keeps one small entry per scheduled claim and gives memory back after a
//! burst, since a burst of every claim at once is what each start of the operator brings.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// A claim UID, shared between the queue and the claim store.
pub type Uid = Arc<str>;

#[derive(Default)]
pub struct Queue {
    /// Scheduled claims by due time; the UID breaks ties.
    due: BTreeSet<(Instant, Uid)>,
    /// Scheduled claim → its due time (the earliest asked for).
    at: HashMap<Uid, Instant>,
    /// Claims being reconciled now.
    running: HashSet<Uid>,
}

impl Queue {
    /// Asks for a reconcile of `uid` at `when`; an earlier request stands.
    pub fn schedule(&mut self, uid: &Uid, when: Instant) {
        match self.at.get(uid) {
            Some(&earlier) if earlier <= when => {}
            Some(&later) => {
                self.due.remove(&(later, uid.clone()));
                self.due.insert((when, uid.clone()));
                self.at.insert(uid.clone(), when);
            }
            None => {
                self.due.insert((when, uid.clone()));
                self.at.insert(uid.clone(), when);
            }
        }
    }

    /// The next claim to reconcile at `now`, if one is due, not running, and fewer than `limit`
    /// run; it counts as running until [`Queue::done`].
    pub fn start(&mut self, now: Instant, limit: usize) -> Option<Uid> {
        if self.running.len() >= limit {
            return None;
        }
        // Claims that are running stay scheduled and are skipped; at most `limit` of them.
        let (when, uid) =
            self.due.iter().take_while(|(when, _)| *when <= now).find(|(_, uid)| !self.running.contains(uid))?.clone();
        self.due.remove(&(when, uid.clone()));
        self.at.remove(&uid);
        self.running.insert(uid.clone());
        Some(uid)
    }

    /// A reconcile of `uid` ended.
    pub fn done(&mut self, uid: &str) {
        self.running.remove(uid);
        self.shrink();
    }

    /// When [`Queue::start`] may next have a claim to start: when the next claim that is not
    /// running is due; never while `limit` run (only a reconcile ending changes that, and
    /// waiting for a due time already past would spin).
    pub fn next_due(&self, limit: usize) -> Option<Instant> {
        if self.running.len() >= limit {
            return None;
        }
        self.due.iter().find(|(_, uid)| !self.running.contains(uid)).map(|(when, _)| *when)
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn scheduled(&self) -> usize {
        self.at.len()
    }

    fn shrink(&mut self) {
        if let Some(keep) = shrunk_capacity(self.at.len(), self.at.capacity()) {
            self.at.shrink_to(keep);
        }
        if let Some(keep) = shrunk_capacity(self.running.len(), self.running.capacity()) {
            self.running.shrink_to(keep);
        }
    }
}

/// Hash tables keep their largest size: after a burst (every claim at once, as each start of
/// the operator brings), the capacity to give the memory back to, if any.
pub fn shrunk_capacity(len: usize, capacity: usize) -> Option<usize> {
    (capacity > 64 && len < capacity / 4).then_some(len * 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn uid(s: &str) -> Uid {
        s.into()
    }

    #[test]
    fn the_earlier_request_stands() {
        let t = Instant::now();
        let mut q = Queue::default();
        q.schedule(&uid("a"), t + Duration::from_secs(5));
        q.schedule(&uid("a"), t + Duration::from_secs(1));
        q.schedule(&uid("a"), t + Duration::from_secs(9));
        assert_eq!(q.scheduled(), 1);
        assert_eq!(q.next_due(4), Some(t + Duration::from_secs(1)));
        assert_eq!(q.start(t, 4), None, "not due yet");
        assert_eq!(q.start(t + Duration::from_secs(1), 4).as_deref(), Some("a"));
        assert_eq!(q.start(t + Duration::from_secs(60), 4), None, "asked for once, runs once");
    }

    #[test]
    fn a_running_claim_asked_for_again_runs_again_after() {
        let t = Instant::now();
        let mut q = Queue::default();
        q.schedule(&uid("a"), t);
        assert_eq!(q.start(t, 4).as_deref(), Some("a"));
        q.schedule(&uid("a"), t);
        assert_eq!(q.start(t, 4), None, "never twice at once");
        assert_eq!(q.next_due(4), None);
        q.done("a");
        assert_eq!(q.next_due(4), Some(t));
        assert_eq!(q.start(t, 4).as_deref(), Some("a"));
    }

    #[test]
    fn the_limit_holds_and_order_is_by_due_time() {
        let t = Instant::now();
        let mut q = Queue::default();
        for (i, name) in ["c", "a", "b"].iter().enumerate() {
            q.schedule(&uid(name), t + Duration::from_millis(i as u64));
        }
        let now = t + Duration::from_secs(1);
        assert_eq!(q.start(now, 2).as_deref(), Some("c"));
        assert_eq!(q.start(now, 2).as_deref(), Some("a"));
        assert_eq!(q.start(now, 2), None, "two run at most");
        assert_eq!(q.next_due(2), None, "nothing to wait for but a reconcile ending");
        assert_eq!(q.next_due(3), Some(t + Duration::from_millis(2)));
        q.done("c");
        assert_eq!(q.start(now, 2).as_deref(), Some("b"));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Schedule(u8, u8),
        Start(u8),
        Done(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6u8, 0..10u8).prop_map(|(c, d)| Op::Schedule(c, d)),
            (0..12u8).prop_map(Op::Start),
            (0..6u8).prop_map(Op::Done),
        ]
    }

    proptest! {
        /// Against a plain model: a claim runs at most once at a time, never more than the
        /// limit run, and a started claim is one that was due.
        #[test]
        fn matches_a_simple_model(ops in proptest::collection::vec(op(), 1..200)) {
            let t0 = Instant::now();
            let limit = 3;
            let mut q = Queue::default();
            let mut due: HashMap<u8, u8> = HashMap::new();
            let mut running: HashSet<u8> = HashSet::new();
            for op in ops {
                match op {
                    Op::Schedule(c, d) => {
                        q.schedule(&uid(&c.to_string()), t0 + Duration::from_secs(d.into()));
                        let e = due.entry(c).or_insert(d);
                        *e = (*e).min(d);
                    }
                    Op::Start(now) => {
                        let started = q.start(t0 + Duration::from_secs(now.into()), limit);
                        let eligible: Vec<(u8, u8)> = due.iter()
                            .filter(|(c, d)| **d <= now && !running.contains(c))
                            .map(|(c, d)| (*d, *c)).collect();
                        match started {
                            None => prop_assert!(running.len() >= limit || eligible.is_empty()),
                            Some(s) => {
                                let c: u8 = s.parse().unwrap();
                                let earliest = eligible.iter().map(|(d, _)| *d).min();
                                prop_assert_eq!(Some(due[&c]), earliest, "the earliest due claim starts");
                                prop_assert!(running.len() < limit);
                                prop_assert!(running.insert(c));
                                due.remove(&c);
                            }
                        }
                    }
                    Op::Done(c) => {
                        q.done(&c.to_string());
                        running.remove(&c);
                    }
                }
                prop_assert_eq!(q.running(), running.len());
                prop_assert_eq!(q.scheduled(), due.len());
            }
        }
    }
}
