//! Tokens that never go back. Every number zklock hands out of ZooKeeper — fencing tokens,
//! tickets, the leader epoch — is a zxid, and zxids start over when the ensemble's data are
//! made anew (a restored snapshot, a new ensemble, a wiped volume): every guarded resource
//! would then refuse the next holder, and a recorded ticket would order a claim wrongly.
//! So each of them is handed out raised by a *base*, kept in ZooKeeper (`token-base`, see
//! [`super::Layout::token_base`]), and the caller keeps, where it survives the ensemble (the
//! Kubernetes API), a *floor* above every number handed out (reserved ahead) and the last
//! term's epoch. A term starts only once `base + zxid` is above that epoch; where the
//! ensemble went back, the base puts every zxid from then on above the floor.
//!
//! The base only changes while nobody hands tokens out with the old one: it is made where it
//! is missing (a new ensemble), raised by the one leader of an unshared root at its term's
//! start (its predecessors are fenced), and otherwise only by an administrator with every
//! sharing cluster's operator stopped ([`raise`]): a cluster still serving with the old base
//! would hand out tokens below the new ones.

use zookeeper_client as zk;

use super::fence::Fence;
use super::retry::{self, Contention};
use super::{Error, ZkConfig};

/// How far above a number handed out the floor is reserved: one write to the floor covers
/// the zxids of 256 ZooKeeper leader elections (each starts a new 2^32 block) or a trillion
/// writes, so that keeping the floor ahead costs nothing on a grant's path.
pub const FLOOR_RESERVE: i64 = 1 << 40;

/// The base that puts every zxid from `zxid` on above `floor`: never below 0 (an ensemble
/// whose zxids are above the floor already needs none).
pub fn covering(floor: i64, zxid: i64) -> i64 {
    floor.saturating_add(1).saturating_sub(zxid).max(0)
}

fn parse(path: &str, data: &[u8]) -> Result<i64, Error> {
    std::str::from_utf8(data).ok().and_then(|s| s.trim().parse::<i64>().ok()).filter(|b| *b >= 0).ok_or_else(|| {
        Error::TokenBase {
            path: path.to_string(),
            why: format!("it holds {:?}, not a number of 0 or more", String::from_utf8_lossy(data)),
        }
    })
}

/// The base at `path` for a term whose first zxid is `zxid` (its epoch's), given what is kept
/// outside ZooKeeper: `floor`, above every number handed out (reserved ahead), and `last`, the
/// epoch of the last term. Made if missing (above the floor). Kept while it puts `zxid` above
/// `last`: the ensemble went on from where the last term left it (its zxids are below the
/// floor, which is reserved ahead). Else ZooKeeper's zxids went back (its data restored):
/// raised above the floor if `may_raise` (this leader alone hands tokens out from this base),
/// else refused.
#[allow(clippy::too_many_arguments)]
pub(super) async fn take(
    client: &zk::Client,
    config: &ZkConfig,
    fence: &Fence,
    path: &str,
    floor: i64,
    last: i64,
    zxid: i64,
    may_raise: bool,
) -> Result<i64, Error> {
    let zkerr = |op, e| Error::zk(op, path, e);
    let mut contention = Contention::new();
    while contention.attempt().await {
        match retry::idempotent(|| client.get_data(path)).await {
            Err(zk::Error::NoNode) => {
                let base = covering(floor, zxid);
                let options_acls = config.node_acls();
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&options_acls));
                match retry::idempotent(|| client.create(path, base.to_string().as_bytes(), &options)).await {
                    Ok(_) => {
                        tracing::info!(%path, base, floor, "made the token base");
                        return Ok(base);
                    }
                    // Another cluster's leader (or our own lost answer): read what is there.
                    Err(zk::Error::NodeExists) => continue,
                    Err(e) => return Err(zkerr("create", e)),
                }
            }
            Err(e) => return Err(zkerr("get", e)),
            Ok((data, stat)) => {
                let base = parse(path, &data)?;
                if base.saturating_add(zxid) > last {
                    return Ok(base);
                }
                if !may_raise {
                    return Err(Error::TokensBehindFloor {
                        path: path.to_string(),
                        floor: last,
                        ensemble: base.saturating_add(zxid),
                    });
                }
                let raised = covering(floor, zxid);
                match fence.set_data_stat(client, path, raised.to_string().as_bytes(), stat.version).await {
                    Ok(_) => {
                        tracing::warn!(%path, from = base, to = raised, floor, "raised the token base: ZooKeeper's zxids went back below tokens handed out before (its data were made anew)");
                        return Ok(raised);
                    }
                    Err(zk::Error::BadVersion) => continue,
                    Err(e) => return Err(zkerr("set", e)),
                }
            }
        }
    }
    Err(Error::Contended { op: "take", path: path.to_string() })
}

