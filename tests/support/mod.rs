//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use zklock::recipe::Mode;
use zklock::zk::{ContenderSpec, ContenderState, EngineEvent, Error, LockEngine, LostReason, ZkConfig};
use zklock_testkit::ZkServer;

/// Upper bound on any single wait in a test: long enough for a loaded 2-core machine, short
/// enough that a hang shows as a failure with a message instead of a stuck run.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {PATIENCE:?} waiting for {what}"))
}

/// A connect string with a chroot of the test's own on the shared server.
pub async fn chroot() -> String {
    ZkServer::shared().chroot().await
}

pub async fn engine(connect: &str) -> Engine {
    let config = ZkConfig::new(connect).with_session_timeout(Duration::from_secs(4));
    Engine::connect(config).await.unwrap_or_else(|e| panic!("engine: {e}"))
}

/// A lock engine with a handle per contender for tests to wait on. The engine itself offers
/// no handles: its event stream is the one way to follow contenders, and this follows it.
/// Dropping the last clone drops the engine (handles do not keep it alive).
#[derive(Clone)]
pub struct Engine {
    engine: Arc<LockEngine>,
    /// Counts the contender events seen so far.
    changes: watch::Receiver<u64>,
    /// The last state reported for each contender: what a contender the engine no longer
    /// tracks ended as (Released, or Lost with its session).
    last: Last,
}

type Last = Arc<parking_lot::Mutex<HashMap<String, ContenderState>>>;

impl Deref for Engine {
    type Target = LockEngine;
    fn deref(&self) -> &LockEngine {
        &self.engine
    }
}

impl Engine {
    pub async fn connect(config: ZkConfig) -> Result<Engine, Error> {
        Ok(Self::connect_with_events(config).await?.0)
    }

    /// The engine, and its event stream passed on for the test.
    pub async fn connect_with_events(
        config: ZkConfig,
    ) -> Result<(Engine, mpsc::UnboundedReceiver<EngineEvent>), Error> {
        let (engine, mut events) = LockEngine::connect_with_events(config).await?;
        let (seen, changes) = watch::channel(0u64);
        let (forward, passed_on) = mpsc::unbounded_channel();
        let last = Last::default();
        let record = last.clone();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if let EngineEvent::Contender { id, state } = &event {
                    record.lock().insert(id.clone(), state.clone());
                    seen.send_modify(|n| *n += 1);
                }
                let _ = forward.send(event);
            }
        });
        Ok((Engine { engine: Arc::new(engine), changes, last }, passed_on))
    }

    /// Enqueues and answers a handle on the contender.
    pub async fn enqueue(&self, spec: ContenderSpec) -> Result<Contender, Error> {
        let id = spec.id.clone();
        self.engine.enqueue(spec).await?;
        Ok(self.contender(&id))
    }

    /// A handle on a contender the engine tracks.
    pub fn contender(&self, id: &str) -> Contender {
        Contender {
            id: id.to_string(),
            node: self.engine.node(id).unwrap_or_default(),
            engine: Arc::downgrade(&self.engine),
            changes: self.changes.clone(),
            last: self.last.clone(),
        }
    }
}

/// A contender to wait on: its state is the engine's answer, and every contender event wakes
/// its waits.
pub struct Contender {
    pub id: String,
    /// Full path of the contender's node.
    pub node: String,
    engine: Weak<LockEngine>,
    changes: watch::Receiver<u64>,
    last: Last,
}

impl std::fmt::Debug for Contender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contender")
            .field("id", &self.id)
            .field("node", &self.node)
            .field("state", &self.state())
            .finish()
    }
}

impl Contender {
    /// The engine's answer while it tracks the contender, else the last state reported (which
    /// may lag behind the engine by the events on their way: wait rather than assert on it).
    pub fn state(&self) -> ContenderState {
        self.known_state().unwrap_or(ContenderState::Released)
    }

    /// `None` while the engine no longer tracks the contender and its last event has not
    /// been seen yet.
    fn known_state(&self) -> Option<ContenderState> {
        let tracked = match self.engine.upgrade() {
            Some(engine) => engine.state(&self.id),
            // The session closed with the engine, and the node with it.
            None => return Some(ContenderState::Lost { why: LostReason::SessionExpired }),
        };
        tracked.or_else(|| self.last.lock().get(&self.id).cloned())
    }

    /// Waits until the state satisfies `f`; `None` once it ended otherwise or the engine went.
    pub async fn wait_for(&mut self, mut f: impl FnMut(&ContenderState) -> bool) -> Option<ContenderState> {
        loop {
            // Marked seen before the state is read: a change after the read wakes the wait.
            self.changes.borrow_and_update();
            if let Some(state) = self.known_state() {
                if f(&state) {
                    return Some(state);
                }
                if state.is_final() {
                    return None;
                }
            }
            self.changes.changed().await.ok()?;
        }
    }
}

pub async fn raw_client(connect: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(connect).await.unwrap_or_else(|e| panic!("client: {e}"))
}

pub fn spec(lock: &str, mode: Mode) -> ContenderSpec {
    ContenderSpec { id: uuid::Uuid::new_v4().to_string().into(), lock: lock.into(), mode, description: "test".into() }
}

pub async fn enqueue(engine: &Engine, lock: &str, mode: Mode) -> Contender {
    engine.enqueue(spec(lock, mode)).await.unwrap_or_else(|e| panic!("enqueue: {e}"))
}

/// Waits until the contender holds the lock; returns its fencing token.
pub async fn held(c: &mut Contender) -> i64 {
    let state = within(&format!("{} to be held", c.id), c.wait_for(|s| s.is_held() || s.is_final())).await;
    match state {
        Some(s) if s.is_held() => s.fencing_token().unwrap_or_default(),
        other => panic!("{} ended without holding: {other:?}", c.id),
    }
}

pub async fn wait_state(c: &mut Contender, what: &str, f: impl FnMut(&ContenderState) -> bool) -> ContenderState {
    match tokio::time::timeout(PATIENCE, c.wait_for(f)).await {
        Ok(Some(state)) => state,
        Ok(None) => panic!("{} closed while waiting for {what}", c.id),
        // The state it was left in says which way it went (CI once timed out here, without it).
        Err(_) => panic!("timed out after {PATIENCE:?} waiting for {what}: {} is {:?}", c.id, c.state()),
    }
}

pub fn is_waiting(s: &ContenderState) -> bool {
    matches!(s, ContenderState::Waiting { .. })
}

pub async fn children(client: &zookeeper_client::Client, path: &str) -> Vec<String> {
    match client.list_children(path).await {
        Ok(c) => c,
        Err(zookeeper_client::Error::NoNode) => vec![],
        Err(e) => panic!("list {path}: {e}"),
    }
}
