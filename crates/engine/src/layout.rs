//! Where zklock keeps what in ZooKeeper, in one place. Under the root (`/zklock` by default):
//!
//! - `installation`: the ephemeral node naming the installation that serves the root (see
//!   [`super::root`]);
//! - `id`: the root's own id, made once by the first installation that served it and read by
//!   every one that serves it after (see [`super::root::id`]); zklock's nodes carry it;
//! - `leader-epoch`: the leader epoch, its version (see [`super::fence`]);
//! - `token-base`: what every zxid zklock hands out is raised by, so that tokens never go back
//!   when the ensemble's data are made anew (see [`super::token_base`]); in the shared root
//!   instead when there is one, since ClusterLock tokens are compared across clusters;
//! - `locks/<namespace>/<lock>`: one directory per lock, its contenders' nodes in it, its data
//!   the marker of foreign use (see [`super::data::DirMarker`]);
//! - `cluster-locks/<lock>`: the directories of `ClusterLock`s, when no shared root is named.
//!
//! A shared root (`--zk-cluster-root`), named alike by the operators of every cluster that
//! shares `ClusterLock`s, holds:
//! - `locks/<lock>`: the directories of the `ClusterLock`s, where every cluster queues;
//! - `clusters/<cluster name>`: an ephemeral node per cluster, held by its leader, naming the
//!   cluster's own root (see [`super::root`]): one name, one cluster;
//! - `permits/<lock>/<cluster>.<permits>.<session>`: the permits each cluster's `ClusterLock`
//!   declares, an ephemeral node of its leader's session (see [`super::permits`]).
//!
//! Which nodes in a lock directory are zklock's is judged by their names (see
//! [`crate::recipe::parse_child`]); whether this root's zklock made one, by its data (see
//! [`super::data::NodeData::root`]).

/// The paths of one root. Made only from a root that is a valid absolute ZooKeeper path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    root: String,
    /// The shared root and this cluster's name on it, if `ClusterLock`s are shared with other
    /// clusters.
    shared: Option<Shared>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Shared {
    root: String,
    cluster: String,
}

const INSTALLATION: &str = "installation";
const ID: &str = "id";
const EPOCH: &str = "leader-epoch";
const LOCKS: &str = "locks";
const CLUSTER_LOCKS: &str = "cluster-locks";
const CLUSTERS: &str = "clusters";
const PERMITS: &str = "permits";
const TOKEN_BASE: &str = "token-base";

fn check_root(root: &str) -> Result<(), String> {
    let segments_ok = root.split('/').skip(1).all(|s| !s.is_empty() && s != "." && s != "..");
    if root.starts_with('/') && root.len() > 1 && segments_ok {
        Ok(())
    } else {
        Err(format!("{root:?} is not an absolute ZooKeeper path like /zklock"))
    }
}

impl Layout {
    /// The layout under `root`, an absolute path such as `/zklock` (not `/`, no trailing `/`).
    pub fn new(root: &str) -> Result<Layout, String> {
        check_root(root)?;
        Ok(Layout { root: root.to_string(), shared: None })
    }

    /// The same, with `ClusterLock`s under shared root `shared`, where this cluster is named
    /// `cluster` (a DNS label). Neither root may hold the other: each cluster's own root holds
    /// its leader epoch, which must never be another cluster's.
    pub fn with_shared_root(self, shared: &str, cluster: &str) -> Result<Layout, String> {
        check_root(shared)?;
        let within = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        if within(shared, &self.root) || within(&self.root, shared) {
            return Err(format!(
                "the shared root {shared:?} and the cluster's own root {:?} must not hold one another: give each \
                 cluster a root of its own (--zk-root) beside the shared one",
                self.root
            ));
        }
        let label = cluster.len() <= 63
            && cluster.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && cluster.starts_with(|c: char| c.is_ascii_alphanumeric())
            && cluster.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !label {
            return Err(format!(
                "cluster name {cluster:?} is not a DNS label: use 1-63 lower-case letters, digits and '-' (e.g. eu-1)"
            ));
        }
        Ok(Layout { shared: Some(Shared { root: shared.to_string(), cluster: cluster.to_string() }), ..self })
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    /// The shared root, if `ClusterLock`s are shared with other clusters.
    pub fn shared_root(&self) -> Option<&str> {
        self.shared.as_ref().map(|s| s.root.as_str())
    }

    /// This cluster's name on the shared root.
    pub fn cluster(&self) -> Option<&str> {
        self.shared.as_ref().map(|s| s.cluster.as_str())
    }

    /// The parent of the `ClusterLock`s' directories: in the shared root if there is one, else
    /// in the cluster's own root (a lock shared by the cluster's namespaces only).
    pub fn cluster_locks(&self) -> String {
        match &self.shared {
            Some(shared) => format!("{}/{LOCKS}", shared.root),
            None => format!("{}/{CLUSTER_LOCKS}", self.root),
        }
    }

    /// The directory of `ClusterLock` `name`.
    pub fn cluster_lock(&self, name: &str) -> String {
        format!("{}/{name}", self.cluster_locks())
    }

    /// Whether `path` is the directory of a `ClusterLock` that other clusters may queue in: there
    /// a node is kept in place across a new session, or its holder is lost (see
    /// [`super::anchor`]).
    pub fn is_shared_lock(&self, path: &str) -> bool {
        self.shared.is_some()
            && path
                .strip_prefix(&self.cluster_locks())
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|name| !name.is_empty() && !name.contains('/'))
    }

