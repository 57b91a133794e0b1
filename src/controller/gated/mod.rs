//! Pods gated on a lock (the rules are in `plan`): per served scope, a kube-runtime
//! `Controller` over the pods not yet bound to a node (the field selection `spec.nodeName=`:
//! its store holds the pods waiting to be scheduled, kept small by `KeptPod`, not every pod of
//! the cluster), driven also by the changes of the claims made for them.
//!
//! Reconcile is a pipeline: dereference (the pod's claim from the claim watch's store, and the
//! operator's own last word on it) → plan (pure) → apply (make the claim, delete a predecessor's,
//! remove the gate) → report (the pod's condition, and an event when it changes).

pub mod plan;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde_json::json;
use tracing::Instrument;

use plan::{Known, PodPlan, Report, Step, GATE};

use super::admission::Turn;
use super::arrivals::Arrivals;
pub use super::base::kept_pod::KeptPod;
use super::base::kept_pod::CONDITION;
use super::base::{Error, Uid};
use super::registry::Registry;
use super::serving::Serving;
use super::stores::Stores;
use super::triggers::Triggers;
use super::writer::Answer;
use super::writer::ApiWriter;
use crate::api::{LockClaim, Phase};
use crate::metrics::Metrics;
use crate::zk::{Layout, LockEngine};

/// What the gated pods' controller works with: the capabilities it shares with the claims'
/// pipeline, and the pods' own arrivals.
pub struct Ctx {
    pub writer: Arc<ApiWriter>,
    pub engine: LockEngine,
    pub layout: Layout,
    pub metrics: Arc<Metrics>,
    /// Read only: what the claims' pipeline last wrote, and whether this term judged a hold.
    pub registry: Arc<Registry>,
    pub serving: Arc<Serving>,
    pub stores: Arc<Stores>,
    pub triggers: Arc<Triggers>,
    /// Gated pods waiting to have their claims made, in creation order.
    pub arrivals: parking_lot::Mutex<Arrivals>,
}

impl AsRef<Metrics> for Ctx {
    fn as_ref(&self) -> &Metrics {
        &self.metrics
    }
}

/// The pods of one scope that no node runs yet, kept in `writer`'s store, as the controller's
/// trigger stream. A pod with a valid lock request arrives, in the order the watch delivers
/// pods, at its lock's gate for claim making.
pub fn pods(
    ctx: Arc<Ctx>,
    api: Api<KeptPod>,
    writer: Writer<KeptPod>,
) -> impl Stream<Item = Result<KeptPod, watcher::Error>> + Send + 'static {
    // The pods of the listing under way: those it leaves out are gone.
    let mut listed: HashSet<Uid> = HashSet::new();
    watcher(api, watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECONDS).fields("spec.nodeName="))
        .default_backoff()
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::InitApply(pod)) => {
                listed.insert(pod.uid().into());
                arrive(&ctx, pod);
            }
            Ok(watcher::Event::Apply(pod)) => arrive(&ctx, pod),
            Ok(watcher::Event::Delete(pod)) => leave(&ctx, pod.uid()),
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitDone) => {
                let next = ctx.arrivals.lock().keep_listed(&std::mem::take(&mut listed));
                for pod in next {
                    ctx.triggers.pod(pod);
                }
            }
            Err(e) => tracing::warn!(error = %e, "watch of unscheduled pods failed; retrying"),
        })
        .applied_objects()
}

/// The pod leaves its lock's gate for claim making; the next one there may go.
/// A gated pod that asks for a lock takes its place at the lock's gate.
fn arrive(ctx: &Ctx, pod: &KeptPod) {
    if let (true, Ok(ask)) = (pod.gates.iter().any(|g| g == GATE), plan::read(pod)) {
        let locks = ask.locks.iter().map(|l| ctx.layout.lock(pod.namespace(), l)).collect();
        ctx.arrivals.lock().arrive(locks, pod);
    }
}

fn leave(ctx: &Ctx, uid: &str) {
    let next = ctx.arrivals.lock().leave(uid);
    for pod in next {
        ctx.triggers.pod(pod);
    }
}