/// Raises the base at `path` so that every zxid from now on hands out numbers above `above`
/// (an administrator's step when moving to a new ensemble; every operator that shares the
/// base must be stopped). Never lowers it. Answers the base.
pub async fn raise(client: &zk::Client, config: &ZkConfig, path: &str, above: i64) -> Result<i64, Error> {
    let zkerr = |op, e| Error::zk(op, path, e);
    if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
        let parents_acls = config.parent_acls();
        let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&parents_acls));
        retry::idempotent(|| client.mkdir(parent, &parents)).await.map_err(|e| zkerr("mkdir", e))?;
    }
    let mut contention = Contention::new();
    while contention.attempt().await {
        let (current, version) = match retry::idempotent(|| client.get_data(path)).await {
            Ok((data, stat)) => (parse(path, &data)?, stat.version),
            Err(zk::Error::NoNode) => {
                let options_acls = config.node_acls();
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&options_acls));
                match retry::idempotent(|| client.create(path, b"0", &options)).await {
                    Ok(_) | Err(zk::Error::NodeExists) => continue,
                    Err(e) => return Err(zkerr("create", e)),
                }
            }
            Err(e) => return Err(zkerr("get", e)),
        };
        // The zxid of a write of our own tells where the ensemble's zxids are now: every later
        // one is above it.
        let now = match retry::timed(client.set_data(path, current.to_string().as_bytes(), Some(version))).await {
            Ok(stat) => stat.mzxid,
            Err(zk::Error::BadVersion) => continue,
            Err(e) => return Err(zkerr("set", e)),
        };
        let base = current.max(covering(above, now));
        if base == current {
            return Ok(base);
        }
        match retry::timed(client.set_data(path, base.to_string().as_bytes(), Some(version + 1))).await {
            Ok(_) => return Ok(base),
            Err(zk::Error::BadVersion) => continue,
            Err(e) => return Err(zkerr("set", e)),
        }
    }
    Err(Error::Contended { op: "raise", path: path.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_puts_every_later_zxid_above_the_floor_and_is_never_negative() {
        assert_eq!(covering(0, 5), 0, "a fresh installation: tokens are the zxids themselves");
        assert_eq!(covering(100, 500), 0, "zxids above the floor already");
        assert_eq!(covering(1_000, 10), 991);
        for (floor, zxid) in [(1_000, 10), (1 << 50, 1), (5, 5)] {
            assert!(covering(floor, zxid) + zxid > floor);
        }
        assert_eq!(covering(i64::MAX, 0), i64::MAX, "saturates instead of wrapping");
    }

    #[test]
    fn a_base_that_is_not_a_number_is_refused_naming_the_node() {
        assert_eq!(parse("/r/token-base", b"42").ok(), Some(42));
        assert_eq!(parse("/r/token-base", b" 7\n").ok(), Some(7));
        for bad in [&b"x"[..], b"-3", b"", b"\xff"] {
            let err = parse("/r/token-base", bad).unwrap_err().to_string();
            assert!(err.contains("/r/token-base"), "{err}");
        }
    }
}
