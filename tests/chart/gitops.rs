//! The chart as GitOps tools install it: Argo CD renders with `helm template` (no cluster, so
//! `lookup` answers nothing), applies what it rendered, and renders again at every sync. Two
//! renders must be the same bytes (a render that drew random credentials would replace the
//! operator's at every sync and lock it out of its own ZooKeeper nodes); the hooks carry Argo
//! CD's own annotations; and a release applied from a render, its operator restarted and the
//! render applied again, keeps its credentials and grants.

use crate::chart_support::*;
use crate::e2e_support::Env;
use crate::upgrade::{release_namespace, run};

use std::process::Command;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use serde_json::json;
use zklock::api::Phase;
use zklock::operator::credentials::Credentials;

/// Helm's hook, and the Argo CD hook that must stand for it (Argo CD reads only its own
/// annotations on a resource that has any).
const ARGOCD_HOOKS: [(&str, &str); 2] = [("pre-delete", "PreDelete"), ("test", "Skip")];

#[test]
fn two_renders_are_the_same_bytes_and_every_hook_has_its_argocd_equivalent() {
    for (label, values) in value_sets() {
        let sets: [&str; 0] = [];
        let first = render("zklock-system", values.as_deref(), &sets).unwrap();
        let second = render("zklock-system", values.as_deref(), &sets).unwrap();
        assert!(first == second, "{label}: two renders differ; a GitOps sync would re-apply the difference every time");
        for doc in documents(&first) {
            let annotations = &doc["metadata"]["annotations"];
            let Some(helm_hook) = annotations["helm.sh/hook"].as_str() else {
                assert!(annotations["argocd.argoproj.io/hook"].is_null(), "{label}: {} is no hook", name(&doc));
                continue;
            };
            let what = format!("{label}: {} {}", kind(&doc), name(&doc));
            let argocd = ARGOCD_HOOKS
                .iter()
                .find(|(helm, _)| *helm == helm_hook)
                .unwrap_or_else(|| panic!("{what}: hook {helm_hook} has no Argo CD equivalent here"))
                .1;
            assert_eq!(annotations["argocd.argoproj.io/hook"], json!(argocd), "{what}");
            assert_eq!(
                annotations["argocd.argoproj.io/sync-wave"], annotations["helm.sh/hook-weight"],
                "{what}: Argo CD orders hooks by sync wave"
            );
            if argocd != "Skip" {
                assert_eq!(
                    annotations["argocd.argoproj.io/hook-delete-policy"],
                    json!("BeforeHookCreation,HookSucceeded"),
                    "{what}: as helm's {}",
                    annotations["helm.sh/hook-delete-policy"]
                );
            }
        }
    }
}

/// RBAC cannot limit the operator's `create` on Secrets to its credentials' one: the chart's
/// admission policy does. As the operator's ServiceAccount, another Secret, or a token Secret of
/// another account, is refused (the policy may take a moment to be in force: tried for 30 s).
async fn only_its_secret_may_be_created(kubeconfig: &std::path::Path, namespace: &str, account: &str) {
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let attempts = [
        serde_json::json!({ "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": { "name": "not-the-credentials", "namespace": namespace }, "stringData": { "a": "b" } }),
        serde_json::json!({ "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": { "name": "a-token", "namespace": namespace,
                "annotations": { "kubernetes.io/service-account.name": "default" } } }),
    ];
    for attempt in attempts {
        let file = std::env::temp_dir().join(format!("zklock-gitops-secret-{}.json", uuid::Uuid::new_v4().simple()));
        std::fs::write(&file, attempt.to_string()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let refused = loop {
            let mut kubectl = Command::new(zklock_testkit::kube::kubectl());
            kubectl.env("KUBECONFIG", kubeconfig).args(["create", "--dry-run=server", "--as", &user, "-f"]).arg(&file);
            let out =
                output_within("kubectl create --as the operator", &mut kubectl, std::time::Duration::from_secs(60));
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            if !out.status.success() && said.contains("may create only its ZooKeeper credentials' Secret") {
                break true;
            }
            if std::time::Instant::now() > deadline {
                eprintln!("as {user}: {said}");
                break false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        };
        let _ = std::fs::remove_file(&file);
        assert!(refused, "the operator's account created {} {}", attempt["type"], attempt["metadata"]["name"]);
    }
}

/// Runs the built `zklock` with `args` against `kubeconfig`: (exit code, stdout and stderr).
fn zklock_in(kubeconfig: &std::path::Path, args: &[&str]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zklock"));
    cmd.args(args).env("KUBECONFIG", kubeconfig).env("RUST_LOG", "off");
    let out = output_within(&format!("zklock {args:?}"), &mut cmd, std::time::Duration::from_secs(60));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), said)
}

