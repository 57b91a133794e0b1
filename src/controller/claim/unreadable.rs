//! Claims the operator cannot read as `LockClaim`s (a field of the wrong type, an object stored
//! under another version of the schema: see `api::KeptClaim::unreadable`). Such a claim is
//! reported and its status left as it is: what it holds it keeps (a holder whose claim cannot
//! be read may still be working); a claim that only waits gives its place up at once (nobody
//! works under a waiter, and its node, once first, would hold the lock for ever), and is
//! queued again at the back once fixed. Its deletion is read all the same, and releases what
//! the engine tracks of it. Every other claim goes on.

use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use crate::api::KeptClaim;
use crate::controller::base::{claim_facts, ids, Error};
use crate::controller::context::Context;

/// One Warning event per change of the claim (a reconcile runs only when it changes), with
/// what to fix.
pub async fn report(uid: &str, claim: &KeptClaim, why: &str, ctx: &Context) -> Result<Action, Error> {
    let name = claim.name_any();
    if !claim_facts::keeps_nodes(ctx.registry.recorded_phase(claim)) {
        // Waiting, or queued and not written yet: its nodes go. Fixed, it queues again at the
        // back ("Requeued"): it never held anything.
        release(uid, ctx).await?;
    }
    tracing::warn!(claim = %name, namespace = claim.namespace().unwrap_or_default(), %why, "cannot read this claim; it is left as it is");
    let note = format!(
        "the operator cannot read this claim ({why}); it is left as it is (what it holds it keeps; a claim that \
         only waited leaves its queue and is queued again at the back once fixed) until it is fixed to the \
         LockClaim schema or deleted"
    );
    ctx.writer.publish(&claim.object_ref(&()), true, "Unreadable", &note).await;
    Ok(Action::await_change())
}

/// The claim is being deleted: the nodes the engine tracks for it go (its status, which the
/// operator cannot read, is not written); then the finalizer helper removes the finalizer.
pub async fn release(uid: &str, ctx: &Context) -> Result<Action, Error> {
    let parts = ctx.parts_tracked(uid);
    if !parts.is_empty() {
        ctx.engine.release_group(&ids::ids(&parts)).await?;
    }
    Ok(Action::await_change())
}
