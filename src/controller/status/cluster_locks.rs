//! `ClusterLock` objects (docs/user-guide.md: locks across clusters): one cluster-wide watch.
//! Their permits go to the lock engine the moment the watch delivers them, as a `Lock`'s do;
//! with a shared root they are this cluster's declaration, and the lock's limit is where every
//! cluster's declaration meets (the engine's `permits`). A claim from a namespace their selector
//! does not admit ends `Invalid`. Their status shows the holders and the queue wherever they
//! are, read from ZooKeeper (the other clusters' claims are in no store of ours), and whether
//! the clusters' permits agree; refreshed while anybody queues or other clusters declare.
//!
//! No claim is decided before the `ClusterLock`s are listed (they count among the listings
//! `Serving::wait_limits_listed` waits for, which the first pass waits for: see `limits_feed`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::core::Selector;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::limits_feed::LimitSource;
use crate::controller::base::settings::NEWER_COPY_BACKSTOP;
use crate::controller::base::Error;
use crate::controller::serving::Serving;
use crate::controller::stores::Stores;
use crate::controller::throttle::Throttle;
use crate::controller::writer::ApiWriter;
use crate::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{conditions, ClusterLock, ClusterLockHolder, ClusterLockStatus, MAX_LISTED_HOLDERS};
use crate::recipe::{self, Decision, Limit};
use crate::zk::{Declaration, Layout, LockEngine, QueueEntry};

/// How often a `ClusterLock`'s status is read again while anybody queues: the other clusters'
/// claims change it without any event of ours.
const STATUS_REFRESH: Duration = Duration::from_secs(5);
/// Queue entries whose owner a status names at most (one read each, then cached).
const MAX_DESCRIBED: usize = 200;

impl LimitSource for ClusterLock {
    const OPTIONAL: bool = true;

    fn directory(&self, layout: &Layout) -> String {
        layout.cluster_lock(&self.name_any())
    }

    /// With a shared root this is this cluster's declaration: the lock's limit is where every
    /// cluster's declaration meets (the engine's `permits`).
    fn declare(&self, engine: &LockEngine, layout: &Layout) {
        engine.declare(&self.directory(layout), Some(Limit::from_permits(self.spec.permits)));
    }

    /// Declared no more: a mutex, where no other cluster shares it.
    fn undeclare(engine: &LockEngine, path: &str) {
        engine.declare(path, None);
    }

    fn fencing(&self) -> (Option<String>, String, bool) {
        (None, self.name_any(), self.spec.fencing == crate::api::Fencing::Enforced)
    }
}

/// The directories of the `ClusterLock`s.
pub fn directories(layout: &Layout) -> String {
    format!("{}/", layout.cluster_locks())
}

/// What the `ClusterLock` status controller works with.
pub struct Ctx {
    pub engine: LockEngine,
    pub layout: Layout,
    pub stores: Arc<Stores>,
    pub writer: Arc<ApiWriter>,
    pub serving: Arc<Serving>,
    pub metrics: Arc<Metrics>,
    /// When each `ClusterLock`'s queue was last looked at (see `throttle`).
    pub refreshes: Throttle<String>,
}

impl AsRef<Metrics> for Ctx {
    fn as_ref(&self) -> &Metrics {
        &self.metrics
    }
}

