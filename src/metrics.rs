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

use crate::api::Phase;
use crate::zk::LockEngine;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: Phase,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub claims: Family<PhaseLabel, Gauge>,
    pub acquire_wait: Histogram,
    pub handoff: Histogram,
    pub zk_session_connected: Gauge,
    pub zk_sessions_lost: Counter,
    pub leader: Gauge,
    pub reconciles: Counter,
    /// Claims waiting for a reconcile, and reconciles running.
    pub reconciles_running: Gauge,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    pub api_calls: Family<CallLabel, Counter>,
    pub api_call_seconds: Histogram,
    /// Kubernetes API writes for claims (status, finalizers, pod annotations, events; not
    /// leader election's Lease).
    pub api_writes: Counter,
    /// Gated pods whose scheduling gate the operator removed.
    pub pods_ungated: Counter,
    /// Reconciliations of gated pods run.
    pub gated_reconciles: Counter,
    /// The engine whose ZooKeeper counters a scrape reads: the current term's.
    pub engine: EngineCounters,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("zklock"),
            claims: Family::default(),
            acquire_wait: Histogram::new(exponential_buckets(0.005, 2.0, 20)),
            handoff: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            zk_session_connected: Gauge::default(),
            zk_sessions_lost: Counter::default(),
            leader: Gauge::default(),
            reconciles: Counter::default(),
            reconciles_running: Gauge::default(),
            reconcile_errors: Family::default(),
            api_calls: Family::default(),
            api_call_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            api_writes: Counter::default(),
            pods_ungated: Counter::default(),
            gated_reconciles: Counter::default(),
            engine: EngineCounters::default(),
        };
        let r = &mut m.registry;
        r.register("claims", "LockClaims served, by phase", m.claims.clone());
        r.register("acquire_wait_seconds", "From claim creation to Held", m.acquire_wait.clone());
        r.register("handoff_seconds", "From a holder letting go to the next claim Held", m.handoff.clone());
        let connected = "1 while the ZooKeeper session is connected";
        r.register("zookeeper_session_connected", connected, m.zk_session_connected.clone());
        let lost = "ZooKeeper sessions that ended (each is followed by re-anchoring)";
        r.register("zookeeper_sessions_lost", lost, m.zk_sessions_lost.clone());
        r.register("leader", "1 while this replica is the leader", m.leader.clone());
        r.register("reconciles", "Reconciliations run", m.reconciles.clone());
        r.register("reconciles_running", "Reconciliations running now", m.reconciles_running.clone());
        r.register("reconcile_errors", "Reconciliations that failed, by error", m.reconcile_errors.clone());
        r.register("kubernetes_calls", "Kubernetes API calls, by method, resource and outcome", m.api_calls.clone());
        r.register("kubernetes_call_seconds", "Kubernetes API call latency", m.api_call_seconds.clone());
        let writes = "Kubernetes API writes for claims: status, finalizers, pod annotations, events";
        r.register("kubernetes_writes", writes, m.api_writes.clone());
        let ungated = "Gated pods whose scheduling gate zklock.io/lock was removed (their claim Held)";
        r.register("pods_ungated", ungated, m.pods_ungated.clone());
        r.register("gated_pod_reconciles", "Reconciliations of gated pods run", m.gated_reconciles.clone());
        r.register_collector(Box::new(m.engine.clone()));
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
        let help = "ZooKeeper operations of the lock engine";
        let mut family = encoder.encode_descriptor("zookeeper_operations", help, None, MetricType::Counter)?;
        for (op, count) in counts {
            ConstCounter::new(count).encode(family.encode_family(&OpLabel { op })?)?;
        }
        Ok(())
    }
}

impl Metrics {
    pub fn set_phase_counts(&self, counts: &std::collections::HashMap<Phase, i64>) {
        for phase in Phase::ALL {
            self.claims.get_or_create(&PhaseLabel { phase }).set(*counts.get(&phase).unwrap_or(&0));
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
    fn phases_are_labelled_by_their_api_names() {
        let metrics = super::Metrics::default();
        metrics.set_phase_counts(&[(super::Phase::Held, 3)].into());
        let text = metrics.encode();
        assert!(text.contains("zklock_claims{phase=\"Held\"} 3\n"), "{text}");
        assert!(text.contains("zklock_claims{phase=\"Waiting\"} 0\n"), "{text}");
    }
}