    /// Where the clusters sharing the `ClusterLock` in directory `lock_path` declare its permits,
    /// if it is one that other clusters may queue in.
    pub fn permits_of(&self, lock_path: &str) -> Option<String> {
        let shared = self.shared.as_ref().filter(|_| self.is_shared_lock(lock_path))?;
        let name = lock_path.rsplit('/').next()?;
        Some(format!("{}/{PERMITS}/{name}", shared.root))
    }

    /// The node naming this cluster on the shared root, if there is one.
    pub fn cluster_node(&self) -> Option<String> {
        self.shared.as_ref().map(|s| format!("{}/{CLUSTERS}/{}", s.root, s.cluster))
    }

    /// The ephemeral node naming the installation that serves the root.
    pub fn installation(&self) -> String {
        format!("{}/{INSTALLATION}", self.root)
    }

    /// The persistent node that holds the root's id.
    pub fn id(&self) -> String {
        format!("{}/{ID}", self.root)
    }

    /// The node whose version is the leader epoch.
    pub fn epoch(&self) -> String {
        format!("{}/{EPOCH}", self.root)
    }

    /// The node holding the token base (see [`super::token_base`]): one per ensemble as far as
    /// tokens are compared, so in the shared root when `ClusterLock`s are shared.
    pub fn token_base(&self) -> String {
        format!("{}/{TOKEN_BASE}", self.shared_root().unwrap_or(&self.root))
    }

    /// The parent of every namespace's lock directories.
    pub fn locks(&self) -> String {
        format!("{}/{LOCKS}", self.root)
    }

    /// The directory of lock `name` of `namespace`.
    pub fn lock(&self, namespace: &str, name: &str) -> String {
        format!("{}/{LOCKS}/{namespace}/{name}", self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_comes_from_the_root() {
        let layout = Layout::new("/zklock").unwrap();
        assert_eq!(layout.installation(), "/zklock/installation");
        assert_eq!(layout.id(), "/zklock/id");
        assert_eq!(layout.epoch(), "/zklock/leader-epoch");
        assert_eq!(layout.lock("shop", "db"), "/zklock/locks/shop/db");
        assert_eq!(layout.token_base(), "/zklock/token-base");
        assert_eq!(Layout::new("/a/b").unwrap().lock("n", "l"), "/a/b/locks/n/l");
        for bad in ["/", "zklock", "/zklock/", "/a//b", "", "/a/../b"] {
            assert!(Layout::new(bad).is_err_and(|e| e.contains("like /zklock")), "{bad:?}");
        }
    }

    #[test]
    fn cluster_locks_live_in_the_shared_root_when_there_is_one() {
        let alone = Layout::new("/zklock").unwrap();
        assert_eq!(alone.cluster_lock("pay"), "/zklock/cluster-locks/pay");
        assert!(!alone.is_shared_lock("/zklock/cluster-locks/pay"), "no other cluster queues there");
        assert_eq!(alone.cluster_node(), None);

        let eu = Layout::new("/zklock-eu").unwrap().with_shared_root("/zklock-shared", "eu-1").unwrap();
        assert_eq!(eu.cluster_lock("pay"), "/zklock-shared/locks/pay");
        assert_eq!(eu.cluster_node().as_deref(), Some("/zklock-shared/clusters/eu-1"));
        assert_eq!(eu.token_base(), "/zklock-shared/token-base", "one base wherever tokens are compared");
        assert_eq!((eu.cluster(), eu.shared_root()), (Some("eu-1"), Some("/zklock-shared")));
        assert!(eu.is_shared_lock("/zklock-shared/locks/pay"));
        assert_eq!(eu.permits_of("/zklock-shared/locks/pay").as_deref(), Some("/zklock-shared/permits/pay"));
        assert_eq!(eu.permits_of("/zklock-eu/locks/n/pay"), None, "a namespaced lock has its own Lock object");
        assert_eq!(alone.permits_of("/zklock/cluster-locks/pay"), None, "one cluster: nothing to agree on");
        for not in
            ["/zklock-shared/locks", "/zklock-shared/locks/", "/zklock-shared/locks/a/b", "/zklock-eu/locks/n/pay"]
        {
            assert!(!eu.is_shared_lock(not), "{not}");
        }
        assert_eq!(eu.lock("n", "l"), "/zklock-eu/locks/n/l", "namespaced locks stay in the cluster's own root");

        let own = || Layout::new("/zklock").unwrap();
        for (shared, cluster, needle) in [
            ("/zklock", "a", "must not hold one another"),
            ("/zklock/shared", "a", "must not hold one another"),
            ("/", "a", "like /zklock"),
            ("/shared", "EU", "not a DNS label"),
            ("/shared", "", "not a DNS label"),
            ("/shared", "a/b", "not a DNS label"),
        ] {
            let err = own().with_shared_root(shared, cluster).unwrap_err();
            assert!(err.contains(needle), "{shared} {cluster}: {err}");
        }
        assert!(Layout::new("/a/b").unwrap().with_shared_root("/a", "x").is_err(), "the shared root holds ours");
    }
}
