//! The operator's numbers (docs/benchmarks.md), measured through the Kubernetes API:
//!
//!     cargo build --release && cargo run --release --example operator_bench [-- --quick]
//!
//! Runs the release `zklock` binary as the operator against a real ZooKeeper (started here, or
//! ZKLOCK_TEST_ZK) and a real control plane (`scripts/k8s.sh`, started for this run, or the
//! cluster of ZKLOCK_TEST_KUBECONFIG; the first line says which), and prints:
//! handoff latency at 10 and 1,000 waiters and on a semaphore of 3 permits at 10 waiters, ZooKeeper
//! watch events and API writes per handoff,
//! holder-pod-deleted → next Held, gated pod finished → next gated pod's scheduling gate removed
//! (with API writes per gated handoff), uncontended acquire/release throughput over 1,000 locks next
//! to Apache Curator's on the same ZooKeeper, and the operator's memory per claim at 10,000
//! claims (`--memory-claims N` for another count, such as 100000). `--quick` runs smaller sizes (for a smoke test);
//! `--only handoff|pods|gated|throughput|memory|clusters|failover|locks|scale` runs one part (`locks`:
//! 1,000 `Lock` objects of two permits and ten claims each, or `--status-locks N`: their status
//! settled, named after a grant on a quiet lock, and refreshed on busy locks; `failover`:
//! the leader stopped gracefully and then killed under 2,000 and 10,000 queued claims, or
//! `--failover-claims N`, and each time 20 holder pods deleted the moment the new leader leads
//! (their locks' next claims Held, p50/p99: the pod path in a term's first second); `scale`, run only when asked for: 10,000 claims or `--scale-claims N`,
//! 100 per namespace and 10 per lock, served by one operator for every namespace — queued,
//! memory, a fresh operator's start (listed, leading, ready, every claim re-stamped, the API
//! server's CPU), the handoff beside its floor; one size per run, alone on the run's control
//! plane: its operator serves whatever claims the control plane has; `clusters`: a
//! `ClusterLock` shared by this control plane and a second one started for the run, the handoff
//! between the two clusters beside the handoff within one, then with 20 ms added to every
//! ZooKeeper request of the second cluster's operator, and a leader change in the first cluster:
//! places changed, time to lead, the first handoff after it); `--pod-rounds N` makes the holder
//! pod rounds and their floors N handoffs each (default 20). The handoff at 10 waiters, the pod
//! rounds and the gated handoffs alternate, in five batches, with the floor of every write of their path, so that each
//! ratio compares the two at the same moment; `--no-finalizer-policy` leaves the
//! finalizer's admission policy out (the operator then adds its finalizer to each claim). `ZKLOCK_BENCH_WRAP="heaptrack -o /tmp/op"` runs the operator under a wrapper
//! command (a profiler); the RSS figure is then the wrapper's, not the operator's.
//! `ZKLOCK_BENCH_OPERATOR=PATH` runs another build of the operator, such as the static (musl)
//! one the container image ships (`scripts/build-static.sh` prints its path), and
//! `ZKLOCK_BENCH_LOG=FILTER` sets its log filter (default `warn`; its log goes to stderr).
//! `ZKLOCK_BENCH_SAMPLES=1` prints each handoff of the handoff part to stderr as `SAMPLE
//! NAMESPACE CLAIM START LATENCY_MS` (CLAIM: the one granted; START: the holder's deletion, Unix
//! seconds), to be laid beside the operator's debug log.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use serde_json::json;
use zklock::api::{ClusterLock, Lock, LockClaim, Phase};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Sizes {
    /// Claims queued (ten per lock) under the leader changes of the failover part.
    failover_claims: Vec<usize>,
    waiters: [usize; 2],
    handoffs: usize,
    pod_rounds: usize,
    locks: usize,
    lifecycles: usize,
    memory_claims: usize,
    /// Claims of the scale part (100 per namespace, 10 per lock).
    scale_claims: usize,
    /// `Lock` objects of the locks part (ten claims each).
    status_locks: usize,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let parts = ["handoff", "pods", "gated", "throughput", "memory", "clusters", "failover", "locks", "scale"];
    if let Some(part) = only.as_deref().filter(|p| !parts.contains(p)) {
        return Err(format!("--only {part}: expected one of {}", parts.join(", ")).into());
    }
    // `scale` runs only when asked for: it takes longer than all the others together.
    let runs = |part: &str| only.as_deref().map_or(part != "scale", |o| o == part);
    let mut sizes = if quick {
        Sizes {
            failover_claims: vec![200],
            waiters: [5, 50],
            handoffs: 10,
            pod_rounds: 5,
            locks: 100,
            lifecycles: 20,
            memory_claims: 500,
            scale_claims: 1_000,
            status_locks: 50,
        }
    } else {
        Sizes {
            failover_claims: vec![2_000, 10_000],
            waiters: [10, 1000],
            handoffs: 50,
            pod_rounds: 20,
            locks: 1000,
            lifecycles: 100,
            memory_claims: 10_000,
            scale_claims: 10_000,
            status_locks: 1_000,
        }
    };
    if let Some(i) = args.iter().position(|a| a == "--failover-claims") {
        let n = args.get(i + 1).and_then(|n| n.parse().ok()).filter(|n| *n >= 10);
        sizes.failover_claims = vec![n.ok_or("--failover-claims N: N must be a number of claims, 10 or more")?];
    }
    if let Some(i) = args.iter().position(|a| a == "--scale-claims") {
        let n = args.get(i + 1).and_then(|n| n.parse().ok()).filter(|n| *n >= 100);
        sizes.scale_claims = n.ok_or("--scale-claims N: N must be a number of claims, 100 or more")?;
    }
    if let Some(i) = args.iter().position(|a| a == "--status-locks") {
        let n = args.get(i + 1).and_then(|n| n.parse().ok()).filter(|n| *n > 0);
        sizes.status_locks = n.ok_or("--status-locks N: N must be a positive number of Lock objects")?;
    }
    if let Some(i) = args.iter().position(|a| a == "--pod-rounds") {
        let n = args.get(i + 1).and_then(|n| n.parse().ok()).filter(|n| *n > 0);
        sizes.pod_rounds = n.ok_or("--pod-rounds N: N must be a positive number of handoffs")?;
    }
    if let Some(i) = args.iter().position(|a| a == "--memory-claims") {
        let n = args.get(i + 1).and_then(|n| n.parse().ok()).filter(|n| *n > 0);
        sizes.memory_claims = n.ok_or("--memory-claims N: N must be a positive number of claims")?;
    }
    let kubeconfig = zklock_testkit::kube::kubeconfig();
    // As the chart installs it on a real API server (1.36+); `--no-finalizer-policy` measures
    // the operator adding its finalizer itself (older clusters, or an earlier build).
    let finalizer_policy = !args.iter().any(|a| a == "--no-finalizer-policy");
    let server = Server { kubeconfig: kubeconfig.to_path_buf(), finalizer_policy };
    let zk = zklock_testkit::ZkServer::shared();
    // The operator's own client stack (TCP_NODELAY), so that the bench's requests do not wait
    // for delayed ACKs that the operator's do not.
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default()).await?;
    let client = zklock::client::builder(config)?.build();
    let version = client.apiserver_version().await?;
    println!(
        "API server: kube-apiserver {} ({}){}",
        version.git_version,
        kubeconfig.display(),
        if finalizer_policy { ", finalizer admission policy installed" } else { "" }
    );
    install_crd(&client).await?;

    if runs("handoff") {
        handoffs(&client, &server, zk, &sizes).await?;
    }
    if runs("pods") {
        // zklock's rounds alternate batch by batch with the floor of every write of their path:
        // measured after them, the floor moved more between runs than the operator's whole part.
        let bench = Bench::start(&client, &server, zk, "pods").await?;
        let probe = ServerProbe::new(&client, &server);
        let batch = sizes.pod_rounds.div_ceil(BATCHES).max(1);
        let start = probe.sample().await;
        let mut server_part = start.clone();
        let before = probe.sample().await;
        let mut pods = bench.pod_deletions(0, batch.min(sizes.pod_rounds)).await?;
        server_part.add(&before, &probe.sample().await);
        let held = pods.held.clone().ok_or("no Held status was seen to copy for the pod path's floor")?;
        let mut floor = Floor::open(&client, &server, Some(zk), held.clone(), FloorStart::PodDeleted).await?;
        let first = pods.latency.clone();
        let measured = floor
            .alternate(&first, sizes.pod_rounds, batch, async |done, n| {
                let before = probe.sample().await;
                let rounds = bench.pod_deletions(done, n).await?;
                server_part.add(&before, &probe.sample().await);
                let latency = rounds.latency.clone();
                pods.add(rounds);
                Ok(latency)
            })
            .await;
        let closed = floor.close().await;
        let (released, floor_gone_seen, ratios) = measured?;
        closed?;
        println!(
            "holder pod deleted -> next Held: {}  | operator's pod GETs per handoff: {:.2} from the deletion to the \
             next Held, {:.2} with the next claim's first sight",
            pods.latency.summary(),
            pods.gets_timed,
            pods.gets_all
        );
        println!(
            "  its first part, the pod's deletion until the bench's watch saw it gone: {}",
            pods.gone_seen.summary()
        );
        println!("{}", server_part.per(&start, pods.latency.0.len(), "pod handoff (setup included)"));
        println!(
            "pod path's floor with ZooKeeper's release after the final status (every write of zklock's path, in \
             its order), in batches of {batch} alternating with zklock's: {}; zklock / that floor: p50 {:.2}; batch \
             by batch {}, median {:.2}",
            released.summary(),
            pods.latency.percentile(0.5).as_secs_f64() / released.percentile(0.5).as_secs_f64(),
            ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
            median(&ratios)
        );
        println!("  its first part, the pod's deletion until seen gone: {}", floor_gone_seen.summary());
        drop(bench);
        let floor = handoff_floor(&client, &server, held, sizes.pod_rounds, FloorStart::PodDeleted).await?;
        println!(
            "pod path's floor (the holder pod's delete seen on a watch, the holder's final status and the next \
             claim's Held written and seen, by the bench alone): {}; zklock / floor: p50 {:.2}",
            floor.summary(),
            pods.latency.percentile(0.5).as_secs_f64() / floor.percentile(0.5).as_secs_f64()
        );
    }
    if runs("gated") {
        // As the pods part: zklock's rounds alternate batch by batch with the floor of every
        // write of their path.
        let bench = Bench::start(&client, &server, zk, "gated").await?;
        let probe = ServerProbe::new(&client, &server);
        let batch = sizes.handoffs.div_ceil(BATCHES).max(1);
        let start = probe.sample().await;
        let mut server_part = start.clone();
        let before = probe.sample().await;
        let (mut gated, mut writes, held) = bench.gated_handoffs(0, batch.min(sizes.handoffs)).await?;
        server_part.add(&before, &probe.sample().await);
        let mut floor = Floor::open(&client, &server, Some(zk), held, FloorStart::GatedPodFinished).await?;
        let first = gated.clone();
        let measured = floor
            .alternate(&first, sizes.handoffs, batch, async |done, n| {
                let before = probe.sample().await;
                let (rounds, round_writes, _) = bench.gated_handoffs(done, n).await?;
                server_part.add(&before, &probe.sample().await);
                writes = weighted(done, rounds.0.len())(writes, round_writes);
                gated.0.extend(rounds.0.iter().copied());
                Ok(rounds)
            })
            .await;
        let closed = floor.close().await;
        let (floor_samples, finish_seen, ratios) = measured?;
        closed?;
        println!("gated pod finished -> next gated pod ungated: {}  | API writes/handoff {writes:.2}", gated.summary());
        println!("{}", server_part.per(&start, gated.0.len(), "gated handoff (setup included)"));
        println!(
            "gated path's floor (the holder pod marked Succeeded and seen so, its claim's final status, ZooKeeper's \
             release, the next claim's Held, the next pod's gate removed and seen gone: every write of zklock's path, \
             in its order), in batches of {batch} alternating with zklock's: {}; zklock / that floor: p50 {:.2}; \
             batch by batch {}, median {:.2}",
            floor_samples.summary(),
            gated.percentile(0.5).as_secs_f64() / floor_samples.percentile(0.5).as_secs_f64(),
            ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
            median(&ratios)
        );
        println!("  its first part, the pod marked Succeeded until seen so: {}", finish_seen.summary());
    }
    if runs("throughput") {
        throughput(&client, &server, zk, &sizes).await?;
    }
    if runs("clusters") {
        clusters(&client, &server, zk, &sizes).await?;
    }
    if runs("failover") {
        for &claims in &sizes.failover_claims {
            failover(&client, &server, zk, claims).await?;
        }
    }
    if runs("locks") {
        lock_statuses(&client, &server, zk, sizes.status_locks).await?;
    }
    if runs("scale") {
        scale(&client, &server, zk, sizes.scale_claims).await?;
    }
    if runs("memory") {
        let bench = Bench::start(&client, &server, zk, "memory").await?;
        let (per_claim, total) = bench.memory(sizes.memory_claims).await?;
        println!(
            "operator memory at {} claims: {:.0} bytes per claim, {:.1} MiB total RSS",
            sizes.memory_claims,
            per_claim,
            total as f64 / 1048576.0
        );
    }
    Ok(())
}

