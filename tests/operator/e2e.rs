//! End to end: the zklock binary as operator, a real ZooKeeper, the Kubernetes API under test
//! (kube-sandbox, or ZKLOCK_TEST_KUBECONFIG / ZKLOCK_TEST_ZK), and the real kubectl. Every test
//! works in a namespace and ZooKeeper chroot of its own, and ends by checking the whole history
//! of claim status changes against the invariants of docs/design.md: safety.

use crate::e2e_support;

use std::process::Command;
use std::time::Instant;

use e2e_support::*;
use futures::StreamExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use zklock::api::{conditions, Lock, LockClaim, Phase};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_wait_gates_the_second_script_until_the_first_claim_is_deleted() {
    let env = Env::new().await;
    let _op = env.operator();
    let kubectl = zklock_testkit::kube::kubectl();
    let kubeconfig = zklock_testkit::kube::kubeconfig();
    let wait = |name: &str| {
        Command::new(&kubectl)
            .args(["--kubeconfig", &kubeconfig.display().to_string(), "-n", &env.ns])
            .args(["wait", "--for=condition=Held", &format!("lockclaim/{name}"), "--timeout=60s"])
            .spawn()
            .expect("run kubectl")
    };
    env.claim("first", "deploy", json!({})).await;
    let status = wait("first").wait().unwrap();
    assert!(status.success(), "kubectl wait for the first claim failed");

    env.claim("second", "deploy", json!({})).await;
    let mut second = wait("second");
    let waiting = env.wait_phase("second", Phase::Waiting).await;
    assert_eq!(waiting.status.as_ref().unwrap().waiting_for.as_deref(), Some("first"));
    assert_eq!(waiting.status.as_ref().unwrap().position, Some(1));
    assert!(second.try_wait().unwrap().is_none(), "kubectl wait returned while the first claim held the lock");

    let deleted_at = Instant::now();
    env.delete_claim("first").await;
    let status = tokio::task::spawn_blocking(move || second.wait().unwrap()).await.unwrap();
    assert!(status.success(), "kubectl wait for the second claim failed");
    assert!(deleted_at.elapsed() < PATIENCE);
    let held = env.wait_phase("second", Phase::Held).await.status.unwrap();
    assert_eq!((held.position, held.waiting_for), (Some(0), None), "a holder waits for nobody");
    env.wait_gone("first").await;
    env.delete_claim("second").await;
    env.history.await_gone("second").await;
    assert_eq!(env.history.grants("deploy"), vec!["first", "second"]);
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_exclusive_claims_are_granted_in_creation_order() {
    let env = Env::new().await;
    let _op = env.operator();
    let names: Vec<String> = (0..20).map(|i| format!("c{i:02}")).collect();
    for name in &names {
        env.claim(name, "order", json!({})).await;
    }
    for (i, name) in names.iter().enumerate() {
        let held = env.wait_phase(name, Phase::Held).await;
        let token: u64 = held.status.unwrap().fencing_token.unwrap().parse().unwrap();
        assert!(token > 0);
        for later in &names[i + 1..] {
            assert_ne!(env.status(later).await, Some(Phase::Held), "{later} held before {name}");
        }
        env.delete_claim(name).await;
    }
    env.history.await_gone("c19").await;
    assert_eq!(env.history.grants("order"), names);
    env.history.check();
}

/// Claims created one after another while the operator lags behind (one reconcile at a time,
/// every API request 200 ms slow: a backlog of several seconds) are queued in creation order all
/// the same. The admission gate let a claim go ahead of one seen before it once that one had been
/// at the gate for 5 s, counted from its arrival, so under a backlog longer than that the queue
/// took the reconciles' order (kube-runtime's scheduler does not keep the triggers' order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_created_while_the_operator_lags_behind_are_queued_in_creation_order() {
    let env = Env::new().await;
    a_burst_is_queued_in_creation_order(&env).await;
}

/// The same where no admission policy puts the finalizer on claims at creation (Kubernetes
/// before 1.36): each claim's first reconcile adds it and ends there, so its next one, the first
/// that can enter the queue, comes after the backlog of the other claims' additions (200 ms
/// each). The gate's patience ran from the first reconcile: 30 claims, 6 s of additions, and one
/// claim went six places late on 1.33. Here, before the fix, 3 runs of 7 out of order (the first
/// claim 2, 2 and 9 places late); 10 of 10 in order after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_the_operator_adds_its_finalizer_to_while_it_lags_behind_are_queued_in_creation_order() {
    let env = Env::new().await;
    if finalizer_policy() {
        let binding = finalizer_binding(&env.ns);
        let bindings: kube::Api<k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBinding> =
            kube::Api::all(env.client.clone());
        bindings.delete(&binding, &Default::default()).await.expect("delete the namespace's finalizer binding");
        let probe: LockClaim = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": "probe" }, "spec": { "lockName": "probe" },
        }))
        .unwrap();
        let dry_run = kube::api::PostParams { dry_run: true, ..Default::default() };
        until("claims made without the finalizer (the binding's deletion in force)", || async {
            let made = env.claims.create(&dry_run, &probe).await.expect("dry-run a claim");
            made.metadata.finalizers.unwrap_or_default().is_empty()
        })
        .await;
    }
    a_burst_is_queued_in_creation_order(&env).await;
}

