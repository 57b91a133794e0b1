//! Liveness (docs/design.md: liveness): one stray object or one leader cut off from ZooKeeper never
//! freezes a lock, or the whole operator. Each test makes its fault through the public surface,
//! as a user or a network would: kubectl, a ZooKeeper client of its own, signals, a TCP proxy,
//! an HTTP proxy in front of the API server. Each one failed on the build before its fix.

use crate::e2e_support;

use std::time::Instant;

use e2e_support::*;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use zklock::api::Phase;
use zklock_testkit::api_proxy::{ApiProxy, Matcher};
use zklock_testkit::proxy::Proxy;

/// A claim's finalizers as the API has them now.
async fn finalizers(env: &Env, name: &str) -> Vec<String> {
    env.claims.get_opt(name).await.ok().flatten().and_then(|c| c.metadata.finalizers).unwrap_or_default()
}

/// Takes another party's finalizer off claim `name` (so that its namespace can go).
async fn let_go(env: &Env, name: &str) {
    let none = json!({ "metadata": { "finalizers": null } });
    let _ = env.claims.patch(name, &PatchParams::default(), &Patch::Merge(&none)).await;
}

/// A waiter deleted while another finalizer keeps the object has its cleanup done at once (its
/// node goes, then the operator's finalizer); the object stays, with its last status, Waiting.
/// After a restart the new term must not take it for a live claim: it was re-created a node
/// (which then held the lock in ZooKeeper for good) and awaited for a stamp that no reconcile
/// would ever write (kube-runtime's finalizer helper hands no reconcile a claim whose cleanup
/// is over), so the lock granted nothing any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_deleted_while_another_finalizer_keeps_it_blocks_nothing_after_a_restart() {
    let env = Env::new().await;
    let mut op = env.operator();
    env.claim("holder", "ghost", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    for name in ["kept", "next"] {
        env.claim(name, "ghost", json!({})).await;
        env.wait_phase(name, Phase::Waiting).await;
    }
    let keep = json!([{ "op": "add", "path": "/metadata/finalizers/-", "value": "example.com/keep" }]);
    let keep: json_patch::Patch = serde_json::from_value(keep).unwrap();
    env.claims.patch("kept", &PatchParams::default(), &Patch::Json::<()>(keep)).await.expect("add a finalizer");
    env.claims.delete("kept", &DeleteParams::default()).await.expect("delete kept");
    until("kept's cleanup (only the other finalizer left)", || async {
        finalizers(&env, "kept").await == ["example.com/keep"]
    })
    .await;
    op.restart();
    env.delete_claim("holder").await;
    env.wait_phase("next", Phase::Held).await;
    assert_eq!(env.status("kept").await, Some(Phase::Waiting), "a deleted claim keeps its last status");
    env.delete_claim("next").await;
    env.history.await_gone("next").await;
    let_go(&env, "kept").await;
    assert_eq!(env.history.grants("ghost"), vec!["holder", "next"]);
    env.history.check();
}

/// An admin's (or a restore tool's) edit of a claim's status that drops `leaderEpoch`, made
/// after the operator wrote the claim in this term: the operator took every copy without its
/// epoch for one older than its own write and waited for a newer one for ever, so the claim
/// froze, and with it the lock it was next in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_edit_that_drops_the_leader_epoch_does_not_freeze_the_claim() {
    let env = Env::new().await;
    let _op = env.operator();
    env.claim("holder", "edited", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    env.claim("next", "edited", json!({})).await;
    let next = env.wait_phase("next", Phase::Waiting).await;
    assert!(next.status.and_then(|s| s.leader_epoch).is_some(), "the operator stamps its epoch into its writes");
    let drop_epoch = r#"[{"op":"remove","path":"/status/leaderEpoch"}]"#;
    // The operator writes the epoch back at once now; it used to freeze instead.
    env.kubectl(&["patch", "lockclaim", "next", "--subresource=status", "--type=json", "-p", drop_epoch]);
    env.delete_claim("holder").await;
    let next = env.wait_phase("next", Phase::Held).await;
    assert!(next.status.and_then(|s| s.leader_epoch).is_some(), "the grant stamps the epoch again");
    env.delete_claim("next").await;
    env.history.await_gone("next").await;
    env.history.check();
}

