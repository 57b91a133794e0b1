//! Which zklock installation a ZooKeeper root serves: one at a time. Two installations on one
//! root (two releases on the default root, two clusters on one ensemble, two unelected
//! operators side by side during a rollout) would take the leader epoch from each other for
//! ever and re-anchor each other's nodes away. The leader of the installation that serves the
//! root holds an ephemeral node `<root>/installation` naming it; a leader of another one finds
//! it and is refused, with a message naming the root and the installation, for as long as that
//! node lives (its owner's session). A new leader of the same installation takes the node over.

use serde::{Deserialize, Serialize};
use zookeeper_client as zk;

use super::retry::{self, Contention};
use super::{Error, Layout};

/// What the node holds: who serves the root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Installation {
    /// The same for every replica of one installation, different for any other.
    pub installation: String,
    /// The replica that took the node: for people reading the refusal.
    pub holder: String,
}

/// Why the root could not be taken.
#[derive(Debug)]
pub(super) enum Refused {
    /// Another installation's leader holds it.
    InUse(Installation),
    ZooKeeper(zk::Error),
    /// Made and deleted under us again and again (see [`retry::Contention`]).
    Contended,
}

impl From<zk::Error> for Refused {
    fn from(e: zk::Error) -> Self {
        Refused::ZooKeeper(e)
    }
}

/// Takes `<root>/installation` for `mine`, in this session: makes it, or replaces one of the
/// same installation (a previous leader's, whose session may still live), or is refused.
pub(super) async fn take(
    client: &zk::Client,
    config: &super::ZkConfig,
    layout: &Layout,
    mine: &Installation,
) -> Result<(), Refused> {
    let parents_acls = config.parent_acls();
    let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&parents_acls));
    retry::idempotent(|| client.mkdir(layout.root(), &parents)).await?;
    // Serialising two strings cannot fail.
    let data = serde_json::to_vec(mine).unwrap_or_default();
    let theirs = |found: &[u8]| {
        let theirs = serde_json::from_slice::<Installation>(found).unwrap_or_else(|_| Installation {
            installation: String::from_utf8_lossy(found).into_owned(),
            holder: "unknown".into(),
        });
        (theirs.installation != mine.installation).then_some(theirs)
    };
    take_node(client, config, &layout.installation(), &data, theirs).await.map_err(|e| match e {
        Taken::Other(theirs) => Refused::InUse(theirs),
        Taken::ZooKeeper(e) => Refused::ZooKeeper(e),
        Taken::Contended => Refused::Contended,
    })
}

/// What the node naming a cluster on the shared root holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterName {
    pub cluster: String,
    /// The cluster's own root, for people reading a refusal.
    pub root: String,
    /// The id of that root (see [`id`]): what tells this cluster's next leader from another
    /// cluster that took the same name.
    pub root_id: String,
}

/// Takes this cluster's name on the shared root, `<shared>/clusters/<name>`, in this session:
/// refused while a leader of another root holds it (two clusters of one name would take each
/// other's nodes for their own). Answers the other cluster's node when refused.
pub(super) async fn take_cluster_name(
    client: &zk::Client,
    config: &super::ZkConfig,
    path: &str,
    mine: &ClusterName,
) -> Result<Result<(), ClusterName>, Error> {
    let parents_acls = config.parent_acls();
    let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&parents_acls));
    if let Some((parent, _)) = path.rsplit_once('/') {
        retry::idempotent(|| client.mkdir(parent, &parents)).await.map_err(|e| Error::zk("mkdir", parent, e))?;
    }
    // Serialising three strings cannot fail.
    let data = serde_json::to_vec(mine).unwrap_or_default();
    let theirs = |found: &[u8]| {
        let theirs = serde_json::from_slice::<ClusterName>(found).unwrap_or_else(|_| ClusterName {
            cluster: mine.cluster.clone(),
            root: String::from_utf8_lossy(found).into_owned(),
            root_id: String::new(),
        });
        (theirs.root_id != mine.root_id).then_some(theirs)
    };
    match take_node(client, config, path, &data, theirs).await {
        Ok(()) => Ok(Ok(())),
        Err(Taken::Other(theirs)) => Ok(Err(theirs)),
        Err(Taken::ZooKeeper(e)) => Err(Error::zk("cluster name", path, e)),
        Err(Taken::Contended) => Err(Error::Contended { op: "cluster name", path: path.to_string() }),
    }
}

