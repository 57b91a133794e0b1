//! The clusters part: a `ClusterLock` shared by two control planes.

use crate::harness::{install_crd, Bench, Samples, Server};
use crate::{Error, Sizes};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;
use std::time::{Duration, Instant};
use zklock::api::{ClusterLock, LockClaim, Phase};

/// Handoffs on a `ClusterLock` two clusters share: within cluster a (holder and next both a's),
/// within cluster b, from a to b (the holder deleted in a, the next claim seen Held in b), interleaved round by
/// round so that both meet the same machine; then a→b again with `ZOOKEEPER_LATENCY` added to
/// every request of b's operator (b in another region).
pub(crate) async fn clusters(
    client_a: &kube::Client,
    server_a: &Server,
    zk: &zklock_testkit::ZkServer,
    sizes: &Sizes,
) -> Result<(), Error> {
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
    // The ClusterLock is cluster-scoped: deleted in both clusters whatever the part came to,
    // so that a later run (or the tests, on the same control plane) do not serve it too.
    let measured = measure(&mut a, &b, &proxy, &connect, &name, sizes).await;
    for client in [client_a, &client_b] {
        let _ = Api::<ClusterLock>::all(client.clone()).delete(&name, &DeleteParams::default()).await;
    }
    measured
}

/// The handoffs, the leader changes and their figures, on ClusterLock `name`.
async fn measure(
    a: &mut Bench,
    b: &Bench,
    proxy: &zklock_testkit::proxy::Proxy,
    connect: &str,
    name: &str,
    sizes: &Sizes,
) -> Result<(), Error> {
    const ZOOKEEPER_LATENCY: Duration = Duration::from_millis(20);
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
        within.push(handoff(a, a).await?);
        within_b.push(handoff(b, b).await?);
        across.push(handoff(a, b).await?);
    }
    proxy.set_latency(ZOOKEEPER_LATENCY);
    for _ in 0..sizes.handoffs {
        slow.push(handoff(a, b).await?);
    }
    proxy.set_latency(Duration::ZERO);

    // A leader change in cluster a (SIGTERM with a standby running, as a `helm upgrade` does)
    // while a's claim holds, b's waits behind it and a's second waits behind that: how long to
    // the Lease and to ready, whether any place (node) or holder's token changed, and the first
    // handoff after it (a's holder deleted → b's waiter Held).
    let zk_client = zookeeper_client::Client::connect(connect).await?;
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
        for (bench, claim) in [(b, &wb), (&*a, &wa)] {
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
