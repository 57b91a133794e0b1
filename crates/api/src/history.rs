// kube-derive takes one `printcolumn(...)` per column; clippy reads the repeated `type_ = ...`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

//! `LockHistory`: a lock's last grants, kept by the operator in the API (docs/design.md, "A
//! lock's history"), and the pure rules by which a batch of news joins it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::claim::{Phase, CLUSTER_LABEL_PREFIX};
use crate::validate::is_dns_subdomain;

/// Grants a history keeps unless its `spec.limit` says otherwise.
pub const DEFAULT_HISTORY_LIMIT: u32 = 100;
/// The most a history may keep: 1,000 entries of about 400 bytes stay far below an object's
/// 1.5 MiB.
pub const MAX_HISTORY_LIMIT: u32 = 1_000;
/// The prefix of a `ClusterLock`'s history's name (it lives in the operator's namespace, beside
/// any `Lock`'s there).
pub const CLUSTER_HISTORY_PREFIX: &str = "cluster.";

/// The last grants of one lock: who held it, when, for how long, how it ended, how long each
/// waited. Written by the operator, read with `kubectl get lockhistories` or `zklock history`.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "zklock.io",
    version = "v1alpha1",
    kind = "LockHistory",
    shortname = "lkh",
    namespaced,
    derive = "PartialEq",
    category = "zklock",
    status = "LockHistoryStatus",
    doc = "LockHistory keeps the last grants of one zklock lock (a Lock in its namespace, or a ClusterLock in this cluster, kept in the operator's namespace); the operator writes it.",
    printcolumn(name = "Lock", type_ = "string", json_path = ".spec.lock"),
    printcolumn(name = "Last Holder", type_ = "string", json_path = ".status.lastHolder"),
    printcolumn(name = "Last Granted", type_ = "date", json_path = ".status.lastGranted"),
    printcolumn(name = "Recorded", type_ = "integer", json_path = ".status.recorded"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct LockHistorySpec {
    /// The lock: a lockName (of this namespace), or cluster/NAME for a ClusterLock.
    pub lock: String,
    /// How many grants are kept, the newest (default 100, at most 1000). Lowering it drops the
    /// oldest at the next write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000))]
    pub limit: Option<u32>,
}

/// The grants kept, oldest first.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockHistoryStatus {
    /// The last grants, in the order they were granted (by fencing token).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["fencingToken"]))]
    pub grants: Vec<GrantRecord>,
    /// namespace/claim of the newest grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_holder: Option<String>,
    /// When the newest grant was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_granted: Option<Time>,
    /// Grants recorded since the history began, the ones no longer kept included.
    #[serde(default)]
    pub recorded: u64,
}

/// One grant of the lock, and its end once it ended.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantRecord {
    /// The grant's fencing token (decimal): unique per lock, growing in grant order.
    pub fencing_token: String,
    /// The claim that held.
    pub claim: String,
    /// The claim's namespace.
    pub namespace: String,
    #[serde(default, rename = "claimUID", skip_serializing_if = "Option::is_none")]
    pub claim_uid: Option<String>,
    /// The cluster that granted it (ClusterLocks shared by several clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The pod the claim was held for, if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_pod: Option<String>,
    /// When the grant was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<Time>,
    /// From the claim's creation to its grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_seconds: Option<f64>,
    /// When the claim's final status was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Time>,
    /// How the hold ended, the claim's final phase: Released (deleted, its pod gone, its lease
    /// run out), Revoked, Lost or Invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_as: Option<Phase>,
}

impl GrantRecord {
    pub fn token(&self) -> u64 {
        self.fencing_token.parse().unwrap_or(0)
    }

    /// How long it was held, once it ended.
    pub fn held_seconds(&self) -> Option<f64> {
        let (granted, ended) = (self.granted.as_ref()?, self.ended.as_ref()?);
        Some(ended.0.duration_since(granted.0).as_secs_f64().max(0.0))
    }

    /// Takes what `news` knows and this record does not (a record of a grant meets the record
    /// of its end, or the other way round when a batch came late).
    fn absorb(&mut self, news: GrantRecord) {
        let GrantRecord {
            fencing_token: _,
            claim,
            namespace,
            claim_uid,
            cluster,
            holder_pod,
            granted,
            waited_seconds,
            ended,
            ended_as,
        } = news;
        if self.claim.is_empty() {
            self.claim = claim;
        }
        if self.namespace.is_empty() {
            self.namespace = namespace;
        }
        self.claim_uid = self.claim_uid.take().or(claim_uid);
        self.cluster = self.cluster.take().or(cluster);
        self.holder_pod = self.holder_pod.take().or(holder_pod);
        self.granted = self.granted.take().or(granted);
        self.waited_seconds = self.waited_seconds.take().or(waited_seconds);
        self.ended = self.ended.take().or(ended);
        self.ended_as = self.ended_as.take().or(ended_as);
    }
}

