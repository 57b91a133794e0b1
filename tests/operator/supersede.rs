//! End to end, newest wins (`spec.supersede`; docs/design.md, "CI queue modes"): of the waiting
//! claims of one lock, namespace and group only the newest stays; the holder, other groups and
//! claims without a group keep their places; `zklock exec --supersede` exits 78 when a newer run
//! takes its place, and the newest runs.

use crate::e2e_support;
use crate::lock_commands::{finish, zklock};

use e2e_support::*;
use serde_json::json;
use zklock::api::conditions::FINISHED;
use zklock::api::Phase;

const GROUP: &str = "prod-deploys";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_claim_of_the_group_supersedes_the_waiting_ones_never_the_holder() {
    let env = Env::new().await;
    let _op = env.operator();
    let group = json!({ "supersede": { "group": GROUP } });
    env.claim("deploy-1", "prod", group.clone()).await;
    env.wait_phase("deploy-1", Phase::Held).await;
    env.claim("deploy-2", "prod", group.clone()).await;
    env.wait_phase("deploy-2", Phase::Waiting).await;
    env.claim("other-group", "prod", json!({ "supersede": { "group": "prod-backups" } })).await;
    env.claim("plain", "prod", json!({})).await;
    env.wait_phase("plain", Phase::Waiting).await;

    env.claim("deploy-3", "prod", group.clone()).await;
    let superseded = env.wait_phase("deploy-2", Phase::Superseded).await;
    let (_, reason, message) = condition(&superseded, FINISHED).expect("a Finished condition");
    assert_eq!(reason, "Superseded");
    assert!(message.contains("deploy-3") && message.contains(GROUP), "names the newer claim: {message}");
    env.wait_phase("deploy-3", Phase::Waiting).await;
    assert_eq!(env.status("deploy-1").await, Some(Phase::Held), "the holder is never superseded");
    assert_eq!(env.status("other-group").await, Some(Phase::Waiting), "another group keeps its place");
    assert_eq!(env.status("plain").await, Some(Phase::Waiting), "a claim without a group keeps its place");

    // `zklock exec --supersede`: the newer run takes the older one's place, which exits 78.
    let run = |name: &'static str| {
        let args = ["exec", "prod", "--name", name, "--supersede", GROUP, "--", "sh", "-c", "exit 0"];
        zklock(&env, &args).spawn().expect("start zklock exec")
    };
    let older = run("run-a");
    env.wait_phase("run-a", Phase::Waiting).await;
    env.wait_phase("deploy-3", Phase::Superseded).await;
    let newer = run("run-b");
    let out = finish(older, "the superseded exec").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "superseded: exit 78; {stderr}");
    assert!(stderr.contains("superseded") && stderr.contains("run-b"), "says who took its place: {stderr}");

    // The queue moves on as before: the newest run gets the lock in its turn and runs.
    for holder in ["deploy-1", "other-group", "plain"] {
        env.wait_phase(holder, Phase::Held).await;
        env.delete_claim(holder).await;
    }
    let out = finish(newer, "the newest exec").await;
    assert_eq!(out.status.code(), Some(0), "the newest ran: {}", String::from_utf8_lossy(&out.stderr));

    // Several locks cannot be superseded: refused before anything is made.
    let args = ["exec", "prod,other", "--supersede", GROUP, "--", "true"];
    let out = finish(zklock(&env, &args).spawn().expect("start zklock exec"), "exec over two locks").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--supersede goes with one lock"), "{stderr}");
    let args = ["exec", "prod", "--timeout", "0", "--supersede", GROUP, "--", "true"];
    let out = finish(zklock(&env, &args).spawn().expect("start zklock exec"), "exec trying once").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("never waits"), "{stderr}");
    env.history.check();
}
