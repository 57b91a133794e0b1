//! zklock: lease-style locks as Kubernetes custom resources, backed by ZooKeeper.
//!
//! - [`recipe`]: the pure lock recipe (which node holds, which node to watch).
//! - [`zk`]: the lock engine on one ZooKeeper session.
#![forbid(unsafe_code)]

pub mod api;
pub mod client;
pub mod controller;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod recipe;
pub mod zk;
