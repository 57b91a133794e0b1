//! The operator: kube-runtime's `Controller` over LockClaims (one per served scope: a namespace,
//! or all), driven also by the lock engine's state changes and by holder pods.
//!
//! The files stand on floors; a file imports only from floors below its own (or files listed
//! before it on its floor), which `tests/repository/layers.rs` checks (`CONTROLLER_LAYERS`):
//! 0. vocabulary (`base`) and the pure cores: names, errors, scopes, intervals; the creation-order
//!    gates (`admission`), the grant ledger (`ledger`), status spacing (`throttle`);
//! 1. capabilities, each owning its state: the numbers kept in ConfigMaps (`numbers`: read,
//!    decided on, written back tested against the version read), the API fence and the token floor, the API `writer`
//!    (every call with its deadline and its `Answer`, Events), the locks' `history` (written in
//!    batches off the grants' path), the registry (the claims' index and
//!    the grant book), the gated pods' arrivals, the holder pods' view, what of the term is served
//!    (`serving`), the watches' `stores`, the `triggers`; the `context` the claims' pipeline and
//!    the term's tasks share (the other controllers have their own), and the one error policy
//!    (`report`);
//! 2. the pipelines: a claim's (`claim`, over the pure `claim::plan`), a gated pod's (`gated`), and
//!    the `Lock` and `ClusterLock` permits and statuses (`status`);
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
mod fencing;
mod history;
mod holders;
mod numbers;
pub mod registry;
mod report;
mod serving;
mod stores;
pub mod token_floor;
mod triggers;
mod writer;
// Floor 2: the pipelines.
pub mod claim;
pub mod gated;
pub mod status;
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
pub use fencing::FencingParam;
pub use registry::Registry;
pub use term::{run, Setup};
