//! `zklock run`: the operator until a stop signal (its flags are `zklock::operator::RunArgs`).

use zklock::operator::RunArgs;

/// Runs the operator until SIGINT or SIGTERM.
pub async fn run(args: RunArgs) -> Result<u8, String> {
    let options = args.into_options()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        on_signal.cancel();
    });
    zklock::operator::run(options, shutdown).await.map_err(|e| e.to_string())?;
    Ok(0)
}

/// SIGINT, or SIGTERM (what Kubernetes sends a pod it stops).
/// True for SIGTERM.
async fn wait_for_signal() -> bool {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        return tokio::select! { _ = tokio::signal::ctrl_c() => false, _ = term.recv() => true };
    }
    let _ = tokio::signal::ctrl_c().await;
    false
}
