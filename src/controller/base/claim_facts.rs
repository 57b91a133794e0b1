//! Pure facts about a claim as the store keeps it (`KeptClaim`), shared by the pipelines, the
//! watches and re-anchoring.

use kube::ResourceExt;

use super::ids::{claim_of, Part};
use crate::api::{KeptClaim, Phase, FINALIZER};

/// A claim deleted whose cleanup is over: its deletion is under way and the operator's
/// finalizer is no longer on it (another finalizer, or foreground deletion, keeps the object).
/// kube-runtime's finalizer helper never hands such a claim to a reconcile again.
pub fn cleaned_up(claim: &KeptClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some() && !claim.finalizers().iter().any(|f| f == FINALIZER)
}

/// Whether a claim asks for something now: it is being deleted, is new (or pending), or its
/// holder is asked to let go. Its locks are re-anchored first and its claims served as soon as
/// they are (docs/design.md: re-anchoring), so that a leader change holds up no grant behind the
/// re-anchoring of locks where nothing is asked.
pub fn asks(claim: &KeptClaim, phase: Option<Phase>) -> bool {
    claim.metadata.deletion_timestamp.is_some()
        || matches!(phase, None | Some(Phase::Pending))
        || claim.annotations().contains_key(crate::api::REVOKE_ANNOTATION)
}

/// Whether a claim that cannot be read keeps its nodes: only one recorded Held (the operator's
/// own last word first, so a grant reserved or in flight counts: `Registry::recorded_phase`).
pub fn keeps_nodes(phase: Option<Phase>) -> bool {
    phase == Some(Phase::Held)
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
            (claim_of(id) == uid).then(|| {
                let name = if name.is_empty() { lock.rsplit('/').next().unwrap_or_default().to_string() } else { name };
                (Part { lock: lock.to_string(), name, mode, id: id.into() }, node.to_string())
            })
        })
        .collect()
}
