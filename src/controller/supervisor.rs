//! The session supervisor: the one owner of the way from a ZooKeeper session to serving claims
//! — open the session and take the leader epoch, let the watches list the claims, re-anchor,
//! admit, be ready — at the start of a leader's term and again after every lost session. It
//! follows the engine's event stream (contender changes become reconciles), and it is the
//! only writer of readiness: through a [`Term`], whose writes are void once a newer term began.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::anchor;
use super::base::Error;
use super::context::Context;
use crate::leader::Leadership;
use crate::zk::{ContenderState, EngineEvent, Installation, Layout, LockEngine, SessionEvent, ZkConfig};

/// The least lease time left in which the leader epoch is taken (the bump's own time included).
const EPOCH_MARGIN: Duration = Duration::from_secs(1);

/// Between attempts to open a new session and re-anchor, within [`serve_bound`].
const REANCHOR_DELAYS: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(200))
    .with_max_delay(Duration::from_secs(2))
    .with_jitter()
    .without_max_times();

/// How long ZooKeeper may stay out of a leader's reach (its session disconnected, then lost
/// and not replaced and re-anchored) before it gives up the term (docs/design.md: liveness):
/// twice the session timeout, at least 5 s. A ZooKeeper that this leader cannot reach may well be reachable from a standby, which
/// takes over once the lease is given up; waiting it out without limit while renewing the
/// lease froze every lock, even holders whose pods went, for as long as the cut lasted.
pub fn serve_bound(session_timeout: Duration) -> Duration {
    (session_timeout * 2).max(Duration::from_secs(5))
}

/// What `/readyz` answers: a standby is ready (healthy, waiting to lead) once it has listed the
/// claims (so that a rolling update hands over to a replica that can lead at once); a leader
/// only while its session is re-anchored and admitting; a replica that just gave up a term
/// because it could not serve is not, until its pause before contending again is over (it says
/// why).
pub struct Readiness(Mutex<Stage>);

struct Stage {
    /// Terms begun so far (0: none yet, a standby).
    term: u64,
    ready: bool,
    /// Why the last term was given up, while that still stands.
    unable: Option<String>,
    /// Whether the process's claim watch has listed the claims once (see `feed`).
    listed: bool,
}

impl Default for Readiness {
    /// A process starts as a standby that has not listed the claims yet.
    fn default() -> Self {
        Readiness(Mutex::new(Stage { term: 0, ready: true, unable: None, listed: false }))
    }
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        let stage = self.0.lock();
        stage.ready && stage.listed
    }

    /// Why this replica is not ready, if it gave up a term it could not serve (or has not
    /// listed the claims yet).
    pub fn unable(&self) -> Option<String> {
        let stage = self.0.lock();
        stage.unable.clone().or_else(|| (!stage.listed).then(|| "the claims are not listed yet".to_string()))
    }

    /// The process's claim watch has listed the claims.
    pub fn listed(&self) {
        self.0.lock().listed = true;
    }

    /// The last term was given up because this replica could not serve it (`why`), or that
    /// no longer stands (`None`: a standby again).
    pub fn set_unable(&self, why: Option<String>) {
        let mut stage = self.0.lock();
        stage.ready = why.is_none();
        stage.unable = why;
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
        stage.unable = None;
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
    layout: &Layout,
    installation: Installation,
    leadership: &Leadership,
    floor: &super::token_floor::TokenFloor,
) -> Result<(LockEngine, mpsc::UnboundedReceiver<EngineEvent>), Error> {
    let (engine, events) = LockEngine::connect_with_events(config.clone()).await?;
    // The root first: a leader of another installation is refused before it takes anything.
    let identity = installation.holder.clone();
    engine.take_root(layout, installation).await?;
    // The bump must be over while the lease is ours, with time to spare: a bump that lands
    // after a successor's would fence the successor. A successor can only take over once our
    // lease has run out by its own clock (longer than our renew deadline), so a bump finished
    // within our time left is before any successor's.
    let left = leadership.time_left().filter(|left| *left > EPOCH_MARGIN).ok_or(Error::NotLeading)?;
    let epoch = tokio::time::timeout(left - EPOCH_MARGIN, engine.take_epoch(&layout.epoch(), &identity))
        .await
        .map_err(|_| Error::NotLeading)??;
    if !leadership.is_leading() {
        return Err(Error::NotLeading);
    }
    // Every number of the term (its epoch first) above every one handed out before it, also
    // when ZooKeeper's data were made anew meanwhile; then the floor reserved ahead of them.
    let base = engine.take_token_base(layout, floor.reserved(), floor.last_epoch()).await?;
    let epoch = engine.epoch().unwrap_or(epoch);
    floor.begin_term(epoch).await?;
    tracing::info!(epoch, base, path = %layout.epoch(), "took the leader epoch");
    Ok((engine, events))
}