pub async fn reconcile(lock: Arc<ClusterLock>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if !ctx.serving.anchored() {
        return Ok(Action::requeue(NEWER_COPY_BACKSTOP));
    }
    let name = lock.name_any();
    let path = ctx.layout.cluster_lock(&name);
    // Declared by the watch feed only (`limits_feed`): this copy may be older than the feed's
    // last word (see `locks::reconcile`).
    if let Some(wait) = ctx.refreshes.wait(name.clone(), Instant::now()) {
        // The queue is read from ZooKeeper: once the window (or the spacing after the last look)
        // is over.
        return Ok(Action::requeue(wait));
    }
    ctx.refreshes.refreshed(name.clone(), Instant::now());
    let entries = ctx.engine.queue(&path).await?;
    let mut owners = Vec::with_capacity(entries.len().min(MAX_DESCRIBED));
    for entry in entries.iter().take(MAX_DESCRIBED) {
        let description = match entry.id {
            Some(_) => ctx.engine.describe(&format!("{path}/{}", entry.node)).await?,
            None => None,
        };
        owners.push(description);
    }
    // Without a shared root nobody else declares: this cluster's permits are the lock's.
    let declarations = match ctx.layout.shared_root() {
        Some(_) => ctx.engine.declarations(&path),
        None => Some(vec![Declaration { cluster: String::new(), limit: Limit::from_permits(lock.spec.permits) }]),
    };
    let served = Served { entries: &entries, owners: &owners, limit: ctx.engine.limit(&path), declarations };
    let mut status = status_of(&lock, &served, &Time(Timestamp::now()));
    // This cluster's holders: their tokens, from their claims.
    let label = format!("{}{name}", crate::api::CLUSTER_LABEL_PREFIX);
    for holder in status.holders.iter_mut().filter(|h| ctx.layout.cluster().unwrap_or_default() == h.cluster) {
        let Some(claim) = ctx.stores.claim(&holder.namespace, &holder.claim) else { continue };
        let several = claim.lock_statuses().iter().find(|l| l.lock_name == label).and_then(|l| l.fencing_token.clone());
        holder.fencing_token = several.or_else(|| claim.fencing_token().map(str::to_string));
    }
    // Other clusters change the queue and the declarations without any event of ours.
    let others = served.declarations.as_ref().is_none_or(|d| d.len() > 1);
    let again = if entries.is_empty() && !others { Action::await_change() } else { Action::requeue(STATUS_REFRESH) };
    if lock.status.as_ref() == Some(&status) {
        return Ok(again);
    }
    let api: Api<ClusterLock> = Api::all(ctx.writer.client().clone());
    let patch = Patch::Merge(json!({ "status": status }));
    let written =
        ctx.writer.write("cluster lock status", api.patch_status(&name, &PatchParams::default(), &patch)).await;
    match written.expecting(&[404])? {
        Some(_) => Ok(again),
        // Deleted meanwhile: its watch says so.
        None => Ok(Action::await_change()),
    }
}

/// Who a queue entry stands for: a zklock node's description (`<cluster>/<namespace>/<claim>`,
/// or `<namespace>/<claim>` from an operator without a cluster name), or the node's name for a
/// client other than zklock.
fn holder_of(entry: &QueueEntry, description: Option<&str>) -> ClusterLockHolder {
    let parts: Vec<&str> = description.map(|d| d.splitn(3, '/').collect()).unwrap_or_default();
    match parts[..] {
        [cluster, namespace, claim] => ClusterLockHolder {
            cluster: cluster.into(),
            namespace: namespace.into(),
            claim: claim.into(),
            fencing_token: None,
        },
        [namespace, claim] => {
            ClusterLockHolder { namespace: namespace.into(), claim: claim.into(), ..Default::default() }
        }
        _ => ClusterLockHolder { claim: entry.node.clone(), ..Default::default() },
    }
}

/// What this cluster's operator knows of a `ClusterLock`'s queue and permits.
pub struct Served<'a> {
    /// The queue, in order.
    pub entries: &'a [QueueEntry],
    /// The descriptions of the first entries.
    pub owners: &'a [Option<String>],
    /// The limit this cluster grants with.
    pub limit: Limit,
    /// What every cluster declares (this one's named by its cluster name, empty without a
    /// shared root); `None` while the others' are not known.
    pub declarations: Option<Vec<Declaration>>,
}

