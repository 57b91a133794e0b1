//! `contrib/argocd/health.lua`, Argo CD's health check for claims, run with Lua 5.1 (the
//! language version of the interpreter Argo CD embeds) on a claim in every phase: each phase
//! maps to the health the docs promise, and a claim that ended without its lock says why.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use zklock::api::Phase;

const SCRIPT: &str = "contrib/argocd/health.lua";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `value` as a Lua table constructor (what Argo CD hands the script as `obj`).
fn lua(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!("{{{}}}", items.iter().map(lua).collect::<Vec<_>>().join(", ")),
        Value::Object(fields) => format!(
            "{{{}}}",
            fields.iter().map(|(k, v)| format!("[{k:?}] = {}", lua(v))).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The script's answer for `claim`: (status, message).
fn health(claim: &Value) -> (String, String) {
    let out = Command::new("lua5.1")
        .current_dir(root())
        .arg("-e")
        .arg(format!("obj = {}", lua(claim)))
        .arg("-e")
        .arg(format!("local hs = dofile({SCRIPT:?}); io.write(hs.status, '\\t', hs.message or '')"))
        .output()
        .expect("run lua5.1 (scripts/tools.sh installs it with TOOLS_WITH_IMAGE=1)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{SCRIPT} on {claim}: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    let (status, message) = stdout.split_once('\t').unwrap_or_else(|| panic!("{SCRIPT} answered {stdout:?}"));
    (status.to_string(), message.to_string())
}

fn claim(status: Value) -> Value {
    json!({
        "apiVersion": "zklock.io/v1alpha1",
        "kind": "LockClaim",
        "metadata": { "name": "migrate", "namespace": "shop" },
        "spec": { "lockName": "db" },
        "status": status,
    })
}

#[test]
fn the_argocd_health_check_maps_every_phase() {
    let expected = |phase: Phase| match phase {
        Phase::Pending | Phase::Waiting => "Progressing",
        Phase::Held | Phase::Released | Phase::Superseded => "Healthy",
        Phase::Revoked | Phase::Expired | Phase::Lost | Phase::Invalid => "Degraded",
    };
    for phase in Phase::ALL {
        let name = serde_json::to_value(phase).unwrap();
        let name = name.as_str().unwrap();
        let mut status = json!({ "phase": name, "lock": "db" });
        match phase {
            Phase::Waiting => {
                status["position"] = json!(2);
                status["waitingFor"] = json!("shop/deploy-7");
            }
            Phase::Held => status["fencingToken"] = json!("4294967301"),
            Phase::Invalid => {
                status["conditions"] = json!([{ "type": "Invalid", "status": "True", "reason": "UnknownLock",
                    "message": "lock db has no Lock object", "lastTransitionTime": "2026-11-29T00:00:00Z" }])
            }
            p if p.is_terminal() => {
                status["conditions"] = json!([{ "type": "Finished", "status": "True", "reason": name,
                    "message": format!("ended {name} on purpose"), "lastTransitionTime": "2026-11-29T00:00:00Z" }])
            }
            _ => {}
        }
        let (health_status, message) = health(&claim(status));
        assert_eq!(health_status, expected(phase), "{name}: {message}");
        assert!(message.starts_with(name), "{name}: the message names the phase: {message:?}");
        match phase {
            Phase::Waiting => assert!(message.contains("position 2") && message.contains("shop/deploy-7"), "{message}"),
            Phase::Held => assert!(message.contains("4294967301"), "{message}"),
            Phase::Invalid => assert!(message.contains("no Lock object"), "{message}"),
            p if p.is_terminal() && p != Phase::Released => {
                assert!(message.contains("on purpose"), "{name}: the reason it ended: {message}")
            }
            _ => {}
        }
    }
    let (fresh, message) = health(&claim(Value::Null));
    assert_eq!(fresh, "Progressing", "a claim with no status yet: {message}");
    assert!(message.contains("zklock check"), "{message}");
}
