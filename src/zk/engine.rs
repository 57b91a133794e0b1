//! One ZooKeeper session, many contenders (one per claim UID).
//!
//! Each contender is an EPHEMERAL_SEQUENTIAL node in its lock directory, and an entry in the
//! engine's book (see [`super::book`]): no task and no watch of its own, so that tens of
//! thousands of them cost little. One persistent recursive watch per parent of lock directories
//! (per namespace, for the operator) reports every deletion and data change below it. The
//! recipe (see [`crate::recipe`]) names for each waiter the one node whose deletion can change
//! its answer; only that node's deletion makes the engine read the directory again and decide
//! for the waiters that watched it — so a release costs one event and one read, whatever the
//! length of the queue. Data changes on our own nodes are revocation requests; their deletion
//! by someone else loses the lock.
//!
//! Persistent watches are not caught up after a reconnection (ZOOKEEPER-4698): on every
//! reconnection the engine reads each lock directory, and the data of its nodes, again.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use tokio::sync::{mpsc, oneshot, watch, OnceCell};
use zookeeper_client as zk;

use super::anchor;
use super::book::{Book, LockQueue, Member, NodeEvent};
use super::data::{self, NodeData};
use super::fence::{self, Epoch, Fence};
use super::retry::{self, Backoff};
use super::stats::{Stats, StatsSnapshot};
use super::{Error, ZkConfig};
use crate::recipe::{self, Decision, Mode};

/// Who wants which lock, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContenderSpec {
    /// Unique per contender and part of its node name (a claim UID): it lets the engine find
    /// the node it made when a create's answer was lost. Shared, so that the operator's many
    /// indexes of one claim hold one copy of it.
    pub id: Arc<str>,
    /// Absolute path of the lock directory, e.g. `/zklock/locks/shop/db-migrations`.
    pub lock: String,
    pub mode: Mode,
    /// Written into the node's data for people reading the queue, e.g. `shop/nightly`.
    pub description: String,
}

/// Where a contender stands. `RevokeRequested` is sticky: once somebody asked the contender to
/// let go, it stays so (with the fencing token once it is granted) until it is released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContenderState {
    Waiting { ahead: usize, watching: String },
    Held { fencing_token: i64 },
    RevokeRequested { reason: String, fencing_token: Option<i64> },
    Lost { why: LostReason },
    Released,
}

impl ContenderState {
    /// The fencing token while the contender holds the lock.
    pub fn fencing_token(&self) -> Option<i64> {
        match self {
            ContenderState::Held { fencing_token } => Some(*fencing_token),
            ContenderState::RevokeRequested { fencing_token, .. } => *fencing_token,
            _ => None,
        }
    }

    pub fn is_held(&self) -> bool {
        self.fencing_token().is_some()
    }

