//! The Helm chart, with the real helm and kubectl: what it renders, and the RBAC it grants.

#[path = "../chart_support/mod.rs"]
mod chart_support;
#[path = "../e2e_support/mod.rs"]
mod e2e_support;

mod chart;
mod chart_rbac;
mod upgrade;