async fn handoffs(
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
    drop(bench);
    println!("handoff at {waiters:>4} waiters: {}", side.zklock.summary());
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
struct SideBySide {
    zklock: HandoffResult,
    floor: Samples,
    /// Handoffs per batch.
    batch: usize,
    /// Each batch's p50 over its floor batch's p50 (the floor's batch right after zklock's).
    ratios: Vec<f64>,
}

/// Batches a side-by-side run is cut into.
const BATCHES: usize = 5;

/// `handoffs` handoffs of `bench`'s operator at `waiters` waiters, in [`BATCHES`] batches, each
/// followed by as many rounds of the floor with ZooKeeper's release
/// (`FloorStart::ClaimDeletedThenReleasedThenGone`): both meet the machine as it is at that
/// moment, as the clusters part interleaves its handoffs round by round.
async fn alternating(
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

/// The mean of a per-round figure over `n` rounds (figure `a`) and `m` more (figure `b`).
fn weighted(n: usize, m: usize) -> impl Fn(f64, f64) -> f64 {
    let (n, m) = (n as f64, m as f64);
    move |a, b| if n + m > 0.0 { (a * n + b * m) / (n + m) } else { 0.0 }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Handoffs on a `ClusterLock` two clusters share: within cluster a (holder and next both a's),
/// within cluster b, from a to b (the holder deleted in a, the next claim seen Held in b), interleaved round by
/// round so that both meet the same machine; then a→b again with `ZOOKEEPER_LATENCY` added to
/// every request of b's operator (b in another region).
async fn clusters(
    client_a: &kube::Client,
    server_a: &Server,
    zk: &zklock_testkit::ZkServer,
    sizes: &Sizes,
) -> Result<(), Error> {
    const ZOOKEEPER_LATENCY: Duration = Duration::from_millis(20);
    let kubeconfig_b = zklock_testkit::kube::private_control_plane("bench-b");
    let config = kube::config::Kubeconfig::read_from(kubeconfig_b)?;
    let config = kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default()).await?;
    let client_b = zklock::client::builder(config)?.build();
    install_crd(&client_b).await?;
    let server_b = Server { kubeconfig: kubeconfig_b.to_path_buf(), finalizer_policy: server_a.finalizer_policy };
    let connect = zk.chroot().await;
    let chroot = &connect[connect.find('/').ok_or("a chroot")?..];
    let proxy = zklock_testkit::proxy::Proxy::start(zk.addr()).await;
    let shared = |root: &'static str, name: &'static str| {
        ["--zk-root", root, "--zk-cluster-root", "/shared", "--cluster-name", name, "--zk-session-timeout", "10s"]
    };
    let mut a = Bench::start_with(client_a, server_a, &connect, "clusters-a", &shared("/a", "a")).await?;
    let b = Bench::start_with(&client_b, &server_b, &proxy.connect_string(chroot), "clusters-b", &shared("/b", "b"))
        .await?;
    let name = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    for client in [client_a, &client_b] {
        let lock: ClusterLock = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "ClusterLock",
            "metadata": {"name": name}, "spec": {"namespaceSelector": {}},
        }))?;
        Api::<ClusterLock>::all(client.clone()).create(&PostParams::default(), &lock).await?;
    }
    let lock = format!("cluster/{name}");
    let mut round = 0;
    // One handoff: a holder made in a and Held, the next claim made in `next` and Waiting, the
    // holder deleted, the next one awaited Held on `next`'s watch.
    let mut handoff = async |first: &Bench, next: &Bench| -> Result<Duration, Error> {
        round += 1;
        let (holder, waiter) = (format!("h{round}"), format!("w{round}"));
        first.create(&holder, &lock, None).await?;
        first.wait_phase(&holder, Phase::Held).await?;
        next.create(&waiter, &lock, None).await?;
        next.wait_phase(&waiter, Phase::Waiting).await?;
        let (seen, follower) = next.follow();
        let start = Instant::now();
        first.claims.delete(&holder, &DeleteParams::default()).await?;
        tokio::time::timeout(Duration::from_secs(120), seen.wait(|sets| sets.0.contains(&waiter)))
            .await
            .map_err(|_| format!("{waiter} not Held within 120 s"))?;
        let took = start.elapsed();
        follower.abort();
        next.claims.delete(&waiter, &DeleteParams::default()).await?;
        next.wait_gone(&waiter).await?;
        Ok(took)
    };
    let (mut within, mut within_b, mut across, mut slow) =
        (Samples::default(), Samples::default(), Samples::default(), Samples::default());
    for _ in 0..sizes.handoffs {
        within.push(handoff(&a, &a).await?);
        within_b.push(handoff(&b, &b).await?);
        across.push(handoff(&a, &b).await?);
    }
    proxy.set_latency(ZOOKEEPER_LATENCY);
    for _ in 0..sizes.handoffs {
        slow.push(handoff(&a, &b).await?);
    }
    proxy.set_latency(Duration::ZERO);

    // A leader change in cluster a (SIGTERM with a standby running, as a `helm upgrade` does)
    // while a's claim holds, b's waits behind it and a's second waits behind that: how long to
    // the Lease and to ready, whether any place (node) or holder's token changed, and the first
    // handoff after it (a's holder deleted → b's waiter Held).
    let zk_client = zookeeper_client::Client::connect(&connect).await?;
    let dir = format!("/shared/locks/{name}");
    let (mut to_lead, mut to_ready, mut first_grant) = (Samples::default(), Samples::default(), Samples::default());
    let (mut places_changed, mut holds_changed) = (0usize, 0usize);
    let changes = sizes.handoffs.clamp(3, 10);
    let held_token = |c: LockClaim| {
        let status = c.status.unwrap_or_default();
        (status.phase == Some(Phase::Held)).then_some(status.fencing_token).flatten()
    };
    for i in 0..changes {
        let (holder, wb, wa) = (format!("lc{i}-h"), format!("lc{i}-wb"), format!("lc{i}-wa"));
        a.create(&holder, &lock, None).await?;
        a.wait_phase(&holder, Phase::Held).await?;
        b.create(&wb, &lock, None).await?;
        b.wait_phase(&wb, Phase::Waiting).await?;
        a.create(&wa, &lock, None).await?;
        a.wait_phase(&wa, Phase::Waiting).await?;
        let token = held_token(a.claims.get(&holder).await?);
        let mut before = zk_client.get_children(&dir).await?.0;
        before.sort();
        let standby = a.standby().await?;
        let (led, ready) = a.hand_over(standby).await?;
        to_lead.push(led);
        to_ready.push(ready);
        let mut after = zk_client.get_children(&dir).await?.0;
        after.sort();
        places_changed += before.iter().filter(|node| !after.contains(node)).count();
        if token.is_none() || held_token(a.claims.get(&holder).await?) != token {
            holds_changed += 1;
        }
        let (seen, follower) = b.follow();
        let start = Instant::now();
        a.claims.delete(&holder, &DeleteParams::default()).await?;
        tokio::time::timeout(Duration::from_secs(120), seen.wait(|sets| sets.0.contains(&wb)))
            .await
            .map_err(|_| format!("{wb} not Held within 120 s of {holder}'s deletion after a leader change"))?;
        first_grant.push(start.elapsed());
        follower.abort();
        for (bench, claim) in [(&b, &wb), (&a, &wa)] {
            bench.claims.delete(claim, &DeleteParams::default()).await?;
            bench.wait_gone(claim).await?;
        }
    }
    println!("ClusterLock handoff within cluster a: {}", within.summary());
    println!("ClusterLock handoff within cluster b: {}", within_b.summary());
    println!("ClusterLock handoff from a to b:      {}", across.summary());
    println!(
        "ClusterLock handoff from a to b, {} ms added to each ZooKeeper request of b's operator: {}",
        ZOOKEEPER_LATENCY.as_millis(),
        slow.summary()
    );
    println!(
        "handoff p50 ratio across clusters vs within one: {:.2}; with b {} ms from ZooKeeper: {:.2}",
        across.percentile(0.5).as_secs_f64() / within.percentile(0.5).as_secs_f64(),
        ZOOKEEPER_LATENCY.as_millis(),
        slow.percentile(0.5).as_secs_f64() / within.percentile(0.5).as_secs_f64()
    );
    println!(
        "ClusterLock leader change in cluster a (SIGTERM, a standby running), {changes} times: the standby leads \
         after {}, is re-anchored and ready after {}; places (nodes) changed: {places_changed}, holders or tokens \
         changed: {holds_changed}",
        to_lead.summary(),
        to_ready.summary()
    );
    println!(
        "ClusterLock handoff from a to b, the first after a's leader change: {} (ratio to the handoff from a to b: {:.2})",
        first_grant.summary(),
        first_grant.percentile(0.5).as_secs_f64() / across.percentile(0.5).as_secs_f64()
    );
    Ok(())
}

/// The permits of the semaphore lock the handoff benchmark measures next to a mutex.
const SEMAPHORE_PERMITS: usize = 3;

/// A claim's phase, fencing token, and the leader epoch of its last status write.
type Seen3 = (Option<Phase>, Option<String>, Option<i64>);

/// What a watch of the bench's namespace says of each claim.
#[derive(Default)]
struct Claims {
    state: std::sync::Mutex<HashMap<String, Seen3>>,
    changed: tokio::sync::Notify,
}

impl Claims {
    fn follow(api: Api<LockClaim>) -> (Arc<Claims>, tokio::task::JoinHandle<()>) {
        let claims = Arc::new(Claims::default());
        let seen = claims.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(event) = stream.next().await {
                let mut state = seen.state.lock().unwrap_or_else(|p| p.into_inner());
                match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                        let status = c.status.unwrap_or_default();
                        state.insert(
                            c.metadata.name.unwrap_or_default(),
                            (status.phase, status.fencing_token, status.leader_epoch),
                        );
                    }
                    Ok(watcher::Event::Delete(c)) => {
                        state.remove(&c.metadata.name.unwrap_or_default());
                    }
                    _ => continue,
                }
                drop(state);
                seen.changed.notify_waiters();
            }
        });
        (claims, task)
    }

    /// Waits until `done` holds of the claims seen, at most `limit`; answers when it did.
    async fn until(&self, limit: Duration, done: impl Fn(&HashMap<String, Seen3>) -> bool) -> Option<Instant> {
        tokio::time::timeout(limit, notified_until(&self.changed, &self.state, done)).await.ok()
    }

    fn snapshot(&self) -> HashMap<String, Seen3> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A leader change under load: `claims` claims queued ten per lock, a standby ready, then the
/// leader stopped gracefully (SIGTERM, as `helm upgrade` does) and, with a new standby, killed
/// (SIGKILL, a node lost). At the signal a holder is deleted and a claim is made on a free lock,
/// as users would meanwhile. Times from the signal: the standby leads; the released lock's next
/// claim is Held; the new claim is Held; every claim carries the new leader's epoch (re-stamped).
/// Also what the takeover cost (the new leader's API calls and ZooKeeper writes until every
/// claim was re-stamped) and whether any other holder or token changed.
/// Holder pods deleted at the start of each failover round's new term.
const FIRST_SECOND_PODS: usize = 20;

