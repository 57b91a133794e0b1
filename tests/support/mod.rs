//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use zklock::recipe::Mode;
use zklock::zk::{Contender, ContenderSpec, ContenderState, LockEngine, ZkConfig};
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

pub async fn engine(connect: &str) -> LockEngine {
    let config = ZkConfig::new(connect).with_session_timeout(Duration::from_secs(4));
    LockEngine::connect(config).await.unwrap_or_else(|e| panic!("engine: {e}"))
}

pub async fn raw_client(connect: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(connect).await.unwrap_or_else(|e| panic!("client: {e}"))
}

pub fn spec(lock: &str, mode: Mode) -> ContenderSpec {
    ContenderSpec { id: uuid::Uuid::new_v4().to_string().into(), lock: lock.into(), mode, description: "test".into() }
}

pub async fn enqueue(engine: &LockEngine, lock: &str, mode: Mode) -> Contender {
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
    within(what, c.wait_for(f)).await.unwrap_or_else(|| panic!("{} closed while waiting for {what}", c.id))
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
