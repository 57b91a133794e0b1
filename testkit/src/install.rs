//! zklock's CRDs and admission policies installed on a test's (or a benchmark's) API server,
//! each awaited until it is in force: the kinds served and creatable, the finalizer policy
//! putting the finalizer on a new claim. One copy for the tests and the benchmarks, so that a
//! wait one of them learned is not missing in the other.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::Api;
use serde_json::json;
use zklock_api::{Lock, LockClaim};

/// How long any of these waits for the API server.
const PATIENCE: Duration = Duration::from_secs(60);

/// Creates (or updates) the CRDs from `crds/` (server-side apply, so that callers running at
/// once meet without conflicts) and waits until their kinds are served and creatable.
pub async fn crds(client: &kube::Client, manager: &str) -> Result<(), String> {
    let apply = PatchParams::apply(manager).force();
    for (file, _) in zklock_api::crds() {
        let name = file.trim_end_matches(".yaml");
        let path = crate::workspace_root().join("crds").join(file);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.patch(name, &apply, &Patch::Apply(&crd)).await.map_err(|e| format!("apply the CRD {name}: {e}"))?;
        let established = await_condition(crds, name, kube::runtime::conditions::is_crd_established());
        tokio::time::timeout(PATIENCE, established)
            .await
            .map_err(|_| format!("the CRD {name} is not established within {PATIENCE:?}"))?
            .map_err(|e| format!("watch the CRD {name}: {e}"))?;
    }
    // Established is not yet served: for a moment after a CRD's first install, kube-apiserver
    // answers its kinds with 503 ("there can be a delay…"), which a user's kubectl, unlike the
    // operator, does not retry. Nothing announces the end of that moment: ask until served.
    let served = async {
        let lists = ListParams::default().limit(1);
        loop {
            let claims = Api::<LockClaim>::all(client.clone()).list_metadata(&lists).await;
            let locks = Api::<Lock>::all(client.clone()).list_metadata(&lists).await;
            match (claims, locks) {
                (Ok(_), Ok(_)) => return Ok(()),
                (Err(kube::Error::Api(e)), _) | (_, Err(kube::Error::Api(e))) if e.code == 503 || e.code == 404 => {}
                (Err(e), _) | (_, Err(e)) => return Err(format!("list the new kinds: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(PATIENCE, served).await.map_err(|_| "the CRDs' kinds are not served".to_string())??;
    // Listed is not yet creatable: admission (the admission policies' matching) resolves kinds
    // through a mapper of its own, refreshed a little later, and answers a create of the new
    // kind with 503 ("Resource kind … not found") until then; a user's kubectl does not retry.
    let creatable = async {
        let probe = probe_claim("zklock-tests-probe");
        let dry_run = PostParams { dry_run: true, ..PostParams::default() };
        loop {
            match Api::<LockClaim>::namespaced(client.clone(), "default").create(&dry_run, &probe).await {
                Err(kube::Error::Api(e)) if e.code == 503 || e.code == 404 => {}
                // Made (dry run), or refused for a reason of its own (it exists): admission knows the kind.
                _ => return,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(PATIENCE, creatable).await.map_err(|_| "the CRDs' kinds cannot be created".to_string())
}

/// The finalizer's admission policy (as the chart installs it), and binding `name` for
/// `namespaces`. It returns before the API server applies them: see [`finalizer_policy_in_force`].
pub async fn finalizer_policy(
    client: &kube::Client,
    manager: &str,
    name: &str,
    namespaces: &[String],
) -> Result<(), String> {
    use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
    use zklock_api::finalizer_policy::{finalizer_policy, finalizer_policy_binding, FINALIZER_POLICY};
    let apply = PatchParams::apply(manager).force();
    let policies: Api<MutatingAdmissionPolicy> = Api::all(client.clone());
    let policy = finalizer_policy(FINALIZER_POLICY);
    policies
        .patch(FINALIZER_POLICY, &apply, &Patch::Apply(&policy))
        .await
        .map_err(|e| format!("install the finalizer policy: {e}"))?;
    let bindings: Api<MutatingAdmissionPolicyBinding> = Api::all(client.clone());
    let binding = finalizer_policy_binding(name, FINALIZER_POLICY, namespaces);
    bindings
        .patch(name, &apply, &Patch::Apply(&binding))
        .await
        .map_err(|e| format!("install the finalizer policy's binding: {e}"))?;
    Ok(())
}

/// Waits until a claim created in `namespace` gets the operator's finalizer from the policy: a
/// dry-run create shows it.
pub async fn finalizer_policy_in_force(client: &kube::Client, namespace: &str) -> Result<(), String> {
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), namespace);
    let probe = probe_claim("probe");
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let deadline = Instant::now() + PATIENCE;
    loop {
        let made = claims.create(&dry_run, &probe).await.map_err(|e| format!("dry-run a claim: {e}"))?;
        if made.metadata.finalizers.iter().flatten().any(|f| f == zklock_api::FINALIZER) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the finalizer policy did not take effect in {namespace} within {PATIENCE:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates (or updates) the epoch policy and a binding `name` for `namespaces`, whose
/// parameter lives in `param_namespace`. It returns before the API server enforces them (its
/// policy cache follows within a second or so): a test that needs the refusal awaits it.
pub async fn epoch_policy(
    client: &kube::Client,
    manager: &str,
    name: &str,
    param_namespace: &str,
    namespaces: &[String],
) -> Result<(), String> {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    use zklock_api::epoch_policy::{epoch_policy, epoch_policy_binding, EPOCH_PARAM, EPOCH_POLICY};
    let apply = PatchParams::apply(manager).force();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let policy = epoch_policy(EPOCH_POLICY);
    policies
        .patch(EPOCH_POLICY, &apply, &Patch::Apply(&policy))
        .await
        .map_err(|e| format!("install the epoch policy: {e}"))?;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let binding = epoch_policy_binding(name, EPOCH_POLICY, EPOCH_PARAM, param_namespace, namespaces);
    bindings
        .patch(name, &apply, &Patch::Apply(&binding))
        .await
        .map_err(|e| format!("install the epoch policy's binding: {e}"))?;
    Ok(())
}

/// Creates (or updates) the fencing policies and their bindings, named `name` and
/// `<name>-cluster-locks`, for objects of `namespaces`: the Locks' parameter is
/// ConfigMap `param` in each object's namespace, the ClusterLocks' `<param>-cluster-locks` in
/// `param_namespace` (the operator's). Returns the four objects' (resource, name), for the
/// caller to delete. The API server enforces them a moment later: the operator proves it
/// before its first grant of a fenced lock.
pub async fn fencing_policy(
    client: &kube::Client,
    manager: &str,
    (name, param): (&str, &str),
    param_namespace: &str,
    namespaces: &[String],
) -> Result<Vec<(&'static str, String)>, String> {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    let (policies, bindings) = zklock_api::fencing_policy::fencing_policies(name, param, param_namespace, namespaces);
    let apply = PatchParams::apply(manager).force();
    let mut made = vec![];
    let policy_api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for policy in &policies {
        let name = policy.metadata.name.clone().unwrap_or_default();
        made.push(("validatingadmissionpolicy", name.clone()));
        policy_api
            .patch(&name, &apply, &Patch::Apply(policy))
            .await
            .map_err(|e| format!("install fencing policy {name}: {e}"))?;
    }
    let binding_api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    for binding in &bindings {
        let name = binding.metadata.name.clone().unwrap_or_default();
        made.push(("validatingadmissionpolicybinding", name.clone()));
        binding_api
            .patch(&name, &apply, &Patch::Apply(binding))
            .await
            .map_err(|e| format!("install fencing binding {name}: {e}"))?;
    }
    Ok(made)
}

/// A claim to dry-run creates with.
fn probe_claim(name: &str) -> LockClaim {
    // A literal that matches the type: it cannot fail to decode.
    serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim", "metadata": { "name": name }, "spec": { "lockName": "probe" },
    }))
    .unwrap_or_else(|e| panic!("the probe claim: {e}"))
}
