//! Claims for gated pods are made in the pods' creation order, per lock, although pods are
//! reconciled concurrently: the claims' own admission then queues them in that order. The gate
//! is the claims' (`admission::Gates`): a pod waits there from the moment the watch delivers it
//! until its claim is made (or it needs none), and only the first one may make its claim.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use kube::runtime::reflector::ObjectRef;

use super::admission::{Gates, Overtaken, Place, Turn};
use super::base::kept_pod::KeptPod;
use super::base::Uid;

#[derive(Default)]
pub struct Arrivals {
    gates: Gates,
    /// Pods seen so far: the second part of a place (creation times have whole seconds only).
    seen: u64,
    pods: HashMap<Uid, Arrival>,
}

struct Arrival {
    /// The locks of the claim it waits to make (one, or several taken together).
    locks: Vec<String>,
    place: Place,
    pod: ObjectRef<KeptPod>,
}

impl Arrivals {
    /// The pod arrives at the gates of its `locks`, unless it is there already.
    pub fn arrive(&mut self, locks: Vec<String>, pod: &KeptPod) {
        if self.pods.contains_key(pod.uid()) {
            return;
        }
        self.seen += 1;
        let created = pod.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
        let place = (created, self.seen);
        let uid: Uid = pod.uid().into();
        for lock in &locks {
            self.gates.arrive(lock, place, &uid, Instant::now());
        }
        self.pods.insert(uid, Arrival { locks, place, pod: ObjectRef::from_obj(pod) });
    }

    /// Whether the pod is first at the gate of every one of its `locks` (it arrives there if it
    /// was not), and the pods ahead of it that stopped holding others back meanwhile. Its
    /// reconcile asks this first (every other step leaves the gate), so its patience there runs
    /// from its first asking as the first.
    pub fn may_create(&mut self, locks: Vec<String>, pod: &KeptPod) -> (Turn, Overtaken) {
        self.arrive(locks, pod);
        let Some(arrival) = self.pods.get(pod.uid()) else { return (Turn::First, Overtaken::default()) };
        let uid: Uid = pod.uid().into();
        let (place, locks) = (arrival.place, arrival.locks.clone());
        let turn = self.gates.may_enqueue(&locks, place, &uid, Instant::now());
        (turn, self.gates.take_overtaken())
    }

    /// After a listing: the pods it did not list leave their gates (a watch sends no deletion
    /// for a pod deleted while it was down, and one left at a gate would hold back every pod
    /// behind it). Answers the pods first at a gate now.
    pub fn keep_listed(&mut self, listed: &HashSet<Uid>) -> Vec<ObjectRef<KeptPod>> {
        let gone: Vec<Uid> = self.pods.keys().filter(|uid| !listed.contains(*uid)).cloned().collect();
        let mut next: Vec<ObjectRef<KeptPod>> = gone.iter().flat_map(|uid| self.leave(uid)).collect();
        next.retain(|r| self.pods.values().any(|a| a.pod == *r));
        next.dedup();
        next
    }

    /// The pod leaves its gates; answers the pods first there now.
    pub fn leave(&mut self, uid: &str) -> Vec<ObjectRef<KeptPod>> {
        let Some(arrival) = self.pods.remove(uid) else { return vec![] };
        let next = arrival.locks.iter().filter_map(|lock| self.gates.leave(lock, uid));
        next.filter_map(|next| self.pods.get(&next).map(|a| a.pod.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, second: i64) -> KeptPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(second).unwrap().to_string()},
        }))
        .unwrap()
    }

    #[test]
    fn pods_make_their_claims_in_creation_order_per_lock() {
        let mut arrivals = Arrivals::default();
        let (a, b, c) = (pod("a", 100), pod("b", 100), pod("c", 101));
        arrivals.arrive(vec!["/l".into()], &a);
        arrivals.arrive(vec!["/l".into()], &b);
        assert_ne!(Turn::First, arrivals.may_create(vec!["/l".into()], &c).0, "c was created after a and b");
        assert_ne!(Turn::First, arrivals.may_create(vec!["/l".into()], &b).0, "same second as a, seen after it");
        assert_eq!(Turn::First, arrivals.may_create(vec!["/other".into()], &pod("d", 200)).0, "gates are per lock");
        assert_eq!(Turn::First, arrivals.may_create(vec!["/l".into()], &a).0);
        assert_eq!(arrivals.leave("uid-a").into_iter().map(|r| r.name).collect::<Vec<_>>(), ["b"]);
        assert_eq!(Turn::First, arrivals.may_create(vec!["/l".into()], &b).0);
        assert_eq!(arrivals.leave("uid-b").into_iter().map(|r| r.name).collect::<Vec<_>>(), ["c"]);
        assert!(arrivals.leave("uid-b").is_empty(), "left already");
    }

    #[test]
    fn a_pod_missing_from_a_listing_leaves_its_gate() {
        let mut arrivals = Arrivals::default();
        let (a, b, c) = (pod("a", 100), pod("b", 101), pod("c", 102));
        for p in [&a, &b, &c] {
            arrivals.arrive(vec!["/l".into()], p);
        }
        // a was deleted while the watch was down: only b and c are listed again.
        let listed: HashSet<Uid> = ["uid-b".into(), "uid-c".into()].into_iter().collect();
        let next: Vec<String> = arrivals.keep_listed(&listed).into_iter().map(|r| r.name).collect();
        assert_eq!(next, ["b"]);
        assert_eq!(Turn::First, arrivals.may_create(vec!["/l".into()], &b).0, "b is no longer held back by a");
        assert_ne!(Turn::First, arrivals.may_create(vec!["/l".into()], &c).0);
        assert!(arrivals.keep_listed(&listed).is_empty(), "nobody left");
    }
}