enum Taken<T> {
    Other(T),
    ZooKeeper(zk::Error),
    Contended,
}

/// Takes ephemeral node `path` with `data` in this session: makes it, or replaces one that
/// `other` finds to be the caller's own (a previous leader's, whose session may still live), or
/// answers what `other` makes of somebody else's.
async fn take_node<T>(
    client: &zk::Client,
    config: &super::ZkConfig,
    path: &str,
    data: &[u8],
    other: impl Fn(&[u8]) -> Option<T>,
) -> Result<(), Taken<T>> {
    let options_acls = config.node_acls();
    let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::new(&options_acls));
    let mut contention = Contention::new();
    while contention.attempt().await {
        match retry::timed(client.create(path, data, &options)).await {
            Ok(_) => return Ok(()),
            Err(zk::Error::NodeExists) => {}
            // The answer was lost: whether it was made shows in the node.
            Err(e) if retry::is_unknown_outcome(&e) => {}
            Err(e) => return Err(Taken::ZooKeeper(e)),
        }
        let (found, stat) = match retry::idempotent(|| client.get_data(path)).await {
            Ok(found) => found,
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(Taken::ZooKeeper(e)),
        };
        if stat.ephemeral_owner == client.session_id().0 {
            return Ok(());
        }
        if let Some(theirs) = other(&found) {
            return Err(Taken::Other(theirs));
        }
        // Ours, from an earlier leader: replaced in one step, guarded by the version read.
        let mut multi = client.new_multi_writer();
        multi.add_delete(path, Some(stat.version)).map_err(Taken::ZooKeeper)?;
        multi.add_create(path, data, &options).map_err(Taken::ZooKeeper)?;
        match retry::timed(async { multi.commit().await.map_err(zk::Error::from) }).await {
            Ok(_) => return Ok(()),
            // Changed or gone meanwhile, or the answer lost: look again.
            Err(zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NodeExists) => {}
            Err(e) if retry::is_unknown_outcome(&e) => {}
            Err(e) => return Err(Taken::ZooKeeper(e)),
        }
    }
    Err(Taken::Contended)
}

/// The root's own id, `<root>/id`: made once, with a random UUID, by the first installation
/// that serves the root, and read by every one after (its replicas, its next terms, the next
/// process of a rollout, a reinstallation on the same root). The nodes zklock makes carry it:
/// an operator of another root (another cluster sharing a lock) has another.
pub(super) async fn id(client: &zk::Client, config: &super::ZkConfig, layout: &Layout) -> Result<String, Error> {
    let path = layout.id();
    let options_acls = config.node_acls();
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&options_acls));
    let fresh = uuid::Uuid::new_v4().to_string();
    let mut contention = Contention::new();
    while contention.attempt().await {
        match retry::idempotent(|| client.get_data(&path)).await {
            Ok((data, _)) => return Ok(String::from_utf8_lossy(&data).trim().to_string()),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(Error::zk("get", &path, e)),
        }
        match retry::timed(client.create(&path, fresh.as_bytes(), &options)).await {
            Ok(_) => return Ok(fresh),
            // Made meanwhile (by another, or by this very call whose answer was lost): read it.
            Err(zk::Error::NodeExists) => {}
            Err(e) if retry::is_unknown_outcome(&e) => {}
            Err(e) => return Err(Error::zk("create", &path, e)),
        }
    }
    Err(Error::Contended { op: "create", path })
}

/// Gives the node up, if this session holds it (a graceful stop: the next process of the
/// installation need not wait for this session to end).
pub(super) async fn leave(client: &zk::Client, layout: &Layout) {
    let path = layout.installation();
    if let Ok(Some(stat)) = retry::idempotent(|| client.check_stat(&path)).await {
        if stat.ephemeral_owner == client.session_id().0 {
            let _ = retry::timed(client.delete(&path, Some(stat.version))).await;
        }
    }
}
