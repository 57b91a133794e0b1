//! What a claim's plan is made from besides the claim: its holder pod (read once), its
//! contenders in the lock engine (read again whenever the plan is), and the deadline of a hold
//! others share while ZooKeeper is out of reach.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use super::plan::{self, ContenderView, HolderView, PartView};
use crate::api::LockClaim;
use crate::controller::base::ids::{claim_of, Part};
use crate::controller::base::Error;
use crate::controller::context::Context;
use crate::controller::holders;
use crate::controller::writer::Answer;
use crate::metrics::SourceLabel;
use crate::zk::ContenderState;

/// The claim's contenders as one plan reads them, with the engine's admission asked before
/// and after the read (see [`Snapshot::admitting`]).
pub struct Snapshot {
    admitting_before: bool,
    pub view: ContenderView,
}

impl Snapshot {
    pub async fn read(ctx: &Context, parts: &[Part]) -> Snapshot {
        let admitting_before = admitting(ctx, parts);
        Snapshot { admitting_before, view: contender_view(ctx, parts).await }
    }

    /// Admission is asked before the contenders are read and again after, and counts only if
    /// it held both times: a session that ends in between reads "not admitting", never
    /// "admitting, node gone"; and a lock that a re-anchoring pass admits in between (the
    /// claims' nodes re-made meanwhile) does not meet a view read before its nodes were re-made:
    /// "admitting, node gone" again, a holder turned Lost by mistake.
    pub fn admitting(&self, ctx: &Context, parts: &[Part]) -> bool {
        self.admitting_before && admitting(ctx, parts)
    }
}

/// Whether the engine admits in every lock of `parts` (their session is re-anchored).
pub fn admitting(ctx: &Context, parts: &[Part]) -> bool {
    ctx.engine.admitting_in(parts.iter().map(|p| p.lock.as_str()))
}

/// The holder pod: from this term's watch where that proves what it says (see `holders`), else
/// as the API has it now. A pod being deleted still counts as present: its containers may
/// still run, and the lock must not move before they stop.
pub async fn holder_view(
    ctx: &Context,
    claim: &LockClaim,
    namespace: &str,
    pod: Option<&str>,
) -> Result<HolderView, Error> {
    let Some(pod) = pod else { return Ok(HolderView::NotRequested) };
    if let Some(view) = ctx.holder_pods.proven(namespace, pod, holders::expected_uid(claim, pod)) {
        ctx.metrics.holder_pod_views.get_or_create(&SourceLabel { source: "watch" }).inc();
        return Ok(view);
    }
    ctx.metrics.holder_pod_views.get_or_create(&SourceLabel { source: "api" }).inc();
    let pods: Api<Pod> = Api::namespaced(ctx.writer.client().clone(), namespace);
    let found = match ctx.writer.read("get_pod", pods.get_opt(pod)).await {
        Answer::Done(found) => found,
        Answer::Refused { status, .. } => {
            return Err(Error::GetPod { pod: pod.to_string(), source: kube::Error::Api(status) })
        }
        Answer::Unanswered(e) => return Err(e),
    };
    Ok(found.map_or(HolderView::Missing, |p| holders::HolderPod::from(p).view()))
}

/// Whether another ZooKeeper client deleted one of the claim's nodes.
pub fn deleted_by_another(view: &ContenderView) -> bool {
    let lost = ContenderState::Lost { why: crate::zk::LostReason::DeletedByOther };
    matches!(view, ContenderView::Tracked { parts, .. } if parts.iter().any(|p| p.state == lost))
}

/// While ZooKeeper is out of reach: by when the claim must be ended, if it holds a lock that
/// others share (the earliest of its parts'; see `LockEngine::hold_deadline`), on the clock
/// the plan reads.
pub fn hold_until(ctx: &Context, parts: &[Part], now: Timestamp) -> Option<Timestamp> {
    let deadline = parts.iter().filter_map(|p| ctx.engine.hold_deadline(&p.id)).min()?;
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    // A span no clock can add is no deadline worth keeping: the hold ends now.
    Some(now.checked_add(left).unwrap_or(now))
}

/// The claim's contenders in the engine (one per lock), each with the claim it waits for named.
pub async fn contender_view(ctx: &Context, parts: &[Part]) -> ContenderView {
    let mut views: Vec<PartView> = Vec::with_capacity(parts.len());
    for part in parts {
        let Some(state) = ctx.engine.state(&part.id) else { continue };
        let waiting_for = match &state {
            crate::zk::ContenderState::Waiting { watching, .. } => {
                Some(match state.waits_for_contender().map(|id| (id, ctx.registry.name(claim_of(id)))) {
                    Some((_, Some(name))) => name,
                    // A claim this operator does not serve: another cluster's (a ClusterLock),
                    // named by what its node says, `<cluster>/<namespace>/<claim>`. The node
                    // name if that cannot be read (it went meanwhile: the next decision says).
                    Some((_, None)) => ctx
                        .engine
                        .describe(&format!("{}/{watching}", part.lock))
                        .await
                        .ok()
                        .flatten()
                        .unwrap_or_else(|| watching.clone()),
                    None => watching.clone(),
                })
            }
            _ => None,
        };
        views.push(PartView {
            lock_name: part.name.clone(),
            node: ctx.engine.node(&part.id),
            state,
            waiting_for,
            ticket: ctx.engine.ticket(&part.id),
        });
    }
    if views.is_empty() {
        return ContenderView::Untracked;
    }
    // A part the engine lost track of alone (the others tracked) went with its session.
    let mut states: Vec<ContenderState> = views.iter().map(|v| v.state.clone()).collect();
    if views.len() < parts.len() {
        states.push(ContenderState::Lost { why: crate::zk::LostReason::SessionExpired });
    }
    let state = plan::aggregate(&states);
    let waiting_for = views
        .iter()
        .filter_map(|v| match &v.state {
            ContenderState::Waiting { ahead, .. } => Some((*ahead, v.waiting_for.clone())),
            _ => None,
        })
        .max_by_key(|(ahead, _)| *ahead)
        .and_then(|(_, who)| who);
    ContenderView::Tracked { state, parts: views, waiting_for }
}
