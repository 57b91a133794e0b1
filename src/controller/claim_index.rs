//! Which claims name each lock and each holder pod, kept by the claim feeds while the process
//! stands by (see `feed`), so that a new term re-anchors the locks where claims ask for
//! something first, each from its own claims, without reading every claim before its first
//! grant: at 100,000 claims that loop took 0.6–0.7 s of a leader change in which nothing is
//! granted (docs/benchmarks.md, "The barrier at a term's start"). The price is memory, in the
//! standby too: see docs/benchmarks.md.
//!
//! Only unfinished claims are kept (a final phase is final, and a claim whose cleanup is over
//! holds nothing: neither is ever taken into a pass), with what their spec says (immutable: the
//! CRD refuses a change) and what orders the pass (whether the claim asks for something, by its
//! own status); which claim holds what is always read from the claim itself, in the store, when
//! its lock is taken.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::base::claim_facts;
use crate::api::{KeptClaim, LockName, Phase, REVOKE_ANNOTATION};
use crate::zk::Layout;

/// A claim as the index names it: where its scope's store has it. No UID: the store's copy of
/// that name is the claim (a claim made again under the name replaces the index's entry, as it
/// replaces the store's copy), and 64 bytes a claim are saved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// What a term's first look at the index gives.
#[derive(Debug, Default)]
pub struct Listed {
    /// Lock path → the claims naming it.
    pub locks: BTreeMap<String, Vec<ClaimRef>>,
    /// Claims that ask for something (new, being deleted, revoked), by their own status, each
    /// with its lock paths.
    pub asking: Vec<(ClaimRef, Vec<Arc<str>>)>,
    /// Claims whose spec or status cannot be read: where they hold is only in their status,
    /// so the term reads each of them before it judges any lock.
    pub unreadable: Vec<ClaimRef>,
}

pub struct ClaimIndex {
    layout: Layout,
    inner: parking_lot::Mutex<Inner>,
}

/// (namespace, pod name).
type PodKey = (Arc<str>, Box<str>);

#[derive(Default)]
struct Inner {
    claims: HashMap<ClaimRef, Entry>,
    /// Lock path → the claims naming it.
    by_lock: HashMap<Arc<str>, HashSet<ClaimRef>>,
    /// (namespace, holder pod) → the claims naming it.
    by_pod: HashMap<PodKey, HashSet<ClaimRef>>,
    /// Namespaces, one copy each, with the number of claims in each.
    namespaces: HashMap<Arc<str>, usize>,
    asking: HashSet<ClaimRef>,
    unreadable: HashSet<ClaimRef>,
}

struct Entry {
    /// A hash of its UID: a claim made again under the name (deleted and made while the watch
    /// was away) is another claim, with locks of its own.
    uid: u64,
    /// The feed's scope whose store has it.
    scope: u32,
    /// Lock paths, shared with `by_lock`'s keys.
    locks: Paths,
    pod: Option<Box<str>>,
}

/// A claim's lock paths: most claims name one, kept without an allocation of its own.
enum Paths {
    One(Arc<str>),
    Several(Box<[Arc<str>]>),
}

impl Paths {
    fn as_slice(&self) -> &[Arc<str>] {
        match self {
            Paths::One(path) => std::slice::from_ref(path),
            Paths::Several(paths) => paths,
        }
    }
}

impl ClaimIndex {
    pub fn new(layout: Layout) -> Self {
        ClaimIndex { layout, inner: Default::default() }
    }