/// Namespace directories are open for create (Curator makes its lock directories there), so
/// any ZooKeeper client can make one the operator may not even list: Curator's usual secure
/// setup, a creator-only ACL. Re-anchoring scans the namespace directories for nodes of earlier
/// sessions; one unreadable directory failed the whole scan, so no term could start after a
/// restart, and the operator never served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_another_client_closed_does_not_stop_re_anchoring() {
    let env = Env::new().await;
    let mut op = Operator::start(&env, &["--zk-session-timeout", "2s"]);
    env.claim("holder", "open", json!({})).await;
    let held = env.wait_phase("holder", Phase::Held).await;
    let stranger = zookeeper_client::Client::connector()
        .with_auth("digest", b"stranger:secret")
        .connect(&env.zk)
        .await
        .expect("connect to ZooKeeper");
    let closed = format!("/zklock/locks/{}/curator-secured", env.ns);
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::creator_all());
    stranger.create(&closed, b"", &options).await.expect("make a directory only its creator may read");
    let lock = format!("{closed}/lock-");
    let ephemeral = zookeeper_client::CreateMode::EphemeralSequential.with_acls(zookeeper_client::Acls::creator_all());
    stranger.create(&lock, b"", &ephemeral).await.expect("a node of the stranger's own");

    op.restart();
    env.claim("next", "open", json!({})).await;
    env.wait_phase("next", Phase::Waiting).await;
    let holder = env.claims.get("holder").await.unwrap();
    assert_eq!(phase_of(&holder), Some(Phase::Held), "the holder kept the lock across the restart");
    assert_eq!(holder.status.unwrap().fencing_token, held.status.unwrap().fencing_token);
    env.delete_claim("holder").await;
    env.wait_phase("next", Phase::Held).await;
    env.delete_claim("next").await;
    env.history.await_gone("next").await;
    env.history.check();
}

/// kube-runtime's finalizer helper sends its PATCH with the operator's client, which had no
/// read timeout: one request the API server never answered froze the reconcile of a deleted
/// holder for good, and the registry (which counts the holder until its finalizer's removal
/// is answered) never let the next claim be granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_removal_that_is_never_answered_does_not_hold_the_next_grant() {
    let env = Env::new().await;
    let proxy = ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let _op = Operator::start_proxied(&env, &proxy, &[]);
    env.claim("holder", "unanswered", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    env.claim("next", "unanswered", json!({})).await;
    env.wait_phase("next", Phase::Waiting).await;
    // The holder's cleanup writes no status (no other finalizer keeps it): the first PATCH of
    // the claim after its deletion is the finalizer's removal.
    let path = format!("/namespaces/{}/lockclaims/holder", env.ns);
    let held = proxy.hold_next(Matcher { method: "PATCH", path_contains: path, status: Some(false) });
    env.delete_claim("holder").await;
    assert!(held.caught(PATIENCE).await, "the operator removed the finalizer");
    let deleted = Instant::now();
    env.wait_phase("next", Phase::Held).await;
    eprintln!("finalizer removal never answered -> next Held after {:?}", deleted.elapsed());
    let answer = held.deliver(PATIENCE).await;
    eprintln!("the held removal was answered {answer:?} when delivered at last");
    env.delete_claim("next").await;
    env.history.await_gone("next").await;
    env.history.check();
}

/// A leader that cannot reach ZooKeeper (its API path fine) kept the lease for as long as the
/// cut lasted: it re-opened sessions without limit while renewing the lease, so the standby
/// that could serve never took over and every lock froze. It must give the lease up within
/// its bound (twice the session timeout) and say so; the standby leads and grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_zookeeper_gives_the_lease_to_a_standby_that_can_serve() {
    let env = Env::new().await;
    let server = zklock_testkit::ZkServer::shared();
    let chroot = &env.zk[env.zk.find('/').expect("a chroot")..];
    let (cut, fine) = (Proxy::start(server.addr()).await, Proxy::start(server.addr()).await);
    let flags = ["--zk-session-timeout", "4s"];
    let first = Operator::start_with_zk(&env, &cut.connect_string(chroot), &flags);
    until("the first replica to lead", || async { first.metric("zklock_leader").await == 1.0 }).await;
    let second = Operator::start_with_zk(&env, &fine.connect_string(chroot), &flags);
    until("the standby to be ready", || async { second.ready().await }).await;
    env.claim("holder", "cut", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    env.claim("next", "cut", json!({})).await;
    env.wait_phase("next", Phase::Waiting).await;

    cut.set_blackhole(true);
    let at = Instant::now();
    env.delete_claim("holder").await;
    until("the standby to lead and serve", || async {
        second.metric("zklock_leader").await == 1.0 && second.ready().await
    })
    .await;
    let leads = at.elapsed();
    env.wait_phase("next", Phase::Held).await;
    let granted = at.elapsed();
    eprintln!("leader cut off from ZooKeeper -> standby leads after {leads:?}; next claim Held after {granted:?}");
    assert_eq!(first.metric("zklock_leader").await, 0.0, "the cut-off replica does not lead");
    assert_eq!(first.metric("zklock_terms_given_up_total").await, 1.0, "it gave its term up once");
    let (code, body) = http_answer(&first.metrics, "/readyz").await.expect("the cut-off replica answers");
    if code == 503 {
        assert!(body.contains("ZooKeeper"), "its readiness says why: {body}");
    }

    cut.set_blackhole(false);
    env.claim("after", "cut", json!({})).await;
    env.wait_phase("after", Phase::Waiting).await;
    env.delete_claim("next").await;
    env.wait_phase("after", Phase::Held).await;
    env.delete_claim("after").await;
    env.history.await_gone("after").await;
    assert_eq!(first.metric("zklock_leader").await, 0.0, "one replica leads");
    env.history.check();
}

