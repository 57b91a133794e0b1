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
    let sets = ["replicaCount=1"];
    let apply = |rendered: &str| {
        let file = dir.join("synced.json");
        std::fs::write(&file, synced(rendered)).unwrap();
        let mut kubectl = Command::new(zklock_testkit::kube::kubectl());
        kubectl.env("KUBECONFIG", kubeconfig).args(["apply", "--server-side", "--field-manager", "argocd-controller"]);
        run("kubectl apply of the render", kubectl.args(["--namespace", &release_ns, "-f"]).arg(&file));
    };
    let rendered = render_release(&release, &release_ns, None, &sets).unwrap();
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
    let mut granted = vec![];
    let mut made = None;
    for round in ["first start", "restarted after a second sync"] {
        let docs = documents(&rendered);
        let log = dir.join(format!("operator-{}.log", granted.len()));
        let (mut child, metrics) =
            crate::chart_rbac::start_operator_on(&docs, &zk, kubeconfig, &dir.join("requests.log"), &log);
        crate::chart_rbac::await_leading(round, &metrics, &log).await;
        let now = credentials().await;
        match &made {
            None => made = Some(now),
            Some(before) => assert!(before == &now, "{round}: the credentials changed"),
        }
        let claim = format!("gitops-{}", granted.len());
        env.claim(&claim, "db", json!({})).await;
        env.wait_phase(&claim, Phase::Held).await;
        env.delete_claim(&claim).await;
        env.wait_gone(&claim).await;
        granted.push(claim);
        crate::chart_rbac::stop(round, &mut child, &log);
        // The next sync: rendered again, the same bytes, applied again.
        let again = render_release(&release, &release_ns, None, &sets).unwrap();
        assert!(again == rendered, "{round}: the next sync's render differs");
        apply(&again);
    }
    assert_eq!(granted.len(), 2);
    let _ = Api::<Namespace>::all(client.clone()).delete(&release_ns, &Default::default()).await;
    let _ = std::fs::remove_dir_all(&dir);
}
