//! `ClusterLock`s shared by two clusters: two real control planes (the run's own and one of this
//! process), one ZooKeeper, an operator per cluster with a root of its own and the shared root.
//! Exclusion, order and fencing are judged on the merged history of both clusters' claims.

use crate::e2e_support;

use std::time::Duration;

use e2e_support::{phase_of, until, Env, Operator, TestClusterLock};
use kube::Api;
use serde_json::json;
use zklock::api::{ClusterLock, LockClaim, Phase};

const SHARED_ROOT: &str = "/shared";

/// The second cluster's API server: a control plane of this test process.
fn other_cluster() -> &'static std::path::Path {
    zklock_testkit::kube::private_control_plane("cluster-b")
}

/// An operator of cluster `name` (its own root `/<name>`), sharing ClusterLocks on the shared root.
fn operator(env: &Env, zk: &str, name: &str, extra: &[&str]) -> Operator {
    let root = format!("/{name}");
    let mut args = vec!["--zk-root", &root, "--zk-cluster-root", SHARED_ROOT, "--cluster-name", name];
    args.extend_from_slice(extra);
    Operator::start_with_zk(env, zk, &args)
}

/// Two clusters' environments on one ZooKeeper chroot, and a ClusterLock in each that admits
/// its test namespace.
async fn two_clusters(zk: String) -> (Env, Env, String, [TestClusterLock; 2]) {
    let a = Env::with_zk(zk.clone()).await;
    let b = Env::on(other_cluster(), zk, true).await;
    let name = format!("pay-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let locks = [
        TestClusterLock::make(&a, &name, TestClusterLock::admitting(&a.ns)).await,
        TestClusterLock::make(&b, &name, TestClusterLock::admitting(&b.ns)).await,
    ];
    (a, b, name, locks)
}

async fn claim(env: &Env, name: &str, cluster_lock: &str) -> LockClaim {
    env.claim_spec(name, json!({ "clusterLockName": cluster_lock })).await
}

fn token(c: &LockClaim) -> u64 {
    c.status.as_ref().and_then(|s| s.fencing_token.as_deref()).and_then(|t| t.parse().ok()).expect("a fencing token")
}

fn waiting_for(c: &LockClaim) -> Option<String> {
    c.status.as_ref().and_then(|s| s.waiting_for.clone())
}

/// Both clusters' histories as one, in the order the test saw them, checked for exclusion and
/// growing tokens.
fn check_merged(a: &Env, b: &Env) {
    let mut records = a.history.records();
    records.extend(b.history.records());
    records.sort_by_key(|r| r.at);
    e2e_support::History::of(records).check();
}

#[tokio::test]
async fn two_clusters_queue_first_come_first_served_with_growing_tokens() {
    let (a, b, lock, _locks) = two_clusters(zklock_testkit::ZkServer::shared().chroot().await).await;
    let _op_a = operator(&a, &a.zk, "a", &[]);
    let _op_b = operator(&b, &b.zk, "b", &[]);
    claim(&a, "a1", &lock).await;
    let a1 = a.wait_phase("a1", Phase::Held).await;
    claim(&b, "b1", &lock).await;
    let b1 = b.wait("b1", "b1 waiting behind a1", |c| waiting_for(c).is_some()).await;
    assert_eq!(phase_of(&b1), Some(Phase::Waiting));
    assert_eq!(waiting_for(&b1).as_deref(), Some(format!("a/{}/a1", a.ns).as_str()), "named across clusters");
    claim(&a, "a2", &lock).await;
    let a2 = a.wait("a2", "a2 waiting behind b1", |c| waiting_for(c).is_some()).await;
    assert_eq!(waiting_for(&a2).as_deref(), Some(format!("b/{}/b1", b.ns).as_str()), "first come, first served");

    // The ClusterLock's status in either cluster names the holder wherever it is.
    let statuses: Api<ClusterLock> = Api::all(b.client.clone());
    let shown = kube::runtime::wait::await_condition(statuses, &lock, |l: Option<&ClusterLock>| {
        l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.held == 1 && s.queue_length == 2)
    });
    let shown = tokio::time::timeout(e2e_support::PATIENCE, shown)
        .await
        .expect("cluster b's ClusterLock to show a1 holding and two waiting")
        .unwrap()
        .and_then(|l| l.status)
        .unwrap();
    assert_eq!(
        (shown.holders[0].cluster.as_str(), shown.holders[0].namespace.as_str(), shown.holders[0].claim.as_str()),
        ("a", a.ns.as_str(), "a1")
    );
    assert_eq!(shown.clusters, ["a", "b"]);
    assert_eq!(shown.holders[0].fencing_token, None, "another cluster's token is in its own claims");
    // Cluster a's own status gives its holder's token.
    let statuses: Api<ClusterLock> = Api::all(a.client.clone());
    let with_token = kube::runtime::wait::await_condition(statuses, &lock, |l: Option<&ClusterLock>| {
        l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.holders.first().is_some_and(|h| h.fencing_token.is_some()))
    });
    let own = tokio::time::timeout(e2e_support::PATIENCE, with_token)
        .await
        .expect("cluster a's ClusterLock to give its holder's token")
        .unwrap()
        .and_then(|l| l.status)
        .unwrap();
    assert_eq!(own.holders[0].fencing_token, Some(token(&a1).to_string()));

    a.delete_claim("a1").await;
    let b1 = b.wait_phase("b1", Phase::Held).await;
    assert!(token(&b1) > token(&a1), "tokens grow across clusters: {} after {}", token(&b1), token(&a1));
    b.delete_claim("b1").await;
    let a2 = a.wait_phase("a2", Phase::Held).await;
    assert!(token(&a2) > token(&b1), "{} after {}", token(&a2), token(&b1));
    a.delete_claim("a2").await;
    a.wait_gone("a2").await;
    check_merged(&a, &b);
}

