//! Where zklock keeps what in ZooKeeper, in one place. Under the root (`/zklock` by default):
//!
//! - `installation`: the ephemeral node naming the installation that serves the root (see
//!   [`super::root`]);
//! - `id`: the root's own id, made once by the first installation that served it and read by
//!   every one that serves it after (see [`super::root::id`]); zklock's nodes carry it;
//! - `leader-epoch`: the leader epoch, its version (see [`super::fence`]);
//! - `locks/<namespace>/<lock>`: one directory per lock, its contenders' nodes in it, its data
//!   the marker of foreign use (see [`super::data::DirMarker`]).
//!
//! Which nodes in a lock directory are zklock's is judged by their names (see
//! [`crate::recipe::parse_child`]); whether this root's zklock made one, by its data (see
//! [`super::data::NodeData::root`]).

/// The paths of one root. Made only from a root that is a valid absolute ZooKeeper path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    root: String,
}

const INSTALLATION: &str = "installation";
const ID: &str = "id";
const EPOCH: &str = "leader-epoch";
const LOCKS: &str = "locks";

impl Layout {
    /// The layout under `root`, an absolute path such as `/zklock` (not `/`, no trailing `/`).
    pub fn new(root: &str) -> Result<Layout, String> {
        let segments_ok = root.split('/').skip(1).all(|s| !s.is_empty() && s != "." && s != "..");
        if root.starts_with('/') && root.len() > 1 && segments_ok {
            Ok(Layout { root: root.to_string() })
        } else {
            Err(format!("{root:?} is not an absolute ZooKeeper path like /zklock"))
        }
    }

    pub fn root(&self) -> &str {
        &self.root
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
        assert_eq!(Layout::new("/a/b").unwrap().lock("n", "l"), "/a/b/locks/n/l");
        for bad in ["/", "zklock", "/zklock/", "/a//b", "", "/a/../b"] {
            assert!(Layout::new(bad).is_err_and(|e| e.contains("like /zklock")), "{bad:?}");
        }
    }
}