pub async fn reconcile(pod: Arc<KeptPod>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let claim_uid = ctx.stores.claim(pod.namespace(), pod.name()).and_then(|c| c.metadata.uid.clone());
    let serves = |uid: &str| ctx.serving.serves(&ctx.registry.shared_uid(uid, &ctx.engine), &ctx.registry, &ctx.engine);
    if !claim_uid.is_some_and(|uid| serves(&uid)) && !ctx.serving.anchored() {
        // Until its locks are re-anchored a claim's Held may still turn out Lost: no gate goes.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if ctx.writer.leadership().draining() {
        // Being uninstalled: no claim made (it would outlive the operator with its finalizer),
        // no gate removed (the claims are being deleted under their pods).
        return Ok(Action::await_change());
    }
    ctx.metrics.gated_reconciles.inc();
    let span = tracing::info_span!("gated_pod", pod = pod.name(), namespace = pod.namespace());
    apply(pod, ctx).instrument(span).await
}

/// Whether this term has judged claim `uid`'s hold (see [`Known::judged`]): no verdict of a
/// re-anchoring pass on it, every lock of it admitting in this session (a pass judging it has
/// ended: verdicts are recorded before a judged lock admits), and, with leader election, its
/// status written by this term (the walk's stamp or the grant itself); and ZooKeeper within
/// reach (out of it, a hold in a lock others share is about to end `Lost`).
fn judged_hold(ctx: &Ctx, uid: &str) -> bool {
    !ctx.engine.out_of_reach()
        && ctx.registry.verdict(uid).is_none()
        && (ctx.engine.epoch().is_none() || ctx.registry.written(uid))
        && ctx
            .registry
            .lock_paths(uid)
            .is_some_and(|locks| !locks.is_empty() && ctx.engine.admitting_in(locks.iter().map(|lock| &**lock)))
}

async fn apply(pod: Arc<KeptPod>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let claim = ctx.stores.claim(pod.namespace(), pod.name());
    let known = claim.as_ref().and_then(|c| c.metadata.uid.as_deref()).map_or_else(Known::default, |uid| Known {
        held: ctx.registry.known_phase(uid) == Some(Phase::Held),
        judged: judged_hold(&ctx, uid),
        epoch: ctx.engine.epoch(),
    });
    let PodPlan { step, mut report } = plan::plan(&pod, claim.as_deref(), known);
    if !matches!(step, Step::Create { .. }) {
        leave(&ctx, pod.uid());
    }
    let action = match step {
        Step::Nothing => Action::await_change(),
        // The claim's next write (the walk's stamp, a verdict's Lost, a revocation) triggers
        // the pod too; a later session's pass may end without one.
        Step::Recheck => Action::requeue(Duration::from_secs(1)),
        Step::Create { locks, claim } => {
            let locks = locks.iter().map(|l| ctx.layout.lock(pod.namespace(), l)).collect();
            let (turn, overtaken) = ctx.arrivals.lock().may_create(locks, &pod);
            ctx.metrics.count_overtaken(&overtaken);
            if let Turn::Behind(wait) = turn {
                // An older pod of the same lock gets its claim first; it triggers this one (the
                // requeue: for when it runs out of patience at the gate instead).
                return Ok(Action::requeue(wait));
            }
            let api: Api<LockClaim> = Api::namespaced(ctx.writer.client().clone(), pod.namespace());
            let created = ctx.writer.write("create_claim", api.create(&PostParams::default(), &claim)).await;
            if let Answer::Unanswered(e) = created {
                // It may have been made: the retry's answer (409 then) lets the pod's place go.
                return Err(e);
            }
            leave(&ctx, pod.uid());
            match created {
                Answer::Refused { status, .. } if status.code == 422 || status.code == 400 => {
                    let message = format!("the LockClaim for this pod was refused: {}", status.message);
                    report = Some(Report { acquired: false, reason: "ClaimRefused", message, warning: true });
                }
                // 409: made already (the watch has not brought it yet).
                created => {
                    if created.expecting(&[409])?.is_some() {
                        tracing::info!(lock = %claim.spec.lock_label(), "made a claim for the gated pod");
                    }
                }
            }
            Action::await_change()
        }
        Step::DeleteStale { uid } => {
            let api: Api<LockClaim> = Api::namespaced(ctx.writer.client().clone(), pod.namespace());
            let only = DeleteParams {
                preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
                ..DeleteParams::default()
            };
            // 404/409: gone already, or another claim of that name.
            if ctx.writer.write("delete_claim", api.delete(pod.name(), &only)).await.expecting(&[404, 409])?.is_some() {
                tracing::info!("deleted the claim an earlier pod of this name left");
            }
            // Its deletion (the finalizer releases its node first) comes back as a watch event.
            Action::requeue(Duration::from_secs(5))
        }
        Step::End { phase, reason, message } => {
            end(&ctx, &pod, phase, reason, &message).await?;
            Action::await_change()
        }
        Step::Ungate { index } => {
            if !ungate(&ctx, &pod, index).await? {
                // The copy was out of date (gates changed, or another pod of this name).
                return Ok(Action::requeue(Duration::from_millis(100)));
            }
            Action::await_change()
        }
    };
    if let Some(report) = report.filter(|r| !r.is_shown_by(pod.condition.as_ref())) {
        show(&ctx, &pod, &report).await?;
    }
    Ok(action)
}

