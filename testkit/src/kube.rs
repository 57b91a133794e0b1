//! The Kubernetes API for tests: the server named by `ZKLOCK_TEST_KUBECONFIG`; else the
//! project's real control plane (`scripts/k8s.sh up`, started once per test process and stopped
//! when it ends); or, with `ZKLOCK_TEST_API=sandbox`, a kube-sandbox started once per test process
//! on a thread of its own (so it outlives each test's runtime). Never the user's default
//! `KUBECONFIG`: clients are built from the explicit file only.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Which API server the tests run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// The project's control plane, or another real cluster (`ZKLOCK_TEST_KUBECONFIG`).
    Real,
    /// kube-sandbox, the project's in-memory API server.
    Sandbox,
}

static SERVER: OnceLock<(PathBuf, Server)> = OnceLock::new();

fn server_under_test() -> &'static (PathBuf, Server) {
    SERVER.get_or_init(|| match std::env::var("ZKLOCK_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => {
            eprintln!("kubernetes API from ZKLOCK_TEST_KUBECONFIG={path}");
            (PathBuf::from(path), Server::Real)
        }
        _ if std::env::var("ZKLOCK_TEST_API").is_ok_and(|api| api == "sandbox") => (start_sandbox(), Server::Sandbox),
        _ => (start_control_plane(), Server::Real),
    })
}

/// Path of the kubeconfig of the API server under test.
pub fn kubeconfig() -> &'static Path {
    &server_under_test().0
}

/// Which server [`kubeconfig`] names.
pub fn server() -> Server {
    server_under_test().1
}

static SANDBOX: OnceLock<PathBuf> = OnceLock::new();

/// A kube-sandbox of this test process, whatever server the others run on: for the tests that
/// say why they need the sandbox (its demo, or a figure printed beside the real server's).
pub fn sandbox_kubeconfig() -> &'static Path {
    match server_under_test() {
        (path, Server::Sandbox) => path,
        _ => SANDBOX.get_or_init(start_sandbox),
    }
}

/// The kubeconfig of a kube-sandbox this process runs, or an empty path if it runs none.
pub fn sandbox_kubeconfig_if_started() -> &'static Path {
    match server_under_test() {
        (path, Server::Sandbox) => path,
        _ => SANDBOX.get().map_or(Path::new(""), |p| p.as_path()),
    }
}

/// The project's control plane, for this test process only: `scripts/k8s.sh up` (which builds
/// it the first time), in a directory of this process; it stops itself once this process ends.
fn start_control_plane() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zklock-k8s-{}", std::process::id()));
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

fn start_sandbox() -> PathBuf {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kube-sandbox".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("kube-sandbox runtime: {e}"));
            runtime.block_on(async move {
                let sandbox = kube_sandbox::Sandbox::start(kube_sandbox::Options::default())
                    .await
                    .unwrap_or_else(|e| panic!("cannot start kube-sandbox: {e}"));
                let _ = tx.send((sandbox.url().to_string(), sandbox.kubeconfig()));
                // Serve for as long as the test process lives.
                std::future::pending::<()>().await;
            });
        })
        .unwrap_or_else(|e| panic!("cannot spawn the kube-sandbox thread: {e}"));
    let (url, config) = rx.recv().unwrap_or_else(|e| panic!("kube-sandbox did not start: {e}"));
    let dir = std::env::temp_dir().join(format!("zklock-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let path = dir.join("kubeconfig");
    std::fs::write(&path, config).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    eprintln!("kube-sandbox at {url}");
    path
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
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("kube client: {e}"))
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
