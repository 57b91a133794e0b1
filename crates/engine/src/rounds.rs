//! Evaluation rounds: read a lock directory, decide for the contenders that need it, repeat
//! while a new reason to read came up meanwhile. One task per lock at a time; a release costs
//! one event and one read, whatever the length of the queue.

use std::sync::{Arc, Weak};
use std::time::Duration;

use zookeeper_client as zk;

use super::book::{Book, LockQueue, NodeEvent};
use super::contender::{ContenderState, LostReason};
use super::core::Core;
use super::data::{DirMarker, CLEAN_DIRECTORY};
use super::stats::Stats;
use super::{anchor, ops, retry};
use crate::recipe::{self, Decision, Limit};

/// How long an evaluation waits before going round again after its session ended.
const SESSION_END_PAUSE: Duration = Duration::from_millis(50);

/// Decides every contender of the lock in `lock_path` again, with a fresh read: its limit
/// changed (a raise grants the waiters it lets in, a lower limit stops grants until fewer hold).
pub(super) fn decide_again(core: &Arc<Core>, lock_path: &str) {
    let mut book = core.book.lock();
    let Book { contenders, locks, .. } = &mut *book;
    let Some(key) = locks.get_key_value(lock_path).map(|(key, _)| key.clone()) else { return };
    let Some(q) = locks.get_mut(lock_path) else { return };
    for id in q.nodes.values() {
        if let Some(member) = contenders.get_mut(id) {
            member.stale = true;
        }
    }
    if q.request_evaluation() {
        drop(book);
        tokio::spawn(evaluate(Arc::downgrade(core), key));
    }
}

/// Reads a lock directory and decides for the contenders that need it, until no new reason to
/// read again came up meanwhile.
pub(super) async fn evaluate(core: Weak<Core>, lock_path: Arc<str>) {
    loop {
        let Some(strong) = core.upgrade() else { return };
        // No session: whoever makes nodes in a new one asks for an evaluation again.
        let Ok(client) = strong.client() else {
            let mut book = strong.book.lock();
            if let Some(q) = book.locks.get_mut(&*lock_path) {
                q.evaluating = false;
            }
            return book.drop_if_idle(&lock_path);
        };
        let session_id = client.session_id().0;
        let (window, full, number) = {
            let mut book = strong.book.lock();
            let Some(q) = book.locks.get_mut(&lock_path) else { return };
            q.dirty = false;
            q.reads += 1;
            (q.open(), std::mem::take(&mut q.full), q.reads)
        };
        let (children, pzxid) = match read(&client, &strong, &lock_path).await {
            Ok(Some(read)) => read,
            // A repair changed the directory: read it again.
            Ok(None) => {
                let mut book = strong.book.lock();
                if let Some(q) = book.locks.get_mut(&*lock_path) {
                    q.close(window);
                }
                continue;
            }
            Err(e) => {
                // After a session end, give its monitor the time to swap the session.
                let pause = retry::is_session_end(&e);
                let again = fail_lock(&strong, &client, &lock_path, window, e);
                drop(strong);
                if !again {
                    return;
                }
                if pause {
                    tokio::time::sleep(SESSION_END_PAUSE).await;
                }
                continue;
            }
        };
        if full {
            refresh_revocations(&client, &strong, &lock_path, session_id).await;
        }
        let current = strong.session_id();
        let read = Read { window, number, session_id, current, pzxid, full };
        if !apply(&strong, &lock_path, read, &children) {
            return;
        }
    }
}

