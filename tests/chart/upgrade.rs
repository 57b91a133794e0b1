//! Upgrades of the chart, with the real helm on a control plane of its own (an earlier release's
//! CRDs must not meet the other tests' claims): the chart of a commit before `spec.locks`
//! installed, then upgraded to this one with `--reuse-values` (the earlier release's values
//! only: this chart's defaults must fill the rest), and the operator of this build brings the
//! CRDs to its revision, so that a claim over two locks is accepted and Held.

use crate::chart_support;
use crate::e2e_support;

use std::process::Command;

use chart_support::*;
use e2e_support::Env;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::Api;
use serde_json::json;
use zklock::api::Phase;

/// The last commit before `spec.locks` (its chart's CRD has no such field, and its values lack
/// everything added since: the Grafana dashboard, ClusterLocks, `crds.manage`).
const BEFORE_SPEC_LOCKS: &str = "f0975f4ba0c7433149b3dea35aaa115dc2910ab2";

/// `charts/zklock` as it was at `commit`, from the repository's history, in a directory of its own.
pub(crate) fn chart_at(commit: &str, dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let archive = Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["archive", "--format=tar", commit, "charts/zklock"])
        .output()
        .expect("run git archive");
    assert!(
        archive.status.success(),
        "the chart of {commit} from git history (a clone with its history is needed, not a shallow one): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut untar =
        Command::new("tar").arg("-x").arg("-C").arg(dir).stdin(std::process::Stdio::piped()).spawn().expect("run tar");
    std::io::Write::write_all(&mut untar.stdin.take().unwrap(), &archive.stdout).unwrap();
    assert!(untar.wait().unwrap().success(), "untar the chart of {commit}");
    dir.join("charts/zklock")
}

/// A release namespace of its own, `<prefix>-<suffix>`; answers the suffix and the name.
pub(crate) async fn release_namespace(client: &kube::Client, prefix: &str) -> (String, String) {
    let suffix = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let name = format!("{prefix}-{suffix}");
    let namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the release namespace");
    (suffix, name)
}

