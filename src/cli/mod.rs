//! The commands of the `zklock` binary, one module each; `main.rs` holds the command line.

pub mod api;
pub mod check;
pub mod claims;
pub mod history;
pub mod lock;
pub mod manifests;
pub mod operator;
pub mod reference;
pub mod status;
pub mod uninstall;
pub mod zookeeper;
