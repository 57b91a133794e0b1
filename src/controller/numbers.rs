//! The numbers the operator keeps in ConfigMaps of its own — the token floor and the leader
//! epoch in force — and the one way they are changed: read, decided on, written back tested
//! against the version read (made where missing). Two writers never lower each other's number:
//! the one overtaken reads again, and decides again from what the other wrote.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;

use super::base::{Error, API_TIMEOUT};
use crate::zk::{Contention, CONTENDED_ATTEMPTS};

/// A ConfigMap's `data`. Keys written replace those found; others are left (none of zklock's).
pub type Data = BTreeMap<String, String>;

/// What to do with the ConfigMap as read.
#[derive(Debug)]
pub enum Change {
    /// It holds what it should.
    Keep,
    /// Write these keys into its `data` (a merge: keys it holds besides are left; none of
    /// zklock's own).
    Write(Data),
}

#[derive(Debug, thiserror::Error)]
pub enum NumbersError {
    #[error("{call}: no answer from the Kubernetes API within {API_TIMEOUT:?}")]
    Timeout { call: &'static str },
    #[error("{call}: {source}")]
    Api { call: &'static str, source: kube::Error },
    #[error(
        "ConfigMap {name}: other writers changed it {CONTENDED_ATTEMPTS} times in a row while this one read and \
         wrote it; look for another process writing it (another operator electing on the same Lease?)"
    )]
    Contended { name: String },
    #[error("ConfigMap {name} came without a resourceVersion: its write could not be tested against it")]
    Unversioned { name: String },
}

impl From<NumbersError> for Error {
    fn from(e: NumbersError) -> Self {
        match e {
            NumbersError::Timeout { call } => Error::Timeout { call },
            NumbersError::Api { call, source } => Error::Write { call, source },
            other @ (NumbersError::Contended { .. } | NumbersError::Unversioned { .. }) => {
                Error::Contended(other.to_string())
            }
        }
    }
}

async fn timed<T>(
    call: &'static str,
    f: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, NumbersError> {
    tokio::time::timeout(API_TIMEOUT, f)
        .await
        .map_err(|_| NumbersError::Timeout { call })?
        .map_err(|source| NumbersError::Api { call, source })
}

/// Changes ConfigMap `name` as `decide` says from the data it holds (`None`: there is none).
/// Each write tests the resourceVersion read (a create fails where one was made meanwhile):
/// when another writer came first, it is read again and `decide` asked again, at most
/// [`CONTENDED_ATTEMPTS`] times. Answers the data in force after it: as found, or as written.
pub async fn change<E, Fut>(
    api: &Api<ConfigMap>,
    name: &str,
    (read_call, write_call): (&'static str, &'static str),
    mut decide: impl FnMut(Option<Data>) -> Fut,
) -> Result<Data, E>
where
    E: From<NumbersError>,
    Fut: std::future::Future<Output = Result<Change, E>>,
{
    let mut contention = Contention::new();
    while contention.attempt().await {
        let found = timed(read_call, api.get_opt(name)).await?;
        let data = found.as_ref().map(|m| m.data.clone().unwrap_or_default());
        let data = match decide(data.clone()).await? {
            Change::Keep => return Ok(data.unwrap_or_default()),
            Change::Write(data) => data,
        };
        let written = match found {
            None => {
                let fresh = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        labels: Some([("app.kubernetes.io/part-of".to_string(), "zklock".to_string())].into()),
                        ..ObjectMeta::default()
                    },
                    data: Some(data.clone()),
                    ..ConfigMap::default()
                };
                timed(write_call, api.create(&PostParams::default(), &fresh)).await
            }
            // Tested against the resourceVersion read: the API server refuses the write (409)
            // once anybody else wrote after that read. (A patch, not a replace: the chart's
            // Role grants `patch` on these two names.)
            Some(read) => {
                // Without its version the write could not be tested: never written blind.
                let Some(version) = read.metadata.resource_version else {
                    return Err(NumbersError::Unversioned { name: name.to_string() }.into());
                };
                let patch = serde_json::json!({ "metadata": { "resourceVersion": version }, "data": data });
                timed(write_call, api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await
            }
        };
        match written {
            Ok(_) => return Ok(data),
            // Written by somebody else since the read (409), or deleted since (404): read again,
            // and decide from what is there now.
            Err(NumbersError::Api { source: kube::Error::Api(s), .. }) if s.code == 409 || s.code == 404 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(NumbersError::Contended { name: name.to_string() }.into())
}
