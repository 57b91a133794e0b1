//! Counters the engine keeps about its own ZooKeeper traffic. They back the herd-effect tests
//! (one predecessor notification per release) and the operator's metrics.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default, Debug)]
pub(crate) struct Stats {
    pub creates: AtomicU64,
    pub create_unknown_outcomes: AtomicU64,
    pub nodes_adopted: AtomicU64,
    pub duplicates_deleted: AtomicU64,
    pub deletes: AtomicU64,
    pub children_reads: AtomicU64,
    pub predecessor_notifications: AtomicU64,
    pub own_node_notifications: AtomicU64,
    pub revocations_written: AtomicU64,
    pub directories_removed: AtomicU64,
    pub grant_stamps: AtomicU64,
}

/// A copy of the engine's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Contender nodes created.
    pub creates: u64,
    /// Creates whose answer was lost (connection loss or timeout).
    pub create_unknown_outcomes: u64,
    /// Nodes found by contender id after such a create, instead of creating a second one.
    pub nodes_adopted: u64,
    /// Extra nodes with the same contender id found and deleted.
    pub duplicates_deleted: u64,
    /// Contender nodes deleted (releases, confirmed).
    pub deletes: u64,
    /// getChildren calls on lock directories.
    pub children_reads: u64,
    /// Watch notifications on a predecessor node: the wake-ups of waiters.
    pub predecessor_notifications: u64,
    /// Watch notifications on contenders' own nodes (revocation requests, deletion).
    pub own_node_notifications: u64,
    /// Revocation requests written into holders' nodes.
    pub revocations_written: u64,
    /// Empty lock directories removed after their last contender left.
    pub directories_removed: u64,
    /// Writes that gave a grant a fencing token of its own (a lock with permits granting two
    /// contenders from one read).
    pub grant_stamps: u64,
}

impl Stats {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            creates: get(&self.creates),
            create_unknown_outcomes: get(&self.create_unknown_outcomes),
            nodes_adopted: get(&self.nodes_adopted),
            duplicates_deleted: get(&self.duplicates_deleted),
            deletes: get(&self.deletes),
            children_reads: get(&self.children_reads),
            predecessor_notifications: get(&self.predecessor_notifications),
            own_node_notifications: get(&self.own_node_notifications),
            revocations_written: get(&self.revocations_written),
            directories_removed: get(&self.directories_removed),
            grant_stamps: get(&self.grant_stamps),
        }
    }
}
