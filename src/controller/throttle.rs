//! Status refreshes of `Lock` and `ClusterLock` objects, per object: the first change after a
//! quiet spell is refreshed a short window later (so that the changes of one handoff, a release
//! and a grant a few milliseconds apart, make one write), and the changes that follow a refresh
//! wait until a spacing has passed since it, however many come meanwhile.
//!
//! kube-runtime's debounce (its `Config::debounce`) is not this: it starts its wait again at every
//! trigger (trailing-edge debouncing), so an object whose claims changed more often than the
//! debounce period, a busy lock, never had its status refreshed while they did.
//!
//! Across objects, refreshes take turns at most one per `interval` (a budget of writes a second,
//! so that a thousand busy locks do not write two thousand statuses a second beside the grants):
//! each due refresh has its turn reserved, in the order they fell due.
//!
//! A `Lock`'s refresh is its status write: its status is made from memory, and a look that finds
//! nothing to write must not put the next change off. A `ClusterLock`'s refresh is its look at
//! the queue, which reads ZooKeeper.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

pub struct Throttle<K> {
    /// From the first change after a quiet spell to its refresh.
    window: Duration,
    /// From a refresh to the next.
    spacing: Duration,
    /// From one refresh of any object to the next, at least.
    interval: Duration,
    state: parking_lot::Mutex<State<K>>,
}

struct State<K> {
    /// Objects with a refresh due, or refreshed less than a spacing ago. Others are let go of, at
    /// most once per spacing.
    objects: HashMap<K, Mark>,
    pruned: Option<Instant>,
    /// The first turn not reserved yet.
    free: Option<Instant>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mark {
    /// A change was seen; its refresh is due at this instant.
    Due(Instant),
    /// Refreshed at this instant.
    Refreshed(Instant),
}

impl Mark {
    /// After this instant the mark says nothing any more.
    fn expires(self, spacing: Duration) -> Instant {
        match self {
            Mark::Due(at) | Mark::Refreshed(at) => at + spacing,
        }
    }
}

impl<K: Hash + Eq> Throttle<K> {
    pub fn new(window: Duration, spacing: Duration, interval: Duration) -> Throttle<K> {
        let state = State { objects: HashMap::new(), pruned: None, free: None };
        Throttle { window, spacing, interval, state: parking_lot::Mutex::new(state) }
    }

    /// Reserves the first free turn at or after `earliest`.
    fn turn(&self, state: &mut State<K>, earliest: Instant) -> Instant {
        let at = state.free.map_or(earliest, |free| free.max(earliest));
        state.free = Some(at + self.interval);
        at
    }

    /// A change of `key` seen at `now`: how long its refresh must wait, or `None` to refresh now.
    pub fn wait(&self, key: K, now: Instant) -> Option<Duration> {
        let mut state = self.state.lock();
        let due = match state.objects.get(&key).copied() {
            Some(Mark::Due(at)) => at,
            Some(Mark::Refreshed(at)) if now < at + self.spacing => {
                let due = self.turn(&mut state, at + self.spacing);
                state.objects.insert(key, Mark::Due(due));
                due
            }
            // Quiet: the window starts.
            _ => {
                self.prune(&mut state, now);
                let due = self.turn(&mut state, now + self.window);
                state.objects.insert(key, Mark::Due(due));
                due
            }
        };
        Some(due.saturating_duration_since(now)).filter(|wait| !wait.is_zero())
    }

    /// `key` was refreshed at `now`.
    pub fn refreshed(&self, key: K, now: Instant) {
        let mut state = self.state.lock();
        self.prune(&mut state, now);
        state.objects.insert(key, Mark::Refreshed(now));
    }

    /// `key` was looked at and had nothing to refresh: its next change starts a window again.
    pub fn unchanged(&self, key: &K) {
        let mut state = self.state.lock();
        if matches!(state.objects.get(key), Some(Mark::Due(_))) {
            state.objects.remove(key);
        }
    }

