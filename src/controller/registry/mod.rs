//! What the operator remembers about the claims it serves, in memory and small, under one lock:
//! the claims' index here (which object a contender id, a claim UID, belongs to, which claims a
//! pod holds or a lock has), the admission gates (`super::admission`), and the grant book
//! ([`book`]: each claim's last written phase, stamp and verdict, and the grant ledger,
//! `super::ledger`, with every rule about who may be written Held). Everything here can be
//! rebuilt from the API and ZooKeeper; it is never the source of truth for who holds a lock. A
//! claim over several locks is one entry here, with all its locks.

mod book;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::admission::{Gates, Overtaken, Turn};
use super::base::Uid;
pub use super::ledger::GrantBlocked;
use super::ledger::Locks;
use crate::api::Phase;
use book::{Book, Grant};

/// A claim as the watch first delivers it.
pub struct Seen<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    /// Its locks (paths), each with whether it wants it exclusively.
    pub locks: &'a [(String, bool)],
    /// The holder pod it names, if any: from its first sight on, that pod's deletion
    /// reconciles it (a new term's walk may reach it last).
    pub pod: Option<&'a str>,
    /// Its place in the order the claim watch first delivered the claims (`KeptClaim::arrival`):
    /// one order for every lock, whichever lock's claims a term notes first.
    pub arrival: u64,
}

#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    /// Told whenever a claim is forgotten: see [`Registry::departure`].
    departed: tokio::sync::Notify,
}

#[derive(Default)]
struct Inner {
    /// Claim UID → what the operator knows of it. Small on purpose: one per claim served.
    claims: HashMap<Uid, Claim>,
    /// Namespaces and lock paths, one copy each however many claims name them.
    strings: HashSet<Arc<str>>,
    /// (namespace, pod name) → claim UIDs naming that pod as holder.
    by_pod: HashMap<(String, String), HashSet<Uid>>,
    /// Lock path → the claims naming it. A `Lock`'s status is made from these: a scan of its
    /// scope's store instead took 6 ms at 100,000 claims, at every refresh of every `Lock`.
    by_lock: HashMap<Arc<str>, HashSet<Uid>>,
    /// The admission gates of the locks (see [`super::admission`]).
    gates: Gates,
    /// Who may be written Held, and what the grants' writes left: see [`book`].
    book: Book,
}

struct Claim {
    name: Box<str>,
    namespace: Arc<str>,
    /// Empty until the claim is validated.
    locks: Locks,
    pod: Option<Box<str>>,
    /// The order in which the claim watch first delivered it (creation order for claims
    /// created while the operator runs).
    seen: u64,
    /// What the grant book keeps of it.
    grant: Grant,
}

impl Inner {
    fn intern_locks(&mut self, locks: &[(String, bool)]) -> Locks {
        match locks {
            [(lock, exclusive)] => Locks::One(self.intern(lock), *exclusive),
            several => {
                Locks::Several(several.iter().map(|(lock, exclusive)| (self.intern(lock), *exclusive)).collect())
            }
        }
    }

    /// Enters a claim not seen before, at place `seen` in first-seen order; answers `seen`,
    /// or `None` when it was known already.
    fn enter(&mut self, uid: &Uid, name: &str, namespace: &str, locks: &[(String, bool)], seen: u64) -> Option<u64> {
        if self.claims.contains_key(uid) {
            return None;
        }
        let claim = Claim {
            name: name.into(),
            namespace: self.intern(namespace),
            locks: self.intern_locks(locks),
            pod: None,
            seen,
            grant: Grant::default(),
        };
        self.index_locks(uid, &claim.locks);
        self.claims.insert(uid.clone(), claim);
        Some(seen)
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(s) {
            return shared.clone();
        }
        let shared: Arc<str> = s.into();
        self.strings.insert(shared.clone());
        shared
    }

