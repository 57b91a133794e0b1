//! Newest wins (`spec.supersede`; docs/design.md, "CI queue modes"): of the claims of one lock,
//! namespace and group, only the newest waits. Newer is by ticket (the zxid of the claim's
//! first enqueue), which every term and every replica reads alike. Read from the engine, not
//! from statuses: a newer claim counts from the moment its node is made, not from its first
//! status write.

use crate::api::{KeptClaim, Phase, ValidSpec};
use crate::controller::base::{Part, Uid};
use crate::controller::context::Context;
use crate::zk::ContenderState;

/// Where a claim stands in its supersede group.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Standing {
    /// The newest claim of the group with a ticket above this claim's, waiting or holding: its
    /// name. A waiting claim with one ends `Superseded`.
    pub newer: Option<String>,
    /// The group's waiting claims with a ticket below this claim's: each is ended by its own
    /// reconcile, which this claim's asks for.
    pub older: Vec<Uid>,
}

/// A member of the group as the engine tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub uid: Uid,
    pub name: String,
    pub ticket: i64,
    pub waiting: bool,
    /// Final already, its node not released yet: it supersedes nobody, and needs no ending.
    pub ended: bool,
}

/// Pure: from this claim's ticket and the other members', its standing.
pub fn standing(mine: i64, members: &[Member]) -> Standing {
    let live = || members.iter().filter(|m| !m.ended);
    let newer = live().filter(|m| m.ticket > mine).max_by_key(|m| m.ticket).map(|m| m.name.clone());
    let older = live().filter(|m| m.ticket < mine && m.waiting).map(|m| m.uid.clone()).collect();
    Standing { newer, older }
}

/// The claim's standing, if it has a group and a ticket (a claim not yet in its queue has
/// neither newer nor older members: it is judged once it enters). A claim queued again at the
/// back (its node gone without re-anchoring: "Requeued") has a new ticket, and counts as new.
pub fn read(ctx: &Context, uid: &Uid, namespace: &str, spec: &ValidSpec, parts: &[Part]) -> Standing {
    let (Some(group), [part]) = (spec.supersede_group.as_deref(), parts) else { return Standing::default() };
    let Some(mine) = ctx.engine.ticket(&part.id) else { return Standing::default() };
    let members: Vec<Member> = ctx
        .registry
        .claims_of_lock_in(&part.lock, namespace)
        .into_iter()
        .filter(|(other, _)| other != uid)
        .filter_map(|(other, name)| {
            let claim = ctx.stores.claim(namespace, &name)?;
            // The store's copy of that name may be a later claim than the registry's entry.
            if claim.metadata.uid.as_deref() != Some(&*other) || !in_group(&claim, group) {
                return None;
            }
            // Ended as its copy or the operator's own last write says (its node not released yet).
            let final_ = |phase: Option<Phase>| phase.is_some_and(Phase::is_terminal);
            let ended = final_(claim.phase()) || final_(ctx.registry.known_phase(&other));
            // A claim of one lock is the engine's contender under its own UID. One asked to
            // leave while it waits ends `Revoked` at once: it supersedes nobody.
            let state = ctx.engine.state(&other)?;
            let waiting = matches!(state, ContenderState::Waiting { .. });
            let live = waiting || state.is_held();
            let ticket = ctx.engine.ticket(&other).filter(|_| live)?;
            Some(Member { uid: other, name, ticket, waiting, ended })
        })
        .collect();
    standing(mine, &members)
}

/// Whether `claim` is of supersede group `group` (and readable, not being deleted).
fn in_group(claim: &KeptClaim, group: &str) -> bool {
    claim.unreadable.is_none()
        && claim.metadata.deletion_timestamp.is_none()
        && claim.spec.supersede.as_ref().is_some_and(|s| s.group == group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, ticket: i64, waiting: bool) -> Member {
        Member { uid: format!("uid-{name}").into(), name: name.into(), ticket, waiting, ended: false }
    }

    #[test]
    fn the_newest_member_above_supersedes_and_waiting_members_below_are_asked_for() {
        let members = [member("a", 10, false), member("b", 20, true), member("d", 40, true), member("e", 50, true)];
        let s = standing(30, &members);
        assert_eq!(s.newer.as_deref(), Some("e"), "the newest of those above, whom the claim is told it gave way to");
        assert_eq!(s.older, vec![Uid::from("uid-b")], "the holder a (below) is never ended: only waiting b");
        let s = standing(60, &members);
        assert_eq!(s.newer, None, "the newest waits on");
        assert_eq!(s.older.len(), 3);
        assert_eq!(standing(5, &[]), Standing::default(), "alone in its group");
        // A newer one that has ended (expired, revoked, superseded itself; its node not yet
        // released) supersedes nobody.
        let ended = Member { ended: true, ..member("f", 70, true) };
        assert_eq!(standing(60, &[member("a", 10, false), ended]).newer, None);
    }
}