    /// Lost or released: the node is gone and nothing more will happen.
    pub fn is_final(&self) -> bool {
        matches!(self, ContenderState::Lost { .. } | ContenderState::Released)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// Somebody else deleted the node.
    DeletedByOther,
    /// The session ended, and ephemeral nodes with it.
    SessionExpired,
    /// ZooKeeper refused an operation the contender cannot do without.
    Failed(String),
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::DeletedByOther => f.write_str("the node was deleted by another client"),
            LostReason::SessionExpired => f.write_str("the ZooKeeper session ended"),
            LostReason::Failed(why) => write!(f, "ZooKeeper error: {why}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// A new session is up (the first one, or one made by `reconnect`).
    Connected {
        session_id: i64,
    },
    /// The connection dropped; the session (and every node) lives on if it comes back in time.
    Disconnected,
    Reconnected,
    /// The session ended: every contender of it is `Lost`.
    Lost {
        session_id: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    Contender { id: String, state: ContenderState },
    Session(SessionEvent),
}

/// A contender's handle: its node and its stream of states. The engine keeps a state channel
/// for a contender only while handles on it exist.
pub struct Contender {
    pub id: String,
    /// Full path of the contender's node.
    pub node: String,
    states: watch::Receiver<ContenderState>,
    shared: Weak<Shared>,
}

impl Clone for Contender {
    fn clone(&self) -> Self {
        Contender {
            id: self.id.clone(),
            node: self.node.clone(),
            states: self.states.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl fmt::Debug for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Contender")
            .field("id", &self.id)
            .field("node", &self.node)
            .field("state", &self.state())
            .finish()
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        // The last handle gone: the contender's channel goes too (it is made again on demand).
        // Handles are never dropped while the book is locked.
        if let Some(shared) = self.shared.upgrade() {
            let mut book = shared.book.lock();
            // Only this incarnation's channel: the id may have come back with a new node.
            if let Some(member) = book.contenders.get_mut(self.id.as_str()).filter(|m| m.path() == self.node) {
                if member.watchers.as_ref().is_some_and(|tx| tx.receiver_count() <= 1) {
                    member.watchers = None;
                }
            }
        }
    }
}

impl Contender {
    pub fn state(&self) -> ContenderState {
        self.states.borrow().clone()
    }

    /// Waits for the next state change; `None` once no change can come any more.
    pub async fn changed(&mut self) -> Option<ContenderState> {
        self.states.changed().await.ok()?;
        Some(self.states.borrow_and_update().clone())
    }

    /// Waits until the state satisfies `f` (checked at once, then on every change). `f` runs
    /// while the engine may be publishing: it must not call into the engine or drop handles.
    pub async fn wait_for(&mut self, mut f: impl FnMut(&ContenderState) -> bool) -> Option<ContenderState> {
        self.states.wait_for(|s| f(s)).await.ok().map(|s| s.clone())
    }
}

/// The lock engine. Cheap to clone; dropping the last clone closes the session (ZooKeeper
/// then deletes the ephemeral nodes) and stops its tasks.
#[derive(Clone)]
pub struct LockEngine {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZkConfig,
    shared: Arc<Shared>,
    session: Mutex<Option<zk::Client>>,
    /// The session in which new contenders may join queues (0: none). A new session is
    /// re-anchored first (DESIGN.md §3): a node made in it before would jump the recorded queue.
    admitted: AtomicI64,
    /// Parent directories of lock directories, watched recursively: path → (session, set up).
    parents: Mutex<HashMap<ParentKey, Arc<OnceCell<()>>>>,
}

/// A parent directory watched recursively, and the session whose watch it is.
type ParentKey = (String, i64);

/// What the engine's tasks share, without keeping the engine (and so its session) alive.
pub(super) struct Shared {
    pub(super) stats: Stats,
    events: Option<mpsc::UnboundedSender<EngineEvent>>,
    book: Mutex<Book>,
    /// Lock directories this engine has already marked as used by foreign clients.
    foreign_marked: Mutex<HashSet<String>>,
    /// The leader epoch every write of this engine is guarded by.
    pub(super) fence: Fence,
    /// Lock directories our last contender left, and since when: removed, if still idle and
    /// empty, once `idle_directory_grace` has passed (one sweeper task at a time).
    idle_directories: Mutex<HashMap<Arc<str>, std::time::Instant>>,
    idle_directory_grace: std::time::Duration,
}

impl Shared {
    fn emit(&self, event: EngineEvent) {
        if let Some(events) = &self.events {
            // A consumer that went away does not stop the engine.
            let _ = events.send(event);
        }
    }

    /// Publishes `state` for contender `id` if it differs from `before` (the state the
    /// contender had before the change at hand; states are derived, not stored).
    fn publish(&self, id: &str, member: &Member, before: &ContenderState, state: ContenderState) {
        if *before == state {
            return;
        }
        if let Some(tx) = &member.watchers {
            tx.send_replace(state.clone());
        }
        self.emit(EngineEvent::Contender { id: id.to_string(), state });
    }

    /// Publishes what the member's decision and revocation request add up to now.
    fn publish_current(&self, id: &str, member: &Member, before: &ContenderState) {
        self.publish(id, member, before, current_state(member));
    }

    /// Notes that our last contender left `dir`; starts the sweeper if none runs.
    fn note_idle_directory(self: &Arc<Self>, client: &zk::Client, dir: &Arc<str>) {
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

    /// Removes a contender from the book and publishes its final state.
    /// A lost contender is remembered (with why, and its node) until it is released or comes
    /// back, so that whoever reacts to the loss can still tell how it ended.
    fn remove(&self, book: &mut Book, id: &str, last: ContenderState) -> Option<Box<Member>> {
        let (key, mut member) = take(book, id)?;
        // Not a session's end: re-anchoring and its verdicts judge those, and a claim that is
        // not re-anchored (its Waiting status not yet written when the claims were listed)
        // must be able to join the queue again.
        if let ContenderState::Lost { why } = &last {
            if *why != LostReason::SessionExpired {
                book.lost.insert(key.clone(), (why.clone(), member.path()));
            }
        }
        self.publish(&key, &member, &current_state(&member), last);
        member.decided = None;
        Some(member)
    }
}

/// Takes a contender out of the book (and its lock, once nothing else needs it).
fn take(book: &mut Book, id: &str) -> Option<(Arc<str>, Box<Member>)> {
    let (key, member) = book.contenders.remove_entry(id)?;
    if let Some(q) = book.locks.get_mut(&member.lock) {
        q.nodes.remove(&member.sequence);
    }
    drop_if_idle(book, &member.lock);
    Some((key, member))
}

/// The state a member's decision and revocation request add up to.
fn current_state(member: &Member) -> ContenderState {
    let token = member.fencing_token;
    match (&member.decision, &member.revoke) {
        (None, None) => ContenderState::Waiting { ahead: 0, watching: String::new() },
        (None, Some(reason)) | (Some(Decision::Waiting { .. }), Some(reason)) => {
            ContenderState::RevokeRequested { reason: reason.clone(), fencing_token: None }
        }
        (Some(Decision::Held), None) => ContenderState::Held { fencing_token: token },
        (Some(Decision::Held), Some(reason)) => {
            ContenderState::RevokeRequested { reason: reason.clone(), fencing_token: Some(token) }
        }
        (Some(Decision::Waiting { watch, ahead }), None) => {
            ContenderState::Waiting { ahead: *ahead, watching: watch.clone() }
        }
        (Some(Decision::Missing), _) => ContenderState::Lost { why: LostReason::DeletedByOther },
    }
}

/// The directory whose recursive watch covers lock directory `lock`.
fn parent_of(lock: &str) -> &str {
    match lock.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((parent, _)) => parent,
    }
}

impl LockEngine {
    /// Opens a session and returns an engine without an event stream.
    pub async fn connect(config: ZkConfig) -> Result<Self, Error> {
        Self::start(config, None).await
    }

    /// Opens a session and returns the engine with the stream of every contender's state
    /// changes and of session events (the operator consumes this one stream).
    pub async fn connect_with_events(config: ZkConfig) -> Result<(Self, mpsc::UnboundedReceiver<EngineEvent>), Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        Ok((Self::start(config, Some(tx)).await?, rx))
    }

    async fn start(config: ZkConfig, events: Option<mpsc::UnboundedSender<EngineEvent>>) -> Result<Self, Error> {
        let idle_directory_grace = config.idle_directory_grace;
        let engine = LockEngine {
            inner: Arc::new(Inner {
                config,
                shared: Arc::new(Shared {
                    stats: Stats::default(),
                    events,
                    book: Mutex::new(Book::default()),
                    foreign_marked: Mutex::new(HashSet::new()),
                    fence: Fence::default(),
                    idle_directories: Mutex::new(HashMap::new()),
                    idle_directory_grace,
                }),
                session: Mutex::new(None),
                admitted: AtomicI64::new(0),
                parents: Mutex::new(HashMap::new()),
            }),
        };
        engine.reconnect().await?;
        // A fresh engine has nothing to re-anchor.
        engine.admit();
        Ok(engine)
    }

    /// Lets new contenders join queues in the current session: call it once the session is
    /// re-anchored. Returns the session admitted, if there is one.
    pub fn admit(&self) -> Option<i64> {
        let session = self.session_id()?;
        self.inner.admitted.store(session, Ordering::SeqCst);
        Some(session)
    }

    /// Whether new contenders may join queues now: the current session is the admitted one.
    /// Turns false the moment a session ends, before any of its contenders is reported lost.
    pub fn admitting(&self) -> bool {
        self.session_id().is_some_and(|s| s == self.inner.admitted.load(Ordering::SeqCst))
    }

    /// Opens a new session after the previous one was lost (or replaces a live one, whose
    /// contenders are then lost). Contenders must be re-anchored, and the session admitted
    /// ([`LockEngine::admit`]), before new ones can be enqueued.
    pub async fn reconnect(&self) -> Result<(), Error> {
        let client = self.inner.config.connect().await?;
        let session_id = client.session_id().0;
        let states = client.state_watcher();
        let old = self.inner.session.lock().replace(client);
        if let Some(old) = old {
            self.inner.lose_session(old.session_id().0);
        }
        tokio::spawn(monitor_session(Arc::downgrade(&self.inner), states, session_id));
        self.inner.shared.emit(EngineEvent::Session(SessionEvent::Connected { session_id }));
        Ok(())
    }

    fn client(&self) -> Result<zk::Client, Error> {
        self.inner.client()
    }

    /// The current session's id, if there is one.
    pub fn session_id(&self) -> Option<i64> {
        self.inner.session.lock().as_ref().map(|c| c.session_id().0)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.inner.shared.stats.snapshot()
    }

    /// The config the engine was made with.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// Takes the leader epoch at `path` (DESIGN.md §5a): bumps it, so that every write guarded
    /// by an earlier epoch fails from now on, and guards every later write of this engine by the
    /// new one. Call it once, before re-anchoring; `holder` is written into the node for people.
    /// Answers the epoch's token (see [`LockEngine::epoch`]).
    pub async fn take_epoch(&self, path: &str, holder: &str) -> Result<i64, Error> {
        let client = self.client()?;
        let (version, token) = fence::bump(&client, path, holder).await.map_err(|e| Error::zk("epoch", path, e))?;
        if !self.inner.shared.fence.set(Epoch { path: path.to_string(), version, token }) {
            return Err(Error::zk("epoch", path, zk::Error::BadArguments(&"this engine has an epoch already")));
        }
        Ok(token)
    }

    /// The token of the leader epoch this engine took, if it took one: the zxid of the bump,
    /// which no other leader's term shares. The controller stamps it into the statuses it
    /// writes, so that a deposed leader's status writes fail too (DESIGN.md §5a).
    pub fn epoch(&self) -> Option<i64> {
        self.inner.shared.fence.epoch().map(|e| e.token)
    }

    /// Whether this engine's leader epoch is still the latest, by a read of the epoch node; the
    /// engine turns fenced when it is not. True without an epoch.
    pub async fn epoch_is_current(&self) -> Result<bool, Error> {
        let Some(epoch) = self.inner.shared.fence.epoch() else { return Ok(true) };
        let client = self.client()?;
        let read = super::retry::idempotent(|| client.get_data(&epoch.path)).await;
        let current = match read {
            Ok((_, stat)) => stat.version == epoch.version && stat.mzxid == epoch.token,
            Err(zk::Error::NoNode) => false,
            Err(e) => return Err(Error::zk("epoch", &epoch.path, e)),
        };
        if !current {
            self.inner.shared.fence.superseded();
        }
        Ok(current)
    }

    /// Turns true, for good, once a write of this engine found its leader epoch superseded:
    /// another leader took over, and this engine can change no lock any more.
    pub fn fenced(&self) -> watch::Receiver<bool> {
        self.inner.shared.fence.subscribe()
    }

    /// The state of contender `id`, if the engine tracks it.
    /// The state of contender `id`, if the engine tracks it (a lost one until it is released).
    pub fn state(&self, id: &str) -> Option<ContenderState> {
        let book = self.inner.shared.book.lock();
        match book.contenders.get(id) {
            Some(member) => Some(current_state(member)),
            None => book.lost.get(id).map(|(why, _)| ContenderState::Lost { why: why.clone() }),
        }
    }

    /// Every contender id the engine tracks, lost ones included.
    pub fn ids(&self) -> Vec<Arc<str>> {
        let book = self.inner.shared.book.lock();
        book.contenders.keys().chain(book.lost.keys()).cloned().collect()
    }

    /// The engine's own copy of a contender id it tracks.
    pub fn id(&self, id: &str) -> Option<Arc<str>> {
        let book = self.inner.shared.book.lock();
        let tracked = book.contenders.get_key_value(id).map(|(key, _)| key);
        tracked.or_else(|| book.lost.get_key_value(id).map(|(key, _)| key)).cloned()
    }

    /// The full path of contender `id`'s node (the node it had, if lost), if the engine tracks it.
    pub fn node(&self, id: &str) -> Option<String> {
        let book = self.inner.shared.book.lock();
        match book.contenders.get(id) {
            Some(member) => Some(member.path()),
            None => book.lost.get(id).map(|(_, path)| path.clone()),
        }
    }

    /// Puts a contender in the queue of its lock: creates its node (and the lock directory if
    /// needed), decides once, and from then on follows the recipe. Enqueueing an id the engine
    /// already tracks returns the existing contender.
    pub async fn enqueue(&self, spec: ContenderSpec) -> Result<Contender, Error> {
        let id = spec.id.to_string();
        let handle = self.join(spec, true).await?;
        handle.ok_or(Error::UnknownContender(id))
    }

    /// [`LockEngine::enqueue`] without a handle: the caller follows the contender through
    /// [`LockEngine::state`] and the event stream (this keeps no state channel for it).
    pub async fn enqueue_untracked(&self, spec: ContenderSpec) -> Result<(), Error> {
        self.join(spec, false).await.map(drop)
    }

    async fn join(&self, spec: ContenderSpec, want_handle: bool) -> Result<Option<Contender>, Error> {
        if !recipe::is_contender_id(&spec.id) {
            return Err(Error::BadContenderId(spec.id.to_string()));
        }
        if !is_lock_path(&spec.lock) {
            return Err(Error::BadLockPath(spec.lock));
        }
        if self.inner.shared.book.lock().contenders.contains_key(&*spec.id) {
            return Ok(if want_handle { self.handle(&spec.id) } else { None });
        }
        let client = self.client()?;
        if client.session_id().0 != self.inner.admitted.load(Ordering::SeqCst) {
            return Err(Error::NotAdmitted);
        }
        self.inner.watch_parent(&client, &spec.lock).await?;
        let (lock_path, window) = self.inner.open_window(&spec.lock);
        let mut guard = WindowGuard { inner: &self.inner, lock: lock_path.clone(), start: window, armed: true };
        let name = create_node(&client, &self.inner.shared, &self.inner.config, &spec).await?;
        // `register` closes the window from here on.
        guard.armed = false;
        let registered = self.inner.register(&client, &lock_path, window, vec![(spec, name)], want_handle)?;
        let mut joined = Inner::settle(registered).await;
        Ok(joined.pop().flatten())
    }

    /// Re-anchors a lock after a new session (DESIGN.md §3): in one multi-op guarded by the
    /// directory's version, deletes every zklock node left in it by earlier sessions and
    /// recreates the nodes of `contenders` in the given order (the caller puts holders first).
    /// A concurrent change to the directory makes it start over rather than misorder.
    ///
    /// Also reports whether a node not made by zklock was ever seen in the directory: the
    /// caller's continuity rule depends on it.
    pub async fn reanchor(&self, lock_path: &str, contenders: Vec<ContenderSpec>) -> Result<Reanchored, Error> {
        if !is_lock_path(lock_path) {
            return Err(Error::BadLockPath(lock_path.to_string()));
        }
        for c in &contenders {
            if !recipe::is_contender_id(&c.id) {
                return Err(Error::BadContenderId(c.id.to_string()));
            }
            if c.lock != lock_path {
                return Err(Error::BadLockPath(c.lock.clone()));
            }
        }
        let client = self.client()?;
        self.inner.watch_parent(&client, lock_path).await?;
        let (lock_arc, window) = self.inner.open_window(lock_path);
        let mut guard = WindowGuard { inner: &self.inner, lock: lock_arc.clone(), start: window, armed: true };
        let created = anchor::recreate(&client, &self.inner.shared, &self.inner.config, lock_path, &contenders).await?;
        // `register` closes the window from here on.
        guard.armed = false;
        let nodes = contenders.into_iter().zip(created.nodes).collect();
        if created.foreign_seen {
            self.inner.shared.foreign_marked.lock().insert(lock_path.to_string());
        }
        let registered = self.inner.register(&client, &lock_arc, window, nodes, true)?;
        let handles = Inner::settle(registered).await;
        Ok(Reanchored { contenders: handles.into_iter().flatten().collect(), foreign_seen: created.foreign_seen })
    }

    /// A handle on a contender the engine tracks.
    pub fn handle(&self, id: &str) -> Option<Contender> {
        let mut book = self.inner.shared.book.lock();
        let member = book.contenders.get_mut(id)?;
        Some(make_handle(&self.inner.shared, id, member))
    }

    /// Leaves the queue (or gives up the lock): deletes the node, retrying through connection
    /// loss until ZooKeeper confirms. The delete goes on even if the caller stops waiting.
    /// Returns false when the engine did not track `id` (already released or lost).
    pub async fn release(&self, id: &str) -> Result<bool, Error> {
        let shared = self.inner.shared.clone();
        // Out of the book first: the deletion event that follows is then nobody's loss.
        let taken = {
            let mut book = shared.book.lock();
            // A lost contender's node is gone already: forgetting the loss is its release.
            book.lost.remove(id);
            take(&mut book, id)
        };
        let Some((key, member)) = taken else { return Ok(false) };
        let client = self.inner.session.lock().clone().filter(|c| c.session_id().0 == member.session_id);
        let Some(client) = client else {
            // The node's session is over, and ephemeral nodes ended with it.
            shared.publish(&key, &member, &current_state(&member), ContenderState::Released);
            return Ok(true);
        };
        let path = member.path();
        let deleting = tokio::spawn(async move {
            match delete_until_confirmed(&client, &shared, &path).await {
                Ok(()) => {
                    shared.publish(&key, &member, &current_state(&member), ContenderState::Released);
                    // The last of our contenders in the lock left: its directory goes too, if
                    // empty, so that locks no longer used do not pile up. In the background: a
                    // release waits for nothing but its own node.
                    let idle = !shared.book.lock().locks.contains_key(&*member.lock);
                    if idle && !shared.foreign_marked.lock().contains(&*member.lock) {
                        shared.note_idle_directory(&client, &member.lock);
                    }
                    Ok(())
                }
                Err(e) => {
                    // The node is still there (ZooKeeper refused the delete): keep tracking it,
                    // so that its state stays true and the release can be tried again.
                    let mut book = shared.book.lock();
                    if !book.lost_sessions.contains(&member.session_id) && !book.contenders.contains_key(&key) {
                        let q = book.locks.entry(member.lock.clone()).or_default();
                        q.nodes.insert(member.sequence, key.clone());
                        book.contenders.insert(key, member);
                    }
                    Err(Error::zk("delete", &path, e))
                }
            }
        });
        match deleting.await {
            Ok(result) => result.map(|()| true),
            // The delete task does not panic; if the runtime is shutting down there is nothing
            // left to wait for.
            Err(join) => Err(Error::zk("delete", id, zk::Error::UnexpectedError(join.to_string()))),
        }
    }

    /// Asks the holder of `node` (a full path, ours or another client's) to let go, by writing a
    /// revocation request into its data. Our nodes keep their description; Curator's get its
    /// `__REVOKE__` marker.
    pub async fn request_revocation(&self, node: &str, reason: &str) -> Result<(), Error> {
        let client = self.client()?;
        loop {
            let (current, stat) =
                retry::idempotent(|| client.get_data(node)).await.map_err(|e| Error::zk("get", node, e))?;
            let wanted = data::with_revoke_request(&current, reason);
            match retry::idempotent(|| self.inner.shared.fence.set_data(&client, node, &wanted, stat.version)).await {
                Ok(_) => {
                    Stats::bump(&self.inner.shared.stats.revocations_written);
                    return Ok(());
                }
                // Somebody wrote in between (or our retried write landed): read and try again.
                Err(zk::Error::BadVersion) => continue,
                Err(e) => return Err(Error::zk("set", node, e)),
            }
        }
    }

    /// The children of any node (empty when it does not exist): for walking the lock tree.
    pub async fn children(&self, path: &str) -> Result<Vec<String>, Error> {
        let client = self.client()?;
        match retry::idempotent(|| client.list_children(path)).await {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(vec![]),
            Err(e) => Err(Error::zk("list", path, e)),
        }
    }

    /// Brings the `ahead` count of the first `limit` waiters of a lock up to date, with one read
    /// of the directory. Waiters are not woken when somebody far ahead of them leaves (that is
    /// the point of the recipe), so their count goes stale; this refreshes it in a bounded
    /// batch. Returns how many changed.
    pub async fn refresh_positions(&self, lock_path: &str, limit: usize) -> Result<usize, Error> {
        let client = self.client()?;
        let children = match retry::idempotent(|| client.list_children(lock_path)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(0),
            Err(e) => return Err(Error::zk("list", lock_path, e)),
        };
        let queue = recipe::queue(&children);
        let mut changed = 0;
        let shared = &self.inner.shared;
        let mut book = shared.book.lock();
        let ours = queue.iter().filter_map(|c| c.ours.map(|(id, _)| (id, c.name))).take(limit.saturating_add(1));
        for (id, name) in ours {
            let Some(member) = book.contenders.get_mut(id) else { continue };
            let Some(Decision::Waiting { watch, ahead }) = &member.decision else { continue };
            // Only the count: whom to watch is the event-driven part's business.
            if let Decision::Waiting { watch: fresh_watch, ahead: fresh } = recipe::decide_in(&queue, name) {
                if fresh_watch == *watch && fresh != *ahead {
                    let before = current_state(member);
                    member.decision = Some(Decision::Waiting { watch: fresh_watch, ahead: fresh });
                    shared.publish_current(id, member, &before);
                    changed += 1;
                }
            }
        }
        Ok(changed)
    }

    /// The contenders of a lock in queue order: `(node name, sequence, contender id if ours,
    /// mode)`. One getChildren; for tools and position reports, not for deciding.
    pub async fn queue(&self, lock_path: &str) -> Result<Vec<QueueEntry>, Error> {
        let client = self.client()?;
        let children = match retry::idempotent(|| client.list_children(lock_path)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => vec![],
            Err(e) => return Err(Error::zk("list", lock_path, e)),
        };
        Ok(recipe::queue(&children)
            .into_iter()
            .map(|c| QueueEntry {
                node: c.name.to_string(),
                sequence: c.sequence,
                id: c.ours.map(|(id, _)| id.to_string()),
                mode: c.mode(),
            })
            .collect())
    }
}

/// Closes a create's window when the create fails or its caller gives up on it (drops the
/// future) before the nodes are registered; otherwise the lock would record events forever.
struct WindowGuard<'a> {
    inner: &'a Inner,
    lock: Arc<str>,
    start: u64,
    armed: bool,
}

impl Drop for WindowGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.inner.close_window(&self.lock, self.start);
        }
    }
}