    /// The watch of `scope` delivered `claim` (new or changed). Runs at every delivery: a claim
    /// known already only has its flags looked at.
    pub fn put(&self, scope: usize, claim: &KeptClaim) {
        let (Some(namespace), Some(name)) = (claim.metadata.namespace.as_deref(), claim.metadata.name.as_deref())
        else {
            return;
        };
        let phase = claim.phase();
        if phase.is_some_and(Phase::is_terminal) || claim_facts::cleaned_up(claim) {
            self.remove(namespace, name);
            return;
        }
        let unreadable = claim.unreadable.is_some();
        let asks = claim.metadata.deletion_timestamp.is_some()
            || matches!(phase, None | Some(Phase::Pending))
            || claim.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(REVOKE_ANNOTATION));
        let uid = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            claim.metadata.uid.hash(&mut hasher);
            hasher.finish()
        };
        let scope = u32::try_from(scope).unwrap_or(u32::MAX);
        let mut inner = self.inner.lock();
        let key = inner.key(namespace, name);
        let same = inner.claims.get(&key).is_some_and(|e| e.uid == uid && e.scope == scope)
            && inner.unreadable.contains(&key) == unreadable;
        if !same {
            let paths: Vec<String> = if unreadable {
                vec![]
            } else {
                claim
                    .spec
                    .lock_names()
                    .filter_map(|lock| match lock {
                        // No lock named (the schema refuses it): none, as the registry has it.
                        LockName::Namespaced("") => None,
                        LockName::Namespaced(lock) => Some(self.layout.lock(namespace, lock)),
                        LockName::Cluster(lock) => Some(self.layout.cluster_lock(lock)),
                    })
                    .collect()
            };
            let pod = claim.spec.holder.as_ref().map(|h| h.pod_name.as_str()).filter(|_| !unreadable);
            inner.remove(&key);
            inner.insert(key.clone(), (uid, scope), &paths, pod);
        }
        set(&mut inner.asking, &key, asks);
        set(&mut inner.unreadable, &key, unreadable);
    }

    /// Claim `name` of `namespace` left its store.
    pub fn remove(&self, namespace: &str, name: &str) {
        let mut inner = self.inner.lock();
        let key = ClaimRef { namespace: namespace.into(), name: name.into() };
        inner.remove(&key);
    }

    /// After a list of `scope`: its claims that `kept` (namespace, name) says are not in its
    /// store any more (deleted while the watch was away) leave the index.
    pub fn retain(&self, scope: usize, kept: impl Fn(&str, &str) -> bool) {
        let scope = u32::try_from(scope).unwrap_or(u32::MAX);
        let mut inner = self.inner.lock();
        let gone: Vec<ClaimRef> = inner
            .claims
            .iter()
            .filter(|(key, e)| e.scope == scope && !kept(&key.namespace, &key.name))
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            inner.remove(&key);
        }
    }

    /// Every lock an unfinished claim names, with those claims, and the claims a term reads
    /// first.
    pub fn listed(&self) -> Listed {
        let inner = self.inner.lock();
        let locks = inner.by_lock.iter().map(|(path, claims)| (path.to_string(), claims.iter().cloned().collect()));
        let paths = |key: &ClaimRef| inner.claims.get(key).map(|e| e.locks.as_slice().to_vec()).unwrap_or_default();
        let asking = inner.asking.iter().map(|key| (key.clone(), paths(key))).collect();
        Listed { locks: locks.collect(), asking, unreadable: inner.unreadable.iter().cloned().collect() }
    }

    /// The claims naming pod `name` of `namespace` as their holder.
    pub fn claims_of_pod(&self, namespace: &str, name: &str) -> Vec<ClaimRef> {
        let inner = self.inner.lock();
        let Some((ns, _)) = inner.namespaces.get_key_value(namespace) else { return vec![] };
        let Some(claims) = inner.by_pod.get(&(ns.clone(), name.into())) else { return vec![] };
        claims.iter().cloned().collect()
    }

    /// Every (namespace, pod) some claim names as its holder.
    pub fn holder_pods(&self) -> Vec<(Arc<str>, String)> {
        self.inner.lock().by_pod.keys().map(|(ns, pod)| (ns.clone(), pod.to_string())).collect()
    }
}

fn set(set: &mut HashSet<ClaimRef>, key: &ClaimRef, member: bool) {
    if member {
        if !set.contains(key) {
            set.insert(key.clone());
        }
    } else {
        set.remove(key);
    }
}

impl Inner {
    /// The index's key for a claim: its copies of the namespace and name if it has them.
    fn key(&self, namespace: &str, name: &str) -> ClaimRef {
        let probe = ClaimRef { namespace: namespace.into(), name: name.into() };
        if let Some((key, _)) = self.claims.get_key_value(&probe) {
            return key.clone();
        }
        match self.namespaces.get_key_value(namespace) {
            Some((ns, _)) => ClaimRef { namespace: ns.clone(), name: probe.name },
            None => probe,
        }
    }

