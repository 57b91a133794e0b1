//! Nodes made in a lock directory become contenders: entered in the book, each given its first
//! decision by a round, and their callers answered once it is made. Above the engine's tasks
//! (rounds, the session's revocation reads, background deletes), which it starts.

use std::sync::Arc;

use tokio::sync::oneshot;
use zookeeper_client as zk;

use super::book::{Member, NodeEvent};
use super::contender::{ContenderSpec, ContenderState};
use super::core::{Core, Registered};
use super::{ops, rounds, session, Error};
use crate::recipe::{self, Decision};

/// A node just made for a contender.
pub(super) struct Made {
    pub spec: ContenderSpec,
    /// Its name in the lock directory.
    pub name: String,
    /// A recorded holder re-anchored ahead of everybody: held from the start.
    pub keeps_hold: bool,
    /// The contender's ticket.
    pub ticket: i64,
}

/// Enters freshly made nodes in the book, asks for their first decision and closes the
/// create's window. A node whose contender id is tracked already (a concurrent enqueue of
/// the same id won) is deleted again. A node marked as keeping a hold (a recorded holder,
/// re-anchored ahead of everybody) is held from the start, whatever the lock's limit.
pub(super) fn register(
    core: &Arc<Core>,
    client: &zk::Client,
    lock_path: &Arc<str>,
    window: u64,
    nodes: Vec<Made>,
) -> Result<Registered, Error> {
    let session_id = client.session_id().0;
    let mut registered = Vec::with_capacity(nodes.len());
    let mut extra = vec![];
    let mut data_changed = vec![];
    let start = {
        let mut book = core.book.lock();
        if book.lost_sessions.contains(&session_id) {
            // The session ended while the nodes were being made: they go with it, and
            // nobody would ever decide for them.
            book.close_window(lock_path, window);
            return Err(Error::SessionLost);
        }
        for Made { spec, name, keeps_hold, ticket } in nodes {
            if let Some(member) = book.contenders.get(&*spec.id) {
                // A second node of a contender already tracked is a duplicate, to be deleted;
                // its own node (replaced in place, so of the same name) is not.
                if member.lock != *lock_path || *member.name != *name {
                    extra.push(format!("{lock_path}/{name}"));
                }
                registered.push((spec.id.clone(), None));
                continue;
            }
            let id = spec.id.clone();
            // Back (re-anchored): no longer lost.
            book.lost.remove(&*id);
            let sequence = recipe::parse_child(&name).map_or(0, |c| c.sequence);
            let (tx, rx) = oneshot::channel();
            let member = Member {
                lock: lock_path.clone(),
                name: name.into_boxed_str(),
                sequence,
                session_id,
                fencing_token: 0,
                ticket,
                decision: keeps_hold.then_some(Decision::Held),
                revoke: None,
                stale: true,
                reads_before: book.locks.get(lock_path).map_or(0, |q| q.reads),
                decided: Some(tx),
                granting: false,
            };
            if let Some(q) = book.locks.get_mut(lock_path) {
                q.nodes.insert(sequence, id.clone());
                if q.seen_since(window, &member.name, NodeEvent::DataChanged) {
                    data_changed.push((id.clone(), member.path()));
                }
            }
            book.contenders.insert(id.clone(), Box::new(member));
            registered.push((id, Some(rx)));
        }
        book.locks.get_mut(lock_path).is_some_and(|q| {
            let start = q.request_evaluation();
            q.close(window);
            start
        })
    };
    if start {
        tokio::spawn(rounds::evaluate(Arc::downgrade(core), lock_path.clone()));
    }
    for (id, path) in data_changed {
        tokio::spawn(session::read_revocation(Arc::downgrade(core), id, path));
    }
    ops::delete_in_background(client, core, extra);
    Ok(registered)
}

/// Waits until every registered node has had its first decision; answers each one's state.
pub(super) async fn settle(core: &Core, registered: Registered) -> Vec<(Arc<str>, ContenderState)> {
    let mut settled = Vec::with_capacity(registered.len());
    for (id, decided) in registered {
        if let Some(decided) = decided {
            // Dropped unanswered when the contender ended first: its state says how.
            let _ = decided.await;
        }
        let state = core.book.lock().state(&id).unwrap_or(ContenderState::Released);
        settled.push((id, state));
    }
    settled
}
