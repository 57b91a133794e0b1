//! What the engine and its tasks share: the session, the book of contenders and the fence.
//! The tasks hold it weakly, so that dropping the last [`super::LockEngine`] closes the
//! session (ZooKeeper then deletes the ephemeral nodes) and stops them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, OnceCell};
use zookeeper_client as zk;

use super::book::{Book, Member};
use super::contender::{ContenderState, EngineEvent, LostReason, SessionEvent, CONNECTION_LOST};
use super::fence::Fence;
use super::stats::Stats;
use super::{Error, ZkConfig};
use crate::recipe::Decision;

pub(super) struct Core {
    pub config: ZkConfig,
    pub stats: Stats,
    events: Option<mpsc::UnboundedSender<EngineEvent>>,
    pub book: Mutex<Book>,
    pub session: Mutex<Option<zk::Client>>,
    /// Where new contenders may join queues. A new session is re-anchored first
    /// (docs/design.md: re-anchoring): a node made in it before would jump the recorded queue.
    pub admission: Mutex<Admission>,
    /// Parent directories of lock directories, watched recursively: (path, session) → the
    /// watch. Only while a lock below is tracked (the idle sweeper stops the others).
    pub parents: Mutex<HashMap<ParentKey, Arc<ParentWatch>>>,
    /// The leader epoch every write of this engine is guarded by.
    pub fence: Fence,
    /// Lock directories our last contender left, and since when: removed, if still idle and
    /// empty, once the config's `idle_directory_grace` has passed (one sweeper task at a time).
    pub idle_directories: Mutex<HashMap<Arc<str>, Instant>>,
    /// The root this engine serves and for which installation (see [`super::root`]): taken
    /// again in every new session.
    pub root: Mutex<Option<(super::Layout, super::Installation, String)>>,
    /// Holders of locks others share, asked to let go when the connection dropped, and the
    /// moment by which they must be ended (see [`Core::suspend_shared_holds`]).
    pub suspended: Mutex<Option<Suspension>>,
    /// What every zxid this engine hands out is raised by (see [`super::token_base`]): set
    /// once, before the engine's first grant, and 0 for an engine that never takes one.
    pub token_base: std::sync::atomic::AtomicI64,
}

/// Holds that cannot be proven while ZooKeeper is out of reach.
pub(super) struct Suspension {
    pub session_id: i64,
    /// Before this, the session cannot have expired on the server (see
    /// [`super::config::hold_deadline_after`]).
    pub deadline: Instant,
    pub ids: HashSet<Arc<str>>,
}

/// The session in which new contenders may join queues, and the locks of it that are still to
/// be re-anchored (none may be joined before: see [`super::LockEngine::begin_reanchoring`]).
#[derive(Default)]
pub(super) struct Admission {
    /// 0: none.
    pub session: i64,
    pub pending: HashSet<String>,
    /// Every lock the last pass in `session` named to re-anchor, done or not.
    pub pass: HashSet<String>,
    /// Whether a re-anchoring pass began in `session` (a fresh engine's first session is
    /// admitted without one).
    pub reanchoring: bool,
}

/// A parent directory watched recursively, and the session whose watch it is.
pub(super) type ParentKey = (String, i64);

/// A recursive watch of a parent directory: set up once; stopped (its watcher dropped, which
/// removes the watch) when no lock below it is tracked any more.
#[derive(Default)]
pub(super) struct ParentWatch {
    pub ready: OnceCell<()>,
    pub stop: tokio_util::sync::CancellationToken,
}

/// Nodes just made, registered but not yet decided: (id, told when decided).
pub(super) type Registered = Vec<(Arc<str>, Option<oneshot::Receiver<()>>)>;

