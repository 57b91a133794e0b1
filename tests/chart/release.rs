//! The release, rehearsed as a user pulls it. A registry on loopback (Debian's `docker-registry`)
//! gets the image `scripts/image.sh` builds (from this build's binary; the release workflow gives
//! it the static release binary), copied there with skopeo, and the chart, packaged and pushed
//! with `helm push`. Then, on a control plane of its own, everything comes from the registry
//! only: the chart installed by its `oci://` reference, with the image the values name; the
//! operator run from that image as the installed Deployment names it, pulled and unpacked (kwok
//! runs no containers, so this test is the node: it runs the container's command from the
//! image's files); `helm test` green, its pod's command run the same way and its phase written
//! as a kubelet would; and `helm upgrade` to the registry's chart from the chart before it in
//! git history.

use crate::chart_support::*;
use crate::e2e_support::Env;
use crate::upgrade::{chart_at, release_namespace, run};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use zklock::api::Phase;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const PATIENCE: Duration = Duration::from_secs(120);

/// A registry of images and charts on a loopback port, stopped when dropped.
struct Registry {
    child: Child,
    host: String,
}

impl Registry {
    async fn start(dir: &Path) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.join("registry.yml");
        let storage = dir.join("registry");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n",
                storage.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("docker-registry: {e} (scripts/tools.sh with TOOLS_WITH_IMAGE=1 installs it)"));
        let registry = Registry { child, host };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let answered = tokio::net::TcpStream::connect(&registry.host).await.is_ok();
            if answered {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the registry did not listen on {} within 30 s: see {}",
                registry.host,
                dir.join("registry.log").display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the test started that must not outlive it, also when it fails midway: processes are
/// killed, the directory (registry storage, image layouts, the unpacked image) removed.
struct Leftovers {
    dir: PathBuf,
    children: Vec<Child>,
    /// Killed when it goes.
    operator: Option<crate::chart_rbac::Running>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The image's manifest digest in the registry (skopeo, without TLS on loopback).
fn digest_of(reference: &str) -> String {
    let inspected =
        run("skopeo inspect", Command::new("skopeo").args(["inspect", "--tls-verify=false"]).arg(reference));
    let inspected: Value = serde_json::from_str(&inspected).unwrap();
    inspected["Digest"].as_str().expect("a digest").to_string()
}

/// Pulls `image` from the registry and unpacks it: the root filesystem of the container.
fn pull(image: &str, dir: &Path) -> PathBuf {
    let layout = dir.join("pulled");
    run(
        "skopeo copy from the registry",
        Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false", &format!("docker://{image}")])
            .arg(format!("oci:{}:pulled", layout.display())),
    );
    let bundle = dir.join("bundle");
    run(
        "umoci unpack",
        Command::new("umoci")
            .args(["unpack", "--rootless", "--image", &format!("{}:pulled", layout.display())])
            .arg(&bundle),
    );
    bundle.join("rootfs")
}

/// `PATH` with the project's tools first (cargo-cyclonedx for scripts/sbom.sh).
fn tools_path() -> String {
    format!("{}:{}", root().join(".tools/bin").display(), std::env::var("PATH").unwrap_or_default())
}

/// cosign with a throw-away key pair (and a second one, whose signature must not count), on
/// the registry on loopback: no transparency log, no certificate authority.
struct Signing {
    cosign: PathBuf,
    key: PathBuf,
    public: PathBuf,
    other_public: PathBuf,
}

/// The throw-away keys' password (cosign encrypts the private key with it).
const KEY_PASSWORD: &str = "rehearsal";

impl Signing {
    fn new(dir: &Path) -> Signing {
        let cosign = root().join(".tools/bin/cosign");
        assert!(cosign.exists(), "cosign not found at {}: run TOOLS_WITH_IMAGE=1 scripts/tools.sh", cosign.display());
        for prefix in ["release", "other"] {
            run(
                "cosign generate-key-pair",
                Command::new(&cosign)
                    .args(["generate-key-pair", "--output-key-prefix"])
                    .arg(dir.join(prefix))
                    .env("COSIGN_PASSWORD", KEY_PASSWORD),
            );
        }
        Signing {
            cosign,
            key: dir.join("release.key"),
            public: dir.join("release.pub"),
            other_public: dir.join("other.pub"),
        }
    }

    /// cosign `args`, on the plain-HTTP registry on loopback.
    fn cosign(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.cosign);
        command
            .args(args)
            .args(["--allow-http-registry", "--allow-insecure-registry"])
            .env("COSIGN_PASSWORD", KEY_PASSWORD);
        command
    }

    fn sign(&self, at: &str) {
        let key = self.key.display().to_string();
        // No signing config: nothing is sent to a transparency log (none is reachable here).
        let mut sign =
            self.cosign(&["sign", "--key", &key, "--use-signing-config=false", "--tlog-upload=false", "--yes"]);
        run("cosign sign", sign.arg(at));
    }

    /// `cosign verify`, as docs/verify.md shows it with a key: the signature's payload names
    /// the digest signed.
    fn verified(&self, at: &str, digest: &str) {
        let public = self.public.display().to_string();
        let out = run("cosign verify", self.cosign(&["verify", "--key", &public, "--insecure-ignore-tlog"]).arg(at));
        let payloads: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("cosign verify's answer: {e}: {out}"));
        let signed = payloads[0]["critical"]["image"]["docker-manifest-digest"].as_str();
        assert_eq!(signed, Some(digest), "the signature of {at} signs another digest: {out}");
    }

    fn refused(&self, at: &str, public: &Path, what: &str) {
        let public = public.display().to_string();
        let out = output_within(
            "cosign verify",
            self.cosign(&["verify", "--key", &public, "--insecure-ignore-tlog"]).arg(at),
            crate::upgrade::COMMAND_DEADLINE,
        );
        assert!(!out.status.success(), "cosign verify accepted {what} ({at})");
    }

    /// The SBOM attested on the image, and read back from the verified attestation.
    fn attested(&self, at: &str, sbom: &Path) {
        let (key, public, sbom) =
            (self.key.display().to_string(), self.public.display().to_string(), sbom.display().to_string());
        let mut attest = self.cosign(&[
            "attest",
            "--key",
            &key,
            "--type",
            "cyclonedx",
            "--predicate",
            &sbom,
            "--use-signing-config=false",
            "--tlog-upload=false",
            "--yes",
        ]);
        run("cosign attest", attest.arg(at));
        let mut verify =
            self.cosign(&["verify-attestation", "--key", &public, "--type", "cyclonedx", "--insecure-ignore-tlog"]);
        let out = run("cosign verify-attestation", verify.arg(at));
        let envelope: Value = serde_json::from_str(out.lines().next().unwrap_or_default())
            .unwrap_or_else(|e| panic!("cosign verify-attestation's answer: {e}: {out}"));
        use base64::Engine as _;
        let payload = envelope["payload"].as_str().expect("a DSSE payload");
        let statement = base64::engine::general_purpose::STANDARD.decode(payload).expect("a base64 payload");
        let statement: Value = serde_json::from_slice(&statement).expect("an in-toto statement");
        assert_eq!(statement["predicate"]["bomFormat"], "CycloneDX", "the attested predicate: {statement}");
        assert_eq!(statement["predicate"]["metadata"]["component"]["name"], "zklock");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_pulled_from_a_registry_installs_passes_helm_test_and_upgrades_from_the_chart_before() {
    let dir = std::env::temp_dir().join(format!("zklock-release-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut leftovers = Leftovers { dir: dir.clone(), children: vec![], operator: None };
    let registry = Registry::start(&dir).await;
    let host = &registry.host;

    // Published: the image with skopeo, the chart with helm push.
    let layout = dir.join("image");
    let mut build = Command::new(root().join("scripts/image.sh"));
    let binary = std::env::var("ZKLOCK_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zklock").into());
    build.args(["--binary", &binary, "--revision", "rehearsal"]).arg(&layout);
    run("scripts/image.sh", &mut build);
    let image = format!("{host}/zklock/zklock:{VERSION}");
    run(
        "skopeo copy to the registry",
        Command::new("skopeo")
            .args(["copy", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{VERSION}", layout.display()))
            .arg(format!("docker://{image}")),
    );
    let pushed = digest_of(&format!("docker://{image}"));
    run("helm package", helm().arg("package").arg(chart()).arg("--destination").arg(&dir));
    let package = dir.join(format!("zklock-{VERSION}.tgz"));
    let charts = format!("oci://{host}/charts");
    let pushed_chart = output_within(
        "helm push",
        helm().arg("push").arg(&package).args([&charts, "--plain-http"]),
        crate::upgrade::COMMAND_DEADLINE,
    );
    let said =
        format!("{}{}", String::from_utf8_lossy(&pushed_chart.stdout), String::from_utf8_lossy(&pushed_chart.stderr));
    assert!(pushed_chart.status.success(), "helm push: {said}");
    let chart_digest = said
        .lines()
        .find_map(|l| l.strip_prefix("Digest: "))
        .unwrap_or_else(|| panic!("helm push names no digest: {said}"))
        .trim()
        .to_string();
    let reference = format!("{charts}/zklock");

    // Signed as the release workflow signs them (there keyless, by the workflow's identity; here
    // with a throw-away key), and verified as docs/verify.md shows: the image, the SBOM attested
    // on it, and the chart, each by digest.
    let signing = Signing::new(&dir);
    let image_at = format!("{host}/zklock/zklock@{pushed}");
    let signed_chart = format!("{host}/charts/zklock@{chart_digest}");
    signing.refused(&image_at, &signing.public, "an image nobody signed");
    signing.sign(&image_at);
    signing.sign(&signed_chart);
    signing.verified(&image_at, &pushed);
    signing.verified(&signed_chart, &chart_digest);
    signing.refused(&image_at, &signing.other_public, "a signature by another key");
    let sbom = dir.join("zklock.cdx.json");
    run("scripts/sbom.sh", Command::new(root().join("scripts/sbom.sh")).arg(&sbom).env("PATH", tools_path()));
    signing.attested(&image_at, &sbom);
    // From here on the repository's chart and build are not used: only what the registry serves.
    std::fs::remove_file(&package).unwrap();

    let kubeconfig = zklock_testkit::kube::private_control_plane("chart-release");
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let client = zklock_testkit::kube::client_for(kubeconfig).await;
    let (suffix, release_ns) = release_namespace(&client, "zklock-release").await;
    let release = format!("zr{suffix}");
    let (zk_host, chroot) = zk.split_at(zk.find('/').unwrap_or(zk.len()));
    // Every namespace served (the control plane is this test's): the test pod in the release's.
    let sets = [
        "zookeeper.bundled.enabled=false".to_string(),
        format!("zookeeper.connectString={zk_host}"),
        format!("zookeeper.chroot={chroot}"),
        "replicaCount=1".to_string(),
        format!("image.repository={host}/zklock/zklock"),
    ];

    let mut install = helm_on(kubeconfig);
    install.args(["install", &release, &reference, "--version", VERSION, "--plain-http"]);
    install.args(["--namespace", &release_ns, "--wait=false"]);
    for set in &sets {
        install.args(["--set", set]);
    }
    run("helm install from the registry", &mut install);

    // The Deployment names the registry's image; that image is what was pushed.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &release_ns);
    let deployment = deployments.list(&Default::default()).await.expect("list deployments").items;
    let container = deployment
        .iter()
        .flat_map(|d| d.spec.template.spec.iter().flat_map(|p| p.containers.iter()))
        .find(|c| c.name == "operator")
        .expect("the release's operator container");
    let named = container.image.clone().unwrap_or_default();
    assert_eq!(named, image, "the installed Deployment runs the image the registry serves");
    assert_eq!(digest_of(&format!("docker://{named}")), pushed, "the registry serves the image pushed");
    let rootfs = pull(&named, &dir);
    let binary = rootfs.join("usr/local/bin/zklock");

    // The operator from the pulled image, as the installed Deployment runs it.
    let manifest =
        run("helm get manifest", helm_on(kubeconfig).args(["get", "manifest", &release, "--namespace", &release_ns]));
    let docs = documents(&manifest);
    let log = dir.join("operator.log");
    let (operator, metrics) =
        crate::chart_rbac::start_operator_from(&binary, &docs, &zk, kubeconfig, &dir.join("requests.log"), &log);
    leftovers.operator = Some(operator);
    crate::chart_rbac::await_leading("the release from the registry", &metrics, &log).await;

    // helm test, as a user runs it; this test is the node that runs its pod.
    let mut helm_test = helm_on(kubeconfig);
    helm_test.args(["test", &release, "--namespace", &release_ns, "--timeout", "3m"]);
    let helm_test = tokio::process::Command::from(helm_test)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run helm test");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &release_ns);
    let test_pod = run_test_pod(&pods, &binary, kubeconfig, &dir).await;
    let out = tokio::time::timeout(PATIENCE, helm_test.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("helm test did not end within {PATIENCE:?} after its pod succeeded"))
        .expect("helm test");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm test failed:\n{said}");
    assert!(said.contains(&test_pod) && said.contains("Succeeded"), "helm test reports its pod: {said}");

    // A claim of a user's, served by the release from the registry.
    let env = Env::on(kubeconfig, zk.clone(), false).await;
    env.claim("from-the-registry", "db", json!({})).await;
    env.wait_phase("from-the-registry", Phase::Held).await;
    env.delete_claim("from-the-registry").await;
    env.wait_gone("from-the-registry").await;
    let mut operator = leftovers.operator.take().expect("the operator");
    crate::chart_rbac::stop("the release from the registry", &mut operator, &log);

    // The chart before this one in git history, installed, then upgraded to the registry's
    // (on a version the chart before supports: on an older one nobody has a release of it).
    let before = previous_chart_commit();
    let old = chart_at(&before, &dir.join("before"));
    let (_, upgraded_ns) = release_namespace(&client, "zklock-release-up").await;
    let upgraded = format!("zu{suffix}");
    let mut install = helm_on(kubeconfig);
    // Its CRDs are in the cluster already, at this chart's revision (the release above): a second
    // release brings none (an older chart's would conflict with the newer ones' fields).
    install.args(["install", &upgraded]).arg(&old).args(["--namespace", &upgraded_ns, "--wait=false", "--skip-crds"]);
    for set in &sets {
        install.args(["--set", set]);
    }
    let what = format!("helm install of the chart at {before}");
    let out = output_within(&what, &mut install, crate::upgrade::COMMAND_DEADLINE);
    if refused_by_kube_version(&out) {
        // A version before the earlier chart's support (the matrix's older ones): nobody has a
        // release of it here to upgrade from, and helm said why.
        run(
            "helm uninstall",
            helm_on(kubeconfig).args(["uninstall", &release, "--namespace", &release_ns, "--wait=false", "--no-hooks"]),
        );
        return;
    }
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    let mut upgrade = helm_on(kubeconfig);
    upgrade.args(["upgrade", &upgraded, &reference, "--version", VERSION, "--plain-http", "--reuse-values"]);
    run("helm upgrade to the registry's chart", upgrade.args(["--namespace", &upgraded_ns, "--wait=false"]));
    let history = run(
        "helm history",
        helm_on(kubeconfig).args(["history", &upgraded, "--namespace", &upgraded_ns, "-o", "json"]),
    );
    let history: Value = serde_json::from_str(&history).unwrap();
    let revisions = history.as_array().cloned().unwrap_or_default();
    let states: Vec<(i64, String)> = revisions
        .iter()
        .map(|r| (r["revision"].as_i64().unwrap_or_default(), r["status"].as_str().unwrap_or_default().to_string()))
        .collect();
    assert_eq!(
        states,
        [(1, "superseded".to_string()), (2, "deployed".to_string())],
        "the chart before, then the registry's, deployed: {history}"
    );

    for (name, ns) in [(&release, &release_ns), (&upgraded, &upgraded_ns)] {
        run(
            "helm uninstall",
            helm_on(kubeconfig).args(["uninstall", name, "--namespace", ns, "--wait=false", "--no-hooks"]),
        );
    }
    drop(registry);
    drop(leftovers);
}

/// The newest commit before the last change to the chart: the chart a user upgrades from.
fn previous_chart_commit() -> String {
    let last = run(
        "git log of the chart",
        Command::new("git").arg("-C").arg(root()).args([
            "log",
            "-n",
            "1",
            "--format=%H",
            "HEAD",
            "--",
            "charts/zklock",
        ]),
    );
    format!("{}^", last.trim())
}

/// Waits for the pod `helm test` makes, runs its container's command from the image's files with
/// the environment a kubelet gives it, and writes the phase the command's exit means. Answers
/// the pod's name.
async fn run_test_pod(pods: &Api<Pod>, binary: &Path, kubeconfig: &Path, dir: &Path) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let pod = loop {
        let listed = pods.list(&Default::default()).await.expect("list pods").items;
        let test = listed
            .into_iter()
            .find(|p| p.metadata.annotations.as_ref().and_then(|a| a.get("helm.sh/hook")).is_some_and(|h| h == "test"));
        if let Some(pod) = test.filter(|p| p.metadata.uid.is_some()) {
            break pod;
        }
        assert!(tokio::time::Instant::now() < deadline, "helm test made no test pod within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.clone().expect("the test pod's spec");
    let container = &spec.containers[0];
    let image_binary = container.command.clone().unwrap_or_default();
    assert!(
        image_binary.is_empty() || image_binary[0].ends_with("zklock"),
        "the test pod runs zklock: {image_binary:?}"
    );
    // As the pod's own ServiceAccount (the chart's test account, which may only take a lock in
    // its namespace), not the admin's: a Role the test pod lacks fails the test here as it would
    // fail `helm test` on a cluster.
    let account = spec.service_account_name.clone().expect("the test pod names its ServiceAccount");
    let pod_ns = pod.metadata.namespace.clone().unwrap_or_default();
    let token = crate::chart_rbac::token_for_on(kubeconfig, &account, &pod_ns);
    let as_the_pod = crate::chart_rbac::token_kubeconfig_on(kubeconfig, &token, &pod_ns);
    let mut command = Command::new(binary);
    command.args(container.args.clone().unwrap_or_default()).env("KUBECONFIG", &as_the_pod);
    // The image's PATH first: the command it runs under the lock is the image's zklock too.
    let image_path = binary.parent().map(|p| p.display().to_string()).unwrap_or_default();
    command.env("PATH", format!("{image_path}:{}", std::env::var("PATH").unwrap_or_default()));
    for var in container.env.iter().flatten() {
        let field = var.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
        let value = match (&var.value, field) {
            (Some(value), _) => value.clone(),
            (None, Some("metadata.name")) => name.clone(),
            (None, Some("metadata.uid")) => pod.metadata.uid.clone().unwrap_or_default(),
            (None, Some("metadata.namespace")) => pod.metadata.namespace.clone().unwrap_or_default(),
            other => panic!("env {}: {other:?} has no local equivalent", var.name),
        };
        command.env(&var.name, value);
    }
    let out = tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("run the test pod's command");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    std::fs::write(dir.join("test-pod.log"), &said).unwrap();
    let _ = std::fs::remove_file(&as_the_pod);
    assert!(out.status.success(), "the test pod's command failed:\n{said}");
    assert!(said.contains(VERSION), "it ran the image's zklock under the lock: {said}");
    // What a kubelet writes when the pod's one container exits 0.
    let status = json!({ "status": { "phase": "Succeeded" } });
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("write the pod's phase");
    name
}

/// The install command the README and operations.md show pulls the chart from where the release workflow pushes it, at
/// this version, and that chart's default image is the one the workflow publishes.
#[test]
fn the_readmes_install_command_names_what_a_release_publishes() {
    for page in ["README.md", "docs/operations.md"] {
        let text = std::fs::read_to_string(root().join(page)).expect(page);
        let install = text
            .lines()
            .find(|l| l.starts_with("helm install") && l.contains("oci://"))
            .unwrap_or_else(|| panic!("{page} installs the chart from its OCI registry"));
        check_install(page, install);
    }
}

fn check_install(page: &str, install: &str) {
    let workflow = std::fs::read_to_string(root().join(".github/workflows/release.yml")).expect("release.yml");
    let values = std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml");
    let image: Value = serde_yaml::from_str::<Value>(&values).expect("values.yaml")["image"]["repository"].clone();
    let image = image.as_str().expect("image.repository");
    // ghcr.io/<owner>/zklock: the workflow's IMAGE for that owner.
    let owner = image.split('/').nth(1).expect("an owner in image.repository");
    assert!(workflow.contains("IMAGE: ghcr.io/${{ github.repository_owner }}/zklock"), "the workflow's image");
    assert!(workflow.contains("CHART_REPOSITORY: oci://ghcr.io/${{ github.repository_owner }}/charts"));
    assert_eq!(image, format!("ghcr.io/{owner}/zklock"), "the chart's default image is the workflow's");
    let chart_ref = format!("oci://ghcr.io/{owner}/charts/zklock");
    assert!(
        install.contains(&format!("{chart_ref} --version {VERSION} ")),
        "{page}: {install:?} installs {chart_ref} {VERSION}"
    );
}
