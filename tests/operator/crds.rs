//! The operator brings zklock's CRDs to its own revision when it starts (Helm never upgrades a
//! chart's `crds/`), and leaves a CRD of a later revision alone. On a control plane of this
//! process: the test changes CRDs, which every other test's claims depend on.

use crate::e2e_support;

use e2e_support::{until, Env, Operator};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{PostParams, ResourceExt};
use kube::Api;
use serde_json::json;
use zklock::api::{LockClaim, Phase, CRD_REVISION, CRD_REVISION_ANNOTATION};

/// Replaces CRD `name` with what `change` makes of it (a PUT: every field as given).
async fn replace(crds: &Api<CustomResourceDefinition>, name: &str, change: impl Fn(&mut serde_json::Value)) {
    let current = crds.get(name).await.unwrap_or_else(|e| panic!("get CRD {name}: {e}"));
    let mut value = serde_json::to_value(&current).unwrap();
    change(&mut value);
    let changed: CustomResourceDefinition = serde_json::from_value(value).unwrap();
    crds.replace(name, &PostParams::default(), &changed).await.unwrap_or_else(|e| panic!("replace CRD {name}: {e}"));
}

/// What the API server keeps of a claim over two locks, created as a dry run.
async fn kept_of_two_locks(env: &Env) -> serde_json::Value {
    let claim: LockClaim = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
        "metadata": { "name": "probe" }, "spec": { "locks": [{ "lockName": "a" }, { "lockName": "b" }] },
    }))
    .unwrap();
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    match env.claims.create(&dry_run, &claim).await {
        Ok(kept) => serde_json::to_value(&kept.spec).unwrap(),
        Err(e) => json!({ "refused": e.to_string() }),
    }
}

#[tokio::test]
async fn an_upgraded_operator_brings_an_older_crd_to_its_revision_and_leaves_a_later_one_alone() {
    let kubeconfig = zklock_testkit::kube::private_control_plane("crd-upgrade");
    let env = Env::on(kubeconfig, zklock_testkit::ZkServer::shared().chroot().await, true).await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    // The claims' CRD as a release before `spec.locks` had it: no `locks` (nor `clusterLockName`),
    // no rule that names them, revision 1.
    replace(&crds, "lockclaims.zklock.io", |crd| {
        let spec = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let properties = spec["properties"].as_object_mut().unwrap();
        properties.remove("locks");
        properties.remove("clusterLockName");
        spec.as_object_mut().unwrap().remove("x-kubernetes-validations");
        crd["metadata"]["annotations"][CRD_REVISION_ANNOTATION] = json!("1");
    })
    .await;
    until("the old schema to be served (spec.locks pruned)", || async {
        kept_of_two_locks(&env).await.get("locks").is_none()
    })
    .await;
    // The Lock CRD of a later zklock (a rollback): not to be touched.
    let later = (CRD_REVISION + 1).to_string();
    replace(&crds, "locks.zklock.io", |crd| {
        crd["metadata"]["annotations"][CRD_REVISION_ANNOTATION] = json!(later);
        crd["spec"]["versions"][0]["additionalPrinterColumns"][0]["name"] = json!("PermitsOfALaterRelease");
    })
    .await;

    let op = Operator::start(&env, &[]);
    until("the operator to bring the claims' CRD to its revision", || async {
        let crd = crds.get("lockclaims.zklock.io").await.unwrap();
        crd.annotations().get(CRD_REVISION_ANNOTATION) == Some(&CRD_REVISION.to_string())
    })
    .await;
    until("spec.locks to be kept again", || async { kept_of_two_locks(&env).await.get("locks").is_some() }).await;
    env.claim_spec("two", json!({ "locks": [{ "lockName": "a" }, { "lockName": "b" }] })).await;
    let two = env.wait_phase("two", Phase::Held).await;
    assert_eq!(two.spec.locks.map(|l| l.len()), Some(2), "the claim kept both locks");

    let locks = crds.get("locks.zklock.io").await.unwrap();
    assert_eq!(locks.annotations().get(CRD_REVISION_ANNOTATION), Some(&(CRD_REVISION + 1).to_string()));
    let columns = locks.spec.versions[0].additional_printer_columns.clone().unwrap_or_default();
    assert_eq!(columns[0].name, "PermitsOfALaterRelease", "a later revision is left as it is");
    let log = std::fs::read_to_string(&op.log).unwrap_or_default();
    assert!(log.contains("a later revision of this CRD is installed"), "the operator says why:\n{log}");
}

/// Two operator versions starting at once (a rollout or a rollback; Argo CD applying the
/// chart's CRDs): each reads the CRD's revision, then applies its own. An apply decided on a
/// copy that a later revision has replaced since is refused, read again, and the later revision
/// left alone — never taken back by an earlier version's forced apply (issue 53).
#[tokio::test]
async fn an_apply_decided_on_a_copy_replaced_since_by_a_later_revision_takes_nothing_back() {
    use zklock::operator::crds::{apply, apply_over, Outcome};
    let kubeconfig = zklock_testkit::kube::private_control_plane("crd-race");
    let env = Env::on(kubeconfig, zklock_testkit::ZkServer::shared().chroot().await, true).await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let name = "lockclaims.zklock.io";
    let read_before = crds.get(name).await.expect("the claims' CRD");
    // A later zklock applies its revision between this version's read and its write.
    let later = (CRD_REVISION + 1).to_string();
    replace(&crds, name, |crd| crd["metadata"]["annotations"][CRD_REVISION_ANNOTATION] = json!(later)).await;
    let mine = zklock::api::crd_objects().into_iter().map(|(_, c)| c).find(|c| c.name_any() == name).unwrap();
    let answer = apply_over(&crds, &mine, Some(&read_before)).await.expect("an answer");
    assert_eq!(answer, None, "refused: the CRD changed since it was read");
    let now = crds.get(name).await.unwrap();
    assert_eq!(now.annotations().get(CRD_REVISION_ANNOTATION), Some(&later), "the later revision stands");
    // Read again, it is left alone.
    let done = apply(&env.client).await.expect("apply");
    assert!(done.iter().any(|(n, o)| n == name && *o == Outcome::Newer(CRD_REVISION + 1)), "{done:?}");
    // This test's control plane only: back to this build's revision for nobody after it.
    replace(&crds, name, |crd| {
        crd["metadata"]["annotations"][CRD_REVISION_ANNOTATION] = json!(CRD_REVISION.to_string())
    })
    .await;
}
