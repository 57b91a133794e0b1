//! One ZooKeeper session, many contenders (one per claim UID): the engine's face.
//!
//! Each contender is an EPHEMERAL_SEQUENTIAL node in its lock directory, and an entry in the
//! engine's book (see [`super::book`]): no task and no watch of its own, so that tens of
//! thousands of them cost little. One persistent recursive watch per parent of lock directories
//! (per namespace, for the operator) reports every deletion and data change below it
//! ([`super::session`]). The recipe (see [`crate::recipe`]) names for each waiter the one node
//! whose deletion can change its answer; only that node's deletion makes the engine read the
//! directory again and decide for the waiters that watched it ([`super::rounds`]). Data
//! changes on our own nodes are revocation requests; their deletion by someone else loses the
//! lock. Every change of a contender's state is reported on the event stream.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use zookeeper_client as zk;

use super::anchor;
use super::book::{Book, Member};
use super::contender::{ContenderSpec, ContenderState, EngineEvent, QueueEntry, Reanchored, Recorded, SessionEvent};
use super::core::{Core, WindowGuard};
use super::data;
use super::declaration::{Declaration, Declared};
use super::enqueue::{self, Made};
use super::fence::{self, Epoch};
use super::ops::{self, is_lock_path};
use super::permits;
use super::retry;
use super::root::{self, Installation};
use super::rounds;
use super::session;
use super::stats::{Stats, StatsSnapshot};
use super::token_base;
use super::Layout;
use super::{Error, ZkConfig};
use crate::recipe::{self, Decision, Limit};

/// The lock engine. Cheap to clone; dropping the last clone closes the session (ZooKeeper
/// then deletes the ephemeral nodes) and stops its tasks.
#[derive(Clone)]
pub struct LockEngine {
    core: Arc<Core>,
    /// What [`LockEngine::describe`] read, by node path.
    descriptions: Arc<parking_lot::Mutex<std::collections::HashMap<String, String>>>,
}

/// Most node descriptions kept.
const MAX_DESCRIPTIONS: usize = 10_000;

/// Lock directories listed at once when looking for nodes of earlier sessions.
const SCAN_CONCURRENCY: usize = 32;

impl LockEngine {
    /// Opens a session and returns an engine without an event stream (for tools that read
    /// queues or write revocation requests).
    pub async fn connect(config: ZkConfig) -> Result<Self, Error> {
        Self::start(config, None).await
    }