async fn a_burst_is_queued_in_creation_order(env: &Env) {
    let proxy = zklock_testkit::api_proxy::ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let _op = Operator::start_proxied(env, &proxy, &["--max-concurrent-reconciles", "1"]);
    env.claim("holder", "burst", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    proxy.set_latency(std::time::Duration::from_millis(200));
    let names: Vec<String> = (0..30).map(|i| format!("b{i:02}")).collect();
    for name in &names {
        env.claim(name, "burst", json!({})).await;
    }
    let made = Instant::now();
    let mut sequences = vec![];
    for name in &names {
        let waiting = env.wait_phase(name, Phase::Waiting).await;
        let znode = waiting.status.and_then(|s| s.znode).unwrap_or_else(|| panic!("{name} Waiting without a znode"));
        let sequence: i64 = znode.rsplit("-lock-").next().and_then(|s| s.parse().ok()).expect("a sequence number");
        sequences.push((sequence, name.clone()));
    }
    eprintln!("every claim queued {:?} after the last was made", made.elapsed());
    proxy.set_latency(std::time::Duration::ZERO);
    let mut queued = sequences.clone();
    queued.sort();
    let queued: Vec<&str> = queued.iter().map(|(_, name)| name.as_str()).collect();
    assert_eq!(queued, names, "the queue's order (by sequence) is not the creation order");
    env.delete_claim("holder").await;
    for name in &names {
        env.wait_phase(name, Phase::Held).await;
        env.delete_claim(name).await;
    }
    env.history.await_gone("b29").await;
    let mut granted = vec!["holder".to_string()];
    granted.extend(names);
    assert_eq!(env.history.grants("burst"), granted);
    env.history.check();
}

/// Herd-free in the API too: a handoff writes the holder's finalizer removal, the next claim's
/// Held and its Acquired event, whatever else happens meanwhile. (The next claim, turned away
/// while the holder's removal was on its way, asked for the holder to be reconciled again: a
/// second cleanup right behind the first, its finalizer removal answered 404, in about half the
/// handoffs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_writes_the_holders_finalizer_removal_and_the_next_grant_only() {
    let env = Env::new().await;
    let op = env.operator();
    let names: Vec<String> = (0..9).map(|i| format!("h{i}")).collect();
    for name in &names {
        env.claim(name, "three-writes", json!({})).await;
    }
    env.wait_phase(&names[0], Phase::Held).await;
    for name in &names[1..] {
        env.wait_phase(name, Phase::Waiting).await;
    }
    // Each waiter's Waiting event is published after its status: all of them before counting.
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::namespaced(env.client.clone(), &env.ns);
    until("every waiter's Waiting event", || async {
        let listed = events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        listed.iter().filter(|e| e.reason.as_deref() == Some("Waiting")).count() == names.len() - 1
    })
    .await;
    let before = op.metric("zklock_kubernetes_writes_total").await;
    let made = || async { op.metric("zklock_kubernetes_writes_total").await - before };
    for pair in names.windows(2) {
        env.delete_claim(&pair[0]).await;
        env.wait_phase(&pair[1], Phase::Held).await;
    }
    // Each grant's event is published after its status (the last one's may still be on its
    // way); a second cleanup ran right behind the first, so by the last grant every earlier one's
    // write was made.
    let expected = 3.0 * (names.len() - 1) as f64;
    until("the last grant's Acquired event", || async { made().await >= expected }).await;
    assert_eq!(made().await, expected, "{} handoffs, three writes each", names.len() - 1);
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_claims_hold_together_and_an_exclusive_one_waits_for_them() {
    let env = Env::new().await;
    let _op = env.operator();
    env.claim("r1", "report", json!({"mode": "Shared"})).await;
    env.wait_phase("r1", Phase::Held).await;
    env.claim("r2", "report", json!({"mode": "Shared"})).await;
    env.wait_phase("r2", Phase::Held).await;
    env.claim("w", "report", json!({"mode": "Exclusive"})).await;
    let w = env.wait_phase("w", Phase::Waiting).await;
    assert_eq!(w.status.unwrap().position, Some(2));
    env.claim("r3", "report", json!({"mode": "Shared"})).await;
    env.wait_phase("r3", Phase::Waiting).await;
    env.delete_claim("r1").await;
    env.delete_claim("r2").await;
    env.wait_phase("w", Phase::Held).await;
    assert_eq!(env.status("r3").await, Some(Phase::Waiting), "a shared claim after an exclusive one waits for it");
    env.delete_claim("w").await;
    env.wait_phase("r3", Phase::Held).await;
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_pods_deleted_failed_or_replaced_release_the_lock() {
    let env = Env::new().await;
    let op = env.operator();
    // Deleted.
    env.pod("worker-a").await;
    env.claim("a", "jobs", json!({"holder": {"podName": "worker-a"}})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    assert!(a.status.unwrap().holder_uid.is_some(), "bound to the pod's uid");
    env.pod("worker-b").await;
    env.claim("b", "jobs", json!({"holder": {"podName": "worker-b"}})).await;
    env.wait_phase("b", Phase::Waiting).await;
    // From here on, both claims are bound and their pods were listed long ago: the pod watch
    // proves the deletion and the failure below, and no reconcile reads a pod from the API.
    let api_reads = r#"zklock_holder_pod_reads_total{source="api"}"#;
    let watch_reads = r#"zklock_holder_pod_reads_total{source="watch"}"#;
    let (api_before, watch_before) = (op.metric(api_reads).await, op.metric(watch_reads).await);
    let deleted = Instant::now();
    env.pods.delete("worker-a", &DeleteParams::default()).await.unwrap();
    env.wait_phase("b", Phase::Held).await;
    let pod_to_held = deleted.elapsed();
    let a = env.wait_phase("a", Phase::Released).await;
    assert_eq!(condition(&a, conditions::FINISHED).unwrap().1, "HolderGone");
    let mut api_during = op.metric(api_reads).await - api_before;

    // Failed.
    env.pod("worker-c").await;
    env.claim("c", "jobs", json!({"holder": {"podName": "worker-c"}})).await;
    env.wait_phase("c", Phase::Waiting).await;
    let api_before = op.metric(api_reads).await;
    let failed = json!({"status": {"phase": "Failed"}});
    env.pods.patch_status("worker-b", &PatchParams::default(), &Patch::Merge(&failed)).await.unwrap();
    env.wait_phase("c", Phase::Held).await;
    env.wait_phase("b", Phase::Released).await;
    api_during += op.metric(api_reads).await - api_before;
    assert_eq!(api_during, 0.0, "a deleted and a failed holder pod are read from the watch, not the API");
    assert!(op.metric(watch_reads).await > watch_before, "the watch's pods were read");

    // Replaced: same name, new uid (a StatefulSet restart) does not inherit the lock.
    env.claim("d", "jobs", json!({})).await;
    env.wait_phase("d", Phase::Waiting).await;
    env.pods.delete("worker-c", &DeleteParams::default()).await.unwrap();
    env.wait_pod_gone("worker-c").await;
    env.pod("worker-c").await;
    let c = env.wait("c", "released", |c| phase_of(c) == Some(Phase::Released)).await;
    assert!(condition(&c, conditions::FINISHED).unwrap().2.contains("worker-c"));
    env.wait_phase("d", Phase::Held).await;
    eprintln!("holder pod deleted -> next Held: {pod_to_held:?}");
    assert!(op.ready().await);
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_annotates_the_pod_and_forces_release_after_the_grace_period() {
    let env = Env::new().await;
    let _op = env.operator();
    env.pod("holder").await;
    env.claim("a", "maint", json!({"holder": {"podName": "holder"}, "revocationGracePeriodSeconds": 2})).await;
    env.wait_phase("a", Phase::Held).await;
    env.claim("b", "maint", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    env.annotate("a", "zklock.io/revoke", "database maintenance").await;
    let a = env
        .wait("a", "revoke requested", |c| condition(c, conditions::REVOKE_REQUESTED).is_some_and(|c| c.0 == "True"))
        .await;
    assert_eq!(phase_of(&a), Some(Phase::Held), "the holder keeps the lock during the grace period");
    let pod = env.pods.get("holder").await.unwrap();
    let told = pod.metadata.annotations.unwrap_or_default().get("revoke.zklock.io/a").cloned();
    let told: serde_json::Value = serde_json::from_str(&told.expect("the holder pod is told")).unwrap();
    assert_eq!(told, json!({ "claim": "a", "reason": "database maintenance" }));
    let a = env.wait_phase("a", Phase::Revoked).await;
    assert!(condition(&a, conditions::FINISHED).unwrap().2.contains("grace period"));
    env.wait_phase("b", Phase::Held).await;
    // A waiting claim that is revoked simply leaves the queue.
    env.claim("c", "maint", json!({})).await;
    env.wait_phase("c", Phase::Waiting).await;
    env.annotate("c", "zklock.io/revoke", "not needed").await;
    env.wait_phase("c", Phase::Revoked).await;
    // A claim whose name is longer than an annotation key's name may be (63): the pod is still
    // told, under a key cut to fit, with the whole name in the value.
    let long = "a-claim-named-by-a-job-controller-for-its-pod-migrate-nightly-7f9c-abcde";
    assert!(long.len() > 63);
    env.claim(long, "maint-long", json!({"holder": {"podName": "holder"}, "revocationGracePeriodSeconds": 30})).await;
    env.wait_phase(long, Phase::Held).await;
    env.annotate(long, "zklock.io/revoke", "rotation").await;
    env.wait(long, "revoke requested", |c| condition(c, conditions::REVOKE_REQUESTED).is_some_and(|c| c.0 == "True"))
        .await;
    let (key, _) = zklock::api::pod_revoke_annotation(long, "rotation");
    let told = async {
        loop {
            let pod = env.pods.get("holder").await.unwrap();
            if let Some(value) = pod.metadata.annotations.unwrap_or_default().get(&key) {
                return value.clone();
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    let told = tokio::time::timeout(PATIENCE, told).await.expect("the holder pod of a long-named claim is told");
    let told: serde_json::Value = serde_json::from_str(&told).unwrap();
    assert_eq!(told, json!({ "claim": long, "reason": "rotation" }));
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_leases() {
    let env = Env::new().await;
    let _op = env.operator();
    // (Times in the API have whole seconds, so a lease of N ends after N−1 to N seconds and a
    // timeout likewise: both are long enough here that a loaded machine still sees each step.)
    env.claim("holder", "t", json!({"leaseDurationSeconds": 10})).await;
    env.wait_phase("holder", Phase::Held).await;
    // Try once on a busy lock: Expired at once.
    env.claim("once", "t", json!({"acquireTimeoutSeconds": 0})).await;
    let once = env.wait_phase("once", Phase::Expired).await;
    assert!(condition(&once, conditions::FINISHED).unwrap().2.contains("busy"));
    // An acquire timeout that runs out while waiting (this also lets three seconds of the lease
    // pass, so that a renewal shows in the second-granular lease expiry).
    env.claim("late", "t", json!({"acquireTimeoutSeconds": 4})).await;
    env.wait_phase("late", Phase::Waiting).await;
    env.wait_phase("late", Phase::Expired).await;
    // Renewal restarts the lease timer; without more renewals the lease then runs out.
    let before = env.claims.get("holder").await.unwrap().status.unwrap().lease_expires_at.unwrap();
    env.annotate("holder", "zklock.io/renew", "1").await;
    let renewed = env
        .wait("holder", "renewed", |c| {
            c.status.as_ref().and_then(|s| s.lease_expires_at.clone()).is_some_and(|t| t.0 > before.0)
        })
        .await;
    assert_eq!(phase_of(&renewed), Some(Phase::Held));
    let released = env.wait_phase("holder", Phase::Released).await;
    assert_eq!(condition(&released, conditions::FINISHED).unwrap().1, "LeaseExpired");
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_input_ends_invalid_with_a_helpful_message_and_the_operator_stays_healthy() {
    let env = Env::new().await;
    let op = env.operator();
    // Refused at admission by the schema (when the server enforces it) or Invalid.
    for (name, spec, needle) in [
        ("bad-name", json!({"lockName": "Not_A_Name"}), "lockName"),
        ("bad-number", json!({"lockName": "x", "leaseDurationSeconds": -4}), "leaseDurationSeconds"),
        ("bad-mode", json!({"lockName": "x", "mode": "Sometimes"}), "mode"),
    ] {
        let claim: zklock::api::LockClaim = match serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": {"name": name}, "spec": spec
        })) {
            Ok(c) => c,
            // An unknown mode cannot even be expressed in the typed client: send it raw.
            Err(_) => {
                let dynamic: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
                    env.client.clone(),
                    &env.ns,
                    &kube::api::ApiResource::erase::<zklock::api::LockClaim>(&()),
                );
                let obj: kube::api::DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": {"name": name}, "spec": spec
                }))
                .unwrap();
                let err = dynamic.create(&Default::default(), &obj).await.expect_err("an unknown mode is refused");
                assert!(err.to_string().contains(needle), "{err}");
                continue;
            }
        };
        match env.claims.create(&Default::default(), &claim).await {
            Err(e) => assert!(e.to_string().contains(needle), "refusal names the field: {e}"),
            Ok(_) => {
                let c = env.wait_phase(name, Phase::Invalid).await;
                assert!(condition(&c, conditions::INVALID).unwrap().2.contains(needle));
            }
        }
    }
    // Accepted by the schema, but not servable: Invalid with a message that says what to fix.
    env.claim("other-ns", "x", json!({"holder": {"podName": "p", "namespace": "elsewhere"}})).await;
    let c = env.wait_phase("other-ns", Phase::Invalid).await;
    assert!(condition(&c, conditions::INVALID).unwrap().2.contains("own namespace"));
    env.claim("reserved", "zookeeper", json!({})).await;
    env.wait_phase("reserved", Phase::Invalid).await;
    // The spec cannot change after creation.
    let patch = json!({"spec": {"lockName": "other"}});
    let refused = env.claims.patch("reserved", &PatchParams::default(), &Patch::Merge(&patch)).await;
    if let Err(e) = refused {
        assert!(e.to_string().contains("immutable"), "{e}");
    }
    // The operator is still healthy and serving.
    env.claim("fine", "x", json!({})).await;
    env.wait_phase("fine", Phase::Held).await;
    assert!(op.ready().await);
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_pod_that_never_appears_turns_the_claim_invalid() {
    let env = Env::new().await;
    let _op = env.operator();
    env.claim("ghost", "g", json!({"holder": {"podName": "does-not-exist"}})).await;
    let c = env.wait_phase("ghost", Phase::Pending).await;
    assert_eq!(condition(&c, conditions::HELD).unwrap().1, "HolderPodNotFound");
    // A pod that appears within the window is bound.
    env.claim("late-pod", "g2", json!({"holder": {"podName": "appears-later"}})).await;
    env.wait_phase("late-pod", Phase::Pending).await;
    env.pod("appears-later").await;
    env.wait_phase("late-pod", Phase::Held).await;
    let c = env.wait_phase("ghost", Phase::Invalid).await;
    assert!(condition(&c, conditions::INVALID).unwrap().2.contains("does not exist"));
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_queue_keeps_the_holder_and_the_order() {
    let env = Env::new().await;
    let mut op = env.operator();
    for name in ["a", "b", "c", "d"] {
        env.claim(name, "q", json!({})).await;
        env.wait(name, "queued", |c| matches!(phase_of(c), Some(Phase::Held | Phase::Waiting))).await;
    }
    let token = env.claims.get("a").await.unwrap().status.unwrap().fencing_token;
    op.kill9();
    let restarted = Instant::now();
    op.restart();
    // A claim created while the operator is down or starting waits its turn behind the others.
    env.claim("e", "q", json!({})).await;
    env.wait_phase("e", Phase::Waiting).await;
    eprintln!("operator kill -9 -> restarted and admitting again: {:?}", restarted.elapsed());
    let a = env.claims.get("a").await.unwrap();
    assert_eq!(phase_of(&a), Some(Phase::Held), "the holder stays held");
    assert_eq!(a.status.unwrap().fencing_token, token, "with the same fencing token");
    for name in ["a", "b", "c", "d", "e"] {
        env.wait_phase(name, Phase::Held).await;
        env.delete_claim(name).await;
    }
    env.history.await_gone("e").await;
    assert_eq!(env.history.grants("q"), vec!["a", "b", "c", "d", "e"]);
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_restart_recovers_claims_without_double_grants() {
    let mut zk = zklock_testkit::ZkServer::start();
    let env = Env::with_zk(zk.chroot().await).await;
    let op = Operator::start(&env, &["--zk-session-timeout", "2s"]);
    env.claim("a", "z", json!({})).await;
    env.wait_phase("a", Phase::Held).await;
    env.claim("b", "z", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    // Down for longer than the session timeout: the session is lost, a new one re-anchors.
    zk.kill();
    until("the operator's session to end", || async { op.metric("zklock_zookeeper_sessions_lost_total").await >= 1.0 })
        .await;
    zk.resume();
    env.claim("c", "z", json!({})).await;
    env.wait_phase("c", Phase::Waiting).await;
    let a = env.wait("a", "held or lost", |c| matches!(phase_of(c), Some(Phase::Held | Phase::Lost))).await;
    assert_eq!(phase_of(&a), Some(Phase::Held), "a zklock-only lock keeps its holder across a session loss");
    env.delete_claim("a").await;
    env.wait_phase("b", Phase::Held).await;
    env.history.check();
}

/// the continuity rule (docs/design.md) under load: when the session expires, every holder of a
/// zklock-only lock stays Held, however many there are and however fast reconciles run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_expiry_turns_no_holder_of_a_zklock_only_lock_lost() {
    const LOCKS: usize = 30;
    let mut zk = zklock_testkit::ZkServer::start();
    let env = Env::with_zk(zk.chroot().await).await;
    let op = Operator::start(&env, &["--zk-session-timeout", "2s"]);
    for i in 0..LOCKS {
        env.claim(&format!("h{i}"), &format!("l{i}"), json!({})).await;
    }
    let mut tokens = vec![];
    for i in 0..LOCKS {
        let held = env.wait_phase(&format!("h{i}"), Phase::Held).await;
        tokens.push(held.status.and_then(|s| s.fencing_token));
    }
    // Several rounds: how reconciles and the session's end interleave varies from run to run.
    for round in 1..=3 {
        zk.kill();
        until("the operator's session to end", || async {
            op.metric("zklock_zookeeper_sessions_lost_total").await >= f64::from(round)
        })
        .await;
        // Not ready while ZooKeeper is away and the session cannot be replaced.
        until("the leader to report not ready", || async { !op.ready().await }).await;
        zk.resume();
        // Admitted again only once re-anchored.
        let probe = format!("probe{round}");
        env.claim(&probe, "probe", json!({})).await;
        env.wait_phase(&probe, Phase::Held).await;
        until("the leader to be ready again", || async { op.ready().await }).await;
        env.delete_claim(&probe).await;
        env.wait_gone(&probe).await;
    }
    env.claim("late", "l0", json!({})).await;
    env.wait_phase("late", Phase::Waiting).await;
    for (i, token) in tokens.iter().enumerate() {
        let name = format!("h{i}");
        let c = env.claims.get(&name).await.unwrap();
        assert_eq!(phase_of(&c), Some(Phase::Held), "{name} stays Held across the session loss: {:?}", c.status);
        assert_eq!(&c.status.unwrap().fencing_token, token, "{name} keeps its fencing token");
    }
    let lost: Vec<String> =
        env.history.records().into_iter().filter(|r| r.phase == Some(Phase::Lost)).map(|r| r.name).collect();
    assert!(lost.is_empty(), "holders turned Lost at some point: {lost:?}");
    env.delete_claim("h0").await;
    env.wait_phase("late", Phase::Held).await;
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_takes_over_without_changing_the_holder() {
    let env = Env::new().await;
    let mut first = env.operator();
    until("the first replica to lead", || async { first.metric("zklock_leader").await == 1.0 }).await;
    let second = env.operator();
    env.claim("a", "ha", json!({})).await;
    let held = env.wait_phase("a", Phase::Held).await;
    env.claim("b", "ha", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    // A standby replica is ready (it serves as soon as it leads), and does not lead; it has
    // listed the claims already, and follows them.
    until("the standby to be ready", || async { second.ready().await }).await;
    until("the standby to have listed both claims", || async { second.metric("zklock_claims_watched").await == 2.0 })
        .await;
    assert_eq!(second.metric("zklock_leader").await, 0.0, "only one replica leads");

    first.kill9();
    let killed = Instant::now();
    until("the standby to lead and re-anchor", || async {
        second.metric("zklock_leader").await == 1.0 && second.ready().await
    })
    .await;
    let failover = killed.elapsed();
    let a = env.claims.get("a").await.unwrap();
    assert_eq!(phase_of(&a), Some(Phase::Held), "the holder did not change");
    let first_epoch = held.status.as_ref().and_then(|s| s.leader_epoch);
    assert_eq!(a.status.as_ref().map(|s| &s.fencing_token), held.status.as_ref().map(|s| &s.fencing_token));
    // Before it planned from the store it had filled while standing by, the new leader wrote
    // one claim and saw the write come back on its watch (docs/design.md: fencing).
    let synced: Vec<i64> = env
        .claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|c| c.metadata.annotations.as_ref()?.get("zklock.io/leader-sync")?.parse().ok())
        .collect();
    assert!(
        matches!(synced.as_slice(), [epoch] if Some(*epoch) > first_epoch),
        "one claim carries the new term's sync write, above epoch {first_epoch:?}: {synced:?}"
    );
    env.delete_claim("a").await;
    env.wait_phase("b", Phase::Held).await;
    eprintln!(
        "leader killed -> standby leading and re-anchored: {failover:?}; first grant after {:?}",
        killed.elapsed()
    );
    env.history.check();
}

/// docs/design.md: fencing: a leader whose API connection hangs (its Lease renewals never answered) steps
/// down before another replica may take over, and the holder does not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_api_connection_hangs_steps_down_before_the_standby_takes_over() {
    let env = Env::new().await;
    let relay = zklock_testkit::hang::HangingRelay::start(api_address()).await;
    let first = Operator::start_through(&env, &relay, &[]);
    until("the first replica to lead", || async { first.metric("zklock_leader").await == 1.0 }).await;
    let second = env.operator();
    env.claim("a", "hung", json!({})).await;
    let held = env.wait_phase("a", Phase::Held).await;
    env.claim("b", "hung", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;

    relay.set_hung(true);
    let hung = Instant::now();
    until("the leader with the hung connection to step down", || async { first.metric("zklock_leader").await == 0.0 })
        .await;
    let stepped_down = hung.elapsed();
    until("the standby to lead and re-anchor", || async {
        second.metric("zklock_leader").await == 1.0 && second.ready().await
    })
    .await;
    let took_over = hung.elapsed();
    eprintln!("API hung -> leader stepped down after {stepped_down:?}; standby leading after {took_over:?}");
    assert!(
        stepped_down < zklock::leader::LEASE_DURATION,
        "stepped down after {stepped_down:?}, not before the lease ({:?}) let another replica lead",
        zklock::leader::LEASE_DURATION
    );
    let a = env.claims.get("a").await.unwrap();
    assert_eq!(phase_of(&a), Some(Phase::Held), "the holder did not change");
    assert_eq!(a.status.unwrap().fencing_token, held.status.unwrap().fencing_token);
    env.delete_claim("a").await;
    env.wait_phase("b", Phase::Held).await;

    // The connection comes back: the deposed replica stays a standby and writes nothing.
    relay.set_hung(false);
    until("the deposed replica to be a ready standby", || async { first.ready().await }).await;
    assert_eq!(first.metric("zklock_leader").await, 0.0, "only one replica leads");
    env.claim("c", "hung", json!({})).await;
    env.wait_phase("c", Phase::Waiting).await;
    env.delete_claim("b").await;
    env.wait_phase("c", Phase::Held).await;
    env.delete_claim("c").await;
    env.history.await_gone("c").await;
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_deleted_without_its_finalizer_gives_the_lock_up() {
    let env = Env::new().await;
    let op = env.operator();
    env.claim("a", "orphan", json!({})).await;
    env.wait_phase("a", Phase::Held).await;
    env.claim("b", "orphan", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    // Stopped, the operator cannot put its finalizer back before the claim is gone.
    op.pause();
    let no_finalizers = json!({"metadata": {"finalizers": null}});
    env.claims.patch("a", &PatchParams::default(), &Patch::Merge(&no_finalizers)).await.unwrap();
    env.claims.delete("a", &DeleteParams::default()).await.unwrap();
    op.resume();
    // Only the operator releasing the orphaned node lets b through.
    env.wait_phase("b", Phase::Held).await;
    assert!(op.logs().contains("deleted without its finalizer"), "{}", op.logs());
    env.delete_claim("b").await;
    env.history.await_gone("b").await;
    assert_eq!(env.history.grants("orphan"), vec!["a", "b"]);
    env.history.check();
}

/// The operator's status writes go by name and test the claim's UID first: the API server must
/// refuse one meant for an earlier claim of the same name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_meant_for_another_uid_is_refused() {
    // Without the admission policies' bindings: no operator runs here to write the epoch
    // parameter, and once the API server's policy cache picked up the binding, every status
    // write would be refused for the missing parameter instead (seen in CI), hiding what this
    // test is about.
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let env = Env::on(zklock_testkit::kube::kubeconfig(), zk, false).await;
    let claim = env.claim("x", "uid-guard", json!({})).await;
    let write = |uid: &str| -> json_patch::Patch {
        serde_json::from_value(json!([
            { "op": "test", "path": "/metadata/uid", "value": uid },
            { "op": "add", "path": "/status", "value": { "phase": "Waiting", "position": 3 } },
        ]))
        .unwrap()
    };
    let refused =
        env.claims.patch_status("x", &PatchParams::default(), &Patch::Json::<()>(write("an-earlier-claim"))).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422), "{refused:?}");
    let uid = claim.metadata.uid.unwrap();
    let written = env.claims.patch_status("x", &PatchParams::default(), &Patch::Json::<()>(write(&uid))).await.unwrap();
    assert_eq!(written.status.unwrap().position, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_written_into_the_znode_by_another_client_is_followed() {
    let env = Env::new().await;
    let _op = env.operator();
    env.claim("a", "r", json!({"revocationGracePeriodSeconds": 1})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    let znode = a.status.unwrap().znode.unwrap();
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    raw.set_data(&znode, b"__REVOKE__", None).await.unwrap();
    let a = env
        .wait("a", "revoke requested", |c| condition(c, conditions::REVOKE_REQUESTED).is_some_and(|c| c.0 == "True"))
        .await;
    assert!(condition(&a, conditions::REVOKE_REQUESTED).unwrap().2.contains("Curator"));
    env.wait_phase("a", Phase::Revoked).await;
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_loss_on_a_lock_shared_with_foreign_clients_turns_the_holder_lost() {
    let zk = zklock_testkit::ZkServer::start();
    let env = Env::with_zk(zk.chroot().await).await;
    let chroot = &env.zk[env.zk.find('/').expect("a chroot")..];
    let cut = zklock_testkit::proxy::Proxy::start(zk.addr()).await;
    let _op = Operator::start_with_zk(&env, &cut.connect_string(chroot), &["--zk-session-timeout", "2s"]);
    env.claim("a", "shared-with-java", json!({})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    let node = a.status.unwrap().znode.unwrap();
    let dir = node.rsplit_once('/').unwrap().0.to_string();
    // The operator is cut off; meanwhile a Curator-style contender queues behind the holder
    // (persistent, so that it outlives whatever happens to this client's own session), which the
    // operator cannot hear: a foreign node heard while connected ends the holder at the cut
    // instead (see the next test). Then the operator's session expires on the server.
    cut.set_blackhole(true);
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(&format!("{dir}/_c_0d1e-lock-"), b"10.0.0.7", &options).await.unwrap();
    until("the operator's session to expire on the server (its node gone)", || async {
        raw.check_stat(&node).await.is_ok_and(|stat| stat.is_none())
    })
    .await;
    cut.set_blackhole(false);
    let a = env.wait_phase("a", Phase::Lost).await;
    assert_eq!(condition(&a, conditions::FINISHED).unwrap().1, "SessionLost");
    env.history.check();
}

/// A foreign client that queues behind a holder is heard at once (its node's creation, on the
/// operator's watch): from then on the lock counts as shared with foreign clients, so an
/// operator cut off from ZooKeeper ends the holder (`Lost`, `ConnectionLost`) before its session
/// can expire and the foreign client be granted. Before, the creation went unheard, the lock
/// counted as zklock's alone until a deletion woke a read, and the holder still read `Held`
/// while the foreign client held the lock. Found by the model (crates/model, rule
/// `SeeForeignCreates`), not by a reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_client_queued_behind_a_holder_is_heard_and_a_cut_off_operator_ends_the_holder_first() {
    let server = zklock_testkit::ZkServer::shared();
    let env = Env::new().await;
    let chroot = &env.zk[env.zk.find('/').expect("a chroot")..];
    let cut = zklock_testkit::proxy::Proxy::start(server.addr()).await;
    let _op = Operator::start_with_zk(&env, &cut.connect_string(chroot), &["--zk-session-timeout", "4s"]);
    env.claim("a", "heard", json!({})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    let dir = a.status.unwrap().znode.unwrap().rsplit_once('/').unwrap().0.to_string();
    // A Curator contender queues behind the holder, on a connection the cut does not touch.
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    let options = zookeeper_client::CreateMode::EphemeralSequential.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(&format!("{dir}/_c_0d1e-lock-"), b"10.0.0.7", &options).await.unwrap();
    // Heard: the operator marks a directory it has seen a foreign node in ("-1", see the user
    // guide). Before, nothing marked it until a deletion woke a read.
    until("the operator to hear the foreign node and mark its directory", || async {
        raw.get_data(&dir).await.is_ok_and(|(data, _)| data == b"-1")
    })
    .await;

    cut.set_blackhole(true);
    until("the operator's session to expire and the foreign client to come first", || async {
        raw.list_children(&dir).await.is_ok_and(|children| children.iter().all(|c| c.starts_with("_c_")))
    })
    .await;
    let phase = env.status("a").await;
    assert_ne!(phase, Some(Phase::Held), "the holder still reads Held while the foreign client holds the lock");
    let a = env.wait_phase("a", Phase::Lost).await;
    assert_eq!(condition(&a, conditions::FINISHED).unwrap().1, "ConnectionLost");
    cut.set_blackhole(false);
    env.history.check();
}

/// When another ZooKeeper client deletes a holder's node, the next claim is granted, but the
/// API never shows it Held beside the old holder: the old holder's Lost is written first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_node_another_client_deletes_is_lost_before_the_next_is_held() {
    const LOCKS: usize = 10;
    let env = Env::new().await;
    let _op = env.operator();
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    let mut nodes = vec![];
    for i in 0..LOCKS {
        env.claim(&format!("a{i}"), &format!("d{i}"), json!({})).await;
        let a = env.wait_phase(&format!("a{i}"), Phase::Held).await;
        nodes.push(a.status.and_then(|s| s.znode).expect("a holder names its znode"));
        env.claim(&format!("b{i}"), &format!("d{i}"), json!({})).await;
    }
    for i in 0..LOCKS {
        env.wait_phase(&format!("b{i}"), Phase::Waiting).await;
    }
    for node in &nodes {
        raw.delete(node, None).await.unwrap_or_else(|e| panic!("delete {node}: {e}"));
    }
    for i in 0..LOCKS {
        let a = env.wait_phase(&format!("a{i}"), Phase::Lost).await;
        assert_eq!(condition(&a, conditions::HELD).map(|c| c.1), Some("NodeDeleted".into()));
        env.wait_phase(&format!("b{i}"), Phase::Held).await;
    }
    env.history.check();
}

/// Re-anchoring is per lock: a lock whose directory the operator may no longer write (another
/// client made it read-only) ends its claims with the reason, and every other lock goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_cannot_be_re_anchored_fails_alone() {
    let env = Env::new().await;
    let mut op = Operator::start(&env, &["--zk-session-timeout", "2s"]);
    env.claim("a", "readonly", json!({})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    env.claim("b", "fine", json!({})).await;
    let b = env.wait_phase("b", Phase::Held).await;
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    let znode = a.status.and_then(|s| s.znode).unwrap();
    let dir = &znode[..znode.rfind('/').unwrap()];
    op.kill9();
    let read_only = [zookeeper_client::Acl::new_const(zookeeper_client::Permission::READ, "world", "anyone")];
    raw.set_acl(dir, &read_only, None).await.unwrap();
    op.restart();
    let a = env.wait_phase("a", Phase::Lost).await;
    let (_, _, message) = condition(&a, conditions::HELD).unwrap();
    assert!(message.contains("could not be re-created"), "the reason is given: {message}");
    // The other lock was re-anchored, and new claims are admitted.
    env.claim("c", "fine", json!({})).await;
    env.wait_phase("c", Phase::Waiting).await;
    let b_now = env.claims.get("b").await.unwrap();
    assert_eq!(phase_of(&b_now), Some(Phase::Held));
    assert_eq!(b_now.status.unwrap().fencing_token, b.status.unwrap().fencing_token);
    env.delete_claim("b").await;
    env.wait_phase("c", Phase::Held).await;
    env.history.check();
}

/// docs/design.md: fencing: a deposed leader's status writes fail too. The leader's API connection hangs
/// with a status write in it: another client deleted its holder's node, which the leader learns
/// from ZooKeeper (not hung) and answers with the holder's final status, Lost. The standby takes
/// over, re-anchors the lock (a zklock-only lock: the recorded holder keeps it, docs/design.md: re-anchoring)
/// and stamps its own epoch into both claims. Then the hung bytes reach the API server, as a
/// delayed network delivers them: without a fence they would turn the holder Lost while the
/// new leader holds its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_late_status_write_does_not_land() {
    let env = Env::new().await;
    let relay = zklock_testkit::hang::HangingRelay::start(api_address()).await;
    let first = Operator::start_through(&env, &relay, &[]);
    until("the first replica to lead", || async { first.metric("zklock_leader").await == 1.0 }).await;
    let second = env.operator();
    env.claim("a", "late", json!({})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    let status = a.status.unwrap();
    let first_epoch = status.leader_epoch.expect("the leader stamps its epoch into the status");
    env.claim("b", "late", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;

    relay.set_hung(true);
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    raw.delete(&status.znode.unwrap(), None).await.unwrap();
    until("the standby to lead and re-anchor", || async {
        second.metric("zklock_leader").await == 1.0 && second.ready().await
    })
    .await;
    let stamped = |c: &zklock::api::LockClaim| c.status.as_ref().and_then(|s| s.leader_epoch) > Some(first_epoch);
    let a = env.wait("a", "stamped with the new leader's epoch", stamped).await;
    assert_eq!(phase_of(&a), Some(Phase::Held), "the recorded holder of a zklock-only lock keeps it");
    env.wait("b", "stamped with the new leader's epoch", stamped).await;
    let version = a.metadata.resource_version.clone();

    // The deposed leader gave its write up and closed the connection; the close arrives late
    // (a lost segment sent again), so the server serves the write instead of dropping it.
    relay.delay_close(std::time::Duration::from_secs(5));
    relay.set_hung(false);
    until("the deposed replica to be a ready standby", || async { first.ready().await }).await;
    // The late write reaches the server within milliseconds of the hang's end (it waited in
    // the relay's socket buffers): any change to a from the version read above shows on a watch
    // opened there, and three seconds without one show that the write did not land.
    let version = version.expect("a claim read from the API has a resourceVersion");
    let params = kube::api::WatchParams::default().fields("metadata.name=a");
    let mut changes = env.claims.watch(&params, &version).await.unwrap().boxed();
    let changed = tokio::time::timeout(std::time::Duration::from_secs(3), changes.next()).await;
    assert!(changed.is_err(), "a deposed leader's late status write landed on a: {changed:?}");
    assert_eq!(first.metric("zklock_leader").await, 0.0, "only one replica leads");
    env.delete_claim("a").await;
    env.wait_phase("b", Phase::Held).await;
    env.history.check();
}

/// A status write whose answer times out can still land later. Here the holder's "Held,
/// revocation requested" write is held back by a proxy past the operator's timeout; the
/// operator writes it again (it lands), the grace period runs out, the holder is written
/// Revoked and the next claim Held; then the first write reaches the API server. Landing, it
/// would show the old holder Held again beside the new one. Every status write tests the
/// resourceVersion it was planned from, so it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_that_times_out_and_lands_late_is_refused() {
    use zklock_testkit::api_proxy::{ApiProxy, Matcher};
    let env = Env::new().await;
    let proxy = ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let _op = Operator::start_proxied(&env, &proxy, &[]);
    env.claim("x", "late", json!({ "revocationGracePeriodSeconds": 2 })).await;
    env.wait_phase("x", Phase::Held).await;
    env.claim("y", "late", json!({})).await;
    env.wait_phase("y", Phase::Waiting).await;
    let path = format!("/namespaces/{}/lockclaims/x/status", env.ns);
    let held = proxy.hold_next(Matcher { method: "PATCH", path_contains: path, status: None });
    env.annotate("x", "zklock.io/revoke", "late write").await;
    assert!(held.caught(PATIENCE).await, "the operator wrote x's revocation request");
    // The operator gives the write up after its timeout (10 s), writes it again, and goes on.
    env.wait_phase("x", Phase::Revoked).await;
    env.wait_phase("y", Phase::Held).await;
    let code = held.deliver(PATIENCE).await.expect("the held write reached the API server");
    // Anything it changed would come before this write on the history's watch.
    env.annotate("y", "zklock.io/marker", "after the late write").await;
    let marked = |c: &zklock::api::LockClaim| {
        c.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("zklock.io/marker"))
    };
    env.wait("y", "marked", marked).await;
    env.delete_claim("y").await;
    env.history.await_gone("y").await;
    env.history.check();
    assert!(code == 409 || code == 422, "the late write was answered {code}, not refused");
    assert_eq!(env.status("x").await, Some(Phase::Revoked), "x stays final");
}

/// On a lock with permits, a grant whose status write is held up past its timeout (and made
/// again) never reads as older than a hold of the lock that ended before it: grants there are
/// written one at a time (c's waits until b's is answered, by its retry), each with a token
/// above the last (the chaos suite's late write met a grant recorded below an ended hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_on_a_semaphore_takes_a_token_above_the_holds_that_ended_meanwhile() {
    use zklock_testkit::api_proxy::{ApiProxy, Matcher};
    let env = Env::new().await;
    let proxy = ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let _op = Operator::start_proxied(&env, &proxy, &[]);
    env.lock("sem", 2).await;
    env.claim("a", "sem", json!({})).await;
    env.wait_phase("a", Phase::Held).await;
    let held = proxy.hold_next(Matcher {
        method: "PATCH",
        path_contains: format!("/namespaces/{}/lockclaims/b/status", env.ns),
        status: None,
    });
    env.claim("b", "sem", json!({})).await;
    assert!(held.caught(PATIENCE).await, "b's grant is being written");
    env.claim("c", "sem", json!({})).await;
    env.delete_claim("a").await;
    env.wait_phase("c", Phase::Held).await;
    env.delete_claim("c").await;
    env.history.await_gone("c").await;
    // b's grant, written again after its timeout, lands now.
    env.wait_phase("b", Phase::Held).await;
    let code = held.deliver(PATIENCE).await;
    assert!(matches!(code, Some(409 | 422)), "the held write is refused: {code:?}");
    env.delete_claim("b").await;
    env.history.await_gone("b").await;
    env.history.check();
}

/// A deleted holder that another finalizer keeps in the API reads Released before its node
/// goes. When that final status write is refused (its copy was outdated by a change made
/// meanwhile), the operator's finalizer stays until the status is written from a newer copy and
/// the node is gone. Before, the cleanup went on as if written: the finalizer went, the claim
/// stayed reading Held beside the next holder, and its node held the lock until the orphan
/// release found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_holder_keeps_its_finalizer_until_its_final_status_is_written() {
    use zklock_testkit::api_proxy::{ApiProxy, Matcher};
    let env = Env::new().await;
    let proxy = ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let _op = Operator::start_proxied(&env, &proxy, &[]);
    let kept: zklock::api::LockClaim = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
        "metadata": { "name": "x", "finalizers": ["example.com/keep"] }, "spec": { "lockName": "cleanup" },
    }))
    .unwrap();
    env.claims.create(&Default::default(), &kept).await.unwrap();
    env.wait_phase("x", Phase::Held).await;
    env.claim("y", "cleanup", json!({})).await;
    env.wait_phase("y", Phase::Waiting).await;
    let path = format!("/namespaces/{}/lockclaims/x/status", env.ns);
    let held = proxy.hold_next(Matcher { method: "PATCH", path_contains: path, status: None });
    env.delete_claim("x").await;
    assert!(held.caught(PATIENCE).await, "the operator wrote x's final status");
    // Changed while the write is on its way: the write's copy is outdated, and refused.
    env.annotate("x", "zklock.io/marker", "changed meanwhile").await;
    let code = held.deliver(PATIENCE).await.expect("the held write reached the API server");
    assert!(code == 409 || code == 422, "the outdated write was answered {code}");
    let released = env.history.await_record("x Released", |r| r.name == "x" && r.phase == Some(Phase::Released)).await;
    assert!(!released.gone, "x's final status is written before it goes");
    env.wait_phase("y", Phase::Held).await;
    env.wait("x", "only its own finalizer left", |c| {
        c.metadata.finalizers.as_deref() == Some(&["example.com/keep".to_string()][..])
    })
    .await;
    let keep_none = json!({ "metadata": { "finalizers": null } });
    env.claims.patch("x", &PatchParams::default(), &Patch::Merge(&keep_none)).await.unwrap();
    env.history.await_gone("x").await;
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_claims_are_deleted_after_their_time_to_live() {
    let env = Env::new().await;
    let op = Operator::start(&env, &["--default-ttl-seconds-after-finished", "5"]);
    env.claim("holder", "batch", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    // Each ends Expired at once (the lock is busy): own time to live, the default, and an owned
    // claim, which the default leaves to its owner's garbage collection.
    env.claim("own", "batch", json!({ "acquireTimeoutSeconds": 0, "ttlSecondsAfterFinished": 1 })).await;
    // "default" cannot finish before it exists, and its time to live counts from a finish time
    // in whole seconds (up to one early): it goes 4 s after this at the earliest.
    let finished = Instant::now();
    env.claim("default", "batch", json!({ "acquireTimeoutSeconds": 0 })).await;
    let owner = env.pod("owner").await;
    let owned: zklock::api::LockClaim = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
        "metadata": { "name": "owned", "ownerReferences": [{
            "apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": owner.metadata.uid.unwrap(),
        }]},
        "spec": { "lockName": "batch", "acquireTimeoutSeconds": 0 },
    }))
    .unwrap();
    env.claims.create(&Default::default(), &owned).await.unwrap();
    // From the history, which has watched since before they were made: "own" may be gone
    // already, and a watch opened now would never see it Expired.
    for name in ["own", "default", "owned"] {
        env.history
            .await_record(&format!("{name} Expired"), |r| r.name == name && r.phase == Some(Phase::Expired))
            .await;
    }
    env.history.await_gone("own").await;
    assert!(env.status("default").await.is_some(), "the default (5 s) has not passed yet");
    env.history.await_gone("default").await;
    assert!(finished.elapsed() >= std::time::Duration::from_secs(4), "deleted too early: {:?}", finished.elapsed());
    // The default's time has passed for "owned" too. Touched, it is reconciled once more: had
    // the default applied to it, that reconcile would delete it.
    let before = op.metric("zklock_reconciles_total").await;
    env.annotate("owned", "zklock.io/marker", "touched").await;
    until("the touched claim to be reconciled", || async { op.metric("zklock_reconciles_total").await > before }).await;
    assert_eq!(env.status("owned").await, Some(Phase::Expired), "an owned claim goes with its owner");
    assert_eq!(env.status("holder").await, Some(Phase::Held), "a live claim has no time to live");
    env.history.check();
}

fn lock_status(lock: &Lock) -> (Option<u32>, u32, Vec<String>, u32) {
    let st = lock.status.clone().unwrap_or_default();
    (st.permits, st.held, st.holders, st.queue_length)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_permits_hold_ten_claims_three_at_a_time_in_order_and_follow_a_live_raise_and_lower() {
    let env = Env::new().await;
    let _op = env.operator();
    let locks = env.lock("api", 3).await;
    let names: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        // Shared or not, a claim takes one permit.
        env.claim(name, "api", if i == 1 { json!({ "mode": "Shared" }) } else { json!({}) }).await;
    }
    for name in &names[..3] {
        env.wait_phase(name, Phase::Held).await;
    }
    for (i, name) in names[3..].iter().enumerate() {
        env.wait(name, &format!("Waiting at position {}", i + 1), |c| {
            c.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Waiting) && s.position == Some(i as i64 + 1))
        })
        .await;
    }
    let held3 = |l: &Lock| lock_status(l) == (Some(3), 3, names[..3].to_vec(), 7);
    wait_lock(&locks, "api", "3 of 3 permits held by c0..c2, 7 queued", held3).await;
    let printed = env.kubectl(&["get", "locks", "api"]);
    for column in ["PERMITS", "HELD", "QUEUE", "HOLDERS", "c0", "c2"] {
        assert!(printed.contains(column), "kubectl get locks shows {column}: {printed}");
    }

    // A release anywhere among the holders lets the first waiter in, and only it.
    env.delete_claim("c1").await;
    env.wait_phase("c3", Phase::Held).await;
    env.delete_claim("c0").await;
    env.wait_phase("c4", Phase::Held).await;
    assert_eq!(env.status("c5").await, Some(Phase::Waiting));

    // Raised to 5: two more at once.
    env.history.set_permits("api", 5);
    let raise = json!({ "spec": { "permits": 5 } });
    locks.patch("api", &PatchParams::default(), &Patch::Merge(&raise)).await.expect("raise the permits");
    env.wait_phase("c5", Phase::Held).await;
    env.wait_phase("c6", Phase::Held).await;
    let held5 = |l: &Lock| lock_status(l) == (Some(5), 5, ["c2", "c3", "c4", "c5", "c6"].map(String::from).to_vec(), 3);
    wait_lock(&locks, "api", "5 of 5 permits held, 3 queued", held5).await;

    // Lowered to 2 with all five permits taken (no grant in flight): nobody loses the lock, and
    // nobody is granted until fewer than two hold.
    let lower = json!({ "spec": { "permits": 2 } });
    locks.patch("api", &PatchParams::default(), &Patch::Merge(&lower)).await.expect("lower the permits");
    wait_lock(&locks, "api", "permits 2 in force", |l| lock_status(l).0 == Some(2)).await;
    env.history.set_permits("api", 2);
    for name in ["c2", "c3", "c4", "c5", "c6"] {
        assert_eq!(env.status(name).await, Some(Phase::Held), "{name} keeps the lock after the lower limit");
    }
    for name in ["c2", "c3", "c4"] {
        env.delete_claim(name).await;
        env.history.await_gone(name).await;
    }
    // Two hold (c5, c6): c7 still waits. One more leaves: c7 is granted.
    assert_eq!(env.status("c7").await, Some(Phase::Waiting));
    env.delete_claim("c5").await;
    env.wait_phase("c7", Phase::Held).await;
    // One release at a time: two releases close together grant two claims whose status writes
    // may land in either order (a refused write is answered, and the next grant may go first),
    // which says nothing about the queue.
    env.delete_claim("c6").await;
    env.wait_phase("c8", Phase::Held).await;
    env.delete_claim("c7").await;
    env.wait_phase("c9", Phase::Held).await;
    for name in ["c8", "c9"] {
        env.delete_claim(name).await;
    }
    env.history.await_gone("c9").await;
    // c0..c2 were granted together, and c5 and c6 by the raise (their status writes land in
    // any order); every other grant follows creation order.
    let mut grants = env.history.grants("api");
    grants[..3].sort();
    grants[5..7].sort();
    assert_eq!(grants, names, "grants follow creation order");
    env.history.check();
}

/// Lowering the permits takes nothing away, also across a failover: the new leader re-anchors
/// the three recorded holders of a lock lowered to one permit, and none of them turns Lost; the
/// waiter is granted only once all three have gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_beyond_a_lowered_limit_keep_the_lock_across_a_restart() {
    let env = Env::new().await;
    let mut op = env.operator();
    let locks = env.lock("api", 3).await;
    for name in ["h0", "h1", "h2", "w"] {
        env.claim(name, "api", json!({})).await;
    }
    for name in ["h0", "h1", "h2"] {
        env.wait_phase(name, Phase::Held).await;
    }
    env.wait_phase("w", Phase::Waiting).await;
    let lower = json!({ "spec": { "permits": 1 } });
    locks.patch("api", &PatchParams::default(), &Patch::Merge(&lower)).await.expect("lower the permits");
    wait_lock(&locks, "api", "permits 1 in force", |l| lock_status(l).0 == Some(1)).await;
    env.history.set_permits("api", 1);

    // kill -9: the next process leads, with a new session, and re-anchors the lock.
    op.restart();
    until("the restarted operator to lead and be ready", || async {
        op.ready().await && op.metric("zklock_leader").await == 1.0
    })
    .await;
    // Its Lock status says how many hold: all three still.
    wait_lock(&locks, "api", "3 held under 1 permit", |l| lock_status(l).1 == 3).await;
    for name in ["h0", "h1"] {
        env.delete_claim(name).await;
        env.history.await_gone(name).await;
    }
    wait_lock(&locks, "api", "1 held, 1 queued", |l| (lock_status(l).1, lock_status(l).3) == (1, 1)).await;
    assert_eq!(env.status("w").await, Some(Phase::Waiting), "one holder left, one permit: w waits");
    env.delete_claim("h2").await;
    env.wait_phase("w", Phase::Held).await;
    let lost: Vec<String> =
        env.history.records().into_iter().filter(|r| r.phase == Some(Phase::Lost)).map(|r| r.name).collect();
    assert!(lost.is_empty(), "holders turned Lost: {lost:?}");
    env.history.check();
}

