//! The scale part: one operator over many namespaces' claims.

use crate::floors::{handoff_floor, FloorStart};
use crate::harness::{
    get_at, install_epoch_policy_over, install_finalizer_policy_over, metric_at, rss, stop, Bench, Claims, Launch,
    Samples, Seen3, Server,
};
use crate::probe::ServerProbe;
use crate::Error;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::Api;
use serde_json::json;
use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zklock::api::{LockClaim, Phase};

/// `claims` claims in `claims / 100` namespaces of their own, ten claims per lock (one holder,
/// nine waiting), served by one operator for every namespace (the Lease and the epoch parameter
/// in a namespace of their own, the policies bound to every bench namespace). Measures: the
/// claims created (32 at once) and queued; the operator's memory per claim then; a fresh
/// operator started on them (the first one stopped): listed, leading, ready (re-anchored), and
/// the API server's CPU for that start; its memory per claim; and the handoff at this size beside
/// its floor (the holder deleted, its final status, the next Held, by the bench alone).
pub(crate) async fn scale(
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
pub(crate) const SETTLE: Duration = Duration::from_secs(15);

/// The measuring of [`scale`] on its namespaces `names`, with the Lease in `home`.
pub(crate) async fn scale_measure(
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

/// Not timed, after a run of [`scale`] that measured or failed: the namespaces named
/// `prefix…` go, their claims finalized by an operator started for it (the finalizer is its; a
/// namespace deleted with none stays Terminating, and the next run's operator, which serves
/// every namespace, would serve its claims), then the operator and its `home`.
pub(crate) async fn scale_cleanup(
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