/// Removes zklock's gate, by a JSON patch that first tests the pod's UID and the gate's name at
/// that index: a stale copy, or a gate list changed since, fails the test instead of removing
/// another gate (the API server refuses to add gates back). False: the test failed.
async fn ungate(ctx: &Ctx, pod: &KeptPod, index: usize) -> Result<bool, Error> {
    let path = format!("/spec/schedulingGates/{index}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/metadata/uid", "value": pod.uid() },
        { "op": "test", "path": format!("{path}/name"), "value": GATE },
        { "op": "remove", "path": path },
    ]))
    .map_err(Error::StatusPatch)?;
    let api: Api<Pod> = Api::namespaced(ctx.writer.client().clone(), pod.namespace());
    let removed =
        ctx.writer.write("ungate_pod", api.patch(pod.name(), &PatchParams::default(), &Patch::Json::<()>(patch))).await;
    // 422/409/404: the test failed, or the pod is gone.
    if let Answer::Refused { status, .. } = &removed {
        tracing::debug!(answer = %status.message, "gate removal refused; looking again");
    }
    if removed.expecting(&[422, 409, 404])?.is_none() {
        return Ok(false);
    }
    tracing::info!("removed the scheduling gate: the pod holds its lock");
    ctx.metrics.pods_ungated.inc();
    Ok(true)
}

/// Ends a pod that never started and never will (skip if held, newest wins): its status as a
/// kubelet would write it, phase `Succeeded` or `Failed`, with the condition `zklock.io/Skipped`
/// saying why (what a Job's `podFailurePolicy` matches) and `zklock.io/LockAcquired` False. The
/// patch carries the pod's UID, so a stale copy (another pod of this name) is refused.
async fn end(ctx: &Ctx, pod: &KeptPod, phase: &str, reason: &str, message: &str) -> Result<(), Error> {
    let now = Timestamp::now().to_string();
    let condition = |type_: &str, status: &str| json!({ "type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now });
    let patch = json!({
        "metadata": { "uid": pod.uid() },
        "status": { "phase": phase, "conditions": [condition(plan::SKIPPED, "True"), condition(CONDITION, "False")] },
    });
    let api: Api<Pod> = Api::namespaced(ctx.writer.client().clone(), pod.namespace());
    let written = ctx
        .writer
        .write("end_pod", api.patch_status(pod.name(), &PatchParams::default(), &Patch::Strategic(patch)))
        .await;
    // 404/409/422: gone, or another pod of this name; the watch brings what is there now.
    if written.expecting(&[404, 409, 422])?.is_some() {
        tracing::info!(phase, reason, "ended the gated pod without starting it");
        ctx.writer.publish(&pod.object_ref(&()), false, "Skipped", message).await;
    }
    Ok(())
}

/// Writes the pod's condition (a strategic merge patch: other conditions stay), and a problem
/// also as a Warning event. Waiting and Acquired are not events: the claim has its own, and a
/// handoff costs one write fewer.
async fn show(ctx: &Ctx, pod: &KeptPod, report: &Report) -> Result<(), Error> {
    let status = if report.acquired { "True" } else { "False" };
    let since = match &pod.condition {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => None,
    };
    let since = since.map_or_else(|| Timestamp::now().to_string(), |t| t.0.to_string());
    let patch = json!({ "status": { "conditions": [{
        "type": CONDITION, "status": status, "reason": report.reason, "message": report.message,
        "lastTransitionTime": since,
    }]}});
    let api: Api<Pod> = Api::namespaced(ctx.writer.client().clone(), pod.namespace());
    let written = ctx
        .writer
        .write("patch_pod_status", api.patch_status(pod.name(), &PatchParams::default(), &Patch::Strategic(patch)))
        .await;
    if written.expecting(&[404])?.is_none() {
        // The pod is gone.
        return Ok(());
    }
    if !report.warning {
        return Ok(());
    }
    // Events are for people; the condition carries the truth.
    ctx.writer.publish(&pod.object_ref(&()), report.warning, report.reason, &report.message).await;
    Ok(())
}
