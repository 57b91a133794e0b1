//! Which claims name each lock and each holder pod, kept by the claim feeds while the process
//! stands by (see `feed`), so that a new term re-anchors the locks where claims ask for
//! something first, each from its own claims, without reading every claim before its first
//! grant: at 100,000 claims that loop took 0.6–0.7 s of a leader change in which nothing is
//! granted (docs/benchmarks.md, "The barrier at a term's start"). The price is about 200 bytes
//! a claim, in the standby too.
//!
//! Only what a claim's spec says (immutable: the CRD refuses a change) and what orders the
//! pass (whether the claim asks for something, by its own status) is kept; which claim holds
//! what is always read from the claim itself, in the store, when its lock is taken.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::api::{KeptClaim, LockName, Phase, REVOKE_ANNOTATION};
use crate::zk::Layout;

/// A claim as the index names it: enough to find it in its scope's store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub uid: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// What a term's first look at the index gives.
#[derive(Debug, Default)]
pub struct Listed {
    /// Lock path → the claims naming it.
    pub locks: BTreeMap<String, Vec<ClaimRef>>,
    /// Claims that ask for something (new, being deleted, revoked), by their own status.
    pub asking: Vec<ClaimRef>,
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
    claims: HashMap<Arc<str>, Entry>,
    /// Lock path → UIDs of the claims naming it.
    by_lock: HashMap<Arc<str>, HashSet<Arc<str>>>,
    /// (namespace, holder pod) → UIDs of the claims naming it.
    by_pod: HashMap<PodKey, HashSet<Arc<str>>>,
    /// Namespaces, one copy each, with the number of claims in each.
    namespaces: HashMap<Arc<str>, usize>,
    asking: HashSet<Arc<str>>,
    unreadable: HashSet<Arc<str>>,
}

struct Entry {
    /// The feed's scope whose store has it.
    scope: usize,
    namespace: Arc<str>,
    name: Arc<str>,
    /// Lock paths, shared with `by_lock`'s keys.
    locks: Box<[Arc<str>]>,
    pod: Option<Box<str>>,
}

impl ClaimIndex {
    pub fn new(layout: Layout) -> Self {
        ClaimIndex { layout, inner: Default::default() }
    }

