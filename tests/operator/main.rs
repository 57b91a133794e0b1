//! The `zklock` binary end to end: the operator on the real control plane and a real ZooKeeper
//! (claims, several locks, gated pods, a Job story, liveness under faults), and the CLI's
//! commands.

#[path = "../e2e_support/mod.rs"]
mod e2e_support;

mod cli;
mod clusters;
mod crds;
mod e2e;
mod fencing;
mod gated_pods;
mod history;
mod job_story;
mod liveness;
mod lock_commands;
mod several_locks;
mod supersede;
mod tokens;
