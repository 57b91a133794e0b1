//! Handoff latency between two contenders on one lock: the time from the holder's release call
//! to the waiter seeing itself Held. Measured for the engine and, in the same run on the same
//! ZooKeeper server, for Apache Curator's InterProcessMutex (both with one session for both
//! contenders, as the operator runs).
//!
//!     cargo run --release --example handoff [-- ITERATIONS]
//!
//! Uses the ZooKeeper named by ZK_CONNECT, or starts one (scripts/zookeeper.sh install first).

use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;
use zklock::recipe::Mode;
use zklock::zk::{ContenderSpec, ContenderState, EngineEvent, LockEngine, ZkConfig};
use zklock_testkit::{curator, ZkServer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iterations: usize = std::env::args().nth(1).map(|n| n.parse()).transpose()?.unwrap_or(2000);
    let server = ZkServer::shared();
    let connect = server.chroot().await;

    let config = ZkConfig::new(&connect).with_session_timeout(Duration::from_secs(10));
    let (engine, mut events) = LockEngine::connect_with_events(config).await?;
    let lock = "/bench/handoff";
    let spec = || ContenderSpec {
        id: uuid::Uuid::new_v4().to_string().into(),
        lock: lock.into(),
        mode: Mode::Exclusive,
        description: "handoff bench".into(),
    };
    let mut holder = spec();
    engine.enqueue(holder.clone()).await?;
    held(&mut events, &holder.id).await?;
    // The first 100 rounds warm up (connections, caches; the JIT on Curator's side) and are
    // not counted.
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations + 100 {
        let waiter = spec();
        let first = engine.enqueue(waiter.clone()).await?;
        assert!(matches!(first, ContenderState::Waiting { .. }), "the waiter waits: {first:?}");
        let start = Instant::now();
        engine.release(&holder.id).await?;
        held(&mut events, &waiter.id).await?;
        if i >= 100 {
            samples.push(start.elapsed());
        }
        holder = waiter;
    }
    engine.release(&holder.id).await?;
    let stats = engine.stats();
    println!(
        "zklock engine handoff:            {} (predecessor notifications per handoff: {:.2})",
        percentiles(&mut samples),
        stats.predecessor_notifications as f64 / (iterations + 100) as f64
    );

    let java_lock = "/bench/curator-handoff";
    let out =
        tokio::task::spawn_blocking(move || curator::run(&["handoff", &connect, java_lock, &iterations.to_string()]))
            .await?;
    print!("{out}");
    Ok(())
}

/// Waits for the event that says contender `id` holds the lock.
async fn held(events: &mut UnboundedReceiver<EngineEvent>, id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let wait = async {
        while let Some(event) = events.recv().await {
            if matches!(&event, EngineEvent::Contender { id: e, state } if e == id && state.is_held()) {
                return Ok(());
            }
        }
        Err("the engine's event stream ended".into())
    };
    tokio::time::timeout(Duration::from_secs(30), wait).await.map_err(|_| format!("{id} was not granted in 30 s"))?
}

fn percentiles(samples: &mut [Duration]) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!("p50={:.2}ms p99={:.2}ms n={}", ms(at(0.5)), ms(at(0.99)), samples.len())
}
