//! zklock: lease-style locks as Kubernetes custom resources, backed by ZooKeeper.
//!
//! - [`recipe`], [`zk`]: the pure lock recipe and the lock engine on one ZooKeeper session (the
//!   crate `zklock-engine`, which knows no Kubernetes).
//! - [`api`]: the custom resources (the crate `zklock-api`).
//! - [`controller`]: the operator's controllers (claims, gated pods); [`operator`] runs them.
//! - [`acquire`], [`exec`]: `zklock acquire` and `zklock exec`, clients of the claim API.
#![forbid(unsafe_code)]

pub mod acquire;
pub use zklock_api as api;
pub mod client;
pub mod controller;
pub mod durations;
pub mod exec;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod process_metrics;
pub use zklock_engine::recipe;
pub mod signals;
pub use zklock_engine as zk;
