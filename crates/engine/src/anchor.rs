//! Re-anchoring a lock on a new session, and the lock directory's marker for foreign clients.
//!
//! Ephemeral nodes die with their session, and a session cannot be taken over by a new process,
//! so a new session (a new leader, or the same one after expiry) recreates the nodes of every
//! live claim, in the order the claims' status records, before anything new is admitted. The
//! directory's data records whether a node not made by zklock was ever seen there: in such a
//! directory a session gap may have let a foreign client hold the lock, so holders cannot be
//! assumed to have kept it.

use zookeeper_client as zk;

use super::contender::{ContenderSpec, Recorded};
use super::core::Core;
use super::data::{DirMarker, NodeData};
use super::ops::{self, node_name};
use super::retry::{self, Backoff};
use super::stats::Stats;
use super::Error;
use crate::recipe;

/// Attempts before giving up on a directory that keeps changing under us.
const MAX_ATTEMPTS: usize = 20;
/// Operations per multi-op: keeps each request well under ZooKeeper's 1 MiB jute.maxbuffer.
const OPS_PER_MULTI: usize = 1000;

/// The order re-created nodes take: recorded holders first; then contenders recorded by an
/// earlier release (a node but no ticket), in the order of the nodes they had (across a wrap of
/// the sequence too): they were enqueued before any contender with a ticket; then the others by
/// ticket; then those with neither, as given. Each with whether it was recorded holding.
///
/// Tickets, not the recorded nodes: each re-creation numbers the nodes anew, and the records of
/// the nodes catch up one status write at a time, so after two session changes close together
/// the recorded nodes mix two numberings (a contender whose record lagged would be put back
/// ahead of one enqueued before it). A ticket is the zxid of the first enqueue, kept by every
/// re-creation, and zxids order every enqueue the ensemble ever made.
pub(super) fn queue_order(mut recorded: Vec<Recorded>) -> Vec<(ContenderSpec, bool, Option<i64>)> {
    let sequence = |r: &Recorded| r.node.as_deref().map(node_name).and_then(recipe::parse_child).map(|c| c.sequence);
    let base = recipe::wrap_base(recorded.iter().filter(|r| r.ticket.is_none()).filter_map(sequence));
    // Tickets of an ensemble whose data were made anew since are below 0 here (see
    // `LockEngine::reanchor`): they keep their order among themselves.
    let key = |r: &Recorded| match (r.ticket, sequence(r)) {
        (None, Some(sequence)) => (0, i128::from(recipe::queue_key(sequence, base))),
        (Some(ticket), _) => (1, i128::from(ticket)),
        (None, None) => (2, 0),
    };
    recorded.sort_by_key(|r| (!r.held, key(r)));
    recorded.into_iter().map(|r| (r.spec, r.held, r.ticket)).collect()
}

pub(super) struct Recreated {
    /// The node name of each contender, in the order given.
    pub nodes: Vec<String>,
    /// Whether each contender's node was put in place of the one it had (a directory other
    /// clusters queue in, see [`recreate`]); false where it was made anew.
    pub kept: Vec<bool>,
    pub foreign_seen: bool,
}

