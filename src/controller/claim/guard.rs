//! Copies of a claim that must not be planned from: one older than the operator's own last
//! write, one a later term wrote (this process is deposed), and one from before a final status
//! the operator wrote (final is final). Also what a copy proves about the registry's
//! bookkeeping: a final copy needs no stamp, a Held copy means its grant landed.

use kube::runtime::controller::Action;

use crate::api::{LockClaim, Phase};
use crate::controller::base::settings::NEWER_COPY_BACKSTOP;
use crate::controller::base::{ids, Error, Part};
use crate::controller::context::Context;

/// `None` when `claim` may be planned from; else what the reconcile answers instead.
pub async fn check(ctx: &Context, uid: &str, claim: &LockClaim, parts: &[Part]) -> Result<Option<Action>, Error> {
    let phase = claim.status.as_ref().and_then(|s| s.phase);
    let terminal = phase.is_some_and(Phase::is_terminal);
    if let Some(waiting) = stale_copy(claim, ctx, uid).await? {
        return Ok(Some(waiting));
    }
    if terminal {
        // Final: no grant waits for this claim's stamp (docs/design.md: fencing).
        ctx.registry.stamped(uid, false);
    }
    if phase == Some(Phase::Held) {
        // Its grant landed (whichever of its writes did): none of them is in flight any more.
        ctx.registry.commit_grant(uid);
    }
    if !terminal && ctx.registry.known_phase(uid).is_some_and(Phase::is_terminal) {
        // Final is final: this copy is older than the operator's own final write, and planning
        // from it could bring the claim back. Only make sure the nodes are gone; the watch
        // delivers the write (the backstop below is for a lost event).
        ctx.engine.release_group(&ids::ids(parts)).await?;
        return Ok(Some(Action::requeue(NEWER_COPY_BACKSTOP)));
    }
    Ok(None)
}

/// Checks the copy against the operator's own writes (docs/design.md: fencing). The copy the last status
/// write was planned from is older than that write: nothing is planned from it (the watch
/// brings the newer one; the schedule is the backstop). A copy that carries a later leader's
/// epoch means this process is deposed: nothing is written.
///
/// A copy without this term's epoch is not taken for an old one: the store only moves forward,
/// and after a status write that landed it holds the copy that write was planned from (caught
/// above) or a newer one. So such a copy is somebody else's edit made after the operator's
/// write (an admin's `kubectl patch --subresource=status` that dropped `leaderEpoch`, a restore
/// tool): it is planned from like any other, and the next write stamps the epoch again. Waiting
/// for a copy with the epoch instead would wait for ever, and a claim next in its queue would
/// stall the lock. An old copy planned from by mistake costs no safety either: every status write
/// tests the resourceVersion it was planned from.
pub async fn stale_copy(claim: &LockClaim, ctx: &Context, uid: &str) -> Result<Option<Action>, Error> {
    if ctx.registry.outdated(uid, claim.metadata.resource_version.as_deref()) {
        // The very copy the last status write was planned from: that write landed, and the
        // watch brings it (and with it a reconcile) any moment; the requeue is a backstop.
        tracing::debug!("this copy is older than the operator's own last write; waiting for the newer one");
        return Ok(Some(Action::requeue(NEWER_COPY_BACKSTOP)));
    }
    let Some(mine) = ctx.epoch() else { return Ok(None) };
    let copy = claim.status.as_ref().and_then(|s| s.leader_epoch);
    // A later term's epoch, unless ZooKeeper's data were made anew since (its zxids start over
    // then): ZooKeeper's epoch node tells.
    if copy.is_some_and(|copy| copy > mine) && !ctx.engine.epoch_is_current().await? {
        return Err(Error::NotLeading);
    }
    if copy == Some(mine) {
        ctx.registry.stamped(uid, false);
    } else if ctx.registry.written(uid) {
        tracing::info!(
            leader_epoch = ?copy,
            "the claim's status was written by someone else after this term's write; planning from it"
        );
    }
    Ok(None)
}
