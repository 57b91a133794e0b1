//! The names the controller speaks in: claim UIDs, a claim's parts (one per lock it asks for) (docs/user-guide.md: several locks). A claim over one lock
//! (`spec.lockName`) is one contender of the lock engine, named by the claim's UID, as it
//! always was. A claim over several locks (`spec.locks`) is a group of contenders, one per
//! lock, named `<uid>-x<index>` (the lock's index in `spec.locks`, which cannot change), made in
//! one multi-op and released in one: the claim holds when every part does.

use std::sync::Arc;

use crate::api::{LockRef, ValidSpec};
use crate::recipe::Mode;
use crate::zk::Layout;

/// A claim UID, one copy shared by the registry and the engine.
pub type Uid = Arc<str>;

/// One lock of a claim, as the operator serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The lock's directory.
    pub lock: String,
    /// The lock's name as status shows it (`NAME`, or `cluster/NAME` for a `ClusterLock`).
    pub name: String,
    pub mode: Mode,
    /// The engine contender that stands for the claim in this lock.
    pub id: Uid,
}

/// The separator of a part's index in its contender id: not a hexadecimal digit, so that it
/// never ends a UID.
const PART: &str = "-x";

/// Each part's fencing token as `status` records it, in the order of `parts`.
pub fn part_tokens(status: &crate::api::LockClaimStatus, parts: &[Part]) -> Vec<Option<i64>> {
    parts
        .iter()
        .map(|part| {
            let token = match status.locks.iter().find(|l| l.lock_name == part.name) {
                Some(lock) => lock.fencing_token.as_deref(),
                None => status.fencing_token.as_deref(),
            };
            token.and_then(|t| t.parse().ok())
        })
        .collect()
}

/// The parts of claim `uid` in `namespace`, in the order of its spec.
pub fn parts_of(layout: &Layout, namespace: &str, uid: &Uid, spec: &ValidSpec) -> Vec<Part> {
    spec.locks
        .iter()
        .enumerate()
        .map(|(i, lock)| Part {
            lock: path_of(layout, namespace, &lock.name, lock.cluster),
            name: lock.label(),
            mode: lock.mode,
            id: if spec.several { format!("{uid}{PART}{i}").into() } else { uid.clone() },
        })
        .collect()
}

/// The claim a contender id stands for: the UID of a one-lock claim is its own id; a part of a
/// claim over several locks carries its index after the UID.
pub fn claim_of(id: &str) -> &str {
    match id.rsplit_once(PART) {
        Some((uid, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => uid,
        _ => id,
    }
}

/// The directory of a claim's lock: one of its namespace, or a `ClusterLock`'s.
pub fn path_of(layout: &Layout, namespace: &str, name: &str, cluster: bool) -> String {
    if cluster {
        layout.cluster_lock(name)
    } else {
        layout.lock(namespace, name)
    }
}

/// The directory of a lock as a spec names it (not validated: a name that is neither is
/// `None`).
pub fn path_of_ref(layout: &Layout, namespace: &str, lock: &LockRef) -> Option<String> {
    match (&lock.lock_name, &lock.cluster_lock_name) {
        (Some(name), _) => Some(layout.lock(namespace, name)),
        (None, Some(name)) => Some(layout.cluster_lock(name)),
        (None, None) => None,
    }
}

/// What a claim's nodes say they stand for (`zkCli get`, and the waitingFor of a claim
/// behind it in another cluster): `<cluster>/<namespace>/<name>`, or `<namespace>/<name>`
/// without a cluster name.
pub fn describe_claim(layout: &Layout, namespace: &str, name: &str) -> String {
    match layout.cluster() {
        Some(cluster) => format!("{cluster}/{namespace}/{name}"),
        None => format!("{namespace}/{name}"),
    }
}

/// The locks of `parts` as the registry keeps them: (path, wanted exclusively).
pub fn locks(parts: &[Part]) -> Vec<(String, bool)> {
    parts.iter().map(|p| (p.lock.clone(), p.mode == Mode::Exclusive)).collect()
}

/// The contender ids of `parts`.
pub fn ids(parts: &[Part]) -> Vec<&str> {
    parts.iter().map(|p| &*p.id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_names_its_claim() {
        let uid = "4bf87072-2c81-4629-9a8b-bffc030bb21d";
        assert_eq!(claim_of(uid), uid, "a one-lock claim is its own contender");
        assert_eq!(claim_of(&format!("{uid}-x0")), uid);
        assert_eq!(claim_of(&format!("{uid}-x15")), uid);
        assert_eq!(claim_of("c-x"), "c-x", "no index, no part");
        assert!(crate::recipe::is_contender_id(&format!("{uid}-x3")), "a part's id makes a node name");
    }
}
