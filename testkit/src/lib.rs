//! Test support for zklock, shared by the integration tests, examples and benchmarks:
//! real ZooKeeper servers ([`zookeeper`]), a loopback TCP proxy that injects connection faults
//! ([`proxy`]), a relay that hangs connections on demand ([`hang`]), Apache Curator peers run
//! with the system's Java ([`curator`]) and kazoo peers run with the system's Python ([`kazoo`]);
//! a PostgreSQL server for the fencing recipes ([`postgres`]);
//! zklock's CRDs and admission policies installed and awaited until in force ([`install`]).
//!
//! Nothing here mocks ZooKeeper: when the server cannot be started the harness panics with
//! what to install, so a missing component fails the run instead of skipping tests.
#![forbid(unsafe_code)]

pub mod api_proxy;
pub mod curator;
pub mod hang;
pub mod install;
pub mod kazoo;
pub mod kube;
pub mod postgres;
pub mod proxy;
pub mod tls;
pub mod zookeeper;

pub use zookeeper::{Ensemble, ZkServer};

/// The workspace's root directory (for scripts and Java sources).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(|p| p.to_path_buf()).unwrap_or_default()
}
