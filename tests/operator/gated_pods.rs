//! End to end, pods gated on a lock: the zklock binary as operator, a real ZooKeeper, the
//! Kubernetes API under test (kube-sandbox, or ZKLOCK_TEST_KUBECONFIG). The test plays the
//! kubelet: it marks pods Succeeded. Pods name a scheduler that does not exist, so that on a
//! real cluster no node runs them either.

use crate::e2e_support;

use std::time::Duration;

use e2e_support::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use zklock::api::Phase;

const GATE: &str = "zklock.io/lock";
const CONDITION: &str = "zklock.io/LockAcquired";

async fn gated_pod(env: &Env, name: &str, annotations: Value, gates: &[&str]) -> Pod {
    let gates: Vec<Value> = gates.iter().map(|g| json!({ "name": g })).collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "schedulerName": "zklock-test-no-scheduler",
            "schedulingGates": gates,
            "containers": [{ "name": "main", "image": "busybox:1.36", "command": ["true"] }],
        },
    }))
    .unwrap();
    env.pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("create pod {name}: {e}"))
}

/// A pod of the example Job (examples/manifests/job-gated.yaml), as the Job controller makes
/// it from the template, with `extra_gates` ahead of the template's.
async fn job_pod(env: &Env, name: &str, extra_gates: &[&str]) -> Pod {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/manifests/job-gated.yaml")).unwrap();
    let job: Value = serde_yaml::from_str(&text).unwrap();
    let mut pod = job["spec"]["template"].clone();
    pod["metadata"]["name"] = name.into();
    pod["metadata"]["labels"] = json!({ "batch.kubernetes.io/job-name": "migrate" });
    pod["spec"]["schedulerName"] = "zklock-test-no-scheduler".into();
    let gates = pod["spec"]["schedulingGates"].as_array_mut().unwrap();
    for (i, gate) in extra_gates.iter().enumerate() {
        gates.insert(i, json!({ "name": gate }));
    }
    let pod: Pod = serde_json::from_value(pod).unwrap();
    env.pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("create pod {name}: {e}"))
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default().into_iter().map(|g| g.name).collect()
}

fn lock_condition(pod: &Pod) -> Option<PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == CONDITION).cloned()
}

fn reason(pod: &Pod) -> Option<String> {
    lock_condition(pod).and_then(|c| c.reason)
}

/// Waits until pod `name` satisfies `f`; returns it.
async fn wait_pod(env: &Env, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Pod {
    let cond = move |p: Option<&Pod>| p.is_some_and(&f);
    match tokio::time::timeout(PATIENCE, await_condition(env.pods.clone(), name, cond)).await {
        Ok(Ok(Some(p))) => p,
        other => {
            let now = env.pods.get_opt(name).await.ok().flatten();
            let shown = now.map(|p| (gates(&p), lock_condition(&p)));
            panic!("waiting for pod {name} to be {what}: {other:?}; it is {shown:?}");
        }
    }
}

async fn finish(env: &Env, name: &str) {
    let done = json!({ "status": { "phase": "Succeeded" } });
    env.pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&done)).await.expect("mark the pod Succeeded");
}

/// The events about pod `name`, as (type, reason, note).
async fn events_of(env: &Env, name: &str) -> Vec<(String, String, String)> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let list = events.list(&ListParams::default()).await.expect("list events");
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Pod"))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

