//! The operator: kube-runtime's `Controller` over LockClaims (one per served scope: a namespace,
//! or all), driven also by the lock engine's state changes and by holder pods.
//!
//! The files stand on floors; a file imports only from floors below its own (or files listed
//! before it on its floor), which `tests/repository/layers.rs` checks (`CONTROLLER_LAYERS`):
//! 0. vocabulary (`base`) and the pure cores: names, errors, scopes, intervals; the creation-order
//!    gates (`admission`), the grant ledger (`ledger`), status spacing (`throttle`);
//! 1. capabilities, each owning its state: the API fence and the token floor, the writer of
//!    Events, the registry, the holder pods' view, and the `context` that bundles them with the
//!    stores and the triggers;
//! 2. the pipelines: a claim's (`reconcile` over the pure `plan`), a gated pod's (`gated`), and
//!    the `Lock` and `ClusterLock` statuses;
//! 3. the term's tasks: the claim feed, watches, re-anchoring, the session supervisor, the paced
//!    walk and the positions' refresh;
//! 4. the wiring of one leader's term (`term`).

// Floor 0: vocabulary and pure cores.
pub mod admission;
pub mod base;
mod ledger;
mod throttle;
// Floor 1: capabilities.
mod api_fence;
mod arrivals;
mod context;
pub mod events;
mod holders;
pub mod registry;
mod serving;
pub mod token_floor;
mod writer;
// Floor 2: the pipelines.
pub mod claim;
pub mod cluster_locks;
pub mod gated;
pub mod locks;
// Floor 3: the term's tasks.
pub mod anchor;
pub mod feed;
mod pace;
mod positions;
pub mod supervisor;
mod watch;
// Floor 4: the wiring.
mod term;

pub use api_fence::EpochParam;
pub use base::ids::claim_of;
pub use base::{Error, Uid, API_TIMEOUT};
pub use context::Context;
pub use registry::Registry;
pub use term::{run, Setup};
