//! The engine's bookkeeping: which contenders it tracks, and per lock directory which of its
//! nodes are ours and which node events arrived while a create or a read was in flight. Pure
//! data, no I/O; the engine holds it under one mutex.
//!
//! Why the "windows": node events come from one recursive watch, handled by a dispatcher task,
//! while creates and reads are answered to other tasks. ZooKeeper delivers an event before the
//! answer to any later read, but the two tasks may handle them in either order. So a task that
//! sends a create or a read first opens a window on the lock; the dispatcher records every node
//! event seen while a window is open; and when the task applies its answer it also looks at the
//! events recorded since it opened its window. Nothing that happened after the server answered
//! is missed: either the dispatcher saw the contender already updated, or it recorded the event.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::contender::{ContenderState, LostReason};
use super::declaration::Declared;
use crate::recipe::{Decision, Limit};

#[derive(Default)]
pub(super) struct Book {
    /// Boxed: the map holds 10,000s of entries and keeps a quarter to a half of its buckets
    /// empty; an empty bucket then costs a pointer rather than a whole member.
    pub contenders: HashMap<Arc<str>, Box<Member>>,
    pub locks: HashMap<Arc<str>, LockQueue>,
    /// Contenders lost and not yet released or re-anchored: why, and the node they had. Only
    /// as many as claims whose loss the operator has not yet acted on.
    pub lost: HashMap<Arc<str>, (LostReason, String)>,
    /// Sessions that ended: nodes made in them are not entered any more. (A handful per
    /// process lifetime: one per session loss.)
    pub lost_sessions: HashSet<i64>,
    /// Locks with permits (a `Lock` object), by directory; the others are mutexes. Kept apart
    /// from `locks`, whose entries come and go with contenders.
    pub limits: HashMap<Arc<str>, Limit>,
    /// The parent of the `ClusterLock` directories other clusters share (`<shared>/locks/`), if
    /// there is a shared root: there the limit is what every cluster's declaration allows.
    pub shared_locks: Option<Arc<str>>,
    /// The shared `ClusterLock`s followed, by directory (see [`super::permits`]).
    pub declared: HashMap<Arc<str>, Declared>,
}

impl Book {
    /// Takes a contender out of the book (and its lock, once nothing else needs it).
    pub fn take(&mut self, id: &str) -> Option<(Arc<str>, Box<Member>)> {
        let (key, member) = self.contenders.remove_entry(id)?;
        if let Some(q) = self.locks.get_mut(&member.lock) {
            q.nodes.remove(&member.sequence);
        }
        self.drop_if_idle(&member.lock);
        Some((key, member))
    }

    /// Forgets a lock nobody needs any more.
    /// Closes a create's window on `lock_path` (see [`LockQueue::open`]) when nothing will.
    pub fn close_window(&mut self, lock_path: &str, window: u64) {
        if let Some(q) = self.locks.get_mut(lock_path) {
            q.close(window);
        }
        self.drop_if_idle(lock_path);
    }

    pub fn drop_if_idle(&mut self, lock_path: &str) {
        if self.locks.get(lock_path).is_some_and(LockQueue::is_idle) {
            self.locks.remove(lock_path);
        }
    }

    /// Ends an evaluation round unless another was asked for meanwhile; true to go round again.
    /// Decided under the same lock that `request_evaluation` takes, so no request is lost.
    pub fn finish_round(&mut self, lock_path: &str) -> bool {
        let Some(q) = self.locks.get_mut(lock_path) else { return false };
        if q.dirty {
            return true;
        }
        q.evaluating = false;
        self.drop_if_idle(lock_path);
        false
    }

    /// The limit of the lock in `lock_path`. In a directory other clusters share, the one every
    /// cluster's declaration allows, and the front only until they are known.
    pub fn limit(&self, lock_path: &str) -> Limit {
        if self.is_shared(lock_path) {
            return self.declared.get(lock_path).map_or(Limit::FRONT_ONLY, Declared::limit);
        }
        self.limits.get(lock_path).copied().unwrap_or_default()
    }