async fn wait_event(env: &Env, pod: &str, reason: &str) -> (String, String, String) {
    let found = async {
        loop {
            if let Some(e) = events_of(env, pod).await.into_iter().find(|e| e.1 == reason) {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(PATIENCE, found).await.unwrap_or_else(|_| panic!("no {reason} event about pod {pod}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_jobs_pods_are_released_one_at_a_time_in_creation_order() {
    let env = Env::new().await;
    let op = env.operator();
    let names = ["migrate-0", "migrate-1", "migrate-2", "migrate-3"];
    for (i, name) in names.iter().enumerate() {
        // The first pod also waits for somebody else's gate, which must stay.
        let others: &[&str] = if i == 0 { &["example.com/quota"] } else { &[] };
        job_pod(&env, name, others).await;
    }
    // What a user runs to wait for the grant: the real kubectl on the pod's condition.
    env.kubectl(&["wait", &format!("--for=condition={CONDITION}"), &format!("pod/{}", names[0]), "--timeout=60s"]);
    let first = wait_pod(&env, names[0], "ungated", |p| !gates(p).contains(&GATE.to_string())).await;
    assert_eq!(gates(&first), ["example.com/quota"], "only zklock's gate is removed");
    let first = wait_pod(&env, names[0], "shown as holding", |p| reason(p).as_deref() == Some("Acquired")).await;
    assert!(lock_condition(&first).unwrap().message.unwrap().contains("fencing token"));
    let claim = env.wait_phase(names[0], Phase::Held).await;
    let owner = &claim.metadata.owner_references.as_ref().expect("the claim is owned by its pod")[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Pod", first.uid().unwrap().as_str()));
    assert_eq!(claim.spec.holder.as_ref().map(|h| h.pod_name.as_str()), Some(names[0]));
    for (position, name) in names.iter().enumerate().skip(1) {
        let c = env
            .wait(name, "waiting in pod order", |c| c.status.as_ref().and_then(|s| s.position) == Some(position as i64))
            .await;
        assert_eq!(phase_of(&c), Some(Phase::Waiting));
        let pod = wait_pod(&env, name, "shown as waiting", |p| reason(p).as_deref() == Some("Waiting")).await;
        assert_eq!(gates(&pod), [GATE], "{name} is held back");
    }
    for (i, name) in names.iter().enumerate().take(names.len() - 1) {
        finish(&env, name).await;
        let next = names[i + 1];
        wait_pod(&env, next, "ungated", |p| gates(p).is_empty()).await;
        for later in &names[i + 2..] {
            assert_eq!(gates(&env.pods.get(later).await.unwrap()), [GATE], "{later} must wait for {next}");
        }
    }
    finish(&env, names[3]).await;
    env.wait_phase(names[3], Phase::Released).await;
    assert_eq!(env.history.grants("db-migrations"), names);
    assert!(op.metric("zklock_pods_ungated_total").await >= 4.0);
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_created_at_once_queue_in_the_order_the_api_server_created_them() {
    let env = Env::new().await;
    let _op = env.operator();
    // The operator watches pods already: a pod it ungated proves it (pods it first sees in its
    // initial listing can only be ordered by creation second, then by the listing's order).
    gated_pod(&env, "burst-holder", json!({ "zklock.io/lock": "burst" }), &[GATE]).await;
    wait_pod(&env, "burst-holder", "ungated", |p| gates(p).is_empty()).await;
    // The order of creation, as a watch that has listed before the burst sees the pods arrive.
    let mut arrivals = kube::runtime::watcher(env.pods.clone(), kube::runtime::watcher::Config::default()).boxed();
    let listed = async {
        loop {
            match arrivals.next().await {
                Some(Ok(kube::runtime::watcher::Event::InitDone)) => return,
                Some(Err(e)) => panic!("pod watch: {e}"),
                None => panic!("pod watch ended"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, listed).await.expect("the pod watch lists");
    let names: Vec<String> = (0..12).map(|i| format!("burst-{i:02}")).collect();
    let creates = names.iter().map(|name| gated_pod(&env, name, json!({ "zklock.io/lock": "burst" }), &[GATE]));
    futures::future::join_all(creates).await;
    let mut created = vec![];
    let seen = async {
        while created.len() < names.len() {
            match arrivals.next().await {
                Some(Ok(kube::runtime::watcher::Event::Apply(p)))
                    if names.contains(&p.name_any()) && !created.contains(&p.name_any()) =>
                {
                    created.push(p.name_any())
                }
                Some(Err(e)) => panic!("pod watch: {e}"),
                None => panic!("pod watch ended"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, seen).await.expect("the watch delivers every pod");
    for (ahead, name) in created.iter().enumerate() {
        let position = Some(ahead as i64 + 1);
        env.wait(name, "queued in creation order", |c| c.status.as_ref().and_then(|s| s.position) == position).await;
    }
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_pod_deleted_while_waiting_leaves_the_queue() {
    let env = Env::new().await;
    let _op = env.operator();
    for name in ["a", "b", "c"] {
        gated_pod(&env, name, json!({ "zklock.io/lock": "reports" }), &[GATE]).await;
    }
    env.wait_phase("a", Phase::Held).await;
    env.wait("c", "second in line", |c| c.status.as_ref().and_then(|s| s.position) == Some(2)).await;
    env.pods.delete("b", &DeleteParams::default()).await.unwrap();
    // Its claim goes with it (the garbage collector), or at least ends.
    env.wait("c", "moved up", |c| c.status.as_ref().and_then(|s| s.position) == Some(1)).await;
    finish(&env, "a").await;
    wait_pod(&env, "c", "ungated", |p| gates(p).is_empty()).await;
    env.history.await_record("c Held", |r| r.name == "c" && r.phase == Some(Phase::Held)).await;
    assert_eq!(env.history.grants("reports"), ["a", "c"], "b never held the lock");
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_annotations_are_shown_on_the_pod_and_the_operator_stays_healthy() {
    let env = Env::new().await;
    let op = env.operator();
    let cases = [
        ("no-annotation", json!({}), vec![GATE], "MissingLockAnnotation", "no annotation zklock.io/lock"),
        ("no-gate", json!({ "zklock.io/lock": "x" }), vec![], "NotGated", "runs without the lock"),
        (
            "bad-mode",
            json!({ "zklock.io/lock": "x", "zklock.io/mode": "shared" }),
            vec![GATE],
            "InvalidAnnotation",
            "Exclusive or Shared",
        ),
        (
            "bad-lock",
            json!({ "zklock.io/lock": "Not_A_Lock" }),
            vec![GATE],
            "InvalidAnnotation",
            "not a valid lock name",
        ),
        (
            "bad-timeout",
            json!({ "zklock.io/lock": "x", "zklock.io/acquire-timeout-seconds": "ten" }),
            vec![GATE],
            "InvalidAnnotation",
            "whole number",
        ),
    ];
    for (name, annotations, gates, _, _) in &cases {
        gated_pod(&env, name, annotations.clone(), gates).await;
    }
    for (name, _, _, why, needle) in &cases {
        let pod = wait_pod(&env, name, why, |p| reason(p).as_deref() == Some(why)).await;
        let condition = lock_condition(&pod).unwrap();
        assert_eq!(condition.status, "False");
        assert!(condition.message.as_deref().unwrap_or_default().contains(needle), "{name}: {condition:?}");
        let (kind, _, note) = wait_event(&env, name, why).await;
        assert_eq!(kind, "Warning");
        assert!(note.contains(needle), "{note}");
        assert!(env.claims.get_opt(name).await.unwrap().is_none(), "no claim is made for {name}");
        // What the user reads: the condition and the event, in the real kubectl's describe.
        let described = env.kubectl(&["describe", "pod", name]);
        assert!(described.contains(CONDITION) && described.contains(why), "{name}: {described}");
    }
    // Annotating the pod is enough to fix the first one.
    let patch = json!({ "metadata": { "annotations": { "zklock.io/lock": "x" } } });
    env.pods.patch("no-annotation", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_pod(&env, "no-annotation", "ungated", |p| gates(p).is_empty()).await;
    // Each problem is reported once, not in a loop: touched, the pod is reconciled again (the
    // operator's count of gated-pod reconciles says when) and says nothing new.
    let before = op.metric("zklock_gated_pod_reconciles_total").await;
    let touch = json!({ "metadata": { "annotations": { "touched": "yes" } } });
    env.pods.patch("bad-mode", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();
    let reconciled = async {
        while op.metric("zklock_gated_pod_reconciles_total").await <= before {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, reconciled).await.expect("the touched pod is reconciled");
    let warnings = events_of(&env, "bad-mode").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(op.ready().await, "the operator is still healthy");
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_claim_expires_stays_gated_and_says_why() {
    let env = Env::new().await;
    let _op = env.operator();
    env.claim("holder", "nightly", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    let annotations = json!({ "zklock.io/lock": "nightly", "zklock.io/acquire-timeout-seconds": "1" });
    gated_pod(&env, "late", annotations, &[GATE]).await;
    let pod = wait_pod(&env, "late", "shown as expired", |p| reason(p).as_deref() == Some("Expired")).await;
    assert_eq!(gates(&pod), [GATE], "not ungated");
    assert!(lock_condition(&pod).unwrap().message.unwrap().contains("ended Expired"));
    let (kind, _, _) = wait_event(&env, "late", "Expired").await;
    assert_eq!(kind, "Warning");
    env.delete_claim("holder").await;
    env.wait_gone("holder").await;
    // The next pod gets the lock, after the release: by then "late" would have got it if it could.
    gated_pod(&env, "next", json!({ "zklock.io/lock": "nightly" }), &[GATE]).await;
    wait_pod(&env, "next", "ungated", |p| gates(p).is_empty()).await;
    assert_eq!(gates(&env.pods.get("late").await.unwrap()), [GATE], "an expired pod never gets the lock");
    env.history.check();
}

/// A pod gated on two locks (`zklock.io/lock: a,b`): one claim over both, the gate removed only
/// once both are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gated_on_two_locks_runs_once_it_holds_both() {
    let env = Env::new().await;
    let _op = env.operator();
    env.claim("holds-b", "reports", json!({})).await;
    env.wait_phase("holds-b", Phase::Held).await;
    gated_pod(&env, "both", json!({ "zklock.io/lock": "ledger,reports" }), &[GATE]).await;
    let claim = env.wait_phase("both", Phase::Waiting).await;
    let names: Vec<String> = claim.spec.locks.unwrap().into_iter().map(|l| l.label()).collect();
    assert_eq!(names, ["ledger", "reports"]);
    assert_eq!(claim.status.unwrap().waiting_for.as_deref(), Some("holds-b"));
    assert_eq!(gates(&env.pods.get("both").await.unwrap()), [GATE], "not while it holds only the ledger");
    env.delete_claim("holds-b").await;
    let pod = wait_pod(&env, "both", "ungated", |p| gates(p).is_empty()).await;
    let message = lock_condition(&pod).and_then(|c| c.message).unwrap_or_default();
    assert!(message.contains("ledger") && message.contains("reports"), "{message}");
    env.history.check();
}

/// Removes a policy binding when dropped, so that a failing test leaves no admission rule
/// behind for the next one.
struct Unbind {
    name: String,
    client: kube::Client,
}

impl Drop for Unbind {
    fn drop(&mut self) {
        use k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBinding;
        let (client, name) = (self.client.clone(), self.name.clone());
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async {
                let bindings: Api<MutatingAdmissionPolicyBinding> = Api::all(client);
                let params = DeleteParams::default();
                let _ = tokio::time::timeout(Duration::from_secs(10), bindings.delete(&name, &params)).await;
            });
        });
        let _ = done.join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_annotation_alone_gates_a_pod_where_the_gate_policy_is_installed() {
    use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
    use zklock::api::gate_policy::{gate_policy, gate_policy_binding, GATE_POLICY};
    let env = Env::new().await;
    if !serves_mutating_admission_policy() {
        // Before Kubernetes 1.36 there is no such policy (the chart renders none): the pod needs
        // the gate in its spec, and one with the annotation alone is told so and runs ungated.
        let _op = env.operator();
        gated_pod(&env, "alone", json!({ "zklock.io/lock": "db" }), &[]).await;
        wait_pod(&env, "alone", "told it is not gated", |p| reason(p).as_deref() == Some("NotGated")).await;
        return;
    }
    let apply = PatchParams::apply("zklock-tests").force();
    let policies: Api<MutatingAdmissionPolicy> = Api::all(env.client.clone());
    policies.patch(GATE_POLICY, &apply, &Patch::Apply(&gate_policy(GATE_POLICY))).await.expect("the gate policy");
    let binding = format!("zklock-gate-{}", env.ns);
    let _unbind = Unbind { name: binding.clone(), client: env.client.clone() };
    let bindings: Api<MutatingAdmissionPolicyBinding> = Api::all(env.client.clone());
    let bound = gate_policy_binding(&binding, GATE_POLICY, std::slice::from_ref(&env.ns));
    bindings.patch(&binding, &apply, &Patch::Apply(&bound)).await.expect("its binding");
    // The API server's policy cache follows within a second or so: probe until a pod comes back gated.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    for attempt in 0.. {
        let probe = format!("probe-{attempt}");
        let made = gated_pod(&env, &probe, json!({ "zklock.io/lock": "probe" }), &[]).await;
        env.pods.delete(&probe, &DeleteParams::default().grace_period(0)).await.expect("delete the probe");
        if gates(&made) == [GATE] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the API server never applied the gate policy");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let _op = env.operator();
    // One edit: the annotation, no gate in the spec.
    let first = gated_pod(&env, "first", json!({ "zklock.io/lock": "db" }), &[]).await;
    assert_eq!(gates(&first), [GATE], "the policy gave the pod its gate at creation");
    let second = gated_pod(&env, "second", json!({ "zklock.io/lock": "db" }), &["example.com/quota"]).await;
    assert_eq!(gates(&second), ["example.com/quota", GATE], "a gate of the pod's own stays, ours after it");
    let plain = gated_pod(&env, "plain", json!({ "team": "payments" }), &[]).await;
    assert!(gates(&plain).is_empty(), "a pod that asks for no lock is left alone");

    wait_pod(&env, "first", "ungated once Held", |p| gates(p).is_empty()).await;
    let waiting = wait_pod(&env, "second", "waiting behind first", |p| reason(p).as_deref() == Some("Waiting")).await;
    assert!(gates(&waiting).contains(&GATE.to_string()), "second stays gated while first holds");
    finish(&env, "first").await;
    wait_pod(&env, "second", "ungated from the lock once first finished", |p| gates(p) == ["example.com/quota"]).await;
}

/// A gated pod whose claim was granted, but whose gate had not gone yet when the operator's
/// session was lost, in a lock a Curator client uses: the next session judges the claim `Lost`,
/// and the pod is never started — not even by a retry of the gate's removal while that `Lost`
/// is still being written (issue 53: a pod starts only under a Held its term has judged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_hold_is_judged_lost_before_its_gate_went_is_never_started() {
    use zklock_testkit::api_proxy::{ApiProxy, Matcher};
    let zk = zklock_testkit::ZkServer::start();
    let env = Env::with_zk(zk.chroot().await).await;
    let chroot = &env.zk[env.zk.find('/').expect("a chroot")..];
    let cut = zklock_testkit::proxy::Proxy::start(zk.addr()).await;
    let proxy = ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let op =
        Operator::start_proxied_with_zk(&env, &proxy, &cut.connect_string(chroot), &["--zk-session-timeout", "2s"]);
    let pod_path = format!("/namespaces/{}/pods/z-job", env.ns);
    let ungate = proxy.hold_next(Matcher { method: "PATCH", path_contains: pod_path, status: Some(false) });
    gated_pod(&env, "z-job", json!({ "zklock.io/lock": "shared-with-java" }), &[GATE]).await;
    let claim = env.wait_phase("z-job", Phase::Held).await;
    assert!(ungate.caught(PATIENCE).await, "the operator removes the gate");
    // The claim's next status write is held too: until it lands, the operator's own last word
    // on the claim is Held.
    let claim_path = format!("/namespaces/{}/lockclaims/z-job", env.ns);
    let ended = proxy.hold_next(Matcher { method: "PATCH", path_contains: claim_path, status: Some(true) });
    // The operator is cut off from ZooKeeper; meanwhile a Curator-style contender queues
    // (persistent: it outlives the outage), unheard, and the operator's session expires.
    let node = claim.status.unwrap().znode.unwrap();
    let dir = node.rsplit_once('/').unwrap().0.to_string();
    cut.set_blackhole(true);
    let raw = zookeeper_client::Client::connect(&env.zk).await.unwrap();
    let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(&format!("{dir}/_c_0d1e-lock-"), b"10.0.0.7", &options).await.unwrap();
    until("the operator's session to expire on the server (its node gone)", || async {
        raw.check_stat(&node).await.is_ok_and(|stat| stat.is_none())
    })
    .await;
    drop(raw);
    cut.set_blackhole(false);
    until("the operator's session to end", || async { op.metric("zklock_zookeeper_sessions_lost_total").await >= 1.0 })
        .await;
    assert!(ended.caught(PATIENCE).await, "the next session ends the claim");
    // The held removal of the gate gives up (no answer within 10 s); the pod is looked at again.
    until("the held gate removal to time out", || async {
        op.metric("zklock_reconcile_errors_total{error=\"timeout\"").await >= 1.0
    })
    .await;
    let looked = op.metric("zklock_gated_pod_reconciles_total").await;
    until("the gated pod to be looked at twice more", || async {
        op.metric("zklock_gated_pod_reconciles_total").await >= looked + 2.0
    })
    .await;
    let pod = env.pods.get("z-job").await.unwrap();
    assert_eq!(gates(&pod), [GATE], "not started under a Held this term judged Lost: {:?}", lock_condition(&pod));
    ended.deliver(PATIENCE).await;
    let c = env.wait_phase("z-job", Phase::Lost).await;
    // Judged by the new session (or, had the engine known the lock shared already, ended
    // while ZooKeeper was out of reach).
    let why = condition(&c, zklock::api::conditions::FINISHED).unwrap().1;
    assert!(["SessionLost", "ConnectionLost"].contains(&why.as_str()), "{why}");
    let pod = wait_pod(&env, "z-job", "told its claim ended Lost", |p| reason(p).as_deref() == Some("Lost")).await;
    assert_eq!(gates(&pod), [GATE]);
    env.history.check();
    // A hold dropped sends its request on: the first removal of the gate must never land.
    std::mem::forget(ungate);
}
