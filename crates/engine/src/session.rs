//! Following the session: its recursive watches (nodes made and deleted, data changes in lock
//! directories), its state (disconnected, back, ended), and the sweeper of idle directories.
//!
//! Persistent watches are not caught up after a reconnection (ZOOKEEPER-4698): on every
//! reconnection each lock directory, and the data of its nodes, is read again.

use std::sync::{Arc, Weak};
use std::time::Duration;

use zookeeper_client as zk;

use super::book::{Book, NodeEvent};
use super::contender::{ContenderState, EngineEvent, LostReason, SessionEvent};
use super::core::Core;
use super::stats::Stats;
use super::{anchor, ops, retry, rounds, Error};
use crate::recipe;

impl Core {
    /// Makes sure the parent of `lock_path` is watched recursively by this session before a
    /// node is made in it: from then on, every deletion and data change in the lock directory
    /// reaches the dispatcher.
    pub async fn watch_parent(self: &Arc<Self>, client: &zk::Client, lock_path: &str) -> Result<(), Error> {
        let parent = ops::parent_of(lock_path);
        let session_id = client.session_id().0;
        let watch = self.parents.lock().entry((parent.to_string(), session_id)).or_default().clone();
        watch
            .ready
            .get_or_try_init(|| async {
                let watcher = retry::idempotent(|| client.watch(parent, zk::AddWatchMode::PersistentRecursive))
                    .await
                    .map_err(|e| Error::zk("addWatch", parent, e))?;
                let stop = watch.stop.clone();
                tokio::spawn(dispatch(Arc::downgrade(self), watcher, session_id, parent.to_string(), stop));
                Ok::<(), Error>(())
            })
            .await?;
        Ok(())
    }

    /// Stops the recursive watches of parents with no lock tracked below them (a namespace
    /// whose claims all went): otherwise one per namespace ever used would stay. Decided under
    /// the book's lock, which every create holds its lock's entry in before it asks for the
    /// watch (`WindowGuard::open` first), so a watch about to be used is never stopped.
    pub fn stop_idle_watches(&self) {
        let book = self.book.lock();
        let used: std::collections::HashSet<&str> = book.locks.keys().map(|path| ops::parent_of(path)).collect();
        self.parents.lock().retain(|(parent, _), watch| {
            let keep = used.contains(parent.as_str());
            if !keep {
                watch.stop.cancel();
            }
            keep
        });
    }

    /// Notes that our last contender left `dir`; starts the sweeper if none runs.
    pub fn note_idle_directory(self: &Arc<Self>, client: &zk::Client, dir: &Arc<str>) {
        let start = {
            let mut idle = self.idle_directories.lock();
            let start = idle.is_empty();
            idle.insert(dir.clone(), std::time::Instant::now());
            start
        };
        if start {
            tokio::spawn(sweep_idle_directories(Arc::downgrade(self), client.clone()));
        }
    }

    /// A node event from the recursive watch of session `session_id`.
    fn on_node_event(self: &Arc<Self>, session_id: i64, path: &str, event: NodeEvent) {
        let Some((dir, name)) = path.rsplit_once('/') else { return };
        let mut evaluate_lock = None;
        let mut read_data = None;
        let mut confirm_deleted = None;
        {
            let mut book = self.book.lock();
            let Book { contenders, locks, .. } = &mut *book;
            let Some(lock_key) = locks.get_key_value(dir).map(|(k, _)| k.clone()) else { return };
            let Some(q) = locks.get_mut(dir) else { return };
            q.record(name, event);
            let own = recipe::parse_child(name)
                .and_then(|c| q.nodes.get(&c.sequence))
                .filter(|id| contenders.get(&***id).is_some_and(|m| *m.name == *name && m.session_id == session_id))
                .cloned();
            match event {
                // A foreign client queued here: the lock counts as shared from now on (a
                // dropped connection ends its holders before the session could expire; a new
                // session cannot claim continuity), so the next round reads it and marks the
                // directory. Unheard, the node went unnoticed until a deletion woke a round,
                // and a client that queued behind a long hold and left in a gap left no trace
                // (found by the model: crates/model, rule SeeForeignCreates).
                NodeEvent::Created => {
                    let ours = recipe::parse_child(name).is_some_and(|c| c.ours.is_some());
                    if !ours && !q.foreign && q.request_evaluation() {
                        evaluate_lock = Some(lock_key.clone());
                    }
                }
                NodeEvent::DataChanged => {
                    if let Some(id) = own {
                        Stats::bump(&self.stats.own_node_notifications);
                        read_data = Some((id, path.to_string()));
                    }
                }
                NodeEvent::Deleted => {
                    let mut woke = false;
                    for id in q.nodes.values() {
                        if let Some(m) = contenders.get_mut(id) {
                            if m.session_id == session_id && m.woken_by(name) {
                                m.stale = true;
                                woke = true;
                            }
                        }
                    }
                    if woke {
                        Stats::bump(&self.stats.predecessor_notifications);
                        if q.request_evaluation() {
                            evaluate_lock = Some(lock_key.clone());
                        }
                    }
                    if let Some(id) = own {
                        Stats::bump(&self.stats.own_node_notifications);
                        confirm_deleted = Some((id, path.to_string()));
                    }
                }
            }
        }
        if let Some(lock_path) = evaluate_lock {
            tokio::spawn(rounds::evaluate(Arc::downgrade(self), lock_path));
        }
        if let Some((id, path)) = read_data {
            tokio::spawn(read_revocation(Arc::downgrade(self), id, path));
        }
        if let Some((id, path)) = confirm_deleted {
            tokio::spawn(confirm_deleted_node(Arc::downgrade(self), session_id, id, path));
        }
    }

