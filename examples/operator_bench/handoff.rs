//! The handoff part: a lock handed on at 10 and 1,000 waiters, on a semaphore and over two locks,
//! alternating in batches with the floors of its path, and the ratios.

use crate::floors::{handoff_floor, Floor, FloorStart};
use crate::harness::{median, Bench, HandoffResult, Samples, Server, BATCHES, SEMAPHORE_PERMITS};
use crate::{Error, Sizes};

pub(crate) async fn handoffs(
    client: &kube::Client,
    server: &Server,
    zk: &zklock_testkit::ZkServer,
    sizes: &Sizes,
) -> Result<(), Error> {
    let mut handoff_p50 = vec![];
    // At the first size, zklock's handoffs alternate batch by batch with the floor of every
    // write of their path: the floor of one run moved 12.8–23.0 ms from run to run when it was
    // measured after zklock's rounds, more than the operator's whole part.
    let waiters = sizes.waiters[0];
    let bench = Bench::start(client, server, zk, &format!("handoff-{waiters}")).await?;
    let side = alternating(&bench, client, server, zk, waiters, sizes.handoffs).await?;
    // The locks' history is written in batches a second after their news, outside the rounds'
    // windows that the writes per handoff above count: its calls over the whole part instead.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let history = |method: &'static str, resource: &'static str| {
        let bench = &bench;
        async move {
            let series = format!("zklock_kubernetes_calls_total{{method=\"{method}\",resource=\"{resource}\"");
            bench.metric(&series).await
        }
    };
    let reads = history("GET", "lockhistories").await;
    let creates = history("POST", "lockhistories").await;
    let writes = history("PUT", "lockhistories/status").await;
    drop(bench);
    println!("handoff at {waiters:>4} waiters: {}", side.zklock.summary());
    let handed = side.zklock.latency.0.len().max(1) as f64;
    println!(
        "  the locks' history over those {} handoffs (and the claims' other grants and ends of the part): {} \
         writes ({creates} creates, {writes} status replaces), {:.3} per handoff; {reads} reads",
        side.zklock.latency.0.len(),
        creates + writes,
        (creates + writes) / handed
    );
    println!(
        "handoff's floor with ZooKeeper's release, then the holder's finalizer removed (every write of zklock's \
         path, in its order: the node's delete in a multi-op that checks an epoch node), in batches of {} \
         alternating with zklock's: {}; zklock / that floor at {waiters} waiters: p50 {:.2}; batch by batch {}, \
         median {:.2}",
        side.batch,
        side.floor.summary(),
        side.zklock.latency.percentile(0.5).as_secs_f64() / side.floor.percentile(0.5).as_secs_f64(),
        side.ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
        median(&side.ratios)
    );
    handoff_p50.push(side.zklock.latency.percentile(0.5));
    let held = side.zklock.held;
    for waiters in &sizes.waiters[1..] {
        let bench = Bench::start(client, server, zk, &format!("handoff-{waiters}")).await?;
        let result = bench.handoffs(1, *waiters, sizes.handoffs).await?;
        println!("handoff at {waiters:>4} waiters: {}", result.summary());
        handoff_p50.push(result.latency.percentile(0.5));
    }
    // The API server's own part of a handoff, made by the bench alone, beside zklock's.
    let held = held.ok_or("no Held status was seen to copy for the handoff's floor")?;
    let floor = handoff_floor(client, server, held.clone(), sizes.handoffs, FloorStart::ClaimDeleted).await?;
    println!(
        "handoff's floor (the holder's delete seen on a watch, then the next claim's Held status written and \
         seen, by the bench alone): {}; zklock / floor at {} waiters: p50 {:.2}",
        floor.summary(),
        sizes.waiters[0],
        handoff_p50[0].as_secs_f64() / floor.percentile(0.5).as_secs_f64()
    );
    let gone = handoff_floor(client, server, held.clone(), sizes.handoffs, FloorStart::ClaimDeletedThenGone).await?;
    println!(
        "handoff's floor with the holder's finalizer removed first (as zklock does when its finalizer is the \
         last): {}; zklock / that floor at {} waiters: p50 {:.2}",
        gone.summary(),
        sizes.waiters[0],
        handoff_p50[0].as_secs_f64() / gone.percentile(0.5).as_secs_f64()
    );
    let with_final = handoff_floor(client, server, held, sizes.handoffs, FloorStart::ClaimDeletedThenFinal).await?;
    println!(
        "handoff's floor with the holder's final status written first (as zklock does when another \
         finalizer keeps the claim): {}; zklock / that floor at {} waiters: p50 {:.2}",
        with_final.summary(),
        sizes.waiters[0],
        handoff_p50[0].as_secs_f64() / with_final.percentile(0.5).as_secs_f64()
    );
    println!(
        "handoff p50 ratio {} vs {} waiters: {:.2}",
        sizes.waiters[1],
        sizes.waiters[0],
        handoff_p50[1].as_secs_f64() / handoff_p50[0].as_secs_f64()
    );
    // The same handoff on a semaphore: the oldest of SEMAPHORE_PERMITS holders leaves and the
    // first waiter takes its permit, next to the mutex's figure of the same run.
    let waiters = sizes.waiters[0];
    let bench = Bench::start(client, server, zk, "handoff-semaphore").await?;
    let result = bench.handoffs(SEMAPHORE_PERMITS, waiters, sizes.handoffs).await?;
    println!("semaphore of {SEMAPHORE_PERMITS} permits, handoff at {waiters:>4} waiters: {}", result.summary());
    println!(
        "handoff p50 ratio semaphore vs mutex at {waiters} waiters: {:.2}",
        result.latency.percentile(0.5).as_secs_f64() / handoff_p50[0].as_secs_f64()
    );
    // Claims over two locks (every claim over both, DESIGN.md §5c), in the same run.
    let bench = Bench::start(client, server, zk, "handoff-two-locks").await?;
    let result = bench.handoffs_on("l,m", "c", 1, waiters, sizes.handoffs).await?;
    println!("claims over two locks, handoff at {waiters:>4} waiters: {}", result.summary());
    println!(
        "handoff p50 ratio two locks vs one at {waiters} waiters: {:.2}",
        result.latency.percentile(0.5).as_secs_f64() / handoff_p50[0].as_secs_f64()
    );
    Ok(())
}