fn make_handle(shared: &Arc<Shared>, id: &str, member: &mut Member) -> Contender {
    let published = current_state(member);
    let node = member.path();
    let tx = member.watchers.get_or_insert_with(|| watch::channel(published).0);
    Contender { id: id.to_string(), node, states: tx.subscribe(), shared: Arc::downgrade(shared) }
}

/// Nodes just made, registered but not yet decided: (id, told when decided, handle).
type Registered = Vec<(Arc<str>, Option<oneshot::Receiver<()>>, Option<Contender>)>;

impl Inner {
    fn client(&self) -> Result<zk::Client, Error> {
        self.session.lock().clone().ok_or(Error::SessionLost)
    }

    /// Makes sure the parent of `lock_path` is watched recursively by this session before a
    /// node is made in it: from then on, every deletion and data change in the lock directory
    /// reaches the dispatcher.
    async fn watch_parent(self: &Arc<Self>, client: &zk::Client, lock_path: &str) -> Result<(), Error> {
        let parent = parent_of(lock_path);
        let session_id = client.session_id().0;
        let cell = self.parents.lock().entry((parent.to_string(), session_id)).or_default().clone();
        cell.get_or_try_init(|| async {
            let watcher = retry::idempotent(|| client.watch(parent, zk::AddWatchMode::PersistentRecursive))
                .await
                .map_err(|e| Error::zk("addWatch", parent, e))?;
            tokio::spawn(dispatch(Arc::downgrade(self), watcher, session_id, parent.to_string()));
            Ok::<(), Error>(())
        })
        .await?;
        Ok(())
    }

