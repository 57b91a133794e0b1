//! The pure ZooKeeper lock recipe: given a lock directory's children, our node and the lock's
//! limit, decide whether we hold the lock or which nodes' deletion can change that. No I/O lives
//! here, so the rules can be checked exhaustively against a model (see the proptest below).
//!
//! A mutex (no `Lock` object) follows the classic recipe: an exclusive contender watches the node
//! right before it, a shared one the nearest exclusive node before it. A lock with N permits (a
//! counting semaphore) lets the first N contenders hold, one permit each, whatever their mode. A
//! waiter there needs more than one node: any departure among the N nodes right before it can
//! move it into the first N, and a departure further ahead cannot (those N still stand before
//! it). So it names the first node of that window, and the deletion of any node from there up to
//! its own wakes it. One release thus wakes at most N waiters (the first waiter alone when the
//! oldest holder leaves), whatever the length of the queue.
//!
//! Node names are `write-<uid>-lock-<seq>` (exclusive) and `read-<uid>-lock-<seq>` (shared).
//! The `-lock-` before the sequence keeps the directory readable by Apache Curator's
//! `InterProcessMutex`, which sorts children by what follows the last `lock-` and treats every
//! child as exclusive. Children that are not ours are sorted by their trailing sequence number
//! and treated as exclusive contenders (the conservative reading: a stranger might be a writer).
//! Children without a sequence are not in any queue, but a stranger's plain node in a lock
//! directory is what a lease looks like (kazoo's `Semaphore` holds one per permit): each counts
//! as an exclusive holder ahead of every contender, for as long as it exists. Ignoring one would
//! let a grant join a holder we cannot see. A sequence is ZooKeeper's: the last ten digits (or
//! a sign and nine or ten), at most 2^31 - 1 unsigned; a name that could be read either way is
//! read as plain (it blocks rather than queues behind), and so is a name of 32 hex digits,
//! kazoo's lease, whatever digits it ends in.

use std::fmt;
use std::num::NonZeroU32;

/// How a contender wants the lock: Exclusive (alone; the default) or Shared (with other Shared
/// holders, no Exclusive one).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub enum Mode {
    /// Write lock: alone, after everyone ahead is gone.
    #[default]
    Exclusive,
    /// Read lock: together with other shared holders, after every exclusive one ahead is gone.
    Shared,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Exclusive => "Exclusive",
            Mode::Shared => "Shared",
        })
    }
}

/// ZooKeeper always pads sequence suffixes to at least ten digits.
const MIN_SEQUENCE_DIGITS: usize = 10;
const LOCK_MARKER: &str = "-lock-";

/// A child of a lock directory, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child<'a> {
    pub name: &'a str,
    /// The sequence suffix. ZooKeeper's is the parent's signed 32-bit child version, printed
    /// `%010d`: after 2^31 - 1 it goes on at -2147483648 (`-lock--2147483648`). A negative one
    /// is kept as its 32-bit pattern (2^31 and up) and ordered as serial numbers (see `queue`).
    pub sequence: u64,
    /// `Some` for nodes zklock made: the contender's id (a claim UID) and mode.
    pub ours: Option<(&'a str, Mode)>,
}

/// The sequence a child without one is given: it is a holder ahead of the whole queue.
pub const NO_SEQUENCE: u64 = u64::MAX;

impl Child<'_> {
    /// The mode the recipe gives this child: foreign children count as exclusive.
    pub fn mode(&self) -> Mode {
        self.ours.map_or(Mode::Exclusive, |(_, mode)| mode)
    }

    /// A stranger's node without a sequence (a semaphore lease, say): it holds ahead of the queue.
    pub fn is_plain(&self) -> bool {
        self.sequence == NO_SEQUENCE
    }
}

/// The length of kazoo's Semaphore lease names (`uuid4().hex`).
const KAZOO_LEASE_LEN: usize = 32;

/// Parses a child name; `None` for children without a sequence, which are not contenders.
///
/// Where a name could be read either way, it is read as having none: a plain node holds ahead
/// of the whole queue (it blocks), while a misread sequence could place a holder behind it.
pub fn parse_child(name: &str) -> Option<Child<'_>> {
    // kazoo's Semaphore names its leases with 32 hex digits and no sequence; about one in a
    // hundred ends in ten decimal digits or more, which read as a sequence put the lease
    // behind every zklock node (a lease beyond the permits: kazoo's hold and one more).
    if name.len() == KAZOO_LEASE_LEN && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let run = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    // ZooKeeper appends `%010d` of a signed 32-bit number: ten digits, or a sign and nine or
    // ten. Digits before the last ten belong to the name's prefix (`node1` + `0000000005`).
    let digits = run.min(MIN_SEQUENCE_DIGITS);
    let (head, seq) = name.split_at(name.len() - digits);
    let signed = head.strip_suffix('-');
    let value = seq.parse::<u64>().ok()?;
    // `%010d` of a negative is a sign and nine or ten digits. A `-` right before the digits is
    // a sign when the digits are too few or too large for a positive sequence, or when another
    // `-` precedes it: zklock's and Curator's prefixes end in `lock-`, so theirs read
    // `lock--1000000000`. (A stranger whose prefix does not end in `-` is read as positive
    // between 1000000000 and 2147483647 either way; its node is then misplaced after a wrap.)
    // Only after the prefixes of lock recipes (zklock's and Curator's `lock-`, kazoo's
    // `__lock__`/`__rlock__`): a stray `job-123456789` is not a contender.
    let negative = signed.is_some_and(|h| {
        (h.ends_with("lock-") || h.ends_with("lock__"))
            && (digits == MIN_SEQUENCE_DIGITS - 1 || digits == MIN_SEQUENCE_DIGITS)
            && (digits < MIN_SEQUENCE_DIGITS || value > i32::MAX as u64 || h.ends_with('-'))
            && value <= 1 << 31
    });
    let (head, sequence) = match signed {
        Some(unsigned_head) if negative => (unsigned_head, u64::from((value as u32).wrapping_neg())),
        _ if digits < MIN_SEQUENCE_DIGITS => return None,
        // Above 2^31 - 1 ZooKeeper prints a sign: no sequence of its own.
        _ if value > i32::MAX as u64 => return None,
        _ => (head, value),
    };
    let ours = head
        .strip_suffix(LOCK_MARKER)
        .and_then(|rest| {
            let write = rest.strip_prefix("write-").map(|uid| (uid, Mode::Exclusive));
            write.or_else(|| rest.strip_prefix("read-").map(|uid| (uid, Mode::Shared)))
        })
        .filter(|(uid, _)| is_contender_id(uid));
    Some(Child { name, sequence, ours })
}

