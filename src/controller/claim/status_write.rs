//! The grant's API half: a claim's status write, and every piece of the registry's write-side
//! bookkeeping that hangs on its answer (a grant committed, abandoned, or left reserved; the
//! copy planned from; the stamp; tokens used; the phase the operator last wrote). Nothing else
//! in the pipeline touches those.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

use super::plan::Plan;
use crate::api::epoch_policy::PARAM_MISSING;
use crate::api::{KeptClaim, LockClaim, LockClaimStatus, Phase, EPOCH_REFUSAL};
use crate::controller::base::{part_tokens, Error, Part};
use crate::controller::context::Context;
use crate::controller::writer::Answer;

/// What a status write's answer means, classified once: for the grant book and for the
/// reconcile's result.
#[derive(Debug)]
pub enum Outcome {
    /// Written.
    Landed,
    /// The test of the UID or of the resourceVersion failed (409/422): the copy planned from is
    /// older than the claim, and the watch brings the newer one.
    Conflict(String),
    /// The admission policy's parameter is gone: every status write is refused until it is
    /// back (the API server answers 422 for a binding it cannot configure).
    ParamMissing(String),
    /// The admission policy refused a term that is over (403; docs/design.md: fencing).
    EpochRefused(String),
    /// Another refusal of the API server's.
    Refused(kube::Error),
    /// No answer of the API server's (none within the deadline, not leading any more, the
    /// connection broke, the answer could not be read): the write may have landed, or may
    /// still land.
    Unanswered(Error),
}

impl Outcome {
    pub fn of<T>(answer: Answer<T>) -> Outcome {
        match answer {
            Answer::Done(_) => Outcome::Landed,
            Answer::Refused { status: s, .. } if s.message.contains(PARAM_MISSING) => Outcome::ParamMissing(s.message),
            Answer::Refused { status: s, .. } if s.code == 409 || s.code == 422 => Outcome::Conflict(s.message),
            Answer::Refused { status: s, .. } if s.code == 403 && s.message.contains(EPOCH_REFUSAL) => {
                Outcome::EpochRefused(s.message)
            }
            Answer::Refused { status, .. } => Outcome::Refused(kube::Error::Api(status)),
            Answer::Unanswered(e) => Outcome::Unanswered(e),
        }
    }

    /// Whether the API server answered: this write landed or never will, and a grant written
    /// earlier (tested against the same copy or an older one) cannot land after it.
    pub fn settled(&self) -> bool {
        !matches!(self, Outcome::Unanswered(_))
    }

    /// Whether the API server refused the write: it did not land, and a grant it carried is
    /// abandoned unless a read shows that an earlier attempt of it landed. A failure without the
    /// API server's answer (the connection broke after the request went out, the answer could
    /// not be read) is no refusal: the write may have landed, and the grant stays reserved until
    /// a newer write of the claim settles it.
    pub fn refused(&self) -> bool {
        self.settled() && !matches!(self, Outcome::Landed)
    }

    /// The reconcile's result: on, or the error of a write that did not land.
    fn into_result(self, name: &str) -> Result<(), Error> {
        Err(match self {
            Outcome::Landed => return Ok(()),
            Outcome::Conflict(message) => {
                tracing::info!(claim = %name, answer = %message, "status write refused; planning again from a newer copy");
                Error::StatusRefused(message)
            }
            Outcome::EpochRefused(message) => {
                tracing::warn!(claim = %name, answer = %message, "status write refused: a newer leader's term is in force");
                Error::NotLeading
            }
            Outcome::ParamMissing(message) => Error::EpochParam(message),
            Outcome::Refused(e) => Error::PatchStatus(e),
            Outcome::Unanswered(e) => e,
        })
    }
}

