//! The `zklock` command line: bad input and unreachable dependencies end with one line that says
//! what to fix and a non-zero exit; SIGTERM ends a running operator cleanly.

use crate::e2e_support;

use std::process::Command;
use std::time::Duration;

use e2e_support::*;

fn zklock(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock"))
        .args(args)
        .env("KUBECONFIG", zklock_testkit::kube::kubeconfig())
        .env("RUST_LOG", "off")
        .output()
        .expect("run zklock");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).trim().to_string())
}

#[test]
fn bad_flags_and_an_unreachable_zookeeper_say_what_to_fix() {
    let (code, err) = zklock(&["run", "--zk-connect", "127.0.0.1:9", "--zk-session-timeout", "ten"]);
    assert_ne!(code, 0);
    assert!(err.contains("not a duration like 10s"), "{err}");

    let (code, err) = zklock(&["run", "--zk-connect", "127.0.0.1:9", "--zk-auth", "alice"]);
    assert_ne!(code, 0);
    assert!(err.contains("expected digest:USER:PASS"), "{err}");

    let (code, err) = zklock(&["run", "--zk-connect", "127.0.0.1:9", "--zk-root", "relative"]);
    assert_ne!(code, 0);
    assert!(err.contains("absolute ZooKeeper path"), "{err}");

    // Nothing listens on the discard port: the error names the address and what to check.
    let (code, err) = zklock(&["run", "--zk-connect", "127.0.0.1:9", "--metrics-addr", "127.0.0.1:0"]);
    assert_ne!(code, 0);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("cannot reach ZooKeeper at 127.0.0.1:9") && err.contains("check the connect string"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_operator_cleanly() {
    let env = Env::new().await;
    let mut op = env.operator();
    env.claim("a", "l", serde_json::json!({})).await;
    env.wait_phase("a", zklock::api::Phase::Held).await;
    // Within the operator's own grace for running reconciles (10 s) and what follows it, well
    // inside a pod's default terminationGracePeriodSeconds (30 s).
    let status = op.terminate_within(Duration::from_secs(20));
    let logs = op.logs();
    let status = status.unwrap_or_else(|| panic!("the operator did not stop within 20 s of SIGTERM; log:\n{logs}"));
    assert!(status.success(), "exit status {status}; log:\n{logs}");
    assert!(logs.contains("stopped"));
}

/// Runs the `zklock` binary with `args`, KUBECONFIG pointing nowhere unless `kubeconfig_env`:
/// the commands must find the cluster from their own flags. Answers (exit code, stdout, stderr).
fn zklock_api(args: &[&str], kubeconfig_env: Option<&std::path::Path>) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock"))
        .args(args)
        .env("KUBECONFIG", kubeconfig_env.unwrap_or(std::path::Path::new("/nonexistent/kubeconfig")))
        .env("RUST_LOG", "off")
        .output()
        .expect("run zklock");
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_and_revoke_go_through_the_kubernetes_api_also_as_a_kubectl_plugin() {
    let env = Env::new().await;
    let _op = env.operator();
    let kubeconfig = env.kubeconfig.display().to_string();
    env.claim("holder", "db", serde_json::json!({})).await;
    let held = env.wait_phase("holder", zklock::api::Phase::Held).await;
    env.claim("reader", "db", serde_json::json!({ "mode": "Shared" })).await;
    env.wait("reader", "reader waiting behind holder", |c| c.status.as_ref().is_some_and(|s| s.waiting_for.is_some()))
        .await;

    // -o json, the cluster from --kubeconfig alone.
    let (code, out, err) = zklock_api(&["queue", "db", "-n", &env.ns, "-o", "json", "--kubeconfig", &kubeconfig], None);
    assert_eq!(code, 0, "{err}");
    let queue: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let claims = queue["claims"].as_array().expect("claims");
    assert_eq!(claims.len(), 2, "{out}");
    assert_eq!((claims[0]["claim"].as_str(), claims[0]["phase"].as_str()), (Some("holder"), Some("Held")));
    let token = held.status.as_ref().and_then(|s| s.fencing_token.clone());
    assert_eq!(claims[0]["fencingToken"].as_str(), token.as_deref());
    assert_eq!(
        (claims[1]["claim"].as_str(), claims[1]["mode"].as_str(), claims[1]["waitingFor"].as_str()),
        (Some("reader"), Some("Shared"), Some("holder"))
    );

    // The table, through kubectl as a plugin (kubectl finds kubectl-zklock on the PATH).
    let plugins = std::env::temp_dir().join(format!("zklock-plugin-{}", env.ns));
    std::fs::create_dir_all(&plugins).unwrap();
    let plugin = plugins.join("kubectl-zklock");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_zklock"), &plugin).unwrap();
    let path = format!("{}:{}", plugins.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(zklock_testkit::kube::kubectl())
        .args(["zklock", "queue", "db", "-n", &env.ns])
        .env("PATH", path)
        .env("KUBECONFIG", &env.kubeconfig)
        .output()
        .expect("run kubectl zklock");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kubectl zklock queue: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines.len() == 3 && lines[0].starts_with("CLAIM"), "{table}");
    assert!(lines[1].starts_with("holder") && lines[2].starts_with("reader"), "holders first: {table}");

    // kubectl's own wide listing shows what a claim waits for (and, once final, why it ended).
    let wide = env.kubectl(&["get", "lockclaims", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or_default();
    assert!(header.contains("WAITING FOR") && header.contains("REASON"), "{wide}");
    let reader = wide.lines().find(|l| l.starts_with("reader")).unwrap_or_default();
    assert!(reader.split_whitespace().any(|w| w == "holder"), "reader waits for holder: {wide}");

    // --context picks a context of the kubeconfig; one it does not have is named in the error.
    let config = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
    let context = config.current_context.clone().expect("a current context");
    let (code, _, err) = zklock_api(&["queue", "db", "-n", &env.ns, "--context", &context], Some(&env.kubeconfig));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = zklock_api(&["queue", "db", "-n", &env.ns, "--context", "nowhere"], Some(&env.kubeconfig));
    assert_ne!(code, 0);
    assert!(err.contains("nowhere"), "{err}");

    // revoke: the annotation, and the operator's RevokeRequested condition.
    let (code, _, err) =
        zklock_api(&["revoke", "holder", "-n", &env.ns, "--reason", "maintenance", "--kubeconfig", &kubeconfig], None);
    assert_eq!(code, 0, "{err}");
    let revoked = env
        .wait("holder", "RevokeRequested", |c| {
            condition(c, "RevokeRequested")
                .is_some_and(|(status, _, message)| status == "True" && message.contains("maintenance"))
        })
        .await;
    assert_eq!(
        revoked.metadata.annotations.unwrap_or_default().get("zklock.io/revoke").map(String::as_str),
        Some("maintenance")
    );
    let (code, _, err) = zklock_api(&["revoke", "nobody", "-n", &env.ns, "--kubeconfig", &kubeconfig], None);
    assert_ne!(code, 0);
    assert!(err.contains("no LockClaim \"nobody\""), "{err}");
    let _ = std::fs::remove_dir_all(&plugins);
}