async fn failover(
    client: &kube::Client,
    server: &Server,
    zk: &zklock_testkit::ZkServer,
    claims: usize,
) -> Result<(), Error> {
    let locks = (claims / 10).max(1);
    let mut bench = Bench::start(client, server, zk, &format!("failover-{claims}")).await?;
    let (watched, follower) = Claims::follow(bench.claims.clone());
    let names: Vec<(String, String)> =
        (0..claims).map(|i| (format!("f{}-{}", i % locks, i / locks), format!("fo-{}", i % locks))).collect();
    let created: Vec<Result<(), Error>> = futures::stream::iter(names.iter())
        .map(|(name, lock)| bench.create(name, lock, None))
        .buffer_unordered(32)
        .collect()
        .await;
    for r in created {
        r?;
    }
    // For each round, holders whose pods go in the new term's first second: a lock of its own
    // each, its holder naming a pod, one claim waiting behind it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &bench.ns);
    for round in 0..2 {
        for k in 0..FIRST_SECOND_PODS {
            pods.create(&PostParams::default(), &unscheduled_pod(&format!("hp{round}-{k}"))?).await?;
            bench
                .create(&format!("hpc{round}-{k}"), &format!("hpl{round}-{k}"), Some(&format!("hp{round}-{k}")))
                .await?;
        }
        for k in 0..FIRST_SECOND_PODS {
            bench.create(&format!("hpw{round}-{k}"), &format!("hpl{round}-{k}"), None).await?;
        }
    }
    let total = claims + 4 * FIRST_SECOND_PODS;
    let queued = |s: &HashMap<String, Seen3>| {
        s.values().filter(|(p, _, _)| matches!(p, Some(Phase::Held | Phase::Waiting))).count() >= total
    };
    watched
        .until(Duration::from_secs(60 + claims as u64 / 20), queued)
        .await
        .ok_or(format!("{claims} claims not all queued"))?;
    for (round, signal) in ["TERM", "KILL"].into_iter().enumerate() {
        let standby = bench.standby().await?;
        let before = watched.snapshot();
        let epoch_before = before.values().filter_map(|(_, _, e)| *e).max().unwrap_or(0);
        let lock = format!("f{round}-");
        let holder = before
            .iter()
            .find(|(name, (phase, _, _))| name.starts_with(&lock) && *phase == Some(Phase::Held))
            .map(|(name, _)| name.clone())
            .ok_or(format!("no holder of fo-{round}"))?;
        let fresh = format!("new-{}", signal.to_lowercase());
        let counters = |m: String| async move {
            let calls = metric_at(&m, "zklock_kubernetes_calls_total").await;
            let writes = metric_at(&m, "zklock_kubernetes_writes_total").await;
            let zk = metric_at(&m, "zklock_zookeeper_operations_total{op=\"create\"}").await
                + metric_at(&m, "zklock_zookeeper_operations_total{op=\"delete\"}").await;
            (calls, writes, zk)
        };
        let cost_before = counters(standby.1.clone()).await;
        let start = Instant::now();
        let killed = Command::new("kill").args([&format!("-{signal}"), &bench.operator.id().to_string()]).status()?;
        if !killed.success() {
            return Err(format!("kill -{signal} of the leader failed").into());
        }
        let mut old = std::mem::replace(&mut bench.operator, standby.0);
        // Reaped whenever it ends (a graceful stop takes a moment), whatever happens here.
        let reaped = tokio::task::spawn_blocking(move || {
            let _ = old.wait();
        });
        bench.metrics = standby.1;
        bench.claims.delete(&holder, &DeleteParams::default()).await?;
        bench.create(&fresh, &format!("free-{}", signal.to_lowercase()), None).await?;
        let limit = Duration::from_secs(120);
        let leads = async {
            let deadline = Instant::now() + limit;
            while bench.metric("zklock_leader").await < 1.0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (Instant::now() < deadline).then(Instant::now)
        };
        let next_held = watched.until(limit, |s| {
            s.iter().any(|(n, (p, _, _))| n.starts_with(&lock) && *n != holder && *p == Some(Phase::Held))
        });
        let fresh_held = watched.until(limit, |s| s.get(&fresh).is_some_and(|(p, _, _)| *p == Some(Phase::Held)));
        // The pod path in the term's first second: the holder pods deleted the moment the
        // standby says it leads, each waiter's Held timed from there.
        let first_second = async {
            let deadline = Instant::now() + limit;
            while bench.metric("zklock_leader").await < 1.0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let deleted = Instant::now();
            let deletes = (0..FIRST_SECOND_PODS).map(|k| {
                let pods = pods.clone();
                async move { pods.delete(&format!("hp{round}-{k}"), &DeleteParams::default().grace_period(0)).await }
            });
            for result in futures::future::join_all(deletes).await {
                result?;
            }
            let mut held: HashMap<usize, Duration> = HashMap::new();
            while held.len() < FIRST_SECOND_PODS && Instant::now() < deadline {
                let now = watched.snapshot();
                for k in 0..FIRST_SECOND_PODS {
                    let waiter = format!("hpw{round}-{k}");
                    if !held.contains_key(&k) && now.get(&waiter).is_some_and(|(p, _, _)| *p == Some(Phase::Held)) {
                        held.insert(k, deleted.elapsed());
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, Error>(held.into_values().collect::<Vec<_>>())
        };
        let restamped = watched.until(Duration::from_secs(300), |s| {
            s.values().all(|(_, _, e)| e.is_some_and(|e| e > epoch_before)) && s.len() >= claims
        });
        let (led, next, new, all, pod_path) = tokio::join!(leads, next_held, fresh_held, restamped, first_second);
        let mut pod_path = pod_path?;
        pod_path.sort();
        let cost_after = counters(bench.metrics.clone()).await;
        let _ = reaped.await;
        let after = watched.snapshot();
        // Holders other than the released lock's keep their grant and token.
        let changed = before
            .iter()
            .filter(|(name, (phase, _, _))| *phase == Some(Phase::Held) && !name.starts_with(&lock))
            .filter(|(name, _)| {
                !name.starts_with(&format!("hpc{round}-")) && !name.starts_with(&format!("hpw{round}-"))
            })
            .filter(|(name, (_, token, _))| {
                after.get(*name).is_none_or(|(p, t, _)| *p != Some(Phase::Held) || t != token)
            })
            .count();
        let secs = |t: Option<Instant>| {
            t.map_or("not within the limit".to_string(), |t| format!("{:.2} s", (t - start).as_secs_f64()))
        };
        let kind = if signal == "TERM" {
            "graceful (SIGTERM, a standby running)"
        } else {
            "crash (SIGKILL, a standby running)"
        };
        println!(
            "failover at {claims} claims ({locks} locks), {kind}: leads {}, the released lock's next claim Held {}, \
             a new claim on a free lock Held {}, every claim re-stamped {}; the takeover's API calls {:.0} (writes \
             {:.0}), ZooKeeper creates+deletes {:.0}; other holders or tokens changed: {changed}",
            secs(led),
            secs(next),
            secs(new),
            secs(all),
            cost_after.0 - cost_before.0,
            cost_after.1 - cost_before.1,
            cost_after.2 - cost_before.2,
        );
        let quantile = |q: f64| {
            let i = ((pod_path.len() as f64 * q).ceil() as usize).saturating_sub(1);
            pod_path.get(i).map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64()))
        };
        println!(
            "failover at {claims} claims, {kind}: {FIRST_SECOND_PODS} holder pods deleted as the new leader leads, \
             their next claims Held: p50 {} p99 {} ({} of {FIRST_SECOND_PODS} within the limit; goal p99 <= 1 s)",
            quantile(0.5),
            quantile(0.99),
            pod_path.len(),
        );
    }
    follower.abort();
    Ok(())
}

/// `claims` claims in `claims / 100` namespaces of their own, ten claims per lock (one holder,
/// nine waiting), served by one operator for every namespace (the Lease and the epoch parameter
/// in a namespace of their own, the policies bound to every bench namespace). Measures: the
/// claims created (32 at once) and queued; the operator's memory per claim then; a fresh
/// operator started on them (the first one stopped): listed, leading, ready (re-anchored), and
/// the API server's CPU for that start; its memory per claim; and the handoff at this size beside
/// its floor (the holder deleted, its final status, the next Held, by the bench alone).
async fn scale(
    client: &kube::Client,
    server: &Server,
    zk: &zklock_testkit::ZkServer,
    claims: usize,
) -> Result<(), Error> {
    // Its operator serves every namespace: claims left by another run would be served and
    // counted with this run's.
    let foreign = Api::<LockClaim>::all(client.clone()).list_metadata(&ListParams::default().limit(1)).await?;
    if let Some(claim) = foreign.items.first() {
        return Err(format!(
            "the scale part runs alone, and the control plane holds claims already ({}/{}, …): \
             run it on a control plane of its own (without ZKLOCK_TEST_KUBECONFIG, one is started)",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        )
        .into());
    }
    let run = uuid::Uuid::new_v4().simple().to_string()[..6].to_string();
    let per_namespace = 100;
    let spaces = claims.div_ceil(per_namespace);
    let home = format!("bench-scale-{run}");
    let names: Vec<String> = (0..spaces).map(|i| format!("bench-scale-{run}-{i}")).collect();
    let namespaces = Api::<Namespace>::all(client.clone());
    futures::stream::iter(std::iter::once(&home).chain(&names))
        .map(|name| {
            let namespaces = namespaces.clone();
            async move {
                let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
                Ok::<_, Error>(namespaces.create(&PostParams::default(), &namespace).await?)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    install_epoch_policy_over(client, &home, &names).await?;
    if server.finalizer_policy {
        install_finalizer_policy_over(client, &names, &format!("scale-{run}")).await?;
    }
    let launch = Launch { server: server.clone(), zk: zk.chroot().await, extra: vec![] };
    let measured = scale_measure(client, server, &launch, &home, &names, claims).await;
    let cleaned = scale_cleanup(client, &launch, &home, &format!("bench-scale-{run}-"), claims).await;
    measured.and(cleaned)
}

/// How long the scale part leaves an operator that has queued every claim alone before it reads
/// its memory a second time.
const SETTLE: Duration = Duration::from_secs(15);

/// The measuring of [`scale`] on its namespaces `names`, with the Lease in `home`.
async fn scale_measure(
    client: &kube::Client,
    server: &Server,
    launch: &Launch,
    home: &str,
    names: &[String],
    claims: usize,
) -> Result<(), Error> {
    let spaces = names.len();
    let (home, launch) = (home.to_string(), launch.clone());
    let (operator, metrics) = launch.spawn_serving(&home, None)?;
    let mut bench = Bench {
        client: client.clone(),
        claims: Api::namespaced(client.clone(), &home),
        ns: home.clone(),
        operator,
        metrics,
        launch,
    };
    bench.until_ready(&bench.metrics, true).await?;
    let empty = rss(bench.operator.id())?;

    // Claim i: namespace i % spaces, lock (i / spaces) % 10 of it: made round robin, so that every
    // namespace and lock fills at once.
    let place = |i: usize| (names[i % spaces].clone(), format!("l{}", (i / spaces) % 10), format!("c{i}"));
    let started = Instant::now();
    futures::stream::iter(0..claims)
        .map(|i| {
            let (ns, lock, name) = place(i);
            let api: Api<LockClaim> = Api::namespaced(client.clone(), &ns);
            async move {
                let claim: LockClaim = serde_json::from_value(json!({
                    "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
                    "metadata": {"name": name}, "spec": {"lockName": lock}
                }))?;
                Ok::<_, Error>(api.create(&PostParams::default(), &claim).await?)
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created_in = started.elapsed();
    let queued = |metrics: String| async move {
        metric_at(&metrics, "zklock_claims{phase=\"Held\"}").await
            + metric_at(&metrics, "zklock_claims{phase=\"Waiting\"}").await
    };
    let deadline = Instant::now() + Duration::from_secs(120 + claims as u64 / 10);
    while queued(bench.metrics.clone()).await < claims as f64 {
        if Instant::now() > deadline {
            return Err(format!(
                "the operator counts only {} of {claims} claims queued",
                queued(bench.metrics.clone()).await
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let queued_in = started.elapsed();
    // Twice: the moment the last claim is queued (the creation burst's buffers and the pages
    // the allocator has not purged yet still counted), and after SETTLE with nothing asked of it
    // (what it holds to serve them).
    let serving = rss(bench.operator.id())?;
    tokio::time::sleep(SETTLE).await;
    let settled = rss(bench.operator.id())?;
    // Every claim of the run as a watch of all namespaces has it (names are unique in the run).
    let (watched, follower) = Claims::follow(Api::all(client.clone()));
    let seen_all = |s: &HashMap<String, Seen3>| s.values().filter(|(p, _, _)| p.is_some()).count() >= claims;
    watched.until(Duration::from_secs(120), seen_all).await.ok_or("the bench's watch did not list every claim")?;
    let epoch_before = watched.snapshot().values().filter_map(|(_, _, e)| *e).max().unwrap_or(0);

    // A fresh operator on them: the first stopped (its Lease let go), then the new one started.
    let probe = ServerProbe::new(client, server);
    Command::new("kill").args(["-TERM", &bench.operator.id().to_string()]).status()?;
    let stopped = Instant::now() + Duration::from_secs(60);
    while bench.operator.try_wait()?.is_none() {
        if Instant::now() > stopped {
            return Err("the first operator did not stop within 60 s of SIGTERM".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = probe.sample().await;
    let start = Instant::now();
    let (operator, metrics) = bench.launch.spawn_serving(&home, None)?;
    bench.operator = operator;
    bench.metrics = metrics;
    let (mut listed, mut leading, mut ready) = (None, None, None);
    let deadline = Instant::now() + Duration::from_secs(120 + claims as u64 / 20);
    while ready.is_none() {
        if Instant::now() > deadline {
            return Err(format!("a fresh operator on {claims} claims was not ready within the deadline").into());
        }
        let m = bench.metrics.clone();
        if listed.is_none() && metric_at(&m, "zklock_claims_watched").await >= claims as f64 {
            listed = Some(start.elapsed());
        }
        if leading.is_none() && metric_at(&m, "zklock_leader").await >= 1.0 {
            leading = Some(start.elapsed());
        }
        if leading.is_some() && get_at(&m, "/readyz").await.is_some_and(|b| b.trim() == "ready") {
            ready = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start_cpu = probe.sample().await.apiserver_cpu_since(&before);
    let restarted = rss(bench.operator.id())?;
    // Every claim's status re-stamped with the new term's epoch: the start's work is done.
    let restamped = watched
        .until(Duration::from_secs(120 + claims as u64 / 20), |s| {
            s.values().filter(|(_, _, e)| e.is_some_and(|e| e > epoch_before)).count() >= claims
        })
        .await
        .map(|t| t - start);
    let restamp_cpu = probe.sample().await.apiserver_cpu_since(&before);
    follower.abort();
    tokio::time::sleep(SETTLE).await;
    let restarted_settled = rss(bench.operator.id())?;

    // The handoff at this size: the holder of one lock of the first namespace deleted, the
    // next claim of that lock Held, as a watch of that namespace sees it.
    let first: Api<LockClaim> = Api::namespaced(client.clone(), &names[0]);
    let (store, writer) = kube::runtime::reflector::store();
    let changed = Arc::new(tokio::sync::Notify::new());
    let watch = {
        let changed = changed.clone();
        let stream = kube::runtime::reflector(writer, watcher(first.clone(), watcher::Config::default()));
        tokio::spawn(stream.for_each(move |_| {
            changed.notify_waiters();
            futures::future::ready(())
        }))
    };
    let holder_of = |lock: String| {
        let (store, changed) = (store.clone(), changed.clone());
        async move {
            loop {
                let notified = changed.notified();
                let held = store.state().into_iter().find(|c| {
                    c.metadata.deletion_timestamp.is_none()
                        && c.spec.lock_name.as_deref() == Some(lock.as_str())
                        && c.status.as_ref().and_then(|s| s.phase) == Some(Phase::Held)
                });
                if let Some(c) = held {
                    return c;
                }
                notified.await;
            }
        }
    };
    // Three rounds on each of the ten locks of that namespace (ten claims each): ten samples
    // were too few to tell a run's spread from the figure.
    let rounds = 30;
    let (mut samples, mut held_status) = (Samples::default(), None);
    // The operator's own part of each handoff (from the holder's node deleted to the next
    // claim's Held written, `zklock_handoff_seconds`), to tell it from the API's.
    let inside = |metrics: String| async move {
        (
            metric_at(&metrics, "zklock_handoff_seconds_sum").await,
            metric_at(&metrics, "zklock_handoff_seconds_count").await,
        )
    };
    let inside_before = inside(bench.metrics.clone()).await;
    for round in 0..rounds {
        let lock = format!("l{}", round % 10);
        let holder = tokio::time::timeout(Duration::from_secs(120), holder_of(lock.clone()))
            .await
            .map_err(|_| format!("no holder of {lock} in {} within 120 s", names[0]))?;
        let holder_name = holder.metadata.name.clone().unwrap_or_default();
        held_status = held_status.or(holder.status.as_ref().map(serde_json::to_value).transpose()?);
        let start = Instant::now();
        first.delete(&holder_name, &DeleteParams::default()).await?;
        let next = async {
            loop {
                let c = holder_of(lock.clone()).await;
                if c.metadata.name.as_deref() != Some(holder_name.as_str()) {
                    return;
                }
                // The deleted holder, still Held in the store: wait for the next change.
                changed.notified().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(120), next)
            .await
            .map_err(|_| format!("the next claim of {lock} not Held within 120 s"))?;
        samples.push(start.elapsed());
    }
    watch.abort();
    let inside_after = inside(bench.metrics.clone()).await;
    let inside_mean = (inside_after.0 - inside_before.0) / (inside_after.1 - inside_before.1).max(1.0);
    // The operator serves every namespace: it goes before the floor's claims are made.
    stop(&mut bench.operator);
    let held_status = held_status.ok_or("no Held status was seen to copy for the floor")?;
    let floor = handoff_floor(client, server, held_status, rounds, FloorStart::ClaimDeletedThenGone).await?;

    let secs = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
    let per_claim = |total: u64| total.saturating_sub(empty) as f64 / claims as f64;
    println!(
        "scale at {claims} claims ({spaces} namespaces, {} locks): created in {:.1} s, all queued after {:.1} s \
         ({:.0} claims/s); operator memory {:.0} B/claim ({:.1} MiB RSS), {:.0} B/claim ({:.1} MiB) {} s later; a \
         fresh operator on them: listed {}, leading {}, ready {}, every claim re-stamped {}; kube-apiserver CPU to \
         ready {} ({} per 1,000 claims), to re-stamped {}; memory at ready {:.0} B/claim ({:.1} MiB), re-stamped and \
         {} s later {:.0} B/claim ({:.1} MiB); then the handoff {} (the operator's own part, from the \
         holder's node deleted to the next Held written: mean {:.1} ms) | its floor {}; zklock / floor p50 {:.2}",
        claims / 10,
        created_in.as_secs_f64(),
        queued_in.as_secs_f64(),
        claims as f64 / queued_in.as_secs_f64(),
        per_claim(serving),
        serving as f64 / 1048576.0,
        per_claim(settled),
        settled as f64 / 1048576.0,
        SETTLE.as_secs(),
        secs(listed),
        secs(leading),
        secs(ready),
        secs(restamped),
        start_cpu.map_or("-".into(), |c| format!("{c:.2} s")),
        start_cpu.map_or("-".into(), |c| format!("{:.0} ms", c * 1000.0 * 1000.0 / claims as f64)),
        restamp_cpu.map_or("-".into(), |c| format!("{c:.2} s")),
        per_claim(restarted),
        restarted as f64 / 1048576.0,
        SETTLE.as_secs(),
        per_claim(restarted_settled),
        restarted_settled as f64 / 1048576.0,
        samples.summary(),
        inside_mean * 1000.0,
        floor.summary(),
        samples.percentile(0.5).as_secs_f64() / floor.percentile(0.5).as_secs_f64(),
    );
    Ok(())
}

/// Claims per lock in the `locks` part; two of them hold (the `Lock` has two permits).
const LOCK_PART_CLAIMS: usize = 10;
/// How often the `locks` part changes each busy lock's claims: faster than a status refresh may
/// come (500 ms), as a busy lock's handoffs do.
const BUSY_TICK: Duration = Duration::from_millis(200);

/// `Lock` objects' status with `locks` of them (two permits, ten claims each) in one namespace:
/// how long until every status shows its claims; how long after a grant on a quiet lock its
/// status names the new holder; and on busy locks (a claim made on each every 200 ms for 10 s)
/// how far apart the status refreshes come, how many status writes the operator makes, and its
/// CPU.
async fn lock_statuses(
    client: &kube::Client,
    server: &Server,
    zk: &zklock_testkit::ZkServer,
    locks: usize,
) -> Result<(), Error> {
    let bench = Bench::start(client, server, zk, "locks").await?;
    let measured = lock_statuses_measure(client, server, &bench, locks).await;
    // Its claims go with the operator still serving them (their finalizers), and its Lease
    // (in the namespace) until they have: the next part must not find thousands of claims
    // served by nobody.
    let cleanup = async {
        let started = Instant::now();
        // One by one: a collection's deletion answers with every claim, and 10,000 of them
        // outlast the API server's request timeout.
        let names: Vec<String> = bench
            .claims
            .list_metadata(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        let claims = &bench.claims;
        futures::stream::iter(names)
            .map(|name| async move {
                match claims.delete(&name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    other => other.map(|_| ()),
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await?;
        let limit = Duration::from_secs(120 + (locks * LOCK_PART_CLAIMS) as u64 / 20);
        loop {
            let left = bench.claims.list_metadata(&ListParams::default().limit(1)).await?;
            if left.items.is_empty() {
                break;
            }
            if started.elapsed() > limit {
                return Err(format!("the claims of {} not gone within {limit:?}", bench.ns).into());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Api::<Namespace>::all(client.clone()).delete(&bench.ns, &DeleteParams::default()).await?;
        Ok::<_, Error>(())
    };
    let cleaned = cleanup.await;
    measured.and(cleaned)
}

/// How many of the `locks` part's queues are in creation order (a lock's claims `s<i>-c<j>`
/// were made one after another), and how many claims stand elsewhere than their creation
/// place: each lock's claims sorted by their node's sequence number. And how long after its
/// creation each claim's first status came (its `Held` condition's first transition; both
/// times in whole seconds).
async fn queue_order(claims: &Api<LockClaim>) -> Result<(usize, usize, Samples), Error> {
    // A `Lock`'s status may show a claim queued before the claim's own status does.
    let limit = Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let listed = claims.list(&ListParams::default()).await?;
        let without = listed.items.iter().filter(|c| c.status.as_ref().is_none_or(|s| s.znode.is_none())).count();
        if without == 0 {
            break listed;
        }
        if Instant::now() > limit {
            return Err(format!("{without} claims show no znode 60 s after their Locks showed them queued").into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut queues: HashMap<String, Vec<(i64, usize)>> = HashMap::new();
    let mut first_status = Samples::default();
    for claim in listed {
        let created = claim.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let held_since = claim.status.as_ref().and_then(|s| zklock::api::conditions::get(&s.conditions, "Held"));
        if let (Some(created), Some(held)) = (created, held_since) {
            let after = held.last_transition_time.0.duration_since(created);
            first_status.push(Duration::try_from(after).unwrap_or_default());
        }
        let name = claim.metadata.name.unwrap_or_default();
        let znode = claim.status.and_then(|s| s.znode).ok_or_else(|| format!("claim {name} has no znode"))?;
        let sequence: i64 = znode.rsplit("-lock-").next().and_then(|s| s.parse().ok()).ok_or("a node's sequence")?;
        let (lock, made) = name.split_once("-c").ok_or_else(|| format!("claim {name}: not s<i>-c<j>"))?;
        let made: usize = made.parse().map_err(|_| format!("claim {name}: not s<i>-c<j>"))?;
        queues.entry(lock.to_string()).or_default().push((sequence, made));
    }
    let (mut in_order, mut out_of_place) = (0, 0);
    for queue in queues.values_mut() {
        queue.sort();
        let misplaced = queue.iter().enumerate().filter(|(place, (_, made))| place != made).count();
        in_order += usize::from(misplaced == 0);
        out_of_place += misplaced;
    }
    Ok((in_order, out_of_place, first_status))
}

/// The measuring of [`lock_statuses`] in `bench`'s namespace.
async fn lock_statuses_measure(
    client: &kube::Client,
    server: &Server,
    bench: &Bench,
    locks: usize,
) -> Result<(), Error> {
    let lock_api: Api<Lock> = Api::namespaced(client.clone(), &bench.ns);
    let statuses = LockStatuses::follow(lock_api.clone());
    futures::stream::iter(0..locks)
        .map(|i| {
            let lock_api = lock_api.clone();
            async move {
                let lock: Lock = serde_json::from_value(json!({
                    "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
                    "metadata": {"name": format!("s{i}")}, "spec": {"permits": 2},
                }))?;
                Ok::<_, Error>(lock_api.create(&PostParams::default(), &lock).await?)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let probe = ServerProbe::new(client, server).with("operator", Some(bench.operator.id()));
    let before = probe.sample().await;
    let started = Instant::now();
    // A lock's claims one after the other (its queue in their names' order), 32 locks at once.
    futures::stream::iter(0..locks)
        .map(|i| async move {
            for j in 0..LOCK_PART_CLAIMS {
                bench.create(&format!("s{i}-c{j}"), &format!("s{i}"), None).await?;
            }
            Ok::<_, Error>(())
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created = started.elapsed();
    let full = |s: &zklock::api::LockStatus| s.held == 2 && s.queue_length == LOCK_PART_CLAIMS as u32 - 2;
    let settled = statuses
        .until(Duration::from_secs(120 + locks as u64 / 5), "every Lock to show 2 held and 8 queued", |all| {
            all.len() == locks && all.values().all(|h| h.last().is_some_and(|(_, s)| full(s)))
        })
        .await?;
    let after = probe.sample().await;
    let status_writes = |after: &ServerSample, before: &ServerSample| {
        after.requests.get("PATCH locks/status").copied().unwrap_or(0.0)
            - before.requests.get("PATCH locks/status").copied().unwrap_or(0.0)
    };
    println!(
        "Lock status: {locks} Locks of {LOCK_PART_CLAIMS} claims: created in {:.1} s, every status showing them \
         {:.1} s after the first claim was made; PATCH locks/status meanwhile {:.0} ({:.2} per claim)",
        created.as_secs_f64(),
        (settled - started).as_secs_f64(),
        status_writes(&after, &before),
        status_writes(&after, &before) / (locks * LOCK_PART_CLAIMS) as f64
    );

    let (in_order, out_of_place, first_status) = queue_order(&bench.claims).await?;
    let seconds = |q: f64| first_status.percentile(q).as_secs();
    println!(
        "Lock status: a claim's first status after its creation (whole seconds): p50 {} s  p99 {} s  max {} s (n={})",
        seconds(0.5),
        seconds(0.99),
        seconds(1.0),
        first_status.0.len()
    );
    let overtaken = |cause: &'static str| async move {
        bench.metric(&format!("zklock_admission_overtaken_total{{cause=\"{cause}\"}}")).await
    };
    println!(
        "Lock status: queues in creation order {in_order} of {locks} (claims out of their creation place: \
         {out_of_place}; let go ahead at the admission gate: {} after the patience of one reconciled, {} of one not \
         reconciled since seen)",
        overtaken("patience").await,
        overtaken("untried").await,
    );

    // A quiet lock: its oldest holder deleted, the next claim seen Held; then its name in the
    // Lock's status.
    let (seen, follower) = bench.follow();
    // Its list first: a holder it has not listed yet would pass for a new one.
    within("every holder", "listed", seen.wait(|sets| sets.0.len() >= 2 * locks)).await?;
    let quiet = locks.min(30);
    let mut after_grant = Samples::default();
    for i in 0..quiet {
        // The oldest holder as the status names it.
        let lock = format!("s{i}");
        let gone = statuses
            .latest(&lock)
            .and_then(|s| s.holders.into_iter().next())
            .ok_or_else(|| format!("Lock {lock} names no holder"))?;
        let prefix = format!("{lock}-c");
        let held_before: Vec<String> = {
            let sets = seen.sets.lock().unwrap_or_else(|p| p.into_inner());
            sets.0.iter().filter(|n| n.starts_with(&prefix)).cloned().collect()
        };
        bench.claims.delete(&gone, &DeleteParams::default()).await?;
        let granted = |sets: &Sets| sets.0.iter().find(|n| n.starts_with(&prefix) && !held_before.contains(n)).cloned();
        within(&lock, "granted again", seen.wait(|sets| granted(sets).is_some())).await?;
        let granted_at = Instant::now();
        let next = granted(&seen.sets.lock().unwrap_or_else(|p| p.into_inner())).unwrap_or_default();
        let shown = statuses
            .until(Duration::from_secs(30), &format!("Lock {lock} to name {next} a holder"), |all| {
                all.get(&lock).and_then(|h| h.last()).is_some_and(|(_, s)| s.holders.contains(&next))
            })
            .await?;
        after_grant.push(shown.saturating_duration_since(granted_at));
    }
    follower.abort();
    println!(
        "Lock status on a quiet lock, from the next claim seen Held to the Lock's status naming it: {}",
        after_grant.summary()
    );

    // Busy locks: a claim made on each every BUSY_TICK, so that each refresh has news to show.
    let busy: Vec<usize> = (quiet..locks).take(10).collect();
    if busy.is_empty() {
        return Ok(());
    }
    let before = probe.sample().await;
    let spell = Duration::from_secs(10);
    let begun = Instant::now();
    let mut tick = tokio::time::interval(BUSY_TICK);
    let mut made = 0;
    while begun.elapsed() < spell {
        tick.tick().await;
        futures::future::try_join_all(
            busy.iter().map(|&i| async move { bench.create(&format!("s{i}-b{made}"), &format!("s{i}"), None).await }),
        )
        .await?;
        made += 1;
    }
    let ended = Instant::now();
    let after = probe.sample().await;
    let queued = LOCK_PART_CLAIMS as u32 - 2 + made;
    let caught_up = statuses
        .until(Duration::from_secs(60), &format!("the busy locks' status to show {queued} queued"), |all| {
            busy.iter().all(|i| {
                all.get(&format!("s{i}")).and_then(|h| h.last()).is_some_and(|(_, s)| s.queue_length == queued)
            })
        })
        .await?;
    // Each busy lock's status changes during the spell: the gaps between them, the spell's
    // edges counted (a status never refreshed in it has one gap, the spell).
    let history = statuses.snapshot();
    let mut gaps = Samples::default();
    let mut longest = Samples::default();
    let mut refreshes = 0;
    for i in &busy {
        let times: Vec<Instant> = history
            .get(&format!("s{i}"))
            .map(|h| h.iter().map(|(at, _)| *at).filter(|at| *at > begun && *at < ended).collect())
            .unwrap_or_default();
        refreshes += times.len();
        let edges: Vec<Instant> = std::iter::once(begun).chain(times).chain(std::iter::once(ended)).collect();
        let these: Vec<Duration> = edges.windows(2).map(|w| w[1] - w[0]).collect();
        longest.push(these.iter().copied().max().unwrap_or_default());
        these.into_iter().for_each(|g| gaps.push(g));
    }
    let writes = status_writes(&after, &before);
    let cpu = |s: &ServerSample| s.others_cpu.first().and_then(|(_, c)| *c);
    let operator_cpu = cpu(&after).zip(cpu(&before)).map(|(a, b)| a - b);
    let secs = (ended - begun).as_secs_f64();
    println!(
        "Lock status on {} busy locks (a claim made on each every {} ms for {:.1} s): {refreshes} changes seen, \
         {:.1} per lock per s; gaps between them {}, the longest per lock p50 {:.0} ms, max {:.0} ms; the last \
         claim shown {:.0} ms after the spell; PATCH locks/status {writes:.0} ({:.1}/s); operator CPU {}",
        busy.len(),
        BUSY_TICK.as_millis(),
        secs,
        refreshes as f64 / busy.len() as f64 / secs,
        gaps.summary(),
        longest.percentile(0.5).as_secs_f64() * 1000.0,
        longest.percentile(1.0).as_secs_f64() * 1000.0,
        caught_up.saturating_duration_since(ended).as_secs_f64() * 1000.0,
        writes / secs,
        operator_cpu.map_or("not measured".into(), |c| format!("{:.0} ms/s", c * 1000.0 / secs)),
    );
    Ok(())
}

/// Every status change of the `Lock` objects a watch sees, by name, with when it was seen.
#[derive(Default)]
struct LockStatuses {
    history: std::sync::Mutex<HashMap<String, Vec<(Instant, zklock::api::LockStatus)>>>,
    changed: tokio::sync::Notify,
}

impl LockStatuses {
    fn follow(api: Api<Lock>) -> Arc<LockStatuses> {
        let statuses = Arc::new(LockStatuses::default());
        let following = statuses.clone();
        tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default()).default_backoff().applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(lock) = stream.next().await {
                let lock = match lock {
                    Ok(lock) => lock,
                    Err(e) => {
                        eprintln!("the bench's watch of Lock objects failed (retrying): {e}");
                        continue;
                    }
                };
                let (Some(name), Some(status)) = (lock.metadata.name, lock.status) else { continue };
                let mut history = following.history.lock().unwrap_or_else(|p| p.into_inner());
                let of = history.entry(name).or_default();
                if of.last().is_none_or(|(_, last)| *last != status) {
                    of.push((Instant::now(), status));
                    drop(history);
                    following.changed.notify_waiters();
                }
            }
        });
        statuses
    }

    /// The status of `Lock` `name` last seen.
    fn latest(&self, name: &str) -> Option<zklock::api::LockStatus> {
        let history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        history.get(name).and_then(|h| h.last()).map(|(_, status)| status.clone())
    }

    fn snapshot(&self) -> HashMap<String, Vec<(Instant, zklock::api::LockStatus)>> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits at most `limit` until `done`; answers when it was seen.
    async fn until(
        &self,
        limit: Duration,
        what: &str,
        done: impl Fn(&HashMap<String, Vec<(Instant, zklock::api::LockStatus)>>) -> bool,
    ) -> Result<Instant, Error> {
        let wait = notified_until(&self.changed, &self.history, done);
        tokio::time::timeout(limit, wait).await.map_err(|_| format!("waited {limit:?} for {what}").into())
    }
}

/// Not timed, after a run of [`scale`] that measured or failed: the namespaces named
/// `prefix…` go, their claims finalized by an operator started for it (the finalizer is its; a
/// namespace deleted with none stays Terminating, and the next run's operator, which serves
/// every namespace, would serve its claims), then the operator and its `home`.
async fn scale_cleanup(
    client: &kube::Client,
    launch: &Launch,
    home: &str,
    prefix: &str,
    claims: usize,
) -> Result<(), Error> {
    let (mut operator, _) = launch.spawn_serving(home, None)?;
    let namespaces = Api::<Namespace>::all(client.clone());
    let ours = || async {
        let listed = namespaces.list_metadata(&ListParams::default()).await?;
        Ok::<_, Error>(
            listed
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .filter(|n| n.starts_with(prefix))
                .collect::<Vec<_>>(),
        )
    };
    for ns in ours().await? {
        namespaces.delete(&ns, &DeleteParams::default()).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120 + claims as u64 / 20);
    let mut left = ours().await?;
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        left = ours().await?;
    }
    stop(&mut operator);
    namespaces.delete(home, &DeleteParams::default()).await?;
    match left.first() {
        Some(ns) => {
            Err(format!("{} of the scale run's namespaces ({ns}, …) not gone within the deadline", left.len()).into())
        }
        None => Ok(()),
    }
}

async fn throughput(
    client: &kube::Client,
    server: &Server,
    zk: &zklock_testkit::ZkServer,
    sizes: &Sizes,
) -> Result<(), Error> {
    let bench = Bench::start(client, server, zk, "throughput").await?;
    // One claim at a time first: what a user waits for on an idle lock.
    let alone = bench.lifecycles(sizes.lifecycles).await?;
    println!("uncontended claim created -> Held, one at a time: {}", alone.summary());
    let probe = ServerProbe::new(client, server)
        .with("zklock", Some(bench.operator.id()))
        .with("ZooKeeper", zk.java_pid())
        .with("the bench", Some(std::process::id()));
    // ZooKeeper's JVM compiles its hot paths over its first thousands of requests: a round over
    // the same locks first, not measured, as a ZooKeeper that has served for days would be (3.75
    // → 2.93 ms of its CPU per lifecycle from a first round of 1,000 to the second, in one run).
    // The measured rounds take each lock again (within 30 s, so that its directory is kept: a
    // lock's first use makes it, 30 s idle remove it, and those writes would fall into the
    // floor's batches). A slow run can exceed that: the engine's `directory_removed` in the
    // requests line then says how often.
    let warm_up = Instant::now();
    bench.throughput("warm-", 0..sizes.locks, 32).await?;
    println!("(a round of {} lifecycles first, not measured: {:.1} s)", sizes.locks, warm_up.elapsed().as_secs_f64());
    // zklock's lifecycles and the floor's alternate in batches, so that both meet the machine as
    // it is at that moment: the same four requests cost kube-apiserver 11.6–14.7 ms from one run
    // to the next, which was most of the ratio's spread when the floor came after.
    let per_batch = sizes.locks.div_ceil(BATCHES).max(1);
    let zk_before = (zk.requests_received(), bench.zk_operations().await);
    let start = probe.sample().await;
    let (mut ours_part, mut floor_part) = (start.clone(), start.clone());
    let (mut ours_time, mut floor_time) = (0.0, 0.0);
    let (mut loaded, mut held, mut done) = (Samples::default(), None, 0);
    // The floor's namespace and its watch, made once the first Held status is there to copy.
    let mut unserved: Option<(String, Api<LockClaim>, tokio::task::JoinHandle<()>)> = None;
    let measured = async {
        for batch in 0.. {
            let n = per_batch.min(sizes.locks - done);
            if n == 0 {
                break;
            }
            let before = probe.sample().await;
            let (rate, latency, status) = bench.throughput(&format!("b{batch}-"), done..done + n, 32).await?;
            ours_part.add(&before, &probe.sample().await);
            ours_time += n as f64 / rate;
            loaded.0.extend(latency.0);
            held = held.or(status);
            let copy = held.as_ref().ok_or("no Held status was seen to copy for the floor")?;
            if unserved.is_none() {
                let (ns, claims) = unserved_namespace(client, server, copy, "bench-floor").await?;
                let watch = watcher(claims.clone(), watcher::Config::default()).default_backoff().for_each(|event| {
                    if let Err(e) = event {
                        eprintln!("the floor's watch failed (retrying): {e}");
                    }
                    futures::future::ready(())
                });
                unserved = Some((ns, claims, tokio::spawn(watch)));
            }
            let Some((_, claims, _)) = &unserved else { return Err("the floor's namespace was not made".into()) };
            let before = probe.sample().await;
            let rate = floor(claims, server, copy, &format!("b{batch}-"), n, 32).await?;
            floor_part.add(&before, &probe.sample().await);
            floor_time += n as f64 / rate;
            done += n;
        }
        Ok::<_, Error>(())
    }
    .await;
    let closed = match unserved {
        Some((ns, _, watch)) => {
            watch.abort();
            Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await.map(|_| ())
        }
        None => Ok(()),
    };
    measured?;
    closed?;
    let zk_after = (zk.requests_received(), bench.zk_operations().await);
    let (ours, floor_rate) = (sizes.locks as f64 / ours_time, sizes.locks as f64 / floor_time);
    println!("uncontended claim created -> Held, 32 at once: {}", loaded.summary());
    println!("{}", ours_part.per(&start, sizes.locks, "claim lifecycle"));
    let n = sizes.locks as f64;
    let engine: Vec<String> = zk_after
        .1
        .iter()
        .map(|(op, v)| (op, (v - zk_before.1.get(op).copied().unwrap_or(0.0)) / n))
        .filter(|(_, v)| *v >= 0.005)
        .map(|(op, v)| format!("{op} {v:.2}"))
        .collect();
    let served = match (zk_before.0, zk_after.0) {
        (Some(b), Some(a)) => format!("{:.2}", a.saturating_sub(b) as f64 / n),
        _ => "not read".into(),
    };
    println!(
        "ZooKeeper requests per claim lifecycle: {served} received by the server (the engine's: {})",
        engine.join(", ")
    );
    println!("{}", floor_part.per(&start, sizes.locks, "lifecycle of the API server's floor"));
    // What the API server charges for the requests alone, whoever makes them.
    let cpu_ratio = match (ours_part.apiserver_cpu_since(&start), floor_part.apiserver_cpu_since(&start)) {
        (Some(ours), Some(floor)) if floor > 0.0 => format!("{:.2}", ours / floor),
        _ => "not measured".into(),
    };
    println!(
        "API server's floor: {floor_rate:.0} lifecycles/s (the same create, Held status, delete and finalizer \
         removal made by the bench on claims no operator serves, 32 at once, in {BATCHES} batches alternating with \
         zklock's); zklock / floor: throughput {:.2}, \
         kube-apiserver CPU per lifecycle {cpu_ratio}",
        ours / floor_rate
    );
    let curator_connect = zk.chroot().await;
    let locks = sizes.locks.to_string();
    let curator = tokio::task::spawn_blocking(move || {
        zklock_testkit::curator::run(&["throughput", &curator_connect, &locks, "32"])
    })
    .await?;
    let curator_rate: f64 = curator
        .split_whitespace()
        .find_map(|w| w.parse::<f64>().ok())
        .ok_or_else(|| format!("cannot read Curator's output: {curator}"))?;
    println!("zklock operator throughput: {ours:.0} acquire+release/s ({} locks, 32 concurrent claims)", sizes.locks);
    print!("{curator}");
    println!("zklock / curator throughput: {:.2}", ours / curator_rate);
    Ok(())
}

/// The API server's own cost of a claim's lifecycle, without the operator: the requests the
/// lifecycle is made of (create, the Held status the operator wrote, delete, the finalizer's
/// removal; as JSON patches tested against the UID and resourceVersion, as the operator makes
/// them) made by the bench on `n` claims (named after `names`) of `claims`, a namespace no
/// operator serves, with the same admission policies and one watch of the namespace (the
/// caller's). Answers lifecycles per second.
async fn floor(
    claims: &Api<LockClaim>,
    server: &Server,
    held: &serde_json::Value,
    names: &str,
    n: usize,
    concurrency: usize,
) -> Result<f64, Error> {
    use kube::api::Patch;
    let manager = as_the_operator();
    let start = Instant::now();
    let results: Vec<Result<(), Error>> = futures::stream::iter(0..n)
        .map(|i| {
            let manager = manager.clone();
            async move {
                let name = format!("{names}f{i}");
                let claim = unserved_claim(&name, &format!("{names}lock-{i}"), server)?;
                let made = claims.create(&PostParams::default(), &claim).await?;
                let status = status_patch(&made, held)?;
                claims.patch_status(&name, &manager, &Patch::Json::<()>(status)).await?;
                claims.delete(&name, &DeleteParams::default()).await?;
                claims.patch(&name, &manager, &Patch::Json::<()>(finalizer_removal()?)).await?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>, Error>>()?;
    Ok(rate)
}

/// The API server's own part of a handoff: in a namespace no operator serves (with the same
/// admission policies), a holder and a waiter made; then, timed: the holder deleted, its
/// deletion seen on a watch of the namespace (as the operator learns of it), the waiter's Held
/// status written (a JSON patch tested against its UID and resourceVersion, as the operator
/// writes it) and seen on the same watch (as `kubectl wait` learns of it). With `final_status`,
/// the holder's final status is written (its answer awaited, as the operator awaits it) before
/// the grant: the API never shows two holders. Everything zklock adds (ZooKeeper's delete and notification, the
/// reconciles) is what a handoff costs above this.
///
/// `FloorStart::PodDeleted` is the floor of a holder pod's path: the holder's pod deleted
/// instead of the holder, its deletion seen on a watch of the namespace's pods, then the
/// holder's final status and the waiter's Held, as zklock writes them.
async fn handoff_floor(
    client: &kube::Client,
    server: &Server,
    held: serde_json::Value,
    rounds: usize,
    start_with: FloorStart,
) -> Result<Samples, Error> {
    handoff_floor_with(client, server, None, held, rounds, start_with).await
}

/// [`handoff_floor`], with the holder's ZooKeeper node released where zklock releases it when
/// `zk` is given (after the final status where one is written, before the finalizer's removal).
async fn handoff_floor_with(
    client: &kube::Client,
    server: &Server,
    zk: Option<&zklock_testkit::ZkServer>,
    held: serde_json::Value,
    rounds: usize,
    start_with: FloorStart,
) -> Result<Samples, Error> {
    let mut floor = Floor::open(client, server, zk, held, start_with).await?;
    let rounds = floor.rounds(rounds).await;
    floor.close().await?;
    let (samples, gone_seen) = rounds?;
    if !gone_seen.0.is_empty() {
        println!(
            "  (the pod-path floor on the next line: its first part, the pod's deletion until seen gone: {})",
            gone_seen.summary()
        );
    }
    Ok(samples)
}

/// A floor's namespace, its watches and its ZooKeeper client, kept open between batches of
/// rounds so that the floor's rounds can alternate with zklock's on the same machine.
struct Floor {
    client: kube::Client,
    server: Server,
    ns: String,
    claims: Api<LockClaim>,
    pods: Api<Pod>,
    store: kube::runtime::reflector::Store<LockClaim>,
    pod_store: kube::runtime::reflector::Store<Pod>,
    changed: Arc<tokio::sync::Notify>,
    watches: [tokio::task::JoinHandle<()>; 2],
    /// The release's client, with `/epoch` and `/l` made under its own chroot.
    zk: Option<zookeeper_client::Client>,
    held: serde_json::Value,
    start_with: FloorStart,
    /// Rounds made so far: each round's names are new.
    made: usize,
}

impl Floor {
    async fn open(
        client: &kube::Client,
        server: &Server,
        zk: Option<&zklock_testkit::ZkServer>,
        held: serde_json::Value,
        start_with: FloorStart,
    ) -> Result<Floor, Error> {
        use kube::runtime::reflector;
        use zookeeper_client as zk;
        // The node a release deletes and the epoch node its multi-op checks, as the operator's.
        let zk = match (start_with == FloorStart::ClaimDeletedThenReleasedThenGone, zk) {
            (true, None) => return Err("this floor releases a ZooKeeper node: it needs ZooKeeper".into()),
            (_, None) => None,
            (_, Some(server)) => {
                let client = zk::Client::connect(&server.chroot().await).await?;
                let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                client.create("/epoch", b"1", &persistent).await?;
                client.create("/l", b"", &persistent).await?;
                Some(client)
            }
        };
        let (ns, claims) = unserved_namespace(client, server, &held, "bench-handoff-floor").await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let (store, writer) = reflector::store();
        let (pod_store, pod_writer) = reflector::store::<Pod>();
        let changed = Arc::new(tokio::sync::Notify::new());
        fn notify<T>(
            changed: Arc<tokio::sync::Notify>,
        ) -> impl FnMut(Result<T, watcher::Error>) -> futures::future::Ready<()> {
            move |event| {
                if let Err(e) = event {
                    eprintln!("a floor's watch failed (retrying): {e}");
                }
                changed.notify_waiters();
                futures::future::ready(())
            }
        }
        let watch = tokio::spawn(
            reflector(writer, watcher(claims.clone(), watcher::Config::default()).default_backoff())
                .for_each(notify(changed.clone())),
        );
        let pod_watch = tokio::spawn(
            reflector(pod_writer, watcher(pods.clone(), watcher::Config::default()).default_backoff())
                .for_each(notify(changed.clone())),
        );
        Ok(Floor {
            client: client.clone(),
            server: server.clone(),
            ns,
            claims,
            pods,
            store,
            pod_store,
            changed,
            watches: [watch, pod_watch],
            zk,
            held,
            start_with,
            made: 0,
        })
    }

    /// Until the floor's watch shows pod `name` gone.
    async fn pod_gone(&self, name: &str) {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(&self.ns);
        loop {
            let notified = self.changed.notified();
            if self.pod_store.get(&key).is_none() {
                return;
            }
            notified.await;
        }
    }

    /// Until the floor's watch shows pod `name` with `done` true.
    async fn pod_seen(&self, name: &str, done: fn(&Pod) -> bool) {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(&self.ns);
        loop {
            let notified = self.changed.notified();
            if self.pod_store.get(&key).is_some_and(|p| done(&p)) {
                return;
            }
            notified.await;
        }
    }

    /// Until the floor's watch shows claim `name` with `done` true; answers that copy.
    async fn seen(&self, name: &str, done: fn(&LockClaim) -> bool) -> LockClaim {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(&self.ns);
        loop {
            let notified = self.changed.notified();
            if let Some(c) = self.store.get(&key) {
                if done(&c) {
                    return (*c).clone();
                }
            }
            notified.await;
        }
    }

    /// `rounds` more handoffs; answers their times and, on the pod path, each one's first part
    /// (the pod's deletion until seen gone: the same in zklock's rounds).
    async fn rounds(&mut self, rounds: usize) -> Result<(Samples, Samples), Error> {
        use kube::api::Patch;
        use kube::runtime::reflector::ObjectRef;
        use zookeeper_client as zk;
        let (claims, pods, ns, start_with) = (&self.claims, &self.pods, &self.ns, self.start_with);
        let final_status = matches!(
            start_with,
            FloorStart::ClaimDeletedThenFinal | FloorStart::PodDeleted | FloorStart::GatedPodFinished
        );
        let gated = start_with == FloorStart::GatedPodFinished;
        let gone_first =
            matches!(start_with, FloorStart::ClaimDeletedThenGone | FloorStart::ClaimDeletedThenReleasedThenGone);
        let by_pod = start_with == FloorStart::PodDeleted;
        let manager = as_the_operator();
        let release = finalizer_removal()?;
        let mut samples = Samples::default();
        let mut gone_seen = Samples::default();
        let first = self.made;
        self.made += rounds;
        for i in first..first + rounds {
            let (holder, waiter, pod, next_pod) = (format!("h{i}"), format!("w{i}"), format!("p{i}"), format!("q{i}"));
            if by_pod || gated {
                pods.create(&PostParams::default(), &unscheduled_pod(&pod)?).await?;
            }
            if gated {
                pods.create(&PostParams::default(), &gated_pod(&next_pod, None)?).await?;
            }
            for name in [&holder, &waiter] {
                claims.create(&PostParams::default(), &unserved_claim(name, "l", &self.server)?).await?;
            }
            within(&waiter, "seen", async {
                self.seen(&waiter, |_| true).await;
            })
            .await?;
            if by_pod || gated {
                // Listed, so that its deletion (its finish) is what the watch shows next.
                within(&pod, "seen", self.pod_seen(&pod, |_| true)).await?;
            }
            if gated {
                within(&next_pod, "seen", self.pod_seen(&next_pod, |_| true)).await?;
            }
            let node = match &self.zk {
                Some(zk_client) => {
                    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
                    let (_, sequence) = zk_client.create("/l/lock-", b"", &ephemeral).await?;
                    Some(format!("/l/lock-{sequence}"))
                }
                None => None,
            };
            let start = Instant::now();
            if by_pod {
                pods.delete(&pod, &DeleteParams::default()).await?;
                tokio::time::timeout(Duration::from_secs(60), self.pod_gone(&pod))
                    .await
                    .map_err(|_| "the holder pod's deletion not seen")?;
                gone_seen.push(start.elapsed());
            } else if gated {
                let finished = json!({"status": {"phase": "Succeeded"}});
                pods.patch_status(&pod, &kube::api::PatchParams::default(), &Patch::Merge(&finished)).await?;
                let seen =
                    self.pod_seen(&pod, |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"));
                tokio::time::timeout(Duration::from_secs(60), seen)
                    .await
                    .map_err(|_| "the holder pod's finish not seen")?;
                gone_seen.push(start.elapsed());
            } else {
                claims.delete(&holder, &DeleteParams::default()).await?;
                let deleting = self.seen(&holder, |c| c.metadata.deletion_timestamp.is_some());
                tokio::time::timeout(Duration::from_secs(60), deleting)
                    .await
                    .map_err(|_| "the holder's deletion not seen")?;
            }
            if final_status {
                // The holder's final status first, as the operator writes it before the next grant.
                let current =
                    self.store.get(&ObjectRef::new(&holder).within(ns)).ok_or("the holder is not in the store")?;
                let mut released = self.held.clone();
                released["phase"] = json!("Released");
                let status = status_patch(&current, &released)?;
                // Answered, not seen: the operator releases and grants on its write's answer.
                claims.patch_status(&holder, &manager, &Patch::Json::<()>(status)).await?;
            }
            if let (Some(zk_client), Some(node)) = (&self.zk, &node) {
                let mut multi = zk_client.new_multi_writer();
                multi.add_check_version("/epoch", 0)?;
                multi.add_delete(node, None)?;
                multi.commit().await.map_err(|e| format!("the floor's release of {node}: {e}"))?;
            }
            if gone_first {
                claims.patch(&holder, &manager, &Patch::Json::<()>(release.clone())).await?;
            }
            let current =
                self.store.get(&ObjectRef::new(&waiter).within(ns)).ok_or("the waiter is not in the store")?;
            let status = status_patch(&current, &self.held)?;
            claims.patch_status(&waiter, &manager, &Patch::Json::<()>(status)).await?;
            if gated {
                // The gate removed as zklock removes it (a JSON patch that tests the pod's UID
                // and the gate), once the Held write is answered.
                let current = self
                    .pod_store
                    .get(&ObjectRef::new(&next_pod).within(ns))
                    .ok_or("the waiter's pod is not in the store")?;
                let ungate: json_patch::Patch = serde_json::from_value(json!([
                    {"op": "test", "path": "/metadata/uid", "value": current.metadata.uid},
                    {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "zklock.io/lock"},
                    {"op": "remove", "path": "/spec/schedulingGates/0"},
                ]))?;
                pods.patch(&next_pod, &manager, &Patch::Json::<()>(ungate)).await?;
                let ungated = self.pod_seen(&next_pod, |p| {
                    p.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_none_or(|g| g.is_empty())
                });
                tokio::time::timeout(Duration::from_secs(60), ungated)
                    .await
                    .map_err(|_| "the waiter's pod's gate removal not seen")?;
            } else {
                let granted = self.seen(&waiter, |c| c.status.as_ref().and_then(|s| s.phase) == Some(Phase::Held));
                tokio::time::timeout(Duration::from_secs(60), granted)
                    .await
                    .map_err(|_| "the waiter's Held not seen")?;
            }
            samples.push(start.elapsed());
            // Not timed: both claims gone, as the operator would finish them, and the pods.
            if by_pod || gated {
                claims.delete(&holder, &DeleteParams::default()).await?;
            }
            if gated {
                pods.delete(&pod, &DeleteParams::default()).await?;
                pods.delete(&next_pod, &DeleteParams::default()).await?;
            }
            if !gone_first {
                claims.patch(&holder, &manager, &Patch::Json::<()>(release.clone())).await?;
            }
            claims.delete(&waiter, &DeleteParams::default()).await?;
            claims.patch(&waiter, &manager, &Patch::Json::<()>(release.clone())).await?;
        }
        Ok((samples, gone_seen))
    }

    /// zklock's rounds side by side with this floor's: after zklock's first batch (`first`, made
    /// before the floor was opened), as many floor rounds as that batch had, then `zklock(done, n)`
    /// for the next batch of at most `batch` rounds (answering their latencies), and so on until
    /// `total` rounds of zklock's are done. Answers the floor's latencies, their first parts (see
    /// [`Floor::rounds`]) and each batch's ratio of zklock's p50 to the floor's batch's.
    async fn alternate(
        &mut self,
        first: &Samples,
        total: usize,
        batch: usize,
        mut zklock: impl AsyncFnMut(usize, usize) -> Result<Samples, Error>,
    ) -> Result<(Samples, Samples, Vec<f64>), Error> {
        let (mut floor, mut first_parts, mut ratios) = (Samples::default(), Samples::default(), vec![]);
        let (mut last, mut last_n) = (first.percentile(0.5), first.0.len());
        let mut done = last_n;
        loop {
            let (samples, parts) = self.rounds(last_n).await?;
            ratios.push(last.as_secs_f64() / samples.percentile(0.5).as_secs_f64());
            floor.0.extend(samples.0);
            first_parts.0.extend(parts.0);
            if done >= total {
                return Ok((floor, first_parts, ratios));
            }
            let latency = zklock(done, batch.min(total - done)).await?;
            (last, last_n) = (latency.percentile(0.5), latency.0.len());
            done += last_n;
        }
    }

    /// Stops the watches and deletes the namespace (whether the rounds succeeded or not).
    async fn close(self) -> Result<(), Error> {
        for watch in &self.watches {
            watch.abort();
        }
        Api::<Namespace>::all(self.client.clone()).delete(&self.ns, &DeleteParams::default()).await?;
        Ok(())
    }
}

/// What the holder pod rounds measured.
struct PodRounds {
    latency: Samples,
    /// From the deletion to the bench's watch of the pods seeing the pod gone (the part of the
    /// handoff before the operator can act: its watch sees it about then).
    gone_seen: Samples,
    held: Option<serde_json::Value>,
    /// The operator's pod GETs per round, from the holder pod's deletion to the next Held.
    gets_timed: f64,
    /// The same, with the next claim's creation and first reconcile.
    gets_all: f64,
}

impl PodRounds {
    /// `other`'s rounds added to these (its per-round figures weighted by its rounds).
    fn add(&mut self, other: PodRounds) {
        let mean = weighted(self.latency.0.len(), other.latency.0.len());
        self.gets_timed = mean(self.gets_timed, other.gets_timed);
        self.gets_all = mean(self.gets_all, other.gets_all);
        self.latency.0.extend(other.latency.0);
        self.gone_seen.0.extend(other.gone_seen.0);
        self.held = other.held.or(self.held.take());
    }
}

/// Where a handoff's floor starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FloorStart {
    /// The holder deleted; the waiter's Held written as soon as that is seen.
    ClaimDeleted,
    /// The holder deleted; its final status written (answered) before the waiter's Held: zklock's
    /// path when another finalizer keeps the claim after its own.
    ClaimDeletedThenFinal,
    /// The holder deleted; its finalizer removed (the removal answered, the claim gone with it)
    /// before the waiter's Held: zklock's path when its finalizer is the claim's last.
    ClaimDeletedThenGone,
    /// As `ClaimDeletedThenGone`, with the holder's ZooKeeper node deleted first (a multi-op that
    /// checks an epoch node, as the operator's release): every write of zklock's path, in its
    /// order, each waiting for the one before as zklock's must.
    ClaimDeletedThenReleasedThenGone,
    /// The holder's pod deleted; then as `ClaimDeletedThenFinal`.
    PodDeleted,
    /// A gated pod's path: the holder's pod marked `Succeeded` (as its kubelet would) and seen
    /// so; the holder's final status, the release, the waiter's Held, then the waiter's pod's
    /// scheduling gate removed once the Held write is answered (zklock removes it once the Held
    /// has also come back on its claim watch: one watch delivery this floor does not wait for)
    /// and seen gone on the watch of the pods.
    GatedPodFinished,
}

/// A pod with zklock's scheduling gate, no node runs; with `lock`, annotated to hold it (zklock
/// then makes its claim and removes the gate on grant).
fn gated_pod(name: &str, lock: Option<&str>) -> Result<Pod, Error> {
    let annotations = lock.map(|lock| json!({"zklock.io/lock": lock})).unwrap_or_else(|| json!({}));
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulingGates": [{"name": "zklock.io/lock"}],
            "schedulerName": "zklock-bench-no-scheduler",
            "containers": [{"name": "m", "image": "busybox"}],
        },
    }))?)
}

/// A pod no node runs (no scheduler places it): its deletion is the API server's alone.
fn unscheduled_pod(name: &str) -> Result<Pod, Error> {
    Ok(serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "schedulerName": "zklock-bench-no-scheduler",
        "containers": [{"name": "m", "image": "busybox"}],
    }}))?)
}

/// A namespace of its own that no operator serves, with the admission policies the bench's
/// operators meet (the epoch policy's parameter at the epoch of the `held` status copied), for
/// the API server's floors; answers it and its claims' API.
async fn unserved_namespace(
    client: &kube::Client,
    server: &Server,
    held: &serde_json::Value,
    prefix: &str,
) -> Result<(String, Api<LockClaim>), Error> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let ns = format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
    install_epoch_policy(client, &ns).await?;
    let epoch = held.get("leaderEpoch").and_then(|e| e.as_u64()).unwrap_or(0);
    let param: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": zklock::api::epoch_policy::EPOCH_PARAM},
        "data": {(zklock::api::epoch_policy::EPOCH_KEY): epoch.to_string()}
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns).create(&PostParams::default(), &param).await?;
    if server.finalizer_policy {
        install_finalizer_policy(client, &ns).await?;
    }
    let claims = Api::namespaced(client.clone(), &ns);
    Ok((ns, claims))
}

/// A claim of lock `lock` for a floor, with the operator's finalizer as it would have it.
fn unserved_claim(name: &str, lock: &str, server: &Server) -> Result<LockClaim, Error> {
    let mut metadata = json!({"name": name});
    if !server.finalizer_policy {
        metadata["finalizers"] = json!([zklock::api::FINALIZER]);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": metadata, "spec": {"lockName": lock}
    }))?)
}

/// Writes as the operator does: its field manager.
fn as_the_operator() -> kube::api::PatchParams {
    kube::api::PatchParams { field_manager: Some("zklock".into()), ..Default::default() }
}

/// `status` written over the copy `current`, tested against its UID and resourceVersion, as the
/// operator writes a status.
fn status_patch(current: &LockClaim, status: &serde_json::Value) -> Result<json_patch::Patch, Error> {
    Ok(serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": current.metadata.uid},
        {"op": "test", "path": "/metadata/resourceVersion", "value": current.metadata.resource_version},
        {"op": "add", "path": "/status", "value": status},
    ]))?)
}

/// The operator's finalizer removed, tested to be the one removed.
fn finalizer_removal() -> Result<json_patch::Patch, Error> {
    Ok(serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": zklock::api::FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))?)
}

/// The finalizer's admission policy (as the chart installs it), and a binding for namespace `ns`.
async fn install_finalizer_policy(client: &kube::Client, ns: &str) -> Result<(), Error> {
    install_finalizer_policy_over(client, &[ns.to_string()], ns).await
}

/// The finalizer policy, and one binding (named after `name`) for `namespaces`; in force once a
/// dry-run create in the first of them shows it.
async fn install_finalizer_policy_over(client: &kube::Client, namespaces: &[String], name: &str) -> Result<(), Error> {
    let ns = namespaces.first().ok_or("no namespace to bind the finalizer policy to")?;
    use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
    use zklock::api::finalizer_policy::{finalizer_policy, finalizer_policy_binding, FINALIZER_POLICY};
    let apply = kube::api::PatchParams::apply("zklock-bench").force();
    Api::<MutatingAdmissionPolicy>::all(client.clone())
        .patch(FINALIZER_POLICY, &apply, &kube::api::Patch::Apply(&finalizer_policy(FINALIZER_POLICY)))
        .await?;
    let name = format!("{FINALIZER_POLICY}-{name}");
    let binding = finalizer_policy_binding(&name, FINALIZER_POLICY, namespaces);
    Api::<MutatingAdmissionPolicyBinding>::all(client.clone())
        .patch(&name, &apply, &kube::api::Patch::Apply(&binding))
        .await?;
    // In force once the API server has loaded it: a dry-run create shows it.
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), ns);
    let probe: LockClaim = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": {"name": "probe"}, "spec": {"lockName": "p"}
    }))?;
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let made = claims.create(&dry_run, &probe).await?;
        if made.metadata.finalizers.iter().flatten().any(|f| f == zklock::api::FINALIZER) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the finalizer policy did not take effect within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader epoch's admission policy, and a binding for namespace `ns` with its parameter there.
async fn install_epoch_policy(client: &kube::Client, ns: &str) -> Result<(), Error> {
    install_epoch_policy_over(client, ns, &[ns.to_string()]).await
}

/// The epoch policy, and one binding for `namespaces` with the parameter in `home`.
async fn install_epoch_policy_over(client: &kube::Client, home: &str, namespaces: &[String]) -> Result<(), Error> {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    use zklock::api::epoch_policy::{epoch_policy, epoch_policy_binding, EPOCH_PARAM, EPOCH_POLICY};
    let apply = kube::api::PatchParams::apply("zklock-bench").force();
    let policy = epoch_policy(EPOCH_POLICY);
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(EPOCH_POLICY, &apply, &kube::api::Patch::Apply(&policy))
        .await?;
    let name = format!("{EPOCH_POLICY}-{home}");
    let binding = epoch_policy_binding(&name, EPOCH_POLICY, EPOCH_PARAM, home, namespaces);
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .patch(&name, &apply, &kube::api::Patch::Apply(&binding))
        .await?;
    Ok(())
}

async fn install_crd(client: &kube::Client) -> Result<(), Error> {
    for (file, _) in zklock::api::crds() {
        let name = file.trim_end_matches(".yaml");
        let text = std::fs::read_to_string(format!("{}/crds/{file}", env!("CARGO_MANIFEST_DIR")))?;
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text)?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        if crds.get_opt(name).await?.is_none() {
            crds.create(&PostParams::default(), &crd).await?;
        }
        await_condition(crds, name, kube::runtime::conditions::is_crd_established()).await?;
    }
    Ok(())
}

/// The API server the benchmark runs on.
#[derive(Clone)]
struct Server {
    kubeconfig: std::path::PathBuf,
    /// The finalizer's admission policy is installed for the bench's namespaces.
    finalizer_policy: bool,
}

/// One operator process serving one namespace of its own.
struct Bench {
    client: kube::Client,
    ns: String,
    claims: Api<LockClaim>,
    operator: Child,
    metrics: String,
    launch: Launch,
}

impl Drop for Bench {
    fn drop(&mut self) {
        stop(&mut self.operator);
    }
}

impl Bench {
    async fn start(
        client: &kube::Client,
        server: &Server,
        zk: &zklock_testkit::ZkServer,
        name: &str,
    ) -> Result<Bench, Error> {
        Self::start_with(client, server, &zk.chroot().await, name, &[]).await
    }

    /// [`Bench::start`] with ZooKeeper at `zk` (a connect string with its chroot) and `extra`
    /// flags for the operator.
    async fn start_with(
        client: &kube::Client,
        server: &Server,
        zk: &str,
        name: &str,
        extra: &[&str],
    ) -> Result<Bench, Error> {
        let ns = format!("bench-{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
        // As users run it: on a real API server with the leader epoch's admission policy (its
        // binding for this namespace, the parameter in it).
        install_epoch_policy(client, &ns).await?;
        if server.finalizer_policy {
            install_finalizer_policy(client, &ns).await?;
        }
        let launch =
            Launch { server: server.clone(), zk: zk.to_string(), extra: extra.iter().map(|s| s.to_string()).collect() };
        let (operator, metrics) = launch.spawn(&ns)?;
        let bench = Bench {
            client: client.clone(),
            claims: Api::namespaced(client.clone(), &ns),
            ns,
            operator,
            metrics,
            launch,
        };
        // Leading and ready (a standby is ready too): its claim watch has listed, so claims made
        // from now on reach it in creation order. (Claims it lists at start are queued by their
        // creation second, then by name: a bench that created them before would find its
        // queue out of its own order.)
        bench.until_ready(&bench.metrics, true).await?;
        Ok(bench)
    }

    /// Starts a second operator process for this bench's namespace (a standby replica) and
    /// waits until it is ready; answers it and its metrics address.
    async fn standby(&self) -> Result<(Child, String), Error> {
        let (child, metrics) = self.launch.spawn(&self.ns)?;
        self.until_ready(&metrics, false).await?;
        Ok((child, metrics))
    }

    /// Stops the leading operator gracefully (SIGTERM) with `standby` running; answers how long
    /// the standby took to lead and to be ready (re-anchored), from the signal.
    async fn hand_over(&mut self, standby: (Child, String)) -> Result<(Duration, Duration), Error> {
        let start = Instant::now();
        let killed = Command::new("kill").args(["-TERM", &self.operator.id().to_string()]).status()?;
        if !killed.success() {
            return Err("kill -TERM of the leader failed".into());
        }
        let (old, old_metrics) =
            (std::mem::replace(&mut self.operator, standby.0), std::mem::replace(&mut self.metrics, standby.1));
        let mut old = old;
        let deadline = Instant::now() + Duration::from_secs(60);
        let led = loop {
            if self.metric("zklock_leader").await >= 1.0 {
                break start.elapsed();
            }
            if Instant::now() > deadline {
                return Err(
                    format!("the standby did not lead within 60 s of the leader's SIGTERM ({old_metrics})").into()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        self.until_ready(&self.metrics, true).await?;
        let ready = start.elapsed();
        let _ = old.wait();
        Ok((led, ready))
    }

    /// Waits at most 30 s until the operator at `metrics` is ready, and leads if `leading`.
    async fn until_ready(&self, metrics: &str, leading: bool) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while (leading && metric_at(metrics, "zklock_leader").await < 1.0)
            || get_at(metrics, "/readyz").await.is_none_or(|b| b.trim() != "ready")
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "the operator did not {}become ready within 30 s",
                    if leading { "lead and " } else { "" }
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    async fn metric(&self, name: &str) -> f64 {
        metric_at(&self.metrics, name).await
    }

    /// The lock engine's ZooKeeper operations so far, by kind.
    async fn zk_operations(&self) -> std::collections::BTreeMap<String, f64> {
        let text = get_at(&self.metrics, "/metrics").await.unwrap_or_default();
        text.lines()
            .filter_map(|l| l.strip_prefix("zklock_zookeeper_operations_total{op=\""))
            .filter_map(|l| {
                let (op, rest) = l.split_once('"')?;
                Some((op.to_string(), rest.rsplit(' ').next()?.parse().ok()?))
            })
            .collect()
    }

    async fn create(&self, name: &str, lock: &str, holder: Option<&str>) -> Result<(), Error> {
        // `a,b`: one claim over both locks.
        let mut spec = if lock.contains(',') {
            json!({"locks": lock.split(',').map(|l| json!({"lockName": l})).collect::<Vec<_>>()})
        } else if let Some(cluster_lock) = lock.strip_prefix("cluster/") {
            json!({"clusterLockName": cluster_lock})
        } else {
            json!({"lockName": lock})
        };
        if let Some(pod) = holder {
            spec["holder"] = json!({"podName": pod});
        }
        let claim: LockClaim = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": {"name": name}, "spec": spec
        }))?;
        self.claims.create(&PostParams::default(), &claim).await?;
        Ok(())
    }

    async fn wait_gone(&self, name: &str) -> Result<(), Error> {
        let gone = await_condition(self.claims.clone(), name, |c: Option<&LockClaim>| c.is_none());
        tokio::time::timeout(Duration::from_secs(120), gone)
            .await
            .map_err(|_| format!("{name} not gone within 120 s"))??;
        Ok(())
    }

    async fn wait_phase(&self, name: &str, phase: Phase) -> Result<(), Error> {
        let cond = move |c: Option<&LockClaim>| c.and_then(|c| c.status.as_ref()).and_then(|s| s.phase) == Some(phase);
        tokio::time::timeout(Duration::from_secs(120), await_condition(self.claims.clone(), name, cond))
            .await
            .map_err(|_| format!("{name} not {phase:?} within 120 s"))??;
        Ok(())
    }

    /// Handoffs on lock `l` with `permits` permits (a `Lock` object when more than one): each
    /// round queues `permits` holders and `waiters` waiters, then deletes the oldest holder and
    /// times until the first waiter is seen Held, again and again.
    async fn handoffs(&self, permits: usize, waiters: usize, handoffs: usize) -> Result<HandoffResult, Error> {
        self.handoffs_on("l", "c", permits, waiters, handoffs).await
    }

    /// [`Bench::handoffs`] with claims over `locks` (`a,b`: every claim over both), named
    /// `names` and a number (a name each call has not used yet).
    async fn handoffs_on(
        &self,
        locks: &str,
        names: &str,
        permits: usize,
        waiters: usize,
        handoffs: usize,
    ) -> Result<HandoffResult, Error> {
        if permits > 1 {
            let lock: Lock = serde_json::from_value(json!({
                "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
                "metadata": {"name": "l"}, "spec": {"permits": permits},
            }))?;
            Api::<Lock>::namespaced(self.client.clone(), &self.ns).create(&PostParams::default(), &lock).await?;
        }
        let mut latency = Samples::default();
        let mut last_held = None;
        let (mut writes, mut zk_events) = (0u64, 0f64);
        let inside = || async {
            [
                self.metric("zklock_handoff_seconds_sum").await,
                self.metric("zklock_handoff_seconds_count").await,
                self.metric("zklock_handoff_seconds_bucket{le=\"0.008\"}").await,
                self.metric("zklock_handoff_seconds_bucket{le=\"0.016\"}").await,
            ]
        };
        let mut inside_total = [0f64; 4];
        let mut next = 0usize;
        let mut counted = 0usize;
        while counted < handoffs {
            // Refill: the holders and `waiters` waiters (not counted).
            let first = next;
            let size = permits + waiters;
            for i in 0..size {
                self.create(&format!("{names}{}", first + i), locks, None).await?;
            }
            next += size;
            self.wait_phase(&format!("{names}{}", first + permits - 1), Phase::Held).await?;
            self.wait_phase(&format!("{names}{}", first + size - 1), Phase::Waiting).await?;
            let zk_before = self.metric("zklock_zookeeper_operations_total{op=\"predecessor_notification\"}").await;
            let writes_before = self.metric("zklock_kubernetes_writes_total").await;
            let inside_before = inside().await;
            let round = waiters.min(handoffs - counted);
            // The next holder's grant is seen on a watch of the namespace that is already open:
            // a new watch per handoff would add the API server's list of the whole queue.
            let (seen, follower) = self.follow();
            let holder = format!("{names}{}", first + permits - 1);
            within(&holder, "seen Held", seen.wait(|sets| sets.0.contains(&holder))).await?;
            for i in 0..round {
                let next = format!("{names}{}", first + i + permits);
                let start = Instant::now();
                let wall = std::time::SystemTime::now();
                self.claims.delete(&format!("{names}{}", first + i), &DeleteParams::default()).await?;
                tokio::time::timeout(Duration::from_secs(120), seen.wait(|sets| sets.0.contains(&next)))
                    .await
                    .map_err(|_| format!("{next} not Held within 120 s"))?;
                let took = start.elapsed();
                latency.push(took);
                if std::env::var_os("ZKLOCK_BENCH_SAMPLES").is_some() {
                    use std::io::Write;
                    let at = wall.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
                    let line = format!("SAMPLE {} {next} {at:.6} {:.3}\n", self.ns, took.as_secs_f64() * 1e3);
                    // One write: the operator's log shares this stderr, and must not split the line.
                    let _ = std::io::stderr().lock().write_all(line.as_bytes());
                }
            }
            follower.abort();
            last_held = last_held.or_else(|| seen.held.lock().unwrap_or_else(|p| p.into_inner()).take());
            // Let the last writes of the round (finalizer removals, events) land.
            tokio::time::sleep(Duration::from_millis(500)).await;
            writes += (self.metric("zklock_kubernetes_writes_total").await - writes_before) as u64;
            for (total, (after, before)) in inside_total.iter_mut().zip(inside().await.iter().zip(inside_before)) {
                *total += after - before;
            }
            zk_events +=
                self.metric("zklock_zookeeper_operations_total{op=\"predecessor_notification\"}").await - zk_before;
            counted += round;
            // Clear the rest of the round's claims, and wait for them to go: their releases would
            // otherwise fall into whatever is measured next (a floor's batch, alternating).
            for i in round..size {
                let _ = self.claims.delete(&format!("{names}{}", first + i), &DeleteParams::default()).await;
            }
            for i in round..size {
                self.wait_gone(&format!("{names}{}", first + i)).await?;
            }
        }
        Ok(HandoffResult {
            latency,
            held: last_held,
            zk_events_per_handoff: zk_events / counted as f64,
            writes_per_handoff: writes as f64 / counted as f64,
            inside_mean: Duration::from_secs_f64(inside_total[0] / inside_total[1].max(1.0)),
            inside_within: [inside_total[2] / inside_total[1].max(1.0), inside_total[3] / inside_total[1].max(1.0)],
        })
    }

    /// Holder pods in one queue: each round, the holder's pod is deleted and the time until the
    /// next claim is Held is taken. Also the operator's pod reads from the API per round: while
    /// timed (from the deletion to the next Held) and in all (the next claim's first sight, which
    /// binds it, included). The last holder's Held status is kept for the floor to copy.
    ///
    /// Rounds `from..from + rounds`: a later call goes on from the holder the last one left.
    async fn pod_deletions(&self, from: usize, rounds: usize) -> Result<PodRounds, Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        // Counted by the operator's client for every build: GETs of pods.
        let gets = r#"zklock_kubernetes_calls_total{method="GET",resource="pods","#;
        let mut samples = Samples::default();
        let (gets_start, mut gets_timed) = (self.metric(gets).await, 0.0);
        if from == 0 {
            pods.create(&PostParams::default(), &unscheduled_pod("p0")?).await?;
            self.create("h0", "pods", Some("p0")).await?;
        }
        self.wait_phase(&format!("h{from}"), Phase::Held).await?;
        // The next holder's grant is seen on a watch that is already open, as the floor sees it:
        // a watch opened per round (`wait_phase`) had the API server list the namespace's claims
        // in the middle of the timed handoff.
        let (seen, follower) = self.follow();
        // When the bench's own watch of the pods saw each deleted: the round's first part.
        let gone_at: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
        let pod_follower = {
            let (gone_at, stream) = (gone_at.clone(), watcher(pods.clone(), watcher::Config::default()));
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream.default_backoff());
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(watcher::Event::Delete(pod)) => {
                            let at = Instant::now();
                            let mut gone = gone_at.lock().unwrap_or_else(|p| p.into_inner());
                            gone.insert(pod.metadata.name.unwrap_or_default(), at);
                        }
                        Ok(_) => {}
                        Err(e) => eprintln!("the bench's watch of the holder pods failed (retrying): {e}"),
                    }
                }
            })
        };
        let mut gone_seen = Samples::default();
        for i in from..from + rounds {
            let next = format!("p{}", i + 1);
            let (holder, waiter) = (format!("h{i}"), format!("h{}", i + 1));
            pods.create(&PostParams::default(), &unscheduled_pod(&next)?).await?;
            self.create(&waiter, "pods", Some(&next)).await?;
            self.wait_phase(&waiter, Phase::Waiting).await?;
            within(&holder, "seen Held", seen.wait(|sets| sets.0.contains(&holder))).await?;
            let before = self.metric(gets).await;
            let start = Instant::now();
            pods.delete(&format!("p{i}"), &DeleteParams::default()).await?;
            within(&waiter, "Held", seen.wait(|sets| sets.0.contains(&waiter))).await?;
            samples.push(start.elapsed());
            if let Some(at) = gone_at.lock().unwrap_or_else(|p| p.into_inner()).get(&format!("p{i}")) {
                gone_seen.push(at.saturating_duration_since(start));
            }
            self.wait_phase(&holder, Phase::Released).await?;
            gets_timed += self.metric(gets).await - before;
        }
        follower.abort();
        pod_follower.abort();
        let last = self.claims.get(&format!("h{}", from + rounds)).await?;
        let held = last.status.map(serde_json::to_value).transpose()?;
        let per_round = |n: f64| n / rounds.max(1) as f64;
        Ok(PodRounds {
            latency: samples,
            gone_seen,
            held,
            gets_timed: per_round(gets_timed),
            gets_all: per_round(self.metric(gets).await - gets_start),
        })
    }

    /// Gated pods in one queue, rounds `from..from + rounds` of them: pod `g{i}` holds the lock,
    /// `g{i+1}` is made and waits; timed, `g{i}` is marked `Succeeded` (as its kubelet would) until
    /// `g{i+1}`'s gate is seen gone. The first call makes `g0` and waits for it to be ungated; a
    /// later one goes on from the pod the last one left holding. Answers the times, the API
    /// writes per round and the last holder's Held status (for the floor to copy).
    async fn gated_handoffs(&self, from: usize, rounds: usize) -> Result<(Samples, f64, serde_json::Value), Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let gated = |name: &str| gated_pod(name, Some("gated"));
        let ungated = Arc::new(Seen::default());
        let follower = {
            let seen = ungated.clone();
            let stream = watcher(pods.clone(), watcher::Config::default()).default_backoff().applied_objects();
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(pod) = stream.next().await {
                    let p = match pod {
                        Ok(p) => p,
                        Err(e) => {
                            eprintln!("the gated pods' watch failed (retrying): {e}");
                            continue;
                        }
                    };
                    let gates = p.spec.and_then(|s| s.scheduling_gates).unwrap_or_default();
                    if gates.iter().all(|g| g.name != "zklock.io/lock") {
                        seen.sets
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                            .insert(p.metadata.name.unwrap_or_default());
                        seen.changed.notify_waiters();
                    }
                }
            })
        };
        let measured = async {
            let holder = format!("g{from}");
            if from == 0 {
                pods.create(&PostParams::default(), &gated(&holder)?).await?;
            }
            within(&holder, "seen ungated", ungated.wait(|sets| sets.0.contains(&holder))).await?;
            let mut samples = Samples::default();
            let succeeded = json!({"status": {"phase": "Succeeded"}});
            let mut writes = 0.0;
            for i in from..from + rounds {
                let next = format!("g{}", i + 1);
                pods.create(&PostParams::default(), &gated(&next)?).await?;
                self.wait_phase(&next, Phase::Waiting).await?;
                let writes_before = self.metric("zklock_kubernetes_writes_total").await;
                let start = Instant::now();
                let finish = kube::api::Patch::Merge(&succeeded);
                pods.patch_status(&format!("g{i}"), &kube::api::PatchParams::default(), &finish).await?;
                tokio::time::timeout(Duration::from_secs(120), ungated.wait(|sets| sets.0.contains(&next)))
                    .await
                    .map_err(|_| format!("{next} not ungated within 120 s"))?;
                samples.push(start.elapsed());
                // The handoff's remaining writes (the pod's condition, events) land before the next.
                tokio::time::sleep(Duration::from_millis(300)).await;
                writes += self.metric("zklock_kubernetes_writes_total").await - writes_before;
            }
            let last = format!("g{}", from + rounds);
            let held = self.claims.get(&last).await?.status.ok_or_else(|| format!("{last}'s claim has no status"))?;
            Ok::<_, Error>((samples, writes / rounds.max(1) as f64, serde_json::to_value(held)?))
        }
        .await;
        follower.abort();
        measured
    }

    /// One watch of the bench's namespace: which claims were seen Held, and which deleted.
    fn follow(&self) -> (Arc<Seen>, tokio::task::JoinHandle<()>) {
        let seen = Arc::new(Seen::default());
        let follower = {
            let seen = seen.clone();
            let stream = watcher(self.claims.clone(), watcher::Config::default());
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    let mut sets = seen.sets.lock().unwrap_or_else(|p| p.into_inner());
                    match event {
                        Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                            if c.status.as_ref().and_then(|s| s.phase) == Some(Phase::Held) {
                                sets.0.insert(c.metadata.name.unwrap_or_default());
                                let status = c.status.as_ref().and_then(|s| serde_json::to_value(s).ok());
                                *seen.held.lock().unwrap_or_else(|p| p.into_inner()) = status;
                            }
                        }
                        Ok(watcher::Event::Delete(c)) => {
                            sets.1.insert(c.metadata.name.unwrap_or_default());
                        }
                        _ => continue,
                    }
                    drop(sets);
                    seen.changed.notify_waiters();
                }
            })
        };
        (seen, follower)
    }

    /// Claims on a free lock one after the other: each created, timed until seen Held, deleted
    /// and seen gone.
    async fn lifecycles(&self, n: usize) -> Result<Samples, Error> {
        let (seen, follower) = self.follow();
        let mut samples = Samples::default();
        for i in 0..n {
            let name = format!("u{i}");
            let start = Instant::now();
            self.create(&name, &format!("alone-{i}"), None).await?;
            within(&name, "Held", seen.wait(|sets| sets.0.contains(&name))).await?;
            samples.push(start.elapsed());
            self.claims.delete(&name, &DeleteParams::default()).await?;
            within(&name, "gone", seen.wait(|sets| sets.1.contains(&name))).await?;
        }
        follower.abort();
        Ok(samples)
    }

    /// A claim on each of the locks `lock-{i}` for `i` in `locks`, `concurrency` at once, each
    /// created, seen Held, deleted and seen gone; the claims named after `names` (new names for
    /// each call). Answers the rate, each claim's time from its create request to its Held
    /// status, and one Held status.
    async fn throughput(
        &self,
        names: &str,
        locks: std::ops::Range<usize>,
        concurrency: usize,
    ) -> Result<(f64, Samples, Option<serde_json::Value>), Error> {
        let count = locks.len();
        // One watch of the namespace tells every worker when its claim is Held and when it is
        // gone: a watch per claim would load the API server more than the operator does.
        let (seen, follower) = self.follow();
        let start = Instant::now();
        let results: Vec<Result<Duration, Error>> = futures::stream::iter(locks)
            .map(|i| {
                let seen = seen.clone();
                async move {
                    let name = format!("{names}t{i}");
                    let created = Instant::now();
                    self.create(&name, &format!("lock-{i}"), None).await?;
                    within(&name, "Held", seen.wait(|sets| sets.0.contains(&name))).await?;
                    let held = created.elapsed();
                    self.claims.delete(&name, &DeleteParams::default()).await?;
                    within(&name, "gone", seen.wait(|sets| sets.1.contains(&name))).await?;
                    Ok(held)
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let rate = count as f64 / start.elapsed().as_secs_f64();
        follower.abort();
        let mut held = Samples::default();
        for r in results {
            held.push(r?);
        }
        let status = seen.held.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok((rate, held, status))
    }

    async fn memory(&self, claims: usize) -> Result<(f64, u64), Error> {
        let baseline = rss(self.operator.id())?;
        let per_lock = 100;
        let names: Vec<(String, String)> =
            (0..claims).map(|i| (format!("m{i}"), format!("mem-{}", i / per_lock))).collect();
        let created: Vec<Result<(), Error>> = futures::stream::iter(names.iter())
            .map(|(name, lock)| self.create(name, lock, None))
            .buffer_unordered(32)
            .collect()
            .await;
        for r in created {
            r?;
        }
        // Every claim in the queue (Held or Waiting); at least 20 claims a second. Followed on
        // the operator's own gauge (listing every claim each second would load the API server
        // more than the operator does), then checked once through the API.
        let deadline = Instant::now() + Duration::from_secs(60 + claims as u64 / 20);
        loop {
            let held = self.metric("zklock_claims{phase=\"Held\"}").await;
            let waiting = self.metric("zklock_claims{phase=\"Waiting\"}").await;
            if held + waiting >= claims as f64 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the operator counts only {} of {claims} claims queued", held + waiting).into());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        loop {
            let list = self.claims.list(&ListParams::default()).await?;
            let mut phases: HashMap<Option<Phase>, usize> = HashMap::new();
            for c in &list.items {
                *phases.entry(c.status.as_ref().and_then(|s| s.phase)).or_default() += 1;
            }
            let queued = phases.get(&Some(Phase::Held)).unwrap_or(&0) + phases.get(&Some(Phase::Waiting)).unwrap_or(&0);
            if queued == claims {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("only {queued} of {claims} claims queued: {phases:?}").into());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let total = rss(self.operator.id())?;
        Ok((total.saturating_sub(baseline) as f64 / claims as f64, total))
    }
}

async fn get_at(address: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut s = tokio::net::TcpStream::connect(address).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    };
    // A stuck endpoint must not hang the bench: no answer within 10 s reads as none.
    match tokio::time::timeout(Duration::from_secs(10), get).await {
        Ok(answer) => answer,
        Err(_) => {
            eprintln!("no answer from http://{address}{path} within 10 s");
            None
        }
    }
}

/// The sum of the samples of metric `name` on the metrics endpoint at `address`.
async fn metric_at(address: &str, name: &str) -> f64 {
    let text = get_at(address, "/metrics").await.unwrap_or_default();
    // A fold, not `sum`: the sum of no samples is -0.
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, x| sum + x)
}

/// How to start one more operator process like a bench's.
#[derive(Clone)]
struct Launch {
    server: Server,
    zk: String,
    extra: Vec<String>,
}

impl Launch {
    /// Starts an operator serving namespace `ns`; answers it and its metrics address.
    fn spawn(&self, ns: &str) -> Result<(Child, String), Error> {
        self.spawn_serving(ns, Some(ns))
    }

    /// Starts an operator with its Lease (and epoch parameter) in `home`, serving `served` or
    /// every namespace.
    fn spawn_serving(&self, home: &str, served: Option<&str>) -> Result<(Child, String), Error> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let binary = match std::env::var_os("ZKLOCK_BENCH_OPERATOR") {
            Some(path) => std::path::PathBuf::from(path),
            None => std::env::current_exe()?
                .parent()
                .and_then(|examples| examples.parent())
                .map(|dir| dir.join("zklock"))
                .filter(|p| p.exists())
                .ok_or("the zklock binary is missing next to this example: run `cargo build --release` first")?,
        };
        let wrapper = std::env::var("ZKLOCK_BENCH_WRAP").unwrap_or_default();
        let mut command = match wrapper.split_whitespace().collect::<Vec<_>>().split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        let operator = command
            .args(["run", "--zk-connect", &self.zk, "--lease-namespace", home])
            .args(served.map(|ns| ["--watch-namespace", ns]).into_iter().flatten())
            .args(["--metrics-addr", &format!("127.0.0.1:{port}"), "--epoch-param=zklock-leader-epoch"])
            .args(&self.extra)
            .env("KUBECONFIG", &self.server.kubeconfig)
            .env("RUST_LOG", std::env::var("ZKLOCK_BENCH_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        Ok((operator, format!("127.0.0.1:{port}")))
    }
}

/// Kills an operator the bench started, and every process under it: under a wrapper
/// (`ZKLOCK_BENCH_WRAP`) the operator is the wrapper's descendant, and a kill of the wrapper
/// alone would leave it serving every namespace through the parts that follow.
fn stop(child: &mut Child) {
    let mut kin = vec![child.id()];
    let mut i = 0;
    // Every process's parent, from /proc (a process that ends meanwhile is skipped).
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command's name, which is in parentheses and may hold anything.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    while let Some(&parent) = kin.get(i) {
        kin.extend(parents.iter().filter(|(_, p)| *p == parent).map(|(pid, _)| *pid));
        i += 1;
    }
    for pid in kin.iter().skip(1) {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn rss(pid: u32) -> Result<u64, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kb * 1024)
}

/// Waits at most two minutes for `what` of claim `name`.
async fn within(name: &str, what: &str, wait: impl std::future::Future<Output = ()>) -> Result<(), Error> {
    tokio::time::timeout(Duration::from_secs(120), wait)
        .await
        .map_err(|_| format!("{name} not {what} within 120 s").into())
}

/// Claims seen Held, and claims seen deleted.
#[derive(Default)]
struct Seen {
    sets: std::sync::Mutex<Sets>,
    changed: tokio::sync::Notify,
    /// The status of the last claim seen Held, as the operator wrote it.
    held: std::sync::Mutex<Option<serde_json::Value>>,
}

type Sets = (std::collections::HashSet<String>, std::collections::HashSet<String>);

impl Seen {
    async fn wait(&self, done: impl Fn(&Sets) -> bool) {
        notified_until(&self.changed, &self.sets, done).await;
    }
}

/// Waits until `done` holds of `state`, looked at again at each notification of `changed`
/// (which whoever changes `state` sends); answers when it held. No deadline of its own.
async fn notified_until<T>(
    changed: &tokio::sync::Notify,
    state: &std::sync::Mutex<T>,
    done: impl Fn(&T) -> bool,
) -> Instant {
    loop {
        // Asked for before the look, so that a change between the two is not missed.
        let notified = changed.notified();
        if done(&state.lock().unwrap_or_else(|p| p.into_inner())) {
            return Instant::now();
        }
        notified.await;
    }
}

struct HandoffResult {
    latency: Samples,
    /// The status of a claim seen Held, as the operator wrote it.
    held: Option<serde_json::Value>,
    zk_events_per_handoff: f64,
    writes_per_handoff: f64,
    /// The operator's own part, mean over the handoffs: its `zklock_handoff_seconds`, from the
    /// holder's node deleted to the next claim's Held written.
    inside_mean: Duration,
    /// The share of those within 8 ms and within 16 ms (the histogram's buckets).
    inside_within: [f64; 2],
}

impl HandoffResult {
    /// `other`'s handoffs added to these: its samples, and its per-handoff figures weighted by
    /// its number of handoffs.
    fn add(&mut self, other: HandoffResult) {
        let mean = weighted(self.latency.0.len(), other.latency.0.len());
        self.zk_events_per_handoff = mean(self.zk_events_per_handoff, other.zk_events_per_handoff);
        self.writes_per_handoff = mean(self.writes_per_handoff, other.writes_per_handoff);
        self.inside_mean =
            Duration::from_secs_f64(mean(self.inside_mean.as_secs_f64(), other.inside_mean.as_secs_f64()));
        for (within, other) in self.inside_within.iter_mut().zip(other.inside_within) {
            *within = mean(*within, other);
        }
        self.latency.0.extend(other.latency.0);
        self.held = self.held.take().or(other.held);
    }

    fn summary(&self) -> String {
        format!(
            "{}  | ZooKeeper watch events/handoff {:.2}  API writes/handoff {:.2}  node deleted -> Held written \
             (the operator's zklock_handoff_seconds) mean {:.1} ms, {:.0} % within 8 ms, {:.0} % within 16 ms",
            self.latency.summary(),
            self.zk_events_per_handoff,
            self.writes_per_handoff,
            self.inside_mean.as_secs_f64() * 1000.0,
            self.inside_within[0] * 100.0,
            self.inside_within[1] * 100.0
        )
    }
}

#[derive(Default, Clone)]
struct Samples(Vec<Duration>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    fn percentile(&self, q: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or_default()
    }

    fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        format!("p50 {:.1} ms  p99 {:.1} ms  (n={})", ms(self.percentile(0.5)), ms(self.percentile(0.99)), self.0.len())
    }
}

