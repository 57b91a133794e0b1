//! The session supervisor: the one owner of the way from a ZooKeeper session to serving claims
//! — open the session and take the leader epoch, let the watches list the claims, re-anchor,
//! admit, be ready — at the start of a leader's term and again after every lost session. It
//! follows the engine's event stream (contender changes become reconciles), and it is the
//! only writer of readiness: through a [`Term`], whose writes are void once a newer term began.

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{anchor, Context, Error};
use crate::leader::Leadership;
use crate::zk::{ContenderState, EngineEvent, LockEngine, SessionEvent, ZkConfig};

/// The leader epoch's node below the ZooKeeper root (DESIGN.md §5a).
pub const EPOCH_NODE: &str = "leader-epoch";

/// The least lease time left in which the leader epoch is taken (the bump's own time included).
const EPOCH_MARGIN: Duration = Duration::from_secs(1);

/// Between attempts to open a new session and re-anchor: a ZooKeeper outage is waited out
/// without limit, at most 10 s apart.
const REANCHOR_DELAYS: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(200))
    .with_max_delay(Duration::from_secs(10))
    .with_jitter()
    .without_max_times();

/// What `/readyz` answers: a standby is ready (healthy, waiting to lead); a leader only while
/// its session is re-anchored and admitting.
pub struct Readiness(Mutex<Stage>);

struct Stage {
    /// Terms begun so far (0: none yet, a standby).
    term: u64,
    ready: bool,
}

impl Default for Readiness {
    /// A process starts as a standby.
    fn default() -> Self {
        Readiness(Mutex::new(Stage { term: 0, ready: true }))
    }
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.0.lock().ready
    }

    /// Not ready for good: the process is about to end with an error.
    pub fn fail(&self) {
        let mut stage = self.0.lock();
        stage.term = u64::MAX;
        stage.ready = false;
    }
}

/// One leader's term, as readiness sees it. A term's writes are void once a newer term began:
/// a deposed leader's tasks, aborted but not yet stopped, cannot mark the next term ready.
#[derive(Clone)]
pub struct Term {
    readiness: Arc<Readiness>,
    id: u64,
}

impl Term {
    /// Begins a term: not ready until its session is re-anchored.
    pub fn begin(readiness: &Arc<Readiness>) -> Term {
        let mut stage = readiness.0.lock();
        stage.term = stage.term.saturating_add(1);
        stage.ready = false;
        Term { readiness: readiness.clone(), id: stage.term }
    }

    /// Ends the term: the process is a standby again, and ready.
    pub fn end(self) {
        self.set(true);
    }

    fn set(&self, ready: bool) {
        let mut stage = self.readiness.0.lock();
        if stage.term == self.id {
            stage.ready = ready;
        }
    }
}

/// Opens the new leader's ZooKeeper session and takes the leader epoch, so that a deposed
/// leader's writes fail from now on. The epoch is taken only while the lease is still ours.
pub async fn connect(
    config: &ZkConfig,
    zk_root: &str,
    identity: &str,
    leadership: &Leadership,
) -> Result<(LockEngine, mpsc::UnboundedReceiver<EngineEvent>), Error> {
    let (engine, events) = LockEngine::connect_with_events(config.clone()).await?;
    // The bump must be over while the lease is ours, with time to spare: a bump that lands
    // after a successor's would fence the successor. A successor can only take over once our
    // lease has run out by its own clock (longer than our renew deadline), so a bump finished
    // within our time left is before any successor's.
    let left = leadership.time_left().filter(|left| *left > EPOCH_MARGIN).ok_or(Error::NotLeading)?;
    let epoch_path = format!("{}/{EPOCH_NODE}", zk_root.trim_end_matches('/'));
    let epoch = tokio::time::timeout(left - EPOCH_MARGIN, engine.take_epoch(&epoch_path, identity))
        .await
        .map_err(|_| Error::NotLeading)??;
    if !leadership.is_leading() {
        return Err(Error::NotLeading);
    }
    tracing::info!(epoch, path = %epoch_path, "took the leader epoch");
    Ok((engine, events))
}

/// The first re-anchoring of the term, once every scope's watch has listed its claims: then
/// the session admits, the term is ready, and every claim is reconciled.
pub(super) async fn first_anchor(ctx: &Context, term: &Term) -> Result<(), Error> {
    ctx.wait_synced().await;
    anchor::reanchor_all(ctx).await?;
    ctx.anchored.store(true, std::sync::atomic::Ordering::SeqCst);
    term.set(true);
    ctx.trigger_all();
    Ok(())
}

/// Follows the engine: contender changes trigger their claim; a lost session is replaced and
/// re-anchored (not ready meanwhile).
pub(super) async fn follow(ctx: Arc<Context>, mut events: mpsc::UnboundedReceiver<EngineEvent>, term: Term) {
    ctx.metrics.zk_session_connected.set(1);
    while let Some(event) = events.recv().await {
        match event {
            // A release is always the operator's own doing, by the reconcile that asked for
            // it: reconciling again would only redo its work from a copy of the claim that may
            // not show it yet (a finalizer removal, say).
            EngineEvent::Contender { state: ContenderState::Released, .. } => {}
            EngineEvent::Contender { id, .. } => ctx.trigger(&id),
            EngineEvent::Session(SessionEvent::Disconnected) => {
                ctx.metrics.zk_session_connected.set(0);
            }
            EngineEvent::Session(SessionEvent::Reconnected | SessionEvent::Connected { .. }) => {
                ctx.metrics.zk_session_connected.set(1);
            }
            EngineEvent::Session(SessionEvent::Lost { .. }) => {
                ctx.metrics.zk_session_connected.set(0);
                ctx.metrics.zk_sessions_lost.inc();
                term.set(false);
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
                term.set(true);
                ctx.trigger_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_is_ready_a_term_only_once_serving_and_an_old_term_writes_nothing() {
        let readiness = Arc::new(Readiness::default());
        assert!(readiness.is_ready(), "a standby");
        let first = Term::begin(&readiness);
        assert!(!readiness.is_ready(), "leading, not yet re-anchored");
        first.set(true);
        assert!(readiness.is_ready());
        let stale = first.clone();
        first.end();
        let second = Term::begin(&readiness);
        stale.set(true);
        assert!(!readiness.is_ready(), "the deposed term's late write is void");
        second.set(true);
        stale.set(false);
        assert!(readiness.is_ready());
    }
}
