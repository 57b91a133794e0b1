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