/// The history's object name for lock `label` (`NAME`, or `cluster/NAME` for a ClusterLock);
/// `None` for a lock name no object can have (a lockName need not be a DNS subdomain, nor short
/// enough for the prefix): such a lock keeps no history.
pub fn history_name(label: &str) -> Option<String> {
    let name = match label.strip_prefix(CLUSTER_LABEL_PREFIX) {
        Some(cluster_lock) => format!("{CLUSTER_HISTORY_PREFIX}{cluster_lock}"),
        None => label.to_string(),
    };
    is_dns_subdomain(&name).then_some(name)
}

/// Joins `news` into `status` (pure): a record of a token already kept completes it, a new one
/// is added in token order, and only the newest `limit` are kept. Returns how many of `news`
/// were new grants.
pub fn record(status: &mut LockHistoryStatus, news: Vec<GrantRecord>, limit: Option<u32>) -> usize {
    let mut added = 0;
    for record in news {
        match status.grants.iter_mut().find(|g| g.fencing_token == record.fencing_token) {
            Some(kept) => kept.absorb(record),
            None => {
                // A token below every kept one, with the history full, was dropped already.
                let full = status.grants.len() >= limit_of(limit);
                if full && status.grants.first().is_some_and(|oldest| record.token() < oldest.token()) {
                    continue;
                }
                status.grants.push(record);
                added += 1;
            }
        }
    }
    status.grants.sort_by_key(GrantRecord::token);
    let excess = status.grants.len().saturating_sub(limit_of(limit));
    status.grants.drain(..excess);
    status.recorded += added as u64;
    if let Some(newest) = status.grants.last() {
        status.last_holder = Some(format!("{}/{}", newest.namespace, newest.claim));
        status.last_granted = newest.granted.clone().or(status.last_granted.take());
    }
    added
}

fn limit_of(limit: Option<u32>) -> usize {
    limit.unwrap_or(DEFAULT_HISTORY_LIMIT).clamp(1, MAX_HISTORY_LIMIT) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Option<Time> {
        Some(Time(Timestamp::from_second(1_800_000_000 + second).unwrap()))
    }

    fn grant(token: u64, claim: &str, second: i64) -> GrantRecord {
        GrantRecord {
            fencing_token: token.to_string(),
            claim: claim.into(),
            namespace: "shop".into(),
            granted: at(second),
            waited_seconds: Some(1.5),
            ..Default::default()
        }
    }

    fn end(token: u64, claim: &str, second: i64, how: Phase) -> GrantRecord {
        GrantRecord {
            fencing_token: token.to_string(),
            claim: claim.into(),
            namespace: "shop".into(),
            ended: at(second),
            ended_as: Some(how),
            ..Default::default()
        }
    }

    #[test]
    fn a_grant_and_its_end_make_one_record_in_either_order() {
        let mut status = LockHistoryStatus::default();
        assert_eq!(record(&mut status, vec![end(7, "a", 10, Phase::Released)], None), 1);
        assert_eq!(record(&mut status, vec![grant(7, "a", 4)], None), 0, "the end came first: no second grant");
        assert_eq!(status.grants.len(), 1);
        let kept = &status.grants[0];
        assert_eq!((kept.granted.clone(), kept.ended.clone(), kept.ended_as), (at(4), at(10), Some(Phase::Released)));
        assert_eq!(kept.held_seconds(), Some(6.0));
        assert_eq!(status.recorded, 1);
        assert_eq!(status.last_holder.as_deref(), Some("shop/a"));
    }

    #[test]
    fn only_the_newest_grants_are_kept_in_token_order() {
        let mut status = LockHistoryStatus::default();
        let news: Vec<GrantRecord> =
            [30, 10, 20, 50, 40].iter().map(|t| grant(*t, &format!("c{t}"), *t as i64)).collect();
        assert_eq!(record(&mut status, news, Some(3)), 5);
        let tokens: Vec<u64> = status.grants.iter().map(GrantRecord::token).collect();
        assert_eq!(tokens, [30, 40, 50]);
        assert_eq!(status.recorded, 5);
        assert_eq!(status.last_holder.as_deref(), Some("shop/c50"));
        // A late end of a grant no longer kept is not brought back as a grant of its own.
        assert_eq!(record(&mut status, vec![end(10, "c10", 60, Phase::Revoked)], Some(3)), 0);
        assert_eq!(status.grants.len(), 3);
        assert_eq!(status.grants[0].token(), 30);
    }

    #[test]
    fn tokens_order_as_numbers_not_as_strings() {
        let mut status = LockHistoryStatus::default();
        record(&mut status, vec![grant(9, "a", 1), grant(10, "b", 2)], None);
        assert_eq!(status.grants.iter().map(|g| g.claim.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn a_history_name_is_the_locks_or_says_there_is_none() {
        assert_eq!(history_name("db-migrations").as_deref(), Some("db-migrations"));
        assert_eq!(history_name("cluster/deploys").as_deref(), Some("cluster.deploys"));
        // A lockName that is no object name ('..' makes an empty DNS label).
        assert_eq!(history_name("a..b"), None);
        assert_eq!(history_name(&format!("cluster/{}", "a".repeat(250))), None);
    }
}
