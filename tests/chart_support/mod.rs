//! Helpers for the chart tests: the real helm (`scripts/tools.sh` with `TOOLS_WITH_HELM=1`, or
//! `ZKLOCK_HELM`), rendering, and the rendered documents as JSON values.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn chart() -> PathBuf {
    root().join("charts/zklock")
}

pub fn helm_path() -> PathBuf {
    let path = std::env::var("ZKLOCK_HELM").map(PathBuf::from).unwrap_or_else(|_| root().join(".tools/bin/helm"));
    if !path.exists() {
        panic!("helm not found at {}: run TOOLS_WITH_HELM=1 scripts/tools.sh (or set ZKLOCK_HELM)", path.display());
    }
    path
}

/// helm with its own config/cache dirs and no default cluster: nothing here reads
/// ~/.kube/config or writes ~/.cache/helm.
pub fn helm() -> Command {
    let home = std::env::temp_dir().join(format!("zklock-helm-{}", std::process::id()));
    let mut cmd = Command::new(helm_path());
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", home.join("no-kubeconfig"));
    cmd
}

/// helm as [`helm`] does it, but talking to the cluster of `kubeconfig` (to install for real).
pub fn helm_on(kubeconfig: &Path) -> Command {
    let mut cmd = helm();
    cmd.env("KUBECONFIG", kubeconfig);
    cmd
}

/// The value sets the tests render: the defaults, then every `charts/zklock/ci/*-values.yaml`.
pub fn value_sets() -> Vec<(String, Option<PathBuf>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .expect("charts/zklock/ci")
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    let mut sets = vec![("default".to_string(), None)];
    sets.extend(files.into_iter().map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), Some(f))));
    sets
}

/// The API the chart's finalizer policy needs (Kubernetes 1.36 or later).
pub const FINALIZER_POLICY_API: &str = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy";

/// `helm template` with a values file and `--set` pairs; stdout, or stderr as the error.
pub fn render(namespace: &str, values: Option<&Path>, sets: &[&str]) -> Result<String, String> {
    render_release("zklock", namespace, values, sets)
}

/// [`render`] for release `release`.
pub fn render_release(release: &str, namespace: &str, values: Option<&Path>, sets: &[&str]) -> Result<String, String> {
    render_release_with(release, namespace, values, sets, true)
}

/// [`render_release`], as a cluster that serves MutatingAdmissionPolicy (`with_policies`: 1.36
/// and later) or not would answer `helm install`'s discovery (what Argo CD passes too).
pub fn render_release_with(
    release: &str,
    namespace: &str,
    values: Option<&Path>,
    sets: &[&str],
    with_policies: bool,
) -> Result<String, String> {
    let mut cmd = helm();
    cmd.args(["template", release]).arg(chart()).args(["--namespace", namespace]);
    if with_policies {
        cmd.args(["--api-versions", FINALIZER_POLICY_API]);
    }
    if let Some(values) = values {
        cmd.arg("--values").arg(values);
    }
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("run helm");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The documents of a multi-document YAML stream, as JSON values (empty documents dropped).
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

pub fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

pub fn find<'a>(docs: &'a [Value], kind_: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind(d) == kind_).collect()
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
}

/// `command`'s output, the process killed (and the test failed, naming `what`) if it has not
/// ended within `deadline`. Its output is read on threads of their own, so that a full pipe
/// cannot stall it.
pub fn output_within(what: &str, command: &mut Command, deadline: std::time::Duration) -> std::process::Output {
    use std::io::Read;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = vec![];
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = reader(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = reader(Box::new(child.stderr.take().expect("piped stderr")));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{what}: {e}")) {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let said = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
            panic!("{what}: no end within {deadline:?}, killed; it said: {said}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Whether helm refused a chart for the cluster's version (its `kubeVersion`), by what `helm
/// install` printed: then nobody has a release of that chart on this version to upgrade from.
pub fn refused_by_kube_version(out: &std::process::Output) -> bool {
    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("chart requires kubeVersion")
}