    /// The watch of `scope` delivered `claim` (new or changed).
    pub fn put(&self, scope: usize, claim: &KeptClaim) {
        let (Some(uid), Some(namespace), Some(name)) =
            (claim.metadata.uid.as_deref(), claim.metadata.namespace.as_deref(), claim.metadata.name.as_deref())
        else {
            return;
        };
        let unreadable = claim.unreadable.is_some();
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
        let asks = claim.metadata.deletion_timestamp.is_some()
            || matches!(claim.phase(), None | Some(Phase::Pending))
            || claim.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(REVOKE_ANNOTATION));
        let mut inner = self.inner.lock();
        let same = inner.claims.get(uid).is_some_and(|e| {
            e.scope == scope
                && e.pod.as_deref() == pod
                && e.locks.len() == paths.len()
                && e.locks.iter().zip(&paths).all(|(a, b)| **a == **b)
        });
        let uid: Arc<str> = match inner.claims.get_key_value(uid) {
            Some((key, _)) => key.clone(),
            None => uid.into(),
        };
        if !same {
            inner.remove(&uid);
            inner.insert(uid.clone(), scope, namespace, name, &paths, pod);
        }
        set(&mut inner.asking, &uid, asks);
        set(&mut inner.unreadable, &uid, unreadable);
    }

    /// Claim `uid` left its store.
    pub fn remove(&self, uid: &str) {
        self.inner.lock().remove(uid);
    }

    /// After a list of `scope`: its claims that `kept` (namespace, name, uid) says are not in
    /// its store any more (deleted while the watch was away) leave the index.
    pub fn retain(&self, scope: usize, kept: impl Fn(&str, &str, &str) -> bool) {
        let mut inner = self.inner.lock();
        let gone: Vec<Arc<str>> = inner
            .claims
            .iter()
            .filter(|(uid, e)| e.scope == scope && !kept(&e.namespace, &e.name, uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            inner.remove(&uid);
        }
    }

    /// Every lock with the claims naming it, and the claims a term reads first.
    pub fn listed(&self) -> Listed {
        let inner = self.inner.lock();
        let locks = inner
            .by_lock
            .iter()
            .map(|(path, uids)| (path.to_string(), uids.iter().filter_map(|uid| inner.claim_ref(uid)).collect()))
            .collect();
        let refs = |uids: &HashSet<Arc<str>>| uids.iter().filter_map(|uid| inner.claim_ref(uid)).collect();
        Listed { locks, asking: refs(&inner.asking), unreadable: refs(&inner.unreadable) }
    }

    /// The lock paths claim `uid` names.
    pub fn lock_paths(&self, uid: &str) -> Vec<Arc<str>> {
        self.inner.lock().claims.get(uid).map(|e| e.locks.to_vec()).unwrap_or_default()
    }

    /// The claims naming pod `name` of `namespace` as their holder.
    pub fn claims_of_pod(&self, namespace: &str, name: &str) -> Vec<ClaimRef> {
        let inner = self.inner.lock();
        let Some((ns, _)) = inner.namespaces.get_key_value(namespace) else { return vec![] };
        let ns = ns.clone();
        let Some(uids) = inner.by_pod.get(&(ns, name.into())) else { return vec![] };
        uids.iter().filter_map(|uid| inner.claim_ref(uid)).collect()
    }

    /// Every (namespace, pod) some claim names as its holder.
    pub fn holder_pods(&self) -> Vec<(Arc<str>, String)> {
        self.inner.lock().by_pod.keys().map(|(ns, pod)| (ns.clone(), pod.to_string())).collect()
    }
}

fn set(set: &mut HashSet<Arc<str>>, uid: &Arc<str>, member: bool) {
    if member {
        set.insert(uid.clone());
    } else {
        set.remove(uid);
    }
}

impl Inner {
    fn claim_ref(&self, uid: &Arc<str>) -> Option<ClaimRef> {
        let e = self.claims.get(uid)?;
        Some(ClaimRef { uid: uid.clone(), namespace: e.namespace.clone(), name: e.name.clone() })
    }

    fn insert(
        &mut self,
        uid: Arc<str>,
        scope: usize,
        namespace: &str,
        name: &str,
        paths: &[String],
        pod: Option<&str>,
    ) {
        let namespace = match self.namespaces.get_key_value(namespace) {
            Some((ns, _)) => ns.clone(),
            None => namespace.into(),
        };
        *self.namespaces.entry(namespace.clone()).or_default() += 1;
        let locks: Box<[Arc<str>]> = paths
            .iter()
            .map(|path| {
                let key = match self.by_lock.get_key_value(path.as_str()) {
                    Some((key, _)) => key.clone(),
                    None => Arc::from(path.as_str()),
                };
                self.by_lock.entry(key.clone()).or_default().insert(uid.clone());
                key
            })
            .collect();
        if let Some(pod) = pod {
            self.by_pod.entry((namespace.clone(), pod.into())).or_default().insert(uid.clone());
        }
        let entry = Entry { scope, namespace, name: name.into(), locks, pod: pod.map(Into::into) };
        self.claims.insert(uid, entry);
    }

