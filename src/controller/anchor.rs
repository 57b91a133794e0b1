//! Re-anchoring on a new session (docs/design.md: re-anchoring): before anything new is admitted, every lock
//! gets the nodes of its live claims back, in the order their status records (holders first),
//! and the continuity rule decides whether a recorded holder keeps the lock.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;

use super::base::ids::{self, Part};
use super::base::{claim_facts, Error};
use super::context::Context;
use crate::api::{validate_spec, KeptClaim, Phase};
use crate::zk::{ContenderSpec, ContenderState, LostReason, Recorded};

/// Whether re-anchoring takes a directory the scan found with nodes of earlier sessions: a
/// `ClusterLock`'s (listed with no namespace: claims of every served namespace queue there)
/// always, a namespace's only if it is served (`--watch-namespace`; none named: all).
fn served_directory(served: &[String], namespace: &str) -> bool {
    namespace.is_empty() || served.is_empty() || served.iter().any(|n| n == namespace)
}

/// A live claim in one of its locks: the claim, its part there, and the node it recorded.
type Live = (Arc<KeptClaim>, Part, Option<String>);

/// Re-anchors every lock from the claims the watches listed (they must have listed them once;
/// the claims need not have been replayed into the term: each is noted in the registry here).
/// A claim over several locks is re-anchored in each of them, as one contender per lock; in
/// each lock the claims keep their recorded order, so two claims stand in the same order in
/// every lock they share, as when they were first enqueued.
///
/// Each lock admits new contenders as soon as it is re-anchored (unless a verdict on one of its
/// holders waits for the whole pass: see below), and locks where a claim asks for something go
/// first: their claims are reconciled at once (see [`Context::serves`]), the others when the pass
/// is over (the caller's walk).
pub async fn reanchor_all(ctx: &Context) -> Result<(), Error> {
    let started = std::time::Instant::now();
    let (mut locks, asked) = listed_holds(ctx);
    tracing::debug!(took = ?started.elapsed(), locks = locks.len(), "the stores' holds listed");
    // Directories that hold nodes of earlier sessions but no live claim any more: their stale
    // nodes must go too, or new claims would queue behind them until the old session expires.
    let stale_only = ctx.engine.directories_with_nodes(&ctx.layout, |path| locks.contains_key(path)).await?;
    for (namespace, path) in stale_only {
        if served_directory(ctx.scopes.namespaces(), &namespace) {
            locks.entry(path).or_default();
        }
    }
    tracing::debug!(took = ?started.elapsed(), "directories with nodes scanned");
    // The session this pass re-anchors in; new contenders may join the queues of every other
    // lock from now on (none of our nodes is there, no live claim is recorded there).
    let (session, todo) = ctx.engine.begin_reanchoring(locks.keys().cloned())?;
    locks.retain(|path, _| todo.contains(path));
    ctx.serving.begin_reanchoring();
    for uid in asked.iter().filter(|(path, _)| !todo.contains(*path)).flat_map(|(_, uids)| uids) {
        ctx.trigger(uid);
    }
    ctx.serve_deferred();
    tracing::debug!(
        locks = locks.len(),
        asked = asked.len(),
        "re-anchoring; locks where a claim asks for something first"
    );
    // Where a claim asks for something first (the sort is stable: path order otherwise).
    let mut locks: Vec<(String, Vec<Live>)> = locks.into_iter().collect();
    locks.sort_by_key(|(path, _)| !asked.contains_key(path));
    // Verdicts are kept until the pass is over, and so is the admission of the locks they are
    // about: one that ends with the session (a second session change close behind the first)
    // proves nothing about the holders it met, and the next pass starts over. Recorded at once,
    // a holder whose node went with that session was judged "could not come back first" and
    // ended Lost on a lock nobody else uses (the chaos suite's cli-621, seed
    // 5580262741893311129). A lock without one admits as soon as it is re-anchored, if the
    // session is still the one it was re-anchored in: a later loss of that session is met like
    // any other (its nodes are re-anchored again, holders first).
    // Locks are independent of one another (a claim over several is one contender in each, in
    // the order its status records), so they are re-anchored `REANCHOR_CONCURRENCY` at a time:
    // one after the other, 1,000 locks took 5.5 s of a leader change in which nothing is granted.
    let asked = &asked;
    // A claim that asks for something while the pass runs (its holder pod deleted, say) has
    // its lock taken next, not in its place in the pass: at 10,000 claims the pass lasts
    // seconds.
    let queue = parking_lot::Mutex::new(PassQueue::new(locks));
    let next = futures::stream::poll_fn(|_| std::task::Poll::Ready(queue.lock().next(ctx)));
    let passes: Vec<Result<Vec<(String, String)>, Error>> = next
        .map(|(path, claims)| async move {
            let verdicts = reanchor_lock(ctx, path.clone(), claims).await?;
            if verdicts.is_empty() && ctx.engine.session_id() == Some(session) {
                ctx.engine.admit_lock(session, &path);
                if let Some(uids) = asked.get(&path) {
                    tracing::debug!(lock = %path, claims = uids.len(), "re-anchored where claims ask: serving them");
                }
                for uid in asked.get(&path).into_iter().flatten() {
                    ctx.trigger(uid);
                }
                ctx.serve_deferred();
            }
            Ok(verdicts)
        })
        .buffer_unordered(REANCHOR_CONCURRENCY)
        .collect()
        .await;
    let mut verdicts: Vec<(String, String)> = vec![];
    for pass in passes {
        verdicts.extend(pass?);
    }
    if ctx.engine.session_id() != Some(session) {
        return Err(crate::zk::Error::SessionLost.into());
    }
    for (uid, why) in verdicts {
        ctx.registry.set_verdict(&uid, why);
    }
    ctx.engine.admit();
    Ok(())
}

