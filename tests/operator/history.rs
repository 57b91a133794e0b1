//! End to end, a lock's history (docs/design.md, "A lock's history"): the operator records each
//! grant and each end in the lock's `LockHistory`, the record outlives the claims and the
//! operator process, and `zklock history` prints it.

use crate::e2e_support;

use std::process::Stdio;

use e2e_support::*;
use kube::Api;
use serde_json::{json, Value};
use zklock::api::{LockHistory, Phase};

/// The history `name` once `done` says it is complete (every wait has a deadline).
async fn await_history(env: &Env, name: &str, what: &str, done: impl Fn(&LockHistory) -> bool) -> LockHistory {
    let api: Api<LockHistory> = Api::namespaced(env.client.clone(), &env.ns);
    let seen = std::sync::Mutex::new(None);
    until(&format!("LockHistory {name}: {what}"), || async {
        let found = api.get_opt(name).await.expect("read the LockHistory");
        let ok = found.as_ref().is_some_and(&done);
        *seen.lock().unwrap() = found;
        ok
    })
    .await;
    let found = seen.lock().unwrap().take();
    found.expect("the history")
}

async fn zklock_history(env: &Env, args: &[&str]) -> String {
    let binary = std::env::var("ZKLOCK_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zklock").into());
    let run = tokio::process::Command::new(binary)
        .arg("history")
        .args(["-n", &env.ns])
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, run)
        .await
        .unwrap_or_else(|_| panic!("zklock history {args:?} did not end within {PATIENCE:?}"))
        .expect("run zklock history");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "zklock history {args:?}: {stdout}{stderr}");
    stdout.into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_grants_and_ends_are_kept_across_a_restart_and_printed() {
    let env = Env::new().await;
    let mut op = env.operator();
    // Two holders in turn: the first released by its deletion, the second revoked.
    env.claim("first", "deploys", json!({})).await;
    env.wait_phase("first", Phase::Held).await;
    env.claim("second", "deploys", json!({ "revocationGracePeriodSeconds": 1 })).await;
    env.wait_phase("second", Phase::Waiting).await;
    env.delete_claim("first").await;
    env.wait_gone("first").await;
    let second = env.wait_phase("second", Phase::Held).await;
    env.annotate("second", "zklock.io/revoke", "history test").await;
    env.wait_phase("second", Phase::Revoked).await;

    let history = await_history(&env, "deploys", "both grants ended", |h| {
        let grants = h.status.as_ref().map(|s| s.grants.as_slice()).unwrap_or_default();
        grants.len() == 2 && grants.iter().all(|g| g.ended_as.is_some())
    })
    .await;
    assert_eq!(history.spec.lock, "deploys");
    let status = history.status.clone().unwrap();
    let (a, b) = (&status.grants[0], &status.grants[1]);
    assert_eq!((a.claim.as_str(), a.ended_as), ("first", Some(Phase::Released)));
    assert_eq!((b.claim.as_str(), b.ended_as), ("second", Some(Phase::Revoked)));
    assert!(a.token() < b.token(), "granted in token order: {status:?}");
    let second_token = second.status.as_ref().and_then(|s| s.fencing_token.clone());
    assert_eq!(Some(&b.fencing_token), second_token.as_ref(), "the record carries the grant's token");
    assert_eq!(b.claim_uid, second.metadata.uid, "the record names the claim by UID too");
    assert!(a.held_seconds().is_some_and(|s| s >= 0.0) && a.granted <= b.granted, "{status:?}");
    assert!(b.waited_seconds.is_some_and(|w| w >= 0.0), "how long the second waited: {status:?}");
    assert_eq!((status.recorded, status.last_holder.as_deref()), (2, Some(&*format!("{}/second", env.ns))));
    let log = op.logs();
    let audit = |event: &str| log.lines().filter(|l| l.contains("zklock::audit") && l.contains(event)).count();
    assert_eq!((audit("lock granted"), audit("hold ended")), (2, 2), "one audit line per grant and end: {log}");

    // The record is the API's: a grant of one process (killed, no shutdown) ends in the next,
    // which adds to the same record and keeps the rest.
    env.delete_claim("second").await;
    env.claim("third", "deploys", json!({})).await;
    env.wait_phase("third", Phase::Held).await;
    await_history(&env, "deploys", "the third grant written", |h| {
        h.status.as_ref().is_some_and(|s| s.grants.len() == 3)
    })
    .await;
    op.restart();
    env.delete_claim("third").await;
    env.wait_gone("third").await;
    let history = await_history(&env, "deploys", "the third grant ended, by the next process", |h| {
        h.status.as_ref().is_some_and(|s| s.grants.len() == 3 && s.grants[2].ended_as.is_some())
    })
    .await;
    let status = history.status.unwrap();
    assert_eq!(status.grants[..2], [a.clone(), b.clone()], "the earlier records are kept as they were");
    let third = &status.grants[2];
    assert_eq!((third.claim.as_str(), third.ended_as, status.recorded), ("third", Some(Phase::Released), 3));
    assert!(third.granted.is_some() && third.waited_seconds.is_some(), "one record, grant and end: {third:?}");

    // What a user reads.
    let printed: Value = serde_json::from_str(&zklock_history(&env, &["deploys", "-o", "json"]).await).unwrap();
    let claims: Vec<&str> =
        printed["grants"].as_array().unwrap().iter().map(|g| g["claim"].as_str().unwrap()).collect();
    assert_eq!(claims, ["first", "second", "third"], "{printed}");
    assert!(printed["grants"][0]["heldSeconds"].is_number(), "{printed}");
    let table = zklock_history(&env, &["deploys"]).await;
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("TOKEN") && rows.len() == 4, "{table}");
    assert!(rows[2].contains("second") && rows[2].contains("Revoked"), "{table}");
    let wide = zklock_history(&env, &["deploys", "-o", "wide"]).await;
    assert!(wide.contains("CLAIM UID") && wide.contains(b.claim_uid.as_deref().unwrap()), "{wide}");

    // The user guide's command, then a limit of 2: the next write keeps the newest two.
    env.kubectl(&["patch", "lockhistory", "deploys", "--type", "merge", "-p", r#"{"spec":{"limit":500}}"#]);
    let api: Api<LockHistory> = Api::namespaced(env.client.clone(), &env.ns);
    assert_eq!(api.get("deploys").await.unwrap().spec.limit, Some(500));
    env.kubectl(&["patch", "lockhistory", "deploys", "--type", "merge", "-p", r#"{"spec":{"limit":2}}"#]);
    env.claim("fourth", "deploys", json!({})).await;
    env.wait_phase("fourth", Phase::Held).await;
    let history = await_history(&env, "deploys", "the newest two kept", |h| {
        h.status.as_ref().is_some_and(|s| s.grants.len() == 2 && s.grants[1].claim == "fourth")
    })
    .await;
    let status = history.status.unwrap();
    assert_eq!((status.grants[0].claim.as_str(), status.recorded), ("third", 4), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_locks_history_is_kept_in_the_operators_namespace() {
    let env = Env::new().await;
    let _op = env.operator();
    let lock = TestClusterLock::make(&env, &format!("hist-{}", env.ns), TestClusterLock::admitting(&env.ns)).await;
    env.claim_spec("c1", json!({ "clusterLockName": lock.name })).await;
    env.wait_phase("c1", Phase::Held).await;
    env.delete_claim("c1").await;
    env.wait_gone("c1").await;
    // The operator's namespace is the test's (its --lease-namespace).
    let name = format!("cluster.{}", lock.name);
    let history = await_history(&env, &name, "the grant ended", |h| {
        h.status.as_ref().is_some_and(|s| s.grants.len() == 1 && s.grants[0].ended_as == Some(Phase::Released))
    })
    .await;
    assert_eq!(history.spec.lock, format!("cluster/{}", lock.name));
    assert_eq!(history.status.unwrap().grants[0].namespace, env.ns);
    // Found by name without --operator-namespace.
    let printed: Value =
        serde_json::from_str(&zklock_history(&env, &[&format!("cluster/{}", lock.name), "-o", "json"]).await).unwrap();
    assert_eq!(printed["namespace"], json!(env.ns), "{printed}");
    assert_eq!(printed["grants"][0]["claim"], json!("c1"), "{printed}");
}