/// The epoch policy's parameter deleted (`kubectl delete cm`, a namespace clean-up): the API
/// server then refuses every status write, the leader's too (`parameterNotFoundAction: Deny`),
/// and every grant stalled for good. The leader makes it again with its own epoch, proves the
/// fence again, and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_epoch_parameter_is_made_again_and_grants_go_on() {
    let env = Env::new().await;
    assert!(epoch_policy(), "the control plane serves ValidatingAdmissionPolicy");
    let _op = env.operator();
    env.claim("holder", "param", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    env.claim("next", "param", json!({})).await;
    env.wait_phase("next", Phase::Waiting).await;
    let param = zklock::api::epoch_policy::EPOCH_PARAM;
    env.kubectl(&["delete", "configmap", param]);
    let deleted = Instant::now();
    env.delete_claim("holder").await;
    env.wait_phase("next", Phase::Held).await;
    eprintln!("epoch parameter deleted -> next Held after {:?}", deleted.elapsed());
    let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let made = configmaps.get(param).await.expect("the parameter was made again");
    let epoch = made.data.and_then(|d| d.get("epoch").cloned()).expect("with an epoch");
    let next = env.claims.get("next").await.unwrap();
    assert_eq!(next.status.and_then(|s| s.leader_epoch).map(|e| e.to_string()), Some(epoch), "the leader's own");
    env.delete_claim("next").await;
    env.history.await_gone("next").await;
    env.history.check();
}

/// FIFO across sessions. A new ZooKeeper session re-creates every node, in recorded order, with
/// new sequence numbers; the claims' statuses take the new nodes one write at a time. When a
/// second session change comes before every status caught up, ordering by the recorded nodes
/// mixed sequences of two generations: a claim whose write lagged (here, held up by a proxy)
/// was put back ahead of one enqueued before it, and was granted first. Claims are ordered by a
/// key that every re-creation keeps: the zxid of their first enqueue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_session_changes_close_together_keep_the_queue_in_order() {
    let env = Env::new().await;
    let server = zklock_testkit::ZkServer::shared();
    let chroot = &env.zk[env.zk.find('/').expect("a chroot")..];
    let zk = Proxy::start(server.addr()).await;
    let api = ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let op = Operator::start_proxied_with_zk(&env, &api, &zk.connect_string(chroot), &["--zk-session-timeout", "2s"]);
    for name in ["holder", "first", "second"] {
        env.claim(name, "order", json!({})).await;
        env.wait(name, "queued", |c| matches!(phase_of(c), Some(Phase::Held | Phase::Waiting))).await;
    }
    let znode = |c: &zklock::api::LockClaim| c.status.as_ref().and_then(|s| s.znode.clone()).unwrap_or_default();
    let before = znode(&env.claims.get("first").await.unwrap());
    // The second claim's status write after the next session change is held up.
    let path = format!("/namespaces/{}/lockclaims/second/status", env.ns);
    let held = api.hold_next(Matcher { method: "PATCH", path_contains: path, status: None });
    for round in 1..=2 {
        zk.set_blackhole(true);
        until("the session to end", || async {
            op.metric("zklock_zookeeper_sessions_lost_total").await >= f64::from(round)
        })
        .await;
        zk.set_blackhole(false);
        until("the leader to serve again", || async { op.ready().await }).await;
        if round == 1 {
            assert!(held.caught(PATIENCE).await, "second's status write was held");
            env.wait("first", "recorded with its new node", |c| znode(c) != before).await;
        }
    }
    env.delete_claim("holder").await;
    env.wait_phase("first", Phase::Held).await;
    assert_eq!(env.status("second").await, Some(Phase::Waiting), "second waits behind first");
    let _ = held.deliver(PATIENCE).await;
    env.delete_claim("first").await;
    env.wait_phase("second", Phase::Held).await;
    env.delete_claim("second").await;
    env.history.await_gone("second").await;
    assert_eq!(env.history.grants("order"), vec!["holder", "first", "second"]);
    env.history.check();
}