/// Runs `command` to its end, within [`COMMAND_DEADLINE`] (killed past it); its stdout, or a
/// panic naming `what` with everything it printed.
pub(crate) fn run(what: &str, command: &mut Command) -> String {
    let out = chart_support::output_within(what, command, COMMAND_DEADLINE);
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The longest a helm, kubectl, skopeo or image build here may take (a chart install without
/// `--wait` takes seconds; the image build a minute on a cold cache).
pub(crate) const COMMAND_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_a_release_before_spec_locks_with_reuse_values_serves_a_claim_over_two_locks() {
    // A control plane of its own, without CRDs: the earlier release brings its own.
    let kubeconfig = zklock_testkit::kube::private_control_plane("chart-upgrade");
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let client = zklock_testkit::kube::client_for(kubeconfig).await;
    let (suffix, release_ns) = release_namespace(&client, "zklock-upgrade").await;
    let release = format!("zu{suffix}");
    let (host, chroot) = zk.split_at(zk.find('/').unwrap_or(zk.len()));
    let sets = [
        "zookeeper.bundled.enabled=false".to_string(),
        format!("zookeeper.connectString={host}"),
        format!("zookeeper.chroot={chroot}"),
        "replicaCount=1".to_string(),
    ];
    let dir = std::env::temp_dir().join(format!("zklock-chart-upgrade-{suffix}"));
    let old = chart_at(BEFORE_SPEC_LOCKS, &dir.join("old"));

    // The earlier release, its CRDs with it (Helm installs crds/ on install only).
    let mut install = helm_on(kubeconfig);
    install.args(["install", &release]).arg(&old).args(["--namespace", &release_ns, "--wait=false"]);
    for set in &sets {
        install.args(["--set", set]);
    }
    run("helm install of the chart before spec.locks", &mut install);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get("lockclaims.zklock.io").await.expect("the earlier release's LockClaim CRD");
    let schema = serde_json::to_string(&crd.spec.versions[0].schema).unwrap();
    assert!(!schema.contains("\"locks\""), "the earlier CRD has no spec.locks: the test would prove nothing");

    // This chart, the earlier values reused: it renders, and the release is upgraded.
    let mut upgrade = helm_on(kubeconfig);
    upgrade.args(["upgrade", &release]).arg(chart()).args(["--namespace", &release_ns, "--reuse-values"]);
    run("helm upgrade --reuse-values to this chart", upgrade.arg("--wait=false"));
    let values = run(
        "helm get values --all",
        helm_on(kubeconfig).args(["get", "values", &release, "--namespace", &release_ns, "--all", "-o", "json"]),
    );
    let values: serde_json::Value = serde_json::from_str(&values).unwrap();
    assert_eq!(values["zookeeper"]["connectString"], json!(host), "the earlier release's values are kept");
    let manifest =
        run("helm get manifest", helm_on(kubeconfig).args(["get", "manifest", &release, "--namespace", &release_ns]));
    let docs = documents(&manifest);
    let args = strings(&find(&docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(args.iter().any(|a| a == "--manage-crds=true"), "this chart's default for crds.manage fills in: {args:?}");
    // Upgrading again, from this chart to itself, also with --reuse-values.
    let mut again = helm_on(kubeconfig);
    again.args(["upgrade", &release]).arg(chart()).args(["--namespace", &release_ns, "--reuse-values"]);
    run("helm upgrade --reuse-values from this chart to itself", again.arg("--wait=false"));

    // The operator of this build, as the upgraded Deployment runs it: it brings the CRDs to
    // its revision, and a claim over two locks is accepted and Held.
    let log = dir.join("operator.log");
    let (mut child, metrics) =
        crate::chart_rbac::start_operator_on(&docs, &zk, kubeconfig, &dir.join("requests.log"), &log);
    crate::chart_rbac::await_leading("upgraded release", &metrics, &log).await;
    let crd = crds.get("lockclaims.zklock.io").await.expect("the LockClaim CRD");
    let revision = crd.metadata.annotations.as_ref().and_then(|a| a.get(zklock::api::CRD_REVISION_ANNOTATION));
    assert_eq!(revision, Some(&zklock::api::CRD_REVISION.to_string()), "the CRD is of this build's revision");
    // (The test environment applies the CRDs too; the operator did it first.)
    let env = Env::on(kubeconfig, zk.clone(), false).await;
    env.claim_spec("both", json!({ "locks": [{ "lockName": "db" }, { "lockName": "queue" }] })).await;
    let held = env.wait_phase("both", Phase::Held).await;
    assert_eq!(held.status.as_ref().map(|s| s.locks.len()), Some(2), "held in both locks: {:?}", held.status);
    env.delete_claim("both").await;
    env.wait_gone("both").await;
    crate::chart_rbac::stop("upgraded release", &mut child, &log);
    run(
        "helm uninstall",
        helm_on(kubeconfig).args(["uninstall", &release, "--namespace", &release_ns, "--wait=false", "--no-hooks"]),
    );
}

/// The last chart that rendered the bundled ensemble's credentials itself (with `lookup`, and
/// `helm.sh/resource-policy: keep`); the operator makes them since.
const CHART_THAT_RENDERED_CREDENTIALS: &str = "9ec355ffff775f6cdb88ca0e9371a239e4128837";

/// Credentials are made once: a release installed by the chart that rendered them keeps them
/// through the upgrade to this chart (which renders none), the operator of this build reads
/// them rather than making new ones (new ones would lock it out of every node the earlier ones
/// made), and an uninstall leaves them, as it leaves the ensemble's data volumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_rendered_by_an_earlier_chart_outlive_the_upgrade_and_an_uninstall() {
    use k8s_openapi::api::core::v1::Secret;
    use zklock::operator::credentials::Credentials;
    let kubeconfig = zklock_testkit::kube::private_control_plane("chart-credentials");
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let client = zklock_testkit::kube::client_for(kubeconfig).await;
    let (suffix, release_ns) = release_namespace(&client, "zklock-credentials").await;
    let release = format!("zc{suffix}");
    let dir = std::env::temp_dir().join(format!("zklock-chart-credentials-{suffix}"));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &release_ns);
    let secret_name = format!("{release}-zklock-zookeeper-auth");
    let credentials = || async {
        let secret = secrets.get(&secret_name).await.unwrap_or_else(|e| panic!("Secret {secret_name}: {e}"));
        Credentials::from_secret(&secret, &secret_name).unwrap_or_else(|e| panic!("{e}"))
    };
    let helm_run = |what: &str, args: &[&str]| {
        let mut cmd = helm_on(kubeconfig);
        cmd.args(args).args(["--namespace", &release_ns]);
        run(what, &mut cmd)
    };
    let old = chart_at(CHART_THAT_RENDERED_CREDENTIALS, &dir.join("old")).display().to_string();
    let one_server = "zookeeper.bundled.replicas=1";
    let mut install = helm_on(kubeconfig);
    install.args(["install", &release, &old, "--skip-crds", "--wait=false", "--set", one_server]);
    let out = output_within(
        "helm install of the earlier chart",
        install.args(["--namespace", &release_ns]),
        COMMAND_DEADLINE,
    );
    if refused_by_kube_version(&out) {
        // A version before the earlier chart's support (the matrix's older ones): nobody has a
        // release of it here to upgrade from, and helm said why.
        let _ = Api::<Namespace>::all(client.clone()).delete(&release_ns, &Default::default()).await;
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    assert!(out.status.success(), "helm install of the earlier chart: {}", String::from_utf8_lossy(&out.stderr));
    let made = credentials().await;
    assert!(made.operator.starts_with("zklock:") && made.operator.len() > 40, "the earlier chart's credentials");

    let chart = chart().display().to_string();
    helm_run("helm upgrade to this chart", &["upgrade", &release, &chart, "--wait=false", "--reuse-values"]);
    assert!(credentials().await == made, "the upgrade to a chart that renders no Secret took the credentials");
    let manifest = helm_run("helm get manifest", &["get", "manifest", &release]);
    let docs = documents(&manifest);
    assert!(find(&docs, "Secret").is_empty(), "this chart renders no Secret");
    let log = dir.join("operator.log");
    let (mut child, metrics) =
        crate::chart_rbac::start_operator_on(&docs, &zk, kubeconfig, &dir.join("requests.log"), &log);
    crate::chart_rbac::await_leading("the upgraded release", &metrics, &log).await;
    crate::chart_rbac::stop("the upgraded release", &mut child, &log);
    assert!(credentials().await == made, "the operator replaced the credentials the earlier chart made");

    helm_run("helm uninstall", &["uninstall", &release, "--wait=false", "--no-hooks"]);
    assert!(credentials().await == made, "helm uninstall took the credentials");
    let _ = Api::<Namespace>::all(client.clone()).delete(&release_ns, &Default::default()).await;
    let _ = std::fs::remove_dir_all(&dir);
}