    fn open_window(&self, lock_path: &str) -> (Arc<str>, u64) {
        let mut book = self.shared.book.lock();
        let key = match book.locks.get_key_value(lock_path) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Arc<str> = lock_path.into();
                book.locks.insert(k.clone(), LockQueue::default());
                k
            }
        };
        let window = book.locks.get_mut(&key).map_or(0, LockQueue::open);
        (key, window)
    }

    fn close_window(&self, lock_path: &str, window: u64) {
        let mut book = self.shared.book.lock();
        if let Some(q) = book.locks.get_mut(lock_path) {
            q.close(window);
        }
        drop_if_idle(&mut book, lock_path);
    }

    /// Enters freshly made nodes in the book, asks for their first decision and closes the
    /// create's window. A node whose contender id is tracked already (a concurrent enqueue of
    /// the same id won) is deleted again.
    fn register(
        self: &Arc<Self>,
        client: &zk::Client,
        lock_path: &Arc<str>,
        window: u64,
        nodes: Vec<(ContenderSpec, String)>,
        want_handles: bool,
    ) -> Result<Registered, Error> {
        let shared = &self.shared;
        let session_id = client.session_id().0;
        let mut registered = Vec::with_capacity(nodes.len());
        let mut extra = vec![];
        let mut data_changed = vec![];
        let start = {
            let mut book = shared.book.lock();
            if book.lost_sessions.contains(&session_id) {
                // The session ended while the nodes were being made: they go with it, and
                // nobody would ever decide for them.
                if let Some(q) = book.locks.get_mut(&**lock_path) {
                    q.close(window);
                }
                drop_if_idle(&mut book, lock_path);
                return Err(Error::SessionLost);
            }
            for (spec, name) in nodes {
                if book.contenders.contains_key(&*spec.id) {
                    extra.push(format!("{lock_path}/{name}"));
                    let handle = if want_handles {
                        book.contenders.get_mut(&*spec.id).map(|m| make_handle(shared, &spec.id, m))
                    } else {
                        None
                    };
                    registered.push((spec.id.clone(), None, handle));
                    continue;
                }
                let id = spec.id.clone();
                // Back (re-anchored): no longer lost.
                book.lost.remove(&*id);
                let sequence = recipe::parse_child(&name).map_or(0, |c| c.sequence);
                let (tx, rx) = oneshot::channel();
                let mut member = Member {
                    lock: lock_path.clone(),
                    name: name.into_boxed_str(),
                    sequence,
                    session_id,
                    fencing_token: 0,
                    decision: None,
                    revoke: None,
                    stale: true,
                    reads_before: book.locks.get(lock_path).map_or(0, |q| q.reads),
                    watchers: None,
                    decided: Some(tx),
                };
                let handle = want_handles.then(|| make_handle(shared, &id, &mut member));
                if let Some(q) = book.locks.get_mut(lock_path) {
                    q.nodes.insert(sequence, id.clone());
                    if q.seen_since(window, &member.name, NodeEvent::DataChanged) {
                        data_changed.push((id.clone(), member.path()));
                    }
                }
                book.contenders.insert(id.clone(), Box::new(member));
                registered.push((id, Some(rx), handle));
            }
            let q = book.locks.get_mut(lock_path);
            let start = q.map(|q| {
                let start = q.request_evaluation();
                q.close(window);
                start
            });
            start.unwrap_or(false)
        };
        if start {
            tokio::spawn(evaluate(Arc::downgrade(self), lock_path.clone()));
        }
        for (id, path) in data_changed {
            tokio::spawn(read_revocation(Arc::downgrade(self), id, path));
        }
        if !extra.is_empty() {
            let client = client.clone();
            let shared = shared.clone();
            tokio::spawn(async move {
                for path in extra {
                    let _ = delete_until_confirmed(&client, &shared, &path).await;
                }
            });
        }
        Ok(registered)
    }

    /// Waits until every registered node has had its first decision.
    async fn settle(registered: Registered) -> Vec<Option<Contender>> {
        let mut handles = Vec::with_capacity(registered.len());
        for (_, decided, handle) in registered {
            if let Some(decided) = decided {
                // Dropped unanswered when the contender ended first: its state says how.
                let _ = decided.await;
            }
            handles.push(handle);
        }
        handles
    }

    /// Every contender of `session_id` is lost: its nodes went with the session.
    fn lose_session(&self, session_id: i64) {
        {
            let mut session = self.session.lock();
            if session.as_ref().is_some_and(|c| c.session_id().0 == session_id) {
                *session = None;
            }
        }
        self.parents.lock().retain(|(_, sid), _| *sid != session_id);
        {
            let mut book = self.shared.book.lock();
            book.lost_sessions.insert(session_id);
            let ids: Vec<Arc<str>> =
                book.contenders.iter().filter(|(_, m)| m.session_id == session_id).map(|(id, _)| id.clone()).collect();
            for id in ids {
                self.shared.remove(&mut book, &id, ContenderState::Lost { why: LostReason::SessionExpired });
            }
        }
        self.shared.emit(EngineEvent::Session(SessionEvent::Lost { session_id }));
    }

    /// The connection dropped. Whether the session survives is unknown until it comes back, and
    /// the server may expire it before this client can tell (it only gives up after 7/5 of the
    /// session timeout). In a lock that clients other than zklock use, one of them could then be
    /// granted the lock while our holder still reads Held. So, choosing safety over an
    /// uninterrupted hold, holders there are asked to let go at once, as if revoked; in
    /// zklock-only locks nobody else can be granted, and holders keep the lock.
    fn suspend_shared_holds(&self, session_id: i64) {
        let shared = &self.shared;
        let marked = shared.foreign_marked.lock().clone();
        let mut book = shared.book.lock();
        for (id, member) in book.contenders.iter_mut() {
            let held = matches!(member.decision, Some(Decision::Held));
            if member.session_id == session_id && held && member.revoke.is_none() && marked.contains(&*member.lock) {
                let before = current_state(member);
                member.revoke = Some(CONNECTION_LOST.to_string());
                shared.publish_current(id, member, &before);
            }
        }
    }

    /// A node event from the recursive watch of session `session_id`.
    fn on_node_event(self: &Arc<Self>, session_id: i64, path: &str, event: NodeEvent) {
        let Some((dir, name)) = path.rsplit_once('/') else { return };
        let shared = &self.shared;
        let mut evaluate_lock = None;
        let mut read_data = None;
        {
            let mut book = shared.book.lock();
            let Book { contenders, locks, .. } = &mut *book;
            let Some(lock_key) = locks.get_key_value(dir).map(|(k, _)| k.clone()) else { return };
            let Some(q) = locks.get_mut(dir) else { return };
            q.record(name, event);
            let own = recipe::parse_child(name)
                .and_then(|c| q.nodes.get(&c.sequence))
                .filter(|id| contenders.get(&***id).is_some_and(|m| *m.name == *name && m.session_id == session_id))
                .cloned();
            match event {
                NodeEvent::DataChanged => {
                    if let Some(id) = own {
                        Stats::bump(&shared.stats.own_node_notifications);
                        read_data = Some((id, path.to_string()));
                    }
                }
                NodeEvent::Deleted => {
                    let mut woke = false;
                    for id in q.nodes.values() {
                        if let Some(m) = contenders.get_mut(id) {
                            if m.session_id == session_id && m.watching() == Some(name) {
                                m.stale = true;
                                woke = true;
                            }
                        }
                    }
                    if woke {
                        Stats::bump(&shared.stats.predecessor_notifications);
                        if q.request_evaluation() {
                            evaluate_lock = Some(lock_key.clone());
                        }
                    }
                    if let Some(id) = own {
                        Stats::bump(&shared.stats.own_node_notifications);
                        shared.remove(&mut book, &id, ContenderState::Lost { why: LostReason::DeletedByOther });
                    }
                }
            }
        }
        if let Some(lock_path) = evaluate_lock {
            tokio::spawn(evaluate(Arc::downgrade(self), lock_path));
        }
        if let Some((id, path)) = read_data {
            tokio::spawn(read_revocation(Arc::downgrade(self), id, path));
        }
    }

    /// After a reconnection, events may have been lost: every lock under `parent` with
    /// contenders of this session is read again in full.
    fn resync(self: &Arc<Self>, session_id: i64, parent: &str) {
        let prefix = format!("{}/", parent.trim_end_matches('/'));
        let mut start = vec![];
        {
            let mut book = self.shared.book.lock();
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
            tokio::spawn(evaluate(Arc::downgrade(self), lock_path));
        }
    }
}

