//! The leader epoch (docs/design.md: fencing): fences a deposed leader's ZooKeeper writes.
//!
//! Each new leader bumps the data version of `<zk-root>/leader-epoch` before it re-anchors and
//! keeps the version it got. From then on every create, delete and data write the engine makes
//! is a multi-op whose first operation checks that version. A deposed leader whose process still
//! runs (its Lease renewal hung, it was stopped longer than its lease) then changes no lock: the
//! next leader's bump makes each of its writes fail as a whole, and the engine reports itself
//! fenced. Reads stay unguarded: they change nothing.
//!
//! Without an epoch (tests, benchmarks, a single replica without leader election) the same
//! writes are sent without the check.

use std::sync::OnceLock;

use tokio::sync::watch;
use zookeeper_client as zk;

use super::retry;

/// The epoch this engine writes under.
#[derive(Debug)]
pub(super) struct Epoch {
    pub path: String,
    pub version: i32,
    /// The zxid of the bump: unique to this leader's term and larger than every earlier term's,
    /// also if the epoch node was ever deleted and made again (its version starts over then).
    pub token: i64,
}

/// The engine's epoch, once it took one, and whether a write found it superseded.
#[derive(Default)]
pub(super) struct Fence {
    epoch: OnceLock<Epoch>,
    /// Turns true, for good, when a write finds the epoch superseded.
    fenced: watch::Sender<bool>,
}

/// What a guarded write reports when the epoch moved on: the client's own "runtime condition
/// mismatch", which no plain ZooKeeper operation returns (the engine maps it to `Fenced`).
pub(super) const FENCED: zk::Error = zk::Error::RuntimeInconsistent;

impl Fence {
    /// Records the epoch taken; false if one was taken before (an engine is one leader's term).
    pub fn set(&self, epoch: Epoch) -> bool {
        self.epoch.set(epoch).is_ok()
    }

    pub fn epoch(&self) -> Option<&Epoch> {
        self.epoch.get()
    }

    /// Records that another leader's epoch superseded ours (found by a read).
    pub fn superseded(&self) {
        self.fenced.send_replace(true);
    }

