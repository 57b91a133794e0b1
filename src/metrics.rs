//! Prometheus metrics of the operator, served on `/metrics`.

use parking_lot::Mutex;
use std::future::Future;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::api::Phase;
use crate::zk::StatsSnapshot;

/// Every write to the Kubernetes API gives up after this long (and is retried by the caller).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabel {
    pub call: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: String,
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
    zk_ops: Family<OpLabel, Counter>,
    zk_seen: Mutex<StatsSnapshot>,
    /// Kubernetes API writes (status, finalizers, pod annotations, events).
    pub api_writes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("zklock");
        let claims = Family::<PhaseLabel, Gauge>::default();
        registry.register("claims", "LockClaims served, by phase", claims.clone());
        let acquire_wait = Histogram::new(exponential_buckets(0.005, 2.0, 20));
        registry.register("acquire_wait_seconds", "From claim creation to Held", acquire_wait.clone());
        let handoff = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register("handoff_seconds", "From a holder letting go to the next claim Held", handoff.clone());
        let zk_session_connected = Gauge::default();
        registry.register(
            "zookeeper_session_connected",
            "1 while the ZooKeeper session is connected",
            zk_session_connected.clone(),
        );
        let zk_sessions_lost = Counter::default();
        registry.register(
            "zookeeper_sessions_lost",
            "ZooKeeper sessions that ended (each is followed by re-anchoring)",
            zk_sessions_lost.clone(),
        );
        let leader = Gauge::default();
        registry.register("leader", "1 while this replica is the leader", leader.clone());
        let reconciles = Counter::default();
        registry.register("reconciles", "Reconciliations run", reconciles.clone());
        let reconciles_running = Gauge::default();
        registry.register("reconciles_running", "Reconciliations running now", reconciles_running.clone());
        let reconcile_errors = Family::<ErrorLabel, Counter>::default();
        registry.register("reconcile_errors", "Reconciliations that failed, by error", reconcile_errors.clone());
        let api_calls = Family::<CallLabel, Counter>::default();
        registry.register("kubernetes_calls", "Kubernetes API calls, by call and outcome", api_calls.clone());
        let api_call_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register("kubernetes_call_seconds", "Kubernetes API call latency", api_call_seconds.clone());
        let api_writes = Counter::default();
        registry.register(
            "kubernetes_writes",
            "Kubernetes API writes: status, finalizers, annotations, events",
            api_writes.clone(),
        );
        let zk_ops = Family::<OpLabel, Counter>::default();
        registry.register("zookeeper_operations", "ZooKeeper operations of the lock engine", zk_ops.clone());
        Metrics {
            registry,
            claims,
            acquire_wait,
            handoff,
            zk_session_connected,
            zk_sessions_lost,
            leader,
            reconciles,
            reconciles_running,
            reconcile_errors,
            api_calls,
            api_call_seconds,
            zk_ops,
            zk_seen: Mutex::new(StatsSnapshot::default()),
            api_writes,
        }
    }
}

impl Metrics {
    /// Runs one Kubernetes API call with the timeout, counting it and its outcome.
    pub async fn api_call<T, E: std::fmt::Display>(
        &self,
        call: &str,
        write: bool,
        f: impl Future<Output = Result<T, E>>,
    ) -> Result<T, ApiCallError<E>> {
        let start = Instant::now();
        let result = tokio::time::timeout(API_TIMEOUT, f).await;
        self.api_call_seconds.observe(start.elapsed().as_secs_f64());
        if write {
            self.api_writes.inc();
        }
        let (outcome, result) = match result {
            Ok(Ok(v)) => ("ok", Ok(v)),
            Ok(Err(e)) => ("error", Err(ApiCallError::Failed(e))),
            Err(_) => ("timeout", Err(ApiCallError::Timeout)),
        };
        self.api_calls.get_or_create(&CallLabel { call: call.into(), outcome: outcome.into() }).inc();
        result
    }

    pub fn set_phase_counts(&self, counts: &std::collections::HashMap<Phase, i64>) {
        for phase in Phase::ALL {
            self.claims
                .get_or_create(&PhaseLabel { phase: phase.as_str().into() })
                .set(*counts.get(&phase).unwrap_or(&0));
        }
    }

    /// Brings the engine's counters into the registry (called at scrape time).
    pub fn observe_engine(&self, now: StatsSnapshot) {
        let mut seen = self.zk_seen.lock();
        let pairs = [
            ("create", now.creates, seen.creates),
            ("create_unknown_outcome", now.create_unknown_outcomes, seen.create_unknown_outcomes),
            ("delete", now.deletes, seen.deletes),
            ("get_children", now.children_reads, seen.children_reads),
            ("predecessor_notification", now.predecessor_notifications, seen.predecessor_notifications),
            ("own_node_notification", now.own_node_notifications, seen.own_node_notifications),
            ("revocation_written", now.revocations_written, seen.revocations_written),
            ("directory_removed", now.directories_removed, seen.directories_removed),
            ("duplicate_deleted", now.duplicates_deleted, seen.duplicates_deleted),
        ];
        for (op, now, before) in pairs {
            self.zk_ops.get_or_create(&OpLabel { op: op.into() }).inc_by(now.saturating_sub(before));
        }
        *seen = now;
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiCallError<E> {
    #[error("{0}")]
    Failed(E),
    #[error("no answer within {API_TIMEOUT:?}")]
    Timeout,
}