/// A read or a repair failed. A session end is its monitor's business: go round again (the
/// next round takes the new session, if any). Any other failure leaves the contenders waiting
/// for a decision without one: they are lost, and their nodes are deleted so that they do not
/// block the queue. Returns true to go round again.
fn fail_lock(core: &Arc<Core>, client: &zk::Client, lock_path: &str, window: u64, e: zk::Error) -> bool {
    let session_id = client.session_id().0;
    let mut book = core.book.lock();
    if let Some(q) = book.locks.get_mut(lock_path) {
        q.close(window);
    }
    if retry::is_session_end(&e) {
        if let Some(q) = book.locks.get_mut(lock_path) {
            q.dirty = true;
        }
        return book.finish_round(lock_path);
    }
    tracing::warn!(lock = %lock_path, error = %e, "cannot read the lock directory");
    let ids: Vec<Arc<str>> = book.locks.get(lock_path).map_or(vec![], |q| q.nodes.values().cloned().collect());
    let mut orphans = vec![];
    for id in ids {
        if book.contenders.get(&id).is_some_and(|m| m.stale && m.session_id == session_id) {
            let lost = ContenderState::Lost { why: LostReason::Failed(e.to_string()) };
            orphans.extend(core.remove(&mut book, &id, lost).map(|m| m.path()));
        }
    }
    let again = book.finish_round(lock_path);
    drop(book);
    ops::delete_in_background(client, core, orphans);
    again
}

/// One read of a lock directory, as `apply` needs to know it.
struct Read {
    /// The window opened before the read was sent.
    window: u64,
    /// Its number among the directory's reads.
    number: u64,
    session_id: i64,
    /// The engine's session when the answer is applied.
    current: Option<i64>,
    /// The directory's pzxid in the answer.
    pzxid: i64,
    /// Decide for every contender, not only the stale ones.
    full: bool,
}

/// Applies one read of the directory; returns true when it must be read again.
fn apply(core: &Arc<Core>, lock_path: &str, read: Read, children: &[String]) -> bool {
    let Read { window, number, session_id, current, pzxid, full } = read;
    let queue = recipe::queue(children);
    let mut book = core.book.lock();
    let limit = book.limit(lock_path);
    let Book { contenders, locks, .. } = &mut *book;
    let Some(q) = locks.get_mut(lock_path) else { return false };
    let mut missing = vec![];
    let mut to_stamp = vec![];
    // Tokens are handed out raised by it (see `token_base`).
    let token_base = core.token_base();
    // In queue order, so that the grants of one read take their tokens in the queue's order.
    let base = recipe::wrap_base(queue.iter().map(|c| c.sequence));
    let mut ids: Vec<(u64, Arc<str>)> =
        q.nodes.iter().map(|(sequence, id)| (recipe::queue_key(*sequence, base), id.clone())).collect();
    ids.sort_unstable_by_key(|(key, _)| *key);
    for (_, id) in &ids {
        let Some(member) = contenders.get_mut(id) else { continue };
        // Granted already: only its token is awaited, and a grant is never taken back.
        if !(member.stale || full) || member.granting {
            continue;
        }
        if member.session_id != session_id {
            // Made in a newer session than this read: the next round, on that session, decides.
            // (Members of an older one go with it.)
            if Some(member.session_id) == current {
                q.dirty = true;
            }
            continue;
        }
        if member.reads_before >= number {
            // Sent before the node was made: the next read (already asked for) decides.
            q.dirty = true;
            continue;
        }
        let before = member.state();
        let decision = match recipe::decide_in(&queue, &member.name, limit) {
            // A hold is never taken back by a decision (a lower limit takes nothing away); only
            // the node's deletion ends it.
            Decision::Waiting { .. } if member.decision == Some(Decision::Held) => Decision::Held,
            decision => decision,
        };
        match &decision {
            Decision::Missing => {
                missing.push(id.clone());
                continue;
            }
            Decision::Held
                if member.fencing_token == 0
                    && matches!(limit, Limit::Permits(_))
                    && pzxid + token_base <= q.last_token =>
            {
                // With permits, one read can grant several contenders, and a raise of the
                // permits grants from a read that shows no change: this read's zxid is taken.
                // The grant waits for a zxid of its own (one write), as undecided as before.
                member.granting = true;
                member.stale = false;
                to_stamp.push((id.clone(), member.path()));
                continue;
            }
            Decision::Held if member.fencing_token == 0 => {
                // The fencing token is the zxid of the directory state in which the grant was
                // decided: it is above the zxid that removed the previous holder, so tokens of
                // successive holders strictly increase. (The node's czxid alone is not enough:
                // nodes re-created together by one multi-op share one czxid.) This read was
                // sent after the node was made (`reads_before`), so the pzxid it answers is at
                // least the node's czxid; granted at once, the two are equal. Shared holders of
                // a mutex granted together share it, as they share the lock.
                member.fencing_token = pzxid + token_base;
                q.last_token = q.last_token.max(pzxid + token_base);
            }
            _ => {}
        }
        // A node whose deletion wakes it went away after the read was answered, before this
        // task got here: the dispatcher could not know it would wake us. Read again.
        let gone = matches!(&decision, Decision::Waiting { .. })
            && q.any_seen_since(window, NodeEvent::Deleted, |n| decision.woken_by(&member.name, n));
        member.stale = gone;
        if gone {
            q.dirty = true;
        }
        // A decision never goes back from Held: only the node's deletion ends a hold.
        if member.decision != Some(Decision::Held) {
            member.decision = Some(decision);
        }
        core.publish(id, &before, member.state());
        if let Some(decided) = member.decided.take() {
            let _ = decided.send(());
        }
    }
    q.close(window);
    for id in missing {
        core.remove(&mut book, &id, ContenderState::Lost { why: LostReason::DeletedByOther });
    }
    let again = book.finish_round(lock_path);
    drop(book);
    if !to_stamp.is_empty() {
        tokio::spawn(stamp_all(Arc::downgrade(core), to_stamp));
    }
    again
}