#[tokio::test]
async fn a_namespace_the_selector_does_not_admit_ends_invalid_naming_the_cluster_lock() {
    let env = Env::new().await;
    let name = format!("only-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let _lock = TestClusterLock::make(&env, &name, TestClusterLock::admitting("some-other-namespace")).await;
    let _op = env.operator();
    claim(&env, "outsider", &name).await;
    let c = env.wait_phase("outsider", Phase::Invalid).await;
    let (_, _, message) = e2e_support::condition(&c, "Invalid").expect("an Invalid condition");
    assert!(message.contains(&format!("ClusterLock {name:?} does not admit namespace {:?}", env.ns)), "{message}");
    // A ClusterLock no admin made in this cluster: Invalid too, once it had the time to appear.
    let selected = TestClusterLock::make(&env, &format!("{name}-all"), json!({ "namespaceSelector": {} })).await;
    claim(&env, "inside", &selected.name).await;
    env.wait_phase("inside", Phase::Held).await;
}

#[tokio::test]
async fn leader_changes_in_one_cluster_change_no_holder_token_or_place_in_either() {
    // Sessions that outlast a takeover after a crash (lease 10 s, then re-anchoring).
    let zk_server = zklock_testkit::ZkServer::start_with_max_session(Duration::from_secs(30));
    let zk = zk_server.chroot().await;
    let (a, b, lock, _locks) = two_clusters(zk.clone()).await;
    let session = ["--zk-session-timeout", "25s"];
    let mut a_replicas = [operator(&a, &zk, "a", &session), operator(&a, &zk, "a", &session)];
    let _op_b = operator(&b, &zk, "b", &session);
    claim(&a, "a1", &lock).await;
    let a1 = a.wait_phase("a1", Phase::Held).await;
    claim(&b, "b1", &lock).await;
    b.wait("b1", "b1 waiting behind a1", |c| waiting_for(c).is_some()).await;
    claim(&a, "a2", &lock).await;
    a.wait("a2", "a2 waiting behind b1", |c| waiting_for(c).is_some()).await;
    let places = |env: &Env, name: &'static str| {
        let env_claims = env.claims.clone();
        async move {
            let c = env_claims.get(name).await.expect("get the claim");
            let st = c.status.unwrap_or_default();
            (st.phase, st.fencing_token, st.znode)
        }
    };
    let before = [places(&a, "a1").await, places(&b, "b1").await, places(&a, "a2").await];

    // A graceful stop of a's leader (a rollout), then a crash of the next one (kill -9): each
    // time the standby takes over and re-anchors.
    for crash in [false, true] {
        let leader = until_leader(&a_replicas).await;
        let leader_epoch = a.claims.get("a1").await.unwrap().status.unwrap().leader_epoch;
        if crash {
            a_replicas[leader].kill9();
        } else {
            a_replicas[leader].terminate();
        }
        let standby = 1 - leader;
        until("a's standby to lead and serve", || async {
            a_replicas[standby].metric("zklock_leader").await == 1.0 && a_replicas[standby].ready().await
        })
        .await;
        // Its first status writes carry its epoch: wait until it has judged a1 (kept, or not).
        a.wait("a1", "a1 stamped by a's new leader", |c| {
            c.status.as_ref().is_some_and(|s| s.leader_epoch != leader_epoch) || phase_of(c) != Some(Phase::Held)
        })
        .await;
        let after = [places(&a, "a1").await, places(&b, "b1").await, places(&a, "a2").await];
        assert_eq!(after, before, "crash={crash}: holders, tokens and nodes of both clusters unchanged");
        a_replicas[leader].restart();
    }
    // Cluster b was never fenced by a's new leaders: its queue still moves.
    a.delete_claim("a1").await;
    let b1 = b.wait_phase("b1", Phase::Held).await;
    assert!(token(&b1) > token(&a1));
    b.delete_claim("b1").await;
    a.wait_phase("a2", Phase::Held).await;
    check_merged(&a, &b);
    drop(a_replicas);
}