    fn prune(&self, state: &mut State<K>, now: Instant) {
        let spacing = self.spacing.max(self.window);
        if state.pruned.is_none_or(|at| now.saturating_duration_since(at) >= spacing) {
            state.objects.retain(|_, mark| mark.expires(spacing) > now);
            state.pruned = Some(now);
        }
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.state.lock().objects.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const WINDOW: Duration = Duration::from_millis(50);
    const SPACING: Duration = Duration::from_millis(500);

    #[test]
    fn a_change_after_a_quiet_spell_waits_the_window_and_changes_within_it_come_with_it() {
        let throttle = Throttle::new(WINDOW, SPACING, Duration::ZERO);
        let start = Instant::now();
        assert_eq!(throttle.wait("a", start), Some(WINDOW));
        assert_eq!(throttle.wait("a", start + 10 * MS), Some(40 * MS), "the window does not start again");
        assert_eq!(throttle.wait("b", start + 10 * MS), Some(WINDOW), "each object has its own");
        assert_eq!(throttle.wait("a", start + WINDOW), None, "due");
        throttle.refreshed("a", start + WINDOW);
        assert_eq!(throttle.wait("a", start + WINDOW + 100 * MS), Some(400 * MS), "spaced from the refresh");
        assert_eq!(throttle.wait("a", start + WINDOW + SPACING), None, "the spacing over: at once");
        assert_eq!(throttle.wait("a", start + 2 * SPACING), None, "and still due until refreshed");
    }

    #[test]
    fn a_trigger_does_not_put_the_refresh_off() {
        // kube-runtime's debounce starts over at each trigger; here the wait only shrinks, and
        // the refresh comes one spacing after the last, however often it is asked for.
        let throttle = Throttle::new(WINDOW, SPACING, Duration::ZERO);
        let start = Instant::now();
        throttle.refreshed("a", start);
        let asked: Vec<Option<Duration>> = (1..=10).map(|i| throttle.wait("a", start + 50 * i * MS)).collect();
        let waits: Vec<Duration> = asked[..9].iter().map(|w| w.expect("within the spacing")).collect();
        assert!(waits.windows(2).all(|w| w[1] < w[0]), "{waits:?}");
        assert_eq!(asked[9], None, "at 500 ms");
    }

    #[test]
    fn a_look_that_finds_nothing_to_refresh_does_not_put_the_next_change_off() {
        let throttle = Throttle::new(WINDOW, SPACING, Duration::ZERO);
        let start = Instant::now();
        assert_eq!(throttle.wait("a", start), Some(WINDOW));
        assert_eq!(throttle.wait("a", start + WINDOW), None);
        throttle.unchanged(&"a");
        assert_eq!(throttle.wait("a", start + WINDOW + MS), Some(WINDOW), "a new window, not the spacing");
        throttle.refreshed("a", start + 2 * WINDOW);
        throttle.unchanged(&"a");
        assert_eq!(throttle.wait("a", start + 3 * WINDOW), Some(SPACING - WINDOW), "a refresh still spaces");
    }

    #[test]
    fn refreshes_of_many_objects_take_turns_in_the_order_they_fell_due() {
        let throttle = Throttle::new(WINDOW, SPACING, 20 * MS);
        let start = Instant::now();
        let waits: Vec<Option<Duration>> = ["a", "b", "c"].map(|key| throttle.wait(key, start)).to_vec();
        assert_eq!(waits, [Some(WINDOW), Some(WINDOW + 20 * MS), Some(WINDOW + 40 * MS)]);
        assert_eq!(throttle.wait("b", start + WINDOW), Some(20 * MS), "b keeps its turn");
        // A quiet spell later the turns are free again.
        assert_eq!(throttle.wait("d", start + SPACING), Some(WINDOW));
    }

    #[test]
    fn objects_refreshed_long_ago_are_let_go_of() {
        let throttle = Throttle::new(WINDOW, SPACING, Duration::ZERO);
        let start = Instant::now();
        for i in 0..1000 {
            throttle.refreshed(i, start);
        }
        throttle.refreshed(1000, start + SPACING);
        assert_eq!(throttle.remembered(), 1, "only the object refreshed within the spacing is kept");
        assert_eq!(throttle.wait(5, start + SPACING), Some(WINDOW), "quiet again");
    }
}
