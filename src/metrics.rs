//! Prometheus metrics of the operator, served on `/metrics`.

use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::api::{LockName, Phase};
use crate::zk::LockEngine;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: PhaseValue,
}

/// A claim's phase as a label value: its name, as the API writes it (the API types know no
/// metrics).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PhaseValue(pub Phase);

impl prometheus_client::encoding::EncodeLabelValue for PhaseValue {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelValueEncoder) -> std::fmt::Result {
        use std::fmt::Write;
        write!(encoder, "{:?}", self.0)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabel {
    pub method: String,
    pub resource: String,
    /// The HTTP status, or `error` when no answer came.
    pub outcome: String,
}

/// Where a reconcile read its holder pod: `watch` (this term's store) or `api`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

/// Why every claim was walked (see `controller::pace`): `reanchored` (a term's start, a new
/// session) or `period` (`--resync-period`, the safety net).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: &'static str,
    crd_revision: u32,
}

/// A lock, by namespace and name: the labels of the per-lock metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, Ord, PartialOrd, EncodeLabelSet)]
pub struct LockLabel {
    pub namespace: String,
    pub lock: String,
}

/// Per-lock series kept at most, so that a cluster with many locks cannot grow the operator's
/// metrics (and Prometheus's storage) without bound: claims of further locks are counted under
/// namespace and lock `_other`.
pub const MAX_LOCK_SERIES: usize = 200;

fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 20))
}

/// How long claims waited before they were Held, per lock ([`MAX_LOCK_SERIES`] at most).
pub struct AcquireWait {
    family: Family<LockLabel, Histogram, fn() -> Histogram>,
    labels: Mutex<std::collections::HashSet<LockLabel>>,
}

impl AcquireWait {
    fn new() -> Self {
        AcquireWait { family: Family::new_with_constructor(wait_histogram), labels: Mutex::default() }
    }

    pub fn observe(&self, namespace: &str, lock: &str, seconds: f64) {
        let mut label = LockLabel { namespace: namespace.into(), lock: lock.into() };
        {
            let mut labels = self.labels.lock();
            if !labels.contains(&label) {
                if labels.len() < MAX_LOCK_SERIES {
                    labels.insert(label.clone());
                } else {
                    label = LockLabel { namespace: OTHER.into(), lock: OTHER.into() };
                }
            }
        }
        self.family.get_or_create(&label).observe(seconds.max(0.0));
    }
}

/// The label of the series that counts what is beyond [`MAX_LOCK_SERIES`].
const OTHER: &str = "_other";

/// The age of the oldest claim waiting for each lock, read at each scrape from the claim stores
/// of the current term (the locks with the oldest waiters first, [`MAX_LOCK_SERIES`] at most),
/// and how many locks have waiters.
#[derive(Clone, Default)]
pub struct Waiters(Arc<Mutex<Vec<kube::runtime::reflector::Store<crate::api::KeptClaim>>>>);

impl Waiters {
    pub fn follow(&self, stores: Vec<kube::runtime::reflector::Store<crate::api::KeptClaim>>) {
        *self.0.lock() = stores;
    }

