//! The lock engine on a real ZooKeeper, with no Kubernetes: the recipe's contenders, re-anchoring
//! after session changes, ACLs, a three-server ensemble's failovers, and the locks shared with
//! Apache Curator and kazoo, and a ClusterLock's directory two clusters share.

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod curator_interop;
mod engine;
mod ensemble;
mod kazoo_interop;
mod reanchor;
mod shared;
mod token_base;
