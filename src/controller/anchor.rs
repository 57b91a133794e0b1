//! Re-anchoring on a new session (docs/design.md: re-anchoring): before anything new is admitted, every lock
//! gets the nodes of its live claims back, in the order their status records (holders first),
//! and the continuity rule decides whether a recorded holder keeps the lock.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::base::ids::{self, Part};
use super::base::{claim_facts, Error, Uid};
use super::claim_index::{ClaimRef, Listed};
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
/// the claims need not have been replayed into the term: each is noted in the registry here,
/// before its lock is judged). A claim over several locks is re-anchored in each of them, as one
/// contender per lock; in each lock the claims keep their recorded order, so two claims stand
/// in the same order in every lock they share, as when they were first enqueued.
///
/// Each lock admits new contenders as soon as it is re-anchored (unless a verdict on one of its
/// holders waits for the whole pass: see below), and locks where a claim asks for something go
/// first: their claims are reconciled at once (see [`Context::serves`]), the others when the pass
/// is over (the caller's walk). Which claims name a lock comes from the feeds' index (see
/// `claim_index`); each claim is read from its store only when its lock is taken, so the first
/// locks are judged without going through every claim first.
pub async fn reanchor_all(ctx: &Context) -> Result<(), Error> {
    let started = std::time::Instant::now();
    let Listed { locks: named, asking, unreadable } = ctx.claim_index.listed();
    let mut locks: BTreeMap<String, ToTake> =
        named.into_iter().map(|(path, claims)| (path, ToTake { claims, read: vec![] })).collect();
    // Where a claim that cannot be read holds is only in its status: read before any lock is
    // judged (they are few).
    for claim in unreadable.iter().filter_map(|r| stored(ctx, r)) {
        for live in unreadable_holds(ctx, &claim) {
            locks.entry(live.1.lock.clone()).or_default().read.push(live);
        }
    }
    let asked: HashSet<Arc<str>> = asking.iter().flat_map(|(_, paths)| paths.iter().cloned()).collect();
    tracing::debug!(took = ?started.elapsed(), locks = locks.len(), "the stores' locks listed");
    // Directories that hold nodes of earlier sessions but no unfinished claim any more: their
    // stale nodes must go too, or new claims would queue behind them until the old session
    // expires.
    let stale_only = ctx.engine.directories_with_nodes(&ctx.layout, |path| locks.contains_key(path)).await?;
    for (namespace, path) in stale_only {
        if served_directory(ctx.scopes.namespaces(), &namespace) {
            locks.entry(path).or_default();
        }
    }
    tracing::debug!(took = ?started.elapsed(), "directories with nodes scanned");
    // The session this pass re-anchors in; new contenders may join the queues of every other
    // lock from now on (none of our nodes is there, no unfinished claim names it).
    let (session, todo) = ctx.engine.begin_reanchoring(locks.keys().cloned())?;
    locks.retain(|path, _| todo.contains(path));
    ctx.serving.begin_reanchoring();
    // Claims that ask for something in locks admitted already (an earlier attempt of this
    // pass, in the same session): served now.
    for (r, paths) in &asking {
        if paths.iter().all(|path| !todo.contains(&**path)) {
            ctx.triggers.claim(ObjectRef::new(&r.name).within(&r.namespace));
        }
    }
    ctx.serve_deferred();
    tracing::debug!(
        locks = locks.len(),
        asked = asked.len(),
        "re-anchoring; locks where a claim asks for something first"
    );
    // Where a claim asks for something first (the sort is stable: path order otherwise).
    let mut locks: Vec<(String, ToTake)> = locks.into_iter().collect();
    locks.sort_by_key(|(path, _)| !asked.contains(path.as_str()));
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
    // A claim that asks for something while the pass runs (its holder pod deleted, say) has
    // its lock taken next, not in its place in the pass: at 10,000 claims the pass lasts
    // seconds.
    let queue = parking_lot::Mutex::new(PassQueue::new(locks));
    let next = futures::stream::poll_fn(|_| std::task::Poll::Ready(queue.lock().next(ctx)));
    let passes: Vec<Result<Vec<(String, String)>, Error>> = next
        .map(|(path, to_take)| async move {
            let (claims, asks) = lock_holds(ctx, &path, to_take);
            let verdicts = reanchor_lock(ctx, path.clone(), claims).await?;
            if verdicts.is_empty() && ctx.engine.session_id() == Some(session) {
                ctx.engine.admit_lock(session, &path);
                if !asks.is_empty() {
                    tracing::debug!(lock = %path, claims = asks.len(), "re-anchored where claims ask: serving them");
                }
                for uid in &asks {
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

/// A lock the pass is to take: the claims the index says name it, to be read from the stores
/// when it is taken, and the holds read already (claims that cannot be read).
#[derive(Default)]
struct ToTake {
    claims: Vec<ClaimRef>,
    read: Vec<Live>,
}

/// Claim `r` as its store has it now (none if it left).
fn stored(ctx: &Context, r: &ClaimRef) -> Option<Arc<KeptClaim>> {
    ctx.stores.claim(&r.namespace, &r.name)
}

/// Notes `claim` in the registry, the first pass only: a term's first pass does not wait for the
/// claims' replay into the term (`watch::claims`); a claim the replay brings later is known by
/// then. Later passes (a new session) find every claim noted by the replay and the watch:
/// noting one here again would bring back a claim whose cleanup the registry already forgot,
/// from a store copy that lags.
fn note(ctx: &Context, claim: &KeptClaim) {
    if !ctx.serving.anchored() {
        super::watch::first_seen(ctx, claim);
    }
}

/// Where a claim whose spec or status cannot be read holds: a holder keeps the nodes its status
/// records; a waiter's are not made again (the pass deletes them with the directory's stale
/// nodes), or once first they would hold the lock for ever.
fn unreadable_holds(ctx: &Context, claim: &Arc<KeptClaim>) -> Vec<Live> {
    note(ctx, claim);
    let Some(uid) = claim.uid() else { return vec![] };
    if claim_facts::cleaned_up(claim) || !claim_facts::keeps_nodes(ctx.registry.recorded_phase(claim)) {
        return vec![];
    }
    let recorded = claim_facts::recorded_parts(claim, &uid);
    recorded.into_iter().map(|(part, node)| (claim.clone(), part, Some(node))).collect()
}

/// What the stores say of lock `path` as the pass takes it: the claims recorded Held or Waiting
/// there (each with its part there and the node its status records), and those that ask for
/// something (see `claim_facts::asks`), live or not. Each is noted in the registry first, and
/// one listed without this term's epoch is told to it: no grant in its locks before this
/// term's first write to it.
fn lock_holds(ctx: &Context, path: &str, to_take: ToTake) -> (Vec<Live>, Vec<String>) {
    let ToTake { claims, read: mut lives } = to_take;
    let mut asked = vec![];
    for claim in claims.iter().filter_map(|r| stored(ctx, r)) {
        note(ctx, &claim);
        let (Some(namespace), Some(uid)) = (claim.namespace(), claim.uid()) else { continue };
        if claim_facts::cleaned_up(&claim) || claim.unreadable.is_some() {
            // Deleted, and its cleanup is done (our finalizer went; another keeps the object):
            // it holds nothing and waits for nothing, in this term too. Neither its node nor a
            // stamp is awaited: no reconcile of it will ever run again to make or give them.
            // One that cannot be read now but could when the pass listed the index: its spec is
            // as it was (immutable), so only its status became unreadable, and an unreadable
            // status records no node (`claim_facts::recorded_parts`): it holds nothing it
            // could be re-anchored with, as `unreadable_holds` would find.
            continue;
        }
        let phase = ctx.registry.recorded_phase(&claim);
        let live = matches!(phase, Some(Phase::Held | Phase::Waiting));
        let Ok(spec) = validate_spec(&claim.spec, &namespace) else { continue };
        let terminal = phase.is_some_and(Phase::is_terminal);
        let asks = claim_facts::asks(&claim, phase) && !terminal;
        // Listed after this term began: an earlier leader may still have a status write for
        // it on the way, and no grant in its locks before this term's first write to it
        // (docs/design.md: fencing). Claims created after the list never saw an earlier leader.
        let epoch = claim.leader_epoch();
        let shared = ctx.shared_uid(&uid);
        if ctx.epoch().is_some() && epoch != ctx.epoch() && !ctx.registry.written(&uid) && !terminal {
            ctx.registry.expect_stamp(&shared);
        }
        if asks {
            asked.push(uid.clone());
        }
        // Claims being deleted too: a holder keeps the lock until its cleanup has written its
        // final status (the next claim must not be Held before).
        if live {
            let parts = ids::parts_of(&ctx.layout, &namespace, &shared, &spec);
            for (i, part) in parts.into_iter().enumerate().filter(|(_, part)| part.lock == path) {
                let node = if spec.several {
                    claim.lock_statuses().get(i).filter(|l| l.lock_name == part.name).and_then(|l| l.znode.clone())
                } else {
                    claim.znode().map(str::to_string)
                };
                lives.push((claim.clone(), part, node));
            }
        }
    }
    (lives, asked)
}

/// The locks a re-anchoring pass has yet to take, in order, and which those are.
struct PassQueue {
    order: std::collections::VecDeque<(String, ToTake)>,
    left: HashSet<String>,
}

impl PassQueue {
    fn new(locks: Vec<(String, ToTake)>) -> Self {
        let left = locks.iter().map(|(path, _)| path.clone()).collect();
        PassQueue { order: locks.into(), left }
    }

    /// The next lock: one where a claim waits as deferred (see `Context::serves_reconcile`)
    /// first, else the next in order. A deferred claim not noted yet (its holder pod's deletion
    /// came before the pass took any of its locks) was deferred with its locks.
    fn next(&mut self, ctx: &Context) -> Option<(String, ToTake)> {
        let wanted: Vec<Arc<str>> = {
            let deferred = ctx.serving.deferred();
            let paths = |(uid, locks): &(Uid, Vec<Arc<str>>)| match ctx.registry.lock_paths(uid) {
                Some(noted) => noted,
                None => locks.clone(),
            };
            deferred.iter().flat_map(paths).collect()
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