/// The fence of docs/design.md: fencing is proven where the operator writes, whatever the number of
/// claims: here the admission policy's binding covers one served namespace and not the other.
/// The term used to prove it on one claim per scope at its start: a namespace with claims that
/// the binding missed failed the whole term, again and again (no namespace served at all), and
/// one without claims then was served unfenced. Now each namespace is proven before the term's
/// first status write there, and one that cannot be fails alone, saying why on its claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_the_epoch_policy_does_not_cover_fails_alone() {
    use k8s_openapi::api::events::v1::Event;
    let env = Env::new().await;
    assert!(epoch_policy(), "the control plane serves ValidatingAdmissionPolicy");
    let other = format!("{}-uncovered", env.ns);
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(env.client.clone());
    let namespace = serde_json::from_value(json!({ "metadata": { "name": other } })).unwrap();
    namespaces.create(&Default::default(), &namespace).await.expect("create the uncovered namespace");
    let uncovered: kube::Api<zklock::api::LockClaim> = kube::Api::namespaced(env.client.clone(), &other);
    let claim = |name: &str| -> zklock::api::LockClaim {
        serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": name }, "spec": { "lockName": "uncovered" },
        }))
        .unwrap()
    };
    uncovered.create(&Default::default(), &claim("early")).await.expect("a claim before the term");
    let op = Operator::start(&env, &["--watch-namespace", &other]);
    env.claim("served", "covered", json!({})).await;
    env.wait_phase("served", Phase::Held).await;
    uncovered.create(&Default::default(), &claim("late")).await.expect("a claim during the term");
    let events: kube::Api<Event> = kube::Api::namespaced(env.client.clone(), &other);
    for name in ["early", "late"] {
        until(&format!("a Warning event on {name}"), || async {
            let listed = events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
            listed.iter().any(|e| {
                e.reason.as_deref() == Some("Unfenced")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.note.as_deref().is_some_and(|n| n.contains("does not refuse"))
            })
        })
        .await;
        let now = uncovered.get(name).await.expect("the claim");
        assert_eq!(now.status.and_then(|s| s.phase), None, "nothing is written for {name}");
    }
    assert_eq!(op.metric("zklock_leader").await, 1.0, "the operator leads and serves the covered namespace");
    for name in ["early", "late"] {
        uncovered.delete(name, &Default::default()).await.expect("delete the claim");
        until(&format!("{name} to be gone"), || async { matches!(uncovered.get_opt(name).await, Ok(None)) }).await;
    }
    env.delete_claim("served").await;
    env.history.await_gone("served").await;
    let _ = namespaces.delete(&other, &Default::default()).await;
    env.history.check();
}

/// Two installations on one ZooKeeper root (two releases on the default root, two clusters on
/// one ensemble) took the leader epoch from each other for ever, each re-anchoring the other's
/// nodes away. The root serves one installation: the second one's leader is refused with a
/// message naming the root, and the first goes on undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_installation_on_a_root_in_use_is_refused_and_the_first_goes_on() {
    let first = Env::new().await;
    let second = Env::on(&first.kubeconfig, first.zk.clone(), true).await;
    let a = first.operator();
    until("the first installation to lead", || async { a.metric("zklock_leader").await == 1.0 }).await;
    first.claim("holder", "shared-root", json!({})).await;
    let held = first.wait_phase("holder", Phase::Held).await;
    first.claim("next", "shared-root", json!({})).await;
    first.wait_phase("next", Phase::Waiting).await;

    let b = second.operator();
    second.claim("elsewhere", "shared-root", json!({})).await;
    until("the second installation to say that the root serves another", || async {
        http_answer(&b.metrics, "/readyz")
            .await
            .is_some_and(|(_, body)| body.contains("serves another zklock installation"))
    })
    .await;
    let holder = first.claims.get("holder").await.unwrap();
    assert_eq!(phase_of(&holder), Some(Phase::Held));
    assert_eq!(holder.status.unwrap().fencing_token, held.status.unwrap().fencing_token, "the holder is undisturbed");
    first.delete_claim("holder").await;
    first.wait_phase("next", Phase::Held).await;
    assert_eq!(second.status("elsewhere").await, None, "the refused installation writes nothing");
    assert!(!a.logs().contains("stepped down"), "the first installation kept its term");
    first.delete_claim("next").await;
    first.history.await_gone("next").await;
    first.history.check();
}

