//! One ZooKeeper session, many contenders (one per claim UID).
//!
//! Each contender is an EPHEMERAL_SEQUENTIAL node in its lock directory and a small task that
//! follows the recipe: read the children, decide (see [`crate::recipe`]), and if it has to wait,
//! put a one-shot watch on the single node the recipe names — never a children watch on the
//! directory, so a release wakes one waiter. A second one-shot watch on the contender's own node
//! catches revocation requests and deletion by someone else.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use zookeeper_client as zk;

use super::anchor;
use super::data::{self, NodeData};
use super::retry::{self, Backoff};
use super::stats::{Stats, StatsSnapshot};
use super::{Error, ZkConfig};
use crate::recipe::{self, Decision, Mode};

/// Who wants which lock, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContenderSpec {
    /// Unique per contender and part of its node name (a claim UID): it lets the engine find
    /// the node it made when a create's answer was lost.
    pub id: String,
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

/// A contender's handle: its node and its stream of states.
#[derive(Clone, Debug)]
pub struct Contender {
    pub id: String,
    /// Full path of the contender's node.
    pub node: String,
    states: watch::Receiver<ContenderState>,
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

    /// Waits until the state satisfies `f` (checked at once, then on every change).
    pub async fn wait_for(&mut self, mut f: impl FnMut(&ContenderState) -> bool) -> Option<ContenderState> {
        self.states.wait_for(|s| f(s)).await.ok().map(|s| s.clone())
    }
}

/// The lock engine. Cheap to clone; dropping the last clone aborts every contender and closes
/// the session (ZooKeeper then deletes the ephemeral nodes).
#[derive(Clone)]
pub struct LockEngine {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZkConfig,
    shared: Arc<Shared>,
    session: Mutex<Option<zk::Client>>,
}

/// What contender tasks need from the engine, without keeping the engine (and so its session)
/// alive.
pub(super) struct Shared {
    pub(super) stats: Stats,
    events: Option<mpsc::UnboundedSender<EngineEvent>>,
    contenders: Mutex<HashMap<String, Entry>>,
    /// Lock directories this engine has already marked as used by foreign clients.
    foreign_marked: Mutex<HashSet<String>>,
}

impl Shared {
    fn emit(&self, event: EngineEvent) {
        if let Some(events) = &self.events {
            // A consumer that went away does not stop the engine.
            let _ = events.send(event);
        }
    }

    fn publish(&self, id: &str, states: &watch::Sender<ContenderState>, state: ContenderState) {
        let changed = states.send_if_modified(|current| {
            if *current == state {
                false
            } else {
                *current = state.clone();
                true
            }
        });
        if changed {
            self.emit(EngineEvent::Contender { id: id.to_string(), state });
        }
    }

    /// Stops tracking contender `id` if its entry is still the one for `node`.
    fn forget(&self, id: &str, node: &str) {
        let mut contenders = lock(&self.contenders);
        if contenders.get(id).is_some_and(|e| e.node == node) {
            contenders.remove(id);
        }
    }
}

struct Entry {
    node: String,
    session_id: i64,
    states: Arc<watch::Sender<ContenderState>>,
    task: AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for entry in lock(&self.shared.contenders).values() {
            entry.task.abort();
        }
    }
}

