//! The tasks that feed the controller besides its watches: the lock engine's state changes, the
//! session supervisor, and the batched position refresh.

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{anchor, Context};
use crate::zk::{ContenderState, EngineEvent, SessionEvent};

/// Waiters whose position is refreshed per lock and round: the front of a long queue is
/// kept exact, the rest is refreshed as it moves up. Bounds the API writes positions cost.
pub const POSITIONS_PER_LOCK: usize = 10;
pub const POSITIONS_EVERY: Duration = Duration::from_secs(2);

/// Between attempts to open a new session and re-anchor: a ZooKeeper outage is waited out
/// without limit, at most 10 s apart.
const REANCHOR_DELAYS: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(200))
    .with_max_delay(Duration::from_secs(10))
    .with_jitter()
    .without_max_times();

/// Spawns them into `tasks`, which ends them when it is dropped.
pub fn spawn(tasks: &mut JoinSet<()>, ctx: Arc<Context>, engine_events: mpsc::UnboundedReceiver<EngineEvent>) {
    tasks.spawn(follow_engine(ctx.clone(), engine_events));
    tasks.spawn(refresh_positions(ctx));
}

/// Contender changes trigger their claim; a lost session is replaced and re-anchored.
async fn follow_engine(ctx: Arc<Context>, mut events: mpsc::UnboundedReceiver<EngineEvent>) {
    ctx.metrics.zk_session_connected.set(1);
    while let Some(event) = events.recv().await {
        match event {
            // A release is always the operator's own doing, by the reconcile that asked for
            // it: reconciling again would only redo its work from a copy of the claim that may
            // not show it yet (a finalizer removal, say).
            EngineEvent::Contender { state: ContenderState::Released, .. } => {}
            EngineEvent::Contender { id, .. } => {
                ctx.trigger(&id);
            }
            EngineEvent::Session(SessionEvent::Disconnected) => {
                ctx.metrics.zk_session_connected.set(0);
            }
            EngineEvent::Session(SessionEvent::Reconnected | SessionEvent::Connected { .. }) => {
                ctx.metrics.zk_session_connected.set(1);
            }
            EngineEvent::Session(SessionEvent::Lost { .. }) => {
                ctx.metrics.zk_session_connected.set(0);
                ctx.metrics.zk_sessions_lost.inc();
                tracing::warn!("ZooKeeper session lost; opening a new one and re-anchoring");
                let renewed = (|| async {
                    ctx.engine.reconnect().await?;
                    anchor::reanchor_all(&ctx).await
                })
                .retry(REANCHOR_DELAYS)
                .sleep(tokio::time::sleep)
                .notify(|e, after| tracing::warn!(error = %e, ?after, "re-anchoring failed; retrying"))
                .await;
                // Retried without limit: only a stopped controller (which drops this task) ends it.
                if let Err(e) = renewed {
                    tracing::error!(error = %e, "re-anchoring gave up");
                    return;
                }
                ctx.trigger_all();
            }
        }
    }
}

async fn refresh_positions(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(POSITIONS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !ctx.admitting() {
            continue;
        }
        for lock in ctx.registry.locks_with_waiters() {
            // Changed positions come back as engine events, and so as reconciles.
            if let Err(e) = ctx.engine.refresh_positions(&lock, POSITIONS_PER_LOCK).await {
                tracing::debug!(lock, error = %e, "position refresh failed");
            }
        }
        ctx.metrics.observe_engine(ctx.engine.stats());
    }
}