/// What the stores say: lock path → the claims recorded Held or Waiting there (each with its
/// part there and the node its status records), and lock path → the claims there that ask for
/// something (see `claim_facts::asks`), live or not. Claims listed without this term's epoch
/// are told to the registry on the way: no grant in their locks before this term's first
/// write to them.
fn listed_holds(ctx: &Context) -> (BTreeMap<String, Vec<Live>>, BTreeMap<String, Vec<String>>) {
    // Lock path → the claims recorded as Held or Waiting there, each with its part there.
    let mut locks: BTreeMap<String, Vec<Live>> = BTreeMap::new();
    // Lock path → the claims there that ask for something (see `asks`), live or not.
    let mut asked: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for claim in ctx.stores.all_claims() {
        // Known to the registry before anything is judged from it: a term's first pass does not
        // wait for the claims' replay into the term (`watch::claims`; with the listing of every
        // directory it kept the pass from starting for over a second at 100,000 claims); a claim
        // the replay brings later is known by then. Later passes (a new session) find every
        // claim noted by the replay and the watch: noting one here again would bring back a
        // claim whose cleanup the registry already forgot, from a store copy that lags.
        if !ctx.serving.anchored() {
            super::watch::first_seen(ctx, &claim);
        }
        let (Some(namespace), Some(uid)) = (claim.namespace(), claim.uid()) else { continue };
        if claim_facts::cleaned_up(&claim) {
            // Deleted, and its cleanup is done (our finalizer went; another keeps the object):
            // it holds nothing and waits for nothing, in this term too. Neither its node nor a
            // stamp is awaited: no reconcile of it will ever run again to make or give them.
            continue;
        }
        let phase = ctx.registry.recorded_phase(&claim);
        let live = matches!(phase, Some(Phase::Held | Phase::Waiting));
        if claim.unreadable.is_some() {
            // Its spec or status cannot be read: a holder keeps the nodes its status records; a
            // waiter's are not made again (the pass deletes them with the directory's stale
            // nodes), or once first they would hold the lock for ever.
            if claim_facts::keeps_nodes(phase) {
                for (part, node) in claim_facts::recorded_parts(&claim, &uid) {
                    locks.entry(part.lock.clone()).or_default().push((claim.clone(), part, Some(node)));
                }
            }
            continue;
        }
        let Ok(spec) = validate_spec(&claim.spec, &namespace) else { continue };
        let terminal = phase.is_some_and(Phase::is_terminal);
        let asks = claim_facts::asks(&claim, phase) && !terminal;
        // Listed after this term began: an earlier leader may still have a status write for
        // it on the way, and no grant in its locks before this term's first write to it
        // (docs/design.md: fencing). Claims created after the list never saw an earlier leader.
        let epoch = claim.leader_epoch();
        let written = ctx.registry.written(&uid);
        let shared = ctx.shared_uid(&uid);
        if ctx.epoch().is_some() && epoch != ctx.epoch() && !written && !terminal {
            ctx.registry.expect_stamp(&shared);
        }
        if !asks && !live {
            continue;
        }
        // Once per claim: at 100,000 claims this loop is on the path of a leader change's
        // first grants.
        let parts = ids::parts_of(&ctx.layout, &namespace, &shared, &spec);
        if asks {
            for part in &parts {
                asked.entry(part.lock.clone()).or_default().push(uid.clone());
            }
        }
        // Claims being deleted too: a holder keeps the lock until its cleanup has written its
        // final status (the next claim must not be Held before).
        if live {
            for (i, part) in parts.into_iter().enumerate() {
                let node = if spec.several {
                    claim.lock_statuses().get(i).filter(|l| l.lock_name == part.name).and_then(|l| l.znode.clone())
                } else {
                    claim.znode().map(str::to_string)
                };
                locks.entry(part.lock.clone()).or_default().push((claim.clone(), part, node));
            }
        }
    }
    (locks, asked)
}

