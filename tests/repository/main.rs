//! What the repository promises about itself: the README's demo and the docs' commands run as
//! written (and every `zklock` command a doc shows exists), the layers keep their dependencies,
//! the checked-in CRDs are the generated ones, the image is what it says, the release workflow
//! lints clean.

#[path = "../e2e_support/mod.rs"]
mod e2e_support;

mod argocd;
mod cli;
mod crd;
mod demo;
mod docs;
mod generated;
mod image;
mod integrations;
mod layers;
mod release_archives;
mod supply_chain;
mod workflows;