    /// Enters claim `key` (its UID's hash, its scope) with lock `paths` and holder `pod`.
    fn insert(&mut self, key: ClaimRef, (uid, scope): (u64, u32), paths: &[String], pod: Option<&str>) {
        *self.namespaces.entry(key.namespace.clone()).or_default() += 1;
        let mut shared: Vec<Arc<str>> = paths
            .iter()
            .map(|path| {
                let path = match self.by_lock.get_key_value(path.as_str()) {
                    Some((path, _)) => path.clone(),
                    None => Arc::from(path.as_str()),
                };
                self.by_lock.entry(path.clone()).or_default().insert(key.clone());
                path
            })
            .collect();
        let locks = match (shared.len(), shared.pop()) {
            (1, Some(path)) => Paths::One(path),
            (_, last) => Paths::Several(shared.into_iter().chain(last).collect()),
        };
        if let Some(pod) = pod {
            self.by_pod.entry((key.namespace.clone(), pod.into())).or_default().insert(key.clone());
        }
        self.claims.insert(key, Entry { uid, scope, locks, pod: pod.map(Into::into) });
    }

    fn remove(&mut self, key: &ClaimRef) {
        self.asking.remove(key);
        self.unreadable.remove(key);
        let Some(entry) = self.claims.remove(key) else { return };
        for lock in entry.locks.as_slice() {
            if let Some(claims) = self.by_lock.get_mut(lock) {
                claims.remove(key);
                if claims.is_empty() {
                    self.by_lock.remove(lock);
                }
            }
        }
        if let Some(pod) = entry.pod {
            let pod_key = (key.namespace.clone(), pod);
            if let Some(claims) = self.by_pod.get_mut(&pod_key) {
                claims.remove(key);
                if claims.is_empty() {
                    self.by_pod.remove(&pod_key);
                }
            }
        }
        // The last claim of a namespace takes its copy along.
        if let Some(count) = self.namespaces.get_mut(&key.namespace) {
            *count -= 1;
            if *count == 0 {
                self.namespaces.remove(&key.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claim `name` (its UID `uid`), with `spec` and, if given, `status`.
    fn made(name: &str, uid: &str, spec: serde_json::Value, status: Option<serde_json::Value>) -> KeptClaim {
        let mut object = serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": spec,
        });
        if let Some(status) = status {
            object["status"] = status;
        }
        serde_json::from_value(object).expect("a claim")
    }

    fn claim(name: &str, spec: serde_json::Value, status: Option<serde_json::Value>) -> KeptClaim {
        made(name, name, spec, status)
    }

    fn phase(phase: &str) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "phase": phase }))
    }

    fn layout() -> Layout {
        Layout::new("/zklock").expect("a valid root")
    }

    fn index() -> ClaimIndex {
        ClaimIndex::new(layout())
    }

    fn names(refs: &[ClaimRef]) -> Vec<&str> {
        let mut names: Vec<&str> = refs.iter().map(|r| &*r.name).collect();
        names.sort();
        names
    }

    fn asking(index: &ClaimIndex) -> Vec<(String, Vec<String>)> {
        let mut asking: Vec<(String, Vec<String>)> = index
            .listed()
            .asking
            .into_iter()
            .map(|(r, paths)| (r.name.to_string(), paths.iter().map(|p| p.to_string()).collect()))
            .collect();
        asking.sort();
        asking
    }

    #[test]
    fn a_lock_lists_exactly_the_unfinished_claims_in_the_stores_that_name_it() {
        let index = index();
        let (path, cluster) = (layout().lock("ns", "l"), layout().cluster_lock("c"));
        index.put(0, &claim("a", serde_json::json!({"lockName": "l"}), phase("Held")));
        index.put(0, &claim("b", serde_json::json!({"locks": [{"lockName": "l"}, {"clusterLockName": "c"}]}), None));
        index.put(0, &claim("c", serde_json::json!({"lockName": "m"}), phase("Waiting")));
        index.put(0, &claim("d", serde_json::json!({"lockName": "done"}), phase("Released")));
        let listed = index.listed();
        assert_eq!(names(&listed.locks[&path]), ["a", "b"]);
        assert_eq!(names(&listed.locks[&cluster]), ["b"]);
        assert!(!listed.locks.contains_key(&layout().lock("ns", "done")), "a lock only finished claims name");
        assert_eq!(asking(&index), [("b".to_string(), vec![path.clone(), cluster.clone()])], "the claim with no phase");

        // Finished: it leaves (a final phase is final).
        index.put(0, &claim("a", serde_json::json!({"lockName": "l"}), phase("Lost")));
        index.remove("ns", "c");
        let listed = index.listed();
        assert_eq!(names(&listed.locks[&path]), ["b"]);
        assert!(!listed.locks.contains_key(&layout().lock("ns", "m")), "an emptied lock goes");
        index.put(0, &claim("b", serde_json::json!({"lockName": "l"}), phase("Waiting")));
        assert!(asking(&index).is_empty(), "granted a place: it asks for nothing any more");
        index.remove("ns", "b");
        let inner = index.inner.lock();
        assert!(inner.by_lock.is_empty() && inner.namespaces.is_empty() && inner.claims.is_empty());
    }

    #[test]
    fn a_claim_made_again_under_its_name_is_indexed_with_its_own_locks_and_pod() {
        let index = index();
        index.put(0, &made("a", "u1", serde_json::json!({"lockName": "l", "holder": {"podName": "p"}}), None));
        // Deleted and made again while the watch was away: the list brings the new one.
        index.put(0, &made("a", "u2", serde_json::json!({"lockName": "m", "holder": {"podName": "q"}}), None));
        let listed = index.listed();
        assert_eq!(listed.locks.keys().cloned().collect::<Vec<_>>(), [layout().lock("ns", "m")]);
        assert!(index.claims_of_pod("ns", "p").is_empty());
        assert_eq!(names(&index.claims_of_pod("ns", "q")), ["a"]);
        assert_eq!(index.inner.lock().namespaces.get("ns"), Some(&1), "one claim in the namespace");
    }

    #[test]
    fn a_list_retains_only_its_own_scopes_claims() {
        let index = index();
        index.put(0, &claim("a", serde_json::json!({"lockName": "l"}), None));
        index.put(1, &claim("b", serde_json::json!({"lockName": "l"}), None));
        index.retain(0, |_, _| false);
        assert_eq!(names(&index.listed().locks[&layout().lock("ns", "l")]), ["b"], "scope 1's claim stays");
    }

    #[test]
    fn a_holder_pod_names_its_claims_until_they_finish_or_go() {
        let index = index();
        let spec = serde_json::json!({"lockName": "l", "holder": {"podName": "p"}});
        index.put(0, &claim("a", spec.clone(), phase("Held")));
        index.put(0, &claim("b", spec.clone(), phase("Waiting")));
        assert_eq!(names(&index.claims_of_pod("ns", "p")), ["a", "b"]);
        assert!(index.claims_of_pod("other", "p").is_empty());
        index.put(0, &claim("a", spec, phase("Released")));
        assert_eq!(names(&index.claims_of_pod("ns", "p")), ["b"], "a finished claim asks for nothing");
        index.remove("ns", "b");
        assert!(index.claims_of_pod("ns", "p").is_empty());
        assert!(index.holder_pods().is_empty());
    }

    #[test]
    fn an_unreadable_claim_is_listed_to_be_read_first_and_names_no_lock() {
        let index = index();
        let mut unreadable = claim("u", serde_json::json!({"lockName": "l"}), None);
        unreadable.unreadable = Some("spec: invalid".into());
        index.put(0, &unreadable);
        let listed = index.listed();
        assert_eq!(names(&listed.unreadable), ["u"]);
        assert!(listed.locks.is_empty());
        // Readable again (its status was mended): it names its lock now.
        index.put(0, &claim("u", serde_json::json!({"lockName": "l"}), None));
        let listed = index.listed();
        assert!(listed.unreadable.is_empty());
        assert_eq!(listed.locks.len(), 1);
    }
}