/// `zklock check` and `zklock status` on an installation applied from a render, its operator
/// leading: the leader's pod stands in the API (from the Deployment's template, named as the
/// process leads, a node of kwok's running it), so that its readiness and flags can be read.
async fn check_and_status(
    client: &kube::Client,
    kubeconfig: &std::path::Path,
    release_ns: &str,
    lease_name: &str,
    docs: &[serde_json::Value],
    env: &Env,
    held: &str,
) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    let lease = Api::<Lease>::namespaced(client.clone(), release_ns).get(lease_name).await.expect("the leader Lease");
    let leader = lease.spec.and_then(|s| s.holder_identity).expect("a holder");
    let template = &find(docs, "Deployment")[0]["spec"]["template"];
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": leader, "labels": template["metadata"]["labels"] },
        "spec": template["spec"],
    }))
    .expect("the Deployment's pod template");
    let pods: Api<Pod> = Api::namespaced(client.clone(), release_ns);
    pods.create(&Default::default(), &pod).await.expect("the leader's pod");
    let ready = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let running = kube::runtime::wait::await_condition(pods.clone(), &leader, ready);
    tokio::time::timeout(std::time::Duration::from_secs(60), running)
        .await
        .unwrap_or_else(|_| panic!("kwok did not run the leader's pod {leader} within 60 s"))
        .expect("watch the leader's pod");

    let (code, said) = zklock_in(
        kubeconfig,
        &["check", "-n", &env.ns, "--operator-namespace", release_ns, "--lease-name", lease_name],
    );
    assert_eq!(code, 0, "zklock check on a ready installation: {said}");
    eprintln!("zklock check:\n{said}");
    let mut lines = vec![
        "ok      CRD               lockclaims.zklock.io, revision",
        "ok      leader            ",
        "ok      namespace         ",
        "ok      epoch policy      ",
    ];
    if crate::e2e_support::serves_mutating_admission_policy_at(kubeconfig) {
        lines.extend(["ok      finalizer policy  ", "ok      gate policy       "]);
    } else {
        // Before 1.36: nothing to bind, and check says what that means.
        lines.push("note    finalizer, gate   this API server serves no MutatingAdmissionPolicy");
    }
    for line in lines {
        assert!(said.contains(line), "zklock check says {line:?}:\n{said}");
    }
    assert!(said.contains(&format!("{leader}, ready")), "{said}");
    // Found without --operator-namespace: the one leader Lease of this control plane.
    let (code, found) = zklock_in(kubeconfig, &["check", "-n", &env.ns, "--lease-name", lease_name]);
    assert_eq!(code, 0, "{found}");
    assert!(found.contains(&format!("installed in {release_ns}")), "{found}");
    let (code, said) = zklock_in(
        kubeconfig,
        &["check", "-n", "no-such-namespace", "--operator-namespace", release_ns, "--lease-name", lease_name],
    );
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("no-such-namespace does not exist"), "{said}");

    let (code, said) = zklock_in(kubeconfig, &["status", held, "-n", &env.ns]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("phase         Held for") && said.contains("fencing token "), "zklock status: {said}");
    eprintln!("zklock status:\n{said}");
}

