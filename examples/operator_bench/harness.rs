//! The harness: an operator per bench (`Bench`), launched and stopped, on the run's API server;
//! zklock's CRDs and policies through `zklock_testkit::install`; samples and waits.

use crate::Error;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use serde_json::json;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zklock::api::{Lock, LockClaim, Phase};

/// The permits of the semaphore lock the handoff benchmark measures next to a mutex.
pub(crate) const SEMAPHORE_PERMITS: usize = 3;

/// The finalizer's admission policy (as the chart installs it), and a binding for namespace `ns`.
pub(crate) async fn install_finalizer_policy(client: &kube::Client, ns: &str) -> Result<(), Error> {
    install_finalizer_policy_over(client, &[ns.to_string()], ns).await
}

/// The finalizer policy, and one binding (named after `name`) for `namespaces`; in force once a
/// dry-run create in the first of them shows it.
pub(crate) async fn install_finalizer_policy_over(
    client: &kube::Client,
    namespaces: &[String],
    name: &str,
) -> Result<(), Error> {
    let ns = namespaces.first().ok_or("no namespace to bind the finalizer policy to")?;
    let name = format!("{}-{name}", zklock::api::finalizer_policy::FINALIZER_POLICY);
    zklock_testkit::install::finalizer_policy(client, "zklock-bench", &name, namespaces).await?;
    zklock_testkit::install::finalizer_policy_in_force(client, ns).await?;
    Ok(())
}

/// The leader epoch's admission policy, and a binding for namespace `ns` with its parameter there.
pub(crate) async fn install_epoch_policy(client: &kube::Client, ns: &str) -> Result<(), Error> {
    install_epoch_policy_over(client, ns, &[ns.to_string()]).await
}

/// The epoch policy, and one binding for `namespaces` with the parameter in `home`.
pub(crate) async fn install_epoch_policy_over(
    client: &kube::Client,
    home: &str,
    namespaces: &[String],
) -> Result<(), Error> {
    let name = format!("{}-{home}", zklock::api::epoch_policy::EPOCH_POLICY);
    zklock_testkit::install::epoch_policy(client, "zklock-bench", &name, home, namespaces).await?;
    Ok(())
}

/// zklock's CRDs, served and creatable.
pub(crate) async fn install_crd(client: &kube::Client) -> Result<(), Error> {
    zklock_testkit::install::crds(client, "zklock-bench").await?;
    Ok(())
}

/// The API server the benchmark runs on.
#[derive(Clone)]
pub(crate) struct Server {
    pub(crate) kubeconfig: std::path::PathBuf,
    /// The finalizer's admission policy is installed for the bench's namespaces.
    pub(crate) finalizer_policy: bool,
}

/// One operator process serving one namespace of its own.
pub(crate) struct Bench {
    pub(crate) client: kube::Client,
    pub(crate) ns: String,
    pub(crate) claims: Api<LockClaim>,
    pub(crate) operator: Child,
    pub(crate) metrics: String,
    pub(crate) launch: Launch,
}

impl Drop for Bench {
    fn drop(&mut self) {
        stop(&mut self.operator);
    }
}

impl Bench {
    pub(crate) async fn start(
        client: &kube::Client,
        server: &Server,
        zk: &zklock_testkit::ZkServer,
        name: &str,
    ) -> Result<Bench, Error> {
        Self::start_with(client, server, &zk.chroot().await, name, &[]).await
    }

