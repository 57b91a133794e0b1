//! The pure ZooKeeper lock recipe: given a lock directory's children, our node and our mode,
//! decide whether we hold the lock or which single node to watch. No I/O lives here, so the
//! rules can be checked exhaustively against a model (see the proptest below).
//!
//! Node names are `write-<uid>-lock-<seq>` (exclusive) and `read-<uid>-lock-<seq>` (shared).
//! The `-lock-` before the sequence keeps the directory readable by Apache Curator's
//! `InterProcessMutex`, which sorts children by what follows the last `lock-` and treats every
//! child as exclusive. Children that are not ours are sorted by their trailing sequence number
//! and treated as exclusive contenders (the conservative reading: a stranger might be a writer);
//! children without a sequence are not contenders and are ignored.

use std::fmt;

/// How a contender wants the lock.
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

impl Child<'_> {
    /// The mode the recipe gives this child: foreign children count as exclusive.
    pub fn mode(&self) -> Mode {
        self.ours.map_or(Mode::Exclusive, |(_, mode)| mode)
    }
}

/// Parses a child name; `None` for children without a sequence, which are not contenders.
pub fn parse_child(name: &str) -> Option<Child<'_>> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (head, seq) = name.split_at(name.len() - digits);
    let signed = head.strip_suffix('-');
    // Ten to nineteen digits fit in u64; anything longer is not a ZooKeeper sequence.
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
    let mut queue: Vec<Child<'a>> = children.iter().filter_map(|c| parse_child(c.as_ref())).collect();
    let base = wrap_base(queue.iter().map(|c| c.sequence));
    queue
        .sort_by(|a, b| queue_key(a.sequence, base).cmp(&queue_key(b.sequence, base)).then_with(|| a.name.cmp(b.name)));
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

/// What the recipe tells a contender to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold the lock.
    Held,
    /// We wait; `watch` is the one node whose deletion can change the answer, `ahead` is the
    /// number of contenders that must go before we can hold.
    Waiting { watch: String, ahead: usize },
    /// Our node is not among the children: it was deleted (or never made).
    Missing,
}

/// Decides for the contender whose node is named `me` among `children`.
pub fn decide<S: AsRef<str>>(children: &[S], me: &str) -> Decision {
    decide_in(&queue(children), me)
}