/// zklock's handoffs beside the floor of every write of their path, measured alternately.
pub(crate) struct SideBySide {
    pub(crate) zklock: HandoffResult,
    pub(crate) floor: Samples,
    /// Handoffs per batch.
    pub(crate) batch: usize,
    /// Each batch's p50 over its floor batch's p50 (the floor's batch right after zklock's).
    pub(crate) ratios: Vec<f64>,
}

/// `handoffs` handoffs of `bench`'s operator at `waiters` waiters, in [`BATCHES`] batches, each
/// followed by as many rounds of the floor with ZooKeeper's release
/// (`FloorStart::ClaimDeletedThenReleasedThenGone`): both meet the machine as it is at that
/// moment, as the clusters part interleaves its handoffs round by round.
pub(crate) async fn alternating(
    bench: &Bench,
    client: &kube::Client,
    server: &Server,
    zk: &zklock_testkit::ZkServer,
    waiters: usize,
    handoffs: usize,
) -> Result<SideBySide, Error> {
    let batch = handoffs.div_ceil(BATCHES).max(1);
    let mut zklock = bench.handoffs_on("l", "b0c", 1, waiters, batch.min(handoffs)).await?;
    let held = zklock.held.clone().ok_or("no Held status was seen to copy for the handoff's floor")?;
    let mut floor = Floor::open(client, server, Some(zk), held, FloorStart::ClaimDeletedThenReleasedThenGone).await?;
    let first = zklock.latency.clone();
    let mut b = 0;
    let measured = floor
        .alternate(&first, handoffs, batch, async |_, n| {
            b += 1;
            let result = bench.handoffs_on("l", &format!("b{b}c"), 1, waiters, n).await?;
            let latency = result.latency.clone();
            zklock.add(result);
            Ok(latency)
        })
        .await;
    // The measurement's error first: a failed cleanup is reported only when it went well.
    let closed = floor.close().await;
    let (floor, _, ratios) = measured?;
    closed?;
    Ok(SideBySide { zklock, floor, batch, ratios })
}
