//! The operator: a kube-runtime controller over LockClaims, driven also by the lock engine.

pub mod plan;
