//! The token floor (docs/design.md: fencing tokens): a number in the Kubernetes API above every
//! fencing token, ticket and leader epoch this installation has handed out, so that they never go
//! back when ZooKeeper's data are made anew (the engine's `token_base` puts the next term's above
//! it). Kept in a ConfigMap beside the leader Lease, reserved ahead by
//! [`crate::zk::token_base::FLOOR_RESERVE`]: a term writes it once as it starts, and a grant's
//! path writes it only when a number outgrows the reservation.

use std::sync::atomic::{AtomicI64, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

use super::{Error, API_TIMEOUT};
use crate::zk::token_base::FLOOR_RESERVE;

/// The ConfigMap's name (in the operator's namespace) and the key holding the floor.
pub const FLOOR_CONFIGMAP: &str = "zklock-token-floor";
pub const FLOOR_KEY: &str = "floor";

pub struct TokenFloor {
    api: Api<ConfigMap>,
    /// The floor as last read or written: every number up to it may be handed out.
    reserved: AtomicI64,
    /// One raise at a time.
    raising: tokio::sync::Mutex<()>,
}

async fn timed<T>(call: &'static str, f: impl std::future::Future<Output = kube::Result<T>>) -> Result<T, Error> {
    tokio::time::timeout(API_TIMEOUT, f)
        .await
        .map_err(|_| Error::Timeout { call })?
        .map_err(|source| Error::Write { call, source })
}

fn parse(map: &ConfigMap) -> Result<i64, Error> {
    let value = map.data.as_ref().and_then(|d| d.get(FLOOR_KEY));
    match value.map(|v| v.trim().parse::<i64>()) {
        Some(Ok(floor)) if floor >= 0 => Ok(floor),
        // Rubbish is never replaced by a guess: a lower floor would let tokens go back.
        _ => Err(Error::TokenFloor(format!(
            "ConfigMap {FLOOR_CONFIGMAP} holds {value:?} in data.{FLOOR_KEY}, not a number of 0 or more: write the \
             highest fencing token, ticket or leader epoch this installation has handed out there (or delete the \
             ConfigMap if ZooKeeper's data were never made anew since its first start)"
        ))),
    }
}

impl TokenFloor {
    /// The floor kept in `namespace`: 0 where none was written yet (an installation that has
    /// handed out nothing since it began keeping one).
    pub async fn read(client: &kube::Client, namespace: &str) -> Result<TokenFloor, Error> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let floor = match timed("get_token_floor", api.get_opt(FLOOR_CONFIGMAP)).await? {
            Some(map) => parse(&map)?,
            None => 0,
        };
        Ok(TokenFloor { api, reserved: AtomicI64::new(floor), raising: Default::default() })
    }

    /// The floor: every number handed out from now on must be above it.
    pub fn reserved(&self) -> i64 {
        self.reserved.load(Ordering::SeqCst)
    }

    /// Makes sure the floor covers `value` before it is handed out: at once when it does,
    /// else by raising it `FLOOR_RESERVE` above `value` (a write tested against the version
    /// read, so that no two writers lower each other's).
    pub async fn cover(&self, value: i64) -> Result<(), Error> {
        if value <= self.reserved() {
            return Ok(());
        }
        let _one = self.raising.lock().await;
        loop {
            if value <= self.reserved() {
                return Ok(());
            }
            let wanted = value.saturating_add(FLOOR_RESERVE);
            let data = json!({ FLOOR_KEY: wanted.to_string() });
            let write = match timed("get_token_floor", self.api.get_opt(FLOOR_CONFIGMAP)).await? {
                None => {
                    let fresh = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(FLOOR_CONFIGMAP.to_string()),
                            labels: Some([("app.kubernetes.io/part-of".to_string(), "zklock".to_string())].into()),
                            ..ObjectMeta::default()
                        },
                        data: Some([(FLOOR_KEY.to_string(), wanted.to_string())].into()),
                        ..ConfigMap::default()
                    };
                    tokio::time::timeout(API_TIMEOUT, self.api.create(&PostParams::default(), &fresh)).await
                }
                Some(map) => {
                    let found = parse(&map)?;
                    if found >= value {
                        self.reserved.fetch_max(found, Ordering::SeqCst);
                        continue;
                    }
                    let version = map.metadata.resource_version.clone().unwrap_or_default();
                    let patch = json!({ "metadata": { "resourceVersion": version }, "data": data });
                    let patch = Patch::Merge(&patch);
                    tokio::time::timeout(API_TIMEOUT, self.api.patch(FLOOR_CONFIGMAP, &PatchParams::default(), &patch))
                        .await
                }
            };
            let written = write.map_err(|_| Error::Timeout { call: "raise_token_floor" })?;
            match written {
                Ok(_) => {
                    tracing::info!(floor = wanted, "reserved fencing tokens ahead in the API (the token floor)");
                    self.reserved.fetch_max(wanted, Ordering::SeqCst);
                    return Ok(());
                }
                // Another writer came first: read again.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(source) => return Err(Error::Write { call: "raise_token_floor", source }),
            }
        }
    }
}
