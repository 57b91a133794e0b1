//! The ZooKeeper operations the engine's rounds and re-anchoring both make: each retried
//! through connection loss, each write guarded by the leader epoch.

use zookeeper_client as zk;

use super::contender::ContenderSpec;
use super::core::Core;
use super::data::{NodeData, CLEAN_DIRECTORY};
use super::retry::{self, Backoff};
use super::stats::Stats;
use super::Error;
use crate::recipe;

/// The last component of a node's path.
pub(super) fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

pub(super) fn is_lock_path(path: &str) -> bool {
    path.len() > 1 && path.starts_with('/') && !path.ends_with('/') && !path.split('/').skip(1).any(str::is_empty)
}

/// The directory whose recursive watch covers lock directory `lock`.
pub(super) fn parent_of(lock: &str) -> &str {
    match lock.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((parent, _)) => parent,
    }
}

/// The children of `path`, and its pzxid; none (and 0) when it does not exist.
pub(super) async fn children_or_empty(client: &zk::Client, path: &str) -> Result<Listing, zk::Error> {
    match retry::idempotent(|| client.get_children(path)).await {
        Ok((children, stat)) => {
            Ok(Listing { children, pzxid: stat.pzxid, data_length: stat.data_length, data_version: stat.version })
        }
        Err(zk::Error::NoNode) => Ok(Listing { children: vec![], pzxid: 0, data_length: 0, data_version: -1 }),
        Err(e) => Err(e),
    }
}

/// A directory's children, and what its stat says besides.
pub(super) struct Listing {
    pub children: Vec<String>,
    /// The zxid of the last change to the children.
    pub pzxid: i64,
    /// Length and version of the directory's own data (its marker, see [`super::data::DirMarker`]).
    pub data_length: i32,
    pub data_version: i32,
}

/// [`children_or_empty`] without the stat, with the engine's error.
pub(super) async fn list(client: &zk::Client, path: &str) -> Result<Vec<String>, Error> {
    children_or_empty(client, path).await.map(|listing| listing.children).map_err(|e| Error::zk("list", path, e))
}

/// Makes lock directory `lock` (and its parents), with the data that marks it as zklock's (and
/// refuses kazoo's semaphore, see [`super::data::DirMarker`]). Lock directories stay open to everybody
/// for create, so that Curator clients can contend.
///
/// The directory first, its parents only when it has none: they are there but for a namespace's
/// first lock, and a create that finds its node there is a write request ZooKeeper's leader
/// serves for nothing.
pub(super) async fn ensure_dir(client: &zk::Client, config: &super::ZkConfig, lock: &str) -> Result<(), Error> {
    let options_acls = config.directory_acls();
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&options_acls));
    let create = || async {
        match retry::idempotent(|| client.create(lock, CLEAN_DIRECTORY, &options)).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(e),
        }
    };
    match create().await {
        Err(zk::Error::NoNode) if parent_of(lock) != "/" => {
            ensure_parents(client, config, lock).await?;
            create().await.map_err(|e| Error::zk("create", lock, e))
        }
        made => made.map_err(|e| Error::zk("create", lock, e)),
    }
}

/// Makes the directories above lock directory `lock` (a namespace's, under the root).
async fn ensure_parents(client: &zk::Client, config: &super::ZkConfig, lock: &str) -> Result<(), Error> {
    let parent = parent_of(lock);
    if parent == "/" {
        return Ok(());
    }
    let parents_acls = config.parent_acls();
    let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&parents_acls));
    retry::idempotent(|| client.mkdir(parent, &parents)).await.map_err(|e| Error::zk("mkdir", parent, e))
}

