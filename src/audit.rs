//! Opt-in log of the operator's Kubernetes API requests: with `ZKLOCK_API_AUDIT=FILE` every
//! request the operator's client sends is appended to FILE as one line `METHOD PATH[?QUERY]`.
//! The chart's RBAC test derives the permissions the operator needs from this log.

use std::io::Write;
use std::sync::Arc;

use parking_lot::Mutex;

/// Environment variable naming the request log.
pub const ENV: &str = "ZKLOCK_API_AUDIT";

/// The operator's Kubernetes client: inferred config (KUBECONFIG or in-cluster), plus the
/// request log when `ZKLOCK_API_AUDIT` is set.
pub async fn client() -> Result<kube::Client, String> {
    let config = kube::Config::infer().await.map_err(|e| e.to_string())?;
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| e.to_string())?;
    let Some(path) = std::env::var_os(ENV).filter(|p| !p.is_empty()) else { return Ok(builder.build()) };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot open {ENV}={}: {e}", path.to_string_lossy()))?;
    let file = Arc::new(Mutex::new(file));
    let log = tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
        let uri = request.uri();
        let line = match uri.query() {
            Some(query) => format!("{} {}?{query}\n", request.method(), uri.path()),
            None => format!("{} {}\n", request.method(), uri.path()),
        };
        // One write per line, so concurrent requests never interleave within a line.
        let _ = file.lock().write_all(line.as_bytes());
        request
    });
    Ok(builder.with_layer(&log).build())
}
