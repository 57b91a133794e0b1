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
pub use super::base::kept_pod::KeptPod;
use super::base::kept_pod::CONDITION;
use super::base::{Error, Uid};
use super::context::Context;
use crate::api::{LockClaim, Phase};

/// The pods of one scope that no node runs yet, kept in `writer`'s store, as the controller's
/// trigger stream. A pod with a valid lock request arrives, in the order the watch delivers
/// pods, at its lock's gate for claim making.
pub fn pods(
    ctx: Arc<Context>,
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
fn arrive(ctx: &Context, pod: &KeptPod) {
    if let (true, Ok(ask)) = (pod.gates.iter().any(|g| g == GATE), plan::read(pod)) {
        let locks = ask.locks.iter().map(|l| ctx.layout.lock(pod.namespace(), l)).collect();
        ctx.arrivals.lock().arrive(locks, pod);
    }
}

fn leave(ctx: &Context, uid: &str) {
    let next = ctx.arrivals.lock().leave(uid);
    for pod in next {
        ctx.triggers.pod(pod);
    }
}

pub async fn reconcile(pod: Arc<KeptPod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let claim_uid = ctx.stores.claim(pod.namespace(), pod.name()).and_then(|c| c.metadata.uid.clone());
    if !claim_uid.is_some_and(|uid| ctx.serves(&ctx.shared_uid(&uid))) && !ctx.serving.anchored() {
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
fn judged_hold(ctx: &Context, uid: &str) -> bool {
    !ctx.engine.out_of_reach()
        && ctx.registry.verdict(uid).is_none()
        && (ctx.epoch().is_none() || ctx.registry.written(uid))
        && ctx
            .registry
            .lock_paths(uid)
            .is_some_and(|locks| !locks.is_empty() && ctx.engine.admitting_in(locks.iter().map(|lock| &**lock)))
}

async fn apply(pod: Arc<KeptPod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let claim = ctx.stores.claim(pod.namespace(), pod.name());
    let known = claim.as_ref().and_then(|c| c.metadata.uid.as_deref()).map_or_else(Known::default, |uid| Known {
        held: ctx.registry.known_phase(uid) == Some(Phase::Held),
        judged: judged_hold(&ctx, uid),
        epoch: ctx.epoch(),
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
            let created = ctx.writer.write("create_claim", api.create(&PostParams::default(), &claim)).await?;
            leave(&ctx, pod.uid());
            match created {
                // 409: made already (the watch has not brought it yet).
                Ok(_) => tracing::info!(lock = %claim.spec.lock_label(), "made a claim for the gated pod"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => {
                    let message = format!("the LockClaim for this pod was refused: {}", s.message);
                    report = Some(Report { acquired: false, reason: "ClaimRefused", message, warning: true });
                }
                Err(source) => return Err(Error::Write { call: "create_claim", source }),
            }
            Action::await_change()
        }
        Step::DeleteStale { uid } => {
            let api: Api<LockClaim> = Api::namespaced(ctx.writer.client().clone(), pod.namespace());
            let only = DeleteParams {
                preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
                ..DeleteParams::default()
            };
            match ctx.writer.write("delete_claim", api.delete(pod.name(), &only)).await? {
                Ok(_) => tracing::info!("deleted the claim an earlier pod of this name left"),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(source) => return Err(Error::Write { call: "delete_claim", source }),
            }
            // Its deletion (the finalizer releases its node first) comes back as a watch event.
            Action::requeue(Duration::from_secs(5))
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
async fn ungate(ctx: &Context, pod: &KeptPod, index: usize) -> Result<bool, Error> {
    let path = format!("/spec/schedulingGates/{index}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/metadata/uid", "value": pod.uid() },
        { "op": "test", "path": format!("{path}/name"), "value": GATE },
        { "op": "remove", "path": path },
    ]))
    .map_err(Error::StatusPatch)?;
    let api: Api<Pod> = Api::namespaced(ctx.writer.client().clone(), pod.namespace());
    match ctx
        .writer
        .write("ungate_pod", api.patch(pod.name(), &PatchParams::default(), &Patch::Json::<()>(patch)))
        .await?
    {
        Ok(_) => {
            tracing::info!("removed the scheduling gate: the pod holds its lock");
            ctx.metrics.pods_ungated.inc();
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 || s.code == 404 => {
            tracing::debug!(answer = %s.message, "gate removal refused; looking again");
            Ok(false)
        }
        Err(source) => Err(Error::Write { call: "ungate_pod", source }),
    }
}

/// Writes the pod's condition (a strategic merge patch: other conditions stay), and a problem
/// also as a Warning event. Waiting and Acquired are not events: the claim has its own, and a
/// handoff costs one write fewer.
async fn show(ctx: &Context, pod: &KeptPod, report: &Report) -> Result<(), Error> {
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
    match ctx
        .writer
        .write("patch_pod_status", api.patch_status(pod.name(), &PatchParams::default(), &Patch::Strategic(patch)))
        .await?
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(source) => return Err(Error::Write { call: "patch_pod_status", source }),
    }
    if !report.warning {
        return Ok(());
    }
    // Events are for people; the condition carries the truth.
    ctx.writer.publish(&pod.object_ref(&()), report.warning, report.reason, &report.message).await;
    Ok(())
}
