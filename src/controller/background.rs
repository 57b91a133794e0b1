//! The tasks that feed the controller besides its own watch: the lock engine's state changes,
//! holder pod changes, the session supervisor, and the batched position refresh.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{anchor, Context};
use crate::zk::{ContenderState, EngineEvent, SessionEvent};

/// Waiters whose position is refreshed per lock and round: the front of a long queue is
/// kept exact, the rest is refreshed as it moves up. Bounds the API writes positions cost.
pub const POSITIONS_PER_LOCK: usize = 10;
pub const POSITIONS_EVERY: Duration = Duration::from_secs(2);

/// Spawns them into `tasks`, which ends them when it is dropped.
pub fn spawn(tasks: &mut JoinSet<()>, ctx: Arc<Context>, engine_events: mpsc::UnboundedReceiver<EngineEvent>) {
    tasks.spawn(follow_engine(ctx.clone(), engine_events));
    tasks.spawn(follow_pods(ctx.clone()));
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
                let mut delay = Duration::from_millis(200);
                loop {
                    let result = match ctx.engine.reconnect().await {
                        Ok(()) => anchor::reanchor_all(&ctx).await,
                        Err(e) => Err(e.into()),
                    };
                    match result {
                        Ok(()) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "re-anchoring failed; retrying");
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_secs(10));
                        }
                    }
                }
                for uid in ctx.registry.all() {
                    ctx.trigger(&uid);
                }
            }
        }
    }
}

/// Any change to a pod that holds a claim reconciles that claim, which reads the pod afresh.
/// After a re-list every claim with a holder is looked at, in case a deletion was missed.
async fn follow_pods(ctx: Arc<Context>) {
    let apis: Vec<Api<Pod>> = if ctx.namespaces.is_empty() {
        vec![Api::all(ctx.client.clone())]
    } else {
        ctx.namespaces.iter().map(|ns| Api::namespaced(ctx.client.clone(), ns)).collect()
    };
    let streams = apis.into_iter().map(|api| watcher(api, watcher::Config::default()).boxed());
    let mut events = futures::stream::select_all(streams);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::Delete(pod) | watcher::Event::InitApply(pod)) => {
                let namespace = pod.namespace().unwrap_or_default();
                for uid in ctx.registry.claims_of_pod(&namespace, &pod.name_any()) {
                    ctx.trigger(&uid);
                }
            }
            Ok(watcher::Event::InitDone) => {
                for uid in ctx.registry.claims_with_holders() {
                    ctx.trigger(&uid);
                }
            }
            Ok(watcher::Event::Init) => {}
            Err(e) => {
                tracing::debug!(error = %e, "pod watch error; the watcher retries");
                tokio::time::sleep(Duration::from_millis(500)).await;
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