impl Core {
    pub fn new(config: ZkConfig, events: Option<mpsc::UnboundedSender<EngineEvent>>) -> Self {
        Core {
            config,
            stats: Stats::default(),
            events,
            book: Mutex::new(Book::default()),
            session: Mutex::new(None),
            admission: Mutex::new(Admission::default()),
            parents: Mutex::new(HashMap::new()),
            fence: Fence::default(),
            idle_directories: Mutex::new(HashMap::new()),
            root: Mutex::new(None),
            suspended: Mutex::new(None),
            token_base: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// What this engine's zxids are raised by when handed out (see [`super::token_base`]).
    pub fn token_base(&self) -> i64 {
        self.token_base.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The id of the root this engine serves, if it took one: what its nodes carry as owner.
    pub fn owner(&self) -> Option<String> {
        self.root.lock().as_ref().map(|(_, _, id)| id.clone())
    }

    /// Whether `lock_path` is a `ClusterLock`'s directory that other clusters queue in (see
    /// [`super::Layout::is_shared_lock`]).
    pub fn is_shared_lock(&self, lock_path: &str) -> bool {
        self.root.lock().as_ref().is_some_and(|(layout, _, _)| layout.is_shared_lock(lock_path))
    }

    pub fn client(&self) -> Result<zk::Client, Error> {
        self.session.lock().clone().ok_or(Error::SessionLost)
    }

    pub fn session_id(&self) -> Option<i64> {
        self.session.lock().as_ref().map(|c| c.session_id().0)
    }

    /// Whether session `session_id` admits new contenders in every lock.
    pub fn is_admitted(&self, session_id: i64) -> bool {
        let admission = self.admission.lock();
        admission.session == session_id && admission.pending.is_empty()
    }

    /// Whether session `session_id` admits new contenders in `lock_path`.
    pub fn is_admitted_in(&self, session_id: i64, lock_path: &str) -> bool {
        let admission = self.admission.lock();
        admission.session == session_id && !admission.pending.contains(lock_path)
    }

    pub fn emit(&self, event: EngineEvent) {
        if let Some(events) = &self.events {
            // A consumer that went away does not stop the engine.
            let _ = events.send(event);
        }
    }

    /// Reports `state` for contender `id` if it differs from `before` (the state the
    /// contender had before the change at hand; states are derived, not stored).
    pub fn publish(&self, id: &str, before: &ContenderState, state: ContenderState) {
        if *before != state {
            self.emit(EngineEvent::Contender { id: id.to_string(), state });
        }
    }

    /// Removes a contender from the book and reports its final state.
    /// A lost contender is remembered (with why, and its node) until it is released or comes
    /// back, so that whoever reacts to the loss can still tell how it ended.
    pub fn remove(&self, book: &mut Book, id: &str, last: ContenderState) -> Option<Box<Member>> {
        let (key, mut member) = book.take(id)?;
        // Not a session's end: re-anchoring and its verdicts judge those, and a claim that is
        // not re-anchored (its Waiting status not yet written when the claims were listed)
        // must be able to join the queue again.
        if let ContenderState::Lost { why } = &last {
            if *why != LostReason::SessionExpired {
                book.lost.insert(key.clone(), (why.clone(), member.path()));
            }
        }
        self.publish(&key, &member.state(), last);
        member.decided = None;
        Some(member)
    }

    /// Records the revocation request in a contender's node data, if its node is still `path`.
    pub fn note_revocation(&self, book: &mut Book, id: &str, path: &str, body: &[u8]) {
        if let Some(member) = book.contenders.get_mut(id).filter(|m| m.path() == path) {
            if member.revoke.is_none() {
                let before = member.state();
                member.revoke = super::data::revoke_request(body);
                self.publish(id, &before, member.state());
            }
        }
    }

    /// Every contender of `session_id` is lost: its nodes went with the session.
    pub fn lose_session(&self, session_id: i64) {
        {
            let mut session = self.session.lock();
            if session.as_ref().is_some_and(|c| c.session_id().0 == session_id) {
                *session = None;
            }
        }
        self.parents.lock().retain(|(_, sid), watch| {
            let keep = *sid != session_id;
            if !keep {
                watch.stop.cancel();
            }
            keep
        });
        {
            let mut book = self.book.lock();
            book.lost_sessions.insert(session_id);
            // The other clusters' declarations were read in that session, after our own
            // declaration of it stood; that declaration went with it, and they may have changed
            // unseen: unknown again (the front only) until the next session lists them after
            // declaring anew (docs/design.md: permits every cluster agrees on).
            for declared in book.declared.values_mut() {
                declared.others = None;
            }
            let ids: Vec<Arc<str>> =
                book.contenders.iter().filter(|(_, m)| m.session_id == session_id).map(|(id, _)| id.clone()).collect();
            for id in ids {
                self.remove(&mut book, &id, ContenderState::Lost { why: LostReason::SessionExpired });
            }
        }
        self.emit(EngineEvent::Session(SessionEvent::Lost { session_id }));
    }

    /// The connection dropped. Whether the session survives is unknown until it comes back, and
    /// the server may expire it before this client can tell (it only gives up after 7/5 of the
    /// session timeout). In a lock that clients other than zklock use, one of them could then be
    /// granted the lock while our holder still reads Held. So, choosing safety over an
    /// uninterrupted hold, holders there are asked to let go at once, as if revoked; so are the
    /// holders of `ClusterLock`s other clusters share (another cluster's waiter is granted the
    /// moment our session expires); in locks of this cluster's zklock alone nobody else can be
    /// granted, and holders keep the lock.
    ///
    /// Asking is not enough: another client is granted the moment the session expires on the
    /// server, and a holder that still reads `Held` then is a second holder in the API. So the
    /// suspension also records by when those holders must be ended (their final status written
    /// through the Kubernetes API, which needs no ZooKeeper): before the session can have
    /// expired, counted from the last byte the client can have read ([`Self::hold_deadline`]).
    pub fn suspend_shared_holds(&self, session_id: i64) {
        let detected = Instant::now();
        let negotiated = self
            .session
            .lock()
            .as_ref()
            .filter(|c| c.session_id().0 == session_id)
            .map_or(self.config.session_timeout, |c| c.session_timeout());
        let mut ids = HashSet::new();
        let mut book = self.book.lock();
        let Book { contenders, locks, .. } = &mut *book;
        for (id, member) in contenders.iter_mut() {
            let held = matches!(member.decision, Some(Decision::Held));
            let shared = locks.get(&member.lock).is_some_and(|q| q.foreign) || self.is_shared_lock(&member.lock);
            if member.session_id == session_id && held && shared {
                ids.insert(id.clone());
                if member.revoke.is_none() {
                    let before = member.state();
                    member.revoke = Some(CONNECTION_LOST.to_string());
                    self.publish(id, &before, member.state());
                }
            }
        }
        drop(book);
        let mut suspended = self.suspended.lock();
        // A second drop in the same session without a reconnection in between cannot happen; a
        // drop after a reconnection counts afresh, and holds suspended before stay so.
        let earlier = suspended.take().filter(|s| s.session_id == session_id);
        let deadline = super::config::hold_deadline_after(detected, negotiated);
        let deadline = earlier.as_ref().map_or(deadline, |s| s.deadline.min(deadline));
        ids.extend(earlier.into_iter().flat_map(|s| s.ids));
        *suspended = Some(Suspension { session_id, deadline, ids });
    }

    /// The connection of `session_id` is back: the session lives, and so do its nodes; the holds
    /// it suspended stay asked to let go (their grace period runs as for any revocation), but
    /// need not be ended before the session could expire.
    pub fn resume_holds(&self, session_id: i64) {
        let mut suspended = self.suspended.lock();
        if suspended.as_ref().is_some_and(|s| s.session_id == session_id) {
            *suspended = None;
        }
    }

    /// The moment by which contender `id`'s hold must be ended, while ZooKeeper is out of
    /// reach and it holds a lock others share (see [`Self::suspend_shared_holds`]). Kept after
    /// the session is lost, until a new session is made: the claim must end all the same.
    pub fn hold_deadline(&self, id: &str) -> Option<Instant> {
        self.suspended.lock().as_ref().filter(|s| s.ids.contains(id)).map(|s| s.deadline)
    }
}

/// Closes a create's window when the create fails or its caller gives up on it (drops the
/// future) before the nodes are registered; otherwise the lock would record events forever.
pub(super) struct WindowGuard<'a> {
    core: &'a Core,
    lock: Arc<str>,
    start: u64,
    armed: bool,
}

impl<'a> WindowGuard<'a> {
    /// Opens a window on `lock_path` before a create is sent (see [`super::book`]).
    pub fn open(core: &'a Core, lock_path: &str) -> Self {
        let mut book = core.book.lock();
        let lock: Arc<str> = book.locks.get_key_value(lock_path).map_or_else(|| lock_path.into(), |(k, _)| k.clone());
        let start = book.locks.entry(lock.clone()).or_default().open();
        drop(book);
        WindowGuard { core, lock, start, armed: true }
    }

    /// Hands the window to `register`, which closes it.
    pub fn disarm(mut self) -> (Arc<str>, u64) {
        self.armed = false;
        (self.lock.clone(), self.start)
    }
}

impl Drop for WindowGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.core.book.lock().close_window(&self.lock, self.start);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::Limit;

    #[test]
    fn other_clusters_declarations_are_unknown_again_after_a_lost_session() {
        let core = Core::new(super::super::ZkConfig::new("127.0.0.1:1"), None);
        let lock: Arc<str> = "/shared/locks/pay".into();
        let three = Limit::Permits(3.try_into().unwrap());
        {
            let mut book = core.book.lock();
            book.shared_locks = Some("/shared/locks/".into());
            let mut declared = super::super::declaration::Declared::new(Some(three));
            declared.others = Some(vec![super::super::Declaration { cluster: "us-2".into(), limit: three }]);
            book.declared.insert(lock.clone(), declared);
            assert_eq!(book.limit(&lock), three);
        }
        core.lose_session(7);
        // Another cluster may have lowered its permits unseen: the front only until listed again.
        assert_eq!(core.book.lock().limit(&lock), Limit::FRONT_ONLY);
    }
}
