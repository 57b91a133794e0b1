//! The operator's Kubernetes client, with two layers around every request it sends (the
//! reconciler's, the finalizer helper's, the watches', leader election's):
//! - metrics: calls by method, resource and outcome, their latency, and the writes made for claims;
//! - opt-in request log: with `ZKLOCK_API_AUDIT=FILE` every request is appended to FILE as one
//!   line `METHOD PATH[?QUERY]`. The chart's RBAC test derives the permissions the operator
//!   needs from this log.

use std::io::Write;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use parking_lot::Mutex;

use crate::metrics::{CallLabel, Metrics};

/// The client stack (kube's, with `TCP_NODELAY`), shared with the test kit.
pub use zklock_kube_client::{builder, Stack};

/// Environment variable naming the request log.
pub const AUDIT_ENV: &str = "ZKLOCK_API_AUDIT";

/// The operator's two Kubernetes clients, from one inferred config (KUBECONFIG or in-cluster).
/// Every request has a deadline (docs/design.md: liveness): kube's client sets no read timeout of
/// its own, so one request the API server never answers (a half-open connection, a proxy that
/// holds it) would hang whoever sent it for good — a reconcile, the finalizer helper's PATCH, a
/// graceful shutdown that waits for both.
#[derive(Clone)]
pub struct Clients {
    /// Requests (reads and writes): no answer within [`REQUEST_TIMEOUT`] fails the request.
    pub requests: kube::Client,
    /// Watches (and the lists they start with): these wait for news by design, so their
    /// deadline is [`WATCH_READ_TIMEOUT`] of silence; a watch asks the server to close it after
    /// [`WATCH_TIMEOUT_SECONDS`], well before, so that only a dead connection meets it.
    pub watches: kube::Client,
}

/// The longest wait for any part of an answer to a request (it counts again from each write).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// What every watch asks of the server: close after this many seconds (the watcher then
/// resumes from where it was, without a new list). kube-runtime's watcher gives up on a watch
/// silent for this long plus 5 s.
pub const WATCH_TIMEOUT_SECONDS: u32 = 55;
/// The longest silence on a watch's or a list's connection.
pub const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(75);

/// The operator's clients (see [`Clients`]), counted in `metrics`, plus the request log when
/// `ZKLOCK_API_AUDIT` is set.
pub async fn clients(metrics: Arc<Metrics>) -> Result<Clients, String> {
    let config = kube::Config::infer().await.map_err(|e| e.to_string())?;
    let with_timeout = |read: Duration| {
        let mut config = config.clone();
        config.read_timeout = Some(read);
        // From when the request was sent, not from when its pooled connection went idle.
        config.reset_reader_on_write = true;
        config
    };
    Ok(Clients {
        requests: client(with_timeout(REQUEST_TIMEOUT), metrics.clone())?,
        watches: client(with_timeout(WATCH_READ_TIMEOUT), metrics)?,
    })
}

/// A client for `config`, counted in `metrics`, plus the request log when `ZKLOCK_API_AUDIT` is set.
fn client(config: kube::Config, metrics: Arc<Metrics>) -> Result<kube::Client, String> {
    let builder = builder(config).map_err(|e| e.to_string())?;
    let builder = builder.with_layer(&tower::layer::layer_fn(move |inner| Counted { inner, metrics: metrics.clone() }));
    let Some(path) = std::env::var_os(AUDIT_ENV).filter(|p| !p.is_empty()) else { return Ok(builder.build()) };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot open {AUDIT_ENV}={}: {e}", path.to_string_lossy()))?;
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

/// Counts each request into [`Metrics`]: by method, resource and outcome (once answered; a call
/// its caller gave up on is not counted here, its reconcile error is), with its latency; and,
/// when it writes anything but leader election's Lease, as a write made for claims.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, R> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().to_string();
        let resource = resource_of(request.uri().path());
        if request.method() != http::Method::GET && resource != "leases" {
            self.metrics.api_writes.inc();
        }
        let (metrics, start, answer) = (self.metrics.clone(), Instant::now(), self.inner.call(request));
        Box::pin(async move {
            let answer = answer.await;
            metrics.api_call_seconds.observe(start.elapsed().as_secs_f64());
            let outcome = match &answer {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".into(),
            };
            metrics.api_calls.get_or_create(&CallLabel { method, resource, outcome }).inc();
            answer
        })
    }
}

/// The resource a request's path names, with its subresource: `lockclaims/status`, `pods`.
fn resource_of(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // `/api/v1/…` or `/apis/GROUP/VERSION/…`, then `namespaces/NS/` for namespaced resources.
    let rest = if parts.first() == Some(&"api") { parts.get(2..) } else { parts.get(3..) };
    let rest = match rest.unwrap_or_default() {
        ["namespaces", _, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    match rest {
        [] => String::new(),
        [kind] | [kind, _] => kind.to_string(),
        [kind, _, sub, ..] => format!("{kind}/{sub}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn requests_are_counted_by_resource_and_subresource() {
        let cases = [
            ("/apis/zklock.io/v1alpha1/namespaces/shop/lockclaims/a/status", "lockclaims/status"),
            ("/apis/zklock.io/v1alpha1/lockclaims", "lockclaims"),
            ("/api/v1/namespaces/shop/pods/worker-0", "pods"),
            ("/apis/coordination.k8s.io/v1/namespaces/ops/leases/zklock-leader", "leases"),
            ("/api/v1/namespaces/shop", "namespaces"),
        ];
        for (path, resource) in cases {
            assert_eq!(super::resource_of(path), resource, "{path}");
        }
    }
}
