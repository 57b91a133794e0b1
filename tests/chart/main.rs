//! The Helm chart, with the real helm and kubectl: what it renders, the RBAC it grants, its
//! upgrades, the release rehearsed from a registry, GitOps renders (Argo CD), and its bundled
//! ZooKeeper's configuration on the real server.

#[path = "../chart_support/mod.rs"]
mod chart_support;
#[path = "../e2e_support/mod.rs"]
mod e2e_support;
#[path = "../support/mod.rs"]
mod support;

mod chart;
mod chart_rbac;
mod gitops;
mod hooks;
mod release;
mod upgrade;
mod zookeeper;
