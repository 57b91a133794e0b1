//! The chart's hooks, run as the chart renders them: `helm test` (takes and releases a lock) and
//! the pre-delete check of `helm uninstall` (refuses, naming them, while claims carry the
//! operator's finalizer; or deletes them and waits for their release). Their pods cannot run on
//! this control plane (kwok runs no containers), so each hook's command runs here, with the
//! rendered args and a token of the hook's own ServiceAccount, after its rendered RBAC is
//! applied: the API server enforces exactly what the hook is granted.

use crate::chart_rbac::{apply, token_for, token_kubeconfig};
use crate::chart_support::*;
use crate::e2e_support::Env;

use std::process::{Command, Output};

use serde_json::{json, Value};
use zklock::api::Phase;

/// The hook documents of kind `hook` (`test`, `pre-delete`): (RBAC and ServiceAccount, the pod
/// spec that runs the command, its namespace).
fn hook<'a>(docs: &'a [Value], hook: &str) -> (Vec<&'a Value>, &'a Value, &'a str) {
    let ours: Vec<&Value> = docs.iter().filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == hook).collect();
    let (pod, ns) = ours
        .iter()
        .find_map(|d| {
            let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
            match kind(d) {
                "Pod" => Some((&d["spec"], ns)),
                "Job" => Some((&d["spec"]["template"]["spec"], ns)),
                _ => None,
            }
        })
        .unwrap_or_else(|| panic!("no {hook} hook runs a pod"));
    let rbac = ours.into_iter().filter(|d| !matches!(kind(d), "Pod" | "Job")).collect();
    (rbac, pod, ns)
}

/// Runs the hook's command here, as its ServiceAccount; `zklock` on the PATH is this build's.
async fn run_hook(env: &Env, docs: &[Value], name: &str) -> Output {
    let (rbac, pod, pod_ns) = hook(docs, name);
    for doc in &rbac {
        apply(env, doc).await;
    }
    let account = pod["serviceAccountName"].as_str().expect("the hook's ServiceAccount");
    let kubeconfig = token_kubeconfig(env, &token_for(account, pod_ns));
    let args = strings(&pod["containers"][0]["args"]);
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_zklock"));
    let path = format!("{}:{}", binary.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let (program, args) = (binary.to_path_buf(), args);
    tokio::task::spawn_blocking(move || {
        Command::new(program)
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .env("PATH", path)
            // Not a pod here: the claim has no holder pod.
            .env_remove("POD_NAME")
            .env_remove("POD_UID")
            .output()
            .expect("run zklock")
    })
    .await
    .unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `env` is the namespace the release serves; the operator runs and leads.
pub(crate) async fn run_as_rendered(env: &Env, release: &str, release_ns: &str, sets: &[&str]) {
    let docs = documents(&render_release(release, release_ns, None, sets).expect("helm template"));

    // helm test: a lock taken, the command run while Held, the claim deleted.
    let out = within_two_minutes("the helm test hook", run_hook(env, &docs, "test")).await;
    assert!(out.status.success(), "helm test's command failed: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")), "{}", text(&out));

    // The pre-delete check with a claim left: refused, naming it; the claim is untouched.
    env.claim("left-behind", "uninstall", json!({})).await;
    env.wait_phase("left-behind", Phase::Held).await;
    let out = within_two_minutes("the pre-delete hook", run_hook(env, &docs, "pre-delete")).await;
    assert_eq!(out.status.code(), Some(1), "the check must refuse: {}", text(&out));
    let named = format!("{}/left-behind (Held)", env.ns);
    assert!(text(&out).contains(&named), "the refusal names {named}: {}", text(&out));
    env.wait_phase("left-behind", Phase::Held).await;

    // Gated pods: one holds (ungated, running), one waits behind it (gated).
    gated_pod(env, "g-holder").await;
    env.wait_phase("g-holder", Phase::Held).await;
    until_gates(env, "g-holder", "ungated", |gates| gates.is_empty()).await;
    gated_pod(env, "g-next").await;
    env.wait_phase("g-next", Phase::Waiting).await;

    // With uninstall.deleteClaims: the claims are deleted and released by the operator, which
    // was told first (the Lease marked): it makes no claim again for the gated pod (one would
    // outlive the operator with its finalizer), and starts no pod while g-holder still runs.
    let mut delete_sets = sets.to_vec();
    delete_sets.push("uninstall.deleteClaims=true");
    let docs = documents(&render_release(release, release_ns, None, &delete_sets).expect("helm template"));
    let out = within_two_minutes("the pre-delete hook (deleteClaims)", run_hook(env, &docs, "pre-delete")).await;
    assert!(out.status.success(), "deleteClaims: {}", text(&out));
    env.wait_gone("left-behind").await;
    // Watched for a while (a claim made again comes within milliseconds of the deletion).
    let watched = std::time::Instant::now();
    while watched.elapsed() < std::time::Duration::from_secs(3) {
        let left = env.claims.list(&Default::default()).await.expect("list claims").items;
        let names: Vec<String> = left.iter().map(kube::ResourceExt::name_any).collect();
        assert!(names.is_empty(), "claims left behind the uninstall step: {names:?}");
        let next = env.pods.get("g-next").await.expect("g-next");
        assert_eq!(gates(&next), ["zklock.io/lock"], "g-next started while g-holder still runs");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    for pod in ["g-holder", "g-next"] {
        let _ = env.pods.delete(pod, &Default::default()).await;
    }

    // Nothing left: the check passes.
    let out = within_two_minutes("the pre-delete hook, no claims", run_hook(env, &docs, "pre-delete")).await;
    assert!(out.status.success(), "no claims left: {}", text(&out));
}

/// A pod asking for lock `uninstall-gated` through the scheduling gate.
async fn gated_pod(env: &Env, name: &str) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": { "zklock.io/lock": "uninstall-gated" } },
        "spec": {
            "schedulerName": "zklock-test-no-scheduler",
            "schedulingGates": [{ "name": "zklock.io/lock" }],
            "containers": [{ "name": "main", "image": "busybox:1.36", "command": ["true"] }],
        },
    }))
    .unwrap();
    env.pods.create(&Default::default(), &pod).await.unwrap_or_else(|e| panic!("create pod {name}: {e}"));
}

fn gates(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default().into_iter().map(|g| g.name).collect()
}

/// Waits until pod `name`'s scheduling gates satisfy `f` (`what` they are, for the failure).
async fn until_gates(env: &Env, name: &str, what: &str, f: impl Fn(&[String]) -> bool) {
    crate::e2e_support::until(&format!("pod {name} {what}"), || async {
        env.pods.get(name).await.is_ok_and(|p| f(&gates(&p)))
    })
    .await;
}

async fn within_two_minutes<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(120), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 2 minutes"))
}
