//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::controller::supervisor::Readiness;
use crate::metrics::Metrics;

/// What the probes report.
#[derive(Default)]
pub struct Health {
    /// Written by the session supervisor only (see [`Readiness`]).
    pub readiness: Arc<Readiness>,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Binds `addr` (the error says which address failed) and serves until the process ends.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, health });
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok((local, task))
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.encode())
}

async fn ready_handler(State(state): State<AppState>) -> impl IntoResponse {
    if state.health.readiness.is_ready() {
        (StatusCode::OK, "ready".to_string())
    } else {
        let why = state.health.readiness.unable().map_or_else(String::new, |why| format!(": {why}"));
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready{why}"))
    }
}

/// Alive: the process answers. A replica that could not serve its term says why (it has given
/// the lease up; restarting it would not bring ZooKeeper closer).
async fn health_handler(State(state): State<AppState>) -> impl IntoResponse {
    match state.health.readiness.unable() {
        Some(why) => format!("ok; gave up leading: {why}"),
        None => "ok".to_string(),
    }
}