    /// Per lock with waiters, oldest first, the first [`MAX_LOCK_SERIES`]: the oldest waiter's
    /// age, and how many claims hold the lock in this store (a foreign client's hold is not
    /// counted); and how many locks have waiters. Each claim is read where it lies, its names
    /// borrowed: a scrape walks every claim, and copying each one's names made a scrape at
    /// 10,000 claims some 30,000 allocations, interleaved with the claims' own.
    fn oldest(&self, now: k8s_openapi::jiff::Timestamp) -> (Vec<(LockLabel, f64, i64)>, usize) {
        let claims: Vec<_> = self.0.lock().iter().flat_map(|store| store.state()).collect();
        // Per lock: the oldest waiter's age (none while no claim waits) and its holders.
        let mut locks: std::collections::HashMap<(&str, LockName<'_>), (Option<f64>, i64)> =
            std::collections::HashMap::new();
        for claim in &claims {
            if claim.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
            match claim.phase() {
                Some(Phase::Held) => {
                    for name in claim.spec.lock_names() {
                        locks.entry((namespace, name)).or_default().1 += 1;
                    }
                }
                None | Some(Phase::Pending | Phase::Waiting) => {
                    let Some(created) = &claim.metadata.creation_timestamp else { continue };
                    let age = now.duration_since(created.0).as_secs_f64().max(0.0);
                    for name in claim.spec.lock_names() {
                        let oldest = &mut locks.entry((namespace, name)).or_default().0;
                        *oldest = Some(oldest.map_or(age, |o| o.max(age)));
                    }
                }
                _ => {}
            }
        }
        let mut waited: Vec<_> = locks
            .into_iter()
            .filter_map(|((namespace, name), (age, held))| age.map(|age| (namespace, name, age, held)))
            .collect();
        // Ties (creation times have whole seconds) in the order of the labels.
        waited.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| (a.0, a.1).cmp(&(b.0, b.1))));
        let count = waited.len();
        let series = waited
            .into_iter()
            .take(MAX_LOCK_SERIES)
            .map(|(namespace, name, age, held)| {
                (LockLabel { namespace: namespace.into(), lock: name.label() }, age, held)
            })
            .collect();
        (series, count)
    }
}

impl std::fmt::Debug for Waiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Waiters")
    }
}

impl Collector for Waiters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (oldest, count) = self.oldest(k8s_openapi::jiff::Timestamp::now());
        let help = "Age of the oldest claim waiting for the lock (locks with the oldest waiters, 200 at most)";
        let mut family = encoder.encode_descriptor("oldest_waiter_seconds", help, None, MetricType::Gauge)?;
        for (label, age, _) in &oldest {
            prometheus_client::metrics::gauge::ConstGauge::new(*age).encode(family.encode_family(label)?)?;
        }
        let help = "Claims holding each lock that has waiters (the same locks as zklock_oldest_waiter_seconds): \
                    0 while claims wait is a lock held by a client other than zklock, or a stall";
        let mut family = encoder.encode_descriptor("waited_lock_holders", help, None, MetricType::Gauge)?;
        for (label, _, held) in &oldest {
            prometheus_client::metrics::gauge::ConstGauge::new(*held).encode(family.encode_family(label)?)?;
        }
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        let help = "Locks with at least one claim waiting";
        let family = encoder.encode_descriptor("locks_with_waiters", help, None, MetricType::Gauge)?;
        prometheus_client::metrics::gauge::ConstGauge::new(count).encode(family)?;
        Ok(())
    }
}

pub struct Metrics {
    registry: Registry,
    pub claims: Family<PhaseLabel, Gauge>,
    pub acquire_wait: Arc<AcquireWait>,
    pub handoff: Histogram,
    pub zk_session_connected: Gauge,
    pub zk_sessions_lost: Counter,
    pub leader: Gauge,
    /// Terms given up because this replica could not serve them (its lease given up).
    pub step_downs: Counter,
    pub reconciles: Counter,
    /// Claim reconciles running now (not those waiting in kube-runtime's queue).
    pub reconciles_running: Gauge,
    /// Claims in the process's watch store (kept while standing by too).
    pub claims_watched: Gauge,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    pub api_calls: Family<CallLabel, Counter>,
    pub api_call_seconds: Histogram,
    /// Kubernetes API writes for claims (status, finalizers, pod annotations, events; not
    /// leader election's Lease).
    pub api_writes: Counter,
    /// Holder pods read by reconciles, by where from.
    pub holder_pod_views: Family<SourceLabel, Counter>,
    /// Gated pods whose scheduling gate the operator removed.
    pub pods_ungated: Counter,
    /// Reconciliations of gated pods run.
    pub gated_reconciles: Counter,
    /// Walks of every claim made to the end, by cause.
    pub walks: Family<CauseLabel, Counter>,
    /// Claims and gated pods that stopped holding back those behind them at a lock's
    /// admission gate, by cause.
    pub overtaken: Family<CauseLabel, Counter>,
    /// The engine whose ZooKeeper counters a scrape reads: the current term's.
    pub engine: EngineCounters,
    /// The claim stores whose waiters a scrape reads: the current term's.
    pub waiters: Waiters,
}