/// The locks a re-anchoring pass has yet to take, in order, and which those are.
struct PassQueue {
    order: std::collections::VecDeque<(String, Vec<Live>)>,
    left: std::collections::HashSet<String>,
}

impl PassQueue {
    fn new(locks: Vec<(String, Vec<Live>)>) -> Self {
        let left = locks.iter().map(|(path, _)| path.clone()).collect();
        PassQueue { order: locks.into(), left }
    }

    /// The next lock: one where a claim waits as deferred (see `Context::serves_reconcile`)
    /// first, else the next in order.
    fn next(&mut self, ctx: &Context) -> Option<(String, Vec<Live>)> {
        let wanted: Vec<std::sync::Arc<str>> = {
            let deferred = ctx.serving.deferred();
            deferred.iter().filter_map(|uid| ctx.registry.lock_paths(uid)).flatten().collect()
        };
        let taken = match wanted.iter().find(|path| self.left.contains(&path[..])) {
            Some(path) => {
                let i = self.order.iter().position(|(p, _)| p.as_str() == &path[..])?;
                self.order.remove(i)
            }
            None => self.order.pop_front(),
        };
        if let Some((path, _)) = &taken {
            self.left.remove(path);
        }
        taken
    }
}

/// Locks re-anchored at once: as many as claims are reconciled at once by default.
const REANCHOR_CONCURRENCY: usize = 16;

/// Re-anchors one lock; answers the verdicts on its recorded holders (claim, why it lost the
/// lock), applied once the whole pass is over.
async fn reanchor_lock(ctx: &Context, path: String, mut claims: Vec<Live>) -> Result<Vec<(String, String)>, Error> {
    let mut verdicts: Vec<(String, String)> = vec![];
    // The engine orders holders first, then by the tickets (or nodes) recorded; equal ones
    // (neither recorded) keep this order: creation order (the same in every lock: one
    // listing).
    claims.sort_by_key(|(c, _, _)| c.creation_timestamp().map(|t| t.0));
    let held = |c: &KeptClaim| ctx.registry.recorded_phase(c) == Some(Phase::Held);
    let recorded: Vec<Recorded> = claims
        .iter()
        .filter_map(|(c, part, node)| {
            let namespace = c.namespace()?;
            Some(Recorded {
                spec: ContenderSpec {
                    id: part.id.clone(),
                    lock: path.clone(),
                    mode: part.mode,
                    description: ids::describe_claim(&ctx.layout, &namespace, &c.name_any()),
                },
                held: held(c),
                node: node.clone(),
                ticket: c.ticket(),
            })
        })
        .collect();
    let recorded_held: HashSet<Arc<str>> = recorded.iter().filter(|r| r.held).map(|r| r.spec.id.clone()).collect();
    let anchored = match ctx.engine.reanchor(&path, recorded).await {
        Ok(anchored) => anchored,
        // The session (or leadership) is gone: the whole pass starts over.
        Err(e) if e.ends_session() => return Err(e.into()),
        // This lock alone cannot be served (no permission on a directory someone else
        // made, a directory that keeps changing): its claims end with the reason, and the
        // other locks go on.
        Err(e) => {
            tracing::error!(lock = %path, error = %e, "cannot re-anchor this lock; its claims end Lost");
            let why = format!("the claim's node could not be re-created after a new ZooKeeper session: {e}");
            return Ok(claims.iter().filter_map(|(c, _, _)| c.uid()).map(|uid| (uid, why.clone())).collect());
        }
    };
    for (id, state) in anchored.contenders.iter().filter(|(id, _)| recorded_held.contains(id)) {
        if matches!(state, ContenderState::Lost { why: LostReason::SessionExpired }) {
            return Err(crate::zk::Error::SessionLost.into());
        }
        let why = if anchored.displaced.contains(id) {
            "after a new ZooKeeper session the claim's node of the earlier one was gone, and other clusters queue \
             on this ClusterLock: one of them may have held it in the gap"
        } else if anchored.foreign_seen {
            "the ZooKeeper session changed and this lock is shared with clients other than zklock, which may \
             have held it in the gap"
        } else if !state.is_held() {
            "after a new ZooKeeper session the claim's node could not come back first"
        } else {
            continue;
        };
        verdicts.push((ids::claim_of(id).to_string(), why.into()));
    }
    tracing::info!(lock = %path, claims = anchored.contenders.len(), foreign = anchored.foreign_seen, "re-anchored");
    Ok(verdicts)
}

#[cfg(test)]
mod tests {
    use super::served_directory;

    #[test]
    fn cluster_lock_directories_are_re_anchored_whatever_namespaces_are_served() {
        let served = ["shop".to_string()];
        assert!(served_directory(&served, ""), "a ClusterLock's directory");
        assert!(served_directory(&served, "shop"));
        assert!(!served_directory(&served, "ci"), "a namespace not served is left alone");
        assert!(served_directory(&[], "ci") && served_directory(&[], ""));
    }
}