/// In one multi-op per thousand nodes, guarded by the directory's version: deletes every
/// zklock node left by earlier sessions and creates `contenders`' nodes in the given order.
///
/// In the directory of a `ClusterLock` that other clusters share, their operators queue too,
/// and a node made anew would land behind their waiters (each cluster's operator takes only the
/// nodes of its own root for its own). There a contender whose node of an earlier session still
/// stands (its operator stopped or crashed, its session not yet expired) gets it replaced in
/// place: the old node deleted and one of the same name, so of the same place, made in this
/// session, in one multi-op, which fails if the old node is gone meanwhile. Nobody else can
/// hold the place meanwhile, so a holder keeps the lock and its token. A contender whose old
/// node is gone gets a new one at the back; a holder among them cannot be proven to have kept
/// the lock (another cluster may have held it in the gap), which the caller learns from `kept`.
pub(super) async fn recreate(
    client: &zk::Client,
    core: &Core,
    lock: &str,
    contenders: &[(ContenderSpec, Option<i64>)],
) -> Result<Recreated, Error> {
    let node_options_acls = core.config.node_acls();
    let node_options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::new(&node_options_acls));
    let in_place_options_acls = core.config.node_acls();
    let in_place_options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::new(&in_place_options_acls));
    let owner = core.owner();
    let shared = core.is_shared_lock(lock);
    // Its marker decides the continuity rule: nobody but us may write it.
    super::acl::protect(client, &core.config, lock, &core.config.directory_acls()).await;
    let mut backoff = Backoff::new();
    for _ in 0..MAX_ATTEMPTS {
        let (body, stat) = match retry::idempotent(|| client.get_data(lock)).await {
            Ok(found) => found,
            Err(zk::Error::NoNode) => {
                ops::ensure_dir(client, &core.config, lock).await?;
                continue;
            }
            Err(e) => return Err(Error::zk("get", lock, e)),
        };
        let children = ops::list(client, lock).await?;
        let queue = recipe::queue(&children);
        // Nodes named as ours are this root's only if their data says so: the others are
        // another root's contenders (they stay, and may have held in our gap).
        let named_ours: Vec<String> =
            queue.iter().filter(|c| c.ours.is_some()).map(|c| format!("{lock}/{}", c.name)).collect();
        let (stale, others) = owned(client, &named_ours, owner.as_deref()).await?;
        // Another root's nodes in a shared ClusterLock's directory are other clusters' claims;
        // anywhere else they count as a foreign client's.
        // A directory made after a contender first queued in it was removed and made again
        // meanwhile (only an empty directory can go: Curator makes lock directories as
        // containers, which ZooKeeper reaps once empty), and its marker went with it: nothing
        // recorded there survives, so nobody can prove who held it in the gap.
        let made_again = contenders.iter().filter_map(|(_, ticket)| *ticket).any(|ticket| ticket < stat.czxid);
        let foreign_seen = DirMarker::parse(&body).foreign_seen
            || made_again
            || queue.iter().any(|c| c.ours.is_none())
            || (!shared && !others.is_empty());

        // Every operation, in order: the marker write (guarded by the version just read), the
        // stale deletes, the replacements in place, then the creates in queue order.
        enum Op<'a> {
            Delete(&'a str),
            Replace(usize, String),
            Create(usize),
        }
        let mut olds: Vec<(&str, &str)> = vec![];
        if shared {
            for path in &stale {
                if let Some((id, _)) = recipe::parse_child(node_name(path)).and_then(|c| c.ours) {
                    olds.push((id, path.as_str()));
                }
            }
            // The first node of a contender is its place; a second one (a create retried after
            // a lost answer) goes.
            olds.sort_by_key(|(id, path)| {
                (*id, recipe::parse_child(node_name(path)).map_or(u64::MAX, |c| recipe::queue_key(c.sequence, 0)))
            });
            olds.dedup_by_key(|(id, _)| *id);
        }
        let replaced: Vec<Option<&str>> = contenders
            .iter()
            .map(|(spec, _)| olds.iter().find(|(id, _)| *id == &*spec.id).map(|(_, path)| *path))
            .collect();
        let mut ops: Vec<Op> =
            stale.iter().filter(|p| !replaced.contains(&Some(p.as_str()))).map(|p| Op::Delete(p)).collect();
        for (i, old) in replaced.iter().enumerate() {
            if let Some(old) = old {
                ops.push(Op::Replace(i, old.to_string()));
            }
        }
        ops.extend((0..contenders.len()).filter(|i| replaced[*i].is_none()).map(Op::Create));
        let kept: Vec<bool> = replaced.iter().map(Option::is_some).collect();
        let marker = DirMarker { foreign_seen }.to_bytes();
        let mut version = stat.version;
        let mut nodes = vec![String::new(); contenders.len()];
        let mut conflict = false;
        // An empty plan still writes the marker once. A replacement is two operations.
        let chunks: Vec<&[Op]> = if ops.is_empty() { vec![&[]] } else { ops.chunks(OPS_PER_MULTI / 2).collect() };
        for chunk in chunks {
            // Guarded by the leader epoch, like every write of the engine.
            let mut multi = core.fence.writer(client).map_err(|e| Error::zk("multi", lock, e))?;
            multi.add_set_data(lock, marker, Some(version)).map_err(|e| Error::zk("multi", lock, e))?;
            let data = |i: usize| {
                let (spec, ticket) = &contenders[i];
                NodeData::new(&spec.id, spec.mode, &spec.description)
                    .with_ticket(*ticket)
                    .with_root(owner.clone())
                    .to_bytes()
            };
            // The contender each create's answer is for.
            let mut created_for = vec![];
            for op in chunk {
                match op {
                    Op::Delete(path) => multi.add_delete(path, None),
                    Op::Replace(i, old) => {
                        created_for.push(*i);
                        // Fails the whole multi-op if the old node is gone: its place may be
                        // somebody else's now.
                        multi.add_delete(old, None).and_then(|()| multi.add_create(old, &data(*i), &in_place_options))
                    }
                    Op::Create(i) => {
                        created_for.push(*i);
                        let (spec, _) = &contenders[*i];
                        multi.add_create(
                            &format!("{lock}/{}", recipe::node_prefix(&spec.id, spec.mode)),
                            &data(*i),
                            &node_options,
                        )
                    }
                }
                .map_err(|e| Error::zk("multi", lock, e))?;
            }
            let mut created_for = created_for.into_iter();
            match core.fence.commit(&mut multi).await {
                Ok(results) => {
                    for result in results {
                        match result {
                            zk::MultiWriteResult::SetData { stat } => version = stat.version,
                            zk::MultiWriteResult::Create { path, .. } => {
                                Stats::bump(&core.stats.creates);
                                if let Some(i) = created_for.next() {
                                    nodes[i] = node_name(&path).to_string();
                                }
                            }
                            zk::MultiWriteResult::Delete => Stats::bump(&core.stats.deletes),
                            _ => {}
                        }
                    }
                }
                // The directory changed under us (a version moved, a node vanished or
                // appeared): read it again and start over.
                Err(zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NodeExists) => {
                    conflict = true;
                    break;
                }
                Err(e) if retry::is_unknown_outcome(&e) => {
                    // Whether it applied shows in the directory: start over, and the nodes we
                    // created (if it applied) are this session's, so they are not stale: find
                    // them by id instead of creating more.
                    Stats::bump(&core.stats.create_unknown_outcomes);
                    if let Some(found) = find_all(client, lock, contenders).await? {
                        // A node found under the name its old one had was put in its place.
                        let kept = found
                            .iter()
                            .zip(&replaced)
                            .map(|(n, old)| old.is_some_and(|o| node_name(o) == n))
                            .collect();
                        return Ok(Recreated { nodes: found, kept, foreign_seen });
                    }
                    conflict = true;
                    break;
                }
                Err(e) => return Err(Error::zk("multi", lock, e)),
            }
        }
        if !conflict {
            // The multi was guarded by the directory's data version, which a new child does not
            // move (ZooKeeper has no check of the child version): a stranger's node made between
            // the listing above and the commit is found only by listing again. Its owner may be
            // granted the lock now, so the directory counts as shared with foreign clients, and
            // recorded holders there cannot claim continuity.
            let after = ops::list(client, lock).await?;
            let slipped_in =
                recipe::queue(&after).iter().any(|c| c.ours.is_none() && !children.iter().any(|n| n == c.name));
            if slipped_in && !foreign_seen {
                tracing::warn!(lock, "a foreign node was made while the lock was re-anchored");
                mark_foreign(client, core, lock).await.map_err(|e| Error::zk("set", lock, e))?;
            }
            return Ok(Recreated { nodes, kept, foreign_seen: foreign_seen || slipped_in });
        }
        backoff.wait().await;
    }
    Err(Error::zk("reanchor", lock, zk::Error::BadVersion))
}