impl Metrics {
    pub fn count_overtaken(&self, overtaken: &crate::controller::admission::Overtaken) {
        for (cause, n) in [("patience", overtaken.patience), ("untried", overtaken.untried)] {
            if n > 0 {
                self.overtaken.get_or_create(&CauseLabel { cause }).inc_by(n);
            }
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Metrics {
            registry: Registry::default(),
            claims: Family::default(),
            acquire_wait: Arc::new(AcquireWait::new()),
            handoff: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            zk_session_connected: Gauge::default(),
            zk_sessions_lost: Counter::default(),
            leader: Gauge::default(),
            step_downs: Counter::default(),
            reconciles: Counter::default(),
            reconciles_running: Gauge::default(),
            claims_watched: Gauge::default(),
            reconcile_errors: Family::default(),
            api_calls: Family::default(),
            api_call_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            api_writes: Counter::default(),
            holder_pod_views: Family::default(),
            pods_ungated: Counter::default(),
            gated_reconciles: Counter::default(),
            walks: Family::default(),
            overtaken: Family::default(),
            engine: EngineCounters::default(),
            waiters: Waiters::default(),
        };
        // The process's metrics under their usual names; zklock's own under zklock_.
        m.registry.register_collector(Box::new(crate::process_metrics::ProcessMetrics));
        let r = m.registry.sub_registry_with_prefix("zklock");
        let build = Family::<BuildLabel, Gauge>::default();
        build
            .get_or_create(&BuildLabel { version: env!("CARGO_PKG_VERSION"), crd_revision: crate::api::CRD_REVISION })
            .set(1);
        r.register("build_info", "1, labelled with this build's version and CRD revision", build);
        r.register("claims", "LockClaims served, by phase", m.claims.clone());
        let wait = "From claim creation to Held, per lock (200 locks at most; the rest under lock _other)";
        r.register("acquire_wait_seconds", wait, m.acquire_wait.family.clone());
        r.register("handoff_seconds", "From a holder letting go to the next claim Held", m.handoff.clone());
        let connected = "1 while the ZooKeeper session is connected";
        r.register("zookeeper_session_connected", connected, m.zk_session_connected.clone());
        let lost = "ZooKeeper sessions that ended (each is followed by re-anchoring)";
        r.register("zookeeper_sessions_lost", lost, m.zk_sessions_lost.clone());
        r.register("leader", "1 while this replica is the leader", m.leader.clone());
        let gave_up = "Leader terms given up because this replica could not serve them (the lease went to another)";
        r.register("terms_given_up", gave_up, m.step_downs.clone());
        r.register("reconciles", "Reconciliations run", m.reconciles.clone());
        r.register("reconciles_running", "Reconciliations running now", m.reconciles_running.clone());
        let watched = "LockClaims in this replica's watch store, listed and followed while it stands by too";
        r.register("claims_watched", watched, m.claims_watched.clone());
        r.register("reconcile_errors", "Reconciliations that failed, by error", m.reconcile_errors.clone());
        r.register("kubernetes_calls", "Kubernetes API calls, by method, resource and outcome", m.api_calls.clone());
        r.register("kubernetes_call_seconds", "Kubernetes API call latency", m.api_call_seconds.clone());
        let writes = "Kubernetes API writes for claims: status, finalizers, pod annotations, events";
        r.register("kubernetes_writes", writes, m.api_writes.clone());
        let views = "Holder pods read by reconciles: from the operator's pod watch (what it proves) or from the API";
        r.register("holder_pod_reads", views, m.holder_pod_views.clone());
        let ungated = "Gated pods whose scheduling gate zklock.io/lock was removed (their claim Held)";
        r.register("pods_ungated", ungated, m.pods_ungated.clone());
        r.register("gated_pod_reconciles", "Reconciliations of gated pods run", m.gated_reconciles.clone());
        let walks = "Walks of every claim served, paced, made to the end: reanchored (a term's start, a new \
                     ZooKeeper session) or period (--resync-period, the safety net against a lost event)";
        r.register("claim_walks", walks, m.walks.clone());
        let overtaken = "Claims (and gated pods) let go ahead of one seen before them at a lock's admission gate, by \
                         cause: patience (it was reconciled as the first there and did not enter within 5 s) or \
                         untried (not reconciled with its finalizer on within 5 minutes of being seen)";
        r.register("admission_overtaken", overtaken, m.overtaken.clone());
        for cause in ["patience", "untried"] {
            // Shown at 0 from the start: an alert on its rate needs the series.
            let _ = m.overtaken.get_or_create(&CauseLabel { cause });
        }
        r.register_collector(Box::new(m.engine.clone()));
        r.register_collector(Box::new(m.waiters.clone()));
        m
    }
}

/// The lock engine's ZooKeeper counters, read at each scrape from the engine of the current
/// term (a new term has a new engine, whose counters start again at zero: Prometheus reads
/// that as a counter reset).
#[derive(Clone, Default)]
pub struct EngineCounters(Arc<Mutex<Option<LockEngine>>>);

impl EngineCounters {
    pub fn follow(&self, engine: Option<LockEngine>) {
        *self.0.lock() = engine;
    }
}

impl std::fmt::Debug for EngineCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineCounters")
    }
}