/// Follows one recursive watch: node deletions and data changes in every lock directory below
/// `parent`, and the session's comings and goings.
async fn dispatch(inner_weak: Weak<Inner>, mut watcher: zk::PersistentWatcher, session_id: i64, parent: String) {
    loop {
        let event = watcher.changed().await;
        let Some(inner) = inner_weak.upgrade() else { return };
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
                    let client = inner.client().ok().filter(|c| c.session_id().0 == session_id);
                    drop(inner);
                    if let Some(client) = client {
                        match retry::idempotent(|| client.watch(&parent, zk::AddWatchMode::PersistentRecursive)).await {
                            Ok(renewed) => watcher = renewed,
                            // The session ended meanwhile: its monitor says so.
                            Err(e) => {
                                tracing::warn!(parent = %parent, error = %e, "could not watch again after a reconnection")
                            }
                        }
                    }
                    let Some(inner) = inner_weak.upgrade() else { return };
                    inner.resync(session_id, &parent)
                }
                _ => {}
            },
            zk::EventType::NodeDeleted => inner.on_node_event(session_id, &event.path, NodeEvent::Deleted),
            zk::EventType::NodeDataChanged => inner.on_node_event(session_id, &event.path, NodeEvent::DataChanged),
            _ => {}
        }
    }
}