/// Writes `plan`'s status if it differs from the copy's, with everything a grant needs before
/// (fresh tokens, the token floor, the namespace's fence) and the bookkeeping its answer
/// settles. Returns the status the copy had.
pub async fn run(
    ctx: &Context,
    uid: &str,
    parts: &[Part],
    claim: &LockClaim,
    plan: &mut Plan,
) -> Result<LockClaimStatus, Error> {
    let before = claim.status.clone().unwrap_or_default();
    let granting = plan.status.phase == Some(Phase::Held) && before.phase != Some(Phase::Held);
    if granting {
        fresh_tokens(ctx, parts, plan).await?;
    }
    if plan.status == before {
        return Ok(before);
    }
    let namespace = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    // Tokens never go back, also across a ZooKeeper whose data are made anew: what this
    // status hands out is below the floor kept in the API before it is written.
    ctx.token_floor.cover(highest_number(&plan.status)).await?;
    fenced_here(claim, ctx, uid, &namespace, &name).await?;
    if granting {
        // A lock whose fencing is enforced: the API server refuses every hold that ended
        // before this grant on the objects it guards, before the holder may start.
        let sources = (ctx.writer.client(), ctx.stores.as_ref(), ctx.registry.as_ref());
        if let Err(e) = ctx.fencing.grant(sources, uid, &namespace, parts, &plan.status).await {
            if let (Error::FencingUnproven(why), true) = (&e, ctx.fencing.first_warning(uid)) {
                let note = format!("the grant waits: {why}");
                ctx.writer.publish(&claim.object_ref(&()), true, "FencingUnproven", &note).await;
            }
            return Err(e);
        }
    }
    // The answer is read as the store reads a claim: only what is kept is decoded.
    let api: Api<KeptClaim> = Api::namespaced(ctx.writer.client().clone(), &namespace);
    let version = claim.metadata.resource_version.as_deref().ok_or(Error::Malformed("a resourceVersion"))?;
    let patch = status_patch(uid, &plan.status, version)?;
    let answer = ctx
        .writer
        .write("patch_status", api.patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(patch)))
        .await;
    let outcome = Outcome::of(answer);
    if outcome.settled() {
        ctx.registry.commit_grant(uid);
    }
    if outcome.refused() && granting && !grant_landed(ctx, &api, &name, uid, &outcome).await {
        // A grant reserved for this write did not happen. (One whose answer did not come
        // stays reserved: it may still land, until a newer write of the claim lands.)
        ctx.registry.abandon_grant(uid, before.phase);
    }
    match outcome {
        Outcome::ParamMissing(message) => {
            let Some(fence) = &ctx.fence else { return Err(Error::EpochParam(message)) };
            let repaired = fence.repair(ctx.writer.client(), &ctx.engine, &name, &namespace).await;
            return Err(match repaired {
                Ok(()) => Error::EpochParam(format!("{message} (made again; the write is tried again)")),
                Err(e) => Error::from(e),
            });
        }
        outcome => outcome.into_result(&name)?,
    }
    tracing::debug!(phase = ?plan.status.phase, position = ?plan.status.position, "status written");
    ctx.registry.planned_from(uid, version);
    ctx.registry.stamped(uid, true);
    if granting {
        observe_grant(claim, ctx, parts);
        ctx.history.granted(claim, parts, &plan.status);
    }
    if let Some(ended) = plan.status.phase.filter(|p| before.phase == Some(Phase::Held) && p.is_terminal()) {
        for (part, token) in parts.iter().zip(part_tokens(&plan.status, parts)) {
            if let Some(token) = token {
                ctx.registry.token_used(&part.lock, token);
            }
        }
        ctx.history.ended(claim, parts, &before, ended);
    }
    // The registry's phase is the operator's own last write, never a copy's.
    ctx.registry.set_phase(uid, plan.status.phase);
    Ok(before)
}

/// No status is written in a namespace before the admission policy is proven to refuse earlier
/// terms' statuses there (see [`super::api_fence::Fence::ready`]). Where it cannot be, the
/// namespace fails alone: each of its claims gets one Warning event per term saying why.
async fn fenced_here(claim: &LockClaim, ctx: &Context, uid: &str, namespace: &str, name: &str) -> Result<(), Error> {
    let Some(fence) = &ctx.fence else { return Ok(()) };
    let Err(e) = fence.ready(ctx.writer.client(), namespace, name).await else { return Ok(()) };
    let e = Error::from(e);
    if let Error::Unfenced(why) = &e {
        if fence.first_warning(uid) {
            let note = format!("no status is written for claims of this namespace: {why}");
            ctx.writer.publish(&claim.object_ref(&()), true, "Unfenced", &note).await;
        }
    }
    Err(e)
}

/// Whether a grant whose write was refused for a changed claim (409/422) is in the API anyway:
/// an earlier attempt of the same grant, given up on after its timeout, may have landed since
/// and changed the claim. Then the registry must keep it Held, not roll it back to Waiting while
/// the API says Held. Settled by a read; a read that fails keeps the reservation (the safe side:
/// it only holds back other grants until this claim's next reconcile plans again).
async fn grant_landed(ctx: &Context, api: &Api<KeptClaim>, name: &str, uid: &str, outcome: &Outcome) -> bool {
    if !matches!(outcome, Outcome::Conflict(_) | Outcome::ParamMissing(_)) {
        return false;
    }
    match ctx.writer.read("get_claim", api.get_opt(name)).await {
        Answer::Done(Some(now)) => {
            now.metadata.uid.as_deref() == Some(uid)
                && now.phase() == Some(Phase::Held)
                && now.leader_epoch() == ctx.epoch()
        }
        Answer::Done(None) => false,
        Answer::Refused { .. } | Answer::Unanswered(_) => true,
    }
}