    /// After a reconnection, events may have been lost: every lock under `parent` with
    /// contenders of this session is read again in full.
    fn resync(self: &Arc<Self>, session_id: i64, parent: &str) {
        let prefix = format!("{}/", parent.trim_end_matches('/'));
        let mut start = vec![];
        {
            let mut book = self.book.lock();
            let Book { contenders, locks, .. } = &mut *book;
            for (path, q) in locks.iter_mut() {
                let ours = q.nodes.values().any(|id| contenders.get(id).is_some_and(|m| m.session_id == session_id));
                if path.starts_with(&prefix) && ours {
                    q.full = true;
                    if q.request_evaluation() {
                        start.push(path.clone());
                    }
                }
            }
        }
        for lock_path in start {
            tokio::spawn(rounds::evaluate(Arc::downgrade(self), lock_path));
        }
    }
}

/// Follows one recursive watch: nodes made and deleted and data changes in every lock directory below
/// `parent`, and the session's comings and goings.
async fn dispatch(
    core: Weak<Core>,
    mut watcher: zk::PersistentWatcher,
    session_id: i64,
    parent: String,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let event = tokio::select! {
            event = watcher.changed() => event,
            // Dropping the watcher removes the watch.
            _ = stop.cancelled() => return,
        };
        let Some(strong) = core.upgrade() else { return };
        match event.event_type {
            zk::EventType::Session => match event.session_state {
                // The watcher must not be polled after a terminal state.
                state if state.is_terminated() => return,
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    // The server keeps watches per connection, and zookeeper-client 0.11 leaves
                    // persistent watches out of what it registers again after a reconnection
                    // (its SetWatches request lists only one-shot watches): without adding the
                    // watch again, nothing would be heard in this directory for the rest of the
                    // session (seen in the chaos suite after ZooKeeper leader kills). Added
                    // before the re-read, so that no change falls between the two; the old
                    // watcher goes once the new one is in place (the path stays watched).
                    let client = strong.client().ok().filter(|c| c.session_id().0 == session_id);
                    drop(strong);
                    if let Some(client) = client {
                        match retry::idempotent(|| client.watch(&parent, zk::AddWatchMode::PersistentRecursive)).await {
                            Ok(renewed) => watcher = renewed,
                            // The session ended meanwhile: its monitor says so.
                            Err(e) => {
                                tracing::warn!(parent = %parent, error = %e, "could not watch again after a reconnection")
                            }
                        }
                    }
                    let Some(strong) = core.upgrade() else { return };
                    strong.resync(session_id, &parent)
                }
                _ => {}
            },
            zk::EventType::NodeCreated => strong.on_node_event(session_id, &event.path, NodeEvent::Created),
            zk::EventType::NodeDeleted => strong.on_node_event(session_id, &event.path, NodeEvent::Deleted),
            zk::EventType::NodeDataChanged => strong.on_node_event(session_id, &event.path, NodeEvent::DataChanged),
            _ => {}
        }
    }
}