    fn remove(&mut self, uid: &str) {
        self.asking.remove(uid);
        self.unreadable.remove(uid);
        let Some(entry) = self.claims.remove(uid) else { return };
        for lock in entry.locks.iter() {
            if let Some(uids) = self.by_lock.get_mut(lock) {
                uids.remove(uid);
                if uids.is_empty() {
                    self.by_lock.remove(lock);
                }
            }
        }
        if let Some(pod) = entry.pod {
            let key = (entry.namespace.clone(), pod);
            if let Some(uids) = self.by_pod.get_mut(&key) {
                uids.remove(uid);
                if uids.is_empty() {
                    self.by_pod.remove(&key);
                }
            }
        }
        // The last claim of a namespace takes its copy along.
        if let Some(count) = self.namespaces.get_mut(&entry.namespace) {
            *count -= 1;
            if *count == 0 {
                self.namespaces.remove(&entry.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str, spec: serde_json::Value, status: Option<serde_json::Value>) -> KeptClaim {
        let mut object = serde_json::json!({
            "metadata": {"name": format!("c-{uid}"), "namespace": "ns", "uid": uid},
            "spec": spec,
        });
        if let Some(status) = status {
            object["status"] = status;
        }
        serde_json::from_value(object).expect("a claim")
    }

    fn layout() -> Layout {
        Layout::new("/zklock").expect("a valid root")
    }

    fn index() -> ClaimIndex {
        ClaimIndex::new(layout())
    }

    fn uids(refs: &[ClaimRef]) -> Vec<&str> {
        let mut uids: Vec<&str> = refs.iter().map(|r| &*r.uid).collect();
        uids.sort();
        uids
    }

    #[test]
    fn a_lock_lists_exactly_the_claims_in_the_stores_that_name_it() {
        let index = index();
        let held = Some(serde_json::json!({"phase": "Held"}));
        index.put(0, &claim("a", serde_json::json!({"lockName": "l"}), held.clone()));
        index.put(0, &claim("b", serde_json::json!({"locks": [{"lockName": "l"}, {"clusterLockName": "c"}]}), held));
        index.put(0, &claim("c", serde_json::json!({"lockName": "m"}), None));
        let listed = index.listed();
        let path = layout().lock("ns", "l");
        let cluster = layout().cluster_lock("c");
        assert_eq!(uids(&listed.locks[&path]), ["a", "b"]);
        assert_eq!(uids(&listed.locks[&cluster]), ["b"]);
        assert_eq!(uids(&listed.asking), ["c"], "only the claim with no phase asks");
        assert_eq!(index.lock_paths("b"), [Arc::from(path.as_str()), Arc::from(cluster.as_str())]);

        index.remove("a");
        index.retain(0, |_, _, uid| uid != "c");
        let listed = index.listed();
        assert_eq!(uids(&listed.locks[&path]), ["b"]);
        assert!(!listed.locks.contains_key(&layout().lock("ns", "m")), "an emptied lock goes");
        assert!(listed.asking.is_empty(), "a claim that left the store asks for nothing");
        index.remove("b");
        let inner = index.inner.lock();
        assert!(inner.by_lock.is_empty() && inner.namespaces.is_empty() && inner.claims.is_empty());
    }

    #[test]
    fn a_holder_pod_names_its_claims_until_they_go() {
        let index = index();
        let spec = serde_json::json!({"lockName": "l", "holder": {"podName": "p"}});
        index.put(0, &claim("a", spec.clone(), None));
        index.put(0, &claim("b", spec, Some(serde_json::json!({"phase": "Waiting"}))));
        assert_eq!(uids(&index.claims_of_pod("ns", "p")), ["a", "b"]);
        assert!(index.claims_of_pod("other", "p").is_empty());
        // A later copy that asks for nothing any more (granted) is still the same claim.
        index.put(
            0,
            &claim(
                "a",
                serde_json::json!({"lockName": "l", "holder": {"podName": "p"}}),
                Some(serde_json::json!({"phase": "Held"})),
            ),
        );
        assert!(index.listed().asking.is_empty());
        index.remove("a");
        index.remove("b");
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
        assert_eq!(uids(&listed.unreadable), ["u"]);
        assert!(listed.locks.is_empty());
        // Readable again (its status was mended): it names its lock now.
        index.put(0, &claim("u", serde_json::json!({"lockName": "l"}), None));
        let listed = index.listed();
        assert!(listed.unreadable.is_empty());
        assert_eq!(listed.locks.len(), 1);
    }
}