/// What the benchmark reads of the control plane itself: the CPU time of its kube-apiserver
/// and etcd processes (when `scripts/k8s.sh` started them: it lists their PIDs beside the
/// kubeconfig) and the API server's own request and watch counters (its `/metrics`).
struct ServerProbe {
    client: kube::Client,
    apiserver: Option<u32>,
    etcd: Option<u32>,
    /// Other processes on the machine whose CPU time is read too (the operator, ZooKeeper, the
    /// bench): on two cores, every process's CPU per lifecycle bounds the rate.
    others: Vec<(&'static str, Option<u32>)>,
    tick: f64,
}

/// One reading of [`ServerProbe`].
#[derive(Clone)]
struct ServerSample {
    apiserver_cpu: Option<f64>,
    etcd_cpu: Option<f64>,
    /// The CPU seconds of [`ServerProbe::others`], in their order.
    others_cpu: Vec<(&'static str, Option<f64>)>,
    /// `VERB resource[/subresource]` → requests served.
    requests: HashMap<String, f64>,
    /// resource → watch events sent.
    watch_events: HashMap<String, f64>,
}

/// The resources whose requests a lifecycle is made of (the operator's leader Lease and epoch
/// ConfigMap are renewed on a timer, not per claim, and are left out).
const PROBED: [&str; 4] = ["lockclaims", "events", "pods", "locks"];

impl ServerProbe {
    fn new(client: &kube::Client, server: &Server) -> ServerProbe {
        let pids = server.kubeconfig.parent().map(|dir| dir.join("pids"));
        let pids = pids.and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        let pid = |name: &str| {
            pids.lines().find_map(|l| l.split_once(' ').filter(|(_, n)| *n == name).and_then(|(p, _)| p.parse().ok()))
        };
        let tick = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0);
        let (apiserver, etcd) = (pid("kube-apiserver"), pid("etcd"));
        ServerProbe { client: client.clone(), apiserver, etcd, others: vec![], tick }
    }

