//! A plan carried out, in the one order its parts may happen in: the term's stamp, the
//! revocation request in the claim's nodes, the holder pod's annotation, the status (the grant's
//! API half, `status_write`), the release of the nodes after the final status, the phase
//! gauges, the Events, and the deletion of a claim whose time to live has passed.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::plan::Plan;
use super::status_write;
use crate::api::{pod_revoke_annotation, LockClaim, LockClaimStatus, Phase};
use crate::controller::base::{ids, Error, Part};
use crate::controller::context::Context;

/// One effect of a plan; [`steps`] lists those a plan has, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// This term's epoch into the status (a cleanup that changes nothing is left as it is).
    Stamp,
    /// A revocation request into the claim's nodes, for other ZooKeeper clients to read.
    RequestRevocation,
    /// The holder pod told that its lock is revoked (best effort).
    AnnotatePod,
    /// The status, if it changed (see `status_write`).
    WriteStatus,
    /// The claim's nodes, every lock at once, after the final status.
    Release,
    /// The phase gauges.
    CountPhases,
    /// Events, for people (best effort).
    Publish,
    /// The claim deleted: its time to live after finishing has passed.
    Delete,
}

/// The steps `plan` takes, in order.
pub fn steps(plan: &Plan) -> Vec<Step> {
    let mut steps = vec![Step::Stamp];
    if plan.write_revoke.is_some() {
        steps.push(Step::RequestRevocation);
    }
    if plan.annotate_pod.is_some() {
        steps.push(Step::AnnotatePod);
    }
    steps.push(Step::WriteStatus);
    if plan.release {
        steps.push(Step::Release);
    }
    steps.push(Step::CountPhases);
    if !plan.events.is_empty() {
        steps.push(Step::Publish);
    }
    if plan.delete {
        steps.push(Step::Delete);
    }
    steps
}

/// Carries `plan` out for `claim` (its contenders `parts`); the answer says when to look again.
pub async fn run(ctx: &Context, uid: &str, parts: &[Part], claim: &LockClaim, mut plan: Plan) -> Result<Action, Error> {
    let mut before = LockClaimStatus::default();
    for step in steps(&plan) {
        match step {
            Step::Stamp => stamp(ctx, claim, &mut plan),
            Step::RequestRevocation => request_revocation(ctx, parts, &plan).await?,
            Step::AnnotatePod => annotate_pod(ctx, claim, &plan).await,
            Step::WriteStatus => before = status_write::run(ctx, uid, parts, claim, &mut plan).await?,
            Step::Release => release(ctx, parts, before.phase == Some(Phase::Held)).await?,
            Step::CountPhases => ctx.metrics.set_phase_counts(&ctx.registry.phase_counts()),
            Step::Publish => {
                let reference = claim.object_ref(&());
                for event in &plan.events {
                    ctx.writer.publish(&reference, event.warning, event.reason, &event.note).await;
                }
            }
            Step::Delete => return delete_expired(ctx, uid, claim).await,
        }
    }
    Ok(plan.requeue_after.map_or_else(Action::await_change, Action::requeue))
}

/// Every status a term writes carries its epoch, except a cleanup's that changes nothing.
fn stamp(ctx: &Context, claim: &LockClaim, plan: &mut Plan) {
    let unchanged =
        plan.cleanup && claim.status.as_ref().map_or(plan.status == Default::default(), |s| *s == plan.status);
    if let Some(epoch) = ctx.epoch().filter(|_| !unchanged) {
        plan.status.leader_epoch = Some(epoch);
    }
}

async fn request_revocation(ctx: &Context, parts: &[Part], plan: &Plan) -> Result<(), Error> {
    let Some(reason) = &plan.write_revoke else { return Ok(()) };
    for part in parts {
        if let Some(node) = ctx.engine.node(&part.id) {
            ctx.engine.request_revocation(&node, reason).await?;
        }
    }
    Ok(())
}

async fn annotate_pod(ctx: &Context, claim: &LockClaim, plan: &Plan) {
    let (Some(reason), Some(pod)) = (&plan.annotate_pod, claim.spec.holder.as_ref().map(|h| &h.pod_name)) else {
        return;
    };
    let name = claim.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.writer.client().clone(), &claim.namespace().unwrap_or_default());
    let (key, value) = pod_revoke_annotation(&name, reason);
    let patch = json!({ "metadata": { "annotations": { key: value } } });
    let result =
        ctx.writer.write("annotate_pod", pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))).await;
    if let Some(e) = result.error() {
        // The pod may be gone already; the revocation goes on regardless.
        tracing::info!(pod, error = %e, "could not annotate the holder pod");
    }
}

/// Every lock at once (one multi-op), after the final status.
async fn release(ctx: &Context, parts: &[Part], was_held: bool) -> Result<(), Error> {
    if ctx.engine.release_group(&ids::ids(parts)).await? && was_held {
        for part in parts {
            ctx.registry.note_release(&part.lock);
        }
    }
    Ok(())
}

async fn delete_expired(ctx: &Context, uid: &str, claim: &LockClaim) -> Result<Action, Error> {
    let name = claim.name_any();
    // Preconditioned on the UID: a new claim of the same name is not this one.
    let api: Api<LockClaim> = Api::namespaced(ctx.writer.client().clone(), &claim.namespace().unwrap_or_default());
    let only_this = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
        ..DeleteParams::default()
    };
    // 404/409: gone already, or another claim of that name.
    if ctx.writer.write("delete_claim", api.delete(&name, &only_this)).await.expecting(&[404, 409])?.is_some() {
        tracing::info!(claim = %name, "deleted: its time to live after finishing has passed");
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::claim::plan::Event;

    #[test]
    fn a_plan_runs_stamp_revocation_annotation_status_release_gauges_events_deletion_in_that_order() {
        let everything = Plan {
            write_revoke: Some("revoked".into()),
            annotate_pod: Some("revoked".into()),
            release: true,
            events: vec![Event { warning: false, reason: "Released", note: String::new() }],
            delete: true,
            ..Plan::default()
        };
        use Step::*;
        assert_eq!(
            steps(&everything),
            [Stamp, RequestRevocation, AnnotatePod, WriteStatus, Release, CountPhases, Publish, Delete]
        );
        assert_eq!(
            steps(&Plan::default()),
            [Stamp, WriteStatus, CountPhases],
            "every plan stamps, writes a changed status, counts"
        );
        let release_only = Plan { release: true, ..Plan::default() };
        assert_eq!(
            steps(&release_only),
            [Stamp, WriteStatus, Release, CountPhases],
            "the release after the final status"
        );
    }
}
