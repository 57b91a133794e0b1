//! The locks part: `Lock` objects' statuses, settled and refreshed.

use crate::harness::{notified_until, within, Bench, Samples, Server, Sets};
use crate::probe::{ServerProbe, ServerSample};
use crate::Error;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zklock::api::{Lock, LockClaim};

/// Claims per lock in the `locks` part; two of them hold (the `Lock` has two permits).
pub(crate) const LOCK_PART_CLAIMS: usize = 10;

/// How often the `locks` part changes each busy lock's claims: faster than a status refresh may
/// come (500 ms), as a busy lock's handoffs do.
pub(crate) const BUSY_TICK: Duration = Duration::from_millis(200);

/// `Lock` objects' status with `locks` of them (two permits, ten claims each) in one namespace:
/// how long until every status shows its claims; how long after a grant on a quiet lock its
/// status names the new holder; and on busy locks (a claim made on each every 200 ms for 10 s)
/// how far apart the status refreshes come, how many status writes the operator makes, and its
/// CPU.
pub(crate) async fn lock_statuses(
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
pub(crate) async fn queue_order(claims: &Api<LockClaim>) -> Result<(usize, usize, Samples), Error> {
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
pub(crate) async fn lock_statuses_measure(
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
pub(crate) struct LockStatuses {
    pub(crate) history: std::sync::Mutex<HashMap<String, Vec<(Instant, zklock::api::LockStatus)>>>,
    pub(crate) changed: tokio::sync::Notify,
}

impl LockStatuses {
    pub(crate) fn follow(api: Api<Lock>) -> Arc<LockStatuses> {
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
    pub(crate) fn latest(&self, name: &str) -> Option<zklock::api::LockStatus> {
        let history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        history.get(name).and_then(|h| h.last()).map(|(_, status)| status.clone())
    }

    pub(crate) fn snapshot(&self) -> HashMap<String, Vec<(Instant, zklock::api::LockStatus)>> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits at most `limit` until `done`; answers when it was seen.
    pub(crate) async fn until(
        &self,
        limit: Duration,
        what: &str,
        done: impl Fn(&HashMap<String, Vec<(Instant, zklock::api::LockStatus)>>) -> bool,
    ) -> Result<Instant, Error> {
        let wait = notified_until(&self.changed, &self.history, done);
        tokio::time::timeout(limit, wait).await.map_err(|_| format!("waited {limit:?} for {what}").into())
    }
}
