//! The operator brings zklock's CRDs to its own revision when it starts (`--manage-crds`, the
//! chart's `crds.manage`). Helm installs a chart's `crds/` once and never upgrades them: without
//! this, a `helm upgrade` to a release whose claims have new fields (`spec.locks`,
//! `clusterLockName`) would leave the old schema in place, and the API server would refuse or
//! prune those fields. Server-side apply, with zklock as the field manager, forced: the CRDs are
//! the operator's. A CRD of a later revision (a newer operator's, during a rollback) is left
//! alone: taking fields away would prune them from the newer claims on their next write. Each
//! write is made on the copy it was decided from (two operator versions starting at once race).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

use crate::api::{crd_objects, CRD_REVISION, CRD_REVISION_ANNOTATION};

/// What happened to one CRD.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// A later revision is installed.
    Newer(u32),
}

/// How often a CRD that changed between its read and the apply is read again.
const ATTEMPTS: usize = 5;

/// Applies every CRD of this build unless a later revision is installed; the first failure
/// stops (the operator goes on with the CRDs as they are, and says so).
pub async fn apply(client: &kube::Client) -> Result<Vec<(String, Outcome)>, String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut done = vec![];
    for (_, crd) in crd_objects() {
        let name = crd.name_any();
        let mut outcome = None;
        for _ in 0..ATTEMPTS {
            let installed = within(&format!("reading CRD {name}"), api.get_opt(&name))
                .await?
                .map_err(|e| format!("reading CRD {name}: {e}"))?;
            if let Some(decided) = apply_over(&api, &crd, installed.as_ref()).await? {
                outcome = Some(decided);
                break;
            }
        }
        let outcome =
            outcome.ok_or_else(|| format!("applying CRD {name}: it changed under every one of {ATTEMPTS} attempts"))?;
        done.push((name, outcome));
    }
    Ok(done)
}

/// Applies `crd` over `installed`, the copy just read, only if that copy is still the one
/// installed: another operator version (a rollout, a rollback, a second installation, Argo CD)
/// may apply its own revision between the read and the write, and a later revision must never
/// be taken back by an earlier one's forced apply. `None`: it changed meanwhile (read again).
pub async fn apply_over(
    api: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
    installed: Option<&CustomResourceDefinition>,
) -> Result<Option<Outcome>, String> {
    let name = crd.name_any();
    let revision = installed.and_then(|c| c.annotations().get(CRD_REVISION_ANNOTATION)?.parse::<u32>().ok());
    if let Some(newer) = revision.filter(|r| *r > CRD_REVISION) {
        return Ok(Some(Outcome::Newer(newer)));
    }
    let answer = match installed {
        // Made by nobody yet: a create, which fails if somebody made it meanwhile.
        None => within(&format!("creating CRD {name}"), api.create(&PostParams::default(), crd)).await?.map(drop),
        // Server-side apply, forced (the fields are the operator's), on the very copy read: the
        // API server refuses it (409) if the CRD changed since.
        Some(installed) => {
            let mut mine = crd.clone();
            mine.metadata.resource_version = installed.resource_version();
            let params = PatchParams::apply("zklock").force();
            within(&format!("applying CRD {name}"), api.patch(&name, &params, &Patch::Apply(&mine))).await?.map(drop)
        }
    };
    match answer {
        Ok(()) => Ok(Some(Outcome::Applied)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => Err(format!("applying CRD {name}: {e}")),
    }
}

/// `f` within the API deadline; `what` names it in the error.
async fn within<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, String> {
    let deadline = crate::controller::API_TIMEOUT;
    tokio::time::timeout(deadline, f).await.map_err(|_| format!("{what}: no answer within {deadline:?}"))
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