/// The history checker on a lock with permits: grants that hold at once may be recorded in any
/// order, but a grant recorded after a hold ended must carry a higher token, and no token is
/// granted twice.
#[test]
fn the_checker_orders_tokens_of_a_semaphore_by_the_holds_that_ended() {
    // Records dated after the permits are set (below, at the checker's creation).
    let start = Instant::now() + std::time::Duration::from_secs(60);
    let record = |n: u64, name: &str, phase: Phase, token: u64| Record {
        at: start + std::time::Duration::from_millis(n),
        name: name.into(),
        uid: name.into(),
        lock: "api".into(),
        exclusive: true,
        phase: Some(phase),
        held_condition: phase == Phase::Held,
        finished_condition: phase.is_terminal(),
        fencing: Some(token.to_string()),
        leader_epoch: None,
        why: None,
        deleting: false,
        gone: false,
    };
    let check = |records: Vec<Record>| {
        let history = History::of(records);
        history.set_permits("api", 2);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| history.check())).is_ok()
    };
    let together = vec![record(1, "b", Phase::Held, 12), record(2, "a", Phase::Held, 11)];
    assert!(check(together), "two holders recorded out of token order");
    let after_release =
        vec![record(1, "a", Phase::Held, 11), record(2, "a", Phase::Released, 11), record(3, "b", Phase::Held, 10)];
    assert!(!check(after_release), "a lower token after a hold with a higher one ended");
    let twice = vec![record(1, "a", Phase::Held, 11), record(2, "b", Phase::Held, 11)];
    assert!(!check(twice), "one token granted twice");
}

