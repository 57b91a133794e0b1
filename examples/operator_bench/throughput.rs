//! The throughput part: uncontended acquire and release beside Apache Curator.

use crate::floors::{floor, unserved_namespace};
use crate::harness::{Bench, Samples, Server, BATCHES};
use crate::probe::ServerProbe;
use crate::{Error, Sizes};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use std::time::Instant;
use zklock::api::LockClaim;

pub(crate) async fn throughput(
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
