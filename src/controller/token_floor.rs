//! The token floor (docs/design.md: fencing tokens): a number in the Kubernetes API above every
//! fencing token, ticket and leader epoch this installation has handed out, so that they never go
//! back when ZooKeeper's data are made anew (the engine's `token_base` puts the next term's above
//! it). Kept in a ConfigMap beside the leader Lease, reserved ahead by
//! [`crate::zk::token_base::FLOOR_RESERVE`]: a term writes it once as it starts, and a grant's
//! path writes it only when a number outgrows the reservation.

use std::sync::atomic::{AtomicI64, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use super::base::{Error, API_TIMEOUT};
use super::numbers::{self, Change};
use crate::zk::token_base::FLOOR_RESERVE;

/// The ConfigMap's name (in the operator's namespace) for the default Lease, and the key holding
/// the floor.
pub const FLOOR_CONFIGMAP: &str = "zklock-token-floor";

/// The floor's ConfigMap of the installation electing on Lease `lease_name`: two installations
/// in one namespace keep floors of their own (a shared one would make each read the other's
/// epochs as ZooKeeper going back).
pub fn floor_configmap(lease_name: &str) -> String {
    if lease_name == crate::operator::LEASE_NAME {
        FLOOR_CONFIGMAP.to_string()
    } else {
        format!("{lease_name}-token-floor")
    }
}
pub const FLOOR_KEY: &str = "floor";
/// The epoch of the last term: a term whose epoch is not above it finds ZooKeeper went back.
pub const EPOCH_KEY: &str = "epoch";

pub struct TokenFloor {
    api: Api<ConfigMap>,
    /// The ConfigMap's name ([`floor_configmap`]).
    name: String,
    /// The floor as last read or written: every number up to it may be handed out.
    reserved: AtomicI64,
    /// The epoch of the last term, as read when this one began.
    last_epoch: i64,
    /// One write at a time.
    writing: tokio::sync::Mutex<()>,
}

async fn timed<T>(call: &'static str, f: impl std::future::Future<Output = kube::Result<T>>) -> Result<T, Error> {
    tokio::time::timeout(API_TIMEOUT, f)
        .await
        .map_err(|_| Error::Timeout { call })?
        .map_err(|source| Error::Write { call, source })
}

/// What the ConfigMap holds: (floor, epoch of the last term).
fn parse(data: &numbers::Data, name: &str) -> Result<(i64, i64), Error> {
    let number = |key: &str, missing: Option<i64>| {
        let value = data.get(key);
        match value.map(|v| v.trim().parse::<i64>()) {
            Some(Ok(n)) if n >= 0 => Ok(n),
            None if missing.is_some() => Ok(missing.unwrap_or_default()),
            // Rubbish is never replaced by a guess: a lower floor would let tokens go back.
            _ => Err(Error::TokenFloor(format!(
                "ConfigMap {name} holds {value:?} in data.{key}, not a number of 0 or more: write the \
                 highest fencing token, ticket or leader epoch this installation has handed out there (or delete \
                 the ConfigMap if ZooKeeper's data were never made anew since its first start)"
            ))),
        }
    };
    Ok((number(FLOOR_KEY, None)?, number(EPOCH_KEY, Some(0))?))
}

impl TokenFloor {
    /// The floor kept in `namespace`: 0 where none was written yet (an installation that has
    /// handed out nothing since it began keeping one).
    pub async fn read(client: &kube::Client, namespace: &str, name: &str) -> Result<TokenFloor, Error> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let (floor, last_epoch) = match timed("get_token_floor", api.get_opt(name)).await? {
            Some(map) => parse(&map.data.unwrap_or_default(), name)?,
            None => (0, 0),
        };
        Ok(TokenFloor {
            api,
            name: name.to_string(),
            reserved: AtomicI64::new(floor),
            last_epoch,
            writing: Default::default(),
        })
    }

    /// The floor: every number handed out from now on must be above it where ZooKeeper's
    /// zxids went back.
    pub fn reserved(&self) -> i64 {
        self.reserved.load(Ordering::SeqCst)
    }

    /// The epoch of the last term: this term's must be above it, else ZooKeeper's zxids went
    /// back.
    pub fn last_epoch(&self) -> i64 {
        self.last_epoch
    }

    /// Records this term's `epoch`, with the floor reserved `FLOOR_RESERVE` above it.
    pub async fn begin_term(&self, epoch: i64) -> Result<(), Error> {
        self.write(epoch, Some(epoch)).await
    }

    /// Makes sure the floor covers `value` before it is handed out: at once when it does,
    /// else by raising it `FLOOR_RESERVE` above `value`.
    pub async fn cover(&self, value: i64) -> Result<(), Error> {
        if value <= self.reserved() {
            return Ok(());
        }
        self.write(value, None).await
    }

    /// Raises the floor over `value` (and the epoch to `epoch`), with writes tested against
    /// the version read, so that no two writers lower each other's.
    async fn write(&self, value: i64, epoch: Option<i64>) -> Result<(), Error> {
        let _one = self.writing.lock().await;
        let name = &self.name;
        let decide = |found: Option<numbers::Data>| async move {
            let (found_floor, found_epoch) = found.as_ref().map(|d| parse(d, name)).transpose()?.unwrap_or((0, 0));
            let floor = if found_floor >= value { found_floor } else { value.saturating_add(FLOOR_RESERVE) };
            let new_epoch = epoch.map_or(found_epoch, |e| e.max(found_epoch));
            if found.is_some() && (floor, new_epoch) == (found_floor, found_epoch) {
                return Ok(Change::Keep);
            }
            Ok::<_, Error>(Change::Write(
                [(FLOOR_KEY.to_string(), floor.to_string()), (EPOCH_KEY.to_string(), new_epoch.to_string())].into(),
            ))
        };
        let now = numbers::change(&self.api, name, ("get_token_floor", "raise_token_floor"), decide).await?;
        let (floor, epoch) = parse(&now, name)?;
        if floor > self.reserved() {
            tracing::info!(floor, epoch, "reserved fencing tokens ahead in the API (the token floor)");
        }
        self.reserved.fetch_max(floor, Ordering::SeqCst);
        Ok(())
    }
}