/// The first re-anchoring of the term, once every scope's watch has listed its claims (they
/// need not have been replayed into the term yet) and its `Lock`s and `ClusterLock`s: then
/// the session admits in every lock and the term is ready (the caller then has every claim
/// reconciled). Answers the engine's session events that came meanwhile, for [`follow`].
pub(super) async fn first_anchor(
    ctx: &Context,
    term: &Term,
    events: &mut mpsc::UnboundedReceiver<EngineEvent>,
) -> Result<VecDeque<EngineEvent>, Error> {
    // What every lock's permits are; the claims are in the feed's stores already (the term
    // began once they had synced), the pass notes each in the registry itself.
    ctx.serving.wait_limits_listed().await;
    let started = std::time::Instant::now();
    let mut kept = VecDeque::new();
    let pass = async {
        anchor::reanchor_all(ctx).await?;
        // Every claim the replay brings is served from now on: it must have brought them all
        // (a claim created after the pass listed the stores, say).
        ctx.serving.wait_synced().await;
        Ok::<_, Error>(())
    };
    while_reanchoring(ctx, events, &mut kept, pass).await?;
    tracing::info!(took = ?started.elapsed(), "re-anchored every lock; admitting");
    // Every claim is reconciled now (the caller's walk): none waits as deferred any more.
    ctx.serving.set_anchored();
    // Ready only if the session the pass re-anchored is still admitting: one lost while the
    // replay was awaited is renewed by `follow` (its event is kept), which makes it ready then.
    if ctx.engine.admitting() {
        term.set(true);
    }
    Ok(kept)
}

/// Runs `pass`, a re-anchoring, while following the engine's events: a lock admits new
/// contenders as soon as the pass re-anchored it, and its claims are served from then on, so a
/// contender's change there (the next in line after a holder let go, say) is reconciled at once.
/// A change in a lock before the engine reported it admitted ([`EngineEvent::Admitted`], in
/// the same stream, so in order) is the pass's own doing (every node it re-makes reports one),
/// which the walk after the pass covers (see [`after_reanchoring`]): as triggers they would all
/// stand in the queue ahead of the claims that asked for something. Session events are kept,
/// in order, for after the pass.
async fn while_reanchoring<T>(
    ctx: &Context,
    events: &mut mpsc::UnboundedReceiver<EngineEvent>,
    kept: &mut VecDeque<EngineEvent>,
    pass: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(pass);
    // Locks the engine reported admitted, in the session of the pass under way.
    let mut admitted: std::collections::HashSet<String> = Default::default();
    loop {
        tokio::select! {
            biased;
            Some(event) = events.recv() => match event {
                EngineEvent::Contender { state: ContenderState::Released, .. } => {}
                EngineEvent::Contender { id, .. } => {
                    let node = ctx.engine.node(&id);
                    let lock = node.as_deref().and_then(|node| node.rsplit_once('/')).map(|(lock, _)| lock);
                    let change = lock.is_some_and(|lock| {
                        admitted.contains(lock) || (ctx.engine.admitting_in([lock]) && !ctx.engine.reanchored_by_pass(lock))
                    });
                    if change {
                        ctx.trigger(&id);
                    }
                }
                EngineEvent::Admitted { lock_path } => {
                    admitted.insert(lock_path);
                }
                other => {
                    if matches!(other, EngineEvent::Session(_)) {
                        // A new session's pass re-makes the nodes of every lock again.
                        admitted.clear();
                    }
                    kept.push_back(other)
                }
            },
            done = &mut pass => return done,
        }
    }
}