/// The render's documents Argo CD applies on a sync: every one but the hooks (a PreDelete hook
/// runs when the Application is deleted, a skipped one never).
fn synced(rendered: &str) -> String {
    documents(rendered)
        .into_iter()
        .filter(|doc| doc["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .map(|doc| serde_json::to_string(&doc).unwrap())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_from_helm_template_a_restarted_operator_keeps_its_credentials_and_grants() {
    // The epoch policy's binding covers every namespace the release serves: a control plane of
    // the test's own.
    let kubeconfig = zklock_testkit::kube::private_control_plane("chart-gitops");
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let client = zklock_testkit::kube::client_for(kubeconfig).await;
    let (suffix, release_ns) = release_namespace(&client, "zklock-gitops").await;
    let release = format!("zg{suffix}");
    let dir = std::env::temp_dir().join(format!("zklock-chart-gitops-{suffix}"));
    std::fs::create_dir_all(&dir).unwrap();
    // The bundled ensemble's credentials, made by the operator (its connect string is moved to
    // the test's ZooKeeper when the operator starts).
    // A Lease name of the release's own, as a second release in a namespace needs.
    let lease_name = format!("{release}-leader");
    let lease_set = format!("leaderElection.leaseName={lease_name}");
    let sets = ["replicaCount=1", lease_set.as_str()];
    let apply = |rendered: &str| {
        let file = dir.join("synced.json");
        std::fs::write(&file, synced(rendered)).unwrap();
        let mut kubectl = Command::new(zklock_testkit::kube::kubectl());
        kubectl.env("KUBECONFIG", kubeconfig).args(["apply", "--server-side", "--field-manager", "argocd-controller"]);
        run("kubectl apply of the render", kubectl.args(["--namespace", &release_ns, "-f"]).arg(&file));
    };
    // As Argo CD renders: with the cluster's API versions.
    let policies = crate::e2e_support::serves_mutating_admission_policy_at(kubeconfig);
    let rendered = render_release_with(&release, &release_ns, None, &sets, policies).unwrap();
    assert!(find(&documents(&rendered), "Secret").is_empty(), "the render holds no credentials");
    apply(&rendered);

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &release_ns);
    let secret_name = format!("{release}-zklock-zookeeper-auth");
    let credentials = || async {
        let secret = secrets.get(&secret_name).await.unwrap_or_else(|e| panic!("Secret {secret_name}: {e}"));
        Credentials::from_secret(&secret, &secret_name).unwrap_or_else(|e| panic!("{e}"))
    };
    assert!(secrets.get_opt(&secret_name).await.unwrap().is_none(), "no Secret before the operator's first start");
    let env = Env::on(kubeconfig, zk.clone(), false).await;
    let check = |namespace: &str| {
        let args = ["check", "-n", namespace, "--operator-namespace", &release_ns, "--lease-name", &lease_name];
        zklock_in(kubeconfig, &[&args[..], &["--wait", "100ms"]].concat())
    };
    let (code, said) = check(&env.ns);
    assert_eq!(code, 1, "zklock check before any operator ran: {said}");
    assert!(said.contains("NOT OK  operator") && said.contains("no operator has ever led"), "{said}");
    assert!(said.contains("→ install the chart"), "the line says what to do: {said}");
    let mut granted = vec![];
    let mut made = None;
    for round in ["first start", "restarted after a second sync"] {
        let docs = documents(&rendered);
        let log = dir.join(format!("operator-{}.log", granted.len()));
        let (mut child, metrics) =
            crate::chart_rbac::start_operator_on(&docs, &zk, kubeconfig, &dir.join("requests.log"), &log);
        crate::chart_rbac::await_leading(round, &metrics, &log).await;
        if granted.is_empty() {
            // What a scrape tells of the build and the process, under the usual names.
            let scraped = crate::e2e_support::http_get(&metrics, "/metrics").await.expect("a scrape");
            let build = format!(
                "zklock_build_info{{version=\"{}\",crd_revision=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION"),
                zklock::api::CRD_REVISION
            );
            assert!(scraped.contains(&build), "{build} in the scrape");
            for series in ["process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_open_fds "] {
                assert!(scraped.contains(&format!("\n{series}")), "{series}in the scrape");
            }
        }
        let now = credentials().await;
        if made.is_none() {
            only_its_secret_may_be_created(kubeconfig, &release_ns, &format!("{release}-zklock")).await;
        }
        match &made {
            None => made = Some(now),
            Some(before) => assert!(before == &now, "{round}: the credentials changed"),
        }
        let claim = format!("gitops-{}", granted.len());
        env.claim(&claim, "db", json!({})).await;
        env.wait_phase(&claim, Phase::Held).await;
        if !granted.is_empty() {
            env.wait_gone("unwritten").await;
        }
        if granted.is_empty() {
            check_and_status(&client, kubeconfig, &release_ns, &lease_name, &docs, &env, &claim).await;
        }
        env.delete_claim(&claim).await;
        env.wait_gone(&claim).await;
        granted.push(claim);
        crate::chart_rbac::stop(round, &mut child, &log);
        if granted.len() == 1 {
            // A claim no operator has written: `zklock status` says why.
            env.claim("unwritten", "db", json!({})).await;
            let (code, said) =
                zklock_in(kubeconfig, &["status", "unwritten", "-n", &env.ns, "--lease-name", &lease_name]);
            assert_eq!(code, 0, "{said}");
            assert!(said.contains("none: the operator has not written this claim"), "{said}");
            eprintln!("zklock status of a claim no operator wrote:\n{said}");
            assert!(said.contains("why: zklock is not ready") && said.contains("NOT OK  leader"), "{said}");
            // Only what is not ready: the replicas' flags are read from a pod of theirs.
            assert!(!said.contains("NOT OK  epoch policy") && !said.contains("ok      "), "{said}");
            // Deleted now, released by the operator started next (it carries the finalizer).
            env.delete_claim("unwritten").await;
        }
        // The next sync: rendered again, the same bytes, applied again.
        let again = render_release_with(&release, &release_ns, None, &sets, policies).unwrap();
        assert!(again == rendered, "{round}: the next sync's render differs");
        apply(&again);
    }
    assert_eq!(granted.len(), 2);
    let _ = Api::<Namespace>::all(client.clone()).delete(&release_ns, &Default::default()).await;
    let _ = std::fs::remove_dir_all(&dir);
}
