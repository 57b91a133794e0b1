//! Throws a few thousand random (mostly malformed) requests at an in-process kube-sandbox:
//! every one must get an HTTP answer (a panic would drop the connection) with a 2xx or a
//! client-error Status, and the server must keep working afterwards.

mod common;

use futures::StreamExt;
use serde_json::{json, Value};

/// xorshift64*: deterministic, so a failure names the seed that reproduces it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    fn word(&mut self, xs: &[&'static str]) -> &'static str {
        xs[self.below(xs.len())]
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
}

const SEGMENTS: &[&str] = &[
    "api",
    "apis",
    "v1",
    "v2",
    "namespaces",
    "default",
    "kube-system",
    "pods",
    "configmaps",
    "secrets",
    "events",
    "serviceaccounts",
    "leases",
    "coordination.k8s.io",
    "events.k8s.io",
    "apiextensions.k8s.io",
    "customresourcedefinitions",
    "status",
    "finalize",
    "x",
    "a.b",
    "..",
    "%2F",
    "%00",
    "UPPER",
    "watch",
    "",
    "widgets",
    "fuzz.zklock-test.io",
    "openapi",
    "v3",
];

fn random_string(r: &mut Rng) -> String {
    let pool = ["a", "b", "-", ".", "Z", "_", "/", "é", "0", " ", "\"", "\\", "{", "~"];
    (0..r.below(12)).map(|_| *r.pick(&pool)).collect()
}

fn random_value(r: &mut Rng, depth: u32) -> Value {
    match r.below(if depth > 3 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => json!(r.chance(50)),
        2 => json!(r.next() as i64),
        3 => json!(random_string(r)),
        4 => json!(-1.5),
        5 => Value::Array((0..r.below(4)).map(|_| random_value(r, depth + 1)).collect()),
        _ => {
            let keys = [
                "metadata",
                "name",
                "namespace",
                "labels",
                "annotations",
                "finalizers",
                "ownerReferences",
                "spec",
                "status",
                "data",
                "kind",
                "apiVersion",
                "resourceVersion",
                "generateName",
                "uid",
                "size",
            ];
            let mut m = serde_json::Map::new();
            for _ in 0..r.below(5) {
                m.insert(r.pick(&keys).to_string(), random_value(r, depth + 1));
            }
            Value::Object(m)
        }
    }
}

fn random_body(r: &mut Rng, hint: Option<(&str, &str)>) -> Vec<u8> {
    let kinds = ["ConfigMap", "Pod", "Secret", "Lease", "Namespace", "Widget", "CustomResourceDefinition", "Event"];
    match r.below(6) {
        0 => Vec::new(),
        1 => b"{not json".to_vec(),
        2 => (0..r.below(64)).map(|_| r.next() as u8).collect(),
        3 => serde_json::to_vec(&random_value(r, 0)).unwrap_or_default(),
        _ => {
            let mut obj = json!({
                "apiVersion": r.pick(&["v1", "coordination.k8s.io/v1", "fuzz.zklock-test.io/v1", "apiextensions.k8s.io/v1", "bogus"]),
                "kind": r.pick(&kinds),
                "metadata": {"name": r.pick(&["f1", "f2", "Bad", "", "a.b"]), "labels": {"k": "v"}},
            });
            for _ in 0..r.below(4) {
                let key = *r.pick(&["spec", "status", "data", "metadata", "stringData", "type"]);
                obj[key] = random_value(r, 1);
            }
            if let Some((av, kind)) = hint.filter(|_| r.chance(75)) {
                obj["apiVersion"] = json!(av);
                obj["kind"] = json!(kind);
            }
            if r.chance(30) {
                if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.insert("finalizers".into(), json!(["zklock.io/f"]));
                }
            }
            serde_json::to_vec(&obj).unwrap_or_default()
        }
    }
}