    /// Whether `lock_path` is a `ClusterLock` directory other clusters share.
    pub fn is_shared(&self, lock_path: &str) -> bool {
        let name = self.shared_locks.as_deref().and_then(|parent| lock_path.strip_prefix(parent));
        name.is_some_and(|name| !name.is_empty() && !name.contains('/'))
    }

    /// Where contender `id` stands, a lost one included (until it is released).
    pub fn state(&self, id: &str) -> Option<ContenderState> {
        let lost = || self.lost.get(id).map(|(why, _)| ContenderState::Lost { why: why.clone() });
        self.contenders.get(id).map(|member| member.state()).or_else(lost)
    }
}

/// One contender: its node and the last decision about it (its state is derived from these).
pub(super) struct Member {
    pub lock: Arc<str>,
    /// The node's name in the lock directory.
    pub name: Box<str>,
    pub sequence: u64,
    pub session_id: i64,
    /// Set when the recipe first grants the lock (see the engine's `apply`).
    pub fencing_token: i64,
    /// The zxid of the contender's first enqueue: its place in the queue across sessions.
    pub ticket: i64,
    /// `None` until the first read of the directory after the node was made.
    pub decision: Option<Decision>,
    pub revoke: Option<String>,
    /// Needs a fresh read of the directory: new, or the node it watched is gone.
    pub stale: bool,
    /// Reads of the directory started before the node was entered here: those may not show it
    /// yet, and must not decide for it.
    pub reads_before: u64,
    /// Told once the first decision is made (or dropped with the contender).
    pub decided: Option<oneshot::Sender<()>>,
    /// Granted, and waiting for a fencing token of its own (see `rounds::stamp`).
    pub granting: bool,
}

impl Member {
    pub fn path(&self) -> String {
        format!("{}/{}", self.lock, self.name)
    }

    /// The state its decision and revocation request add up to.
    pub fn state(&self) -> ContenderState {
        let token = self.fencing_token;
        match (&self.decision, &self.revoke) {
            (None, None) => ContenderState::Waiting { ahead: 0, watching: String::new() },
            (None, Some(reason)) | (Some(Decision::Waiting { .. }), Some(reason)) => {
                ContenderState::RevokeRequested { reason: reason.clone(), fencing_token: None }
            }
            (Some(Decision::Held), None) => ContenderState::Held { fencing_token: token },
            (Some(Decision::Held), Some(reason)) => {
                ContenderState::RevokeRequested { reason: reason.clone(), fencing_token: Some(token) }
            }
            (Some(Decision::Waiting { watch, ahead, .. }), None) => {
                ContenderState::Waiting { ahead: *ahead, watching: watch.clone() }
            }
            (Some(Decision::Missing), _) => ContenderState::Lost { why: LostReason::DeletedByOther },
        }
    }