/// Removes the lock directories that stayed idle for the grace period, until none is left to
/// watch. Directories used again meanwhile are skipped (and forgotten).
async fn sweep_idle_directories(shared: Weak<Shared>, client: zk::Client) {
    loop {
        let Some(grace) = shared.upgrade().map(|s| s.idle_directory_grace) else { return };
        tokio::time::sleep(grace.max(std::time::Duration::from_millis(10)).min(std::time::Duration::from_secs(10)))
            .await;
        let Some(shared) = shared.upgrade() else { return };
        let due: Vec<Arc<str>> = {
            let mut idle = shared.idle_directories.lock();
            let book = shared.book.lock();
            idle.retain(|dir, _| !book.locks.contains_key(dir));
            let due = idle.iter().filter(|(_, since)| since.elapsed() >= grace).map(|(dir, _)| dir.clone()).collect();
            due
        };
        for dir in due {
            // Used again since it was due: its next idle time counts afresh.
            if shared.book.lock().locks.contains_key(&dir) {
                shared.idle_directories.lock().remove(&dir);
                continue;
            }
            anchor::remove_if_empty(&client, &shared, &dir).await;
            shared.idle_directories.lock().remove(&dir);
        }
        // Decided under the lock `note_idle_directory` takes: a directory noted after this
        // finds the map empty and starts a new sweeper.
        if shared.idle_directories.lock().is_empty() {
            return;
        }
    }
}

/// Reads a contender's node for a revocation request (after its data changed).
async fn read_revocation(inner: Weak<Inner>, id: Arc<str>, path: String) {
    let Some(client) = inner.upgrade().and_then(|i| i.client().ok()) else { return };
    let body = match retry::idempotent(|| client.get_data(&path)).await {
        Ok((body, _)) => body,
        // Gone: the deletion event says so. Session over: its monitor says so.
        Err(_) => return,
    };
    let Some(inner) = inner.upgrade() else { return };
    note_revocation(&inner.shared, &mut inner.shared.book.lock(), &id, &path, &body);
}

/// Records the revocation request in a contender's node data, if its node is still `path`.
fn note_revocation(shared: &Shared, book: &mut Book, id: &str, path: &str, body: &[u8]) {
    if let Some(member) = book.contenders.get_mut(id).filter(|m| m.path() == path) {
        if member.revoke.is_none() {
            let before = current_state(member);
            member.revoke = data::revoke_request(body);
            shared.publish_current(id, member, &before);
        }
    }
}

/// The revocation reason given to holders in foreign-shared locks when the connection drops.
pub const CONNECTION_LOST: &str =
    "the ZooKeeper connection dropped and this lock is shared with clients other than zklock, which may be granted it if the session expires";

/// How long an evaluation waits before going round again after its session ended.
const SESSION_END_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Reads a lock directory and decides for the contenders that need it, until no new reason to
/// read again came up meanwhile. One task per lock at a time.
async fn evaluate(inner: Weak<Inner>, lock_path: Arc<str>) {
    loop {
        let Some(engine) = inner.upgrade() else { return };
        let shared = engine.shared.clone();
        let client = match engine.client() {
            Ok(client) => client,
            // No session: whoever makes nodes in a new one asks for an evaluation again.
            Err(_) => {
                let mut book = shared.book.lock();
                if let Some(q) = book.locks.get_mut(&*lock_path) {
                    q.evaluating = false;
                }
                drop_if_idle(&mut book, &lock_path);
                return;
            }
        };
        let session_id = client.session_id().0;
        drop(engine);
        let (window, full, number) = {
            let mut book = shared.book.lock();
            let Some(q) = book.locks.get_mut(&lock_path) else { return };
            q.dirty = false;
            q.reads += 1;
            (q.open(), std::mem::take(&mut q.full), q.reads)
        };
        let (children, pzxid) = match read_and_repair(&client, &shared, &lock_path).await {
            Ok(Some(read)) => read,
            // A repair changed the directory: read it again.
            Ok(None) => {
                let mut book = shared.book.lock();
                if let Some(q) = book.locks.get_mut(&*lock_path) {
                    q.close(window);
                }
                continue;
            }
            Err(e) => {
                // After a session end, give its monitor the time to swap the session.
                let pause = retry::is_session_end(&e);
                if fail_lock(&shared, &client, &lock_path, window, e) {
                    if pause {
                        tokio::time::sleep(SESSION_END_PAUSE).await;
                    }
                    continue;
                }
                return;
            }
        };
        if full {
            refresh_revocations(&client, &shared, &lock_path, session_id).await;
        }
        let current = inner.upgrade().and_then(|i| i.client().ok()).map(|c| c.session_id().0);
        let read = Read { window, number, session_id, current, pzxid, full };
        if !apply(&shared, &lock_path, read, &children) {
            return;
        }
    }
}