/// Splits `nodes` (named as zklock's) into those of root `mine` (or naming no root), and the
/// others, by reading each one's data. A node gone meanwhile is in
/// neither: the multi-op that follows sees the directory changed, and re-anchoring reads again.
async fn owned(client: &zk::Client, nodes: &[String], mine: Option<&str>) -> Result<(Vec<String>, Vec<String>), Error> {
    let reads = nodes.iter().map(|path| async move {
        match retry::idempotent(|| client.get_data(path)).await {
            Ok((data, _)) => Ok(Some((path, NodeData::owned_by(&data, mine)))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(Error::zk("get", path, e)),
        }
    });
    let (mut ours, mut others) = (vec![], vec![]);
    for read in futures::future::join_all(reads).await {
        match read? {
            Some((path, true)) => ours.push(path.clone()),
            Some((path, false)) => others.push(path.clone()),
            None => {}
        }
    }
    Ok((ours, others))
}

/// The nodes of all `contenders` made by this session, if every one of them has one.
async fn find_all(
    client: &zk::Client,
    lock: &str,
    contenders: &[(ContenderSpec, Option<i64>)],
) -> Result<Option<Vec<String>>, Error> {
    let children = ops::list(client, lock).await?;
    let mut found = Vec::with_capacity(contenders.len());
    for (spec, _) in contenders {
        let Some((name, _)) = ops::own_node(client, lock, &children, &spec.id).await? else { return Ok(None) };
        found.push(name);
    }
    Ok(Some(found))
}

/// Removes lock directory `lock` if it is empty and no foreign node was ever seen in it (a
/// marked directory keeps its mark's meaning: there, holders cannot claim continuity across a
/// session gap), then its parent (a namespace's directory) if that is empty too. Best effort:
/// ZooKeeper refuses to delete a directory with children, and the delete is guarded by the
/// version read, so a concurrent mark or a new contender always wins.
pub(super) async fn remove_if_empty(client: &zk::Client, core: &Core, lock: &str) {
    let Ok((body, stat)) = retry::idempotent(|| client.get_data(lock)).await else { return };
    if DirMarker::parse(&body).foreign_seen {
        return;
    }
    let removed = retry::idempotent(|| core.fence.delete_version(client, lock, Some(stat.version))).await;
    // No node: our own delete, repeated after its answer was lost, or somebody else's. Gone
    // either way, so the parent may go too.
    if matches!(removed, Ok(()) | Err(zk::Error::NoNode)) {
        if removed.is_ok() {
            Stats::bump(&core.stats.directories_removed);
        }
        if let Some((parent, _)) = lock.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            // Fails while other locks of the namespace live: the usual case.
            let _ = retry::idempotent(|| core.fence.delete_version(client, parent, None)).await;
        }
    }
}

