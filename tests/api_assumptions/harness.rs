//! The suite's harness: a client for the API server under test (`zklock_testkit::kube`: the
//! project's control plane, or `ZKLOCK_TEST_KUBECONFIG`; never the user's default kubeconfig),
//! fresh namespaces and CRDs of unique names, and waits with deadlines.

use kube::Client;
use serde_json::{json, Value};
use std::future::Future;
use std::time::Duration;

pub struct Env {
    pub client: Client,
}

pub async fn env() -> Env {
    Env { client: zklock_testkit::kube::client().await }
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// Polls `f` until it yields Some, or panics after `secs` seconds with `what`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {secs}s waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A fresh namespace, deleted (best effort) when the guard is dropped.
pub struct Ns {
    pub name: String,
    client: Client,
}

impl Drop for Ns {
    fn drop(&mut self) {
        let client = self.client.clone();
        let name = self.name.clone();
        // Best-effort cleanup so runs against a shared cluster leave nothing behind.
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
                let _ = api.delete(&name, &Default::default()).await;
            });
        }
    }
}

pub async fn namespace(client: &Client) -> Ns {
    use k8s_openapi::api::core::v1::Namespace;
    let name = unique("zkt");
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace json");
    api.create(&Default::default(), &ns).await.expect("create namespace");
    Ns { name, client: client.clone() }
}

/// A uniquely named namespaced CRD `widgets.<random>.zklock-test.io` with a status
/// subresource, printer columns, short name and a schema with defaults and limits.
pub struct Crd {
    pub group: String,
    pub plural: String,
    pub kind: String,
    pub name: String,
    pub short: String,
}

pub fn crd_manifest(scope: &str) -> (Crd, Value) {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let group = format!("t{tag}.zklock-test.io");
    let plural = "widgets".to_string();
    let kind = "Widget".to_string();
    let short = format!("wg{tag}");
    let name = format!("{plural}.{group}");
    let manifest = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"plural": plural, "singular": "widget", "kind": kind, "shortNames": [short], "categories": ["zklock-test"]},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 0, "maximum": 100},
                                "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                                "label": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 10}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "phase": {"type": "string"},
                                "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                            }
                        }
                    }
                }}
            }]
        }
    });
    (Crd { group, plural, kind, name, short }, manifest)
}

/// Creates the CRD and waits until it is Established and its resource is served.
pub async fn install_crd(client: &Client, scope: &str) -> Crd {
    let (crd, manifest) = crd_manifest(scope);
    install_crd_manifest(client, crd, manifest).await
}

/// Creates a CRD from a (possibly modified) `crd_manifest` and waits until it is served.
pub async fn install_crd_manifest(client: &Client, crd: Crd, manifest: Value) -> Crd {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    let obj: CustomResourceDefinition = serde_json::from_value(manifest).expect("crd json");
    api.create(&Default::default(), &obj).await.expect("create CRD");
    let name = crd.name.clone();
    eventually(20, "CRD Established", || {
        let api = api.clone();
        let name = name.clone();
        async move {
            let c = api.get(&name).await.ok()?;
            let est = c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
            est.then_some(())
        }
    })
    .await;
    let dyn_api = widgets_all(client, &crd);
    eventually(20, "custom resource served", || {
        let a = dyn_api.clone();
        async move { a.list(&Default::default()).await.ok().map(|_| ()) }
    })
    .await;
    crd
}

pub fn resource(crd: &Crd) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: crd.group.clone(),
        version: "v1".into(),
        api_version: format!("{}/v1", crd.group),
        kind: crd.kind.clone(),
        plural: crd.plural.clone(),
    }
}

pub fn widgets(client: &Client, crd: &Crd, ns: &str) -> kube::Api<kube::api::DynamicObject> {
    kube::Api::namespaced_with(client.clone(), ns, &resource(crd))
}

pub fn widgets_all(client: &Client, crd: &Crd) -> kube::Api<kube::api::DynamicObject> {
    kube::Api::all_with(client.clone(), &resource(crd))
}

pub fn widget(crd: &Crd, name: &str, spec: Value) -> kube::api::DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{}/v1", crd.group),
        "kind": crd.kind,
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("widget json")
}

pub async fn remove_crd(client: &Client, crd: &Crd) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    let _ = api.delete(&crd.name, &Default::default()).await;
}

/// The API error (code, reason, full Status) of a failed call; panics if it succeeded.
pub fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn rv_num(obj_rv: Option<String>) -> u64 {
    obj_rv.expect("resourceVersion").parse().expect("numeric resourceVersion")
}