    /// Reads process `pid`'s CPU time too, as `name`.
    fn with(mut self, name: &'static str, pid: Option<u32>) -> ServerProbe {
        self.others.push((name, pid));
        self
    }

    /// CPU seconds (user + system) a process has used.
    fn cpu(&self, pid: Option<u32>) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
        // Fields after the command name (which may hold spaces): utime and stime are 12th and 13th.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / self.tick)
    }

    async fn sample(&self) -> ServerSample {
        let mut sample = ServerSample {
            apiserver_cpu: self.cpu(self.apiserver),
            etcd_cpu: self.cpu(self.etcd),
            others_cpu: self.others.iter().map(|(name, pid)| (*name, self.cpu(*pid))).collect(),
            requests: HashMap::new(),
            watch_events: HashMap::new(),
        };
        let Ok(request) = http::Request::get("/metrics").body(vec![]) else { return sample };
        // A server that does not let us read its metrics leaves the counters empty.
        let text = self.client.request_text(request).await.unwrap_or_default();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once('{') else { continue };
            let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let label = |key: &str| {
                let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
                labels[start..].split('"').next()
            };
            let resource = label("resource").unwrap_or_default();
            if !PROBED.contains(&resource) {
                continue;
            }
            match name {
                "apiserver_request_total" => {
                    let sub =
                        label("subresource").filter(|s| !s.is_empty()).map(|s| format!("/{s}")).unwrap_or_default();
                    let key = format!("{} {resource}{sub}", label("verb").unwrap_or_default());
                    *sample.requests.entry(key).or_default() += value;
                }
                "apiserver_watch_events_total" => {
                    *sample.watch_events.entry(resource.to_string()).or_default() += value
                }
                _ => {}
            }
        }
        sample
    }
}