/// Poisoning would only follow a panic inside one of the short critical sections below, none
/// of which can panic; recovering the guard keeps the engine usable regardless.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
        let engine = LockEngine {
            inner: Arc::new(Inner {
                config,
                shared: Arc::new(Shared {
                    stats: Stats::default(),
                    events,
                    contenders: Mutex::new(HashMap::new()),
                    foreign_marked: Mutex::new(HashSet::new()),
                }),
                session: Mutex::new(None),
            }),
        };
        engine.reconnect().await?;
        Ok(engine)
    }

    /// Opens a new session after the previous one was lost (or replaces a live one, whose
    /// contenders are then lost). Contenders must be enqueued again.
    pub async fn reconnect(&self) -> Result<(), Error> {
        let client = self.inner.config.connect().await?;
        let session_id = client.session_id().0;
        let states = client.state_watcher();
        let old = lock(&self.inner.session).replace(client);
        if let Some(old) = old {
            self.inner.lose_session(old.session_id().0);
        }
        tokio::spawn(monitor_session(Arc::downgrade(&self.inner), states, session_id));
        self.inner.shared.emit(EngineEvent::Session(SessionEvent::Connected { session_id }));
        Ok(())
    }

    fn client(&self) -> Result<zk::Client, Error> {
        lock(&self.inner.session).clone().ok_or(Error::SessionLost)
    }

    /// The current session's id, if there is one.
    pub fn session_id(&self) -> Option<i64> {
        lock(&self.inner.session).as_ref().map(|c| c.session_id().0)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.inner.shared.stats.snapshot()
    }

    /// The config the engine was made with.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The state of contender `id`, if the engine tracks it.
    pub fn state(&self, id: &str) -> Option<ContenderState> {
        lock(&self.inner.shared.contenders).get(id).map(|e| e.states.borrow().clone())
    }

    /// Puts a contender in the queue of its lock: creates its node (and the lock directory if
    /// needed), decides once, and from then on follows the recipe in the background. Enqueueing
    /// an id the engine already tracks returns the existing contender.
    pub async fn enqueue(&self, spec: ContenderSpec) -> Result<Contender, Error> {
        if !recipe::is_contender_id(&spec.id) {
            return Err(Error::BadContenderId(spec.id));
        }
        if !is_lock_path(&spec.lock) {
            return Err(Error::BadLockPath(spec.lock));
        }
        if let Some(existing) = self.handle(&spec.id) {
            return Ok(existing);
        }
        let client = self.client()?;
        let (name, stat) = create_node(&client, &self.inner.shared, &self.inner.config, &spec).await?;
        self.track(client, spec, name, stat).await
    }

    /// Starts following the recipe for a node that exists: arms its watches, decides once,
    /// and registers the contender.
    async fn track(
        &self,
        client: zk::Client,
        spec: ContenderSpec,
        name: String,
        stat: zk::Stat,
    ) -> Result<Contender, Error> {
        let shared = &self.inner.shared;
        let mut tracker = Tracker {
            shared: shared.clone(),
            path: format!("{}/{name}", spec.lock),
            name,
            fencing_token: 0,
            created_zxid: stat.czxid,
            spec,
            client,
            // Replaced by the first decision before anybody can see it.
            states: Arc::new(watch::channel(ContenderState::Released).0),
            decision: Decision::Missing,
            revoke: None,
        };
        let own = match tracker.start().await {
            Ok(own) => own,
            Err(e) => {
                // The node must not outlive a contender nobody tracks.
                let _ = delete_until_confirmed(&tracker.client, shared, &tracker.path).await;
                return Err(Error::zk("enqueue", &tracker.path, e));
            }
        };
        tracker.publish_current();
        let handle =
            Contender { id: tracker.spec.id.clone(), node: tracker.path.clone(), states: tracker.states.subscribe() };
        let node = tracker.path.clone();
        let client = tracker.client.clone();
        // Spawned under the lock, so that a contender that ends at once cannot try to forget its
        // entry before the entry is there.
        let existing = {
            let mut contenders = lock(&shared.contenders);
            match contenders.get(&handle.id) {
                Some(first) => Some(Contender {
                    id: handle.id.clone(),
                    node: first.node.clone(),
                    states: first.states.subscribe(),
                }),
                None => {
                    let entry = Entry {
                        node: node.clone(),
                        session_id: client.session_id().0,
                        states: tracker.states.clone(),
                        task: tokio::spawn(tracker.run(own)).abort_handle(),
                    };
                    contenders.insert(handle.id.clone(), entry);
                    None
                }
            }
        };
        match existing {
            None => Ok(handle),
            // A concurrent enqueue of the same id won the race: keep its node, drop ours.
            Some(existing) => {
                delete_until_confirmed(&client, shared, &node).await.map_err(|e| Error::zk("delete", &node, e))?;
                Ok(existing)
            }
        }
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
                return Err(Error::BadContenderId(c.id.clone()));
            }
            if c.lock != lock_path {
                return Err(Error::BadLockPath(c.lock.clone()));
            }
        }
        let client = self.client()?;
        let created = anchor::recreate(&client, &self.inner.shared, &self.inner.config, lock_path, &contenders).await?;
        let mut handles = Vec::with_capacity(created.nodes.len());
        for (spec, (name, stat)) in contenders.into_iter().zip(created.nodes) {
            handles.push(self.track(client.clone(), spec, name, stat).await?);
        }
        Ok(Reanchored { contenders: handles, foreign_seen: created.foreign_seen })
    }

    /// A handle on a contender the engine tracks.
    pub fn handle(&self, id: &str) -> Option<Contender> {
        lock(&self.inner.shared.contenders).get(id).map(|e| Contender {
            id: id.to_string(),
            node: e.node.clone(),
            states: e.states.subscribe(),
        })
    }

    /// Leaves the queue (or gives up the lock): deletes the node, retrying through connection
    /// loss until ZooKeeper confirms. The delete goes on even if the caller stops waiting.
    /// Returns false when the engine did not track `id` (already released or lost).
    pub async fn release(&self, id: &str) -> Result<bool, Error> {
        let Some(entry) = lock(&self.inner.shared.contenders).remove(id) else {
            return Ok(false);
        };
        entry.task.abort();
        let shared = self.inner.shared.clone();
        let client = lock(&self.inner.session).clone().filter(|c| c.session_id().0 == entry.session_id);
        let Some(client) = client else {
            // The node's session is over, and ephemeral nodes ended with it.
            shared.publish(id, &entry.states, ContenderState::Released);
            return Ok(true);
        };
        let node = entry.node.clone();
        let deleting = tokio::spawn(async move {
            let result = delete_until_confirmed(&client, &shared, &node).await;
            (result, shared)
        });
        match deleting.await {
            Ok((result, shared)) => {
                result.map_err(|e| Error::zk("delete", &entry.node, e))?;
                shared.publish(id, &entry.states, ContenderState::Released);
                Ok(true)
            }
            // The delete task does not panic; if the runtime is shutting down there is nothing
            // left to wait for.
            Err(join) => Err(Error::zk("delete", &entry.node, zk::Error::UnexpectedError(join.to_string()))),
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
            match retry::idempotent(|| client.set_data(node, &wanted, Some(stat.version))).await {
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
        let contenders = lock(&self.inner.shared.contenders);
        for child in queue.iter().filter(|c| c.ours.is_some()).take(limit.saturating_add(1)) {
            let Some((id, _)) = child.ours else { continue };
            let Some(entry) = contenders.get(id) else { continue };
            let current = entry.states.borrow().clone();
            if let ContenderState::Waiting { .. } = current {
                if let Decision::Waiting { watch, ahead } = recipe::decide(&children, child.name) {
                    let fresh = ContenderState::Waiting { ahead, watching: watch };
                    if fresh != current {
                        self.inner.shared.publish(id, &entry.states, fresh);
                        changed += 1;
                    }
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

impl Inner {
    /// Every contender of `session_id` is lost: its nodes went with the session.
    fn lose_session(&self, session_id: i64) {
        {
            let mut session = lock(&self.session);
            if session.as_ref().is_some_and(|c| c.session_id().0 == session_id) {
                *session = None;
            }
        }
        let lost: Vec<(String, Entry)> = {
            let mut contenders = lock(&self.shared.contenders);
            let ids: Vec<String> =
                contenders.iter().filter(|(_, e)| e.session_id == session_id).map(|(id, _)| id.clone()).collect();
            ids.into_iter().filter_map(|id| contenders.remove(&id).map(|e| (id, e))).collect()
        };
        for (id, entry) in lost {
            entry.task.abort();
            self.shared.publish(&id, &entry.states, ContenderState::Lost { why: LostReason::SessionExpired });
        }
        self.shared.emit(EngineEvent::Session(SessionEvent::Lost { session_id }));
    }
}

async fn monitor_session(inner: Weak<Inner>, mut states: zk::StateWatcher, session_id: i64) {
    loop {
        let state = states.changed().await;
        let Some(inner) = inner.upgrade() else { return };
        match state {
            zk::SessionState::Disconnected => inner.shared.emit(EngineEvent::Session(SessionEvent::Disconnected)),
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
) -> Result<(String, zk::Stat), Error> {
    let prefix = recipe::node_prefix(&spec.id, spec.mode);
    let path = format!("{}/{prefix}", spec.lock);
    let body = NodeData::new(&spec.id, spec.mode, &spec.description).to_bytes();
    let acls = config.node_acls();
    let options = zk::CreateMode::EphemeralSequential.with_acls(acls);
    // Lock directories stay open to everybody for create, so that Curator clients can contend.
    let dir_options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut backoff = Backoff::new();
    loop {
        match retry::timed(client.create(&path, &body, &options)).await {
            Ok((stat, sequence)) => {
                Stats::bump(&shared.stats.creates);
                let stat = if stat.is_invalid() { stat_of(client, &format!("{path}{sequence}")).await? } else { stat };
                return Ok((format!("{prefix}{sequence}"), stat));
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
async fn find_own_node(client: &zk::Client, spec: &ContenderSpec) -> Result<Option<(String, zk::Stat)>, Error> {
    let children = match retry::idempotent(|| client.list_children(&spec.lock)).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(Error::zk("list", &spec.lock, e)),
    };
    let Some(name) = recipe::find_node(&children, &spec.id) else { return Ok(None) };
    let path = format!("{}/{name}", spec.lock);
    match retry::idempotent(|| client.check_stat(&path)).await {
        Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => Ok(Some((name.to_string(), stat))),
        Ok(_) => Ok(None),
        Err(e) => Err(Error::zk("stat", &path, e)),
    }
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
    match retry::idempotent(|| client.delete(path, None)).await {
        Ok(()) => {
            Stats::bump(&shared.stats.deletes);
            Ok(())
        }
        Err(zk::Error::NoNode) => Ok(()),
        Err(e) if retry::is_session_end(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

type WatchFuture = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

fn boxed(watcher: zk::OneshotWatcher) -> WatchFuture {
    Box::pin(watcher.changed())
}

/// One contender following the recipe.
struct Tracker {
    shared: Arc<Shared>,
    client: zk::Client,
    spec: ContenderSpec,
    name: String,
    path: String,
    /// Set when the recipe first grants the lock (see `evaluate`).
    fencing_token: i64,
    created_zxid: i64,
    states: Arc<watch::Sender<ContenderState>>,
    decision: Decision,
    revoke: Option<String>,
}

enum Step {
    /// Read the children and decide again.
    Continue,
    /// The contender is over (lost, or its session ended).
    Stop,
}

impl Tracker {
    /// Arms the watch on our own node, then decides for the first time.
    async fn start(&mut self) -> Result<WatchFuture, zk::Error> {
        let own = self.watch_own().await?;
        self.evaluate().await?;
        Ok(own)
    }

    /// Reads our node's data (and any revocation request in it) and watches it again.
    async fn watch_own(&mut self) -> Result<WatchFuture, zk::Error> {
        let (body, _, watcher) = retry::idempotent(|| self.client.get_and_watch_data(&self.path)).await?;
        if self.revoke.is_none() {
            self.revoke = data::revoke_request(&body);
        }
        Ok(boxed(watcher))
    }

    async fn evaluate(&mut self) -> Result<(), zk::Error> {
        loop {
            Stats::bump(&self.shared.stats.children_reads);
            let (children, dir) = retry::idempotent(|| self.client.get_children(&self.spec.lock)).await?;
            self.decision = recipe::decide(&children, &self.name);
            if self.decision == Decision::Held && self.fencing_token == 0 {
                // The fencing token is the zxid of the directory state in which the grant was
                // decided: it is above the zxid that removed the previous holder, so tokens of
                // successive holders strictly increase. (The node's czxid alone is not enough:
                // nodes re-created together by one multi-op share one czxid.) Granted at once,
                // it equals the node's czxid.
                self.fencing_token = dir.pzxid.max(self.created_zxid);
            }
            if self.decision == Decision::Missing {
                // Our node is gone: whatever else carries our id is somebody else's business.
                return Ok(());
            }
            let my_sequence = recipe::parse_child(&self.name).map_or(0, |c| c.sequence);
            let duplicates: Vec<(String, u64)> = recipe::queue(&children)
                .into_iter()
                .filter(|c| c.name != self.name && c.ours.is_some_and(|(id, _)| id == self.spec.id))
                .map(|c| (format!("{}/{}", self.spec.lock, c.name), c.sequence))
                .collect();
            if duplicates.is_empty() {
                return self.mark_foreign_use(&children).await;
            }
            // A second node with our id. Ours wins over one of our own session (a create retried
            // after a lost answer) and over an older one (left by an earlier session). A newer
            // node of another session is a newer incarnation of this contender (re-anchored by
            // a new leader): that one wins, and ours will be deleted by it.
            let mut deleted = false;
            for (path, sequence) in duplicates {
                let owner = match retry::idempotent(|| self.client.check_stat(&path)).await? {
                    Some(stat) => stat.ephemeral_owner,
                    None => continue,
                };
                if owner != self.client.session_id().0 && sequence > my_sequence {
                    continue;
                }
                tracing::warn!(node = %path, contender = %self.spec.id, "deleting a second node of one contender");
                match retry::idempotent(|| self.client.delete(&path, None)).await {
                    Ok(()) => Stats::bump(&self.shared.stats.duplicates_deleted),
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(e),
                }
                deleted = true;
            }
            if !deleted {
                return self.mark_foreign_use(&children).await;
            }
        }
    }

    /// Records in the directory that a client other than zklock uses this lock (once per
    /// directory and engine): after a session gap, holders there cannot be assumed to have kept
    /// the lock.
    async fn mark_foreign_use(&self, children: &[String]) -> Result<(), zk::Error> {
        let lock_path = &self.spec.lock;
        if lock(&self.shared.foreign_marked).contains(lock_path) {
            return Ok(());
        }
        if recipe::queue(children).iter().any(|c| c.ours.is_none()) {
            anchor::mark_foreign(&self.client, lock_path).await?;
            lock(&self.shared.foreign_marked).insert(lock_path.clone());
        }
        Ok(())
    }

    /// The state the last decision and any revocation request add up to.
    fn current_state(&self) -> ContenderState {
        let token = self.fencing_token;
        match (&self.decision, &self.revoke) {
            (Decision::Held, None) => ContenderState::Held { fencing_token: token },
            (Decision::Held, Some(reason)) => {
                ContenderState::RevokeRequested { reason: reason.clone(), fencing_token: Some(token) }
            }
            (Decision::Waiting { .. }, Some(reason)) => {
                ContenderState::RevokeRequested { reason: reason.clone(), fencing_token: None }
            }
            (Decision::Waiting { watch, ahead }, None) => {
                ContenderState::Waiting { ahead: *ahead, watching: watch.clone() }
            }
            (Decision::Missing, _) => ContenderState::Lost { why: LostReason::DeletedByOther },
        }
    }

    fn publish_current(&self) {
        self.shared.publish(&self.spec.id, &self.states, self.current_state());
    }

    fn lose(&self, why: LostReason) {
        self.shared.publish(&self.spec.id, &self.states, ContenderState::Lost { why });
    }

    async fn run(mut self, mut own: WatchFuture) {
        loop {
            self.publish_current();
            let step = match self.decision.clone() {
                Decision::Missing => Ok(Step::Stop),
                Decision::Held => self.hold(&mut own).await,
                Decision::Waiting { watch, .. } => {
                    let watched = format!("{}/{watch}", self.spec.lock);
                    self.wait_for_predecessor(&watched, &mut own).await
                }
            };
            let step = match step {
                Ok(Step::Continue) => self.evaluate().await.map(|()| Step::Continue),
                other => other,
            };
            match step {
                Ok(Step::Continue) => {}
                Ok(Step::Stop) => break,
                Err(e) => {
                    self.on_error(e);
                    break;
                }
            }
        }
        // Release and session loss remove the engine's entry themselves; a contender that
        // ended on its own (node deleted, ZooKeeper refused) is removed here.
        if self.states.borrow().is_final() {
            self.shared.forget(&self.spec.id, &self.path);
        }
    }

    /// Holds the lock until our node goes away; follows revocation requests meanwhile.
    async fn hold(&mut self, own: &mut WatchFuture) -> Result<Step, zk::Error> {
        loop {
            let event = own.as_mut().await;
            match self.on_own_event(event).await? {
                Some(next) => *own = next,
                None => return Ok(Step::Stop),
            }
        }
    }

    /// Waits until the watched node is gone, following events on our own node meanwhile.
    async fn wait_for_predecessor(&mut self, watched: &str, own: &mut WatchFuture) -> Result<Step, zk::Error> {
        loop {
            let (stat, watcher) = retry::idempotent(|| self.client.check_and_watch_stat(watched)).await?;
            if stat.is_none() {
                return Ok(Step::Continue);
            }
            let mut predecessor = boxed(watcher);
            loop {
                tokio::select! {
                    event = predecessor.as_mut() => {
                        Stats::bump(&self.shared.stats.predecessor_notifications);
                        match event.event_type {
                            zk::EventType::NodeDeleted => return Ok(Step::Continue),
                            zk::EventType::Session if event.session_state.is_terminated() => return Ok(Step::Stop),
                            // Data changed (say, a revocation request for the holder): the node
                            // is still there; watch it again.
                            _ => break,
                        }
                    }
                    event = own.as_mut() => match self.on_own_event(event).await? {
                        Some(next) => *own = next,
                        None => return Ok(Step::Stop),
                    },
                }
            }
        }
    }

    /// Handles an event on our own node; returns the re-armed watch, or `None` when the
    /// contender is over.
    async fn on_own_event(&mut self, event: zk::WatchedEvent) -> Result<Option<WatchFuture>, zk::Error> {
        Stats::bump(&self.shared.stats.own_node_notifications);
        match event.event_type {
            zk::EventType::NodeDeleted => {
                self.lose(LostReason::DeletedByOther);
                Ok(None)
            }
            zk::EventType::Session if event.session_state.is_terminated() => Ok(None),
            _ => match self.watch_own().await {
                Ok(next) => {
                    self.publish_current();
                    Ok(Some(next))
                }
                Err(zk::Error::NoNode) => {
                    self.lose(LostReason::DeletedByOther);
                    Ok(None)
                }
                Err(e) => Err(e),
            },
        }
    }

    fn on_error(&self, e: zk::Error) {
        // The session monitor reports session ends; anything else is this contender's own.
        if !retry::is_session_end(&e) {
            tracing::warn!(node = %self.path, error = %e, "contender failed");
            self.lose(LostReason::Failed(e.to_string()));
        }
    }
}
