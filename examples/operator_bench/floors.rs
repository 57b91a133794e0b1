//! The floors: each path's writes made by the bench alone, in zklock's order.

use crate::harness::{
    gated_pod, install_epoch_policy, install_finalizer_policy, unscheduled_pod, within, Samples, Server,
};
use crate::Error;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zklock::api::{LockClaim, Phase};

/// The API server's own cost of a claim's lifecycle, without the operator: the requests the
/// lifecycle is made of (create, the Held status the operator wrote, delete, the finalizer's
/// removal; as JSON patches tested against the UID and resourceVersion, as the operator makes
/// them) made by the bench on `n` claims (named after `names`) of `claims`, a namespace no
/// operator serves, with the same admission policies and one watch of the namespace (the
/// caller's). Answers lifecycles per second.
pub(crate) async fn floor(
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
pub(crate) async fn handoff_floor(
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
pub(crate) async fn handoff_floor_with(
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
pub(crate) struct Floor {
    pub(crate) client: kube::Client,
    pub(crate) server: Server,
    pub(crate) ns: String,
    pub(crate) claims: Api<LockClaim>,
    pub(crate) pods: Api<Pod>,
    pub(crate) store: kube::runtime::reflector::Store<LockClaim>,
    pub(crate) pod_store: kube::runtime::reflector::Store<Pod>,
    pub(crate) changed: Arc<tokio::sync::Notify>,
    pub(crate) watches: [tokio::task::JoinHandle<()>; 2],
    /// The release's client, with `/epoch` and `/l` made under its own chroot.
    pub(crate) zk: Option<zookeeper_client::Client>,
    pub(crate) held: serde_json::Value,
    pub(crate) start_with: FloorStart,
    /// Rounds made so far: each round's names are new.
    pub(crate) made: usize,
}

impl Floor {
    pub(crate) async fn open(
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
    pub(crate) async fn pod_gone(&self, name: &str) {
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
    pub(crate) async fn pod_seen(&self, name: &str, done: fn(&Pod) -> bool) {
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
    pub(crate) async fn seen(&self, name: &str, done: fn(&LockClaim) -> bool) -> LockClaim {
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
    pub(crate) async fn rounds(&mut self, rounds: usize) -> Result<(Samples, Samples), Error> {
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
    pub(crate) async fn alternate(
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
    pub(crate) async fn close(self) -> Result<(), Error> {
        for watch in &self.watches {
            watch.abort();
        }
        Api::<Namespace>::all(self.client.clone()).delete(&self.ns, &DeleteParams::default()).await?;
        Ok(())
    }
}

/// Where a handoff's floor starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloorStart {
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

/// A namespace of its own that no operator serves, with the admission policies the bench's
/// operators meet (the epoch policy's parameter at the epoch of the `held` status copied), for
/// the API server's floors; answers it and its claims' API.
pub(crate) async fn unserved_namespace(
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
pub(crate) fn unserved_claim(name: &str, lock: &str, server: &Server) -> Result<LockClaim, Error> {
    let mut metadata = json!({"name": name});
    if !server.finalizer_policy {
        metadata["finalizers"] = json!([zklock::api::FINALIZER]);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": metadata, "spec": {"lockName": lock}
    }))?)
}

/// Writes as the operator does: its field manager.
pub(crate) fn as_the_operator() -> kube::api::PatchParams {
    kube::api::PatchParams { field_manager: Some("zklock".into()), ..Default::default() }
}

/// `status` written over the copy `current`, tested against its UID and resourceVersion, as the
/// operator writes a status.
pub(crate) fn status_patch(current: &LockClaim, status: &serde_json::Value) -> Result<json_patch::Patch, Error> {
    Ok(serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": current.metadata.uid},
        {"op": "test", "path": "/metadata/resourceVersion", "value": current.metadata.resource_version},
        {"op": "add", "path": "/status", "value": status},
    ]))?)
}

/// The operator's finalizer removed, tested to be the one removed.
pub(crate) fn finalizer_removal() -> Result<json_patch::Patch, Error> {
    Ok(serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": zklock::api::FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))?)
}
