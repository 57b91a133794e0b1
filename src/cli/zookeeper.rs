//! `zklock admin zk-queue`, `zk-revoke` and `raise-token-base`: straight to ZooKeeper, for
//! operators of the ensemble (users have `zklock queue` and `zklock revoke`, through the
//! Kubernetes API).

use std::time::Duration;

use zklock::zk::{LockEngine, ZkConfig};

fn config(connect: String) -> ZkConfig {
    ZkConfig::new(connect).with_session_timeout(Duration::from_secs(10))
}

/// Prints the queue of lock directory `lock`, holders first.
pub async fn queue(zk_connect: String, lock: &str, permits: Option<u32>) -> Result<u8, String> {
    let engine = LockEngine::connect(config(zk_connect)).await.map_err(|e| e.to_string())?;
    let queue = engine.queue(lock).await.map_err(|e| e.to_string())?;
    let names: Vec<&str> = queue.iter().map(|e| e.node.as_str()).collect();
    println!("{:<4} {:<10} {:<38} NODE", "POS", "MODE", "CONTENDER");
    for (position, entry) in queue.iter().enumerate() {
        let id = entry.id.as_deref().unwrap_or("(foreign)");
        let held = matches!(
            zklock::recipe::decide(&names, &entry.node, zklock::recipe::Limit::from_permits(permits)),
            zklock::recipe::Decision::Held
        );
        let pos = if held { "held".to_string() } else { position.to_string() };
        println!("{pos:<4} {:<10} {id:<38} {}", entry.mode.to_string(), entry.node);
    }
    Ok(0)
}

/// Writes a revocation request into node `node`.
pub async fn revoke(zk_connect: String, node: &str, reason: &str) -> Result<u8, String> {
    let engine = LockEngine::connect(config(zk_connect)).await.map_err(|e| e.to_string())?;
    engine.request_revocation(node, reason).await.map_err(|e| e.to_string())?;
    Ok(0)
}

/// Raises the token base of root `root` (or of shared root `shared`, where ClusterLocks are
/// shared) so that every fencing token, ticket and leader epoch from now on is above `above`.
pub async fn raise_token_base(
    zk_connect: String,
    zk_auth: Option<String>,
    root: &str,
    shared: Option<&str>,
    above: i64,
) -> Result<u8, String> {
    if above < 0 {
        return Err(format!("--above {above}: a token floor is 0 or more"));
    }
    let layout = zklock::zk::Layout::new(shared.unwrap_or(root))?;
    let mut config = config(zk_connect);
    config.digest_auth = zk_auth;
    let engine = LockEngine::connect(config).await.map_err(|e| e.to_string())?;
    let path = layout.token_base();
    let base = engine.raise_token_base(&path, above).await.map_err(|e| e.to_string())?;
    println!("token base {path}: {base} (every token from now on is above {above})");
    Ok(0)
}