async fn until_leader(replicas: &[Operator; 2]) -> usize {
    let deadline = tokio::time::Instant::now() + e2e_support::PATIENCE;
    loop {
        for (i, r) in replicas.iter().enumerate() {
            if r.metric("zklock_leader").await == 1.0 {
                return i;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no replica of cluster a led within {:?}",
            e2e_support::PATIENCE
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_cluster_gone_past_its_session_lets_the_other_proceed_and_its_holder_is_lost_when_it_returns() {
    let (a, b, lock, _locks) = two_clusters(zklock_testkit::ZkServer::shared().chroot().await).await;
    let mut op_a = operator(&a, &a.zk, "a", &["--zk-session-timeout", "4s"]);
    let _op_b = operator(&b, &b.zk, "b", &[]);
    claim(&a, "a1", &lock).await;
    let a1 = a.wait_phase("a1", Phase::Held).await;
    claim(&b, "b1", &lock).await;
    b.wait("b1", "b1 waiting behind a1", |c| waiting_for(c).is_some()).await;
    // Every operator of cluster a is gone: once its session expires, b is granted.
    op_a.kill9();
    let b1 = b.wait_phase("b1", Phase::Held).await;
    assert!(token(&b1) > token(&a1));
    // Cluster a comes back: its holder cannot have kept the lock.
    op_a.restart();
    let a1 = a.wait_phase("a1", Phase::Lost).await;
    let (_, _, message) = e2e_support::condition(&a1, "Finished").expect("a Finished condition");
    assert!(message.contains("other clusters queue on this ClusterLock"), "{message}");
    // Not judged on the merged history: while nothing of cluster a ran, a1's status could not
    // change, and read Held beside b1 (what a holder whose whole cluster is gone cannot know:
    // the fencing tokens, checked above, are what a guarded resource goes by).
    b.history.check();
}

#[tokio::test]
async fn a_second_cluster_of_the_same_name_is_refused() {
    let (a, b, lock, _locks) = two_clusters(zklock_testkit::ZkServer::shared().chroot().await).await;
    let _op_a = operator(&a, &a.zk, "a", &[]);
    claim(&a, "a1", &lock).await;
    a.wait_phase("a1", Phase::Held).await;
    // Cluster b's operator says it is "a" too (with a root of its own).
    let impostor = Operator::start_with_zk(
        &b,
        &b.zk,
        &["--zk-root", "/b", "--zk-cluster-root", SHARED_ROOT, "--cluster-name", "a"],
    );
    until("the second \"a\" to say why it cannot serve", || async {
        std::fs::read_to_string(&impostor.log).is_ok_and(|log| log.contains("is taken on the shared root"))
    })
    .await;
    claim(&b, "b1", &lock).await;
    assert!(!impostor.ready().await, "it serves nothing");
    assert_eq!(b.status("b1").await, None, "b1 is not served");
    assert_eq!(a.status("a1").await, Some(Phase::Held), "cluster a's holder is untouched");
}

/// Cluster a's operator loses ZooKeeper but still reaches its API server. Its holder is asked to
/// let go at once, and ended (`Lost`, `ConnectionLost`, through the API alone) before its
/// session can expire on the server, when cluster b's waiter is granted: with the revocation
/// grace (30 s) far longer than the session (6 s), the merged history of both clusters still
/// never shows two holders, and a1 stays final when the connection comes back.
#[tokio::test]
async fn an_operator_cut_off_from_zookeeper_ends_its_cluster_lock_holders_before_another_cluster_is_granted() {
    let server = zklock_testkit::ZkServer::shared();
    let zk = server.chroot().await;
    let chroot = &zk[zk.find('/').expect("a chroot")..];
    let (a, b, lock, _locks) = two_clusters(zk.clone()).await;
    let proxy = zklock_testkit::proxy::Proxy::start(server.addr()).await;
    let _op_a = operator(&a, &proxy.connect_string(chroot), "a", &["--zk-session-timeout", "6s"]);
    let _op_b = operator(&b, &b.zk, "b", &[]);
    a.claim_spec("a1", json!({ "clusterLockName": lock, "revocationGracePeriodSeconds": 30 })).await;
    let a1 = a.wait_phase("a1", Phase::Held).await;
    claim(&b, "b1", &lock).await;
    b.wait("b1", "b1 waiting behind a1", |c| waiting_for(c).is_some()).await;

    proxy.set_blackhole(true);
    a.wait("a1", "a1 asked to let go", |c| {
        c.status.as_ref().is_some_and(|s| zklock::api::conditions::is_true(&s.conditions, "RevokeRequested"))
    })
    .await;
    let lost = a.wait("a1", "a1 final while cut off", |c| phase_of(c).is_some_and(Phase::is_terminal)).await;
    assert_eq!(phase_of(&lost), Some(Phase::Lost));
    let (_, reason, message) = e2e_support::condition(&lost, "Finished").expect("a Finished condition");
    assert_eq!(reason, "ConnectionLost", "{message}");
    let b1 = b.wait_phase("b1", Phase::Held).await;
    assert!(token(&b1) > token(&a1));
    // As the two API servers stamped them (whole seconds, one clock): a1 ended no later.
    let ended_at = zklock::api::conditions::get(&lost.status.unwrap().conditions, "Finished")
        .map(|c| c.last_transition_time.0)
        .expect("when");
    let granted_at = b1.status.as_ref().and_then(|s| s.acquired_at.as_ref()).map(|t| t.0).expect("acquiredAt");
    assert!(ended_at <= granted_at, "a1 ended at {ended_at}, b1 granted at {granted_at}");
    proxy.set_blackhole(false);
    b.delete_claim("b1").await;
    b.wait_gone("b1").await;
    // Judged as the tests' watches saw both clusters: never two holders, a1 stays final.
    check_merged(&a, &b);
}

/// Waits until `env`'s `ClusterLock` `name` satisfies `f` (`what` it is, for the failure).
async fn until_cluster_lock(env: &Env, name: &str, what: &str, f: impl Fn(&ClusterLock) -> bool) -> ClusterLock {
    let api: Api<ClusterLock> = Api::all(env.client.clone());
    let seen = kube::runtime::wait::await_condition(api, name, move |l: Option<&ClusterLock>| l.is_some_and(&f));
    tokio::time::timeout(e2e_support::PATIENCE, seen)
        .await
        .unwrap_or_else(|_| panic!("ClusterLock {name}: {what} within {:?}", e2e_support::PATIENCE))
        .unwrap_or_else(|e| panic!("ClusterLock {name}: watching for {what}: {e}"))
        .unwrap_or_else(|| panic!("ClusterLock {name} is gone while waiting for {what}"))
}

fn permits_agree(lock: &ClusterLock) -> Option<(String, String)> {
    let conditions = &lock.status.as_ref()?.conditions;
    zklock::api::conditions::get(conditions, "PermitsAgree").map(|c| (c.status.clone(), c.message.clone()))
}

#[tokio::test]
async fn clusters_that_declare_different_permits_grant_as_the_smallest_allows_and_say_so() {
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let a = Env::with_zk(zk.clone()).await;
    let b = Env::on(other_cluster(), zk, true).await;
    let name = format!("sem-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let label = format!("cluster/{name}");
    let with_permits = |ns: &str, permits: u32| {
        let mut spec = TestClusterLock::admitting(ns);
        spec["permits"] = json!(permits);
        spec
    };
    let _locks = [
        TestClusterLock::make(&a, &name, with_permits(&a.ns, 3)).await,
        TestClusterLock::make(&b, &name, with_permits(&b.ns, 1)).await,
    ];
    a.history.set_permits(&label, 1);
    b.history.set_permits(&label, 1);
    let _op_a = operator(&a, &a.zk, "a", &[]);
    let _op_b = operator(&b, &b.zk, "b", &[]);
    // Both operators know both declarations before any claim.
    for env in [&a, &b] {
        let lock = until_cluster_lock(env, &name, "PermitsAgree False", |l| {
            permits_agree(l).is_some_and(|(state, _)| state == "False")
        })
        .await;
        let (_, message) = permits_agree(&lock).unwrap();
        assert!(message.contains("(a: 3 permits, b: 1 permit); each grants as 1 permit allows"), "{message}");
        assert_eq!(lock.status.unwrap().clusters, ["a", "b"], "both clusters serve it before any claim");
    }

    for c in ["a1", "a2", "a3"] {
        claim(&a, c, &name).await;
    }
    a.wait_phase("a1", Phase::Held).await;
    for c in ["a2", "a3"] {
        let waiting = a.wait(c, "waiting behind a1 (one permit, cluster b's)", |c| waiting_for(c).is_some()).await;
        assert_eq!(phase_of(&waiting), Some(Phase::Waiting), "{c}: cluster a's 3 permits are not what holds");
    }
    claim(&b, "b1", &name).await;
    b.wait("b1", "b1 waiting", |c| waiting_for(c).is_some()).await;

    // Cluster b's admin raises its permits to cluster a's: both grant as 3 allow.
    let raised_at = std::time::Instant::now();
    a.history.set_permits(&label, 3);
    b.history.set_permits(&label, 3);
    let api: Api<ClusterLock> = Api::all(b.client.clone());
    let patch = kube::api::Patch::Merge(json!({ "spec": { "permits": 3 } }));
    api.patch(&name, &kube::api::PatchParams::default(), &patch).await.expect("raise cluster b's permits");
    a.wait_phase("a2", Phase::Held).await;
    a.wait_phase("a3", Phase::Held).await;
    let lock = until_cluster_lock(&a, &name, "PermitsAgree True", |l| {
        permits_agree(l).is_some_and(|(state, _)| state == "True")
    })
    .await;
    assert_eq!(permits_agree(&lock).unwrap().1, "all 2 clusters sharing it declare 3 permits");
    assert_eq!(phase_of(&b.wait_phase("b1", Phase::Waiting).await), Some(Phase::Waiting), "the fourth waits");
    a.delete_claim("a1").await;
    b.wait_phase("b1", Phase::Held).await;

    let mut merged = a.history.records();
    merged.extend(b.history.records());
    merged.sort_by_key(|r| r.at);
    let before: Vec<_> = merged.iter().filter(|r| r.at < raised_at).cloned().collect();
    assert_eq!(e2e_support::History::of(before).most_held_at_once(&label), 1, "one permit before the raise");
    assert_eq!(e2e_support::History::of(merged).most_held_at_once(&label), 3, "three after it, across clusters");
    a.history.check();
    b.history.check();
}

/// Raised permits grant in two clusters from the same directory state: each cluster took that
/// state's token, so two holders carried one token (issue 53). Every grant in a shared
/// `ClusterLock` now takes a token written just before it: unique, growing in grant order.
#[tokio::test]
async fn permits_raised_in_two_clusters_at_once_grant_unique_growing_tokens() {
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let a = Env::with_zk(zk.clone()).await;
    let b = Env::on(other_cluster(), zk, true).await;
    let name = format!("sem-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let with_permits = |ns: &str, permits: u32| {
        let mut spec = TestClusterLock::admitting(ns);
        spec["permits"] = json!(permits);
        spec
    };
    let _locks = [
        TestClusterLock::make(&a, &name, with_permits(&a.ns, 1)).await,
        TestClusterLock::make(&b, &name, with_permits(&b.ns, 1)).await,
    ];
    let _op_a = operator(&a, &a.zk, "a", &[]);
    let _op_b = operator(&b, &b.zk, "b", &[]);
    claim(&a, "a1", &name).await;
    let a1 = a.wait_phase("a1", Phase::Held).await;
    claim(&b, "b1", &name).await;
    b.wait("b1", "b1 waiting", |c| waiting_for(c).is_some()).await;
    claim(&a, "a2", &name).await;
    a.wait("a2", "a2 waiting", |c| waiting_for(c).is_some()).await;
    // Both admins raise to 3 at once: b1 and a2 are granted, each by its own cluster.
    for env in [&a, &b] {
        let api: Api<ClusterLock> = Api::all(env.client.clone());
        let patch = kube::api::Patch::Merge(json!({ "spec": { "permits": 3 } }));
        api.patch(&name, &kube::api::PatchParams::default(), &patch).await.expect("raise the permits");
    }
    let b1 = b.wait_phase("b1", Phase::Held).await;
    let a2 = a.wait_phase("a2", Phase::Held).await;
    let tokens = [token(&a1), token(&b1), token(&a2)];
    assert!(tokens[1] != tokens[2], "two holders, one token: {tokens:?}");
    assert!(tokens[1] > tokens[0] && tokens[2] > tokens[0], "above the first holder's: {tokens:?}");
    for (env, c) in [(&a, "a1"), (&b, "b1"), (&a, "a2")] {
        env.delete_claim(c).await;
        env.wait_gone(c).await;
    }
}
