//! The integration examples (`examples/integrations/`, docs/integrations.md) as their platforms
//! take them: every Kubernetes manifest created in a server-side dry run (strict field
//! validation) on the API server under test, Argo Workflows' `Workflow` and Tekton's `Task`
//! against those projects' own CRDs (from their Go modules, fetched by scripts/tools.sh); the
//! GitHub Actions workflow through actionlint; the GitLab job parsed, its `zklock` command and
//! the CLI's download checked like the docs' commands.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubectl(args: &[&str]) -> (bool, String) {
    // Each request bounded: a hung API server fails the test instead of holding it.
    let out = Command::new(zklock_testkit::kube::kubectl())
        .arg("--request-timeout=60s")
        .args(args)
        .env("KUBECONFIG", zklock_testkit::kube::kubeconfig())
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// A namespace of the test's own, deleted when the test ends (also when it fails).
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", "namespace", &self.0, "--wait=false"]);
    }
}

/// Waits (60 s at most) until CRD `name` is Established: `kubectl wait` gives up at once on a CRD
/// whose status has no conditions yet.
fn established(name: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let jsonpath = "jsonpath={.status.conditions[?(@.type==\"Established\")].status}";
    loop {
        let (ok, out) = kubectl(&["get", "crd", name, "-o", jsonpath]);
        if ok && out.trim() == "True" {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "CRD {name} not Established within 60 s: {out}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn every_kubernetes_example_is_accepted_by_the_api_server() {
    // The workflow engines' CRDs (server-side apply: Argo's is too large for the annotation a
    // client-side apply keeps).
    for (file, crd) in [("argoproj.io_workflows.yaml", "workflows.argoproj.io"), ("300-task.yaml", "tasks.tekton.dev")]
    {
        let path = root().join(".tools/crds").join(file);
        assert!(path.exists(), "{} is missing: run TOOLS_WITH_IMAGE=1 scripts/tools.sh", path.display());
        let (ok, out) = kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=zklock-tests",
            "-f",
            path.to_str().unwrap(),
        ]);
        assert!(ok, "apply {file}: {out}");
        established(crd);
    }
    let ns = Namespace(format!("zklock-integrations-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]));
    let (ok, out) = kubectl(&["create", "namespace", &ns.0]);
    assert!(ok, "{out}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("examples/integrations"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "the Kubernetes examples: {files:?}");
    for file in &files {
        // `create`, not `apply`: a Workflow is named by generateName.
        let (ok, out) =
            kubectl(&["create", "--dry-run=server", "--validate=strict", "-n", &ns.0, "-f", file.to_str().unwrap()]);
        assert!(ok, "{}: {out}", file.display());
    }
    // The validation is real: a misspelt field of a Workflow is refused.
    let argo = std::fs::read_to_string(root().join("examples/integrations/argo-workflow.yaml")).unwrap();
    let broken = root().join("target").join(format!("broken-workflow-{}.yaml", std::process::id()));
    std::fs::write(&broken, argo.replace("podSpecPatch", "podSpecPatsh")).unwrap();
    let (ok, out) =
        kubectl(&["create", "--dry-run=server", "--validate=strict", "-n", &ns.0, "-f", broken.to_str().unwrap()]);
    let _ = std::fs::remove_file(&broken);
    assert!(!ok && out.contains("podSpecPatsh"), "a misspelt field must be refused: {out}");
}

#[test]
fn the_ci_examples_lint_and_fetch_the_cli_a_release_ships() {
    let dir = root().join("examples/integrations");
    let linter = root().join(".tools/bin/actionlint");
    let out = Command::new(&linter)
        .arg(dir.join("github-actions.yml"))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (TOOLS_WITH_IMAGE=1 scripts/tools.sh installs it)", linter.display()));
    assert!(
        out.status.success(),
        "actionlint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let gitlab: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(dir.join("gitlab-ci.yml")).unwrap())
        .expect("gitlab-ci.yml parses");
    let script = gitlab["deploy"]["script"].as_array().expect("the deploy job's script");
    assert!(script.iter().any(|l| l.as_str().is_some_and(|l| l.starts_with("zklock exec "))), "{script:?}");

    // Both fetch the archive of this version that scripts/archive.sh makes, and take the binary
    // from where it lies in it (tests/repository/release_archives.rs unpacks it that way).
    let version = env!("CARGO_PKG_VERSION");
    let archive = format!("releases/download/v{version}/zklock-{version}-linux-amd64.tar.gz");
    let member = format!("--strip-components=1 zklock-{version}-linux-amd64/zklock");
    for file in ["github-actions.yml", "gitlab-ci.yml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(text.contains(&archive) && text.contains(&member), "{file} fetches {archive} and takes {member}");
    }
}