/// Contender ids are Kubernetes UIDs: lower-case letters, digits and dashes. The restriction
/// keeps a stranger's node such as `read-x/y-lock-...` from being read as one of ours, and keeps
/// our own names free of the `-lock-` marker.
pub fn is_contender_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.contains("lock-")
}

/// The name prefix of a contender's node; ZooKeeper appends the sequence.
pub fn node_prefix(id: &str, mode: Mode) -> String {
    let prefix = match mode {
        Mode::Exclusive => "write",
        Mode::Shared => "read",
    };
    format!("{prefix}-{id}{LOCK_MARKER}")
}

/// Sorts the contenders among `children` in queue order (by sequence, ties by name so that the
/// order is total even for malformed foreign input).
pub fn queue<'a, S: AsRef<str>>(children: &'a [S]) -> Vec<Child<'a>> {
    let plain = |name: &'a str| Child { name, sequence: NO_SEQUENCE, ours: None };
    let mut queue: Vec<Child<'a>> =
        children.iter().map(|c| parse_child(c.as_ref()).unwrap_or_else(|| plain(c.as_ref()))).collect();
    let base = wrap_base(queue.iter().map(|c| c.sequence));
    queue.sort_by(|a, b| {
        let key = |c: &Child<'_>| (!c.is_plain(), queue_key(c.sequence, base));
        key(a).cmp(&key(b)).then_with(|| a.name.cmp(b.name))
    });
    queue
}

/// Where the queue starts in the 32-bit circle of sequences, for [`queue_key`]. The nodes alive
/// in one directory span far less than half the circle, so after a wrap the queue starts after
/// the widest gap between them; without a wrap (every sequence below 2^31) it starts at 0.
pub fn wrap_base(sequences: impl Iterator<Item = u64>) -> u64 {
    let mut circle: Vec<u64> = sequences.filter(|s| *s < 1 << 32).collect();
    // Also when `circle` is empty: the indexing below needs one element.
    if circle.iter().all(|s| *s < 1 << 31) {
        return 0;
    }
    circle.sort_unstable();
    circle.dedup();
    let mut base = circle[0];
    let mut widest = circle[0] + (1 << 32) - circle[circle.len() - 1];
    for pair in circle.windows(2) {
        if pair[1] - pair[0] > widest {
            widest = pair[1] - pair[0];
            base = pair[1];
        }
    }
    base
}

/// A sequence's place in the queue, counted from `base` ([`wrap_base`]) around the circle.
/// Sequences beyond 32 bits (never ZooKeeper's) keep their own order after all others.
pub fn queue_key(sequence: u64, base: u64) -> u64 {
    if sequence < 1 << 32 {
        (sequence + (1 << 32) - base) % (1 << 32)
    } else {
        sequence
    }
}

/// How many contenders may hold a lock at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Limit {
    /// No `Lock` object: one exclusive holder, or the shared contenders at the front together.
    #[default]
    Mutex,
    /// A `Lock` object's permits: the first N contenders hold, one permit each, whatever their
    /// mode (a semaphore has no readers; a shared claim simply takes a permit).
    Permits(NonZeroU32),
}