/// A grant is written with a token above every token of its lock granted or ended before.
/// Holders of a lock with permits are not granted in queue order (a claim over several locks may
/// sit among the first N of one while it waits for another, and a grant's write may be held up
/// and made again while other holds began and ended), so a part's first token could read as
/// older than a hold that ended before it. Such a part gets a fresh token from the engine,
/// above every token issued so far. Grants of a lock with permits are written one at a time
/// (the registry's reservation), so no other grant comes between the check and the write.
///
/// The check does not ask for the lock's limit now: a part granted under permits keeps its
/// hold when the permits are lowered or its `Lock` object is deleted (the lock is a mutex
/// again), and its first token is as old as before (chaos run, seed 1795586562701459641: the
/// `Lock` went 0.2 s before such a claim's grant was written, which then carried 8589934793
/// after a hold with 8589934806 had ended). On a mutex that was one all along, only a Shared
/// holder granted beside another can come out below (it takes a fresh one, needlessly but
/// harmlessly); an Exclusive grant waits for every hold it conflicts with, and its token is
/// above theirs.
///
/// In a `ClusterLock` other clusters share, their grants and ends are in no registry here, and
/// each cluster decides from the same directory states: raised permits granted in two clusters
/// from one state carried one token, and a grant whose write was held up landed with a token
/// below a hold another cluster had ended meanwhile. There every attempt of a grant write takes
/// a token written just before it (one ZooKeeper write per grant): ZooKeeper orders those
/// writes, so tokens are unique and grow in the order the grants are written, across clusters.
async fn fresh_tokens(ctx: &Context, parts: &[Part], plan: &mut Plan) -> Result<(), Error> {
    for (i, (part, token)) in parts.iter().zip(part_tokens(&plan.status, parts)).enumerate() {
        let Some(mut token) = token else { continue };
        // Tokens with permits are each a zxid of their own: an equal one is this grant's own,
        // recorded by an earlier attempt of this write.
        let shared = ctx.layout.is_shared_lock(&part.lock);
        if shared || token < ctx.registry.highest_token(&part.lock) {
            let fresh = ctx.engine.refresh_token(&part.id).await?;
            tracing::debug!(lock = %part.lock, old = token, new = fresh, "a grant takes a fresh fencing token");
            token = fresh;
            match plan.status.locks.get_mut(i).filter(|l| l.lock_name == part.name) {
                Some(lock) => lock.fencing_token = Some(fresh.to_string()),
                None => plan.status.fencing_token = Some(fresh.to_string()),
            }
        }
        ctx.registry.token_used(&part.lock, token);
    }
    Ok(())
}

/// The status write: the whole new status, for this very claim, landing only on the copy it
/// was planned from. A JSON patch replaces the status as a whole (a merge patch would keep the
/// fields the new status leaves out: a new holder kept naming whom it had waited for). Its
/// first operation tests the UID, since the write goes by name: a claim deleted without its
/// finalizer and re-created under the same name must not receive its predecessor's status. Its
/// second tests the resourceVersion planned from: a write that lands late (its answer timed
/// out, it was retried, newer writes followed) or a deposed leader's write (docs/design.md: fencing) is
/// refused once anything else was written to the claim.
fn status_patch(uid: &str, status: &LockClaimStatus, version: &str) -> Result<json_patch::Patch, Error> {
    use json_patch::{jsonptr::Pointer, AddOperation, PatchOperation, TestOperation};
    let test = |path: &'static str, value: serde_json::Value| {
        PatchOperation::Test(TestOperation { path: Pointer::from_static(path).to_buf(), value })
    };
    let value = serde_json::to_value(status).map_err(Error::StatusPatch)?;
    Ok(json_patch::Patch(vec![
        test("/metadata/uid", uid.into()),
        test("/metadata/resourceVersion", version.into()),
        PatchOperation::Add(AddOperation { path: Pointer::from_static("/status").to_buf(), value }),
    ]))
}

/// The highest of the numbers out of ZooKeeper a status hands out: fencing tokens, ticket,
/// leader epoch.
fn highest_number(status: &LockClaimStatus) -> i64 {
    let parse = |s: Option<&String>| s.and_then(|s| s.parse::<i64>().ok());
    let tokens = status.locks.iter().map(|l| parse(l.fencing_token.as_ref()));
    [parse(status.fencing_token.as_ref()), parse(status.ticket.as_ref()), status.leader_epoch]
        .into_iter()
        .chain(tokens)
        .flatten()
        .max()
        .unwrap_or(0)
}

