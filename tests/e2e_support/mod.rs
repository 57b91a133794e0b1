//! End-to-end harness: the real `zklock` binary as the operator, real ZooKeeper, the Kubernetes
//! API under test (the project's control plane, or `ZKLOCK_TEST_KUBECONFIG`), and a history of every claim
//! status change, checked against the invariants of docs/design.md: safety.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use zklock::api::{conditions, LockClaim, Phase};

pub const PATIENCE: Duration = Duration::from_secs(60);

/// Awaits `f()` being true, asked every 100 ms, for at most [`PATIENCE`]; panics with `what`.
pub async fn until<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tokio::time::timeout(PATIENCE, async {
        loop {
            tick.tick().await;
            if f().await {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {PATIENCE:?} waiting for {what}"));
}

pub struct Env {
    pub client: kube::Client,
    /// The kubeconfig of the API server this environment lives on.
    pub kubeconfig: PathBuf,
    /// The kubeconfig it was made with (the admin's, whatever `with_kubeconfig` sets later).
    made_with: PathBuf,
    pub ns: String,
    /// ZooKeeper connect string with this test's chroot.
    pub zk: String,
    pub claims: Api<LockClaim>,
    pub pods: Api<Pod>,
    pub history: History,
    _history_task: tokio::task::JoinHandle<()>,
}

/// What a test made in the API server goes with it, passed or failed: its namespaces (every one
/// named after its own, their claims' finalizers taken off first, since no operator is left to
/// take them) and the admission bindings named after it. Waits for nothing.
impl Drop for Env {
    fn drop(&mut self) {
        let script = r#"
            k() { "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" --request-timeout=10s "$@"; }
            for n in $(k get namespaces -o name | sed 's|^namespace/||' | grep "^$NS"); do
              k -n "$n" get lockclaims -o name | xargs -r -n 20 "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" \
                --request-timeout=10s -n "$n" patch --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null
              k delete namespace "$n" --wait=false >/dev/null
            done
            k get validatingadmissionpolicybindings,mutatingadmissionpolicybindings -o name 2>/dev/null | grep -- "$NS" \
              | xargs -r "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" --request-timeout=10s delete --ignore-not-found >/dev/null
        "#;
        // (kubectl is there: every environment's test ran it or could have; a panic here,
        // during a failed test's unwinding, would abort the run instead.)
        let Ok(kubectl) = std::panic::catch_unwind(zklock_testkit::kube::kubectl) else { return };
        let cleaned = Command::new("bash")
            .args(["-c", script])
            .env("KUBECTL", kubectl)
            .env("KUBECONFIG_PATH", &self.made_with)
            .env("NS", &self.ns)
            .stdout(Stdio::null())
            .status();
        if !matches!(cleaned, Ok(status) if status.success()) {
            eprintln!("cleaning up after namespace {} did not finish: {cleaned:?}", self.ns);
        }
    }
}

impl Env {
    /// Runs the real kubectl in the test's namespace; its stdout (panics, with stderr, on
    /// failure). Every call must bound its own wait (`--timeout` for `kubectl wait`).
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new(zklock_testkit::kube::kubectl())
            .args(["--kubeconfig", &self.kubeconfig.display().to_string(), "-n", &self.ns])
            .args(args)
            .output()
            .expect("run kubectl");
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub async fn new() -> Env {
        Self::with_zk(zklock_testkit::ZkServer::shared().chroot().await).await
    }

    pub async fn with_zk(zk: String) -> Env {
        Self::on(zklock_testkit::kube::kubeconfig(), zk, true).await
    }

    /// An environment on the API server of `kubeconfig`, with ZooKeeper at `zk`. `binding`: the
    /// epoch policy's binding for this namespace, as an installation of the chart serving it
    /// would have (a test that installs the chart's own passes false).
    pub async fn on(kubeconfig: &std::path::Path, zk: String, binding: bool) -> Env {
        let client = zklock_testkit::kube::client_for(kubeconfig).await;
        install_crd(&client).await;
        let ns = format!("zklock-e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        namespaces.create(&PostParams::default(), &namespace).await.expect("create the test namespace");
        if binding && epoch_policy() {
            // As the chart does for an installation: the operators of this test keep their
            // epoch in the test's namespace (their lease namespace) and serve only it.
            install_epoch_policy(&client, &format!("zklock-leader-epoch-{ns}"), &ns, std::slice::from_ref(&ns)).await;
        }
        if binding && finalizer_policy() {
            // As the chart does: claims get the operator's finalizer as they are created.
            install_finalizer_policy(&client, &finalizer_binding(&ns), std::slice::from_ref(&ns)).await;
        }
        let claims: Api<LockClaim> = Api::namespaced(client.clone(), &ns);
        let history = History::default();
        let task = tokio::spawn(history.clone().record(claims.clone()));
        let kubeconfig = kubeconfig.to_path_buf();
        Env {
            made_with: kubeconfig.clone(),
            pods: Api::namespaced(client.clone(), &ns),
            client,
            kubeconfig,
            ns,
            zk,
            claims,
            history,
            _history_task: task,
        }
    }

    /// The same environment, with operators started from it using `kubeconfig` (another
    /// identity on the same API server, say a ServiceAccount's token).
    pub fn with_kubeconfig(mut self, kubeconfig: PathBuf) -> Env {
        self.kubeconfig = kubeconfig;
        self
    }

    pub fn operator(&self) -> Operator {
        Operator::start(self, &[])
    }

    pub async fn claim(&self, name: &str, lock: &str, extra: Value) -> LockClaim {
        let mut spec = json!({ "lockName": lock });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        let claim: LockClaim = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": name }, "spec": spec,
        }))
        .expect("claim json");
        self.claims.create(&PostParams::default(), &claim).await.unwrap_or_else(|e| panic!("create claim {name}: {e}"))
    }

    /// `Lock` object `name` with `permits`, made in the test's namespace and told to the
    /// history (its checker judges the lock as a semaphore of that many); answers the API of
    /// the namespace's `Lock`s.
    pub async fn lock(&self, name: &str, permits: u32) -> Api<zklock::api::Lock> {
        let locks: Api<zklock::api::Lock> = Api::namespaced(self.client.clone(), &self.ns);
        let lock: zklock::api::Lock = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
            "metadata": { "name": name }, "spec": { "permits": permits },
        }))
        .expect("Lock json");
        self.history.set_permits(name, permits as usize);
        locks.create(&PostParams::default(), &lock).await.unwrap_or_else(|e| panic!("create Lock {name}: {e}"));
        locks
    }

    /// A claim with this whole `spec` (for claims over several locks: `{"locks": [...]}`).
    pub async fn claim_spec(&self, name: &str, spec: Value) -> LockClaim {
        let claim: LockClaim = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": name }, "spec": spec,
        }))
        .expect("claim json");
        self.claims.create(&PostParams::default(), &claim).await.unwrap_or_else(|e| panic!("create claim {name}: {e}"))
    }

    pub async fn pod(&self, name: &str) -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "containers": [{ "name": "main", "image": "busybox:1.36" }] },
        }))
        .unwrap();
        self.pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("create pod {name}: {e}"))
    }

    /// Waits until pod `name` is gone from the API (a pod a node runs is deleted gracefully:
    /// its kubelet, kwok here, finishes the deletion).
    pub async fn wait_pod_gone(&self, name: &str) {
        let Some(uid) = self.pods.get_opt(name).await.ok().flatten().and_then(|p| p.uid()) else { return };
        let gone = await_condition(self.pods.clone(), name, kube::runtime::conditions::is_deleted(&uid));
        tokio::time::timeout(PATIENCE, gone)
            .await
            .unwrap_or_else(|_| panic!("pod {name} was not deleted within {PATIENCE:?}"))
            .expect("watch");
    }

    pub async fn delete_claim(&self, name: &str) {
        self.claims.delete(name, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("delete claim {name}: {e}"));
    }

    /// Waits until claim `name` satisfies `f`; returns it.
    pub async fn wait(&self, name: &str, what: &str, f: impl Fn(&LockClaim) -> bool) -> LockClaim {
        let cond = move |c: Option<&LockClaim>| c.is_some_and(&f);
        match tokio::time::timeout(PATIENCE, await_condition(self.claims.clone(), name, cond)).await {
            Ok(Ok(Some(c))) => c,
            other => {
                let now = self.claims.get_opt(name).await.ok().flatten();
                panic!("waiting for {name} to be {what}: {other:?}; it is {:?}", now.map(|c| c.status));
            }
        }
    }

    pub async fn wait_phase(&self, name: &str, phase: Phase) -> LockClaim {
        self.wait(name, &format!("{phase:?}"), |c| phase_of(c) == Some(phase)).await
    }

    pub async fn status(&self, name: &str) -> Option<Phase> {
        self.claims.get(name).await.ok().and_then(|c| phase_of(&c))
    }

    /// Waits until the claim is gone from the API (its finalizer removed).
    pub async fn wait_gone(&self, name: &str) {
        let Some(uid) = self.claims.get_opt(name).await.ok().flatten().and_then(|c| c.uid()) else { return };
        let gone = await_condition(self.claims.clone(), name, kube::runtime::conditions::is_deleted(&uid));
        tokio::time::timeout(PATIENCE, gone)
            .await
            .unwrap_or_else(|_| panic!("{name} was not deleted within {PATIENCE:?}"))
            .expect("watch");
    }

    pub async fn annotate(&self, name: &str, key: &str, value: &str) {
        let patch = json!({ "metadata": { "annotations": { key: value } } });
        self.claims.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotate claim");
    }
}

