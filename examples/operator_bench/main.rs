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
//! `--only handoff|pods|gated|throughput|memory|clusters|failover|locks|fencing|scale` runs one part (`fencing`:
//! a Lock whose fencing is Enforced handed on beside one without, alternating, and a guarded
//! object's write beside an unguarded one's, the API server's CPU per write; `locks`:
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

use crate::clusters::clusters;
use crate::failover::failover;
use crate::fencing::fencing;
use crate::floors::{handoff_floor, Floor, FloorStart};
use crate::handoff::handoffs;
use crate::harness::{install_crd, median, weighted, Bench, Server, BATCHES};
use crate::locks::lock_statuses;
use crate::probe::ServerProbe;
use crate::scale::scale;
use crate::throughput::throughput;

mod clusters;
mod failover;
mod fencing;
mod floors;
mod handoff;
mod harness;
mod locks;
mod probe;
mod scale;
mod throughput;

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

pub(crate) struct Sizes {
    /// Claims queued (ten per lock) under the leader changes of the failover part.
    pub(crate) failover_claims: Vec<usize>,
    pub(crate) waiters: [usize; 2],
    pub(crate) handoffs: usize,
    pub(crate) pod_rounds: usize,
    pub(crate) locks: usize,
    pub(crate) lifecycles: usize,
    pub(crate) memory_claims: usize,
    /// Claims of the scale part (100 per namespace, 10 per lock).
    pub(crate) scale_claims: usize,
    /// `Lock` objects of the locks part (ten claims each).
    pub(crate) status_locks: usize,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let parts =
        ["handoff", "pods", "gated", "throughput", "memory", "clusters", "failover", "locks", "fencing", "scale"];
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
    if runs("fencing") {
        fencing(&client, &server, zk, sizes.handoffs, 10 * sizes.lifecycles).await?;
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
