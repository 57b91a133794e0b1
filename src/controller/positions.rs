//! The batched position refresh. Waiters are not woken when somebody far ahead of them leaves
//! (that is the point of the recipe), so the `position` in their status goes stale; every
//! [`EVERY`] the front of each queue is brought up to date with one read of its directory.

use std::sync::Arc;
use std::time::Duration;

use super::context::Context;

/// Waiters whose position is refreshed per lock and round: the front of a long queue is
/// kept exact, the rest is refreshed as it moves up. Bounds the API writes positions cost.
const PER_LOCK: usize = 10;
const EVERY: Duration = Duration::from_secs(2);

pub(super) async fn refresh(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !ctx.admitting() {
            continue;
        }
        for lock in ctx.registry.locks_with_waiters() {
            // Changed positions come back as engine events, and so as reconciles.
            if let Err(e) = ctx.engine.refresh_positions(&lock, PER_LOCK).await {
                tracing::debug!(lock, error = %e, "position refresh failed");
            }
        }
    }
}