/// Stamps the grants of one read one after the other, in queue order (see [`stamp`]).
async fn stamp_all(core: Weak<Core>, grants: Vec<(Arc<str>, String)>) {
    for (id, path) in grants {
        stamp(core.clone(), id, path).await;
    }
}

/// Gives a grant a fencing token of its own: writes the node's data back unchanged, guarded by
/// its version (a revocation request written meanwhile is kept: the write is made again) and
/// by the leader epoch, and takes the write's zxid, again while it is not above the lock's last
/// token (a later read may have granted meanwhile). Then the grant is published. A node gone
/// or a session ended is for the deletion event or the session's monitor to report.
async fn stamp(core: Weak<Core>, id: Arc<str>, path: String) {
    loop {
        let Some(strong) = core.upgrade() else { return };
        let Ok(client) = strong.client() else { return };
        let zxid = match strong.fence.touch(&client, &path).await {
            Ok(stat) => stat.mzxid + strong.token_base(),
            Err(e) => {
                if !(retry::is_session_end(&e) || e == zk::Error::NoNode) {
                    tracing::warn!(node = %path, error = %e, "cannot give a grant its fencing token; deciding again");
                    let mut book = strong.book.lock();
                    if let Some(member) = book.contenders.get_mut(&id).filter(|m| m.path() == path) {
                        member.granting = false;
                        member.stale = true;
                        let lock = member.lock.clone();
                        if book.locks.get_mut(&lock).is_some_and(LockQueue::request_evaluation) {
                            drop(book);
                            tokio::spawn(evaluate(Arc::downgrade(&strong), lock));
                        }
                    }
                }
                return;
            }
        };
        Stats::bump(&strong.stats.grant_stamps);
        let mut book = strong.book.lock();
        let Book { contenders, locks, .. } = &mut *book;
        let Some(member) = contenders.get_mut(&id).filter(|m| m.path() == path && m.granting) else { return };
        let Some(q) = locks.get_mut(&member.lock) else { return };
        if zxid <= q.last_token {
            continue;
        }
        q.last_token = zxid;
        let before = member.state();
        member.granting = false;
        member.fencing_token = zxid;
        member.decision = Some(Decision::Held);
        strong.publish(&id, &before, member.state());
        if let Some(decided) = member.decided.take() {
            let _ = decided.send(());
        }
        return;
    }
}

