//! The `kube-sandbox` binary: flags, kubeconfig output, --crd-dir, and a clean exit on SIGTERM
//! even with a watch open.

mod common;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::WatchParams;
use kube::Api;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

const CRD_YAML: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.cli.zklock-test.io
spec:
  group: cli.zklock-test.io
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
---
# a second document that is not a CRD is ignored
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
"#;

#[tokio::test]
async fn binary_serves_crd_dir_and_exits_on_sigterm() {
    let dir = TempDir::new();
    let crds = dir.0.join("crds");
    std::fs::create_dir_all(&crds).expect("crd dir");
    std::fs::write(crds.join("gadgets.yaml"), CRD_YAML).expect("crd file");
    let kc = dir.0.join("kubeconfig");
    let started = std::time::Instant::now();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sandbox"))
        .args(["--port", "0", "--kubeconfig-out"])
        .arg(&kc)
        .arg("--crd-dir")
        .arg(&crds)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kube-sandbox");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let url = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("URL printed in time")
        .expect("read stdout")
        .expect("a line");
    eprintln!("kube-sandbox printed {url} after {:?}", started.elapsed());
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let kubeconfig = std::fs::read_to_string(&kc).expect("kubeconfig written");
    assert!(kubeconfig.contains(&url) && kubeconfig.contains("token:"), "{kubeconfig}");

    let client = client_for(&kc).await;
    let ar = kube::api::ApiResource {
        group: "cli.zklock-test.io".into(),
        version: "v1".into(),
        api_version: "cli.zklock-test.io/v1".into(),
        kind: "Gadget".into(),
        plural: "gadgets".into(),
    };
    let gadgets: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    gadgets.list(&Default::default()).await.expect("CRD from --crd-dir is served");

    // An open watch must not keep the server from exiting.
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut watch = cms.watch(&WatchParams::default(), "0").await.expect("watch").boxed();
    let pid = child.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10s of SIGTERM")
        .expect("wait");
    assert!(status.success(), "clean exit: {status:?}");
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = watch.next().await {
            if ev.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the watch ends when the server exits");
}

#[tokio::test]
async fn bad_flags_are_usage_errors() {
    let out =
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sandbox")).arg("--bogus").output().await.expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_stalled_watch_client() {
    use tokio::io::AsyncWriteExt;
    let sb = kube_sandbox::Sandbox::start(kube_sandbox::Options::default()).await.expect("start");
    let dir = TempDir::new();
    let kc = dir.0.join("kubeconfig");
    std::fs::write(&kc, sb.kubeconfig()).expect("kubeconfig");
    let client = client_for(&kc).await;
    // A watcher that never reads its response.
    let mut stalled = tokio::net::TcpStream::connect(sb.addr()).await.expect("connect");
    stalled
        .write_all(b"GET /api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send watch");
    // Enough events to fill the socket buffers and the watch's queue.
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let payload = "x".repeat(4096);
    for i in 0..1500 {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("fill-{i}")}, "data": {"p": payload}
        }))
        .expect("configmap");
        cms.create(&Default::default(), &cm).await.expect("create");
    }
    tokio::time::timeout(Duration::from_secs(15), sb.shutdown())
        .await
        .expect("shutdown finishes despite the stalled client");
    drop(stalled);
}
