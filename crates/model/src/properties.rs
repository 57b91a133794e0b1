//! What must hold in every state the checker reaches (DESIGN.md §4's invariants, as the model
//! can state them), and what must be reachable at all (so that a model that does nothing
//! cannot pass).

use stateright::{Model, Property};

use crate::state::{Foreign, Link, Phase, Pod, State};
use crate::ZklockModel;

pub const MUTUAL_EXCLUSION: &str = "at most the permits are Held in the merged API history of every cluster";
pub const HELD_HOLDS: &str = "a Held a live term answers for holds the lock in ZooKeeper";
pub const POD_UNDER_HOLD: &str = "a gated pod starts only while its claim holds the lock and nobody takes it back";
pub const TOKENS_GROW: &str = "fencing tokens are unique and grow in grant order across clusters";
pub const DEPOSED_CHANGES_NOTHING: &str = "a deposed term changes nothing";
pub const NO_WAIT_FOR_EVER: &str = "no claim waits for ever behind a free lock";

pub(crate) fn all() -> Vec<Property<ZklockModel>> {
    vec![
        Property::always(MUTUAL_EXCLUSION, |_, s: &State| mutual_exclusion(s)),
        Property::always(HELD_HOLDS, |_, s: &State| held_holds(s)),
        Property::always(POD_UNDER_HOLD, |_, s: &State| !s.history.pod_started_without_hold),
        Property::always(TOKENS_GROW, |_, s: &State| !s.history.token_not_growing),
        Property::always(DEPOSED_CHANGES_NOTHING, |_, s: &State| !s.history.deposed_write_landed),
        Property::always(NO_WAIT_FOR_EVER, no_wait_for_ever),
        Property::sometimes("a claim is granted or kept", |_, s: &State| granted(s)),
        Property::sometimes("a leader change completes", |_, s: &State| {
            s.clusters.iter().any(|c| c.leader.as_ref().is_some_and(|t| t.epoch > 1 && s.answerable(0)))
        }),
    ]
}

/// Counted over the clusters whose live term answers for their statuses: a `Held` a crashed
/// leader left is excused until the next term judged it (nobody can change it meanwhile; that
/// is what fencing tokens are for).
fn mutual_exclusion(s: &State) -> bool {
    let held: usize = (0..s.clusters.len() as u8)
        .filter(|&k| s.answerable(k))
        .map(|k| s.clusters[k as usize].claims.iter().filter(|c| c.phase == Phase::Held && !c.cleaned_up).count())
        .sum();
    held <= s.limit as usize
}

fn held_holds(s: &State) -> bool {
    (0..s.clusters.len() as u8)
        .filter(|&k| s.answerable(k))
        .all(|k| s.clusters[k as usize].claims.iter().all(|c| c.phase != Phase::Held || !c.taken_over))
}

/// A grant the walk made (a token beyond the first state's), a hold a new term kept, or a pod
/// started.
fn granted(s: &State) -> bool {
    s.clusters.iter().any(|c| c.claims.iter().any(|c| c.phase == Phase::Held && (c.token > 1 || c.epoch > 1)))
        || s.clusters.iter().any(|c| c.claims.iter().any(|c| c.pod == Pod::Running))
}

/// Liveness under fairness: in a state where the system has nothing left to do — every step
/// left is one the environment may never take (a user's deletion or edit, a crash, a cut, a new
/// foreign contender) — with every cluster served and in reach of ZooKeeper, every live claim is
/// Held or final, or waits behind a holder that is live. (Steps the system takes in time are
/// assumed to come: a session of a process that is gone expires, a late write lands or is
/// refused, a term begins where one may, a foreign holder lets go.)
fn no_wait_for_ever(m: &ZklockModel, s: &State) -> bool {
    let mut next = vec![];
    m.actions(s, &mut next);
    let quiet = next.iter().all(|a| a.environment());
    let served = (0..s.clusters.len() as u8)
        .all(|k| s.answerable(k) && s.clusters[k as usize].leader.as_ref().is_some_and(|t| t.link == Link::Up));
    if !quiet || !served {
        return true;
    }
    let live_holder = matches!(s.foreign, Foreign::Holding { .. })
        || s.clusters.iter().any(|c| c.claims.iter().any(|c| c.live() && c.phase == Phase::Held));
    let done = s.clusters.iter().all(|c| c.claims.iter().all(|c| !c.live() || c.phase != Phase::Waiting));
    done || live_holder
}