/// Reads the directory's children and pzxid, then, before deciding, makes the repairs that
/// need ZooKeeper: deletes second nodes carrying the id of one of our contenders, and marks the
/// directory when a client other than zklock uses it. Learns from the directory's marker
/// whether foreign clients used it before (what [`Core::suspend_shared_holds`] asks). `None`
/// when it deleted a node (the directory must be read again).
async fn read(client: &zk::Client, core: &Core, lock_path: &str) -> Result<Option<(Vec<String>, i64)>, zk::Error> {
    Stats::bump(&core.stats.children_reads);
    // No directory, no nodes: every contender in it is gone.
    let ops::Listing { children, pzxid, data_length, data_version } = ops::children_or_empty(client, lock_path).await?;
    let session_id = client.session_id().0;
    let queue = recipe::queue(&children);
    let base = recipe::wrap_base(queue.iter().map(|c| c.sequence));
    // (duplicate's path, its sequence, our contender's sequence)
    let (duplicates, known_foreign, marker_known): (Vec<(String, u64, u64)>, bool, bool) = {
        let book = core.book.lock();
        let duplicates = queue
            .iter()
            .filter_map(|c| {
                let (id, _) = c.ours?;
                let member = book.contenders.get(id)?;
                (member.session_id == session_id && *member.name != *c.name && *member.lock == *lock_path)
                    .then(|| (format!("{lock_path}/{}", c.name), c.sequence, member.sequence))
            })
            .collect();
        let q = book.locks.get(lock_path);
        (duplicates, q.is_some_and(|q| q.foreign), q.is_some_and(|q| q.marker_read == Some(data_version)))
    };
    // A second node with our id. Ours wins over one of our own session (a create retried
    // after a lost answer) and over an older one (left by an earlier session). A newer node of
    // another session is a newer incarnation of this contender (re-anchored by a new leader):
    // that one wins, and ours will be deleted by it.
    let mut deleted = false;
    for (path, sequence, mine) in duplicates {
        let owner = match retry::idempotent(|| client.check_stat(&path)).await? {
            Some(stat) => stat.ephemeral_owner,
            None => continue,
        };
        if owner != session_id && recipe::queue_key(sequence, base) > recipe::queue_key(mine, base) {
            continue;
        }
        tracing::warn!(node = %path, "deleting a second node of one contender");
        match retry::idempotent(|| core.fence.delete_version(client, &path, None)).await {
            Ok(()) => Stats::bump(&core.stats.duplicates_deleted),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(e),
        }
        deleted = true;
    }
    let mut foreign = known_foreign;
    if !foreign && !marker_known {
        // Zklock's clean marker is "0" (and "" is nobody's): a longer one (the foreign marker
        // "-1", an older JSON one, a stranger's data) is read, once per version.
        if data_length > CLEAN_DIRECTORY.len() as i32 {
            match retry::idempotent(|| client.get_data(lock_path)).await {
                Ok((body, _)) => foreign = DirMarker::parse(&body).foreign_seen,
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if !deleted && !foreign && queue.iter().any(|c| c.ours.is_none()) {
        // After a session gap, holders in this directory cannot be assumed to have kept the lock.
        match anchor::mark_foreign(client, core, lock_path).await {
            Ok(()) => foreign = true,
            // Other writers kept changing the directory's data: read it again (no loss).
            Err(zk::Error::BadVersion) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    if let Some(q) = core.book.lock().locks.get_mut(lock_path) {
        q.foreign |= foreign;
        q.marker_read = Some(data_version);
    }
    Ok((!deleted).then_some((children, pzxid)))
}

/// Reads every contender's node in the lock for revocation requests (after a reconnection).
async fn refresh_revocations(client: &zk::Client, core: &Core, lock_path: &str, session_id: i64) {
    let paths: Vec<(Arc<str>, String)> = {
        let book = core.book.lock();
        let Some(q) = book.locks.get(lock_path) else { return };
        q.nodes
            .values()
            .filter_map(|id| {
                book.contenders.get(id).filter(|m| m.session_id == session_id).map(|m| (id.clone(), m.path()))
            })
            .collect()
    };
    let reads = paths.iter().map(|(_, path)| retry::idempotent(move || client.get_data(path)));
    let bodies = futures::future::join_all(reads).await;
    let mut book = core.book.lock();
    for ((id, path), body) in paths.iter().zip(bodies) {
        if let Ok((body, _)) = body {
            core.note_revocation(&mut book, id, path, &body);
        }
    }
}