/// Waits until `Lock` object `name` satisfies `f`; returns it.
pub async fn wait_lock(
    locks: &Api<zklock::api::Lock>,
    name: &str,
    what: &str,
    f: impl Fn(&zklock::api::Lock) -> bool,
) -> zklock::api::Lock {
    let cond = move |l: Option<&zklock::api::Lock>| l.is_some_and(&f);
    match tokio::time::timeout(PATIENCE, kube::runtime::wait::await_condition(locks.clone(), name, cond)).await {
        Ok(Ok(Some(lock))) => lock,
        other => {
            let now = locks.get_opt(name).await.ok().flatten().map(|l| l.status);
            panic!("waiting for Lock {name} to show {what}: {other:?}; its status is {now:?}");
        }
    }
}

/// A cluster-scoped object a test made (no namespace takes it along), deleted when this goes,
/// passed or failed.
pub struct ClusterObject {
    /// As kubectl names the resource: `clusterlock`, `validatingadmissionpolicy`…
    resource: &'static str,
    name: String,
    kubeconfig: PathBuf,
}

impl ClusterObject {
    /// Object `name` of `resource` on the API server of `env`, deleted when this goes.
    pub fn delete_later(env: &Env, resource: &'static str, name: &str) -> ClusterObject {
        ClusterObject { resource, name: name.to_string(), kubeconfig: env.made_with.clone() }
    }
}