fn observe_grant(claim: &LockClaim, ctx: &Context, parts: &[Part]) {
    if let Some(created) = &claim.metadata.creation_timestamp {
        let waited = Timestamp::now().duration_since(created.0).as_secs_f64();
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        for part in parts {
            ctx.metrics.acquire_wait.observe(namespace, &part.name, waited);
        }
    }
    // The handoff that ends here: the latest release among the claim's locks.
    let released = parts.iter().filter_map(|p| ctx.registry.take_release(&p.lock)).min();
    if let Some(since_release) = released {
        ctx.metrics.handoff.observe(since_release.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_write_replaces_the_status_of_the_copy_it_was_planned_from_only() {
        let held = LockClaimStatus { phase: Some(Phase::Held), position: Some(0), ..Default::default() };
        let patch = serde_json::to_value(status_patch("u-1", &held, "41").unwrap()).unwrap();
        assert_eq!(
            patch,
            json!([
                { "op": "test", "path": "/metadata/uid", "value": "u-1" },
                { "op": "test", "path": "/metadata/resourceVersion", "value": "41" },
                { "op": "add", "path": "/status", "value": { "phase": "Held", "position": 0 } },
            ])
        );
    }

    fn refused(code: u16, message: &str) -> Answer<()> {
        let status: kube::core::Status = serde_json::from_value(json!({ "code": code, "message": message })).unwrap();
        Answer::Refused { call: "patch_status", status: Box::new(status) }
    }

    /// (settled: the grant reservation is committed; refused: a grant it carried may be
    /// abandoned, after the read that tells whether an earlier attempt landed).
    fn settled_refused(outcome: &Outcome) -> (bool, bool) {
        (outcome.settled(), outcome.refused())
    }

    #[test]
    fn a_status_writes_answer_is_classified_once_for_the_grant_book_and_the_retry() {
        let landed = Outcome::of(Answer::Done(()));
        assert!(matches!(landed, Outcome::Landed));
        assert_eq!(settled_refused(&landed), (true, false));
        assert!(matches!(landed.into_result("c"), Ok(())));

        for code in [409, 422] {
            let conflict = Outcome::of(refused(code, "the object has been modified"));
            assert!(matches!(conflict, Outcome::Conflict(_)), "{code}: {conflict:?}");
            assert_eq!(settled_refused(&conflict), (true, true));
            assert!(
                matches!(conflict.into_result("c"), Err(Error::StatusRefused(_))),
                "planned again from a newer copy"
            );
        }

        let message = format!("ValidatingAdmissionPolicy denied request: {EPOCH_REFUSAL}");
        let deposed = Outcome::of(refused(403, &message));
        assert!(matches!(deposed, Outcome::EpochRefused(_)), "{deposed:?}");
        assert_eq!(settled_refused(&deposed), (true, true));
        assert!(matches!(deposed.into_result("c"), Err(Error::NotLeading)), "a newer term is in force");
        let forbidden = Outcome::of(refused(403, "RBAC: forbidden"));
        assert!(matches!(forbidden, Outcome::Refused(_)), "another 403 is no epoch refusal: {forbidden:?}");
        assert_eq!(settled_refused(&forbidden), (true, true));
        assert!(matches!(forbidden.into_result("c"), Err(Error::PatchStatus(_))));

        let message = format!("failed to configure binding: {PARAM_MISSING}");
        let missing = Outcome::of(refused(422, &message));
        assert!(matches!(missing, Outcome::ParamMissing(_)), "before the 422 of a conflict: {missing:?}");
        assert_eq!(settled_refused(&missing), (true, true));

        let late = Outcome::of::<()>(Answer::Unanswered(Error::Timeout { call: "patch_status" }));
        assert!(matches!(late, Outcome::Unanswered(_)));
        assert_eq!(settled_refused(&late), (false, false), "it may still land: the grant stays reserved");
        assert!(matches!(late.into_result("c"), Err(Error::Timeout { .. })));
        let not_leading = Outcome::of::<()>(Answer::Unanswered(Error::NotLeading));
        assert_eq!(settled_refused(&not_leading), (false, false));

        // An answer that could not be read: the write landed, or may have.
        let unreadable = serde_json::from_str::<LockClaimStatus>("{").unwrap_err();
        let source = kube::Error::SerdeError(unreadable);
        let broken = Outcome::of::<()>(Answer::Unanswered(Error::Write { call: "patch_status", source }));
        assert!(matches!(broken, Outcome::Unanswered(_)));
        assert_eq!(settled_refused(&broken), (false, false), "no refusal: the grant stays reserved");
        let retried = broken.into_result("c");
        assert!(
            matches!(&retried, Err(e @ Error::Write { .. }) if e.metric_label() == "patch_status"),
            "the reconcile fails and is retried: {retried:?}"
        );
    }
}