    /// Lets go of an interned string; the last claim naming it takes it along (and, for a
    /// lock, what the ledger keeps about it).
    fn unintern(&mut self, s: Arc<str>) {
        // Two references left: this one and the set's (one more for each the ledger keeps).
        if Arc::strong_count(&s) <= 2 + self.book.ledger.references(&s) {
            self.book.ledger.drop_lock(&s);
            self.strings.remove(&*s);
        }
    }

    fn index_locks(&mut self, uid: &Uid, locks: &Locks) {
        for (lock, _) in locks.iter() {
            self.by_lock.entry(lock.clone()).or_default().insert(uid.clone());
        }
    }

    /// Out of the index by lock; an emptied entry goes, so that it holds no interned path.
    fn unindex_locks(&mut self, uid: &str, locks: &Locks) {
        for (lock, _) in locks.iter() {
            if let Some(claims) = self.by_lock.get_mut(&**lock) {
                claims.remove(uid);
                if claims.is_empty() {
                    self.by_lock.remove(&**lock);
                }
            }
        }
    }

    fn unintern_locks(&mut self, locks: Locks) {
        let paths: Vec<Arc<str>> = locks.iter().map(|(l, _)| l.clone()).collect();
        // Its own references go first: kept while the paths are let go of, they counted as a
        // claim still naming each lock, and no lock path (nor what the ledger keeps of the lock)
        // was ever let go of: the registry grew with every lock name ever used.
        drop(locks);
        for lock in paths {
            self.unintern(lock);
        }
    }