impl ServerSample {
    /// kube-apiserver's CPU seconds between `before` and this sample, when it was measured.
    fn apiserver_cpu_since(&self, before: &ServerSample) -> Option<f64> {
        Some(self.apiserver_cpu? - before.apiserver_cpu?)
    }

    /// Adds to this reading what changed from `before` to `after`: a reading that has added
    /// several such spans, read with [`ServerSample::per`] against the reading it started as,
    /// gives their sum (batches of a part that alternate with other work).
    fn add(&mut self, before: &ServerSample, after: &ServerSample) {
        let add = |total: &mut Option<f64>, before: Option<f64>, after: Option<f64>| {
            *total = match (*total, before, after) {
                (Some(t), Some(b), Some(a)) => Some(t + a - b),
                _ => None,
            }
        };
        add(&mut self.apiserver_cpu, before.apiserver_cpu, after.apiserver_cpu);
        add(&mut self.etcd_cpu, before.etcd_cpu, after.etcd_cpu);
        for (((_, total), (_, b)), (_, a)) in self.others_cpu.iter_mut().zip(&before.others_cpu).zip(&after.others_cpu)
        {
            add(total, *b, *a);
        }
        for (totals, before, after) in [
            (&mut self.requests, &before.requests, &after.requests),
            (&mut self.watch_events, &before.watch_events, &after.watch_events),
        ] {
            for (key, a) in after {
                *totals.entry(key.clone()).or_default() += a - before.get(key).copied().unwrap_or(0.0);
            }
        }
    }