/// The history checker on a mutex: every grant carries a token above the holds it waited for;
/// Shared holders are not compared with each other.
#[test]
fn the_checker_orders_tokens_of_a_mutex_by_the_holds_each_grant_waited_for() {
    let start = Instant::now();
    let record = |n: u64, name: &str, exclusive: bool, phase: Phase, token: u64| Record {
        at: start + std::time::Duration::from_millis(n),
        name: name.into(),
        uid: name.into(),
        lock: "db".into(),
        exclusive,
        phase: Some(phase),
        held_condition: phase == Phase::Held,
        finished_condition: phase.is_terminal(),
        fencing: Some(token.to_string()),
        leader_epoch: None,
        why: None,
        deleting: false,
        gone: false,
    };
    let check = |records: Vec<Record>| {
        let history = History::of(records);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| history.check())).is_ok()
    };
    // Exclusive x (20) ends; then Shared s1 is granted with a lower token: a regression, also
    // while another Shared holder holds.
    let shared_below_exclusive = vec![
        record(1, "x", true, Phase::Held, 20),
        record(2, "x", true, Phase::Released, 20),
        record(3, "s0", false, Phase::Held, 25),
        record(4, "s1", false, Phase::Held, 19),
    ];
    assert!(!check(shared_below_exclusive), "a Shared grant below the Exclusive hold it waited for");
    // Shared holders granted by separate reads, recorded out of order around one's release.
    let shared_apart = vec![
        record(1, "s0", false, Phase::Held, 30),
        record(2, "s2", false, Phase::Held, 32),
        record(3, "s2", false, Phase::Released, 32),
        record(4, "s1", false, Phase::Held, 31),
    ];
    assert!(check(shared_apart), "Shared holders are not ordered among themselves");
    let exclusive_below_shared = vec![
        record(1, "s0", false, Phase::Held, 30),
        record(2, "s0", false, Phase::Released, 30),
        record(3, "x", true, Phase::Held, 29),
    ];
    assert!(!check(exclusive_below_shared), "an Exclusive grant below a hold it waited for");
}

