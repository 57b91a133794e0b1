//! Claims the operator cannot read as `LockClaim`s (a field of the wrong type, an object stored
//! under another version of the schema: see `api::KeptClaim::unreadable`). Such a claim is
//! reported and its status left as it is: what it holds it keeps (a holder whose claim cannot
//! be read may still be working); a claim that only waits gives its place up at once (nobody
//! works under a waiter, and its node, once first, would hold the lock for ever), and is
//! queued again at the back once fixed. Its deletion is read all the same, and releases what
//! the engine tracks of it. Every other claim goes on.

use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::parts::{self, Part};
use super::{Context, Error};
use crate::api::{KeptClaim, Phase};

/// Whether a claim that cannot be read keeps its nodes: only one recorded Held (the operator's
/// own last word first, so a grant reserved or in flight counts: `anchor::recorded_phase`).
pub fn keeps_nodes(phase: Option<Phase>) -> bool {
    phase == Some(Phase::Held)
}

/// One Warning event per change of the claim (a reconcile runs only when it changes), with
/// what to fix.
pub async fn report(uid: &str, claim: &KeptClaim, why: &str, ctx: &Context) -> Result<Action, Error> {
    let name = claim.name_any();
    if !keeps_nodes(super::anchor::recorded_phase(ctx, claim)) {
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
    let reference = claim.object_ref(&());
    let published = ctx.write("publish_event", ctx.events.publish(&reference, true, "Unreadable", &note)).await;
    if let Some(e) = super::reconcile::write_error(published) {
        tracing::info!(claim = %name, error = %e, "could not publish an event");
    }
    Ok(Action::await_change())
}

/// The claim is being deleted: the nodes the engine tracks for it go (its status, which the
/// operator cannot read, is not written); then the finalizer helper removes the finalizer.
pub async fn release(uid: &str, ctx: &Context) -> Result<Action, Error> {
    let parts = ctx.parts_tracked(uid);
    if !parts.is_empty() {
        ctx.engine.release_group(&parts::ids(&parts)).await?;
    }
    Ok(Action::await_change())
}

/// The parts a claim that cannot be read holds, as its status records them: each
/// recorded node names its lock (its directory), the contender (the claim's UID, or a part of
/// it) and the mode. Re-anchoring keeps them: a new term must not hand on a lock whose holder's
/// claim it cannot read. Nothing, where the status cannot be read either or records no node.
pub fn recorded_parts(claim: &KeptClaim, uid: &str) -> Vec<(Part, String)> {
    let several = claim.lock_statuses();
    let nodes: Vec<(String, &str)> = if several.is_empty() {
        claim.znode().map(|node| (String::new(), node)).into_iter().collect()
    } else {
        several.iter().filter_map(|l| Some((l.lock_name.clone(), l.znode.as_deref()?))).collect()
    };
    nodes
        .into_iter()
        .filter_map(|(name, node)| {
            let (lock, child) = node.rsplit_once('/')?;
            let (id, mode) = crate::recipe::parse_child(child)?.ours?;
            // Only the claim's own contenders: a status edited to name another's node is not
            // taken for this claim's.
            (parts::claim_of(id) == uid).then(|| {
                let name = if name.is_empty() { lock.rsplit('/').next().unwrap_or_default().to_string() } else { name };
                (Part { lock: lock.to_string(), name, mode, id: id.into() }, node.to_string())
            })
        })
        .collect()
}