    /// [`Bench::start`] with ZooKeeper at `zk` (a connect string with its chroot) and `extra`
    /// flags for the operator.
    pub(crate) async fn start_with(
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
    pub(crate) async fn standby(&self) -> Result<(Child, String), Error> {
        let (child, metrics) = self.launch.spawn(&self.ns)?;
        self.until_ready(&metrics, false).await?;
        Ok((child, metrics))
    }

    /// Stops the leading operator gracefully (SIGTERM) with `standby` running; answers how long
    /// the standby took to lead and to be ready (re-anchored), from the signal.
    pub(crate) async fn hand_over(&mut self, standby: (Child, String)) -> Result<(Duration, Duration), Error> {
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
    pub(crate) async fn until_ready(&self, metrics: &str, leading: bool) -> Result<(), Error> {
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

    pub(crate) async fn metric(&self, name: &str) -> f64 {
        metric_at(&self.metrics, name).await
    }

    /// The lock engine's ZooKeeper operations so far, by kind.
    pub(crate) async fn zk_operations(&self) -> std::collections::BTreeMap<String, f64> {
        let text = get_at(&self.metrics, "/metrics").await.unwrap_or_default();
        text.lines()
            .filter_map(|l| l.strip_prefix("zklock_zookeeper_operations_total{op=\""))
            .filter_map(|l| {
                let (op, rest) = l.split_once('"')?;
                Some((op.to_string(), rest.rsplit(' ').next()?.parse().ok()?))
            })
            .collect()
    }

    pub(crate) async fn create(&self, name: &str, lock: &str, holder: Option<&str>) -> Result<(), Error> {
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

    pub(crate) async fn wait_gone(&self, name: &str) -> Result<(), Error> {
        let gone = await_condition(self.claims.clone(), name, |c: Option<&LockClaim>| c.is_none());
        tokio::time::timeout(Duration::from_secs(120), gone)
            .await
            .map_err(|_| format!("{name} not gone within 120 s"))??;
        Ok(())
    }

    pub(crate) async fn wait_phase(&self, name: &str, phase: Phase) -> Result<(), Error> {
        let cond = move |c: Option<&LockClaim>| c.and_then(|c| c.status.as_ref()).and_then(|s| s.phase) == Some(phase);
        tokio::time::timeout(Duration::from_secs(120), await_condition(self.claims.clone(), name, cond))
            .await
            .map_err(|_| format!("{name} not {phase:?} within 120 s"))??;
        Ok(())
    }

    /// Handoffs on lock `l` with `permits` permits (a `Lock` object when more than one): each
    /// round queues `permits` holders and `waiters` waiters, then deletes the oldest holder and
    /// times until the first waiter is seen Held, again and again.
    pub(crate) async fn handoffs(
        &self,
        permits: usize,
        waiters: usize,
        handoffs: usize,
    ) -> Result<HandoffResult, Error> {
        self.handoffs_on("l", "c", permits, waiters, handoffs).await
    }

    /// [`Bench::handoffs`] with claims over `locks` (`a,b`: every claim over both), named
    /// `names` and a number (a name each call has not used yet).
    pub(crate) async fn handoffs_on(
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
    pub(crate) async fn pod_deletions(&self, from: usize, rounds: usize) -> Result<PodRounds, Error> {
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
    pub(crate) async fn gated_handoffs(
        &self,
        from: usize,
        rounds: usize,
    ) -> Result<(Samples, f64, serde_json::Value), Error> {
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
    pub(crate) fn follow(&self) -> (Arc<Seen>, tokio::task::JoinHandle<()>) {
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
    pub(crate) async fn lifecycles(&self, n: usize) -> Result<Samples, Error> {
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
    pub(crate) async fn throughput(
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

    pub(crate) async fn memory(&self, claims: usize) -> Result<(f64, u64), Error> {
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

pub(crate) async fn get_at(address: &str, path: &str) -> Option<String> {
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
pub(crate) async fn metric_at(address: &str, name: &str) -> f64 {
    let text = get_at(address, "/metrics").await.unwrap_or_default();
    // A fold, not `sum`: the sum of no samples is -0.
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, x| sum + x)
}

/// How to start one more operator process like a bench's.
#[derive(Clone)]
pub(crate) struct Launch {
    pub(crate) server: Server,
    pub(crate) zk: String,
    pub(crate) extra: Vec<String>,
}

impl Launch {
    /// Starts an operator serving namespace `ns`; answers it and its metrics address.
    pub(crate) fn spawn(&self, ns: &str) -> Result<(Child, String), Error> {
        self.spawn_serving(ns, Some(ns))
    }

    /// Starts an operator with its Lease (and epoch parameter) in `home`, serving `served` or
    /// every namespace.
    pub(crate) fn spawn_serving(&self, home: &str, served: Option<&str>) -> Result<(Child, String), Error> {
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
pub(crate) fn stop(child: &mut Child) {
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

pub(crate) fn rss(pid: u32) -> Result<u64, Error> {
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
pub(crate) async fn within(name: &str, what: &str, wait: impl std::future::Future<Output = ()>) -> Result<(), Error> {
    tokio::time::timeout(Duration::from_secs(120), wait)
        .await
        .map_err(|_| format!("{name} not {what} within 120 s").into())
}

/// Claims seen Held, and claims seen deleted.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) sets: std::sync::Mutex<Sets>,
    pub(crate) changed: tokio::sync::Notify,
    /// The status of the last claim seen Held, as the operator wrote it.
    pub(crate) held: std::sync::Mutex<Option<serde_json::Value>>,
}

pub(crate) type Sets = (std::collections::HashSet<String>, std::collections::HashSet<String>);

impl Seen {
    pub(crate) async fn wait(&self, done: impl Fn(&Sets) -> bool) {
        notified_until(&self.changed, &self.sets, done).await;
    }
}

/// Waits until `done` holds of `state`, looked at again at each notification of `changed`
/// (which whoever changes `state` sends); answers when it held. No deadline of its own.
pub(crate) async fn notified_until<T>(
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

pub(crate) struct HandoffResult {
    pub(crate) latency: Samples,
    /// The status of a claim seen Held, as the operator wrote it.
    pub(crate) held: Option<serde_json::Value>,
    pub(crate) zk_events_per_handoff: f64,
    pub(crate) writes_per_handoff: f64,
    /// The operator's own part, mean over the handoffs: its `zklock_handoff_seconds`, from the
    /// holder's node deleted to the next claim's Held written.
    pub(crate) inside_mean: Duration,
    /// The share of those within 8 ms and within 16 ms (the histogram's buckets).
    pub(crate) inside_within: [f64; 2],
}

impl HandoffResult {
    /// `other`'s handoffs added to these: its samples, and its per-handoff figures weighted by
    /// its number of handoffs.
    pub(crate) fn add(&mut self, other: HandoffResult) {
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

    pub(crate) fn summary(&self) -> String {
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
pub(crate) struct Samples(pub(crate) Vec<Duration>);

impl Samples {
    pub(crate) fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub(crate) fn percentile(&self, q: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or_default()
    }

    pub(crate) fn summary(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        format!("p50 {:.1} ms  p99 {:.1} ms  (n={})", ms(self.percentile(0.5)), ms(self.percentile(0.99)), self.0.len())
    }
}

/// Batches a side-by-side run is cut into.
pub(crate) const BATCHES: usize = 5;

/// The mean of a per-round figure over `n` rounds (figure `a`) and `m` more (figure `b`).
pub(crate) fn weighted(n: usize, m: usize) -> impl Fn(f64, f64) -> f64 {
    let (n, m) = (n as f64, m as f64);
    move |a, b| if n + m > 0.0 { (a * n + b * m) / (n + m) } else { 0.0 }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// What the holder pod rounds measured.
pub(crate) struct PodRounds {
    pub(crate) latency: Samples,
    /// From the deletion to the bench's watch of the pods seeing the pod gone (the part of the
    /// handoff before the operator can act: its watch sees it about then).
    pub(crate) gone_seen: Samples,
    pub(crate) held: Option<serde_json::Value>,
    /// The operator's pod GETs per round, from the holder pod's deletion to the next Held.
    pub(crate) gets_timed: f64,
    /// The same, with the next claim's creation and first reconcile.
    pub(crate) gets_all: f64,
}

impl PodRounds {
    /// `other`'s rounds added to these (its per-round figures weighted by its rounds).
    pub(crate) fn add(&mut self, other: PodRounds) {
        let mean = weighted(self.latency.0.len(), other.latency.0.len());
        self.gets_timed = mean(self.gets_timed, other.gets_timed);
        self.gets_all = mean(self.gets_all, other.gets_all);
        self.latency.0.extend(other.latency.0);
        self.gone_seen.0.extend(other.gone_seen.0);
        self.held = other.held.or(self.held.take());
    }
}

/// A pod with zklock's scheduling gate, no node runs; with `lock`, annotated to hold it (zklock
/// then makes its claim and removes the gate on grant).
pub(crate) fn gated_pod(name: &str, lock: Option<&str>) -> Result<Pod, Error> {
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
pub(crate) fn unscheduled_pod(name: &str) -> Result<Pod, Error> {
    Ok(serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "schedulerName": "zklock-bench-no-scheduler",
        "containers": [{"name": "m", "image": "busybox"}],
    }}))?)
}

/// A claim's phase, fencing token, and the leader epoch of its last status write.
pub(crate) type Seen3 = (Option<Phase>, Option<String>, Option<i64>);

/// What a watch of the bench's namespace says of each claim.
#[derive(Default)]
pub(crate) struct Claims {
    pub(crate) state: std::sync::Mutex<HashMap<String, Seen3>>,
    pub(crate) changed: tokio::sync::Notify,
}

impl Claims {
    pub(crate) fn follow(api: Api<LockClaim>) -> (Arc<Claims>, tokio::task::JoinHandle<()>) {
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
    pub(crate) async fn until(
        &self,
        limit: Duration,
        done: impl Fn(&HashMap<String, Seen3>) -> bool,
    ) -> Option<Instant> {
        tokio::time::timeout(limit, notified_until(&self.changed, &self.state, done)).await.ok()
    }

    pub(crate) fn snapshot(&self) -> HashMap<String, Seen3> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