/// Follows the session's state until it ends.
pub(super) async fn monitor_session(core: Weak<Core>, mut states: zk::StateWatcher, session_id: i64) {
    loop {
        let state = states.changed().await;
        let Some(core) = core.upgrade() else { return };
        match state {
            zk::SessionState::Disconnected => {
                core.suspend_shared_holds(session_id);
                core.emit(EngineEvent::Session(SessionEvent::Disconnected))
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                core.resume_holds(session_id);
                core.emit(EngineEvent::Session(SessionEvent::Reconnected))
            }
            // Expired, closed or refused: the session is over. (The client reports Expired by
            // itself when it cannot reconnect within 7/5 of the session timeout.)
            _ => {
                tracing::warn!(session = format_args!("{session_id:#x}"), ?state, "ZooKeeper session ended");
                core.lose_session(session_id);
                return;
            }
        }
    }
}

/// Reads a contender's node for a revocation request (after its data changed).
pub(super) async fn read_revocation(core: Weak<Core>, id: Arc<str>, path: String) {
    let Some(client) = core.upgrade().and_then(|c| c.client().ok()) else { return };
    let body = match retry::idempotent(|| client.get_data(&path)).await {
        Ok((body, _)) => body,
        // Gone: the deletion event says so. Session over: its monitor says so.
        Err(_) => return,
    };
    let Some(core) = core.upgrade() else { return };
    core.note_revocation(&mut core.book.lock(), &id, &path, &body);
}

/// A node of ours reported deleted: lost, unless the node of that name stands and is this
/// session's. The one deletion of a node of ours that is not its loss is re-anchoring's in
/// place (the earlier session's node deleted and one of the same name made in this session, in
/// one multi-op): the watch reports it before the multi-op's answer, but this handler may run
/// after the new node was entered. Taken for somebody deleting the node, it ended a holder and
/// a waiter `Lost` while their nodes stood, untracked, in front of other clusters' waiters for
/// the session's life. Nobody else can make a node of that name (a sequential name is made once,
/// and a replacement in place needs the old node), so one standing in this session is ours; a
/// node gone, or another session's (a newer leader replaced it in place), ends the contender,
/// as does a read that fails (the session's end, reported by its monitor too).
async fn confirm_deleted_node(core: Weak<Core>, session_id: i64, id: Arc<str>, path: String) {
    let Some(client) = core.upgrade().and_then(|c| c.client().ok()) else { return };
    let stands = client.session_id().0 == session_id
        && matches!(
            retry::idempotent(|| client.check_stat(&path)).await,
            Ok(Some(stat)) if stat.ephemeral_owner == session_id
        );
    let Some(core) = core.upgrade() else { return };
    let mut book = core.book.lock();
    let ours = book.contenders.get(&id).is_some_and(|m| m.path() == path && m.session_id == session_id);
    if ours && !stands {
        core.remove(&mut book, &id, ContenderState::Lost { why: LostReason::DeletedByOther });
    }
}

/// Removes the lock directories that stayed idle for the grace period, until none is left to
/// watch. Directories used again meanwhile are skipped (and forgotten).
async fn sweep_idle_directories(core: Weak<Core>, client: zk::Client) {
    loop {
        let Some(grace) = core.upgrade().map(|c| c.config.idle_directory_grace) else { return };
        tokio::time::sleep(grace.clamp(Duration::from_millis(10), Duration::from_secs(10))).await;
        let Some(core) = core.upgrade() else { return };
        let due: Vec<Arc<str>> = {
            let mut idle = core.idle_directories.lock();
            let book = core.book.lock();
            idle.retain(|dir, _| !book.locks.contains_key(dir));
            let due = idle.iter().filter(|(_, since)| since.elapsed() >= grace).map(|(dir, _)| dir.clone()).collect();
            due
        };
        for dir in due {
            // Used again since it was due: its next idle time counts afresh.
            if core.book.lock().locks.contains_key(&dir) {
                core.idle_directories.lock().remove(&dir);
                continue;
            }
            anchor::remove_if_empty(&client, &core, &dir).await;
            core.idle_directories.lock().remove(&dir);
        }
        core.stop_idle_watches();
        // Decided under the lock `note_idle_directory` takes: a directory noted after this
        // finds the map empty and starts a new sweeper.
        if core.idle_directories.lock().is_empty() {
            return;
        }
    }
}