impl Drop for ClusterObject {
    fn drop(&mut self) {
        let Ok(kubectl) = std::panic::catch_unwind(zklock_testkit::kube::kubectl) else { return };
        let deleted = Command::new(kubectl)
            .args(["--kubeconfig", &self.kubeconfig.display().to_string(), "--request-timeout=10s"])
            .args(["delete", self.resource, &self.name, "--ignore-not-found", "--wait=false"])
            .stdout(Stdio::null())
            .status();
        if !matches!(deleted, Ok(status) if status.success()) {
            eprintln!("deleting {} {} did not finish: {deleted:?}", self.resource, self.name);
        }
    }
}

/// A `ClusterLock` a test made, deleted when this goes, passed or failed.
pub struct TestClusterLock {
    pub name: String,
    _deleted_later: ClusterObject,
}

impl TestClusterLock {
    /// Makes `ClusterLock` `name` with `spec` on the API server of `env`.
    pub async fn make(env: &Env, name: &str, spec: Value) -> TestClusterLock {
        let api: Api<zklock::api::ClusterLock> = Api::all(env.client.clone());
        let lock = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "ClusterLock", "metadata": { "name": name }, "spec": spec,
        }))
        .expect("ClusterLock json");
        api.create(&PostParams::default(), &lock).await.unwrap_or_else(|e| panic!("create ClusterLock {name}: {e}"));
        TestClusterLock {
            name: name.to_string(),
            _deleted_later: ClusterObject::delete_later(env, "clusterlock", name),
        }
    }

    /// A spec whose selector admits exactly namespace `ns`.
    pub fn admitting(ns: &str) -> Value {
        json!({ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } } })
    }
}

pub fn phase_of(c: &LockClaim) -> Option<Phase> {
    c.status.as_ref().and_then(|s| s.phase)
}

