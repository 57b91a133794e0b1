//! The `Lock` and `ClusterLock` objects: their permits fed to the lock engine from one watch
//! feed (`limits_feed`), and their statuses refreshed by a controller each (`locks`,
//! `cluster_locks`), spaced so that they never take the API server from the grants.

pub mod cluster_locks;
pub mod limits_feed;
pub mod locks;