/// [`decide`] on a queue already sorted by [`queue`] (to decide for many contenders at once).
pub fn decide_in(queue: &[Child<'_>], me: &str) -> Decision {
    let Some(index) = queue.iter().position(|c| c.name == me) else {
        return Decision::Missing;
    };
    let blocker = match queue[index].mode() {
        Mode::Exclusive => index.checked_sub(1),
        Mode::Shared => queue[..index].iter().rposition(|c| c.mode() == Mode::Exclusive),
    };
    match blocker {
        None => Decision::Held,
        Some(b) => Decision::Waiting { watch: queue[b].name.to_string(), ahead: b + 1 },
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
    use std::collections::BTreeMap;

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
        assert_eq!(decide(&shuffled, &made[0]), Decision::Held);
        assert_eq!(decide(&shuffled, &made[2]), Decision::Waiting { watch: made[1].clone(), ahead: 2 });
        // A `-` before ten digits is a separator, not a sign, unless the number is 2^31.
        assert_eq!(parse_child("write-a-lock-0000000007").unwrap().sequence, 7);
        // Kazoo's negative names parse; a stray name with nine digits is no contender.
        assert_eq!(parse_child("f00__lock__-000000002").unwrap().sequence, (1 << 32) - 2);
        assert_eq!(parse_child("job-123456789"), None);
    }

    #[test]
    fn exclusive_watches_the_node_right_before_it() {
        let c = vec![name("a", Mode::Exclusive, 1), name("b", Mode::Shared, 2), name("c", Mode::Exclusive, 3)];
        assert_eq!(decide(&c, &c[0]), Decision::Held);
        assert_eq!(decide(&c, &c[2]), Decision::Waiting { watch: c[1].clone(), ahead: 2 });
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
        assert_eq!(decide(&c, &c[1]), Decision::Held);
        assert_eq!(decide(&c, &c[2]), Decision::Waiting { watch: c[1].clone(), ahead: 2 });
        assert_eq!(decide(&c, &c[4]), Decision::Waiting { watch: c[2].clone(), ahead: 3 });
    }

    #[test]
    fn foreign_nodes_are_exclusive_and_unsequenced_ones_ignored() {
        let c = vec!["_c_1234-lock-0000000002".to_string(), "leftover".to_string(), name("a", Mode::Shared, 3)];
        assert_eq!(decide(&c, &c[2]), Decision::Waiting { watch: c[0].clone(), ahead: 1 });
        assert_eq!(decide(&c, "read-zz-lock-0000000009"), Decision::Missing);
    }

    #[test]
    fn duplicates_keep_the_lowest_node() {
        let c = vec![name("a", Mode::Exclusive, 4), name("a", Mode::Exclusive, 2), name("b", Mode::Exclusive, 3)];
        assert_eq!(find_node(&c, "a"), Some(c[1].as_str()));
        assert_eq!(duplicates_of(&c, "a"), vec![c[0].as_str()]);
        assert!(duplicates_of(&c, "b").is_empty());
    }

    /// The model: a FIFO of contenders; the holders are the first one if it is exclusive, or
    /// the run of shared ones at the front. Nothing about watches, positions or names.
    fn model_holders(queue: &[(u64, Mode)]) -> Vec<u64> {
        match queue.first() {
            None => vec![],
            Some((id, Mode::Exclusive)) => vec![*id],
            Some(_) => queue.iter().take_while(|(_, m)| *m == Mode::Shared).map(|(id, _)| *id).collect(),
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Enqueue(Mode),
        Foreign,
        Junk,
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop_oneof![Just(Mode::Exclusive), Just(Mode::Shared)].prop_map(Op::Enqueue),
            1 => Just(Op::Foreign),
            1 => Just(Op::Junk),
            4 => any::<usize>().prop_map(Op::Release),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

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

        /// Random interleavings of enqueue and release (of holders and of waiters, ours and
        /// foreign) agree with the model, every waiter watches exactly one live lower node, and
        /// a release wakes only those that watched the released node: everyone else's decision
        /// stays as it was, yet nobody who became a holder was left asleep.
        #[test]
        fn recipe_matches_the_fifo_model(ops in proptest::collection::vec(op(), 1..80)) {
            let mut children: Vec<String> = vec![];
            // sequence -> (contender id, mode) in the model; junk has no entry.
            let mut contenders: BTreeMap<u64, (String, Mode)> = BTreeMap::new();
            let mut next_seq = 0u64;
            // What each contender last decided, as its watch target (None = held).
            let mut last: BTreeMap<String, Option<String>> = BTreeMap::new();

            for op in ops {
                next_seq += 1;
                let mut released = None;
                match op {
                    Op::Enqueue(mode) => {
                        let id = format!("c{next_seq}");
                        let node = name(&id, mode, next_seq);
                        children.push(node.clone());
                        contenders.insert(next_seq, (node, mode));
                    }
                    Op::Foreign => {
                        let node = format!("_c_{next_seq:x}-lock-{next_seq:010}");
                        children.push(node.clone());
                        contenders.insert(next_seq, (node, Mode::Exclusive));
                    }
                    Op::Junk => children.push(format!("junk{}", next_seq % 7)),
                    Op::Release(i) => {
                        if contenders.is_empty() { continue; }
                        let seq = *contenders.keys().nth(i % contenders.len()).unwrap();
                        let (node, _) = contenders.remove(&seq).unwrap();
                        children.retain(|c| *c != node);
                        last.remove(&node);
                        released = Some(node);
                    }
                }
                // Shuffle-free but unordered input: ZooKeeper returns children in no order.
                children.reverse();

                let model: Vec<(u64, Mode)> = contenders.iter().map(|(s, (_, m))| (*s, *m)).collect();
                let holders = model_holders(&model);
                for (seq, (node, mode)) in &contenders {
                    let decision = decide(&children, node);
                    let now = match &decision {
                        Decision::Held => {
                            prop_assert!(holders.contains(seq), "{node} held but the model says {holders:?}");
                            None
                        }
                        Decision::Waiting { watch, ahead } => {
                            prop_assert!(!holders.contains(seq), "{node} waits but the model holds it");
                            let target = parse_child(watch).unwrap();
                            prop_assert!(children.contains(watch), "watches a node that is gone");
                            prop_assert!(target.sequence < *seq, "watches a node after itself");
                            if *mode == Mode::Shared {
                                prop_assert_eq!(target.mode(), Mode::Exclusive);
                            }
                            let lower = model.iter().filter(|(s, _)| s < seq).count();
                            prop_assert!(*ahead >= 1 && *ahead <= lower);
                            Some(watch.clone())
                        }
                        Decision::Missing => { prop_assert!(false, "{node} is missing"); None }
                    };
                    match (last.get(node), &released) {
                        // Watched the released node: woken, may decide anything.
                        (Some(Some(w)), Some(r)) if w == r => {}
                        // Not woken: the decision must not have changed, or it would sleep on.
                        (Some(before), _) => prop_assert_eq!(before, &now, "{} changed without a wake-up", node),
                        (None, _) => {}
                    }
                    last.insert(node.clone(), now);
                }
            }
        }
    }
}