/// Reads the directory's children and pzxid, then makes the repairs that need ZooKeeper (see
/// `repair`); `None` when a repair changed the directory.
async fn read_and_repair(
    client: &zk::Client,
    shared: &Shared,
    lock_path: &str,
) -> Result<Option<(Vec<String>, i64)>, zk::Error> {
    Stats::bump(&shared.stats.children_reads);
    let (children, pzxid) = match retry::idempotent(|| client.get_children(lock_path)).await {
        Ok((children, stat)) => (children, stat.pzxid),
        // No directory, no nodes: every contender in it is gone.
        Err(zk::Error::NoNode) => (vec![], 0),
        Err(e) => return Err(e),
    };
    let repaired = repair(client, shared, lock_path, client.session_id().0, &children).await?;
    Ok((!repaired).then_some((children, pzxid)))
}

/// Forgets a lock nobody needs any more.
fn drop_if_idle(book: &mut Book, lock_path: &str) {
    if book.locks.get(lock_path).is_some_and(LockQueue::is_idle) {
        book.locks.remove(lock_path);
    }
}

/// Ends an evaluation round unless another was asked for meanwhile; true to go round again.
/// Decided under the same lock that `request_evaluation` takes, so no request is lost.
fn finish_round(book: &mut Book, lock_path: &str) -> bool {
    let Some(q) = book.locks.get_mut(lock_path) else { return false };
    if q.dirty {
        return true;
    }
    q.evaluating = false;
    drop_if_idle(book, lock_path);
    false
}

/// A read or a repair failed. A session end is its monitor's business: go round again (the
/// next round takes the new session, if any). Any other failure leaves the contenders waiting
/// for a decision without one: they are lost, and their nodes are deleted so that they do not
/// block the queue. Returns true to go round again.
fn fail_lock(shared: &Arc<Shared>, client: &zk::Client, lock_path: &str, window: u64, e: zk::Error) -> bool {
    let session_id = client.session_id().0;
    let mut book = shared.book.lock();
    if let Some(q) = book.locks.get_mut(lock_path) {
        q.close(window);
    }
    if retry::is_session_end(&e) {
        if let Some(q) = book.locks.get_mut(lock_path) {
            q.dirty = true;
        }
        return finish_round(&mut book, lock_path);
    }
    tracing::warn!(lock = %lock_path, error = %e, "cannot read the lock directory");
    let stale: Vec<Arc<str>> = book
        .locks
        .get(lock_path)
        .map(|q| q.nodes.values().cloned().collect::<Vec<Arc<str>>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|id| book.contenders.get(id).is_some_and(|m| m.stale && m.session_id == session_id))
        .collect();
    let mut orphans = vec![];
    for id in stale {
        let lost = LostReason::Failed(e.to_string());
        if let Some(member) = shared.remove(&mut book, &id, ContenderState::Lost { why: lost }) {
            orphans.push(member.path());
        }
    }
    let again = finish_round(&mut book, lock_path);
    drop(book);
    if !orphans.is_empty() {
        let (client, shared) = (client.clone(), shared.clone());
        tokio::spawn(async move {
            for path in orphans {
                let _ = delete_until_confirmed(&client, &shared, &path).await;
            }
        });
    }
    again
}

/// One read of a lock directory, as `apply` needs to know it.
struct Read {
    /// The window opened before the read was sent.
    window: u64,
    /// Its number among the directory's reads.
    number: u64,
    session_id: i64,
    /// The engine's session when the answer is applied.
    current: Option<i64>,
    /// The directory's pzxid in the answer.
    pzxid: i64,
    /// Decide for every contender, not only the stale ones.
    full: bool,
}

/// Applies one read of the directory; returns true when it must be read again.
fn apply(shared: &Shared, lock_path: &str, read: Read, children: &[String]) -> bool {
    let Read { window, number, session_id, current, pzxid, full } = read;
    let queue = recipe::queue(children);
    let mut book = shared.book.lock();
    let Book { contenders, locks, .. } = &mut *book;
    let Some(q) = locks.get_mut(lock_path) else { return false };
    let mut missing = vec![];
    for id in q.nodes.values() {
        let Some(member) = contenders.get_mut(id) else { continue };
        if !(member.stale || full) {
            continue;
        }
        if member.session_id != session_id {
            // Made in a newer session than this read: the next round, on that session, decides.
            // (Members of an older one go with it.)
            if Some(member.session_id) == current {
                q.dirty = true;
            }
            continue;
        }
        if member.reads_before >= number {
            // Sent before the node was made: the next read (already asked for) decides.
            q.dirty = true;
            continue;
        }
        let before = current_state(member);
        let decision = recipe::decide_in(&queue, &member.name);
        match &decision {
            Decision::Missing => {
                missing.push(id.clone());
                continue;
            }
            Decision::Held if member.fencing_token == 0 => {
                // The fencing token is the zxid of the directory state in which the grant was
                // decided: it is above the zxid that removed the previous holder, so tokens of
                // successive holders strictly increase. (The node's czxid alone is not enough:
                // nodes re-created together by one multi-op share one czxid.) This read was
                // sent after the node was made (`reads_before`), so the pzxid it answers is at
                // least the node's czxid; granted at once, the two are equal.
                member.fencing_token = pzxid;
            }
            _ => {}
        }
        // The node to watch went away after the read was answered, before this task got
        // here: the dispatcher could not know we would watch it. Read again.
        let gone =
            matches!(&decision, Decision::Waiting { watch, .. } if q.seen_since(window, watch, NodeEvent::Deleted));
        member.stale = gone;
        if gone {
            q.dirty = true;
        }
        // A decision never goes back from Held: only the node's deletion ends a hold.
        if member.decision != Some(Decision::Held) {
            member.decision = Some(decision);
        }
        shared.publish_current(id, member, &before);
        if let Some(decided) = member.decided.take() {
            let _ = decided.send(());
        }
    }
    q.close(window);
    for id in missing {
        shared.remove(&mut book, &id, ContenderState::Lost { why: LostReason::DeletedByOther });
    }
    finish_round(&mut book, lock_path)
}

