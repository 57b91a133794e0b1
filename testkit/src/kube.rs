//! The Kubernetes API for tests: the server named by `ZKLOCK_TEST_KUBECONFIG`, or a kube-sandbox
//! started once per test process on a thread of its own (so it outlives each test's runtime).
//! Never the user's default `KUBECONFIG`: clients are built from the explicit file only.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Path of the kubeconfig of the API server under test.
pub fn kubeconfig() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var("ZKLOCK_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => {
            eprintln!("kubernetes API from ZKLOCK_TEST_KUBECONFIG={path}");
            PathBuf::from(path)
        }
        _ => start_sandbox(),
    })
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
    let path = kubeconfig();
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