/// Without leader election an operator is one process: a rollout that overlaps (the chart's
/// single-replica profile rolled out with maxSurge) started a second one beside it, whose
/// re-anchoring deleted the first one's nodes, and the first wrote every claim Lost. The second
/// now waits while the first serves the root, and takes over once it stops, holders kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_without_leader_election_overlapping_take_no_hold_away() {
    // No admission policy: an operator without leader election keeps no epoch parameter.
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let env = Env::on(zklock_testkit::kube::kubeconfig(), zk, false).await;
    let mut old = Operator::start(&env, &["--no-leader-election"]);
    env.claim("holder", "rollout", json!({})).await;
    let held = env.wait_phase("holder", Phase::Held).await;
    env.claim("next", "rollout", json!({})).await;
    env.wait_phase("next", Phase::Waiting).await;

    let new = Operator::start(&env, &["--no-leader-election"]);
    until("the new operator to wait for the root", || async {
        http_answer(&new.metrics, "/readyz")
            .await
            .is_some_and(|(_, body)| body.contains("serves another zklock installation"))
    })
    .await;
    env.claim("during", "rollout", json!({})).await;
    env.wait_phase("during", Phase::Waiting).await;
    let stopped = old.terminate();
    assert!(stopped.success(), "the old operator stops cleanly: {stopped:?}");
    until("the new operator to serve", || async { new.ready().await }).await;
    let holder = env.claims.get("holder").await.unwrap();
    assert_eq!(phase_of(&holder), Some(Phase::Held), "the holder kept the lock");
    assert_eq!(holder.status.unwrap().fencing_token, held.status.unwrap().fencing_token);
    env.delete_claim("holder").await;
    env.wait_phase("next", Phase::Held).await;
    env.delete_claim("next").await;
    env.wait_phase("during", Phase::Held).await;
    env.delete_claim("during").await;
    env.history.await_gone("during").await;
    let lost: Vec<String> =
        env.history.records().into_iter().filter(|r| r.phase == Some(Phase::Lost)).map(|r| r.name).collect();
    assert!(lost.is_empty(), "claims turned Lost in the rollout: {lost:?}");
    assert_eq!(env.history.grants("rollout"), vec!["holder", "next", "during"]);
    env.history.check();
}

/// Loosens the LockClaim CRD of the environment's (private) control plane so that a claim the
/// operator cannot read can be stored, as after a schema change or an operator downgrade.
async fn loosen_claim_schema(env: &Env) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(env.client.clone());
    let name = "lockclaims.zklock.io";
    let mut crd = serde_json::to_value(crds.get(name).await.expect("the LockClaim CRD")).unwrap();
    for version in crd["spec"]["versions"].as_array_mut().expect("versions") {
        version["schema"]["openAPIV3Schema"]["properties"]["spec"] =
            json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
    }
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    crds.replace(name, &Default::default(), &crd).await.expect("loosen the LockClaim CRD");
}

/// A claim the operator cannot read as a LockClaim (a field of the wrong type, stored under a
/// looser schema, as after a schema change or a downgrade) used to make its namespace's list
/// fail, again and again: no claim there was served any more, and no term could start. Now it
/// is reported (a Warning event) and left as it is: what it holds it keeps, across a new term
/// too (re-anchored from the nodes its status records), until it is deleted; every other claim
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_operator_cannot_read_fails_alone_and_keeps_what_it_holds() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{ApiResource, DynamicObject};
    // A control plane of its own: the CRD is loosened there for this test alone.
    let kubeconfig = zklock_testkit::kube::private_control_plane("loose-claim-schema");
    let env = Env::on(kubeconfig, zklock_testkit::ZkServer::shared().chroot().await, true).await;
    loosen_claim_schema(&env).await;
    // Written and read untyped: the typed client cannot read these claims either.
    let resource = ApiResource::erase::<zklock::api::LockClaim>(&());
    let raw: kube::Api<DynamicObject> = kube::Api::namespaced_with(env.client.clone(), &env.ns, &resource);
    // Left with the loosened CRD (an operator brings its CRDs to its own schema at start).
    let mut op = e2e_support::Operator::start(&env, &["--manage-crds=false"]);
    env.claim("holder", "kept", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    env.claim("next", "kept", json!({})).await;
    env.wait_phase("next", Phase::Waiting).await;

    // The holder's spec gets a field of the wrong type; a new claim is made unreadable.
    let wrong = json!({ "spec": { "holder": "not-a-pod-reference" } });
    until("the looser schema to take the holder's wrong field", || async {
        raw.patch("holder", &PatchParams::default(), &Patch::Merge(&wrong)).await.is_ok()
    })
    .await;
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
        "metadata": { "name": "bad" }, "spec": { "lockName": 7 },
    }))
    .unwrap();
    raw.create(&Default::default(), &bad).await.expect("create the unreadable claim");

    // Every other claim goes on.
    env.claim("other", "free", json!({})).await;
    env.wait_phase("other", Phase::Held).await;
    let events: kube::Api<Event> = kube::Api::namespaced(env.client.clone(), &env.ns);
    for name in ["holder", "bad"] {
        until(&format!("an Unreadable Warning event on {name}"), || async {
            let listed = events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
            listed.iter().any(|e| {
                e.reason.as_deref() == Some("Unreadable")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.note.as_deref().is_some_and(|n| n.contains("spec"))
            })
        })
        .await;
    }

    // A new term (the leader killed, a new process and session) re-anchors the holder from its
    // recorded node: the next claim in its lock is still not Held once the term serves.
    op.restart();
    env.claim("after-restart", "free-too", json!({})).await;
    env.wait_phase("after-restart", Phase::Held).await;
    assert_eq!(env.status("next").await, Some(Phase::Waiting), "the unreadable holder keeps its lock in a new term");

    // Its deletion is read: its node goes, and the next claim gets the lock.
    raw.delete("holder", &DeleteParams::default()).await.expect("delete the unreadable holder");
    env.wait_phase("next", Phase::Held).await;
    raw.delete("bad", &DeleteParams::default()).await.expect("delete the unreadable claim");
    for name in ["holder", "bad"] {
        until(&format!("{name} to be gone"), || async { matches!(raw.get_opt(name).await, Ok(None)) }).await;
    }
    assert_eq!(op.metric("zklock_leader").await, 1.0, "the operator leads throughout");
}

