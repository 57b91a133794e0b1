//! temp: engine RSS per contender
use std::time::Duration;
use zklock::recipe::Mode;
use zklock::zk::{ContenderSpec, LockEngine, ZkConfig};
use zklock_testkit::ZkServer;

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().split_whitespace().next().unwrap().parse::<u64>().unwrap()
        * 1024
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map(|n| n.parse()).transpose()?.unwrap_or(10000);
    let server = ZkServer::shared();
    let connect = server.chroot().await;
    let engine = LockEngine::connect(ZkConfig::new(&connect).with_session_timeout(Duration::from_secs(10))).await?;
    let base = rss();
    let mut hs = vec![];
    for i in 0..n {
        let spec = ContenderSpec {
            id: uuid::Uuid::new_v4().to_string(),
            lock: format!("/bench/mem-{}", i / 100),
            mode: Mode::Exclusive,
            description: format!("ns/claim-{i}"),
        };
        hs.push(engine.enqueue(spec).await?);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss();
    println!(
        "engine: {n} contenders, {:.0} B/contender, total {:.1} MiB",
        (after - base) as f64 / n as f64,
        after as f64 / 1048576.0
    );
    Ok(())
}
