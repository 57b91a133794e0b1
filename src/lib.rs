//! zklock: lease-style locks as Kubernetes custom resources, backed by ZooKeeper.
//!
//! - [`recipe`]: the pure lock recipe (which node holds, which node to watch).
//! - [`zk`]: the lock engine on one ZooKeeper session.
//! - [`controller`]: the operator's controllers (claims, gated pods); [`operator`] runs them.
//! - [`acquire`], [`exec`]: `zklock acquire` and `zklock exec`, clients of the claim API.
#![forbid(unsafe_code)]

pub mod acquire;
pub mod api;
pub mod client;
pub mod controller;
pub mod exec;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod recipe;
pub mod signals;
pub mod zk;