/// An unreadable waiter (issue 53): a claim made unreadable while it waited kept its node, which
/// once first held the lock for ever (nobody could write the claim Held); and a new term made
/// its node again. Now only a holder keeps what it has: a waiter gives its place up, in a term
/// and across a new one, and once fixed queues again at the back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_waiter_gives_its_place_up_and_blocks_nobody() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{ApiResource, DynamicObject};
    // A control plane of its own (loosening the CRD where another test watches claims expires
    // that test's watches).
    let kubeconfig = zklock_testkit::kube::private_control_plane("loose-claim-schema-waiter");
    let env = Env::on(kubeconfig, zklock_testkit::ZkServer::shared().chroot().await, true).await;
    loosen_claim_schema(&env).await;
    let resource = ApiResource::erase::<zklock::api::LockClaim>(&());
    let raw: kube::Api<DynamicObject> = kube::Api::namespaced_with(env.client.clone(), &env.ns, &resource);
    let mut op = e2e_support::Operator::start(&env, &["--manage-crds=false"]);
    for lock in ["in-term", "new-term"] {
        let n = if lock == "in-term" { 1 } else { 2 };
        env.claim(&format!("h{n}"), lock, json!({})).await;
        env.wait_phase(&format!("h{n}"), Phase::Held).await;
        for name in [format!("w{n}"), format!("t{n}")] {
            env.claim(&name, lock, json!({})).await;
            env.wait_phase(&name, Phase::Waiting).await;
        }
    }
    let first_node = env.wait_phase("w1", Phase::Waiting).await.status.and_then(|s| s.znode);
    let wrong = json!({ "spec": { "holder": "not-a-pod-reference" } });
    let make_unreadable = |name: &'static str| {
        let (raw, wrong) = (raw.clone(), wrong.clone());
        async move {
            until(&format!("the looser schema to take {name}'s wrong field"), || async {
                raw.patch(name, &PatchParams::default(), &Patch::Merge(&wrong)).await.is_ok()
            })
            .await;
        }
    };

    // In a term: w1 is reported, and gives its place up; h1 leaves, and t1 is granted.
    make_unreadable("w1").await;
    let events: kube::Api<Event> = kube::Api::namespaced(env.client.clone(), &env.ns);
    until("an Unreadable Warning event on w1", || async {
        let listed = events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        listed.iter().any(|e| {
            e.reason.as_deref() == Some("Unreadable")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("w1")
        })
    })
    .await;
    env.delete_claim("h1").await;
    env.wait_phase("t1", Phase::Held).await;
    let w1 = raw.get("w1").await.expect("read w1 untyped");
    assert_eq!(w1.data["status"]["phase"], "Waiting", "its status is left as it is");

    // Across a new term: w2 is made unreadable while no operator runs; the next term does not
    // make its node again, and t2 is granted when h2 leaves.
    op.kill9();
    make_unreadable("w2").await;
    op.restart();
    env.delete_claim("h2").await;
    env.wait_phase("t2", Phase::Held).await;

    // Fixed, w1 queues again, behind t1, which held meanwhile.
    raw.patch("w1", &PatchParams::default(), &Patch::Merge(&json!({ "spec": { "holder": null } })))
        .await
        .expect("fix w1");
    let node = |c: &zklock::api::LockClaim| c.status.as_ref().and_then(|s| s.znode.clone());
    env.wait("w1", "w1 queued again with a new node", |c| {
        e2e_support::phase_of(c) == Some(Phase::Waiting) && node(c).is_some() && node(c) != first_node
    })
    .await;
    env.delete_claim("t1").await;
    env.wait_phase("w1", Phase::Held).await;
    for name in ["w1", "t2", "w2"] {
        raw.delete(name, &DeleteParams::default()).await.expect("delete");
    }
    for name in ["w1", "t2", "w2"] {
        until(&format!("{name} to be gone"), || async { matches!(raw.get_opt(name).await, Ok(None)) }).await;
    }
    env.history.check();
}