/// With the chart's admission policy a claim carries the operator's finalizer from its creation,
/// and the operator writes nothing to add it; without the policy (its binding deleted, or a
/// cluster before 1.36) the operator adds it itself, and the claim is served all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_get_the_finalizer_at_creation_from_the_policy_or_else_from_the_operator() {
    use k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBinding;
    let env = Env::new().await;
    let op = env.operator();
    let finalizer_patches = || op.metric("zklock_kubernetes_calls_total{method=\"PATCH\",resource=\"lockclaims\",");
    let has_finalizer =
        |c: &zklock::api::LockClaim| c.metadata.finalizers.iter().flatten().any(|f| f == zklock::api::FINALIZER);
    let probe = |name: &str| -> zklock::api::LockClaim {
        serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": name }, "spec": { "lockName": "fin" },
        }))
        .unwrap()
    };
    let dry_run = kube::api::PostParams { dry_run: true, ..Default::default() };
    // Counted from when the operator serves: a term that starts with a claim already made
    // writes one claim's metadata (its sync write, docs/design.md: fencing), which is no
    // finalizer write.
    until("the operator to lead and be ready", || async {
        op.ready().await && op.metric("zklock_leader").await == 1.0
    })
    .await;
    let before = finalizer_patches().await;
    if finalizer_policy() {
        // The policy takes effect once the API server has loaded the binding.
        until("the finalizer policy to take effect", || async {
            env.claims.create(&dry_run, &probe("probe")).await.is_ok_and(|c| has_finalizer(&c))
        })
        .await;
        let made = env.claims.create(&Default::default(), &probe("at-creation")).await.unwrap();
        assert!(has_finalizer(&made), "the create answer carries the finalizer: {:?}", made.metadata.finalizers);
        env.wait_phase("at-creation", Phase::Held).await;
        assert_eq!(finalizer_patches().await - before, 0.0, "no write to add the finalizer");
        env.delete_claim("at-creation").await;
        env.history.await_gone("at-creation").await;
        let bindings: kube::Api<MutatingAdmissionPolicyBinding> = kube::Api::all(env.client.clone());
        bindings.delete(&finalizer_binding(&env.ns), &DeleteParams::default()).await.unwrap();
        until("the finalizer policy to be gone", || async {
            env.claims.create(&dry_run, &probe("probe")).await.is_ok_and(|c| !has_finalizer(&c))
        })
        .await;
    }
    let made = env.claims.create(&Default::default(), &probe("by-operator")).await.unwrap();
    assert!(!has_finalizer(&made), "no policy: {:?}", made.metadata.finalizers);
    env.wait("by-operator", "the finalizer", has_finalizer).await;
    env.wait_phase("by-operator", Phase::Held).await;
    assert!(finalizer_patches().await - before >= 1.0, "the operator added it");
    env.delete_claim("by-operator").await;
    env.history.await_gone("by-operator").await;
    env.history.check();
}