    /// Whether the deletion of node `deleted` wakes this contender (see
    /// [`Decision::woken_by`]).
    pub fn woken_by(&self, deleted: &str) -> bool {
        self.decision.as_ref().is_some_and(|d| d.woken_by(&self.name, deleted))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NodeEvent {
    Created,
    Deleted,
    DataChanged,
}

/// One lock directory in which the engine has contenders (or a create in flight).
#[derive(Default)]
pub(super) struct LockQueue {
    /// Our nodes: sequence → contender id.
    pub nodes: HashMap<u64, Arc<str>>,
    /// A task is reading the directory and deciding; others set `dirty` instead of starting one.
    pub evaluating: bool,
    /// Read again before the evaluating task stops.
    pub dirty: bool,
    /// The highest fencing token granted in this lock since its queue was entered here. A
    /// lock with permits may grant two contenders from one read (or a raise of the permits
    /// from a read that shows nothing new): a grant needs a token above this one.
    pub last_token: i64,
    /// Reads of the directory started so far.
    pub reads: u64,
    /// The next read re-checks every contender and its data (after a reconnection, when
    /// events may have been lost: ZOOKEEPER-4698).
    pub full: bool,
    /// The directory is shared with clients other than zklock (its marker says so, or one of
    /// their nodes was seen): a dropped connection then revokes our holders there. Kept while
    /// the lock is tracked, learned again when it is tracked anew.
    pub foreign: bool,
    /// The version of the directory's data (its marker) last read, if any.
    pub marker_read: Option<i32>,
    /// Open windows: start mark → how many.
    open: BTreeMap<u64, u32>,
    /// Node events recorded while a window was open: (mark, node name, what happened).
    seen: VecDeque<(u64, Box<str>, NodeEvent)>,
    next_mark: u64,
}

impl LockQueue {
    /// Opens a window before a create or a read is sent; returns its start mark.
    pub fn open(&mut self) -> u64 {
        let start = self.next_mark;
        *self.open.entry(start).or_insert(0) += 1;
        start
    }

    /// Closes a window and forgets the events no open window can still need.
    pub fn close(&mut self, start: u64) {
        if let Some(n) = self.open.get_mut(&start) {
            *n -= 1;
            if *n == 0 {
                self.open.remove(&start);
            }
        }
        let oldest = self.open.keys().next().copied().unwrap_or(self.next_mark);
        while self.seen.front().is_some_and(|(mark, _, _)| *mark < oldest) {
            self.seen.pop_front();
        }
    }

    /// Notes a node event; kept only while some window is open.
    pub fn record(&mut self, name: &str, event: NodeEvent) {
        if !self.open.is_empty() {
            self.seen.push_back((self.next_mark, name.into(), event));
        }
        self.next_mark += 1;
    }

    /// Whether `event` happened to node `name` since the window opened at `start`.
    pub fn seen_since(&self, start: u64, name: &str, event: NodeEvent) -> bool {
        self.any_seen_since(start, event, |n| n == name)
    }

    /// Whether `event` happened since the window opened at `start` to a node `which` picks.
    pub fn any_seen_since(&self, start: u64, event: NodeEvent, which: impl Fn(&str) -> bool) -> bool {
        self.seen.iter().any(|(mark, n, e)| *mark >= start && *e == event && which(n))
    }

    /// Asks for a read and a decision; true when the caller must start the evaluating task.
    pub fn request_evaluation(&mut self) -> bool {
        self.dirty = true;
        !std::mem::replace(&mut self.evaluating, true)
    }

    /// Nothing left to track: no contender, no task, no window.
    pub fn is_idle(&self) -> bool {
        self.nodes.is_empty() && !self.evaluating && self.open.is_empty()
    }

    #[cfg(test)]
    fn recorded(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_kept_exactly_while_a_window_that_needs_them_is_open() {
        let mut q = LockQueue::default();
        q.record("before", NodeEvent::Deleted);
        assert_eq!(q.recorded(), 0, "nobody is listening");
        let a = q.open();
        q.record("x", NodeEvent::Deleted);
        let b = q.open();
        q.record("y", NodeEvent::DataChanged);
        assert!(q.seen_since(a, "x", NodeEvent::Deleted));
        assert!(!q.seen_since(b, "x", NodeEvent::Deleted), "x went before b opened");
        assert!(q.seen_since(b, "y", NodeEvent::DataChanged));
        assert!(!q.seen_since(a, "y", NodeEvent::Deleted));
        q.close(a);
        assert_eq!(q.recorded(), 1, "only b's event is still needed");
        assert!(q.seen_since(b, "y", NodeEvent::DataChanged));
        q.close(b);
        assert_eq!(q.recorded(), 0);
        assert!(q.is_idle());
    }

    #[test]
    fn one_evaluating_task_at_a_time() {
        let mut q = LockQueue::default();
        assert!(q.request_evaluation());
        assert!(!q.request_evaluation());
        assert!(q.dirty && q.evaluating && !q.is_idle());
    }
}
