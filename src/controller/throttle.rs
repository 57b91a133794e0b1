//! Status refreshes of `Lock` and `ClusterLock` objects, spaced per object: the first change
//! after a quiet spell is looked at (and written) at once, the changes that follow together once
//! the spacing has passed.
//!
//! kube-runtime's debounce (its `Config::debounce`) is not this: it starts its wait again at every
//! trigger (trailing-edge debouncing), so an object whose claims change more often than the
//! debounce period, a busy lock, never had its status refreshed while they did.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

pub struct Throttle<K> {
    spacing: Duration,
    state: parking_lot::Mutex<State<K>>,
}

struct State<K> {
    /// When each object's status was last refreshed, for those refreshed less than `spacing` ago
    /// (older ones are let go of at most once per `spacing`).
    written: HashMap<K, Instant>,
    pruned: Option<Instant>,
}

impl<K: Hash + Eq> Throttle<K> {
    pub fn new(spacing: Duration) -> Throttle<K> {
        Throttle { spacing, state: parking_lot::Mutex::new(State { written: HashMap::new(), pruned: None }) }
    }

    /// Whether `key`'s status may be refreshed at `now` (and it is taken to be, from then on), or
    /// how long the refresh must wait: its last was less than the spacing ago.
    pub fn admit(&self, key: K, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock();
        let spacing = self.spacing;
        if let Some(last) = state.written.get(&key) {
            let wait = spacing.saturating_sub(now.saturating_duration_since(*last));
            if !wait.is_zero() {
                return Err(wait);
            }
        }
        if state.pruned.is_none_or(|at| now.saturating_duration_since(at) >= spacing) {
            state.written.retain(|_, at| now.saturating_duration_since(*at) < spacing);
            state.pruned = Some(now);
        }
        state.written.insert(key, now);
        Ok(())
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.state.lock().written.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPACING: Duration = Duration::from_millis(500);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_refresh_goes_at_once_and_the_next_waits_out_the_spacing() {
        let throttle = Throttle::new(SPACING);
        let start = Instant::now();
        assert_eq!(throttle.admit("a", start), Ok(()), "never refreshed: at once");
        assert_eq!(throttle.admit("a", start + 200 * MS), Err(300 * MS));
        assert_eq!(throttle.admit("b", start + 200 * MS), Ok(()), "each object has its own spacing");
        assert_eq!(throttle.admit("a", start + SPACING), Ok(()), "the spacing over: at once");
        assert_eq!(throttle.admit("a", start + SPACING + MS), Err(SPACING - MS), "and spaced again");
    }

    #[test]
    fn a_trigger_does_not_put_the_refresh_off() {
        // kube-runtime's debounce starts over at each trigger; here the wait only shrinks, and
        // the refresh comes one spacing after the last, however often it is asked for.
        let throttle = Throttle::new(SPACING);
        let start = Instant::now();
        assert_eq!(throttle.admit("a", start), Ok(()));
        let asked: Vec<Result<(), Duration>> = (1..=10).map(|i| throttle.admit("a", start + 50 * i * MS)).collect();
        let waits: Vec<Duration> = asked[..9].iter().map(|r| r.expect_err("within the spacing")).collect();
        assert!(waits.windows(2).all(|w| w[1] < w[0]), "{waits:?}");
        assert_eq!(asked[9], Ok(()), "at 500 ms");
    }

    #[test]
    fn objects_refreshed_long_ago_are_let_go_of() {
        let throttle = Throttle::new(SPACING);
        let start = Instant::now();
        for i in 0..1000 {
            assert_eq!(throttle.admit(i, start), Ok(()));
        }
        assert_eq!(throttle.admit(1000, start + SPACING), Ok(()));
        assert_eq!(throttle.remembered(), 1, "only the object refreshed within the spacing is kept");
        assert_eq!(throttle.admit(5, start + SPACING), Ok(()));
    }
}