/// Records in the directory's data that a foreign node was seen there (guarded by the leader
/// epoch, as every write). Idempotent. A stranger's data is replaced too: kazoo's semaphore
/// writes its lease count there when it makes the directory, and would go on granting leases
/// to semaphores of that count.
pub(super) async fn mark_foreign(client: &zk::Client, core: &Core, lock: &str) -> Result<(), zk::Error> {
    // A foreign client may have made the directory, open to all: nobody else may reset the mark.
    super::acl::protect(client, &core.config, lock, &core.config.directory_acls()).await;
    let marker = DirMarker { foreign_seen: true }.to_bytes();
    core.fence.rewrite(client, lock, |body| (body != marker).then(|| marker.to_vec())).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(id: &str, held: bool, node: Option<&str>) -> Recorded {
        let spec =
            ContenderSpec { id: id.into(), lock: "/l".into(), mode: recipe::Mode::Exclusive, description: "".into() };
        Recorded { spec, held, node: node.map(str::to_string), ticket: None }
    }

    #[test]
    fn recorded_holders_come_first_then_recorded_nodes_in_queue_order_then_the_rest_as_given() {
        let given = vec![
            recorded("late", false, None),
            // Made after the sequence wrapped to negative: queued after the positive ones.
            recorded("wrapped", false, Some("/l/write-c-lock--2147483648")),
            recorded("second", false, Some("write-b-lock-2147483647")),
            recorded("holder", true, Some("/l/write-a-lock--2147483647")),
            recorded("later", false, None),
        ];
        let order: Vec<(String, bool)> =
            queue_order(given).into_iter().map(|(s, held, _)| (s.id.to_string(), held)).collect();
        let ids: Vec<&str> = order.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["holder", "second", "wrapped", "late", "later"]);
        assert_eq!(order.iter().map(|(_, held)| *held).collect::<Vec<_>>(), [true, false, false, false, false]);
    }

    #[test]
    fn tickets_order_what_the_recorded_nodes_of_two_numberings_would_not() {
        let ticketed =
            |id: &str, node: &str, ticket: i64| Recorded { ticket: Some(ticket), ..recorded(id, false, Some(node)) };
        let given = vec![
            // Re-created by the last session (a higher sequence), enqueued before "lagging".
            ticketed("early", "write-a-lock-0000000011", 100),
            // Its record still names its node from before that session.
            ticketed("lagging", "write-b-lock-0000000003", 200),
            ticketed("holder", "write-h-lock-0000000010", 50),
            // Recorded by an earlier release: a node, no ticket.
            recorded("legacy", false, Some("write-c-lock-0000000002")),
            recorded("new", false, None),
        ];
        let given =
            given.into_iter().map(|r| if r.spec.id.as_ref() == "holder" { Recorded { held: true, ..r } } else { r });
        let order: Vec<String> = queue_order(given.collect()).into_iter().map(|(s, _, _)| s.id.to_string()).collect();
        assert_eq!(order, ["holder", "legacy", "early", "lagging", "new"]);
    }
}