    /// Opens a session and returns the engine with the stream of every contender's state
    /// changes and of session events.
    pub async fn connect_with_events(config: ZkConfig) -> Result<(Self, mpsc::UnboundedReceiver<EngineEvent>), Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        Ok((Self::start(config, Some(tx)).await?, rx))
    }

    async fn start(config: ZkConfig, events: Option<mpsc::UnboundedSender<EngineEvent>>) -> Result<Self, Error> {
        let engine = LockEngine { core: Arc::new(Core::new(config, events)), descriptions: Default::default() };
        engine.reconnect().await?;
        // A fresh engine has nothing to re-anchor.
        engine.admit();
        Ok(engine)
    }

    /// Lets new contenders join queues in the current session, in every lock: call it once the
    /// session is re-anchored. Returns the session admitted, if there is one.
    pub fn admit(&self) -> Option<i64> {
        let session = self.session_id()?;
        let mut admission = self.core.admission.lock();
        admission.reanchoring &= admission.session == session;
        admission.session = session;
        admission.pending.clear();
        admission.pass.clear();
        Some(session)
    }

    /// Begins re-anchoring the current session: new contenders may join queues at once in
    /// every lock but `locks` (those with nodes or live contenders of an earlier session), and
    /// in each of those once [`LockEngine::admit_lock`] says it was re-anchored. Answers the
    /// locks to re-anchor, with the session: all of `locks` in a new session; in one where a
    /// pass began already, only those it did not finish (the others admit new contenders
    /// already, and re-anchoring one again would take their nodes for stale).
    pub fn begin_reanchoring(&self, locks: impl IntoIterator<Item = String>) -> Result<(i64, HashSet<String>), Error> {
        let session = self.session_id().ok_or(Error::SessionLost)?;
        let mut admission = self.core.admission.lock();
        let locks: HashSet<String> = locks.into_iter().collect();
        admission.pending = if admission.session == session && admission.reanchoring {
            admission.pending.intersection(&locks).cloned().collect()
        } else {
            locks
        };
        admission.session = session;
        admission.reanchoring = true;
        admission.pass = admission.pending.clone();
        Ok((session, admission.pending.clone()))
    }

    /// `lock_path` was re-anchored in `session`: new contenders may join its queue, if that is
    /// still the session. Reported as [`EngineEvent::Admitted`], after the events of the nodes
    /// re-made there.
    pub fn admit_lock(&self, session: i64, lock_path: &str) {
        let mut admission = self.core.admission.lock();
        if admission.session == session && admission.pending.remove(lock_path) {
            self.core.emit(EngineEvent::Admitted { lock_path: lock_path.to_string() });
        }
    }

    /// Whether the last re-anchoring pass of the current session named `lock_path` (see
    /// [`LockEngine::begin_reanchoring`]).
    pub fn reanchored_by_pass(&self, lock_path: &str) -> bool {
        let admission = self.core.admission.lock();
        Some(admission.session) == self.session_id() && admission.pass.contains(lock_path)
    }

    /// Whether new contenders may join queues now, in every lock: the current session is the
    /// admitted one, fully re-anchored. Turns false the moment a session ends, before any of
    /// its contenders is reported lost.
    pub fn admitting(&self) -> bool {
        self.session_id().is_some_and(|s| self.core.is_admitted(s))
    }

    /// Whether new contenders may join the queues of every lock in `lock_paths` now.
    pub fn admitting_in<'a>(&self, lock_paths: impl IntoIterator<Item = &'a str>) -> bool {
        self.session_id().is_some_and(|s| lock_paths.into_iter().all(|lock| self.core.is_admitted_in(s, lock)))
    }

    /// Opens a new session after the previous one was lost (or replaces a live one, whose
    /// contenders are then lost). Contenders must be re-anchored, and the session admitted
    /// ([`LockEngine::admit`]), before new ones can be enqueued.
    pub async fn reconnect(&self) -> Result<(), Error> {
        let client = self.core.config.connect().await?;
        let root = self.core.root.lock().clone();
        if let Some((root, mine, id)) = root {
            take_root(&client, &self.core.config, &root, &mine).await?;
            take_cluster_name(&client, &self.core.config, &root, &id).await?;
            self.zxids_not_behind(&client, &root).await?;
        }
        let session_id = client.session_id().0;
        let states = client.state_watcher();
        // The holds suspended in an earlier session are judged by re-anchoring in this one.
        self.core.suspended.lock().take();
        let old = self.core.session.lock().replace(client);
        if let Some(old) = old {
            self.core.lose_session(old.session_id().0);
        }
        tokio::spawn(session::monitor_session(Arc::downgrade(&self.core), states, session_id));
        self.core.emit(EngineEvent::Session(SessionEvent::Connected { session_id }));
        Ok(())
    }

    /// In a new session of a term: ZooKeeper's zxids must not be behind the tokens the term
    /// handed out (its data restored from a snapshot taken since, with the leader epoch as it
    /// was then): every token from now on could repeat one handed out. Then the engine turns
    /// fenced, and the next term raises the token base above the floor kept outside ZooKeeper.
    /// The zxid of now is a write's: the installation node written back as it is.
    async fn zxids_not_behind(&self, client: &zk::Client, root: &Layout) -> Result<(), Error> {
        let handed = self.core.book.lock().locks.values().map(|q| q.last_token).max().unwrap_or(0);
        if self.core.fence.epoch().is_none() || handed == 0 {
            return Ok(());
        }
        let path = root.installation();
        let (data, stat) =
            retry::idempotent(|| client.get_data(&path)).await.map_err(|e| Error::zk("get", &path, e))?;
        let now =
            client.set_data(&path, &data, Some(stat.version)).await.map_err(|e| Error::zk("set", &path, e))?.mzxid;
        let ensemble = now + self.core.token_base();
        if ensemble <= handed {
            tracing::error!(handed, ensemble, "ZooKeeper's zxids went back below the tokens this term handed out (its data were restored); stepping down");
            self.core.fence.superseded();
            return Err(Error::ZxidsWentBack { handed, ensemble });
        }
        Ok(())
    }

    /// While ZooKeeper is out of reach: the moment by which contender `id`, a holder of a lock
    /// that other clients or clusters share, must be ended (its final status written) — before
    /// the session can expire on the server and another client be granted. `None` for every
    /// other contender, and once the connection is back.
    pub fn hold_deadline(&self, id: &str) -> Option<std::time::Instant> {
        self.core.hold_deadline(id)
    }

    /// Whether ZooKeeper is out of reach: the connection dropped and neither came back nor was
    /// replaced by a new session. No hold can be confirmed meanwhile.
    pub fn out_of_reach(&self) -> bool {
        self.core.suspended.lock().is_some()
    }

    /// The session timeout asked for (the server may have negotiated another).
    pub fn session_timeout(&self) -> std::time::Duration {
        self.core.config.session_timeout
    }

    /// The current session's id, if there is one.
    pub fn session_id(&self) -> Option<i64> {
        self.core.session_id()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.core.stats.snapshot()
    }

    /// Serves ZooKeeper root `root` for installation `mine`, in this session and every later
    /// one (see [`super::root`]): refused while another installation's leader serves it.
    pub async fn take_root(&self, layout: &Layout, mine: Installation) -> Result<(), Error> {
        let client = self.core.client()?;
        own_root_writable(&client, &self.core.config, layout.root()).await?;
        take_root(&client, &self.core.config, layout, &mine).await?;
        // After a change of credentials, before anything under the root is written.
        crate::acl::take_over(&client, &self.core.config, layout).await;
        let id = root::id(&client, &self.core.config, layout).await?;
        take_cluster_name(&client, &self.core.config, layout, &id).await?;
        *self.core.root.lock() = Some((layout.clone(), mine, id));
        self.core.book.lock().shared_locks =
            layout.shared_root().map(|_| Arc::from(format!("{}/", layout.cluster_locks())));
        Ok(())
    }

    /// Gives the root up (a graceful stop), so that the installation's next process need not
    /// wait for this session to end.
    pub async fn leave_root(&self) {
        let root = self.core.root.lock().take();
        if let (Some((root, _, _)), Ok(client)) = (root, self.core.client()) {
            root::leave(&client, &root).await;
        }
    }

    /// Takes the leader epoch at `path` (docs/design.md: fencing): bumps it, so that every write guarded
    /// by an earlier epoch fails from now on, and guards every later write of this engine by the
    /// new one. Call it once, before re-anchoring; `holder` is written into the node for people.
    /// Answers the epoch's token (see [`LockEngine::epoch`]).
    pub async fn take_epoch(&self, path: &str, holder: &str) -> Result<i64, Error> {
        let client = self.core.client()?;
        let (version, token) =
            fence::bump(&client, &self.core.config, path, holder).await.map_err(|e| Error::zk("epoch", path, e))?;
        if !self.core.fence.set(Epoch { path: path.to_string(), version, token }) {
            return Err(Error::zk("epoch", path, zk::Error::BadArguments(&"this engine has an epoch already")));
        }
        Ok(token)
    }

    /// The token of the leader epoch this engine took, if it took one: the zxid of the bump
    /// (raised by the token base), which no other leader's term shares. The controller stamps
    /// it into the statuses it writes, so that a deposed leader's status writes fail too
    /// (docs/design.md: fencing).
    pub fn epoch(&self) -> Option<i64> {
        self.core.fence.epoch().map(|e| e.token + self.core.token_base())
    }

    /// Takes the token base of `layout` (see [`super::token_base`]) for this term, given what
    /// is kept where it survives the ensemble: `floor`, above every number handed out, and
    /// `last`, the epoch of the last term. Made where it is missing; where ZooKeeper's zxids
    /// went back below `last`, raised above the floor where this leader alone hands out
    /// tokens from it (an unshared root), refused ([`Error::TokensBehindFloor`]) where clusters
    /// share it. Call it after [`LockEngine::take_epoch`], before anything is enqueued; every
    /// fencing token, ticket and epoch the engine answers from then on is raised by the base.
    /// Answers the base.
    pub async fn take_token_base(&self, layout: &Layout, floor: i64, last: i64) -> Result<i64, Error> {
        let client = self.core.client()?;
        let epoch = self.core.fence.epoch().map(|e| e.token).ok_or_else(|| {
            Error::zk("token base", &layout.token_base(), zk::Error::BadArguments(&"take the leader epoch first"))
        })?;
        let may_raise = layout.shared_root().is_none();
        let path = layout.token_base();
        let base = token_base::take(&client, &self.core.config, &self.core.fence, &path, floor, last, epoch, may_raise)
            .await?;
        self.core.token_base.store(base, std::sync::atomic::Ordering::SeqCst);
        Ok(base)
    }

    /// Raises the token base at `path` so that every number handed out from now on is above
    /// `above` (see [`super::token_base::raise`]): for an administrator moving to a new
    /// ensemble, with every operator sharing the base stopped. Answers the base.
    pub async fn raise_token_base(&self, path: &str, above: i64) -> Result<i64, Error> {
        let client = self.core.client()?;
        token_base::raise(&client, &self.core.config, path, above).await
    }

    /// The token base this engine took (0 before, or without one).
    pub fn token_base(&self) -> i64 {
        self.core.token_base()
    }

    /// Whether this engine's leader epoch is still the latest, by a read of the epoch node; the
    /// engine turns fenced when it is not. True without an epoch.
    pub async fn epoch_is_current(&self) -> Result<bool, Error> {
        let Some(epoch) = self.core.fence.epoch() else { return Ok(true) };
        let client = self.core.client()?;
        let current = match retry::idempotent(|| client.get_data(&epoch.path)).await {
            Ok((_, stat)) => stat.version == epoch.version && stat.mzxid == epoch.token,
            Err(zk::Error::NoNode) => false,
            Err(e) => return Err(Error::zk("epoch", &epoch.path, e)),
        };
        if !current {
            self.core.fence.superseded();
        }
        Ok(current)
    }

    /// Turns true, for good, once a write of this engine found its leader epoch superseded:
    /// another leader took over, and this engine can change no lock any more.
    pub fn fenced(&self) -> watch::Receiver<bool> {
        self.core.fence.subscribe()
    }

    /// The state of contender `id`, if the engine tracks it (a lost one until it is released).
    pub fn state(&self, id: &str) -> Option<ContenderState> {
        self.core.book.lock().state(id)
    }

    /// Every contender id the engine tracks, lost ones included.
    pub fn ids(&self) -> Vec<Arc<str>> {
        let book = self.core.book.lock();
        book.contenders.keys().chain(book.lost.keys()).cloned().collect()
    }

    /// The engine's own copy of a contender id it tracks.
    pub fn id(&self, id: &str) -> Option<Arc<str>> {
        let book = self.core.book.lock();
        let tracked = book.contenders.get_key_value(id).map(|(key, _)| key);
        tracked.or_else(|| book.lost.get_key_value(id).map(|(key, _)| key)).cloned()
    }

    /// Contender `id`'s ticket, if the engine tracks it and knows one: the zxid of its first
    /// enqueue, which orders it in its queues whatever session made its node. Its owner records
    /// it and gives it back when the contender is re-anchored (see [`Recorded`]).
    pub fn ticket(&self, id: &str) -> Option<i64> {
        // 0: none known. Below 0: a ticket of an ensemble whose data were made anew since,
        // which the base maps below every zxid of this one (see `reanchor`).
        let ticket = self.core.book.lock().contenders.get(id).map(|m| m.ticket).filter(|t| *t != 0)?;
        Some(ticket + self.core.token_base())
    }

    /// The full path of contender `id`'s node (the node it had, if lost), if the engine tracks it.
    pub fn node(&self, id: &str) -> Option<String> {
        let book = self.core.book.lock();
        book.contenders.get(id).map(|member| member.path()).or_else(|| book.lost.get(id).map(|(_, path)| path.clone()))
    }

    /// Puts a contender in the queue of its lock: creates its node (and the lock directory if
    /// needed), decides once, and from then on follows the recipe; answers the first decision.
    /// Enqueueing an id the engine already tracks answers where it stands.
    pub async fn enqueue(&self, spec: ContenderSpec) -> Result<ContenderState, Error> {
        let mut states = self.enqueue_group(vec![spec]).await?;
        Ok(states.pop().unwrap_or(ContenderState::Released))
    }

    /// Puts a group of contenders (one claim over several locks, one contender per lock) in
    /// the queues of their locks at once: their nodes are made in one multi-op, so that any two
    /// groups stand in the same relative order in every lock they share (docs/user-guide.md: several locks). Each
    /// contender then follows its lock's recipe on its own; answers each one's first decision,
    /// in the order given. A group the engine already tracks answers where it stands.
    pub async fn enqueue_group(&self, specs: Vec<ContenderSpec>) -> Result<Vec<ContenderState>, Error> {
        for spec in &specs {
            if !recipe::is_contender_id(&spec.id) {
                return Err(Error::BadContenderId(spec.id.to_string()));
            }
            if !is_lock_path(&spec.lock) {
                return Err(Error::BadLockPath(spec.lock.clone()));
            }
        }
        for spec in &specs {
            self.follow_declarations(&spec.lock);
        }
        {
            let book = self.core.book.lock();
            let known: Vec<ContenderState> =
                specs.iter().filter_map(|s| book.contenders.get(&*s.id).map(|m| m.state())).collect();
            if !known.is_empty() {
                return Ok(known);
            }
        }
        let client = self.core.client()?;
        if !specs.iter().all(|s| self.core.is_admitted_in(client.session_id().0, &s.lock)) {
            return Err(Error::NotAdmitted);
        }
        // With listed contenders, a directory another client made (Curator makes it open to
        // all) is closed when this engine first uses it: one ACL read per directory taken up.
        let unprotected: Vec<String> = match self.core.config.contenders {
            crate::Contenders::Listed(_) if self.core.config.digest_auth.is_some() => {
                let book = self.core.book.lock();
                specs.iter().filter(|s| !book.locks.contains_key(s.lock.as_str())).map(|s| s.lock.clone()).collect()
            }
            _ => vec![],
        };
        // The windows first: they enter the locks in the book, which keeps the parents' watches.
        let guards: Vec<WindowGuard> = specs.iter().map(|s| WindowGuard::open(&self.core, &s.lock)).collect();
        for spec in &specs {
            self.core.watch_parent(&client, &spec.lock).await?;
        }
        let (names, ticket) = ops::create_adopting(&client, &self.core, &specs).await?;
        for lock in &unprotected {
            crate::acl::protect(&client, &self.core.config, lock, &self.core.config.directory_acls()).await;
        }
        let mut registered = Vec::with_capacity(specs.len());
        for ((spec, name), guard) in specs.into_iter().zip(names).zip(guards) {
            let (lock, window) = guard.disarm();
            let made = Made { spec, name, keeps_hold: false, ticket };
            registered.extend(enqueue::register(&self.core, &client, &lock, window, vec![made])?);
        }
        let settled = enqueue::settle(&self.core, registered).await;
        Ok(settled.into_iter().map(|(_, state)| state).collect())
    }

    /// Re-anchors a lock after a new session (docs/design.md: re-anchoring): in one multi-op guarded by the
    /// directory's version, deletes every zklock node left in it by earlier sessions and
    /// recreates the nodes of `contenders`, recorded holders first, then in the order of the
    /// nodes they had (contenders without one last, in the order given). A concurrent change
    /// to the directory makes it start over rather than misorder.
    ///
    /// Also reports whether a node not made by zklock was ever seen in the directory: the
    /// caller's continuity rule depends on it.
    pub async fn reanchor(&self, lock_path: &str, contenders: Vec<Recorded>) -> Result<Reanchored, Error> {
        if !is_lock_path(lock_path) {
            return Err(Error::BadLockPath(lock_path.to_string()));
        }
        for c in &contenders {
            if !recipe::is_contender_id(&c.spec.id) {
                return Err(Error::BadContenderId(c.spec.id.to_string()));
            }
            if c.spec.lock != lock_path {
                return Err(Error::BadLockPath(c.spec.lock.clone()));
            }
        }
        self.follow_declarations(lock_path);
        // Tickets are handed out raised by the token base; here they are compared with zxids.
        let base = self.core.token_base();
        let contenders: Vec<Recorded> = contenders
            .into_iter()
            .map(|r| Recorded { ticket: r.ticket.map(|t| t.saturating_sub(base)), ..r })
            .collect();
        // Where each recorded holder's place is: the node its status names.
        let places: std::collections::HashMap<Arc<str>, String> = contenders
            .iter()
            .filter(|r| r.held)
            .filter_map(|r| Some((r.spec.id.clone(), ops::node_name(r.node.as_deref()?).to_string())))
            .collect();
        let (contenders, held): (Vec<(ContenderSpec, Option<i64>)>, Vec<bool>) =
            anchor::queue_order(contenders).into_iter().map(|(spec, held, ticket)| ((spec, ticket), held)).unzip();
        let client = self.core.client()?;
        // The window first: it enters the lock in the book, which keeps the parent's watch.
        let guard = WindowGuard::open(&self.core, lock_path);
        self.core.watch_parent(&client, lock_path).await?;
        let created = anchor::recreate(&client, &self.core, lock_path, &contenders).await?;
        let (lock, window) = guard.disarm();
        if let Some(q) = self.core.book.lock().locks.get_mut(lock_path) {
            q.foreign |= created.foreign_seen;
        }
        // Recorded holders come back first, ahead of every other node (in a directory no
        // foreign client has used, nobody could have been granted meanwhile): they keep the lock
        // whatever its limit is now. Lowering the permits, or deleting or creating a `Lock`,
        // takes nothing away, across a new session too (docs/design.md: re-anchoring).
        // A contender recorded without a ticket (by an earlier release) keeps none: the zxid of
        // this re-creation, shared by every node it makes, would not order it.
        // In a ClusterLock's directory other clusters share, a holder keeps the lock only in the
        // place its node had (see [`anchor::recreate`]).
        let shared = self.core.is_shared_lock(lock_path);
        let mut displaced = vec![];
        let nodes = contenders
            .into_iter()
            .zip(created.nodes)
            .zip(held)
            .zip(created.kept)
            .map(|((((spec, ticket), name), held), kept)| {
                // A holder's place is the node its status names: a node of its id under another
                // name was made anew, behind whoever went first (by an earlier attempt of this
                // re-anchoring after a partial commit, or by an earlier session's), and taking it
                // for the place kept a displaced holder Held beside another cluster's.
                let kept = kept && (!held || places.get(&spec.id).is_some_and(|place| *place == name));
                if held && shared && !kept {
                    displaced.push(spec.id.clone());
                }
                Made {
                    keeps_hold: held && !created.foreign_seen && (kept || !shared),
                    spec,
                    name,
                    ticket: ticket.unwrap_or(0),
                }
            })
            .collect();
        let registered = enqueue::register(&self.core, &client, &lock, window, nodes)?;
        let contenders = enqueue::settle(&self.core, registered).await;
        Ok(Reanchored { contenders, foreign_seen: created.foreign_seen, displaced })
    }

    /// Leaves the queue (or gives up the lock): deletes the node, retrying through connection
    /// loss until ZooKeeper confirms. The delete goes on even if the caller stops waiting.
    /// Returns false when the engine did not track `id` (already released or lost).
    pub async fn release(&self, id: &str) -> Result<bool, Error> {
        self.release_group(&[id]).await
    }

    /// Lets a group go (one claim over several locks): deletes all its nodes in one multi-op,
    /// retrying until ZooKeeper confirms. Returns false when the engine tracked none of them.
    pub async fn release_group(&self, ids: &[&str]) -> Result<bool, Error> {
        let core = self.core.clone();
        // Out of the book first: the deletion events that follow are then nobody's loss.
        let taken: Vec<(Arc<str>, Box<Member>)> = {
            let mut book = core.book.lock();
            ids.iter()
                .filter_map(|id| {
                    // A lost contender's node is gone already: forgetting the loss is its release.
                    book.lost.remove(*id);
                    book.take(id)
                })
                .collect()
        };
        if taken.is_empty() {
            return Ok(false);
        }
        let session = core.session.lock().clone();
        // Nodes of a session that is over ended with it.
        let (live, ended): (Vec<_>, Vec<_>) =
            taken.into_iter().partition(|(_, m)| session.as_ref().is_some_and(|c| c.session_id().0 == m.session_id));
        for (key, member) in ended {
            core.publish(&key, &member.state(), ContenderState::Released);
        }
        let Some(client) = session.filter(|_| !live.is_empty()) else { return Ok(true) };
        let deleting = tokio::spawn(async move {
            let paths: Vec<String> = live.iter().map(|(_, m)| m.path()).collect();
            match ops::delete_all_until_confirmed(&client, &core, &paths).await {
                Ok(()) => {
                    for (key, member) in &live {
                        core.publish(key, &member.state(), ContenderState::Released);
                        // The last of our contenders in the lock left: its directory goes too,
                        // if empty, so that locks no longer used do not pile up. In the
                        // background: a release waits for nothing but its own nodes. (A
                        // directory shared with foreign clients keeps its marker and stays.)
                        let idle = !core.book.lock().locks.contains_key(&*member.lock);
                        if idle {
                            core.note_idle_directory(&client, &member.lock);
                        }
                    }
                    Ok(())
                }
                Err(e) => {
                    // The nodes are still there (ZooKeeper refused the delete): keep tracking
                    // them, so that their state stays true and the release can be tried again.
                    let mut book = core.book.lock();
                    for (key, member) in live {
                        if !book.lost_sessions.contains(&member.session_id) && !book.contenders.contains_key(&key) {
                            let q = book.locks.entry(member.lock.clone()).or_default();
                            q.nodes.insert(member.sequence, key.clone());
                            book.contenders.insert(key, member);
                        }
                    }
                    Err(Error::zk("delete", paths.first().map_or("", String::as_str), e))
                }
            }
        });
        match deleting.await {
            Ok(result) => result.map(|()| true),
            // The delete task does not panic; if the runtime is shutting down there is nothing
            // left to wait for.
            Err(join) => Err(Error::zk(
                "delete",
                ids.first().copied().unwrap_or(""),
                zk::Error::UnexpectedError(join.to_string()),
            )),
        }
    }

    /// Asks the holder of `node` (a full path, ours or another client's) to let go, by writing a
    /// revocation request into its data. Our nodes keep their description; Curator's get its
    /// `__REVOKE__` marker.
    pub async fn request_revocation(&self, node: &str, reason: &str) -> Result<(), Error> {
        let client = self.core.client()?;
        let request = |current: &[u8]| Some(data::with_revoke_request(current, reason));
        match self.core.fence.rewrite(&client, node, request).await {
            Ok(_) => {
                Stats::bump(&self.core.stats.revocations_written);
                Ok(())
            }
            Err(zk::Error::BadVersion) => Err(Error::Contended { op: "set", path: node.to_string() }),
            Err(e) => Err(Error::zk("set", node, e)),
        }
    }

    /// The lock directories of `layout` (`<root>/locks/<namespace>/<lock>`, and the
    /// `ClusterLock`s' with an empty namespace) that hold zklock nodes, as `(namespace, path)`:
    /// after a new session,
    /// the directories whose nodes of earlier sessions must go even if no live contender is
    /// left there to re-anchor.
    ///
    /// Best effort: a directory this session may not list (another client made it with an ACL
    /// of its own: namespace directories are open for create, so that Curator can make lock
    /// directories) is left out with a warning, so that one stranger's directory does not stop
    /// every lock's re-anchoring. No zklock node can be in it: zklock could not list it either.
    /// Only an error that ends the session ends the scan.
    ///
    /// Directories `known` says the caller re-anchors anyway (those with live contenders) are
    /// not listed: only the others' listings can add anything, and at 100,000 claims (10,000
    /// locks) listing every directory took most of a second of a leader change.
    pub async fn directories_with_nodes(
        &self,
        layout: &Layout,
        known: impl Fn(&str) -> bool,
    ) -> Result<Vec<(String, String)>, Error> {
        let root = layout.locks();
        let client = self.core.client()?;
        let list = |path: String| {
            let client = client.clone();
            async move {
                match ops::list(&client, &path).await {
                    Ok(children) => Ok(children),
                    Err(e) if e.ends_session() => Err(e),
                    Err(e) => {
                        tracing::warn!(%path, error = %e, "cannot list this directory; leaving it out of re-anchoring");
                        Ok(vec![])
                    }
                }
            }
        };
        // Every lock directory, then their listings, `SCAN_CONCURRENCY` at a time: one after the
        // other, the 1,000 directories of 10,000 claims took 0.6 s of a leader change in which
        // nothing is granted.
        let mut directories: Vec<(String, String)> = vec![];
        for group in list(root.to_string()).await? {
            for lock in list(format!("{root}/{group}")).await? {
                directories.push((group.clone(), format!("{root}/{group}/{lock}")));
            }
        }
        // The ClusterLocks' directories, with no namespace. Other clusters' nodes there look
        // like ours: re-anchoring tells them apart by the root their data names.
        let cluster_locks = layout.cluster_locks();
        for lock in list(cluster_locks.clone()).await? {
            directories.push((String::new(), format!("{cluster_locks}/{lock}")));
        }
        directories.retain(|(_, path)| !known(path));
        let listed: Vec<Result<Option<(String, String)>, Error>> = futures::stream::iter(directories)
            .map(|(group, path)| async {
                let children = list(path.clone()).await?;
                Ok(recipe::queue(&children).iter().any(|c| c.ours.is_some()).then_some((group, path)))
            })
            .buffered(SCAN_CONCURRENCY)
            .collect()
            .await;
        let mut found = vec![];
        for directory in listed {
            found.extend(directory?);
        }
        Ok(found)
    }

    /// Who a zklock node stands for, as its data describes it (a claim as
    /// `<cluster>/<namespace>/<name>`, or `<namespace>/<name>` without a cluster name); `None` for
    /// a node that is gone or not zklock's. Read once per node: a node's description never
    /// changes.
    pub async fn describe(&self, node: &str) -> Result<Option<String>, Error> {
        if let Some(known) = self.descriptions.lock().get(node) {
            return Ok(Some(known.clone()));
        }
        let client = self.core.client()?;
        let data = match retry::idempotent(|| client.get_data(node)).await {
            Ok((data, _)) => data,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(Error::zk("get", node, e)),
        };
        let Ok(parsed) = serde_json::from_slice::<crate::data::NodeData>(data.trim_ascii()) else { return Ok(None) };
        let mut known = self.descriptions.lock();
        // Nodes come and go: a bound, not an eviction policy, is all a status text needs.
        if known.len() >= MAX_DESCRIPTIONS {
            known.clear();
        }
        known.insert(node.to_string(), parsed.description.clone());
        Ok(Some(parsed.description))
    }

    /// Brings the `ahead` count of the first `limit` waiters of a lock up to date, with one read
    /// of the directory. Waiters are not woken when somebody far ahead of them leaves (that is
    /// the point of the recipe), so their count goes stale; this refreshes it in a bounded
    /// batch. Returns how many changed.
    pub async fn refresh_positions(&self, lock_path: &str, limit: usize) -> Result<usize, Error> {
        let client = self.core.client()?;
        let children = ops::list(&client, lock_path).await?;
        let queue = recipe::queue(&children);
        let mut changed = 0;
        let mut book = self.core.book.lock();
        let lock_limit = book.limit(lock_path);
        let ours = queue.iter().filter_map(|c| c.ours.map(|(id, _)| (id, c.name))).take(limit.saturating_add(1));
        for (id, name) in ours {
            let Some(member) = book.contenders.get_mut(id) else { continue };
            let Some(Decision::Waiting { watch, ahead, .. }) = &member.decision else { continue };
            // Only the count: whom to watch is the event-driven part's business.
            if let Decision::Waiting { watch: fresh_watch, ahead: fresh, span } =
                recipe::decide_in(&queue, name, lock_limit)
            {
                if fresh_watch == *watch && fresh != *ahead {
                    let before = member.state();
                    member.decision = Some(Decision::Waiting { watch: fresh_watch, ahead: fresh, span });
                    self.core.publish(id, &before, member.state());
                    changed += 1;
                }
            }
        }
        Ok(changed)
    }

    /// Sets how many contenders may hold the lock in `lock_path` at once (a `Lock` object's
    /// permits; a mutex without one). Every contender of that lock is decided again at once:
    /// a raise grants the waiters it lets in, a lower limit stops grants until fewer hold.
    pub fn set_limit(&self, lock_path: &str, limit: Limit) {
        {
            let mut book = self.core.book.lock();
            if book.limits.get(lock_path).copied().unwrap_or_default() == limit {
                return;
            }
            match limit {
                Limit::Mutex => book.limits.remove(lock_path),
                Limit::Permits(_) => book.limits.insert(lock_path.into(), limit),
            };
        }
        rounds::decide_again(&self.core, lock_path);
    }

    /// Declares what this cluster's `ClusterLock` in `lock_path` says (`None`: this cluster has
    /// none of that name now). In a directory other clusters share, the lock's limit is where
    /// every cluster's declaration meets (see [`super::permits`]), and the front only until
    /// they are known; elsewhere it is [`LockEngine::set_limit`].
    pub fn declare(&self, lock_path: &str, limit: Option<Limit>) {
        if !self.core.book.lock().is_shared(lock_path) {
            return self.set_limit(lock_path, limit.unwrap_or_default());
        }
        let changed = {
            let mut book = self.core.book.lock();
            let before = book.limit(lock_path);
            match book.declared.get_mut(lock_path) {
                Some(declared) if declared.own == limit => return,
                Some(declared) => {
                    declared.own = limit;
                    declared.wake.notify_one();
                }
                None => {
                    book.declared.insert(lock_path.into(), Declared::new(limit));
                    self.spawn_follower(lock_path);
                }
            }
            before != book.limit(lock_path)
        };
        if changed {
            rounds::decide_again(&self.core, lock_path);
        }
    }

    /// Follows the declarations of the shared `ClusterLock` in `lock_path`, if it is one, before
    /// a contender joins it (the entry removes itself once neither is left).
    fn follow_declarations(&self, lock_path: &str) {
        let mut book = self.core.book.lock();
        if book.is_shared(lock_path) && !book.declared.contains_key(lock_path) {
            book.declared.insert(lock_path.into(), Declared::new(None));
            self.spawn_follower(lock_path);
        }
    }

    fn spawn_follower(&self, lock_path: &str) {
        let root = self.core.root.lock();
        let Some((layout, _, _)) = root.as_ref() else { return };
        let (Some(dir), Some(cluster)) = (layout.permits_of(lock_path), layout.cluster()) else { return };
        let core = Arc::downgrade(&self.core);
        tokio::spawn(permits::follow(core, lock_path.into(), dir, cluster.to_string()));
    }

    /// What the clusters sharing the `ClusterLock` in `lock_path` declare, this one's included,
    /// by cluster; `None` while they are not known (or it is not shared, or not followed).
    pub fn declarations(&self, lock_path: &str) -> Option<Vec<Declaration>> {
        let book = self.core.book.lock();
        let declared = book.declared.get(lock_path)?;
        let mut all = declared.others.clone()?;
        let root = self.core.root.lock();
        let cluster = root.as_ref().and_then(|(layout, _, _)| layout.cluster()).unwrap_or_default();
        if let Some(limit) = declared.own {
            all.push(Declaration { cluster: cluster.to_string(), limit });
        }
        all.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        Some(all)
    }

    /// Every lock with a limit other than a mutex's, by directory.
    /// Shared `ClusterLock`s count with what this cluster declares.
    pub fn limits(&self) -> Vec<(String, Limit)> {
        let book = self.core.book.lock();
        let declared = book.declared.iter().filter_map(|(path, d)| Some((path.to_string(), d.own?)));
        book.limits.iter().map(|(path, limit)| (path.to_string(), *limit)).chain(declared).collect()
    }

    /// Gives a holder a fencing token of its own, above every token issued so far: writes its
    /// node's data back unchanged (guarded by its version and the leader epoch) and takes the
    /// write's zxid. For a grant that is recorded late (its status write was held up while
    /// other holds of the lock began and ended): recorded with its first token, it would read
    /// as older than holds that ended before it. Answers the new token.
    pub async fn refresh_token(&self, id: &str) -> Result<i64, Error> {
        let client = self.core.client()?;
        let path = self.node(id).ok_or(Error::SessionLost)?;
        let zxid = match self.core.fence.touch(&client, &path).await {
            Ok(stat) => stat.mzxid + self.core.token_base(),
            Err(zk::Error::BadVersion) => return Err(Error::Contended { op: "set", path }),
            Err(e) => return Err(Error::zk("set", &path, e)),
        };
        let mut book = self.core.book.lock();
        let Book { contenders, locks, .. } = &mut *book;
        if let Some(member) = contenders.get_mut(id).filter(|m| m.path() == path) {
            member.fencing_token = zxid;
            if let Some(q) = locks.get_mut(&member.lock) {
                q.last_token = q.last_token.max(zxid);
            }
        }
        Ok(zxid)
    }

    /// The limit set for the lock in `lock_path` ([`LockEngine::set_limit`]).
    pub fn limit(&self, lock_path: &str) -> Limit {
        self.core.book.lock().limit(lock_path)
    }

    /// The contenders of a lock in queue order. One getChildren; for tools and position
    /// reports, not for deciding.
    pub async fn queue(&self, lock_path: &str) -> Result<Vec<QueueEntry>, Error> {
        let client = self.core.client()?;
        let children = ops::list(&client, lock_path).await?;
        Ok(recipe::queue(&children)
            .into_iter()
            .map(|c| QueueEntry {
                node: c.name.to_string(),
                sequence: c.sequence,
                id: c.ours.map(|(id, _)| id.to_string()),
                mode: c.mode(),
            })
            .collect())
    }
}