    /// Takes claim `uid` out of its locks' admission gates; answers who is first there now.
    fn leave_gates(&mut self, uid: &str) -> Vec<Uid> {
        let Some(locks) = self.claims.get(uid).map(|c| c.locks.clone()) else { return vec![] };
        locks.iter().filter_map(|(lock, _)| self.gates.leave(lock, uid)).collect()
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Records (or refreshes) a claim the operator serves, with its locks (paths, each with
    /// whether it is wanted exclusively; none while the claim is invalid); `arrival` as in
    /// [`Seen`].
    pub fn observe(&self, uid: &Uid, seen_as: Seen<'_>) {
        let Seen { name, namespace, locks, pod, arrival } = seen_as;
        let mut inner = self.lock();
        if let Some(pod) = pod {
            inner.by_pod.entry((namespace.to_string(), pod.to_string())).or_default().insert(uid.clone());
        }
        inner.enter(uid, name, namespace, locks, arrival);
        let changed = inner.claims.get(uid).is_some_and(|c| !c.locks.same(locks));
        if changed {
            // Out of the old locks' indexes first (a claim turned invalid keeps no hold, gate
            // or stamp there), back in under the new ones.
            let phase = inner.claims.get(uid).and_then(|c| c.grant.phase);
            let unstamped = inner.claims.get(uid).is_some_and(|c| c.grant.unstamped);
            inner.set_phase(uid, None);
            inner.unstamp(uid);
            inner.leave_gates(uid);
            let shared = inner.intern_locks(locks);
            let key = inner.claims.get_key_value(uid).map(|(key, _)| key.clone());
            if let (Some(key), Some(claim)) = (key, inner.claims.get_mut(uid)) {
                let old = std::mem::replace(&mut claim.locks, shared.clone());
                inner.unindex_locks(uid, &old);
                inner.index_locks(&key, &shared);
                inner.unintern_locks(old);
            }
            inner.set_phase(uid, phase);
            if unstamped {
                drop(inner);
                self.expect_stamp(uid);
                inner = self.lock();
            }
        }
        if let Some(claim) = inner.claims.get_mut(uid) {
            if claim.pod.as_deref() != pod {
                claim.pod = pod.map(Into::into);
            }
        }
    }

    /// Notes the order in which the claim watch delivers claims. A claim not yet in any queue
    /// (`pending`) joins its locks' admission gates at once, so that claims created after it
    /// wait for it even before its first reconcile asks to enqueue.
    pub fn first_seen(&self, uid: &Uid, seen_as: Seen<'_>, created: i64, phase: Option<Phase>) {
        let Seen { name, namespace, locks, pod, arrival } = seen_as;
        let mut inner = self.lock();
        let Some(seen) = inner.enter(uid, name, namespace, locks, arrival) else { return };
        if let Some(pod) = pod {
            inner.by_pod.entry((namespace.to_string(), pod.to_string())).or_default().insert(uid.clone());
            if let Some(claim) = inner.claims.get_mut(uid) {
                claim.pod = Some(pod.into());
            }
        }
        // Known from the start, so that a grant made before this claim's first reconcile (after
        // a restart, say) still sees a recorded holder.
        inner.set_phase(uid, phase);
        let pending = matches!(phase, None | Some(Phase::Pending));
        if pending {
            for (lock, _) in locks {
                inner.gates.arrive(lock, (created, seen), uid, Instant::now());
            }
        }
    }

    /// The paths of the locks claim `uid` asks for (as first seen), if it is known.
    pub fn lock_paths(&self, uid: &str) -> Option<Vec<Arc<str>>> {
        self.lock().claims.get(uid).map(|c| c.locks.iter().map(|(lock, _)| lock.clone()).collect())
    }

    /// Claim `uid` (created at second `created`) is being reconciled: where it waits at an
    /// admission gate, its patience runs from now (see `admission`).
    /// Called by every reconcile that can enter (the claim's finalizer on) or clean up: nothing
    /// more than a look while no claim waits at a gate.
    pub fn reconciling(&self, uid: &str, created: i64) {
        let mut inner = self.lock();
        let Inner { claims, gates, .. } = &mut *inner;
        if gates.is_empty() {
            return;
        }
        let Some(claim) = claims.get(uid) else { return };
        let paths: Vec<&str> = claim.locks.iter().map(|(lock, _)| &**lock).collect();
        gates.reconciling(&paths, (created, claim.seen), uid, Instant::now());
    }

    /// Asks to enqueue claim `uid`; first when it is first at the admission gate of every one of
    /// its locks (it arrives at each, so that later claims wait for it there).
    /// Claims ahead of it that stopped holding others back meanwhile are answered too.
    pub fn may_enqueue(&self, uid: &Uid, created: i64) -> (Turn, Overtaken) {
        let mut inner = self.lock();
        let Inner { claims, gates, .. } = &mut *inner;
        let Some(claim) = claims.get(uid) else { return (Turn::First, Overtaken::default()) };
        let paths: Vec<&str> = claim.locks.iter().map(|(lock, _)| &**lock).collect();
        let turn = gates.may_enqueue(&paths, (created, claim.seen), uid, Instant::now());
        (turn, gates.take_overtaken())
    }

    /// The claim entered the queues, or cannot enter them now (waiting for its holder pod, or
    /// final): it leaves its gates. Returns the claims first at them now.
    pub fn leave_gates(&self, uid: &str) -> Vec<String> {
        let mut inner = self.lock();
        let next = inner.leave_gates(uid);
        next.into_iter().filter(|n| inner.claims.contains_key(n)).map(|n| n.to_string()).collect()
    }

    pub fn forget(&self, uid: &str) {
        let mut inner = self.lock();
        inner.settle(uid);
        // Gone before it entered the queues: the claims behind it are asked for now.
        for next in inner.leave_gates(uid) {
            inner.book.ledger.wake(next);
        }
        inner.set_phase(uid, None);
        inner.unstamp(uid);
        if let Some(claim) = inner.claims.remove(uid) {
            inner.book.ledger.forget(uid, &claim.locks);
            inner.unindex_locks(uid, &claim.locks);
            inner.count(claim.grant.phase, -1);
            if let Some(pod) = claim.pod {
                let key = (claim.namespace.to_string(), pod.into_string());
                if let Some(set) = inner.by_pod.get_mut(&key) {
                    set.remove(uid);
                    if set.is_empty() {
                        inner.by_pod.remove(&key);
                    }
                }
            }
            inner.unintern(claim.namespace);
            inner.unintern_locks(claim.locks);
        }
        drop(inner);
        self.departed.notify_waiters();
    }

    /// Waits until claim `uid` is forgotten (its finalizer's removal answered), for `within` at
    /// most; whether it was.
    pub async fn departure(&self, uid: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Registered before the look, so that a departure in between is not missed.
            let notified = self.departed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if !self.lock().claims.contains_key(uid) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// The claims naming lock `path` (a claim whose cleanup is over names none): the
    /// namespace and name of each.
    pub fn claims_of_lock(&self, path: &str) -> Vec<(Arc<str>, String)> {
        let inner = self.lock();
        let Some(uids) = inner.by_lock.get(path) else { return vec![] };
        uids.iter().filter_map(|uid| inner.claims.get(uid)).map(|c| (c.namespace.clone(), c.name.to_string())).collect()
    }

    /// The claims of `namespace` naming lock `path`: the UID and name of each.
    pub fn claims_of_lock_in(&self, path: &str, namespace: &str) -> Vec<(Uid, String)> {
        let inner = self.lock();
        let Some(uids) = inner.by_lock.get(path) else { return vec![] };
        uids.iter()
            .filter_map(|uid| Some((uid, inner.claims.get(uid)?)))
            .filter(|(_, c)| &*c.namespace == namespace)
            .map(|(uid, c)| (uid.clone(), c.name.to_string()))
            .collect()
    }

    pub fn name(&self, uid: &str) -> Option<String> {
        self.lock().claims.get(uid).map(|c| c.name.to_string())
    }

    /// The registry's copy of a UID it knows, to share rather than allocate again.
    pub fn key(&self, uid: &str) -> Option<Uid> {
        self.lock().claims.get_key_value(uid).map(|(key, _)| key.clone())
    }

    /// One copy of a claim UID for all the operator's indexes: the registry's or the engine's if
    /// either has one.
    pub fn shared_uid(&self, uid: &str, engine: &crate::zk::LockEngine) -> Uid {
        self.key(uid).or_else(|| engine.id(uid)).unwrap_or_else(|| uid.into())
    }

    /// Which object claim `uid` is: (namespace, name).
    pub fn object(&self, uid: &str) -> Option<(String, String)> {
        self.lock().claims.get(uid).map(|c| (c.namespace.to_string(), c.name.to_string()))
    }

    /// UIDs of the claims naming `pod` as holder.
    pub fn claims_of_pod(&self, namespace: &str, pod: &str) -> Vec<String> {
        let inner = self.lock();
        let Some(uids) = inner.by_pod.get(&(namespace.to_string(), pod.to_string())) else { return vec![] };
        uids.iter().filter(|uid| inner.claims.contains_key(*uid)).map(|uid| uid.to_string()).collect()
    }

    /// UIDs of the claims that name a holder pod.
    pub fn claims_with_holders(&self) -> Vec<String> {
        self.lock().claims.iter().filter(|(_, c)| c.pod.is_some()).map(|(uid, _)| uid.to_string()).collect()
    }

    /// UIDs of every claim known.
    pub fn all(&self) -> Vec<String> {
        self.lock().claims.keys().map(|uid| uid.to_string()).collect()
    }

    /// Locks with at least one claim recorded as Waiting.
    pub fn locks_with_waiters(&self) -> Vec<String> {
        let inner = self.lock();
        let set: HashSet<&str> = inner
            .claims
            .values()
            .filter(|c| c.grant.phase == Some(Phase::Waiting))
            .flat_map(|c| c.locks.iter().map(|(l, _)| &**l))
            .collect();
        set.into_iter().map(str::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::Limit;

    /// A claim as the feed delivers it: each one after those before it (the feed numbers them).
    fn seen(locks: &[(String, bool)]) -> Seen<'_> {
        static ARRIVALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let arrival = ARRIVALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Seen { name: "c", namespace: "ns", locks, pod: None, arrival }
    }

    #[test]
    fn claims_created_in_one_second_keep_the_feeds_order_whichever_a_term_notes_first() {
        // A term's first pass notes the claims of its stores in the stores' order, not the
        // feed's: the gate orders them by the feed's numbers.
        let r = Registry::default();
        let (a, b): (Uid, Uid) = ("a".into(), "b".into());
        let lock = one("/l", true);
        r.first_seen(&b, Seen { name: "cb", namespace: "ns", locks: &lock, pod: None, arrival: 8 }, 5, None);
        r.first_seen(&a, Seen { name: "ca", namespace: "ns", locks: &lock, pod: None, arrival: 7 }, 5, None);
        assert_ne!(r.may_enqueue(&b, 5).0, Turn::First, "a was delivered first, in the same second");
        assert_eq!(r.may_enqueue(&a, 5).0, Turn::First);
    }

    fn one(lock: &str, exclusive: bool) -> Vec<(String, bool)> {
        vec![(lock.to_string(), exclusive)]
    }

    #[test]
    fn a_holder_pods_claims_are_known_from_their_first_sight_before_any_reconcile() {
        let r = Registry::default();
        let uid: Uid = "a".into();
        let seen = Seen { name: "ca", namespace: "ns", locks: &one("/l", true), pod: Some("worker-0"), arrival: 1 };
        r.first_seen(&uid, seen, 1, Some(Phase::Held));
        assert_eq!(r.claims_of_pod("ns", "worker-0"), ["a"], "the pod's deletion reconciles it at once");
        assert_eq!(r.claims_with_holders(), ["a"]);
        assert!(r.claims_of_pod("other", "worker-0").is_empty());
    }

    #[test]
    fn the_claims_of_a_lock_follow_their_specs_and_leave_with_them() {
        let r = Registry::default();
        let of = |path: &str| {
            let mut names: Vec<String> =
                r.claims_of_lock(path).into_iter().map(|(ns, name)| format!("{ns}/{name}")).collect();
            names.sort();
            names
        };
        let both = vec![("/l".to_string(), true), ("/m".to_string(), false)];
        let (a, b): (Uid, Uid) = ("a".into(), "b".into());
        r.first_seen(&a, Seen { name: "ca", namespace: "ns", locks: &one("/l", true), pod: None, arrival: 1 }, 1, None);
        r.first_seen(&b, Seen { name: "cb", namespace: "ns", locks: &both, pod: None, arrival: 2 }, 2, None);
        assert_eq!((of("/l"), of("/m")), (vec!["ns/ca".to_string(), "ns/cb".to_string()], vec!["ns/cb".to_string()]));
        r.observe(&b, Seen { name: "cb", namespace: "ns", locks: &one("/m", false), pod: None, arrival: 2 });
        assert_eq!(
            (of("/l"), of("/m")),
            (vec!["ns/ca".to_string()], vec!["ns/cb".to_string()]),
            "a changed spec moves it"
        );
        r.forget("a");
        r.forget("b");
        assert!(of("/l").is_empty() && of("/m").is_empty());
        let inner = r.lock();
        assert!(inner.by_lock.is_empty(), "no entry is kept for a lock nobody names");
        assert!(inner.strings.is_empty(), "and no path or namespace stays interned: {:?}", inner.strings);
    }

    #[tokio::test]
    async fn a_departure_is_awaited_until_the_claim_is_forgotten_or_the_time_is_up() {
        let r = Arc::new(Registry::default());
        let (a, b): (Uid, Uid) = ("a".into(), "b".into());
        r.first_seen(&a, seen(&one("/l", true)), 1, Some(Phase::Held));
        r.first_seen(&b, seen(&one("/m", true)), 2, Some(Phase::Held));
        assert!(r.departure("unknown", Duration::ZERO).await, "a claim the registry does not know has left");
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.departure("a", Duration::from_secs(1)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        r.forget("b");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "another claim's departure is not this one's");
        r.forget("a");
        assert!(waiting.await.unwrap(), "told the moment it is forgotten");
        r.first_seen(&b, seen(&one("/m", true)), 3, Some(Phase::Held));
        let started = Instant::now();
        assert!(!r.departure("b", Duration::from_millis(50)).await, "not forgotten: the wait ends with its time");
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_grant_conflicts_with_a_recorded_holder_until_its_final_status() {
        let r = Registry::default();
        let (a, b, c): (Uid, Uid, Uid) = ("a".into(), "b".into(), "c".into());
        r.first_seen(&a, seen(&one("/l", true)), 1, Some(Phase::Held));
        r.first_seen(&b, seen(&one("/l", true)), 2, Some(Phase::Waiting));
        r.first_seen(&c, seen(&one("/other", true)), 3, Some(Phase::Held));
        assert_eq!(r.reserve_grant("b", &[("/l", true, Limit::Mutex)]), Err(GrantBlocked::Holder("a".into())));
        assert_eq!(r.known_phase("b"), Some(Phase::Waiting), "a refused grant records nothing");
        assert_eq!(
            r.reserve_grant("a", &[("/l", true, Limit::Mutex)]),
            Ok(()),
            "a holder does not conflict with itself"
        );
        r.set_phase("a", Some(Phase::Lost));
        assert_eq!(r.reserve_grant("b", &[("/l", true, Limit::Mutex)]), Ok(()), "once its final status is written");
        assert_eq!(
            r.reserve_grant("c", &[("/l", true, Limit::Mutex)]),
            Err(GrantBlocked::Holder("b".into())),
            "the reservation itself counts"
        );
        r.set_phase("b", Some(Phase::Waiting));
        assert_eq!(
            r.reserve_grant("c", &[("/l", true, Limit::Mutex)]),
            Ok(()),
            "a rolled-back reservation frees the lock"
        );
        r.forget("c");
        assert_eq!(r.reserve_grant("x", &[("/l", true, Limit::Mutex)]), Ok(()), "a forgotten claim holds nothing");
    }

    #[test]
    fn shared_holders_conflict_only_with_an_exclusive_one() {
        let r = Registry::default();
        let (s1, s2): (Uid, Uid) = ("s1".into(), "s2".into());
        r.first_seen(&s1, seen(&one("/l", false)), 1, Some(Phase::Held));
        r.first_seen(&s2, seen(&one("/l", false)), 2, Some(Phase::Waiting));
        assert_eq!(r.reserve_grant("s2", &[("/l", false, Limit::Mutex)]), Ok(()), "shared beside shared");
        let three = Limit::from_permits(Some(3));
        for (i, uid) in ["e3", "e4"].into_iter().enumerate() {
            r.first_seen(&Uid::from(uid), seen(&one("/l", true)), 3 + i as i64, Some(Phase::Waiting));
        }
        assert_eq!(r.reserve_grant("e3", &[("/l", true, three)]), Ok(()), "a third permit beside two holders");
        assert_eq!(
            r.reserve_grant("e4", &[("/l", true, three)]),
            Err(GrantBlocked::Holder("s1".into())),
            "no fourth of three"
        );
        r.commit_grant("e3");
        assert_eq!(r.reserve_grant("e4", &[("/l", true, Limit::from_permits(Some(4)))]), Ok(()));
        for uid in ["e3", "e4"] {
            r.set_phase(uid, Some(Phase::Released));
        }
        assert_eq!(
            r.reserve_grant("x", &[("/l", true, Limit::Mutex)]),
            Err(GrantBlocked::Holder("s1".into())),
            "exclusive beside shared"
        );
    }

    #[test]
    fn grants_of_a_lock_with_permits_are_written_one_at_a_time() {
        let r = Registry::default();
        let three = Limit::from_permits(Some(3));
        for (i, uid) in ["a", "b", "c", "m1", "m2"].into_iter().enumerate() {
            let lock = if uid.starts_with('m') { "/mutex" } else { "/p" };
            r.first_seen(&Uid::from(uid), seen(&one(lock, false)), i as i64, Some(Phase::Waiting));
        }
        assert_eq!(r.reserve_grant("a", &[("/p", true, three)]), Ok(()));
        assert_eq!(
            r.reserve_grant("b", &[("/p", true, three)]),
            Err(GrantBlocked::Granting("a".into())),
            "a's write is not answered yet"
        );
        assert_eq!(r.reserve_grant("a", &[("/p", true, three)]), Ok(()), "its own write does not hold it up");
        r.commit_grant("a");
        assert_eq!(r.reserve_grant("b", &[("/p", true, three)]), Ok(()), "answered");
        r.abandon_grant("b", Some(Phase::Waiting));
        assert_eq!(r.reserve_grant("c", &[("/p", true, three)]), Ok(()), "an abandoned grant is not in flight");
        r.forget("c");
        assert_eq!(r.lock().book.ledger.references("/p"), 0, "a forgotten claim's grant is not in flight");
        assert_eq!(r.reserve_grant("m1", &[("/mutex", false, Limit::Mutex)]), Ok(()));
        assert_eq!(
            r.reserve_grant("m2", &[("/mutex", false, Limit::Mutex)]),
            Ok(()),
            "shared grants of a mutex at once"
        );

        r.token_used("/p", 7);
        r.token_used("/p", 5);
        assert_eq!(r.highest_token("/p"), 7);
        assert_eq!(r.highest_token("/unknown"), 0);
    }

    #[test]
    fn gates_are_kept_only_for_locks_with_claims_waiting_at_them() {
        let r = Registry::default();
        let (a, b): (Uid, Uid) = ("a".into(), "b".into());
        r.first_seen(&a, seen(&one("/l", true)), 1, None);
        r.first_seen(&b, seen(&one("/m", true)), 1, None);
        assert_eq!(r.lock().gates.len(), 2);
        r.forget("a");
        assert!(r.leave_gates("b").is_empty());
        assert_eq!(r.lock().gates.len(), 0, "no empty gate left behind");
        r.forget("b");
        assert!(r.lock().claims.is_empty() && r.lock().book.ledger.is_empty());
    }

    #[test]
    fn no_grant_while_a_claim_of_the_lock_may_still_receive_a_deposed_leaders_write() {
        let r = Registry::default();
        let (a, b, c): (Uid, Uid, Uid) = ("a".into(), "b".into(), "c".into());
        r.first_seen(&a, seen(&one("/l", true)), 1, Some(Phase::Waiting));
        r.first_seen(&b, seen(&one("/l", true)), 2, Some(Phase::Waiting));
        r.first_seen(&c, seen(&one("/other", true)), 3, Some(Phase::Waiting));
        r.expect_stamp(&a);
        r.expect_stamp(&b);
        r.expect_stamp(&c);
        assert_eq!(r.reserve_grant("a", &[("/l", true, Limit::Mutex)]), Err(GrantBlocked::Unstamped(vec!["b".into()])));
        assert!(!r.written("b"));
        r.stamped("b", true);
        assert!(r.written("b"));
        assert_eq!(
            r.reserve_grant("b", &[("/l", true, Limit::Mutex)]),
            Err(GrantBlocked::Unstamped(vec!["a".into()])),
            "nor for b"
        );
        assert_eq!(r.reserve_grant("a", &[("/l", true, Limit::Mutex)]), Ok(()), "its own stamp is the grant's write");
        r.stamped("a", true);
        r.forget("c");
        assert!(!r.lock().book.ledger.awaits_stamps(), "a deleted claim is awaited no more");
        r.expect_stamp(&b);
        r.stamped("b", false);
        assert!(!r.lock().book.ledger.awaits_stamps(), "read with this term's epoch, or final");
    }

    #[test]
    fn a_claim_that_turns_invalid_leaves_its_locks_indexes() {
        let r = Registry::default();
        let a: Uid = "a".into();
        r.first_seen(&a, seen(&one("/l", true)), 1, Some(Phase::Held));
        r.observe(&a, Seen { name: "c", namespace: "ns", locks: &[], pod: None, arrival: 1 });
        assert_eq!(r.reserve_grant("b", &[("/l", true, Limit::Mutex)]), Ok(()), "no hold left behind under /l");
        r.forget("a");
        assert!(r.lock().book.ledger.is_empty());
    }

    #[test]
    fn the_known_phase_is_the_last_written_one() {
        let r = Registry::default();
        let a: Uid = "a".into();
        r.first_seen(&a, seen(&one("/l", true)), 1, Some(Phase::Waiting));
        assert_eq!(r.known_phase("a"), Some(Phase::Waiting));
        r.set_phase("a", Some(Phase::Expired));
        // A later first sighting (a re-list) does not overwrite what the operator wrote.
        r.first_seen(&a, seen(&one("/l", true)), 1, Some(Phase::Waiting));
        assert_eq!(r.known_phase("a"), Some(Phase::Expired));
    }

    #[test]
    fn a_claim_gone_before_it_entered_its_queue_wakes_the_claim_behind_it() {
        let r = Registry::default();
        let (tx, mut woken) = tokio::sync::mpsc::unbounded_channel();
        r.wake_into(tx);
        let (gone, next): (Uid, Uid) = ("gone".into(), "next".into());
        r.first_seen(&gone, seen(&one("/l", true)), 1, None);
        r.first_seen(&next, seen(&one("/l", true)), 2, None);
        assert_ne!(r.may_enqueue(&next, 2).0, Turn::First);
        r.forget("gone");
        assert_eq!(woken.try_recv().ok().as_deref(), Some("next"));
        assert_eq!(r.may_enqueue(&next, 2).0, Turn::First);
    }

    #[test]
    fn a_claim_over_several_locks_is_granted_in_all_or_none_and_waits_at_every_gate() {
        let r = Registry::default();
        let (m, s, t): (Uid, Uid, Uid) = ("m".into(), "s".into(), "t".into());
        let both = vec![("/a".to_string(), true), ("/b".to_string(), false)];
        r.first_seen(&s, seen(&one("/b", true)), 1, None);
        r.first_seen(&m, seen(&both), 2, None);
        r.first_seen(&t, seen(&one("/a", true)), 3, None);
        assert_ne!(r.may_enqueue(&m, 2).0, Turn::First, "s, created earlier, is first at /b");
        assert_ne!(r.may_enqueue(&t, 3).0, Turn::First, "m waits at /a too, ahead of t");
        assert_eq!(r.leave_gates("s"), ["m"]);
        assert_eq!(r.may_enqueue(&m, 2).0, Turn::First, "first at both gates");
        assert_eq!(r.leave_gates("m"), ["t"]);
        r.set_phase("s", Some(Phase::Held));
        let grant = [("/a", true, Limit::Mutex), ("/b", false, Limit::Mutex)];
        assert_eq!(r.reserve_grant("m", &grant), Err(GrantBlocked::Holder("s".into())), "s holds /b exclusively");
        assert_eq!(r.known_phase("m"), None, "nothing reserved in /a either");
        assert_eq!(r.reserve_grant("t", &[("/a", true, Limit::Mutex)]), Ok(()));
        r.set_phase("t", Some(Phase::Released));
        r.set_phase("s", Some(Phase::Released));
        assert_eq!(r.reserve_grant("m", &grant), Ok(()));
        assert_eq!(r.reserve_grant("t", &[("/a", true, Limit::Mutex)]), Err(GrantBlocked::Holder("m".into())));
        assert_eq!(r.reserve_grant("x", &[("/b", false, Limit::Mutex)]), Ok(()), "shared beside m's shared part");
        for uid in ["m", "s", "t", "x"] {
            r.forget(uid);
        }
        assert!(r.lock().book.ledger.is_empty(), "a forgotten claim holds nothing in any lock");
    }
}