impl Limit {
    /// The limit `Some(permits)` of a `Lock` object declares, or a mutex without one. Zero
    /// permits are refused where a `Lock` is validated; here they count as one.
    pub fn from_permits(permits: Option<u32>) -> Limit {
        permits.map_or(Limit::Mutex, |n| Limit::Permits(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)))
    }

    /// One permit: only the front of the queue holds. Every limit grants the front, so this
    /// grants nothing another limit would not: what a lock whose limit is not known yet gets.
    pub const FRONT_ONLY: Limit = Limit::Permits(NonZeroU32::MIN);

    /// The largest limit that grants nothing either of `self` and `other` would not: the
    /// smaller permits; a mutex and permits meet at one permit (a mutex may grant several
    /// Shared contenders, permits an Exclusive one behind a holder, so only the front is
    /// granted by both).
    pub fn meet(self, other: Limit) -> Limit {
        match (self, other) {
            (Limit::Mutex, Limit::Mutex) => Limit::Mutex,
            (Limit::Permits(a), Limit::Permits(b)) => Limit::Permits(a.min(b)),
            (Limit::Mutex, Limit::Permits(_)) | (Limit::Permits(_), Limit::Mutex) => Limit::FRONT_ONLY,
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Mutex => f.write_str("mutex"),
            Limit::Permits(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Limit {
    type Err = String;

    /// What [`Limit`]'s `Display` writes: `mutex`, or a number of permits from 1 on.
    fn from_str(s: &str) -> Result<Limit, String> {
        match s {
            "mutex" => Ok(Limit::Mutex),
            _ => s.parse::<NonZeroU32>().map(Limit::Permits).map_err(|_| format!("{s:?} is neither mutex nor permits")),
        }
    }
}

/// What the recipe tells a contender to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold the lock.
    Held,
    /// We wait. `watch` is the node whose deletion can change the answer; with `span` (a lock
    /// with permits), so can the deletion of any node after it and before ours. `ahead` is the
    /// number of contenders that must go before we can hold.
    Waiting { watch: String, ahead: usize, span: bool },
    /// Our node is not among the children: it was deleted (or never made).
    Missing,
}

impl Decision {
    /// Whether the deletion of node `deleted` can change this decision of the contender whose
    /// node is `me`: the one test that decides whom a deletion wakes.
    pub fn woken_by(&self, me: &str, deleted: &str) -> bool {
        match self {
            Decision::Waiting { watch, span: false, .. } => watch == deleted,
            Decision::Waiting { watch, span: true, .. } => {
                let Some(to) = parse_child(me) else { return deleted != me };
                match (parse_child(watch), parse_child(deleted)) {
                    // From the window's first node round the 32-bit circle: it spans far less
                    // than half of it, so this holds across a wrap of the sequence too.
                    (Some(from), Some(gone)) => {
                        queue_key(gone.sequence, from.sequence) < queue_key(to.sequence, from.sequence)
                    }
                    // Plain nodes come before every queued one: never inside a window that
                    // starts at a queued node.
                    (Some(_), None) => false,
                    // A window that starts at a plain node holds the plain nodes from it on (in
                    // name order) and every queued node before mine.
                    (None, None) => deleted >= watch.as_str(),
                    (None, Some(gone)) => {
                        gone.sequence != to.sequence && queue_key(to.sequence, gone.sequence) < 1 << 31
                    }
                }
            }
            Decision::Held | Decision::Missing => false,
        }
    }
}

/// Decides for the contender whose node is named `me` among `children`.
pub fn decide<S: AsRef<str>>(children: &[S], me: &str, limit: Limit) -> Decision {
    decide_in(&queue(children), me, limit)
}

/// [`decide`] on a queue already sorted by [`queue`] (to decide for many contenders at once).
pub fn decide_in(queue: &[Child<'_>], me: &str, limit: Limit) -> Decision {
    let Some(index) = queue.iter().position(|c| c.name == me) else {
        return Decision::Missing;
    };
    if let Limit::Permits(permits) = limit {
        let permits = usize::try_from(permits.get()).unwrap_or(usize::MAX);
        return match index.checked_sub(permits) {
            None => Decision::Held,
            Some(first) => Decision::Waiting { watch: queue[first].name.to_string(), ahead: first + 1, span: true },
        };
    }
    let blocker = match queue[index].mode() {
        Mode::Exclusive => index.checked_sub(1),
        Mode::Shared => queue[..index].iter().rposition(|c| c.mode() == Mode::Exclusive),
    };
    match blocker {
        None => Decision::Held,
        Some(b) => Decision::Waiting { watch: queue[b].name.to_string(), ahead: b + 1, span: false },
    }
}

/// Contenders whose nodes carry the same id as `me`, other than the lowest one. A create that
/// was retried after a connection loss could in theory leave a second node; the lowest one keeps
/// the queue position and the rest must be deleted.
pub fn duplicates_of<'a, S: AsRef<str>>(children: &'a [S], id: &str) -> Vec<&'a str> {
    queue(children).into_iter().filter(|c| c.ours.is_some_and(|(uid, _)| uid == id)).skip(1).map(|c| c.name).collect()
}

/// The node of contender `id`, if it is among `children` (the lowest one if several).
pub fn find_node<'a, S: AsRef<str>>(children: &'a [S], id: &str) -> Option<&'a str> {
    queue(children).into_iter().find(|c| c.ours.is_some_and(|(uid, _)| uid == id)).map(|c| c.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn name(id: &str, mode: Mode, seq: u64) -> String {
        format!("{}{seq:010}", node_prefix(id, mode))
    }

    #[test]
    fn parses_our_names_and_curators() {
        let w = parse_child("write-5f0e-ab-lock-0000000007").unwrap();
        assert_eq!((w.sequence, w.ours), (7, Some(("5f0e-ab", Mode::Exclusive))));
        let r = parse_child("read-abc-lock-0000000012").unwrap();
        assert_eq!(r.ours, Some(("abc", Mode::Shared)));
        let curator = parse_child("_c_1f2e3d-lock-0000000003").unwrap();
        assert_eq!((curator.sequence, curator.ours, curator.mode()), (3, None, Mode::Exclusive));
        let kazoo = parse_child("6a0f9f3d__rlock__0000000004").unwrap();
        assert_eq!(kazoo.mode(), Mode::Exclusive);
        assert_eq!(parse_child("config"), None);
        assert_eq!(parse_child("node-12"), None, "short numeric tails are not sequences");
        assert_eq!(parse_child("x-99999999999999999999999"), None, "too long for a sequence");
        // Digits before the last ten are the prefix's: ZooKeeper appends ten.
        let numbered = parse_child("node10000000005").unwrap();
        assert_eq!((numbered.name, numbered.sequence), ("node10000000005", 5));
        // Positive and above 2^31 - 1: ZooKeeper would have printed a sign. No sequence.
        assert_eq!(parse_child("job-3000000000"), None);
        assert_eq!(parse_child("write-abc-lock-2147483648"), None);
        // A stranger's name that merely looks like ours is foreign.
        assert_eq!(parse_child("read-A/B-lock-0000000001").unwrap().ours, None);
    }

    /// The name ZooKeeper gives the child made at parent child-version `cversion` (`%010d`).
    fn zk_name(prefix: &str, cversion: i32) -> String {
        format!("{prefix}{cversion:010}")
    }

    #[test]
    fn sequences_past_the_signed_32_bit_wrap_parse_and_queue_in_creation_order() {
        assert_eq!(zk_name("x-lock-", -5), "x-lock--000000005");
        assert_eq!(zk_name("x-lock-", i32::MIN), "x-lock--2147483648");
        let last = parse_child("write-a-lock-2147483647").unwrap();
        let first_negative = parse_child("write-b-lock--2147483648").unwrap();
        assert_eq!(first_negative.ours, Some(("b", Mode::Exclusive)));
        assert_eq!(first_negative.sequence, 1 << 31);
        let minus_one = parse_child("_c_f00-lock--000000001").unwrap();
        assert_eq!((minus_one.sequence, minus_one.ours), ((1 << 32) - 1, None));
        assert_eq!(last.sequence, (1 << 31) - 1);
        // Made in this order: across the top of the positive range, then through -1 to 0.
        let made = [
            zk_name(&node_prefix("a", Mode::Exclusive), i32::MAX - 1),
            zk_name(&node_prefix("b", Mode::Shared), i32::MAX),
            zk_name(&node_prefix("c", Mode::Exclusive), i32::MIN),
            zk_name("_c_foreign-lock-", i32::MIN + 1),
            zk_name(&node_prefix("d", Mode::Shared), -1),
            zk_name(&node_prefix("e", Mode::Exclusive), 0),
        ];
        let mut shuffled = made.to_vec();
        shuffled.reverse();
        shuffled.swap(1, 4);
        let order: Vec<&str> = queue(&shuffled).iter().map(|c| c.name).collect();
        assert_eq!(order, made.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(decide(&shuffled, &made[0], Limit::Mutex), Decision::Held);
        assert_eq!(
            decide(&shuffled, &made[2], Limit::Mutex),
            Decision::Waiting { watch: made[1].clone(), ahead: 2, span: false }
        );
        // A `-` before ten digits is a separator, not a sign, unless the number is 2^31.
        assert_eq!(parse_child("write-a-lock-0000000007").unwrap().sequence, 7);
        // Kazoo's negative names parse; a stray name with nine digits is no contender.
        assert_eq!(parse_child("f00__lock__-000000002").unwrap().sequence, (1 << 32) - 2);
        assert_eq!(parse_child("job-123456789"), None);
    }

    #[test]
    fn exclusive_watches_the_node_right_before_it() {
        let c = vec![name("a", Mode::Exclusive, 1), name("b", Mode::Shared, 2), name("c", Mode::Exclusive, 3)];
        assert_eq!(decide(&c, &c[0], Limit::Mutex), Decision::Held);
        assert_eq!(decide(&c, &c[2], Limit::Mutex), Decision::Waiting { watch: c[1].clone(), ahead: 2, span: false });
    }

    #[test]
    fn shared_waits_only_for_lower_exclusive_nodes() {
        let c = vec![
            name("a", Mode::Shared, 1),
            name("b", Mode::Shared, 2),
            name("c", Mode::Exclusive, 3),
            name("d", Mode::Shared, 4),
            name("e", Mode::Shared, 5),
        ];
        assert_eq!(decide(&c, &c[1], Limit::Mutex), Decision::Held);
        assert_eq!(decide(&c, &c[2], Limit::Mutex), Decision::Waiting { watch: c[1].clone(), ahead: 2, span: false });
        assert_eq!(decide(&c, &c[4], Limit::Mutex), Decision::Waiting { watch: c[2].clone(), ahead: 3, span: false });
    }

    #[test]
    fn foreign_nodes_are_exclusive_and_plain_ones_hold_ahead_of_the_queue() {
        let c = vec!["_c_1234-lock-0000000002".to_string(), name("a", Mode::Shared, 3)];
        assert_eq!(decide(&c, &c[1], Limit::Mutex), Decision::Waiting { watch: c[0].clone(), ahead: 1, span: false });
        assert_eq!(decide(&c, "read-zz-lock-0000000009", Limit::Mutex), Decision::Missing);

        // kazoo's semaphore lease: a plain uuid, made after our node, holds ahead of it.
        let lease = "4f7c2e0a9b1d4e6f8a2b3c4d5e6f7a8b".to_string();
        // Also one whose hex ends in ten digits or more (about one lease in a hundred): read
        // as a sequence, it went behind every zklock node, and a semaphore of two permits
        // granted two zklock claims beside kazoo's lease (the kazoo interop test's flake).
        for digits_at_the_end in ["4f7c2e0a9b1d4e6f8a2b3c4d51234567", "4f7c2e0a9b1d4e6f8a21234567890123"] {
            assert_eq!(parse_child(digits_at_the_end), None, "{digits_at_the_end}");
            let c = vec![name("a", Mode::Exclusive, 0), name("b", Mode::Exclusive, 1), digits_at_the_end.to_string()];
            let two = Limit::from_permits(Some(2));
            assert_eq!(decide(&c, &c[0], two), Decision::Held);
            assert_eq!(
                decide(&c, &c[1], two),
                Decision::Waiting { watch: digits_at_the_end.to_string(), ahead: 1, span: true }
            );
        }
        let c = vec![name("a", Mode::Shared, 3), lease.clone()];
        assert_eq!(decide(&c, &c[0], Limit::Mutex), Decision::Waiting { watch: lease.clone(), ahead: 1, span: false });
        let permits = Limit::from_permits(Some(2));
        let c = vec![name("a", Mode::Exclusive, 3), name("b", Mode::Exclusive, 4), "lease-b".into(), "lease-a".into()];
        assert_eq!(queue(&c).iter().map(|c| c.name).collect::<Vec<_>>(), [&c[3], &c[2], &c[0], &c[1]]);
        let a = decide(&c, &c[0], permits);
        assert_eq!(a, Decision::Waiting { watch: "lease-a".into(), ahead: 1, span: true });
        assert!(a.woken_by(&c[0], "lease-a") && a.woken_by(&c[0], "lease-b"));
        assert!(!a.woken_by(&c[0], &c[1]), "not by a node behind it");
        let b = decide(&c, &c[1], permits);
        assert_eq!(b, Decision::Waiting { watch: "lease-b".into(), ahead: 2, span: true });
        assert!(!b.woken_by(&c[1], "lease-a"), "a plain node before the window");
        assert!(b.woken_by(&c[1], "lease-b") && b.woken_by(&c[1], &c[0]));
        let c = vec![
            name("a", Mode::Exclusive, 3),
            name("b", Mode::Exclusive, 4),
            name("c", Mode::Exclusive, 5),
            "lease-a".into(),
        ];
        let third = decide(&c, &c[2], permits);
        assert_eq!(third, Decision::Waiting { watch: c[0].clone(), ahead: 2, span: true });
        assert!(!third.woken_by(&c[2], "lease-a"), "a window that starts at a queued node");
    }

    #[test]
    fn duplicates_keep_the_lowest_node() {
        let c = vec![name("a", Mode::Exclusive, 4), name("a", Mode::Exclusive, 2), name("b", Mode::Exclusive, 3)];
        assert_eq!(find_node(&c, "a"), Some(c[1].as_str()));
        assert_eq!(duplicates_of(&c, "a"), vec![c[0].as_str()]);
        assert!(duplicates_of(&c, "b").is_empty());
    }

    #[test]
    fn with_permits_the_first_n_hold_whatever_their_mode_and_waiters_span_n_nodes() {
        let c = vec![
            name("a", Mode::Exclusive, 1),
            name("b", Mode::Shared, 2),
            "_c_f00-lock-0000000003".to_string(),
            name("d", Mode::Shared, 4),
            name("e", Mode::Exclusive, 5),
        ];
        let three = Limit::from_permits(Some(3));
        assert_eq!(decide(&c, &c[0], three), Decision::Held);
        assert_eq!(decide(&c, &c[1], three), Decision::Held);
        assert_eq!(decide(&c, &c[3], three), Decision::Waiting { watch: c[0].clone(), ahead: 1, span: true });
        assert_eq!(decide(&c, &c[4], three), Decision::Waiting { watch: c[1].clone(), ahead: 2, span: true });
        // d, the first waiter, is woken by any holder's departure (the foreign one's too)...
        let d = decide(&c, &c[3], three);
        assert!([0, 1, 2].iter().all(|&i| d.woken_by(&c[3], &c[i])));
        // ...e only by a departure among the three nodes right before it.
        let e = decide(&c, &c[4], three);
        assert!(!e.woken_by(&c[4], &c[0]));
        assert!([1, 2, 3].iter().all(|&i| e.woken_by(&c[4], &c[i])));
        assert!(!e.woken_by(&c[4], &c[4]), "not by its own node");
        // One permit is a mutex in which shared contenders take the permit too.
        let one = Limit::from_permits(Some(1));
        assert_eq!(decide(&c, &c[1], one), Decision::Waiting { watch: c[0].clone(), ahead: 1, span: true });
        assert_eq!(Limit::from_permits(Some(0)), one, "zero permits are refused before they get here");
        assert_eq!(Limit::from_permits(None), Limit::Mutex);
    }

    #[test]
    fn a_window_across_the_wrap_of_the_sequence_wakes_as_in_the_middle() {
        let c = vec![
            zk_name(&node_prefix("a", Mode::Exclusive), i32::MAX),
            zk_name(&node_prefix("b", Mode::Exclusive), i32::MIN),
            zk_name(&node_prefix("c", Mode::Exclusive), -1),
            zk_name(&node_prefix("d", Mode::Exclusive), 0),
        ];
        let two = Limit::from_permits(Some(2));
        let d = decide(&c, &c[3], two);
        assert_eq!(d, Decision::Waiting { watch: c[1].clone(), ahead: 2, span: true });
        assert!(!d.woken_by(&c[3], &c[0]));
        assert!(d.woken_by(&c[3], &c[1]) && d.woken_by(&c[3], &c[2]));
    }

    /// The model: a FIFO of contenders and the set of those holding. Whoever holds keeps holding
    /// until it leaves (a lower limit takes nothing away). After every step the front waiters
    /// are granted while the limit allows: with N permits while fewer than N hold; on a mutex
    /// the first if it is exclusive, or the run of shared ones at the front. Nothing about
    /// watches, positions or names.
    fn model_grant(queue: &[(u64, Mode)], holding: &mut BTreeSet<u64>, limit: Limit) {
        match limit {
            Limit::Permits(n) => {
                for (id, _) in queue {
                    if !holding.contains(id) {
                        if holding.len() >= n.get() as usize {
                            return;
                        }
                        holding.insert(*id);
                    }
                }
            }
            Limit::Mutex => match queue.first() {
                None => {}
                Some((id, Mode::Exclusive)) => {
                    holding.insert(*id);
                }
                Some(_) => holding.extend(queue.iter().take_while(|(_, m)| *m == Mode::Shared).map(|(id, _)| *id)),
            },
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Enqueue(Mode),
        Foreign,
        /// A plain node (a stranger's lease): a holder ahead of the queue.
        Plain,
        Release(usize),
        /// A `Lock` object made, changed (0 is taken as "deleted": a mutex again).
        SetPermits(u32),
    }

    fn is_ours(node: &str) -> bool {
        node.starts_with("write-") || node.starts_with("read-")
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop_oneof![Just(Mode::Exclusive), Just(Mode::Shared)].prop_map(Op::Enqueue),
            1 => Just(Op::Foreign),
            1 => Just(Op::Plain),
            4 => any::<usize>().prop_map(Op::Release),
            1 => (0u32..6).prop_map(Op::SetPermits),
        ]
    }

    /// A claim of the multi-lock model: its locks (indexes) with its mode in each.
    #[derive(Clone, Debug)]
    struct ModelClaim {
        locks: Vec<(usize, Mode)>,
    }

    fn model_claim(locks: usize) -> impl Strategy<Value = ModelClaim> {
        proptest::collection::btree_map(0..locks, prop_oneof![Just(Mode::Exclusive), Just(Mode::Shared)], 1..=locks)
            .prop_map(|locks| ModelClaim { locks: locks.into_iter().collect() })
    }

    fn multi_lock_case() -> impl Strategy<Value = (Vec<Limit>, Vec<ModelClaim>, Vec<(bool, usize)>)> {
        (1usize..=4).prop_flat_map(|locks| {
            let limit = prop_oneof![Just(Limit::Mutex), (1u32..=3).prop_map(|n| Limit::from_permits(Some(n)))];
            (
                proptest::collection::vec(limit, locks),
                proptest::collection::vec(model_claim(locks), 1..10),
                // Each step: release a holder (false) or any claim, waiting or not (true: a
                // revocation, a timeout), picked by index.
                proptest::collection::vec((proptest::bool::weighted(0.2), any::<usize>()), 12),
            )
        })
    }

    proptest! {
        /// Whatever a stranger's prefix (digits at its end included), the sequence ZooKeeper
        /// appends (`%010d` of a non-negative int) is what is read; and kazoo's lease names
        /// (32 hex digits) are never read as a sequence, whatever they end in.
        #[test]
        fn the_sequence_read_is_the_one_zookeeper_appended(
            prefix in "[g-z_][a-z0-9_-]{0,20}",
            n in 0..=i32::MAX,
            lease in "[0-9a-f]{22}[0-9]{10}|[0-9a-f]{32}",
        ) {
            // `lock-` then a `-` before ten digits reads as a sign (see `parse_child`): those
            // are the lock recipes' negative sequences, `lock--1000000000`.
            prop_assume!(!prefix.ends_with("lock--") && !prefix.ends_with("lock__-"));
            let made = zk_name(&prefix, n);
            let child = parse_child(&made);
            prop_assert_eq!(child.map(|c| c.sequence), Some(n as u64), "{}", made);
            prop_assert_eq!(parse_child(&lease), None, "{}", lease);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Claims over several locks (docs/user-guide.md: several locks): each makes its node in every one of its
        /// locks at once (one multi-op: the nodes of two claims are in the same order in every
        /// lock they share), each node follows the one-lock recipe (a node once held stays held
        /// until it goes), and a claim holds when all its nodes do. Whatever the locks, modes
        /// and release order: no two conflicting holders of one lock, always someone holding
        /// while claims are left (no deadlock), and a claim is granted only once every
        /// conflicting claim ahead of it in each of its locks has gone (FIFO per lock, nobody
        /// overtaken; with N permits, fewer than N ahead).
        #[test]
        fn claims_over_several_locks_never_deadlock_and_keep_each_lock_fifo(
            (limits, claims, steps) in multi_lock_case()
        ) {
            // Node names per lock, made in claim order (one sequence: the multi-ops' order).
            let mut dirs: Vec<Vec<String>> = vec![vec![]; limits.len()];
            let mut nodes: Vec<Vec<(usize, String)>> = vec![];
            for (c, claim) in claims.iter().enumerate() {
                let mut mine = vec![];
                for (l, mode) in &claim.locks {
                    let node = name(&format!("c{c}"), *mode, (c * 10 + l) as u64);
                    dirs[*l].push(node.clone());
                    mine.push((*l, node));
                }
                nodes.push(mine);
            }
            let mut live: BTreeSet<usize> = (0..claims.len()).collect();
            let mut node_held: BTreeSet<String> = BTreeSet::new();
            let mut granted: BTreeSet<usize> = BTreeSet::new();
            let mut steps = steps.into_iter();
            loop {
                // Decide every live node (a hold is kept), then every claim.
                for c in &live {
                    for (l, node) in &nodes[*c] {
                        if decide(&dirs[*l], node, limits[*l]) == Decision::Held {
                            node_held.insert(node.clone());
                        }
                    }
                }
                let held: BTreeSet<usize> =
                    live.iter().copied().filter(|c| nodes[*c].iter().all(|(_, n)| node_held.contains(n))).collect();
                // Newly granted claims: nobody conflicting ahead of them in any of their locks.
                for c in held.difference(&granted) {
                    for (l, mode) in &claims[*c].locks {
                        let ahead: Vec<usize> = (0..*c).filter(|a| live.contains(a) && claims[*a].locks.iter().any(|(m, _)| m == l)).collect();
                        match limits[*l] {
                            Limit::Mutex => {
                                let conflicting = ahead.iter().filter(|a| {
                                    let theirs = claims[**a].locks.iter().find(|(m, _)| m == l).map(|(_, m)| *m);
                                    *mode == Mode::Exclusive || theirs == Some(Mode::Exclusive)
                                });
                                prop_assert_eq!(conflicting.count(), 0, "c{} granted lock {} before a conflicting claim ahead of it", c, l);
                            }
                            Limit::Permits(n) => prop_assert!(ahead.len() < n.get() as usize, "c{c} granted lock {l} with {} ahead", ahead.len()),
                        }
                    }
                }
                granted.extend(held.iter().copied());
                // No two conflicting holders of one lock.
                for (l, limit) in limits.iter().enumerate() {
                    let holders: Vec<Mode> = held.iter().filter_map(|c| claims[*c].locks.iter().find(|(m, _)| *m == l).map(|(_, m)| *m)).collect();
                    match limit {
                        Limit::Mutex => prop_assert!(holders.len() <= 1 || holders.iter().all(|m| *m == Mode::Shared), "lock {l} held by {holders:?}"),
                        Limit::Permits(n) => prop_assert!(holders.len() <= n.get() as usize),
                    }
                }
                if live.is_empty() {
                    break;
                }
                prop_assert!(!held.is_empty(), "no claim holds while {live:?} are left: a deadlock");
                // The next step: a holder leaves, or any claim does.
                let (any_claim, pick) = steps.next().unwrap_or((false, 0));
                let pool: Vec<usize> = if any_claim { live.iter().copied().collect() } else { held.iter().copied().collect() };
                let gone = pool[pick % pool.len()];
                live.remove(&gone);
                for (l, node) in &nodes[gone] {
                    dirs[*l].retain(|n| n != node);
                    node_held.remove(node);
                }
            }
        }

        /// Wherever in the 32-bit circle a queue lies (across the wrap or not), and whoever made
        /// its nodes, it is ordered as the nodes were made.
        #[test]
        fn queue_order_is_creation_order_across_the_wrap(
            start in any::<i32>(),
            gaps in proptest::collection::vec(1u32..100_000, 1..40),
            kinds in proptest::collection::vec(0u8..3, 40),
        ) {
            let mut cversion = start;
            let mut made = vec![];
            for (i, gap) in gaps.iter().enumerate() {
                let prefix = match kinds[i] {
                    0 => node_prefix(&format!("c{i}"), Mode::Exclusive),
                    1 => node_prefix(&format!("c{i}"), Mode::Shared),
                    _ => format!("_c_{i:x}-lock-"),
                };
                made.push(zk_name(&prefix, cversion));
                cversion = cversion.wrapping_add(*gap as i32);
            }
            let mut shuffled = made.clone();
            shuffled.sort();
            let order: Vec<&str> = queue(&shuffled).iter().map(|c| c.name).collect();
            prop_assert_eq!(order, made.iter().map(String::as_str).collect::<Vec<_>>());
        }

        /// Random interleavings of enqueue, release (of holders and of waiters, ours and foreign)
        /// and changes of the limit agree with the model, as the engine runs the recipe: a
        /// contender is decided when it is new, when a deletion wakes it (`woken_by`), or for
        /// everyone when the limit changes; a hold is kept until the node goes. Every waiter
        /// watches a live lower node (with permits, exactly N nodes from it up to its own), a
        /// release wakes at most N waiters on a lock with N permits, and everyone not woken
        /// would decide as before: nobody who became a holder was left asleep.
        #[test]
        fn recipe_matches_the_fifo_model(start_permits in 0u32..6, ops in proptest::collection::vec(op(), 1..80)) {
            let mut limit = Limit::from_permits((start_permits > 0).then_some(start_permits));
            let mut children: Vec<String> = vec![];
            // Queue key -> (node, mode) in the model: plain nodes first (in name order, as
            // their zero-padded numbers), then the sequence.
            let mut contenders: BTreeMap<u64, (String, Mode)> = BTreeMap::new();
            const QUEUED: u64 = 1 << 32;
            let mut holding: BTreeSet<u64> = BTreeSet::new();
            let mut next_seq = 0u64;
            // The engine's last decision for each of our contenders.
            let mut last: BTreeMap<String, Decision> = BTreeMap::new();
            // Waiters kept asleep with a wider window than they would now name: a plain node made
            // inside a window that starts at a plain node moves its start, and nothing wakes the
            // waiter (no deletion). Its old window still holds the new one, so every deletion
            // that matters wakes it; it may only wake for one more.
            let mut widened: BTreeSet<String> = BTreeSet::new();

            for op in ops {
                next_seq += 1;
                let mut released = None;
                let mut everyone = false;
                let plain_made = matches!(op, Op::Plain);
                match op {
                    Op::Enqueue(mode) => {
                        let node = name(&format!("c{next_seq}"), mode, next_seq);
                        children.push(node.clone());
                        contenders.insert(QUEUED + next_seq, (node, mode));
                    }
                    Op::Foreign => {
                        let node = format!("_c_{next_seq:x}-lock-{next_seq:010}");
                        children.push(node.clone());
                        contenders.insert(QUEUED + next_seq, (node, Mode::Exclusive));
                    }
                    Op::Plain => {
                        let node = format!("lease-{next_seq:04}");
                        children.push(node.clone());
                        contenders.insert(next_seq, (node, Mode::Exclusive));
                    }
                    Op::Release(i) => {
                        if contenders.is_empty() { continue; }
                        let seq = *contenders.keys().nth(i % contenders.len()).unwrap();
                        let (node, _) = contenders.remove(&seq).unwrap();
                        holding.remove(&seq);
                        children.retain(|c| *c != node);
                        last.remove(&node);
                        released = Some(node);
                    }
                    Op::SetPermits(n) => {
                        limit = Limit::from_permits((n > 0).then_some(n));
                        everyone = true;
                    }
                }
                // Unordered input: ZooKeeper returns children in no order.
                children.reverse();

                let model: Vec<(u64, Mode)> = contenders.iter().map(|(s, (_, m))| (*s, *m)).collect();
                model_grant(&model, &mut holding, limit);
                let order: Vec<&str> = queue(&children).iter().map(|c| c.name).collect();
                let mut woken = 0;
                let mut granted = false;
                for (seq, (node, _)) in &contenders {
                    if !is_ours(node) {
                        continue; // foreign: nobody decides for it here
                    }
                    let fresh = decide(&children, node, limit);
                    let before = last.get(node).cloned();
                    let decided = match &before {
                        // A hold is kept until the node goes.
                        Some(Decision::Held) => Decision::Held,
                        Some(b) if !everyone && !released.as_deref().is_some_and(|r| b.woken_by(node, r)) => {
                            // Not woken: it must not have anything new to learn.
                            let position = |n: &str| order.iter().position(|o| *o == n);
                            let same = match (b, &fresh) {
                                (Decision::Waiting { watch: w0, span: s0, .. }, Decision::Waiting { watch: w1, span: s1, .. }) => {
                                    let wider = (plain_made || widened.contains(node.as_str()))
                                        && position(w0).is_some_and(|p0| position(w1).is_some_and(|p1| p0 < p1));
                                    if wider {
                                        widened.insert(node.clone());
                                    }
                                    s0 == s1 && (w0 == w1 || wider)
                                }
                                _ => false,
                            };
                            prop_assert!(same, "{} was not woken but would now decide {:?} instead of {:?}", node, fresh, b);
                            b.clone()
                        }
                        Some(_) => {
                            if released.is_some() && !widened.contains(node.as_str()) {
                                woken += 1;
                            }
                            widened.remove(node.as_str());
                            fresh.clone()
                        }
                        None => fresh.clone(),
                    };
                    match &decided {
                        Decision::Held => prop_assert!(holding.contains(seq), "{node} held but the model holds {holding:?}"),
                        Decision::Waiting { watch, ahead, span } => {
                            prop_assert!(!holding.contains(seq), "{node} waits but the model holds it");
                            let from = order.iter().position(|n| n == watch);
                            let me = order.iter().position(|n| n == node).unwrap();
                            prop_assert!(from.is_some_and(|f| f < me), "{node} watches {watch}, not a live node before it");
                            // A count kept from before may be stale (refreshed in batches).
                            prop_assert!(*ahead >= 1 && (*ahead <= me || decided != fresh));
                            if let (true, Limit::Permits(n)) = (*span, limit) {
                                let width = me - from.unwrap();
                                let n = n.get() as usize;
                                prop_assert!(width == n || (width > n && widened.contains(node.as_str())), "a window of {} nodes, not N = {}", width, n);
                            }
                        }
                        Decision::Missing => prop_assert!(false, "{node} is missing"),
                    }
                    granted |= decided == Decision::Held && before != Some(Decision::Held);
                    last.insert(node.clone(), decided);
                }
                if let (Some(_), Limit::Permits(n)) = (&released, limit) {
                    prop_assert!(woken <= n.get() as usize, "one release woke {woken} waiters with {n} permits");
                }
                if let (true, Limit::Permits(n)) = (granted, limit) {
                    // The safety the product is about, stated on its own: a grant never makes
                    // more than N holders (ours as decided, foreign ones as the model has them).
                    let ours = last.values().filter(|d| **d == Decision::Held).count();
                    let foreign = contenders.iter().filter(|(s, (n, _))| !is_ours(n) && holding.contains(s)).count();
                    prop_assert!(ours + foreign <= n.get() as usize, "{} holders with {} permits", ours + foreign, n);
                }
            }
        }

        /// Permits across clusters (docs/design.md: permits every cluster agrees on): the limit
        /// two clusters' declarations meet at grants, in any queue, only contenders that each of
        /// the two limits grants, and is one of them when they are alike; and a limit unknown
        /// yet (the front only) grants nothing either would not.
        #[test]
        fn where_two_limits_meet_only_what_both_grant_is_granted(
            modes in proptest::collection::vec(prop_oneof![Just(Mode::Exclusive), Just(Mode::Shared)], 1..12),
            a in prop_oneof![Just(Limit::Mutex), (1u32..=5).prop_map(|n| Limit::from_permits(Some(n)))],
            b in prop_oneof![Just(Limit::Mutex), (1u32..=5).prop_map(|n| Limit::from_permits(Some(n)))],
        ) {
            let names: Vec<String> = modes
                .iter()
                .enumerate()
                .map(|(i, mode)| zk_name(&node_prefix(&format!("c{i}"), *mode), i as i32))
                .collect();
            let meet = a.meet(b);
            prop_assert_eq!(meet, b.meet(a));
            prop_assert_eq!(a.meet(a), a);
            prop_assert_eq!(meet.to_string().parse::<Limit>(), Ok(meet));
            for name in &names {
                let held = |limit| decide(&names, name, limit) == Decision::Held;
                prop_assert!(!held(meet) || (held(a) && held(b)), "{} held under {} but not under both {} and {}", name, meet, a, b);
                prop_assert!(!held(Limit::FRONT_ONLY) || held(a), "{} held under the front-only limit but not under {}", name, a);
            }
            prop_assert!(decide(&names, &names[0], meet) == Decision::Held, "the front always holds");
        }
    }
}
