//! The lock engine's memory per contender, as the operator uses it (no handles kept):
//!
//!     cargo run --release --example engine_memory [-- CONTENDERS]
//!
//! Enqueues CONTENDERS contenders (default 10,000) in locks of 100 on a real ZooKeeper (started
//! here, or ZK_CONNECT) and prints the growth of this process's RSS per contender.

use std::time::Duration;

use zklock::recipe::Mode;
use zklock::zk::{ContenderSpec, LockEngine, ZkConfig};
use zklock_testkit::ZkServer;

fn rss() -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or("no VmRSS in /proc/self/status")?;
    Ok(kb * 1024)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map(|n| n.parse()).transpose()?.unwrap_or(10_000);
    let server = ZkServer::shared();
    let connect = server.chroot().await;
    let engine = LockEngine::connect(ZkConfig::new(&connect).with_session_timeout(Duration::from_secs(10))).await?;
    let before = rss()?;
    for i in 0..n {
        let spec = ContenderSpec {
            id: uuid::Uuid::new_v4().to_string().into(),
            lock: format!("/bench/memory/m{}", i / 100),
            mode: Mode::Exclusive,
            description: format!("bench/claim-{i}"),
        };
        engine.enqueue(spec).await?;
    }
    let after = rss()?;
    println!(
        "engine memory at {n} contenders: {:.0} bytes per contender, {:.1} MiB total RSS",
        after.saturating_sub(before) as f64 / n as f64,
        after as f64 / 1048576.0
    );
    Ok(())
}