/// With `--watch-namespace` (every test operator runs with it), re-anchoring left out the
/// `ClusterLock` directories its scan found holding only an earlier session's nodes (listed with
/// no namespace), so a new claim there queued behind a node nobody would release until that
/// session expired (issue 53).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_lock_left_with_only_stale_nodes_is_re_anchored_when_namespaces_are_watched() {
    let zk = zklock_testkit::ZkServer::start_with_max_session(std::time::Duration::from_secs(40));
    let env = Env::with_zk(zk.chroot().await).await;
    let mut op = Operator::start(&env, &["--zk-session-timeout", "40s"]);
    let name = format!("stale-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let _lock = TestClusterLock::make(&env, &name, TestClusterLock::admitting(&env.ns)).await;
    let spec = json!({ "clusterLockName": name });
    env.claim_spec("gone", spec.clone()).await;
    env.wait_phase("gone", Phase::Held).await;
    // The leader dies; its detached session, and gone's node, outlive it by 40 s. The claim
    // leaves the API meanwhile: no live claim is recorded in the ClusterLock any more.
    op.kill9();
    let killed = Instant::now();
    let_go(&env, "gone").await;
    let _ = env.claims.delete("gone", &DeleteParams::default()).await;
    env.wait_gone("gone").await;
    op.restart();
    env.claim_spec("next", spec).await;
    env.wait_phase("next", Phase::Held).await;
    assert!(
        killed.elapsed() < std::time::Duration::from_secs(35),
        "next Held only {:?} after the kill: it queued behind the old session's node",
        killed.elapsed()
    );
    env.delete_claim("next").await;
    env.wait_gone("next").await;
}

/// The safety net against an event that never came: every claim is reconciled again each
/// `--resync-period`, for the whole term, in batches of `--max-concurrent-reconciles`; and a
/// walk over claims that did not change writes nothing (it replaced a requeue per claim, and at
/// 100,000 claims a write per claim per walk would be the API server's largest load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claim_is_reconciled_again_each_resync_period_and_an_unchanged_one_is_not_written() {
    let env = Env::new().await;
    let op = Operator::start(&env, &["--resync-period", "2s", "--max-concurrent-reconciles", "2"]);
    env.claim("holder", "walked", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    let waiters = ["w1", "w2", "w3", "w4"];
    for name in waiters {
        env.claim(name, "walked", json!({})).await;
        env.wait_phase(name, Phase::Waiting).await;
    }
    let periodic = || op.metric("zklock_claim_walks_total{cause=\"period\"}");
    until("a walk of every claim after the period", || async { periodic().await >= 1.0 }).await;
    let versions = || async {
        let list = env.claims.list(&Default::default()).await.expect("list the claims");
        list.items.iter().map(|c| (c.metadata.name.clone(), c.metadata.resource_version.clone())).collect::<Vec<_>>()
    };
    let (walks, writes, reconciles, before) = (
        periodic().await,
        op.metric("zklock_kubernetes_writes_total").await,
        op.metric("zklock_reconciles_total").await,
        versions().await,
    );
    until("two more walks", || async { periodic().await >= walks + 2.0 }).await;
    let reconciled = op.metric("zklock_reconciles_total").await - reconciles;
    assert!(reconciled >= 2.0 * 5.0, "two walks reconcile each of the 5 claims twice: {reconciled} reconciles");
    assert_eq!(op.metric("zklock_kubernetes_writes_total").await, writes, "a walk of unchanged claims writes nothing");
    assert_eq!(versions().await, before, "no claim changed");
    assert_eq!(op.metric("zklock_claim_walks_total{cause=\"reanchored\"}").await, 1.0, "one re-anchoring, the term's");

    env.delete_claim("holder").await;
    env.wait_phase("w1", Phase::Held).await;
    for (name, next) in waiters.iter().zip(waiters.iter().skip(1)) {
        env.delete_claim(name).await;
        env.wait_phase(next, Phase::Held).await;
    }
    env.delete_claim("w4").await;
    env.history.await_gone("w4").await;
    assert_eq!(env.history.grants("walked"), ["holder", "w1", "w2", "w3", "w4"]);
    env.history.check();
}