/// A deposed leader's grant that lands after the next leader listed the claims but before its
/// fence was raised: the next term's registry took the claim's phase from a replay made before
/// that write (Waiting), so re-anchoring did not judge it as a holder, and in a lock a foreign
/// client uses it stayed Held instead of ending Lost (issue 53). The replay is now taken after
/// the fence and the sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_grant_landing_before_the_fence_is_judged_by_the_next_terms_re_anchoring() {
    use zklock_testkit::api_proxy::{ApiProxy, Matcher};
    if !epoch_policy() {
        panic!("this test holds the next leader's fence: it needs the epoch policy (the project's control plane)");
    }
    let env = Env::new().await;
    let (p1, p2) = (
        ApiProxy::start(zklock_testkit::kube::kubeconfig()).await,
        ApiProxy::start(zklock_testkit::kube::kubeconfig()).await,
    );
    let mut first = Operator::start_proxied(&env, &p1, &[]);
    until("the first replica to lead", || async { first.metric("zklock_leader").await == 1.0 }).await;
    let second = Operator::start_proxied(&env, &p2, &[]);
    env.claim("a", "foreign", json!({})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    env.claim("b", "foreign", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    // The directory is marked as used by a foreign client (as Curator's node once did).
    let dir = a.status.unwrap().znode.unwrap().rsplit_once('/').unwrap().0.to_string();
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    raw.set_data(&dir, b"-1", None).await.unwrap();
    until("the standby to list both claims", || async { second.metric("zklock_claims_watched").await == 2.0 }).await;
    // The first leader grants b; that write is held, and the first leader dies.
    let ns = env.ns.clone();
    let grant = p1.hold_next(Matcher {
        method: "PATCH",
        path_contains: format!("/namespaces/{ns}/lockclaims/b/status"),
        status: Some(true),
    });
    env.delete_claim("a").await;
    assert!(grant.caught(PATIENCE).await, "the first leader grants b");
    let first_epoch = env.claims.get("b").await.unwrap().status.and_then(|s| s.leader_epoch);
    first.kill9();
    // The second leader's fence is held; the old grant lands meanwhile.
    let raise = p2.hold_next(Matcher {
        method: "PATCH",
        path_contains: format!("/namespaces/{ns}/configmaps/{}", zklock::api::epoch_policy::EPOCH_PARAM),
        status: None,
    });
    assert!(raise.caught(PATIENCE).await, "the second leader raises the fence");
    assert_eq!(grant.deliver(PATIENCE).await, Some(200), "the deposed leader's grant lands before the fence");
    env.wait("b", "b Held by the first term", |c| {
        phase_of(c) == Some(Phase::Held) && c.status.as_ref().and_then(|s| s.leader_epoch) == first_epoch
    })
    .await;
    raise.deliver(PATIENCE).await;
    // A holder in a lock a foreign client uses cannot prove it kept the lock across the change.
    let b = env.wait_phase("b", Phase::Lost).await;
    assert_eq!(condition(&b, conditions::FINISHED).unwrap().1, "SessionLost");
    env.history.check();
    drop(second);
}