/// With a shared root: takes this cluster's name there, for the root with id `root_id`.
/// A root made under other credentials than every one this engine authenticates with locks it
/// out of its epoch node for good: refused at once, naming the fix.
async fn own_root_writable(client: &zk::Client, config: &ZkConfig, root: &str) -> Result<(), Error> {
    if config.digest_auth.is_none() {
        return Ok(());
    }
    match retry::idempotent(|| client.get_acl(root)).await {
        Ok((acls, _)) if !crate::acl::lets_us_write(&acls, config) => {
            let acl: Vec<String> =
                acls.iter().map(|a| format!("{}:{}:{:?}", a.scheme(), a.id(), a.permission())).collect();
            Err(Error::RootCredentials { root: root.into(), acl: acl.join(", ") })
        }
        Ok(_) | Err(zk::Error::NoNode) => Ok(()),
        Err(e) => Err(Error::zk("get ACL", root, e)),
    }
}

async fn take_cluster_name(
    client: &zk::Client,
    config: &ZkConfig,
    layout: &Layout,
    root_id: &str,
) -> Result<(), Error> {
    let (Some(path), Some(cluster)) = (layout.cluster_node(), layout.cluster()) else { return Ok(()) };
    if let Some(shared) = layout.shared_root() {
        match retry::idempotent(|| client.get_acl(shared)).await {
            Ok((acls, _)) if !super::acl::lets_us_write(&acls, config) => {
                let acl: Vec<String> =
                    acls.iter().map(|a| format!("{}:{}:{:?}", a.scheme(), a.id(), a.permission())).collect();
                return Err(Error::SharedRootCredentials { shared: shared.into(), acl: acl.join(", ") });
            }
            Ok(_) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(Error::zk("get ACL", shared, e)),
        }
    }
    let mine = root::ClusterName { cluster: cluster.into(), root: layout.root().into(), root_id: root_id.into() };
    match root::take_cluster_name(client, config, &path, &mine).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(other)) => Err(Error::ClusterNameInUse {
            cluster: cluster.into(),
            shared: layout.shared_root().unwrap_or_default().into(),
            other_root: other.root,
        }),
        Err(e) => Err(e),
    }
}

async fn take_root(client: &zk::Client, config: &ZkConfig, layout: &Layout, mine: &Installation) -> Result<(), Error> {
    root::take(client, config, layout, mine).await.map_err(|refused| match refused {
        root::Refused::InUse(other) => Error::RootInUse { root: layout.root().to_string(), other },
        root::Refused::ZooKeeper(e) => Error::zk("installation", layout.root(), e),
        root::Refused::Contended => Error::Contended { op: "installation", path: layout.installation() },
    })
}