/// Creates the contenders' nodes in one multi-op (and their directories if needed); after a
/// lost answer, looks for the nodes by contender id before trying again, so that no contender
/// ever gets two nodes. One multi-op: either every node is made or none, and the nodes of two
/// groups stand in the same order in every directory they share. Answers the nodes' names, in
/// the order given, and the zxid that made them (one transaction: one zxid for all).
pub(super) async fn create_adopting(
    client: &zk::Client,
    core: &Core,
    specs: &[ContenderSpec],
) -> Result<(Vec<String>, i64), Error> {
    let options_acls = core.config.node_acls();
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::new(&options_acls));
    let owner = core.owner();
    let made = specs
        .iter()
        .map(|spec| {
            let path = format!("{}/{}", spec.lock, recipe::node_prefix(&spec.id, spec.mode));
            let data = NodeData::new(&spec.id, spec.mode, &spec.description).with_root(owner.clone());
            (path, data.to_bytes())
        })
        .collect::<Vec<_>>();
    let what = || made.first().map_or_else(String::new, |(path, _)| path.clone());
    // The directories, made in the same multi-op once one was found missing (a lock nobody
    // used lately): one request less than making them first, and as many as before if one
    // is there after all (refused, they are made one by one as before).
    let mut dirs: Vec<&str> = specs.iter().map(|spec| spec.lock.as_str()).collect();
    dirs.sort_unstable();
    dirs.dedup();
    let dir_acls = core.config.directory_acls();
    let dir_options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&dir_acls));
    let mut with_dirs = false;
    let mut backoff = Backoff::new();
    loop {
        let mut multi = core.fence.writer(client).map_err(|e| Error::zk("create", &what(), e))?;
        for dir in dirs.iter().filter(|_| with_dirs) {
            multi.add_create(dir, CLEAN_DIRECTORY, &dir_options).map_err(|e| Error::zk("create", dir, e))?;
        }
        for (path, body) in &made {
            multi.add_create(path, body, &options).map_err(|e| Error::zk("create", path, e))?;
        }
        match core.fence.commit(&mut multi).await {
            Ok(results) => {
                let made: Vec<(String, i64)> = results
                    .into_iter()
                    .skip(if with_dirs { dirs.len() } else { 0 })
                    .filter_map(|r| match r {
                        zk::MultiWriteResult::Create { path, stat } => Some((path, stat.czxid)),
                        _ => None,
                    })
                    .collect();
                if made.len() != specs.len() {
                    return Err(Error::zk(
                        "create",
                        &what(),
                        zk::Error::UnexpectedError("a create answered no path".into()),
                    ));
                }
                for _ in &made {
                    Stats::bump(&core.stats.creates);
                }
                let zxid = match made.first() {
                    Some((_, czxid)) if *czxid > 0 => *czxid,
                    // A multi's stat can come back empty (ZOOKEEPER-4026): the node has it.
                    Some((path, _)) => czxid_of(client, path).await?,
                    None => 0,
                };
                return Ok((made.into_iter().map(|(path, _)| node_name(&path).to_string()).collect(), zxid));
            }
            // No directory: with them, next time. No parent either (a namespace's first lock):
            // made first.
            Err(zk::Error::NoNode) if !with_dirs => with_dirs = true,
            Err(zk::Error::NoNode) => {
                for dir in &dirs {
                    ensure_parents(client, &core.config, dir).await?;
                }
            }
            // One of them is there (made meanwhile, or a group's other lock): one by one.
            Err(zk::Error::NodeExists) if with_dirs => {
                with_dirs = false;
                for spec in specs {
                    ensure_dir(client, &core.config, &spec.lock).await?;
                }
            }
            Err(e) if retry::is_unknown_outcome(&e) => {
                Stats::bump(&core.stats.create_unknown_outcomes);
                // All or none: the multi-op applied, or it did not.
                let mut found = Vec::with_capacity(specs.len());
                let mut zxid = 0;
                for spec in specs {
                    let children = list(client, &spec.lock).await?;
                    match own_node(client, &spec.lock, &children, &spec.id).await? {
                        Some((name, czxid)) => {
                            found.push(name);
                            zxid = czxid;
                        }
                        None => break,
                    }
                }
                if found.len() == specs.len() {
                    Stats::bump(&core.stats.nodes_adopted);
                    return Ok((found, zxid));
                }
                backoff.wait().await;
            }
            Err(e) => return Err(Error::zk("create", &what(), e)),
        }
    }
}

/// The node of contender `id` among `children` of `lock` that this session made, if any, with
/// its czxid.
pub(super) async fn own_node(
    client: &zk::Client,
    lock: &str,
    children: &[String],
    id: &str,
) -> Result<Option<(String, i64)>, Error> {
    let Some(name) = recipe::find_node(children, id) else { return Ok(None) };
    let path = format!("{lock}/{name}");
    let stat = retry::idempotent(|| client.check_stat(&path)).await.map_err(|e| Error::zk("stat", &path, e))?;
    Ok(stat.filter(|s| s.ephemeral_owner == client.session_id().0).map(|s| (name.to_string(), s.czxid)))
}

/// The zxid that made node `path`.
async fn czxid_of(client: &zk::Client, path: &str) -> Result<i64, Error> {
    let stat = retry::idempotent(|| client.check_stat(path)).await.map_err(|e| Error::zk("stat", path, e))?;
    stat.map(|s| s.czxid).ok_or_else(|| Error::zk("stat", path, zk::Error::NoNode))
}

/// Deletes `path` until ZooKeeper confirms it is gone. The end of the session confirms it too:
/// ephemeral nodes go with their session.
pub(super) async fn delete_until_confirmed(client: &zk::Client, core: &Core, path: &str) -> Result<(), zk::Error> {
    match retry::idempotent(|| core.fence.delete_version(client, path, None)).await {
        Ok(()) => Stats::bump(&core.stats.deletes),
        Err(e) if e != zk::Error::NoNode && !retry::is_session_end(&e) => return Err(e),
        Err(_) => {}
    }
    Ok(())
}

/// Deletes every one of `paths` in one multi-op (a group lets go of all its locks at once),
/// until ZooKeeper confirms they are gone; one that is gone already (another client deleted
/// it) makes the multi fail as a whole, and the others are then deleted one by one.
pub(super) async fn delete_all_until_confirmed(
    client: &zk::Client,
    core: &Core,
    paths: &[String],
) -> Result<(), zk::Error> {
    if let [path] = paths {
        return delete_until_confirmed(client, core, path).await;
    }
    let together = retry::idempotent(|| async {
        let mut multi = core.fence.writer(client)?;
        for path in paths {
            multi.add_delete(path, None)?;
        }
        core.fence.commit(&mut multi).await
    })
    .await;
    match together {
        Ok(_) => {
            for _ in paths {
                Stats::bump(&core.stats.deletes);
            }
            Ok(())
        }
        Err(e) if retry::is_session_end(&e) => Ok(()),
        // One is gone (or a retried multi applied before its answer was lost): one by one.
        Err(zk::Error::NoNode) => {
            for path in paths {
                delete_until_confirmed(client, core, path).await?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Deletes each of `paths` in the background (nodes nobody must wait on).
pub(super) fn delete_in_background(client: &zk::Client, core: &std::sync::Arc<Core>, paths: Vec<String>) {
    if paths.is_empty() {
        return;
    }
    let (client, core) = (client.clone(), core.clone());
    tokio::spawn(async move {
        for path in paths {
            let _ = delete_until_confirmed(&client, &core, &path).await;
        }
    });
}
