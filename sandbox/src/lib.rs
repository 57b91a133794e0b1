//! kube-sandbox: an in-memory Kubernetes API server for tests and local demos.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let sandbox = kube_sandbox::Sandbox::start(kube_sandbox::Options::default()).await?;
//! std::fs::write("/tmp/kubeconfig", sandbox.kubeconfig())?;
//! sandbox.shutdown().await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod api;
mod cel;
mod convert;
mod crd;
mod discovery;
mod error;
mod gc;
mod kubeconfig;
mod lifecycle;
mod meta;
mod openapi;
mod patch;
mod protobuf;
mod query;
mod registry;
mod schema;
mod selector;
mod server;
mod state;
mod store;
mod table;
mod watch;

use parking_lot::Mutex;
use serde_json::Value;
use server::Shared;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch as tokio_watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone)]
pub struct Options {
    /// 0 picks a free port.
    pub port: u16,
    /// CRD manifests (YAML/JSON, multi-document) to create at startup.
    pub crd_dir: Option<PathBuf>,
    /// Changes kept for watch resumption and paged lists (etcd's compaction window).
    pub history: usize,
    /// Periodic bookmark interval for watches that allow bookmarks (kube-apiserver: ~1 min).
    pub bookmark_interval: Duration,
    /// Bearer token clients must present; random when None.
    pub token: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options { port: 0, crd_dir: None, history: 10_000, bookmark_interval: Duration::from_secs(60), token: None }
    }
}

pub struct Sandbox {
    url: String,
    token: String,
    addr: SocketAddr,
    shutdown: tokio_watch::Sender<bool>,
    server: JoinHandle<()>,
}

impl Sandbox {
    pub async fn start(opts: Options) -> std::io::Result<Sandbox> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let token = opts.token.clone().unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        let (tx, rx) = tokio_watch::channel(false);
        let mut state = state::State::new(opts.history);
        bootstrap(&mut state);
        if let Some(dir) = &opts.crd_dir {
            load_crds(&mut state, dir)?;
        }
        let gc_rx = state.store.subscribe();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            token: token.clone(),
            shutdown: rx.clone(),
            bookmark_interval: opts.bookmark_interval,
            server_url: url.clone(),
        });
        tokio::spawn(gc::run(shared.clone(), gc_rx));
        let app = axum::Router::new().fallback({
            let shared = shared.clone();
            move |req: axum::extract::Request| server::handle(shared.clone(), req)
        });
        let mut stop = rx;
        let server = tokio::spawn(async move {
            let graceful = async move {
                let _ = stop.wait_for(|v| *v).await;
            };
            // Without TCP_NODELAY, small responses wait for the client's delayed ACK (~40 ms).
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).with_graceful_shutdown(graceful).await;
        });
        Ok(Sandbox { url, token, addr, shutdown: tx, server })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// A kubeconfig (YAML) pointing at this sandbox.
    pub fn kubeconfig(&self) -> String {
        kubeconfig::render(&self.url, &self.token)
    }

    /// Ends open watches and stops serving. Connections that still hold unsent data after a
    /// grace period (a client that stopped reading) are abandoned rather than waited for.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let mut server = self.server;
        if tokio::time::timeout(Duration::from_secs(3), &mut server).await.is_err() {
            server.abort();
        }
    }
}

fn bootstrap(st: &mut state::State) {
    let Some(def) = st.registry.lookup("", "v1", "namespaces") else {
        return;
    };
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        let _ = api::create(st, &def, None, body, &query::Query::default());
    }
}

fn load_crds(st: &mut state::State, dir: &std::path::Path) -> std::io::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")))
        .collect();
    files.sort();
    let def = st
        .registry
        .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .ok_or_else(|| std::io::Error::other("CRD resource missing"))?;
    for f in files {
        let text = std::fs::read_to_string(&f)?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", f.display())))?;
            if v.is_null() {
                continue;
            }
            if v.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
                continue;
            }
            api::create(st, &def, None, v, &query::Query::default()).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {}", f.display(), e.message))
            })?;
        }
    }
    Ok(())
}
