//! The real kubectl against the server: apply, get (printer columns), patch --subresource,
//! wait, annotate, delete --wait. kubectl comes from ZKLOCK_KUBECTL or .tools/bin/kubectl
//! (scripts/tools.sh); without it this test fails, it never skips.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;
use tokio::process::Command;

fn kubectl_path() -> PathBuf {
    if let Ok(p) = std::env::var("ZKLOCK_KUBECTL") {
        if !p.is_empty() {
            return PathBuf::from(p);
        }
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/kubectl");
    assert!(p.exists(), "kubectl not found at {} and ZKLOCK_KUBECTL is unset: run scripts/tools.sh first", p.display());
    p
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(&self.cache).args(args);
        c.env_remove("KUBECONFIG");
        c.kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().await.unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"))
    }

    /// One field of one object, through `-o jsonpath`.
    async fn field(&self, resource: &str, name: &str, ns: &str, path: &str) -> String {
        self.ok(&["get", resource, name, "-n", ns, "-o", &format!("jsonpath={path}")]).await
    }

    /// Runs kubectl and returns stdout; panics with stderr if it failed.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "kubectl {args:?} failed: {stderr}\n{stdout}");
        assert!(!stderr.to_lowercase().contains("warning"), "kubectl {args:?} warned: {stderr}");
        stdout
    }
}