/// Before deciding: deletes second nodes carrying the id of one of our contenders, and marks
/// the directory when a client other than zklock uses it. Returns true when it deleted a node
/// (the directory must be read again).
async fn repair(
    client: &zk::Client,
    shared: &Shared,
    lock_path: &str,
    session_id: i64,
    children: &[String],
) -> Result<bool, zk::Error> {
    let queue = recipe::queue(children);
    let base = recipe::wrap_base(queue.iter().map(|c| c.sequence));
    // (duplicate's path, its sequence, our contender's sequence)
    let duplicates: Vec<(String, u64, u64)> = {
        let book = shared.book.lock();
        queue
            .iter()
            .filter_map(|c| {
                let (id, _) = c.ours?;
                let member = book.contenders.get(id)?;
                (member.session_id == session_id && *member.name != *c.name && *member.lock == *lock_path)
                    .then(|| (format!("{lock_path}/{}", c.name), c.sequence, member.sequence))
            })
            .collect()
    };
    // A second node with our id. Ours wins over one of our own session (a create retried
    // after a lost answer) and over an older one (left by an earlier session). A newer node of
    // another session is a newer incarnation of this contender (re-anchored by a new leader):
    // that one wins, and ours will be deleted by it.
    let mut deleted = false;
    for (path, sequence, mine) in duplicates {
        let owner = match retry::idempotent(|| client.check_stat(&path)).await? {
            Some(stat) => stat.ephemeral_owner,
            None => continue,
        };
        if owner != session_id && recipe::queue_key(sequence, base) > recipe::queue_key(mine, base) {
            continue;
        }
        tracing::warn!(node = %path, "deleting a second node of one contender");
        match retry::idempotent(|| shared.fence.delete(client, &path)).await {
            Ok(()) => Stats::bump(&shared.stats.duplicates_deleted),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(e),
        }
        deleted = true;
    }
    if !deleted && queue.iter().any(|c| c.ours.is_none()) && !shared.foreign_marked.lock().contains(lock_path) {
        // After a session gap, holders in this directory cannot be assumed to have kept the lock.
        anchor::mark_foreign(client, lock_path).await?;
        shared.foreign_marked.lock().insert(lock_path.to_string());
    }
    Ok(deleted)
}

/// Reads every contender's node in the lock for revocation requests (after a reconnection).
async fn refresh_revocations(client: &zk::Client, shared: &Shared, lock_path: &str, session_id: i64) {
    let paths: Vec<(Arc<str>, String)> = {
        let book = shared.book.lock();
        let Some(q) = book.locks.get(lock_path) else { return };
        q.nodes
            .values()
            .filter_map(|id| {
                book.contenders.get(id).filter(|m| m.session_id == session_id).map(|m| (id.clone(), m.path()))
            })
            .collect()
    };
    let reads = paths.iter().map(|(_, path)| retry::idempotent(move || client.get_data(path)));
    let bodies = futures::future::join_all(reads).await;
    let mut book = shared.book.lock();
    for ((id, path), body) in paths.iter().zip(bodies) {
        if let Ok((body, _)) = body {
            note_revocation(shared, &mut book, id, path, &body);
        }
    }
}

async fn monitor_session(inner: Weak<Inner>, mut states: zk::StateWatcher, session_id: i64) {
    loop {
        let state = states.changed().await;
        let Some(inner) = inner.upgrade() else { return };
        match state {
            zk::SessionState::Disconnected => {
                inner.suspend_shared_holds(session_id);
                inner.shared.emit(EngineEvent::Session(SessionEvent::Disconnected))
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                inner.shared.emit(EngineEvent::Session(SessionEvent::Reconnected))
            }
            // Expired, closed or refused: the session is over. (The client reports Expired by
            // itself when it cannot reconnect within 7/5 of the session timeout.)
            _ => {
                tracing::warn!(session = format_args!("{session_id:#x}"), ?state, "ZooKeeper session ended");
                inner.lose_session(session_id);
                return;
            }
        }
    }
}

/// What [`LockEngine::reanchor`] did.
#[derive(Debug)]
pub struct Reanchored {
    /// The recreated contenders, in the order given.
    pub contenders: Vec<Contender>,
    /// A node not made by zklock was seen in the directory, now or ever before.
    pub foreign_seen: bool,
}

/// One contender in a lock's queue, as [`LockEngine::queue`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueEntry {
    pub node: String,
    pub sequence: u64,
    pub id: Option<String>,
    pub mode: Mode,
}

fn is_lock_path(path: &str) -> bool {
    path.len() > 1 && path.starts_with('/') && !path.ends_with('/') && !path.split('/').skip(1).any(str::is_empty)
}

/// Creates the contender's node; after a lost answer, looks for the node by contender id before
/// trying again, so that one contender never gets two nodes.
async fn create_node(
    client: &zk::Client,
    shared: &Shared,
    config: &ZkConfig,
    spec: &ContenderSpec,
) -> Result<String, Error> {
    let prefix = recipe::node_prefix(&spec.id, spec.mode);
    let path = format!("{}/{prefix}", spec.lock);
    let body = NodeData::new(&spec.id, spec.mode, &spec.description).to_bytes();
    let acls = config.node_acls();
    let options = zk::CreateMode::EphemeralSequential.with_acls(acls);
    // Lock directories stay open to everybody for create, so that Curator clients can contend.
    let dir_options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut backoff = Backoff::new();
    loop {
        match shared.fence.create(client, &path, &body, &options).await {
            Ok(created) => {
                Stats::bump(&shared.stats.creates);
                return Ok(node_name(&created).to_string());
            }
            Err(zk::Error::NoNode) => {
                retry::idempotent(|| client.mkdir(&spec.lock, &dir_options))
                    .await
                    .map_err(|e| Error::zk("mkdir", &spec.lock, e))?;
            }
            Err(e) if retry::is_unknown_outcome(&e) => {
                Stats::bump(&shared.stats.create_unknown_outcomes);
                if let Some(found) = find_own_node(client, spec).await? {
                    Stats::bump(&shared.stats.nodes_adopted);
                    return Ok(found);
                }
                backoff.wait().await;
            }
            Err(e) => return Err(Error::zk("create", &path, e)),
        }
    }
}

/// The node of contender `spec.id` made by this session, if there is one.
async fn find_own_node(client: &zk::Client, spec: &ContenderSpec) -> Result<Option<String>, Error> {
    let children = match retry::idempotent(|| client.list_children(&spec.lock)).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(Error::zk("list", &spec.lock, e)),
    };
    let Some(name) = recipe::find_node(&children, &spec.id) else { return Ok(None) };
    let path = format!("{}/{name}", spec.lock);
    match retry::idempotent(|| client.check_stat(&path)).await {
        Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => Ok(Some(name.to_string())),
        Ok(_) => Ok(None),
        Err(e) => Err(Error::zk("stat", &path, e)),
    }
}

/// The last component of a node's path.
pub(super) fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

pub(super) async fn stat_of(client: &zk::Client, path: &str) -> Result<zk::Stat, Error> {
    match retry::idempotent(|| client.check_stat(path)).await {
        Ok(Some(stat)) => Ok(stat),
        Ok(None) => Err(Error::zk("stat", path, zk::Error::NoNode)),
        Err(e) => Err(Error::zk("stat", path, e)),
    }
}

/// Deletes `path` until ZooKeeper confirms it is gone. The end of the session confirms it too:
/// ephemeral nodes go with their session.
async fn delete_until_confirmed(client: &zk::Client, shared: &Shared, path: &str) -> Result<(), zk::Error> {
    match retry::idempotent(|| shared.fence.delete(client, path)).await {
        Ok(()) => {
            Stats::bump(&shared.stats.deletes);
            Ok(())
        }
        Err(zk::Error::NoNode) => Ok(()),
        Err(e) if retry::is_session_end(&e) => Ok(()),
        Err(e) => Err(e),
    }
}