    /// Follows whether the engine was fenced.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.fenced.subscribe()
    }

    /// A multi-op that starts with the epoch check, if there is an epoch. Refused at once once
    /// a write was fenced: the epoch never comes back.
    pub fn writer<'a>(&self, client: &'a zk::Client) -> Result<zk::MultiWriter<'a>, zk::Error> {
        if *self.fenced.borrow() {
            return Err(FENCED);
        }
        let mut multi = client.new_multi_writer();
        if let Some(epoch) = self.epoch() {
            multi.add_check_version(&epoch.path, epoch.version)?;
        }
        Ok(multi)
    }

    /// Sends a multi made by [`Fence::writer`]; returns the results of the caller's own
    /// operations. A failed epoch check reads as [`FENCED`] (and is remembered); any other
    /// failure is the failing operation's own error.
    pub async fn commit(&self, multi: &mut zk::MultiWriter<'_>) -> Result<Vec<zk::MultiWriteResult>, zk::Error> {
        let guarded = self.epoch().is_some();
        let result = super::retry::timed(async { multi.commit().await.map_err(|e| self.error(e, guarded)) }).await;
        result.map(|mut results| {
            if guarded && !results.is_empty() {
                results.remove(0);
            }
            results
        })
    }

    fn error(&self, e: zk::MultiWriteError, guarded: bool) -> zk::Error {
        match e {
            zk::MultiWriteError::OperationFailed { index: 0, source: zk::Error::BadVersion | zk::Error::NoNode }
                if guarded =>
            {
                self.fenced.send_replace(true);
                FENCED
            }
            other => other.into(),
        }
    }

    /// Deletes `path` if its data version is still `version` (any, with `None`).
    pub async fn delete_version(&self, client: &zk::Client, path: &str, version: Option<i32>) -> Result<(), zk::Error> {
        let mut multi = self.writer(client)?;
        multi.add_delete(path, version)?;
        self.commit(&mut multi).await.map(drop)
    }

    /// Rewrites the data of `path` from what it holds: `change` answers the new bytes (`None`:
    /// nothing to write), and the write is guarded by the version read (and the epoch). Another
    /// writer's write in between (a revocation request, our own retried write that landed) is
    /// read and changed again, at most [`retry::CONTENDED_ATTEMPTS`] times: then the answer is
    /// `BadVersion`. Answers the stat after the write, or `None` where nothing was written.
    pub async fn rewrite(
        &self,
        client: &zk::Client,
        path: &str,
        mut change: impl FnMut(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Option<zk::Stat>, zk::Error> {
        let mut contention = retry::Contention::new();
        while contention.attempt().await {
            let (body, stat) = retry::idempotent(|| client.get_data(path)).await?;
            let Some(wanted) = change(&body) else { return Ok(None) };
            match retry::idempotent(|| self.set_data_stat(client, path, &wanted, stat.version)).await {
                Ok(stat) => return Ok(Some(stat)),
                Err(zk::Error::BadVersion) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(zk::Error::BadVersion)
    }

    /// Writes the data of `path` back unchanged ([`Fence::rewrite`]: a revocation request
    /// written meanwhile is read and kept), for the write's zxid: a fencing token above every
    /// one given before.
    pub async fn touch(&self, client: &zk::Client, path: &str) -> Result<zk::Stat, zk::Error> {
        match self.rewrite(client, path, |body| Some(body.to_vec())).await? {
            Some(stat) => Ok(stat),
            // `rewrite` answers `None` only where the change does, and this one never does.
            None => Err(zk::Error::UnexpectedError(format!("{path} was not written back"))),
        }
    }

    /// [`Fence::set_data`], answering the node's stat after the write.
    pub async fn set_data_stat(
        &self,
        client: &zk::Client,
        path: &str,
        data: &[u8],
        version: i32,
    ) -> Result<zk::Stat, zk::Error> {
        let mut multi = self.writer(client)?;
        multi.add_set_data(path, data, Some(version))?;
        match self.commit(&mut multi).await?.pop() {
            Some(zk::MultiWriteResult::SetData { stat }) => Ok(stat),
            other => Err(zk::Error::UnexpectedError(format!("a setData answered {other:?}"))),
        }
    }
}

/// Bumps the epoch node's version (making it if needed) and returns the new version: from then
/// on, writes guarded by any earlier version fail. The bump is conditional on the version read
/// just before, so that a late bump (a leader that was slow to get here) cannot supersede one
/// made after it: it fails with [`FENCED`] instead. Answers (version, zxid of the bump).
/// With credentials, only our identity may write the epoch node: anybody else could fence the
/// leader at will.
pub(super) async fn bump(
    client: &zk::Client,
    config: &super::ZkConfig,
    path: &str,
    holder: &str,
) -> Result<(i32, i64), zk::Error> {
    if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
        let parents_acls = config.parent_acls();
        let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&parents_acls));
        super::retry::idempotent(|| client.mkdir(parent, &parents)).await?;
    }
    let options_acls = config.node_acls();
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&options_acls));
    match super::retry::idempotent(|| client.create(path, b"", &options)).await {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(e) => return Err(e),
    }
    super::acl::protect(client, config, path, &config.node_acls()).await;
    let (_, read) = super::retry::idempotent(|| client.get_data(path)).await?;
    match super::retry::idempotent(|| client.set_data(path, holder.as_bytes(), Some(read.version))).await {
        Ok(stat) => Ok((stat.version, stat.mzxid)),
        Err(zk::Error::BadVersion) => {
            // Either our own write, applied before its answer was lost, or another leader's.
            let (data, now) = super::retry::idempotent(|| client.get_data(path)).await?;
            if data == holder.as_bytes() && now.version == read.version + 1 {
                Ok((now.version, now.mzxid))
            } else {
                Err(FENCED)
            }
        }
        Err(e) => Err(e),
    }
}