/// Follows the engine: contender changes trigger their claim; a lost session is replaced and
/// re-anchored (not ready meanwhile). Ends the term with [`Error::CannotServe`] when that does
/// not succeed within [`serve_bound`].
pub(super) async fn follow(
    ctx: Arc<Context>,
    mut events: mpsc::UnboundedReceiver<EngineEvent>,
    kept: VecDeque<EngineEvent>,
    term: Term,
) -> Result<(), Error> {
    ctx.metrics.zk_session_connected.set(1);
    let bound = serve_bound(ctx.engine.session_timeout());
    // Since when ZooKeeper has been out of this leader's reach: the bound counts from there,
    // not from the session's end, which the client reports only 7/5 of its timeout later.
    let mut out_of_reach: Option<Instant> = None;
    let mut pending = kept;
    pending.extend(after_reanchoring(&ctx, &mut events));
    loop {
        let deadline = out_of_reach.map(|since| since + bound);
        let event = match pending.pop_front() {
            Some(event) => event,
            None => tokio::select! {
                event = events.recv() => match event {
                    Some(event) => event,
                    // The engine is gone: the term is ending.
                    None => return Ok(()),
                },
                _ = sleep_until(deadline) => {
                    return Err(Error::CannotServe(format!("ZooKeeper out of reach for {bound:?}")));
                }
            },
        };
        match event {
            // A release is always the operator's own doing, by the reconcile that asked for
            // it: reconciling again would only redo its work from a copy of the claim that may
            // not show it yet (a finalizer removal, say).
            EngineEvent::Contender { state: ContenderState::Released, .. } => {}
            EngineEvent::Contender { id, .. } => ctx.trigger(&id),
            // Followed while a pass runs (see `while_reanchoring`).
            EngineEvent::Admitted { .. } => {}
            EngineEvent::Permits { lock_path } => {
                if let Some(name) = lock_path.strip_prefix(&format!("{}/", ctx.layout.cluster_locks())) {
                    ctx.trigger_cluster_lock(name);
                }
            }
            EngineEvent::Session(SessionEvent::Disconnected) => {
                ctx.metrics.zk_session_connected.set(0);
                out_of_reach.get_or_insert_with(Instant::now);
            }
            EngineEvent::Session(SessionEvent::Reconnected | SessionEvent::Connected { .. }) => {
                ctx.metrics.zk_session_connected.set(1);
                out_of_reach = None;
            }
            EngineEvent::Session(SessionEvent::Lost { session_id })
                if ctx.engine.session_id().is_some_and(|live| live != session_id) =>
            {
                // Reported during a pass and replaced by it already (see `while_reanchoring`):
                // the live session, re-anchored, stays.
                tracing::debug!(session_id, "an earlier session's loss; its replacement is live");
            }
            EngineEvent::Session(SessionEvent::Lost { .. }) => {
                ctx.metrics.zk_session_connected.set(0);
                ctx.metrics.zk_sessions_lost.inc();
                term.set(false);
                tracing::warn!("ZooKeeper session lost; opening a new one and re-anchoring");
                let since = *out_of_reach.get_or_insert_with(Instant::now);
                let kept = renew(&ctx, &mut events, since, bound).await?;
                out_of_reach = None;
                term.set(true);
                pending.extend(kept);
                pending.extend(after_reanchoring(&ctx, &mut events));
            }
        }
    }
}

/// Replaces a lost session and re-anchors in the new one, retrying, until `bound` after ZooKeeper
/// went out of reach (`since`); the engine's events that came meanwhile, for [`follow`].
async fn renew(
    ctx: &Context,
    events: &mut mpsc::UnboundedReceiver<EngineEvent>,
    since: Instant,
    bound: Duration,
) -> Result<VecDeque<EngineEvent>, Error> {
    let last = Mutex::new(String::from("no attempt finished"));
    let renewed = (|| async {
        // A pass that failed while its session lives (a connection loss on one
        // lock, say) goes on in it: the locks it admitted keep the claims that
        // joined them (a new session would re-make their nodes, and in a directory
        // shared with others their new holders could not claim continuity).
        if ctx.engine.session_id().is_none() {
            ctx.engine.reconnect().await?;
        }
        anchor::reanchor_all(ctx).await
    })
    .retry(REANCHOR_DELAYS)
    .sleep(tokio::time::sleep)
    .notify(|e, after| {
        *last.lock() = e.to_string();
        tracing::warn!(error = %e, ?after, "re-anchoring failed; retrying")
    });
    let mut kept = VecDeque::new();
    let renewed = tokio::time::timeout_at(since + bound, renewed);
    match while_reanchoring(ctx, events, &mut kept, renewed).await {
        Ok(Ok(())) => Ok(kept),
        // Not leading any more, say: the term ends with it.
        Ok(Err(e)) => Err(e),
        Err(_) => {
            let why = format!(
                "ZooKeeper out of reach for {bound:?}: no new session re-anchored (last attempt: {})",
                last.lock()
            );
            Err(Error::CannotServe(why))
        }
    }
}

/// After a re-anchoring: asks for every claim to be reconciled (the walk, paced: see `pace`),
/// and answers the engine's events queued so far but its contenders' changes. Every one of the
/// thousands of nodes re-made reports one; as triggers they would all stand in the controller's
/// queue ahead of any claim that changes from now on. Dropping them is safe because they are
/// taken before the walk is asked for: it looks at the claims after it is asked, so every claim
/// is reconciled after any change dropped here. Session events are kept, in order.
fn after_reanchoring(ctx: &Context, events: &mut mpsc::UnboundedReceiver<EngineEvent>) -> VecDeque<EngineEvent> {
    let mut kept = VecDeque::new();
    while let Ok(event) = events.try_recv() {
        if !matches!(event, EngineEvent::Contender { .. } | EngineEvent::Admitted { .. }) {
            kept.push_back(event);
        }
    }
    ctx.triggers.all();
    kept
}

/// Sleeps until `deadline`, or for ever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_is_ready_a_term_only_once_serving_and_an_old_term_writes_nothing() {
        let readiness = Arc::new(Readiness::default());
        assert!(!readiness.is_ready(), "a standby that has not listed the claims yet");
        assert_eq!(readiness.unable().as_deref(), Some("the claims are not listed yet"));
        readiness.listed();
        assert!(readiness.is_ready(), "a standby");
        assert_eq!(readiness.unable(), None);
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
