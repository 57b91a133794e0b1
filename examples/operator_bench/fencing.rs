//! The fencing part (issue 57, 1): what a Lock whose fencing is `Enforced` costs — its handoff
//! beside an unfenced lock's, alternating in batches on one operator (the grant waits for the
//! holds in force to be written into the policy's parameter and judged by the API server), and a
//! guarded object's write beside the same write of an unguarded one (the API server's CPU per
//! write, and its latency).

use crate::harness::{median, Bench, Samples, Server, BATCHES};
use crate::probe::ServerProbe;
use crate::Error;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use std::time::Instant;
use zklock::api::fencing_policy::{FENCED_BY, FENCING_PARAM, FENCING_TOKEN};
use zklock::api::Phase;

pub(crate) async fn fencing(
    client: &kube::Client,
    server: &Server,
    zk: &zklock_testkit::ZkServer,
    handoffs: usize,
    writes: usize,
) -> Result<(), Error> {
    let bench = Bench::start(client, server, zk, "fencing").await?;
    let name = format!("zklock-fencing-{}", bench.ns);
    let namespaces = [bench.ns.clone()];
    let made =
        zklock_testkit::install::fencing_policy(client, "zklock-bench", (&name, FENCING_PARAM), &bench.ns, &namespaces)
            .await;
    // The policies are cluster-scoped: removed whatever the part came to.
    let _removed = Removed { kubeconfig: server.kubeconfig.clone(), objects: made.clone().unwrap_or_default() };
    made?;
    let locks: Api<zklock::api::Lock> = Api::namespaced(client.clone(), &bench.ns);
    for (lock, fencing) in [("fenced", "Enforced"), ("plain", "Off")] {
        let object: zklock::api::Lock = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
            "metadata": { "name": lock }, "spec": { "fencing": fencing },
        }))?;
        locks.create(&PostParams::default(), &object).await?;
    }
    let seen = |l: Option<&zklock::api::Lock>| l.is_some_and(|l| l.status.is_some());
    for lock in ["fenced", "plain"] {
        let wait = kube::runtime::wait::await_condition(locks.clone(), lock, seen);
        tokio::time::timeout(std::time::Duration::from_secs(60), wait).await.map_err(|_| "the Locks not seen")??;
    }
    // The handoff, fenced and not, in batches that alternate (10 waiters each round).
    let per_batch = (handoffs / BATCHES).max(1);
    let (mut fenced, mut plain) = (None::<crate::harness::HandoffResult>, None::<crate::harness::HandoffResult>);
    let mut ratios = vec![];
    for batch in 0..BATCHES {
        let f = bench.handoffs_on("fenced", &format!("f{batch}-"), 1, 10, per_batch).await?;
        let p = bench.handoffs_on("plain", &format!("p{batch}-"), 1, 10, per_batch).await?;
        ratios.push(f.latency.percentile(0.5).as_secs_f64() / p.latency.percentile(0.5).as_secs_f64());
        match &mut fenced {
            Some(all) => all.add(f),
            None => fenced = Some(f),
        }
        match &mut plain {
            Some(all) => all.add(p),
            None => plain = Some(p),
        }
    }
    let (fenced, plain) = (fenced.ok_or("no fenced handoff")?, plain.ok_or("no handoff")?);
    println!("fencing: handoff on a Lock with fencing Enforced: {}", fenced.summary());
    println!("fencing: handoff on a Lock without, the same operator, alternating: {}", plain.summary());
    println!(
        "fencing: fenced / unfenced handoff p50, batch by batch {}, median {:.2}",
        ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
        median(&ratios)
    );

    // A guarded object's write beside an unguarded one's, alternating: the holder of "fenced"
    // writes with its token; the same merge patch of an unlabelled ConfigMap.
    bench.create("writer", "fenced", None).await?;
    bench.wait_phase("writer", Phase::Held).await?;
    let holder = bench.claims.get("writer").await?;
    let token = holder.status.and_then(|s| s.fencing_token).ok_or("the writer's claim has no token")?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &bench.ns);
    for (object, guarded) in [("guarded", true), ("unguarded", false)] {
        let mut metadata = json!({ "name": object, "annotations": { FENCING_TOKEN: token } });
        if guarded {
            metadata["labels"] = json!({ FENCED_BY: "fenced" });
        }
        let map: ConfigMap = serde_json::from_value(json!({ "metadata": metadata, "data": { "n": "0" } }))?;
        configmaps.create(&PostParams::default(), &map).await?;
    }
    let probe = ServerProbe::new(client, server);
    let mut cpu = [0f64; 2];
    let mut latency = [Samples::default(), Samples::default()];
    let per_batch = (writes / BATCHES).max(1);
    for batch in 0..BATCHES {
        for (k, object) in ["guarded", "unguarded"].into_iter().enumerate() {
            let before = probe.sample().await;
            for i in 0..per_batch {
                let patch = json!({
                    "metadata": { "annotations": { FENCING_TOKEN: token } },
                    "data": { "n": (batch * per_batch + i).to_string() },
                });
                let start = Instant::now();
                configmaps.patch(object, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                latency[k].push(start.elapsed());
            }
            let after = probe.sample().await;
            cpu[k] += after.apiserver_cpu_since(&before).unwrap_or(f64::NAN);
        }
    }
    let n = (per_batch * BATCHES) as f64;
    println!(
        "fencing: a guarded object's write (merge patch with its token, judged by the policy): {}, kube-apiserver \
         CPU {:.3} ms/write; the same write of an unguarded object: {}, {:.3} ms/write; guarded / unguarded CPU {:.2}",
        latency[0].summary(),
        cpu[0] * 1000.0 / n,
        latency[1].summary(),
        cpu[1] * 1000.0 / n,
        cpu[0] / cpu[1]
    );
    Ok(())
}

/// Cluster-scoped objects of the part, deleted when it ends.
struct Removed {
    kubeconfig: std::path::PathBuf,
    objects: Vec<(&'static str, String)>,
}

impl Drop for Removed {
    fn drop(&mut self) {
        for (resource, name) in &self.objects {
            let _ = std::process::Command::new(zklock_testkit::kube::kubectl())
                .args(["--kubeconfig", &self.kubeconfig.display().to_string(), "--request-timeout=10s"])
                .args(["delete", resource, name, "--ignore-not-found", "--wait=false"])
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
}
