//! The failover part: the leader stopped, then killed, under queued claims.

use crate::harness::{metric_at, unscheduled_pod, Bench, Claims, Seen3, Server};
use crate::Error;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};
use zklock::api::Phase;

/// A leader change under load: `claims` claims queued ten per lock, a standby ready, then the
/// leader stopped gracefully (SIGTERM, as `helm upgrade` does) and, with a new standby, killed
/// (SIGKILL, a node lost). At the signal a holder is deleted and a claim is made on a free lock,
/// as users would meanwhile. Times from the signal: the standby leads; the released lock's next
/// claim is Held; the new claim is Held; every claim carries the new leader's epoch (re-stamped).
/// Also what the takeover cost (the new leader's API calls and ZooKeeper writes until every
/// claim was re-stamped) and whether any other holder or token changed.
/// Holder pods deleted at the start of each failover round's new term.
pub(crate) const FIRST_SECOND_PODS: usize = 20;

pub(crate) async fn failover(
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
        // The paced walk re-stamps at the API server's status write rate (150–200/s here).
        let restamped = watched.until(Duration::from_secs(300 + claims as u64 / 200), |s| {
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
