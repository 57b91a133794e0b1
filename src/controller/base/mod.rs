//! The controller's vocabulary (floor 0): names, the error type, the scopes served, fixed
//! intervals and pure facts about a claim. Nothing here does I/O or holds state, and nothing
//! here imports from the rest of the controller.

pub mod claim_facts;
pub mod error;
pub mod ids;
pub mod kept_pod;
pub mod scopes;
pub mod settings;

pub use error::{Error, API_TIMEOUT};
pub use ids::{part_tokens, Part, Uid};
