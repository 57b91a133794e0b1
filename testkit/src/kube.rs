//! The Kubernetes API for tests: the server named by `ZKLOCK_TEST_KUBECONFIG`; else the
//! project's real control plane (`scripts/k8s.sh up`, started once per test process and stopped
//! when it ends). A test that needs a control plane nobody else uses (an operator of every
//! namespace sees every test's claims) starts one of its own with [`private_control_plane`].
//! Never the user's default `KUBECONFIG`: clients are built from the explicit file only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use kube::config::{KubeConfigOptions, Kubeconfig};

static SERVER: OnceLock<PathBuf> = OnceLock::new();

/// Path of the kubeconfig of the API server under test.
pub fn kubeconfig() -> &'static Path {
    SERVER.get_or_init(|| match std::env::var("ZKLOCK_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => {
            eprintln!("kubernetes API from ZKLOCK_TEST_KUBECONFIG={path}");
            PathBuf::from(path)
        }
        _ => start_control_plane("shared"),
    })
}

static PRIVATE: OnceLock<Mutex<HashMap<String, &'static Path>>> = OnceLock::new();

/// A control plane of this test process named `name`, which no other test uses (the first call
/// starts it: about 10 s with the binaries cached), whatever `ZKLOCK_TEST_KUBECONFIG` says. It
/// stops when the process ends.
pub fn private_control_plane(name: &str) -> &'static Path {
    let mut started = PRIVATE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    started.entry(name.to_string()).or_insert_with(|| Box::leak(start_control_plane(name).into_boxed_path()))
}

/// A control plane for this test process only: `scripts/k8s.sh up` (which builds it the first
/// time), in a directory of this process; it stops itself once this process ends.
fn start_control_plane(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zklock-k8s-{}-{name}", std::process::id()));
    let script = crate::workspace_root().join("scripts/k8s.sh");
    eprintln!("starting the real control plane: {} up {}", script.display(), dir.display());
    let out = Command::new(&script)
        .args(["up", &dir.display().to_string()])
        .env("ZKLOCK_K8S_WATCH_PID", std::process::id().to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let kubeconfig = stdout.lines().find_map(|l| l.strip_prefix("KUBECONFIG="));
    match kubeconfig {
        Some(path) if out.status.success() => PathBuf::from(path),
        _ => panic!("scripts/k8s.sh up failed ({}): {stdout}", out.status),
    }
}

/// A client for the API server under test.
pub async fn client() -> kube::Client {
    client_for(kubeconfig()).await
}

/// A client for the API server of the kubeconfig at `path` (and only that file).
pub async fn client_for(path: &Path) -> kube::Client {
    let config = Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
    // The operator's stack: kube's own leaves Nagle's algorithm on, and a request whose body
    // goes out after its headers waits 40 ms for the server's delayed ACK.
    zklock_kube_client::builder(config).unwrap_or_else(|e| panic!("kube client: {e}")).build()
}

/// The real kubectl: `ZKLOCK_KUBECTL`, or `.tools/bin/kubectl` as `scripts/tools.sh` installs it.
pub fn kubectl() -> PathBuf {
    let path = std::env::var("ZKLOCK_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| crate::workspace_root().join(".tools/bin/kubectl"));
    if !path.exists() {
        panic!("kubectl not found at {}: run scripts/tools.sh (or set ZKLOCK_KUBECTL)", path.display());
    }
    path
}

/// The number in a Kubernetes minor version as `/version` gives it ("33", or "33+" from some
/// builds).
pub fn minor_number(minor: &str) -> u32 {
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("a minor version in {minor:?}"))
}