/// The status a `ClusterLock` shows (pure); `now` stamps the conditions that change.
pub fn status_of(lock: &ClusterLock, served: &Served<'_>, now: &Time) -> ClusterLockStatus {
    let Served { entries, owners, limit, declarations } = served;
    let names: Vec<&str> = entries.iter().map(|e| e.node.as_str()).collect();
    let queue = recipe::queue(&names);
    // Holders are a prefix of the queue: the recipe grants from the front.
    let held = entries.iter().take_while(|e| recipe::decide_in(&queue, &e.node, *limit) == Decision::Held).count();
    let holders: Vec<ClusterLockHolder> = entries
        .iter()
        .zip(owners.iter().map(Option::as_deref).chain(std::iter::repeat(None)))
        .take(held.min(MAX_LISTED_HOLDERS))
        .map(|(entry, owner)| holder_of(entry, owner))
        .collect();
    let mut clusters: Vec<String> = entries
        .iter()
        .zip(owners.iter())
        .filter_map(|(entry, owner)| Some(holder_of(entry, owner.as_deref())).filter(|h| !h.cluster.is_empty()))
        .map(|h| h.cluster)
        .chain(declarations.iter().flatten().map(|d| d.cluster.clone()).filter(|c| !c.is_empty()))
        .collect();
    clusters.sort();
    clusters.dedup();
    let generation = lock.metadata.generation;
    let mut conditions = lock.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let (ready, reason, message) = readiness(lock, declarations.is_some());
    conditions::set(&mut conditions, conditions::READY, ready, reason, &message, generation, now);
    if let Some(declarations) = declarations {
        let (agree, reason, message) = agreement(declarations, *limit);
        conditions::set(&mut conditions, conditions::PERMITS_AGREE, agree, reason, &message, generation, now);
    }
    ClusterLockStatus {
        held: u32::try_from(held).unwrap_or(u32::MAX),
        holders,
        queue_length: u32::try_from(entries.len() - held).unwrap_or(u32::MAX),
        clusters,
        conditions,
        observed_generation: generation,
    }
}

/// The Ready condition: whether this cluster serves the lock.
fn readiness(lock: &ClusterLock, declarations_known: bool) -> (bool, &'static str, String) {
    let name = lock.metadata.name.as_deref().unwrap_or_default();
    match &lock.spec.namespace_selector {
        None => (
            false,
            "NoNamespaceSelected",
            "no namespace may claim it: give it spec.namespaceSelector ({} selects every namespace)".into(),
        ),
        Some(selector) => match Selector::try_from(selector.clone()) {
            Err(e) => (false, "SelectorInvalid", format!("spec.namespaceSelector cannot be read ({e}): fix it")),
            Ok(_) if !declarations_known => (
                false,
                "ReadingPermits",
                "reading the permits the other clusters declare; until then only the front of the queue is granted"
                    .into(),
            ),
            Ok(_) => (true, "Serving", format!("claims of the selected namespaces may name clusterLockName {name}")),
        },
    }
}