/// Annotates claim `name` every 50 ms (as any tool that annotates its objects would) until
/// stopped; `stop` answers how many times.
struct Toucher {
    touching: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Toucher {
    fn start(env: &Env, name: &str) -> Toucher {
        let touching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (claims, name, flag) = (env.claims.clone(), name.to_string(), touching.clone());
        let task = tokio::spawn(async move {
            let mut touches = 0u64;
            while flag.load(std::sync::atomic::Ordering::Relaxed) {
                touches += 1;
                let patch = json!({ "metadata": { "annotations": { "example.com/touched": touches.to_string() } } });
                claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("touch the claim");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            touches
        });
        Toucher { touching, task }
    }

    async fn stop(self) -> u64 {
        self.touching.store(false, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("the toucher")
    }
}

/// Twenty times a status refresh's spacing (500 ms): a refresh that comes at all comes well
/// within it.
const REFRESHED_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// A `Lock` whose claims change more often than its status refreshes may be spaced (500 ms) has
/// its status refreshed all the same. kube-runtime's debounce, which spaced them, starts its
/// wait again at every trigger: a claim touched every 50 ms (any tool that annotates its
/// objects; a busy lock's handoffs do the same) kept the `Lock`'s status as it was until its
/// claims were quiet for half a second, which on a busy lock may be never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_locks_status_is_refreshed_while_its_claims_keep_changing() {
    use zklock::api::Lock;
    let env = Env::new().await;
    let _op = env.operator();
    let locks = env.lock("busy", 1).await;
    env.claim("holder", "busy", json!({})).await;
    env.wait_phase("holder", Phase::Held).await;
    env.claim("waiter", "busy", json!({})).await;
    env.wait_phase("waiter", Phase::Waiting).await;
    wait_lock(&locks, "busy", "1 queued", |l| l.status.as_ref().is_some_and(|s| s.queue_length == 1)).await;

    let toucher = Toucher::start(&env, "waiter");
    env.claim("late", "busy", json!({})).await;
    env.wait_phase("late", Phase::Waiting).await;
    let waited = Instant::now();
    let two_queued = |l: Option<&Lock>| l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.queue_length == 2);
    let refreshed = kube::runtime::wait::await_condition(locks.clone(), "busy", two_queued);
    let outcome = tokio::time::timeout(REFRESHED_WITHIN, refreshed).await;
    let touches = toucher.stop().await;
    assert!(
        matches!(outcome, Ok(Ok(Some(_)))),
        "the Lock's status did not show the late claim queued within {REFRESHED_WITHIN:?} while the waiter was \
         touched {touches} times ({outcome:?})"
    );
    eprintln!("refreshed after {:?} while touched {touches} times", waited.elapsed());
    for name in ["holder", "waiter", "late"] {
        env.delete_claim(name).await;
    }
    env.history.await_gone("late").await;
    env.history.check();
}

/// The same for a `ClusterLock`, whose status is read from ZooKeeper (its look at the queue is
/// spaced by a throttle of its own, as a `Lock`'s write is): a waiter touched every 50 ms must
/// not keep a later claim out of its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_cluster_locks_status_is_refreshed_while_its_claims_keep_changing() {
    use zklock::api::ClusterLock;
    let env = Env::new().await;
    let _op = env.operator();
    let name = format!("busy-{}", &env.ns["zklock-e2e-".len()..]);
    let _lock = TestClusterLock::make(&env, &name, TestClusterLock::admitting(&env.ns)).await;
    let spec = json!({ "clusterLockName": name });
    env.claim_spec("holder", spec.clone()).await;
    env.wait_phase("holder", Phase::Held).await;
    env.claim_spec("waiter", spec.clone()).await;
    env.wait_phase("waiter", Phase::Waiting).await;
    let api: kube::Api<ClusterLock> = kube::Api::all(env.client.clone());
    let queued =
        |n: u32| move |l: Option<&ClusterLock>| l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.queue_length == n);
    let one = tokio::time::timeout(PATIENCE, kube::runtime::wait::await_condition(api.clone(), &name, queued(1))).await;
    assert!(matches!(one, Ok(Ok(Some(_)))), "ClusterLock {name} did not show 1 queued within {PATIENCE:?}: {one:?}");

    let toucher = Toucher::start(&env, "waiter");
    env.claim_spec("late", spec).await;
    env.wait_phase("late", Phase::Waiting).await;
    let waited = Instant::now();
    let refreshed = kube::runtime::wait::await_condition(api.clone(), &name, queued(2));
    let outcome = tokio::time::timeout(REFRESHED_WITHIN, refreshed).await;
    let touches = toucher.stop().await;
    assert!(
        matches!(outcome, Ok(Ok(Some(_)))),
        "ClusterLock {name}'s status did not show the late claim queued within {REFRESHED_WITHIN:?} while the \
         waiter was touched {touches} times ({outcome:?})"
    );
    eprintln!("refreshed after {:?} while touched {touches} times", waited.elapsed());
    for claim in ["holder", "waiter", "late"] {
        env.delete_claim(claim).await;
    }
    env.history.await_gone("late").await;
    env.history.check();
}