#[tokio::test]
async fn kubectl_workflow() {
    let bin = kubectl_path();
    let env = env().await;
    let dir = TempDir::new();
    let k = Kubectl { bin, kubeconfig: env.kubeconfig.clone(), cache: dir.0.join("cache") };
    let ns = unique("zkt-kubectl");
    let (crd, manifest) = crd_manifest("Namespaced");
    let write = |name: &str, text: String| {
        let p = dir.0.join(name);
        std::fs::write(&p, text).expect("write manifest");
        p.to_string_lossy().to_string()
    };
    let crd_file = write("crd.json", serde_json::to_string_pretty(&manifest).expect("crd json"));
    let widget_yaml = |size: u32| {
        format!(
            "apiVersion: {}/v1\nkind: Widget\nmetadata:\n  name: w1\n  namespace: {ns}\nspec:\n  size: {size}\n",
            crd.group
        )
    };
    let w_file = write("w1.yaml", widget_yaml(3));

    // Imperative creates go through kubectl's typed clients (protobuf request bodies).
    k.ok(&["create", "namespace", &ns]).await;
    k.ok(&["create", "configmap", "gen", "-n", &ns, "--from-literal=a=1", "--from-literal=b=2"]).await;
    k.ok(&["create", "secret", "generic", "sec", "-n", &ns, "--from-literal=pw=hunter2", "--type=zklock.io/test"])
        .await;
    k.ok(&["create", "serviceaccount", "robot", "-n", &ns]).await;
    assert_eq!(k.field("configmap", "gen", &ns, "{.data.a}{.data.b}").await, "12");
    assert_eq!(k.field("secret", "sec", &ns, "{.type} {.data.pw}").await, "zklock.io/test aHVudGVyMg==");
    assert_eq!(k.field("serviceaccount", "robot", &ns, "{.metadata.name}").await, "robot");
    k.ok(&["apply", "-f", &crd_file]).await;
    k.ok(&["wait", "--for=condition=Established", &format!("crd/{}", crd.name), "--timeout=30s"]).await;
    let out = k.ok(&["apply", "-f", &w_file]).await;
    assert!(out.contains("created"), "{out}");

    // Printer columns, through the short name.
    let out = k.ok(&["get", &crd.short, "-n", &ns]).await;
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.first().cloned(), Some(vec!["NAME", "SIZE", "PHASE", "AGE"]), "{out}");
    assert_eq!(lines.get(1).map(|l| &l[..2]), Some(&["w1", "3"][..]), "{out}");

    // kubectl wait watches with a fieldSelector; start it before the condition exists.
    let waiter = k
        .cmd(&["wait", "--for=condition=Ready", "widget/w1", "-n", &ns, "--timeout=30s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kubectl wait");
    let status = r#"{"status":{"phase":"Ready","conditions":[{"type":"Ready","status":"True","reason":"Test","message":"ok","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;
    let resource = format!("widgets.{}", crd.group);
    k.ok(&["patch", &resource, "w1", "-n", &ns, "--subresource=status", "--type=merge", "-p", status]).await;
    let waited = waiter.wait_with_output().await.expect("kubectl wait");
    assert!(waited.status.success(), "kubectl wait: {}", String::from_utf8_lossy(&waited.stderr));
    assert!(String::from_utf8_lossy(&waited.stdout).contains("condition met"));
    let out = k.ok(&["get", &resource, "w1", "-n", &ns]).await;
    assert!(out.lines().nth(1).is_some_and(|l| l.split_whitespace().nth(2) == Some("Ready")), "{out}");

    k.ok(&["annotate", &resource, "w1", "-n", &ns, "zklock.io/note=hello"]).await;
    // Re-apply with a change: client-side apply patches against last-applied-configuration.
    write("w1.yaml", widget_yaml(5));
    let out = k.ok(&["apply", "-f", &w_file]).await;
    assert!(out.contains("configured"), "{out}");
    let got = k
        .ok(&[
            "get",
            &resource,
            "w1",
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.size} {.metadata.annotations.zklock\\.io/note} {.status.phase} {.metadata.generation}",
        ])
        .await;
    assert_eq!(got, "5 hello Ready 2");

    // A kind the server does not serve fails at REST mapping, not in client-side validation.
    let unknown = write(
        "unknown.yaml",
        format!("apiVersion: nosuch.zklock-test.io/v1\nkind: Nothing\nmetadata:\n  name: x\n  namespace: {ns}\n"),
    );
    let out = k.run(&["apply", "-f", &unknown]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no matches for kind \"Nothing\""), "{err}");

    // Schema violations come back as kubectl errors naming the field.
    let bad = write("bad.yaml", widget_yaml(1000));
    let out = k.run(&["apply", "-f", &bad]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.size"), "{}", String::from_utf8_lossy(&out.stderr));

    // A finalizer keeps the object; delete --wait returns once it is released.
    k.ok(&[
        "patch",
        &resource,
        "w1",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["zklock.io/hold"]}}"#,
    ])
    .await;
    k.ok(&["delete", &resource, "w1", "-n", &ns, "--wait=false"]).await;
    let ts = k.ok(&["get", &resource, "w1", "-n", &ns, "-o", "jsonpath={.metadata.deletionTimestamp}"]).await;
    assert!(!ts.is_empty(), "deletionTimestamp set while the finalizer holds");
    // --cascade=foreground makes kubectl's DELETE a write (foregroundDeletion is added, then
    // dropped by the garbage collector), so a new resourceVersion shows the waiter is in place.
    let before = k.field(&resource, "w1", &ns, "{.metadata.resourceVersion}").await;
    let deleter = k
        .cmd(&["delete", &resource, "w1", "-n", &ns, "--cascade=foreground", "--wait=true", "--timeout=30s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kubectl delete");
    eventually(30, "kubectl delete issued", || async {
        (k.field(&resource, "w1", &ns, "{.metadata.resourceVersion}").await != before).then_some(())
    })
    .await;
    k.ok(&[
        "patch",
        &resource,
        "w1",
        "-n",
        &ns,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers/0"}]"#,
    ])
    .await;
    let deleted = deleter.wait_with_output().await.expect("kubectl delete");
    assert!(deleted.status.success(), "kubectl delete --wait: {}", String::from_utf8_lossy(&deleted.stderr));
    let out = k.run(&["get", &resource, "w1", "-n", &ns]).await;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"), "w1 is gone");

    // Built-in kinds through client-side apply (strategic merge patch on the second apply).
    let cm = |v: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: {ns}\ndata:\n  key: \"{v}\"\n")
    };
    let cm_file = write("cm.yaml", cm("one"));
    k.ok(&["apply", "-f", &cm_file]).await;
    write("cm.yaml", cm("two"));
    k.ok(&["apply", "-f", &cm_file]).await;
    assert_eq!(k.ok(&["get", "configmap", "cfg", "-n", &ns, "-o", "jsonpath={.data.key}"]).await, "two");

    k.ok(&["delete", "crd", &crd.name, "--wait=true", "--timeout=60s"]).await;
    k.ok(&["delete", "namespace", &ns, "--wait=true", "--timeout=60s"]).await;
}