/// The PermitsAgree condition, from every cluster's declaration and the limit granted with.
fn agreement(declarations: &[Declaration], limit: Limit) -> (bool, &'static str, String) {
    let says = |limit: Limit| match limit {
        Limit::Mutex => "a mutex".to_string(),
        Limit::Permits(n) if n.get() == 1 => "1 permit".to_string(),
        Limit::Permits(n) => format!("{n} permits"),
    };
    let first = declarations.first().map(|d| d.limit);
    if declarations.iter().all(|d| Some(d.limit) == first) {
        let clusters = if declarations.len() > 1 {
            format!("all {} clusters sharing it declare", declarations.len())
        } else {
            "the one cluster serving it declares".to_string()
        };
        return (true, "Agree", format!("{clusters} {}", first.map_or_else(|| says(limit), says)));
    }
    let each: Vec<String> = declarations.iter().map(|d| format!("{}: {}", d.cluster, says(d.limit))).collect();
    (
        false,
        "Disagree",
        format!(
            "the clusters sharing it declare different permits ({}); each grants as {} allows, which every one \
             allows: give every cluster's ClusterLock the same spec.permits",
            each.join(", "),
            says(limit)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::Mode;

    fn cluster_lock(selector: Option<serde_json::Value>) -> ClusterLock {
        let mut spec = json!({});
        if let Some(selector) = selector {
            spec["namespaceSelector"] = selector;
        }
        serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "ClusterLock", "metadata": { "name": "pay" }, "spec": spec,
        }))
        .unwrap()
    }

    fn entry(name: &str, sequence: u64, mode: Mode) -> QueueEntry {
        let node = format!("{}{sequence:010}", recipe::node_prefix(name, mode));
        QueueEntry { node, sequence, id: Some(name.into()), mode }
    }

    #[test]
    fn the_status_names_holders_wherever_they_are_and_counts_the_rest() {
        let entries = vec![
            entry("a1", 3, Mode::Shared),
            entry("b1", 4, Mode::Shared),
            entry("a2", 5, Mode::Exclusive),
            entry("b2", 6, Mode::Shared),
        ];
        let owners = vec![Some("eu-1/pay/a1".into()), Some("us-2/pay/b1".into()), Some("eu-1/pay/a2".into()), None];
        let now = Time(Timestamp::UNIX_EPOCH);
        let served = |entries, owners, limit| Served { entries, owners, limit, declarations: None };
        let status = status_of(&cluster_lock(None), &served(&entries, &owners, Limit::Mutex), &now);
        assert_eq!(status.held, 2, "two Shared holders ahead of an Exclusive waiter");
        assert_eq!(
            status.holders,
            [
                ClusterLockHolder {
                    cluster: "eu-1".into(),
                    namespace: "pay".into(),
                    claim: "a1".into(),
                    fencing_token: None
                },
                ClusterLockHolder {
                    cluster: "us-2".into(),
                    namespace: "pay".into(),
                    claim: "b1".into(),
                    fencing_token: None
                },
            ]
        );
        assert_eq!(status.queue_length, 2);
        assert_eq!(status.clusters, ["eu-1", "us-2"]);

        let permits = status_of(&cluster_lock(None), &served(&entries, &owners, Limit::from_permits(Some(3))), &now);
        assert_eq!(permits.held, 3, "three permits, whatever the modes");
        let foreign = QueueEntry { node: "_c_x-lock-0000000001".into(), sequence: 1, id: None, mode: Mode::Exclusive };
        let alone = status_of(&cluster_lock(None), &served(&[foreign], &[None], Limit::Mutex), &now);
        assert_eq!(alone.holders[0].claim, "_c_x-lock-0000000001", "a foreign holder by its node");
        assert!(alone.clusters.is_empty());
    }

    #[test]
    fn the_conditions_say_whether_the_lock_is_served_and_the_clusters_agree() {
        let now = Time(Timestamp::UNIX_EPOCH);
        let declared = |pairs: &[(&str, Option<u32>)]| {
            Some(
                pairs
                    .iter()
                    .map(|(cluster, permits)| Declaration {
                        cluster: cluster.to_string(),
                        limit: Limit::from_permits(*permits),
                    })
                    .collect::<Vec<_>>(),
            )
        };
        let status = |lock: &ClusterLock, declarations, limit| {
            status_of(lock, &Served { entries: &[], owners: &[], limit, declarations }, &now)
        };
        let condition = |status: &ClusterLockStatus, type_| {
            conditions::get(&status.conditions, type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        let all = cluster_lock(Some(json!({})));
        let three = Limit::from_permits(Some(3));

        let agreed = status(&all, declared(&[("eu-1", Some(3)), ("us-2", Some(3))]), three);
        assert_eq!(condition(&agreed, conditions::READY).map(|c| c.0), Some("True".into()));
        let (state, _, message) = condition(&agreed, conditions::PERMITS_AGREE).unwrap();
        assert_eq!((state.as_str(), message.as_str()), ("True", "all 2 clusters sharing it declare 3 permits"));
        assert_eq!(agreed.clusters, ["eu-1", "us-2"], "clusters serving it, with or without contenders");

        let one = Limit::from_permits(Some(1));
        let apart = status(&all, declared(&[("eu-1", Some(3)), ("us-2", None)]), one);
        let (state, reason, message) = condition(&apart, conditions::PERMITS_AGREE).unwrap();
        assert_eq!((state.as_str(), reason.as_str()), ("False", "Disagree"));
        assert!(message.contains("(eu-1: 3 permits, us-2: a mutex); each grants as 1 permit allows"), "{message}");

        let unknown = status(&all, None, Limit::FRONT_ONLY);
        assert_eq!(condition(&unknown, conditions::READY).map(|c| c.1), Some("ReadingPermits".into()));
        assert_eq!(condition(&unknown, conditions::PERMITS_AGREE), None, "not known: not said");

        let closed = status(&cluster_lock(None), declared(&[("", None)]), Limit::Mutex);
        assert_eq!(condition(&closed, conditions::READY).map(|c| c.1), Some("NoNamespaceSelected".into()));
        assert_eq!(
            condition(&closed, conditions::PERMITS_AGREE).map(|c| c.2),
            Some("the one cluster serving it declares a mutex".into())
        );
        assert!(closed.clusters.is_empty(), "no cluster name without a shared root");
    }
}