impl Collector for EngineCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let help = "ZooKeeper operations of the lock engine";
        let mut family = encoder.encode_descriptor("zookeeper_operations", help, None, MetricType::Counter)?;
        let Some(s) = self.0.lock().as_ref().map(LockEngine::stats) else { return Ok(()) };
        let counts = [
            ("create", s.creates),
            ("create_unknown_outcome", s.create_unknown_outcomes),
            ("delete", s.deletes),
            ("get_children", s.children_reads),
            ("predecessor_notification", s.predecessor_notifications),
            ("own_node_notification", s.own_node_notifications),
            ("revocation_written", s.revocations_written),
            ("directory_removed", s.directories_removed),
            ("duplicate_deleted", s.duplicates_deleted),
        ];
        for (op, count) in counts {
            ConstCounter::new(count).encode(family.encode_family(&OpLabel { op })?)?;
        }
        Ok(())
    }
}

impl Metrics {
    pub fn set_phase_counts(&self, counts: &std::collections::HashMap<Phase, i64>) {
        for phase in Phase::ALL {
            self.claims.get_or_create(&PhaseLabel { phase: PhaseValue(phase) }).set(*counts.get(&phase).unwrap_or(&0));
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn waits_are_kept_per_lock_up_to_a_bound() {
        let metrics = super::Metrics::default();
        for i in 0..super::MAX_LOCK_SERIES + 5 {
            metrics.acquire_wait.observe("shop", &format!("lock-{i}"), 0.5);
        }
        metrics.acquire_wait.observe("shop", "lock-0", 1.0);
        let text = metrics.encode();
        assert!(text.contains("zklock_acquire_wait_seconds_count{namespace=\"shop\",lock=\"lock-0\"} 2\n"), "{text}");
        let other = "zklock_acquire_wait_seconds_count{namespace=\"_other\",lock=\"_other\"} 5\n";
        assert!(text.contains(other), "the locks beyond the bound share one series");
        let series = text.lines().filter(|l| l.starts_with("zklock_acquire_wait_seconds_count")).count();
        assert_eq!(series, super::MAX_LOCK_SERIES + 1);
        assert!(text.contains("# TYPE zklock_oldest_waiter_seconds gauge"), "described without a term");
        assert!(text.contains("zklock_locks_with_waiters 0\n"), "{text}");
    }

    #[test]
    fn phases_are_labelled_by_their_api_names() {
        let metrics = super::Metrics::default();
        metrics.set_phase_counts(&[(super::Phase::Held, 3)].into());
        let text = metrics.encode();
        assert!(text.contains("zklock_claims{phase=\"Held\"} 3\n"), "{text}");
        assert!(text.contains("zklock_claims{phase=\"Waiting\"} 0\n"), "{text}");
    }

    #[test]
    fn locks_with_waiters_show_their_oldest_waiter_and_their_holders() {
        use kube::runtime::watcher::Event;
        let (reader, mut writer) = kube::runtime::reflector::store::<crate::api::KeptClaim>();
        let claim = |name: &str, lock: &str, phase: Option<&str>| {
            let status = phase.map_or(serde_json::json!({}), |p| serde_json::json!({ "phase": p }));
            let claim: crate::api::LockClaim = serde_json::from_value(serde_json::json!({
                "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
                "metadata": { "name": name, "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z" },
                "spec": { "lockName": lock }, "status": status,
            }))
            .unwrap();
            crate::api::KeptClaim::from(claim)
        };
        for c in [
            claim("h", "db", Some("Held")),
            claim("w", "db", Some("Waiting")),
            claim("stuck", "free", Some("Waiting")),
            claim("alone", "idle", Some("Held")),
        ] {
            writer.apply_watcher_event(&Event::Apply(c));
        }
        let metrics = super::Metrics::default();
        metrics.waiters.follow(vec![reader]);
        let text = metrics.encode();
        assert!(text.contains("zklock_waited_lock_holders{namespace=\"shop\",lock=\"db\"} 1\n"), "{text}");
        assert!(text.contains("zklock_waited_lock_holders{namespace=\"shop\",lock=\"free\"} 0\n"), "{text}");
        assert!(!text.contains("lock=\"idle\""), "a lock nobody waits for has no series: {text}");
        assert!(text.contains("zklock_locks_with_waiters 2\n"), "{text}");

        // A claim over several locks waits in each; only the oldest locks get series, all count.
        let several: crate::api::LockClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": "both", "namespace": "shop", "creationTimestamp": "2025-01-01T00:00:00Z" },
            "spec": { "locks": [{ "lockName": "db" }, { "clusterLockName": "shared" }] },
            "status": { "phase": "Waiting" },
        }))
        .unwrap();
        writer.apply_watcher_event(&Event::Apply(crate::api::KeptClaim::from(several)));
        for i in 0..super::MAX_LOCK_SERIES {
            writer.apply_watcher_event(&Event::Apply(claim(&format!("n{i}"), &format!("new-{i:03}"), None)));
        }
        let text = metrics.encode();
        let count = 2 + 1 + super::MAX_LOCK_SERIES;
        assert!(text.contains(&format!("zklock_locks_with_waiters {count}\n")), "{text}");
        let series: Vec<_> = text.lines().filter(|l| l.starts_with("zklock_oldest_waiter_seconds{")).collect();
        assert_eq!(series.len(), super::MAX_LOCK_SERIES, "{text}");
        // The year-older claim first (its two locks, in the order of their labels), then the
        // rest by label: "free" is among the series, "new-199" and "new-198" are not.
        assert!(series[0].starts_with("zklock_oldest_waiter_seconds{namespace=\"shop\",lock=\"cluster/shared\"}"));
        assert!(series[1].starts_with("zklock_oldest_waiter_seconds{namespace=\"shop\",lock=\"db\"}"));
        assert!(series[2].starts_with("zklock_oldest_waiter_seconds{namespace=\"shop\",lock=\"free\"}"));
        assert!(!text.contains("lock=\"new-198\""), "{text}");
        assert!(text.contains("zklock_waited_lock_holders{namespace=\"shop\",lock=\"cluster/shared\"} 0\n"));
    }
}