pub fn condition(c: &LockClaim, type_: &str) -> Option<(String, String, String)> {
    let st = c.status.as_ref()?;
    conditions::get(&st.conditions, type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Creates (or updates) the CRDs from `crds/` and waits until they are served and creatable
/// (see `zklock_testkit::install::crds`).
pub async fn install_crd(client: &kube::Client) {
    zklock_testkit::install::crds(client, "zklock-tests").await.unwrap_or_else(|e| panic!("{e}"));
}

/// Whether the tests install the admission policy that refuses a deposed leader's late status
/// writes (docs/design.md: fencing): every API server since Kubernetes 1.30 runs it; a cluster
/// named by `ZKLOCK_TEST_KUBECONFIG` that cannot is tested with `ZKLOCK_TEST_EPOCH_POLICY=off`.
pub fn epoch_policy() -> bool {
    std::env::var("ZKLOCK_TEST_EPOCH_POLICY").map_or(true, |v| v != "off")
}

/// Whether the tests' claims get the operator's finalizer from the admission policy (as the
/// chart installs it): where the API server serves MutatingAdmissionPolicy (Kubernetes 1.36 and
/// later), unless ZKLOCK_TEST_FINALIZER_POLICY=off (to compare with the operator adding it
/// itself, as on a cluster before 1.36).
pub fn finalizer_policy() -> bool {
    std::env::var("ZKLOCK_TEST_FINALIZER_POLICY").map_or_else(|_| serves_mutating_admission_policy(), |v| v != "off")
}

/// Whether the API server under test serves `admissionregistration.k8s.io/v1`
/// MutatingAdmissionPolicy, asked once (detected, as the chart's capabilities are).
pub fn serves_mutating_admission_policy() -> bool {
    static SERVED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SERVED.get_or_init(|| serves_mutating_admission_policy_at(zklock_testkit::kube::kubeconfig()))
}

/// Whether the API server of `kubeconfig` serves MutatingAdmissionPolicy. From 1.36 on it must:
/// a control plane that stopped serving it fails here rather than sending a test down its
/// branch for older versions.
pub fn serves_mutating_admission_policy_at(kubeconfig: &std::path::Path) -> bool {
    let raw = |path: &str| -> Value {
        let out = Command::new(zklock_testkit::kube::kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["get", "--raw", path, "--request-timeout=20s"])
            .output()
            .expect("run kubectl");
        assert!(out.status.success(), "GET {path}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("a JSON document")
    };
    let group = raw("/apis/admissionregistration.k8s.io/v1");
    let served = group["resources"].as_array().into_iter().flatten().any(|r| r["name"] == "mutatingadmissionpolicies");
    let minor = zklock_testkit::kube::minor_number(raw("/version")["minor"].as_str().unwrap_or_default());
    assert!(served || minor < 36, "kube-apiserver 1.{minor} serves no MutatingAdmissionPolicy");
    served
}

/// The name of the finalizer policy's binding for the test namespace `ns`.
pub fn finalizer_binding(ns: &str) -> String {
    format!("zklock-finalizer-{ns}")
}

/// The finalizer's admission policy, and binding `name` for `namespaces`.
pub async fn install_finalizer_policy(client: &kube::Client, name: &str, namespaces: &[String]) {
    zklock_testkit::install::finalizer_policy(client, "zklock-tests", name, namespaces)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Creates (or updates) the epoch policy and a binding `name` for `namespaces`, whose
/// parameter lives in `param_namespace`. It returns before the API server enforces them (its
/// policy cache follows within a second or so): a test that needs the refusal awaits it.
pub async fn install_epoch_policy(client: &kube::Client, name: &str, param_namespace: &str, namespaces: &[String]) {
    zklock_testkit::install::epoch_policy(client, "zklock-tests", name, param_namespace, namespaces)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The fencing policies and their bindings for the test's namespace, as the chart installs them
/// for an installation serving it (the operator's namespace is the test's, its parameter named
/// by the operator's default `--fencing-param`); deleted when the answer goes, passed or failed.
pub async fn install_fencing_policy(env: &Env) -> Vec<ClusterObject> {
    use zklock::api::fencing_policy::FENCING_PARAM;
    let name = format!("zklock-fencing-{}", env.ns);
    let kept = [
        ("validatingadmissionpolicy", name.clone()),
        ("validatingadmissionpolicy", format!("{name}-cluster-locks")),
        ("validatingadmissionpolicybinding", name.clone()),
        ("validatingadmissionpolicybinding", format!("{name}-cluster-locks")),
    ]
    .map(|(resource, name)| ClusterObject::delete_later(env, resource, &name));
    let namespaces = std::slice::from_ref(&env.ns);
    let made = zklock_testkit::install::fencing_policy(
        &env.client,
        "zklock-tests",
        (&name, FENCING_PARAM),
        &env.ns,
        namespaces,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(made.len(), kept.len(), "every object made is deleted later");
    kept.into()
}

/// The operator as a separate process: the real binary with real flags.
pub struct Operator {
    child: Option<Child>,
    args: Vec<String>,
    kubeconfig: PathBuf,
    pub metrics: String,
    pub log: PathBuf,
}

impl Operator {
    pub fn start(env: &Env, extra: &[&str]) -> Operator {
        Self::start_with_kubeconfig(env, env.kubeconfig.clone(), &env.zk, extra)
    }

    /// An operator that reaches the API server through `relay` (to hang its connection).
    pub fn start_through(env: &Env, relay: &zklock_testkit::hang::HangingRelay, extra: &[&str]) -> Operator {
        Self::start_with_kubeconfig(env, relayed_kubeconfig(env, relay), &env.zk, extra)
    }

    /// An operator that reaches the API server through `proxy` (to delay single requests).
    pub fn start_proxied(env: &Env, proxy: &zklock_testkit::api_proxy::ApiProxy, extra: &[&str]) -> Operator {
        Self::start_with_kubeconfig(env, proxy.kubeconfig(&std::env::temp_dir()), &env.zk, extra)
    }

    /// An operator that reaches the API server through `proxy` and ZooKeeper at `zk`.
    pub fn start_proxied_with_zk(
        env: &Env,
        proxy: &zklock_testkit::api_proxy::ApiProxy,
        zk: &str,
        extra: &[&str],
    ) -> Operator {
        Self::start_with_kubeconfig(env, proxy.kubeconfig(&std::env::temp_dir()), zk, extra)
    }

    /// An operator that reaches ZooKeeper at `zk` (through a proxy, say).
    pub fn start_with_zk(env: &Env, zk: &str, extra: &[&str]) -> Operator {
        Self::start_with_kubeconfig(env, env.kubeconfig.clone(), zk, extra)
    }

    /// An operator that reaches the API server through `relay` and ZooKeeper at `zk`.
    pub fn start_custom(env: &Env, relay: &zklock_testkit::hang::HangingRelay, zk: &str, extra: &[&str]) -> Operator {
        Self::start_with_kubeconfig(env, relayed_kubeconfig(env, relay), zk, extra)
    }

    fn start_with_kubeconfig(env: &Env, kubeconfig: PathBuf, zk: &str, extra: &[&str]) -> Operator {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut args: Vec<String> = [
            "run",
            "--zk-connect",
            zk,
            "--watch-namespace",
            &env.ns,
            "--lease-namespace",
            &env.ns,
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // (An older build, `ZKLOCK_TEST_BINARY`, is not given flags it may not know.)
        if !epoch_policy()
            && !extra.contains(&"--no-leader-election")
            && std::env::var_os("ZKLOCK_TEST_BINARY").is_none()
        {
            args.push("--no-epoch-policy".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = std::env::temp_dir().join(format!("zklock-operator-{}-{port}.log", env.ns));
        let mut op = Operator { child: None, args, kubeconfig, metrics: format!("127.0.0.1:{port}"), log };
        op.spawn();
        op
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        // `ZKLOCK_TEST_BINARY`: another build of the operator, e.g. the one before a fix, to
        // see a test fail without it.
        let binary = std::env::var("ZKLOCK_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zklock").into());
        let child = Command::new(binary)
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", std::env::var("ZKLOCK_TEST_OPERATOR_LOG").unwrap_or_else(|_| "info,zklock=debug".into()))
            .env("HOSTNAME", format!("op-{}", uuid::Uuid::new_v4().simple()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the zklock binary");
        self.child = Some(child);
    }

    /// kill -9: no shutdown, no lease release, no session close.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the operator sees nothing and does nothing until [`Operator::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("operator running");
        let status = Command::new("kill").args([signal, &child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("operator running");
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        child.wait().expect("wait for the operator")
    }

    /// SIGTERM, and the exit status once it stops; after `limit` it is killed (-9) and the
    /// answer is `None`: a graceful stop that does not end is a finding, never a hang.
    pub fn terminate_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take().expect("operator running");
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Starts the operator again with the same flags (after `terminate`, or killing it).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Reads one sample of the operator's /metrics (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = http_get(&self.metrics, "/metrics").await.unwrap_or_default();
        // The metric itself (`name`, or `name{labels…` to pick some of its series), not another
        // whose name it begins (zklock_leader_…).
        text.lines()
            .filter(|l| l.strip_prefix(name).is_some_and(|rest| name.contains('{') || rest.starts_with([' ', '{'])))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub async fn ready(&self) -> bool {
        http_get(&self.metrics, "/readyz").await.is_some_and(|b| b.contains("ready") && !b.contains("not"))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("--- operator log {} ---\n{}", self.log.display(), self.logs());
        }
    }
}

/// A copy of the test kubeconfig whose server is reached through `relay`.
fn relayed_kubeconfig(env: &Env, relay: &zklock_testkit::hang::HangingRelay) -> PathBuf {
    let original = zklock_testkit::kube::kubeconfig();
    let text = std::fs::read_to_string(original).expect("read the test kubeconfig");
    let text = text.replace(&api_address().to_string(), &relay.addr().to_string());
    let path = std::env::temp_dir().join(format!("zklock-kubeconfig-{}-{}", env.ns, relay.addr().port()));
    std::fs::write(&path, text).expect("write the relayed kubeconfig");
    path
}

/// The `host:port` of the API server under test, from its kubeconfig.
pub fn api_address() -> std::net::SocketAddr {
    let path = zklock_testkit::kube::kubeconfig();
    let config = kube::config::Kubeconfig::read_from(path).expect("read the test kubeconfig");
    let server = config.clusters.first().and_then(|c| c.cluster.as_ref()).and_then(|c| c.server.clone());
    let server = server.expect("the test kubeconfig names a server");
    let url: http::Uri = server.parse().expect("the server is a URL");
    let port = url.port_u16().unwrap_or(if url.scheme_str() == Some("https") { 443 } else { 80 });
    let host = url.host().expect("the server URL has a host");
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("cannot resolve the API server {server}"))
}

/// A tiny HTTP/1.0 GET (the operator's own endpoints only); `None` after 2 s without an
/// answer (a stopped operator never answers).
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    http_answer(addr, path).await.filter(|(code, _)| *code == 200).map(|(_, body)| body)
}

/// A tiny HTTP/1.0 GET: the status code and the body; `None` after 2 s without an answer.
pub async fn http_answer(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    let answer = tokio::time::timeout(Duration::from_secs(2), get).await.ok()??;
    let code = answer.split(' ').nth(1)?.parse().ok()?;
    answer.split_once("\r\n\r\n").map(|(_, b)| (code, b.to_string()))
}

/// From when how many permits a lock has.
type PermitsTimeline = Vec<(std::time::Instant, usize)>;

/// Every status change of every claim of a namespace, in the order the API serialised them.
#[derive(Clone, Default)]
pub struct History {
    inner: Arc<Mutex<Vec<Record>>>,
    /// Locks with permits: from when (as the test says) how many are in force.
    permits: Arc<Mutex<HashMap<String, PermitsTimeline>>>,
    recorded: Arc<tokio::sync::Notify>,
    /// Watch errors so far and the last one: shown by every wait that gives up, so that a
    /// broken watch reads as such rather than as a slow operator.
    errors: Arc<Mutex<(usize, Option<String>)>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// When the history's watch delivered it.
    pub at: std::time::Instant,
    pub name: String,
    pub uid: String,
    pub lock: String,
    pub exclusive: bool,
    pub phase: Option<Phase>,
    pub held_condition: bool,
    pub finished_condition: bool,
    pub fencing: Option<String>,
    /// The term of the leader that wrote the status.
    pub leader_epoch: Option<i64>,
    /// The Finished condition's reason and message once final, else the Held condition's: what
    /// a failing check prints about the claim.
    pub why: Option<String>,
    pub deleting: bool,
    pub gone: bool,
}

impl History {
    async fn record(self, claims: Api<LockClaim>) {
        // With a backoff: a watch that keeps failing (the API server gone, say) must not spin.
        let mut stream = watcher(claims, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            let (claim, gone) = match event {
                Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => (c, false),
                Ok(watcher::Event::Delete(c)) => (c, true),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                Err(e) => {
                    eprintln!("history watch error (retrying with backoff): {e}");
                    let mut errors = self.errors.lock().unwrap();
                    errors.0 += 1;
                    errors.1 = Some(e.to_string());
                    continue;
                }
            };
            let st = claim.status.clone().unwrap_or_default();
            // A claim over several locks: one record per lock, with that lock's own token.
            let several = claim.spec.locks.is_some();
            let records: Vec<Record> = claim
                .spec
                .lock_refs()
                .into_iter()
                .map(|lock| {
                    let fencing = if several {
                        st.locks.iter().find(|l| l.lock_name == lock.label()).and_then(|l| l.fencing_token.clone())
                    } else {
                        st.fencing_token.clone()
                    };
                    Record {
                        at: std::time::Instant::now(),
                        name: claim.name_any(),
                        uid: claim.uid().unwrap_or_default(),
                        exclusive: lock.mode == zklock::recipe::Mode::Exclusive,
                        lock: lock.label(),
                        phase: st.phase,
                        held_condition: conditions::is_true(&st.conditions, conditions::HELD),
                        finished_condition: conditions::is_true(&st.conditions, conditions::FINISHED),
                        fencing,
                        leader_epoch: st.leader_epoch,
                        why: conditions::get(&st.conditions, conditions::FINISHED)
                            .filter(|c| c.status == "True")
                            .or_else(|| conditions::get(&st.conditions, conditions::HELD))
                            .map(|c| format!("{}: {}", c.reason, c.message)),
                        deleting: claim.metadata.deletion_timestamp.is_some(),
                        gone,
                    }
                })
                .collect();
            {
                let mut kept = self.inner.lock().unwrap();
                for record in records {
                    let last = kept.iter().rev().find(|r| r.uid == record.uid && r.lock == record.lock);
                    if last.is_none_or(|last| Record { at: record.at, ..last.clone() } != record) {
                        kept.push(record);
                    }
                }
            }
            self.recorded.notify_waiters();
        }
    }

    /// Tells the checker that `lock` lets `permits` hold from now on. Say it before a raise,
    /// and after a lower limit is in force (the `Lock`'s status shows it).
    pub fn set_permits(&self, lock: &str, permits: usize) {
        self.permits.lock().unwrap().entry(lock.to_string()).or_default().push((std::time::Instant::now(), permits));
    }

    /// The permits of `lock` in force at `at`, if it has a `Lock` object then.
    fn permits_at(&self, lock: &str, at: std::time::Instant) -> Option<usize> {
        let permits = self.permits.lock().unwrap();
        permits.get(lock)?.iter().rev().find(|(from, _)| *from <= at).map(|(_, n)| *n)
    }

    /// A history made of the given records, for tests of the checker itself.
    #[allow(dead_code)] // Used by one test crate of those that include this module.
    pub fn of(records: Vec<Record>) -> History {
        let history = History::default();
        *history.inner.lock().unwrap() = records;
        history
    }

    pub fn records(&self) -> Vec<Record> {
        self.inner.lock().unwrap().clone()
    }

    /// The records from the `from`-th on (to follow the history as it grows).
    pub fn records_since(&self, from: usize) -> Vec<Record> {
        self.inner.lock().unwrap().get(from..).map(<[Record]>::to_vec).unwrap_or_default()
    }

    /// How the history's watch has fared, for failure messages.
    pub fn watch_errors(&self) -> String {
        match &*self.errors.lock().unwrap() {
            (0, _) => "the history watch had no errors".into(),
            (n, last) => format!("the history watch failed {n} times, last: {}", last.as_deref().unwrap_or("?")),
        }
    }

    /// Waits until the history has recorded claim `name` leaving the API. The watch delivers
    /// events in resourceVersion order, so everything before that deletion is recorded too.
    pub async fn await_gone(&self, name: &str) {
        let seen = async {
            loop {
                // Registered before the check, so a record pushed in between still wakes us.
                let next = self.recorded.notified();
                if self.records().iter().any(|r| r.name == name && r.gone) {
                    return;
                }
                next.await;
            }
        };
        tokio::time::timeout(PATIENCE, seen).await.unwrap_or_else(|_| {
            panic!("the history never saw {name} deleted within {PATIENCE:?} ({})", self.watch_errors())
        });
    }

    /// Waits until the history has a record `f` picks (`what` it is, for the failure); returns it.
    pub async fn await_record(&self, what: &str, f: impl Fn(&Record) -> bool) -> Record {
        let seen = async {
            loop {
                let next = self.recorded.notified();
                if let Some(r) = self.records().into_iter().find(|r| f(r)) {
                    return r;
                }
                next.await;
            }
        };
        tokio::time::timeout(PATIENCE, seen).await.unwrap_or_else(|_| {
            panic!("the history never recorded {what} within {PATIENCE:?} ({})", self.watch_errors())
        })
    }

    /// The claims granted the lock, in grant order.
    pub fn grants(&self, lock: &str) -> Vec<String> {
        let mut seen = vec![];
        for r in self.records() {
            if r.lock == lock && r.phase == Some(Phase::Held) && !seen.contains(&r.name) {
                seen.push(r.name.clone());
            }
        }
        seen
    }

    /// The most claims the history shows holding `lock` at one time: a lock with permits that
    /// never had two holders at once was not exercised as one.
    pub fn most_held_at_once(&self, lock: &str) -> usize {
        let mut holding = HashSet::new();
        let mut most = 0;
        for r in self.records().into_iter().filter(|r| r.lock == lock) {
            if r.phase == Some(Phase::Held) && !r.gone {
                holding.insert(r.uid);
            } else {
                holding.remove(&r.uid);
            }
            most = most.max(holding.len());
        }
        most
    }

    /// Checks docs/design.md: safety (mutual exclusion, fencing) and the status conventions over the
    /// whole history; panics with the offending records.
    pub fn check(&self) {
        let records = self.records();
        let mut holding: HashMap<String, BTreeMap<String, (bool, Option<String>)>> = HashMap::new();
        // Mutexes: the highest token of a hold that ended, and of an Exclusive hold that ended.
        let mut mutex_ended: HashMap<String, (u64, u64)> = HashMap::new();
        // Locks with permits: every token granted so far, and the highest token of a hold that
        // has ended.
        let mut granted_tokens: HashMap<String, HashSet<u64>> = HashMap::new();
        let mut ended_token: HashMap<String, u64> = HashMap::new();
        let mut last_phase: HashMap<String, Phase> = HashMap::new();
        for (i, r) in records.iter().enumerate() {
            // A claim being deleted holds until its status says otherwise or it is gone.
            let held = r.phase == Some(Phase::Held) && !r.gone;
            assert_eq!(
                r.held_condition,
                r.phase == Some(Phase::Held),
                "record {i}: Held condition must be True exactly while the phase is Held: {r:?}"
            );
            if let Some(p) = r.phase {
                assert_eq!(
                    r.finished_condition,
                    p.is_terminal(),
                    "record {i}: Finished must mark terminal phases: {r:?}"
                );
                if let Some(before) = last_phase.get(&r.uid) {
                    assert!(
                        !before.is_terminal() || *before == p,
                        "record {i}: {} left terminal phase {before:?} for {p:?}",
                        r.name
                    );
                }
                last_phase.insert(r.uid.clone(), p);
            }
            let lock = holding.entry(r.lock.clone()).or_default();
            let was_held = lock.contains_key(&r.uid);
            if held {
                lock.insert(r.uid.clone(), (r.exclusive, r.fencing.clone()));
            } else if let Some((exclusive, ended)) = lock.remove(&r.uid) {
                let ended = ended.and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
                let highest = ended_token.entry(r.lock.clone()).or_default();
                *highest = (*highest).max(ended);
                let mutex = mutex_ended.entry(r.lock.clone()).or_insert((0, 0));
                mutex.0 = mutex.0.max(ended);
                if exclusive {
                    mutex.1 = mutex.1.max(ended);
                }
            }
            let permits = self.permits_at(&r.lock, r.at);
            if let (true, false, Some(permits)) = (held, was_held, permits) {
                // A grant never makes more than the permits hold (a lower limit takes nothing
                // away, so more may hold until they leave, but nobody is granted then).
                assert!(
                    lock.len() <= permits,
                    "record {i}: {} granted while {} of {permits} permits of {} were taken\nhistory: {:#?}",
                    r.name,
                    lock.len() - 1,
                    r.lock,
                    &records[..=i]
                );
            }
            if held && !was_held {
                let token: u64 = r
                    .fencing
                    .as_deref()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| panic!("record {i}: Held without a fencing token: {r:?}"));
                if permits.is_some() {
                    // With permits, each grant has a token of its own, and a grant made after
                    // a hold ended carries a higher token than that hold. Grants that hold at
                    // once are written by separate status writes, which the API may serialise
                    // in any order: their tokens are not compared with each other.
                    assert!(
                        granted_tokens.entry(r.lock.clone()).or_default().insert(token),
                        "record {i}: fencing token {token} granted twice on {}\nhistory: {:#?}",
                        r.lock,
                        &records[..=i]
                    );
                    let ended = ended_token.get(&r.lock).copied().unwrap_or(0);
                    assert!(
                        token > ended,
                        "record {i}: fencing token {token} after a hold with {ended} ended on {}\nhistory: {:#?}",
                        r.lock,
                        &records[..=i]
                    );
                } else {
                    // A mutex: a grant's token is above that of every hold it had to wait for,
                    // which ended before it (the operator writes no conflicting grant before the
                    // conflicting holder's final status): an Exclusive grant waits for every
                    // holder, a Shared one for the Exclusive ones. Shared holders are not
                    // compared with each other: granted together they share a token, and their
                    // writes land in any order, also after another Shared hold ended.
                    let (any, exclusive) = mutex_ended.get(&r.lock).copied().unwrap_or((0, 0));
                    let waited_for = if r.exclusive { any } else { exclusive };
                    assert!(
                        token > waited_for,
                        "record {i}: fencing token {token} on {} after a hold with {waited_for} ended\nhistory: {:#?}",
                        r.lock,
                        &records[..=i]
                    );
                }
            }
            let exclusive_count = lock.values().filter(|(excl, _)| *excl).count();
            assert!(
                permits.is_some() || exclusive_count == 0 || lock.len() == 1,
                "record {i}: mutual exclusion violated on lock {}: holders {:?}\nhistory: {:#?}",
                r.lock,
                lock.keys().collect::<Vec<_>>(),
                &records[..=i]
            );
        }
    }
}