fn random_request(r: &mut Rng) -> Option<http::Request<Vec<u8>>> {
    let method = *r.pick(&["GET", "GET", "POST", "PUT", "PATCH", "DELETE"]);
    let mut path = String::new();
    let mut hint = None;
    if r.chance(80) {
        // Mostly well-formed resource paths, so requests reach the verbs, not just routing.
        let (prefix, plural, namespaced, av, kind) = *r.pick(&[
            ("/api/v1", "configmaps", true, "v1", "ConfigMap"),
            ("/api/v1", "pods", true, "v1", "Pod"),
            ("/api/v1", "secrets", true, "v1", "Secret"),
            ("/api/v1", "events", true, "v1", "Event"),
            ("/api/v1", "serviceaccounts", true, "v1", "ServiceAccount"),
            ("/api/v1", "namespaces", false, "v1", "Namespace"),
            ("/apis/coordination.k8s.io/v1", "leases", true, "coordination.k8s.io/v1", "Lease"),
            ("/apis/events.k8s.io/v1", "events", true, "events.k8s.io/v1", "Event"),
            ("/apis/fuzz.zklock-test.io/v1", "widgets", true, "fuzz.zklock-test.io/v1", "Widget"),
            (
                "/apis/apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                false,
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
            ),
        ]);
        hint = Some((av, kind));
        path.push_str(prefix);
        if namespaced && r.chance(85) {
            path.push_str("/namespaces/");
            path.push_str(r.word(&["default", "fuzz", "fuzz", "nope"]));
        }
        path.push('/');
        path.push_str(plural);
        if r.chance(70) {
            path.push('/');
            path.push_str(r.word(&["f1", "f1", "f2", "fuzz", "default", "Bad", "a.b", "widgets.fuzz.zklock-test.io"]));
            if r.chance(30) {
                path.push('/');
                path.push_str(r.word(&["status", "finalize", "scale", "x"]));
            }
        }
    } else {
        path.push_str(r.word(&[
            "/api/v1",
            "/apis/coordination.k8s.io/v1",
            "/apis/fuzz.zklock-test.io/v1",
            "",
            "/apis",
        ]));
        for _ in 0..r.below(5) {
            path.push('/');
            path.push_str(r.word(SEGMENTS));
        }
    }
    let mut q = Vec::new();
    for _ in 0..r.below(4) {
        let (k, vals): (&str, &[&str]) = *r.pick(&[
            ("labelSelector", &["a=b", "a in (b", "!a", "a notin (x,y)", "=", "a==b,c!=d"][..]),
            ("fieldSelector", &["metadata.name=f1", "status.phase=Running", "bogus=1", "x"][..]),
            ("limit", &["1", "-3", "abc", "1000000000000000000000"][..]),
            ("continue", &["garbage", "5.00.00", "1.6465.6631"][..]),
            ("resourceVersion", &["0", "1", "abc", "99999999999", "-1"][..]),
            ("resourceVersionMatch", &["Exact", "NotOlderThan", "bogus"][..]),
            ("watch", &["true", "1", "false"][..]),
            ("propagationPolicy", &["Orphan", "Foreground", "Nope"][..]),
            ("dryRun", &["All", "x"][..]),
            ("fieldValidation", &["Strict", "Warn", "Ignore"][..]),
            ("sendInitialEvents", &["true"][..]),
            ("allowWatchBookmarks", &["true"][..]),
        ]);
        q.push(format!(
            "{k}={}",
            r.pick(vals).replace(' ', "%20").replace('(', "%28").replace(')', "%29").replace('!', "%21")
        ));
    }
    // Watches must end on their own so the run finishes.
    q.push("timeoutSeconds=1".into());
    let uri = format!("{path}?{}", q.join("&"));
    let ct = *r.pick(&[
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "application/yaml",
        "text/plain",
        "application/vnd.kubernetes.protobuf",
    ]);
    let accept = *r.pick(&[
        "application/json",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        "*/*",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
    ]);
    http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ct)
        .header("accept", accept)
        .body(random_body(r, hint))
        .ok()
}

const CRD: &str = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.fuzz.zklock-test.io"},
 "spec":{"group":"fuzz.zklock-test.io","scope":"Namespaced","names":{"plural":"widgets","kind":"Widget"},
 "versions":[{"name":"v1","served":true,"storage":true,"subresources":{"status":{}},
 "schema":{"openAPIV3Schema":{"type":"object","properties":{"spec":{"type":"object","properties":{"size":{"type":"integer","minimum":0}}},
 "status":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}}}]}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_requests_never_crash_the_server() {
    // Always the in-process sandbox: this is about our server's robustness, not a contract.
    let sb = kube_sandbox::Sandbox::start(kube_sandbox::Options::default()).await.expect("start");
    let dir = common::TempDir::new();
    let path = dir.0.join("kubeconfig");
    std::fs::write(&path, sb.kubeconfig()).expect("kubeconfig");
    let client = common::client_for(&path).await;
    let crd_req = http::Request::post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        .header("content-type", "application/json")
        .body(CRD.as_bytes().to_vec())
        .expect("crd request");
    client.request_text(crd_req).await.expect("create fuzz CRD");
    let ns_req = http::Request::post("/api/v1/namespaces")
        .header("content-type", "application/json")
        .body(br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"fuzz"}}"#.to_vec())
        .expect("ns");
    client.request_text(ns_req).await.expect("create fuzz namespace");

    let seed = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_cafe_u64);
    let mut rng = Rng(seed);
    let requests: Vec<_> = (0..3000).filter_map(|_| random_request(&mut rng)).collect();
    assert!(requests.len() > 2500, "most generated requests are sendable");
    let results: Vec<(String, Result<u16, String>)> = futures::stream::iter(requests)
        .map(|req| {
            let client = client.clone();
            let desc = format!("{} {}", req.method(), req.uri());
            async move {
                let r = match client.request_text(req).await {
                    Ok(_) => Ok(200),
                    Err(kube::Error::Api(s))
                        if s.code >= 500 && !s.message.contains("resourceVersion should not be set") =>
                    {
                        Err(format!("server error {}: {}", s.code, s.message))
                    }
                    Err(kube::Error::Api(s)) => Ok(s.code),
                    // Non-Status bodies on errors would be a bug too, as would a dropped connection.
                    Err(e) => Err(format!("no proper answer: {e}")),
                };
                (desc, r)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let failures: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(
        failures.is_empty(),
        "seed {seed:#x}: {} bad answers, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let mut codes = std::collections::BTreeMap::new();
    for (_, r) in &results {
        if let Ok(c) = r {
            *codes.entry(*c).or_insert(0) += 1;
        }
    }
    eprintln!("status codes: {codes:?}");
    if std::env::var("FUZZ_SHOW").is_ok() {
        for (d, r) in results.iter().take(40) {
            eprintln!("{r:?} {d}");
        }
    }
    assert!(codes.keys().any(|c| *c >= 400), "the fuzz reaches error paths");
    assert!(codes.contains_key(&200), "and some requests succeed");
    // Still healthy.
    let v = client.apiserver_version().await.expect("server still answers");
    assert_eq!(v.major, "1");
    let list = http::Request::get("/api/v1/namespaces").body(vec![]).expect("req");
    client.request_text(list).await.expect("server still lists");
    sb.shutdown().await;
}
