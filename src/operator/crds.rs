//! The operator brings zklock's CRDs to its own revision when it starts (`--manage-crds`, the
//! chart's `crds.manage`). Helm installs a chart's `crds/` once and never upgrades them: without
//! this, a `helm upgrade` to a release whose claims have new fields (`spec.locks`,
//! `clusterLockName`) would leave the old schema in place, and the API server would refuse or
//! prune those fields. Server-side apply, with zklock as the field manager, forced: the CRDs are
//! the operator's. A CRD of a later revision (a newer operator's, during a rollback) is left
//! alone: taking fields away would prune them from the newer claims on their next write.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

use crate::api::{crd_objects, CRD_REVISION, CRD_REVISION_ANNOTATION};

/// What happened to one CRD.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// A later revision is installed.
    Newer(u32),
}

/// Applies every CRD of this build unless a later revision is installed; the first failure
/// stops (the operator goes on with the CRDs as they are, and says so).
pub async fn apply(client: &kube::Client) -> Result<Vec<(String, Outcome)>, String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut done = vec![];
    for (_, crd) in crd_objects() {
        let name = crd.name_any();
        let installed = tokio::time::timeout(crate::controller::API_TIMEOUT, api.get_opt(&name))
            .await
            .map_err(|_| format!("reading CRD {name}: no answer within {:?}", crate::controller::API_TIMEOUT))?
            .map_err(|e| format!("reading CRD {name}: {e}"))?;
        let revision =
            installed.as_ref().and_then(|c| c.annotations().get(CRD_REVISION_ANNOTATION)?.parse::<u32>().ok());
        if let Some(newer) = revision.filter(|r| *r > CRD_REVISION) {
            done.push((name, Outcome::Newer(newer)));
            continue;
        }
        let params = PatchParams::apply("zklock").force();
        tokio::time::timeout(crate::controller::API_TIMEOUT, api.patch(&name, &params, &Patch::Apply(&crd)))
            .await
            .map_err(|_| format!("applying CRD {name}: no answer within {:?}", crate::controller::API_TIMEOUT))?
            .map_err(|e| format!("applying CRD {name}: {e}"))?;
        done.push((name, Outcome::Applied));
    }
    Ok(done)
}

/// [`apply`], its outcome logged: never fatal (the CRDs as installed may do).
pub async fn apply_and_report(client: &kube::Client) {
    match apply(client).await {
        Ok(done) => {
            for (name, outcome) in done {
                match outcome {
                    Outcome::Applied => tracing::info!(crd = %name, revision = CRD_REVISION, "CRD up to date"),
                    Outcome::Newer(newer) => tracing::warn!(
                        crd = %name,
                        installed = newer,
                        mine = CRD_REVISION,
                        "a later revision of this CRD is installed (a newer zklock's); left as it is"
                    ),
                }
            }
        }
        Err(e) => tracing::warn!(
            error = %e,
            "cannot bring zklock's CRDs to this version; going on with them as installed (grant the operator get \
             and patch on the zklock CRDs, the chart's crds.manage, or apply `zklock crd` by hand)"
        ),
    }
}