    /// What the API server did between `before` and this sample, per `lifecycles`, as lines.
    fn per(&self, before: &ServerSample, lifecycles: usize, what: &str) -> String {
        let n = lifecycles as f64;
        let ms = |after: Option<f64>, before: Option<f64>| match (after, before) {
            (Some(a), Some(b)) => format!("{:.2} ms", (a - b) * 1000.0 / n),
            _ => "not measured (the control plane was not started by this project)".into(),
        };
        let mut out = format!(
            "kube-apiserver CPU per {what}: {} (etcd {}) over {lifecycles}\n",
            ms(self.apiserver_cpu, before.apiserver_cpu),
            ms(self.etcd_cpu, before.etcd_cpu)
        );
        if !self.others_cpu.is_empty() {
            let mut total = 0.0;
            let mut each = vec![];
            let all = [
                ("kube-apiserver", self.apiserver_cpu, before.apiserver_cpu),
                ("etcd", self.etcd_cpu, before.etcd_cpu),
            ];
            let others = self.others_cpu.iter().zip(&before.others_cpu).map(|((name, a), (_, b))| (*name, *a, *b));
            for (name, after, before) in all.into_iter().chain(others) {
                if let (Some(a), Some(b)) = (after, before) {
                    total += (a - b) * 1000.0 / n;
                    each.push(format!("{name} {:.2}", (a - b) * 1000.0 / n));
                }
            }
            // The processes share the cores: the rate is at most their CPU seconds a second over this.
            let cores = cores();
            let most = 1000.0 * cores as f64 / total.max(f64::MIN_POSITIVE);
            out.push_str(&format!(
                "the machine's CPU per {what}: {total:.2} ms ({}); {cores} cores: at most {most:.0}/s\n",
                each.join(", "),
            ));
        }
        let delta = |after: &HashMap<String, f64>, before: &HashMap<String, f64>| {
            let mut d: Vec<(String, f64)> = after
                .iter()
                .map(|(k, v)| (k.clone(), (v - before.get(k).copied().unwrap_or(0.0)) / n))
                .filter(|(_, v)| *v >= 0.005)
                .collect();
            d.sort_by(|a, b| a.0.cmp(&b.0));
            d
        };
        let requests = delta(&self.requests, &before.requests);
        if requests.is_empty() {
            out.push_str("API requests per lifecycle: not served by this API server's /metrics\n");
            return out;
        }
        let total: f64 = requests.iter().filter(|(k, _)| !k.starts_with("WATCH")).map(|(_, v)| v).sum();
        let listed: Vec<String> = requests.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        out.push_str(&format!("API requests per {what}: {total:.2} ({})\n", listed.join(", ")));
        let watch: Vec<String> =
            delta(&self.watch_events, &before.watch_events).iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        out.push_str(&format!("watch events sent per {what}: {}", watch.join(", ")));
        out
    }
}

/// The machine's cores (what the processes of a run share).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
