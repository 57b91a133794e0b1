//! The chart's RBAC grants exactly what the operator's API requests need.
//!
//! The real binary runs with the args and env of the chart's rendered Deployment (only the
//! ZooKeeper address and the metrics port swapped for the test's), with `ZKLOCK_API_AUDIT` set,
//! against a real ZooKeeper, through a scenario that takes every API path: leader election (two
//! terms: the first makes the leader epoch's ConfigMap, the second raises it), claims with a
//! holder pod, a waiter, revocation (pod annotation), a holder pod's death, events, finalizers,
//! status, deletion, shutdown. Each logged request becomes (namespace, apiGroup,
//! resource[/subresource], name, verb); every one must be allowed by the Roles/ClusterRoles the
//! chart binds to the operator's ServiceAccount, and every permission the chart grants must
//! have been used. Run with the chart's own epoch policy for `watchNamespaces` (Roles per
//! namespace) on the test run's control plane, and for the default values (ClusterRole) on a
//! control plane of its own: an operator of all namespaces on the shared one would serve every
//! other test's claims (and its policy binding would cover their namespaces).
//! `the_operator_works_with_the_charts_own_serviceaccount` installs the chart for real and runs
//! the operator with its ServiceAccount's own token, so RBAC is enforced by the API server itself.

use crate::chart_support;
use crate::e2e_support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chart_support::*;
use e2e_support::{http_get, Env};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use zklock::api::{ClusterLock, Lock, Phase};

/// One API request as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    verb: String,
    group: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
}

/// Maps a logged `METHOD PATH[?QUERY]` line to the request's RBAC attributes.
fn parse_request(line: &str) -> Request {
    let (method, target) = line.split_once(' ').unwrap_or_else(|| panic!("bad audit line {line:?}"));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("{line:?}: not a resource request (the chart grants no non-resource URLs)"),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (resource, name) = match rest {
        [resource] => (resource.to_string(), None),
        [resource, name] => (resource.to_string(), Some(name.to_string())),
        [resource, name, sub] => (format!("{resource}/{sub}"), Some(name.to_string())),
        _ => panic!("{line:?}: unexpected path"),
    };
    let watch = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => panic!("{line:?}: unexpected method"),
    };
    // As the API server does: a list or watch selecting one name by field is authorized
    // against that name (RBAC's resourceNames).
    let name = name.or_else(|| {
        query.split('&').find_map(|kv| {
            let value = kv.strip_prefix("fieldSelector=")?;
            let value = value.replace("%3D", "=").replace("%3d", "=");
            value.strip_prefix("metadata.name=").filter(|n| !n.contains(',')).map(str::to_string)
        })
    });
    Request { verb: verb.into(), group: group.into(), resource, namespace, name }
}

/// The RBAC the chart binds to its operator's ServiceAccount.
struct Grants {
    /// (namespace of the binding or None for a ClusterRoleBinding, the role's rules)
    bound: Vec<(Option<String>, String, Vec<Value>)>,
}

impl Grants {
    fn from_rendered(docs: &[Value]) -> Grants {
        let deployment = find(docs, "Deployment")[0];
        let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap().to_string();
        let sa_ns = deployment["metadata"]["namespace"].as_str().unwrap().to_string();
        let role = |kind_: &str, name_: &str, ns: Option<&str>| -> Vec<Value> {
            let role = docs
                .iter()
                .find(|d| kind(d) == kind_ && name(d) == name_ && d["metadata"]["namespace"].as_str() == ns)
                .unwrap_or_else(|| panic!("the chart binds {kind_} {name_} but does not render it"));
            role["rules"].as_array().cloned().unwrap_or_default()
        };
        let mut bound = vec![];
        for binding in docs.iter().filter(|d| matches!(kind(d), "RoleBinding" | "ClusterRoleBinding")) {
            let ours =
                binding["subjects"].as_array().into_iter().flatten().any(|s| {
                    s["kind"] == "ServiceAccount" && s["name"] == sa.as_str() && s["namespace"] == sa_ns.as_str()
                });
            if !ours {
                continue;
            }
            let ns = binding["metadata"]["namespace"].as_str();
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
            let role_name = binding["roleRef"]["name"].as_str().unwrap();
            let rules = role(role_kind, role_name, if role_kind == "Role" { ns } else { None });
            bound.push((ns.map(String::from), format!("{} {role_kind}/{role_name}", kind(binding)), rules));
        }
        Grants { bound }
    }

    /// Which binding allows the request, if any (kube-apiserver's RBAC rule matching).
    fn allows(&self, r: &Request) -> Option<String> {
        self.bound.iter().find_map(|(binding_ns, what, rules)| {
            let in_scope = match binding_ns {
                None => true,
                Some(ns) => r.namespace.as_deref() == Some(ns),
            };
            let ok = in_scope
                && rules.iter().any(|rule| {
                    let has = |key: &str, v: &str| strings(&rule[key]).iter().any(|x| x == v || x == "*");
                    let names = strings(&rule["resourceNames"]);
                    has("apiGroups", &r.group)
                        && has("resources", &r.resource)
                        && has("verbs", &r.verb)
                        && (names.is_empty() || r.name.as_ref().is_some_and(|n| names.contains(n)))
                });
            ok.then(|| what.clone())
        })
    }

    /// Every (group, resource, verb, resourceNames) the bound rules grant.
    fn granted(&self) -> BTreeSet<(String, String, String, Vec<String>)> {
        let mut all = BTreeSet::new();
        for (_, _, rules) in &self.bound {
            for rule in rules {
                for g in strings(&rule["apiGroups"]) {
                    for res in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            all.insert((g.clone(), res.clone(), verb, strings(&rule["resourceNames"])));
                        }
                    }
                }
            }
        }
        all
    }
}

/// Checks requests against the grants; returns the derived table, or what is missing/unused.
fn check(requests: &[Request], grants: &Grants) -> Result<String, String> {
    let mut counts: BTreeMap<(String, String, String, String), (usize, String)> = BTreeMap::new();
    let mut denied = BTreeSet::new();
    for r in requests {
        let scope = if r.namespace.is_some() { "namespace" } else { "all namespaces" };
        match grants.allows(r) {
            Some(by) => {
                let key = (r.group.clone(), r.resource.clone(), r.verb.clone(), scope.to_string());
                counts.entry(key).or_insert((0, by)).0 += 1;
            }
            None => {
                denied
                    .insert(format!("{} {}/{} in {:?} (name {:?})", r.verb, r.group, r.resource, r.namespace, r.name));
            }
        }
    }
    let mut table =
        format!("{:<20} {:<18} {:<7} {:<15} {:>6}  granted by\n", "apiGroup", "resource", "verb", "scope", "calls");
    for ((group, resource, verb, scope), (n, by)) in &counts {
        let group = if group.is_empty() { "\"\"" } else { group };
        table.push_str(&format!("{group:<20} {resource:<18} {verb:<7} {scope:<15} {n:>6}  {by}\n"));
    }
    let unused: Vec<_> = grants
        .granted()
        .into_iter()
        .filter(|(g, res, verb, names)| {
            !requests.iter().any(|r| {
                &r.group == g
                    && &r.resource == res
                    && &r.verb == verb
                    && (names.is_empty() || r.name.as_ref().is_some_and(|n| names.contains(n)))
            })
        })
        .collect();
    if denied.is_empty() && unused.is_empty() {
        Ok(table)
    } else {
        Err(format!(
            "operator requests the chart does not grant: {denied:#?}\npermissions the chart grants but the operator never used: {unused:#?}\nderived so far:\n{table}"
        ))
    }
}

/// An operator process a test started: killed (and reaped) when this goes, so that a test that
/// fails half-way leaves no operator serving its namespaces.
pub(crate) struct Running(pub(crate) Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The operator as the chart runs it: the rendered Deployment's args and env.
pub(crate) fn start_operator(
    docs: &[Value],
    env: &Env,
    audit: &std::path::Path,
    log: &std::path::Path,
) -> (Running, String) {
    start_operator_on(docs, &env.zk, &env.kubeconfig, audit, log)
}

/// [`start_operator`] with ZooKeeper at `zk` and the API server of `kubeconfig`.
pub(crate) fn start_operator_on(
    docs: &[Value],
    zk: &str,
    kubeconfig: &std::path::Path,
    audit: &std::path::Path,
    log: &std::path::Path,
) -> (Running, String) {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_zklock"));
    start_operator_from(binary, docs, zk, kubeconfig, audit, log)
}

/// [`start_operator_on`] with the zklock `binary` (one pulled from a registry, say).
pub(crate) fn start_operator_from(
    binary: &std::path::Path,
    docs: &[Value],
    zk: &str,
    kubeconfig: &std::path::Path,
    audit: &std::path::Path,
    log: &std::path::Path,
) -> (Running, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let pod = &find(docs, "Deployment")[0]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    // The ZooKeeper credentials the Deployment mounts, from the rendered Secret, beside the log.
    let mounted = log.with_extension("zk-auth");
    let secret_name = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "zk-auth")
        .and_then(|v| v["secret"]["secretName"].as_str());
    if let Some(secret_name) = secret_name {
        let secret = find(docs, "Secret").into_iter().find(|s| name(s) == secret_name);
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(
            (*secret.unwrap_or_else(|| {
                panic!("the Deployment mounts Secret {secret_name}, which the chart does not render")
            }))
            .clone(),
        )
        .unwrap();
        std::fs::create_dir_all(&mounted).unwrap();
        for (key, value) in secret.data.unwrap_or_default() {
            std::fs::write(mounted.join(key), value.0).unwrap();
        }
    }
    let args: Vec<String> = strings(&container["args"])
        .into_iter()
        .map(|a| a.replace("/etc/zklock/zk-auth", &mounted.display().to_string()))
        .map(|a| {
            if a.starts_with("--zk-connect=") {
                format!("--zk-connect={zk}")
            } else if a.starts_with("--metrics-addr=") {
                format!("--metrics-addr=127.0.0.1:{port}")
            } else {
                a
            }
        })
        .collect();
    let mut cmd = Command::new(binary);
    cmd.args(&args);
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        match (&var["value"], &var["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => cmd.env(name, v),
            // Each process a pod of its own (a replica's identity in leader election).
            (_, Value::String(p)) if p == "metadata.name" => {
                static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                cmd.env(name, format!("zklock-7d9f8-{n:05}"))
            }
            other => panic!("env {name}: {other:?} has no local equivalent"),
        };
    }
    let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let child = cmd
        .env("KUBECONFIG", kubeconfig)
        .env(zklock::client::AUDIT_ENV, audit)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .expect("start zklock");
    eprintln!("operator: zklock {}", args.join(" "));
    (Running(child), format!("127.0.0.1:{port}"))
}

async fn create_namespace(env: &Env, name: &str) {
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// Every API path of the operator, once at least.
async fn scenario(env: &Env, fenced: bool) {
    env.pod("holder-a").await;
    env.claim("a", "maint", json!({ "holder": { "podName": "holder-a" }, "revocationGracePeriodSeconds": 1 })).await;
    env.wait_phase("a", Phase::Held).await;
    env.claim("b", "maint", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    // Revocation of a holder: condition, pod annotation, event, forced release.
    env.annotate("a", "zklock.io/revoke", "chart rbac test").await;
    env.wait_phase("a", Phase::Revoked).await;
    env.wait_phase("b", Phase::Held).await;
    env.delete_claim("b").await;
    env.wait_gone("b").await;
    // A holder pod that goes away.
    env.pod("holder-c").await;
    env.claim("c", "other", json!({ "holder": { "podName": "holder-c" } })).await;
    env.wait_phase("c", Phase::Held).await;
    env.pods.delete("holder-c", &DeleteParams::default()).await.unwrap();
    env.wait_phase("c", Phase::Released).await;
    for name in ["a", "c"] {
        env.delete_claim(name).await;
        env.wait_gone(name).await;
    }
    // A gated pod: its claim made, its gate removed, its condition written.
    let gated: Pod = serde_json::from_value(json!({
        "metadata": { "name": "gated", "annotations": { "zklock.io/lock": "gate" } },
        "spec": {
            "schedulerName": "zklock-test-no-scheduler",
            "schedulingGates": [{ "name": "zklock.io/lock" }],
            "containers": [{ "name": "main", "image": "busybox:1.36" }],
        },
    }))
    .unwrap();
    env.pods.create(&PostParams::default(), &gated).await.unwrap();
    env.wait_phase("gated", Phase::Held).await;
    let ungated = async {
        while env.pods.get("gated").await.unwrap().spec.unwrap().scheduling_gates.is_some_and(|g| !g.is_empty()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), ungated).await.expect("the gated pod is ungated");
    // A claim deleted by the operator once final (it expires at once: the lock is busy).
    env.claim("short", "gate", json!({ "acquireTimeoutSeconds": 0, "ttlSecondsAfterFinished": 0 })).await;
    env.wait_gone("short").await;
    // The garbage collector deletes the pod's claim with it; the operator releases its node.
    env.pods.delete("gated", &DeleteParams::default()).await.unwrap();
    env.wait_gone("gated").await;
    // A lock with permits: its Lock object read, its status written.
    let locks: Api<Lock> = Api::namespaced(env.client.clone(), &env.ns);
    let lock: Lock = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
        "metadata": { "name": "sem" }, "spec": { "permits": 2 },
    }))
    .unwrap();
    locks.create(&PostParams::default(), &lock).await.unwrap();
    env.claim("s1", "sem", json!({})).await;
    env.wait_phase("s1", Phase::Held).await;
    let counted = kube::runtime::wait::await_condition(locks.clone(), "sem", |l: Option<&Lock>| {
        l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.held == 1)
    });
    tokio::time::timeout(Duration::from_secs(60), counted).await.expect("the Lock's status counts its holder").unwrap();
    env.delete_claim("s1").await;
    env.wait_gone("s1").await;
    // A Lock whose fencing is enforced: its holds in force written into the namespace's fencing
    // parameter (made, read, patched) and proven with a dry-run patch of it.
    if fenced {
        let lock: Lock = serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
            "metadata": { "name": "fenced" }, "spec": { "fencing": "Enforced" },
        }))
        .unwrap();
        locks.create(&PostParams::default(), &lock).await.unwrap();
        e2e_support::wait_lock(&locks, "fenced", "its status written", |l| l.status.is_some()).await;
        for name in ["f1", "f2"] {
            env.claim(name, "fenced", json!({})).await;
            env.wait_phase(name, Phase::Held).await;
            env.delete_claim(name).await;
            env.wait_gone(name).await;
        }
    }
    // A ClusterLock: read, its selector matched against the namespace's labels, its status
    // written from its queue (and, fenced, its holds in force written into the release
    // namespace's parameter).
    let mut spec = e2e_support::TestClusterLock::admitting(&env.ns);
    if fenced {
        spec["fencing"] = json!("Enforced");
    }
    let cluster_lock = e2e_support::TestClusterLock::make(env, &format!("rbac-{}", env.ns), spec).await;
    let cluster_locks: Api<ClusterLock> = Api::all(env.client.clone());
    if fenced {
        // Seen by the operator before its first claim, so that the grant is fenced.
        let seen = kube::runtime::wait::await_condition(
            cluster_locks.clone(),
            &cluster_lock.name,
            |l: Option<&ClusterLock>| l.is_some_and(|l| l.status.is_some()),
        );
        tokio::time::timeout(Duration::from_secs(60), seen).await.expect("the ClusterLock's status written").unwrap();
    }
    env.claim_spec("cl", json!({ "clusterLockName": cluster_lock.name })).await;
    env.wait_phase("cl", Phase::Held).await;
    let counted = kube::runtime::wait::await_condition(cluster_locks, &cluster_lock.name, |l: Option<&ClusterLock>| {
        l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.held == 1)
    });
    tokio::time::timeout(Duration::from_secs(60), counted)
        .await
        .expect("the ClusterLock's status counts its holder")
        .unwrap();
    env.delete_claim("cl").await;
    env.wait_gone("cl").await;
    // A second grant: the ClusterLocks' fencing parameter, made by the first, is patched.
    env.claim_spec("cl2", json!({ "clusterLockName": cluster_lock.name })).await;
    env.wait_phase("cl2", Phase::Held).await;
    env.delete_claim("cl2").await;
    env.wait_gone("cl2").await;
}

/// Renders the chart into a release namespace of its own, runs the scenario with the operator as
/// the chart configures it, and checks the requests against the rendered RBAC.
async fn derive_and_check(label: &str, watch_other: bool, kubeconfig: &std::path::Path) -> String {
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let env = Env::on(kubeconfig, zk, false).await;
    let release_ns = format!("{}-rel", env.ns);
    create_namespace(&env, &release_ns).await;
    let other = format!("{}-other", env.ns);
    let mut sets = vec![];
    let watch = format!("watchNamespaces={{{},{other}}}", env.ns);
    if watch_other {
        create_namespace(&env, &other).await;
        sets.push(watch.as_str());
    }
    // A cluster before 1.30 (ZKLOCK_TEST_EPOCH_POLICY=off) gets the chart without the epoch
    // policy (the operator proves the policy before it writes a status, and would write none).
    let real = e2e_support::epoch_policy();
    if !real {
        sets.push("leaderElection.epochPolicy=false");
        sets.push("fencing.admissionPolicy=false");
    }
    // A release name of its own: the policy and its binding are cluster-scoped and made for
    // real here, and `chart::rendered_manifests_are_valid` dry-runs the default release's on the
    // same API server (a binding of that name deleted here between its GET and its PATCH failed
    // that test).
    let release = format!("zr{}", &env.ns[env.ns.len() - 8..]);
    let docs = documents(&render_release(&release, &release_ns, None, &sets).expect("helm template"));
    let grants = Grants::from_rendered(&docs);
    // The epoch's and the fencing ones (the credentials' policy is another, of the bundled
    // ensemble).
    let policy_docs: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            kind(d).starts_with("ValidatingAdmissionPolicy")
                && ["-leader-epoch", "-fencing", "-fencing-cluster-locks"].iter().any(|s| name(d).ends_with(s))
        })
        .collect();
    let rendered = if real { 2 + 4 } else { 0 };
    assert_eq!(policy_docs.len(), rendered, "{label}: the chart renders the epoch and fencing policies where served");
    // Removed when the test ends, passed or failed: their names are this release's.
    let mut _made = vec![];
    if real {
        for doc in &policy_docs {
            _made.push(e2e_support::ClusterObject::delete_later(&env, resource_of(doc), name(doc)));
            apply(&env, doc).await;
        }
    }

    let dir = std::env::temp_dir().join(format!("zklock-chart-rbac-{}", env.ns));
    std::fs::create_dir_all(&dir).unwrap();
    let (audit, log) = (dir.join("api-requests.log"), dir.join("operator.log"));
    let (mut child, metrics) = start_operator(&docs, &env, &audit, &log);
    await_leading(label, &metrics, &log).await;
    scenario(&env, real).await;
    // A standby (it watches the lease), then SIGTERM: the leader gives the lease up and the
    // standby takes over; its term raises the epoch the first wrote.
    let standby_audit = dir.join("api-requests-standby.log");
    let (mut child2, metrics) = start_operator(&docs, &env, &standby_audit, &log);
    await_standing_by(label, &metrics, &log).await;
    stop(label, &mut child, &log);
    let mut child = {
        await_leading(label, &metrics, &log).await;
        std::mem::replace(&mut child2, Running(Command::new("true").spawn().expect("a placeholder")))
    };
    let _ = child2.wait();
    env.claim("after", "maint", json!({})).await;
    env.wait_phase("after", Phase::Held).await;
    env.delete_claim("after").await;
    env.wait_gone("after").await;
    stop(label, &mut child, &log);

    let lines = std::fs::read_to_string(&audit).expect("the request log")
        + &std::fs::read_to_string(&standby_audit).expect("the standby's request log");
    let requests: Vec<Request> = lines.lines().map(parse_request).collect();
    assert!(requests.len() > 10, "{label}: too few requests logged: {lines}");
    let lease_writes =
        requests.iter().filter(|r| r.resource == "leases").all(|r| r.namespace.as_deref() == Some(&release_ns));
    assert!(lease_writes, "{label}: the Lease must live in the release namespace");
    match check(&requests, &grants) {
        Ok(table) => format!("{label} (release namespace {release_ns}):\n{table}"),
        Err(e) => panic!("{label}: {e}\noperator log: {}", log.display()),
    }
}

/// Waits until the operator says it leads and is ready (re-anchored).
pub(crate) async fn await_leading(label: &str, metrics: &str, log: &std::path::Path) {
    await_role(label, metrics, log, true).await
}

/// Waits until the operator at `metrics` stands by: ready, and not leading.
async fn await_standing_by(label: &str, metrics: &str, log: &std::path::Path) {
    await_role(label, metrics, log, false).await
}

/// Waits until the operator at `metrics` is ready and leads (`leading`) or stands by.
async fn await_role(label: &str, metrics: &str, log: &std::path::Path, leading: bool) {
    let gauge = if leading { "zklock_leader 1" } else { "zklock_leader 0" };
    let ready = async {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let role = http_get(metrics, "/metrics").await.is_some_and(|m| m.contains(gauge));
            if role && http_get(metrics, "/readyz").await.is_some_and(|b| b.trim() == "ready") {
                return;
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), ready).await.is_err() {
        let role = if leading { "lead" } else { "stand by" };
        panic!("{label}: the operator did not {role}:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    }
}

/// SIGTERM, and a clean exit.
pub(crate) fn stop(label: &str, child: &mut Child, log: &std::path::Path) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let status = child.wait().unwrap();
    assert!(status.success(), "{label}: operator exit {status:?}:\n{}", std::fs::read_to_string(log).unwrap());
}

/// The resource kubectl names a rendered admission policy document by.
fn resource_of(doc: &Value) -> &'static str {
    match kind(doc) {
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicy",
        "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybinding",
        other => panic!("not an admission policy document: {other}"),
    }
}

/// Creates (or updates) a rendered object with server-side apply.
pub(crate) async fn apply(env: &Env, doc: &Value) {
    let (group, version) = doc["apiVersion"].as_str().unwrap().rsplit_once('/').unwrap_or(("", "v1"));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind(doc));
    let (resource, _) = kube::discovery::pinned_kind(&env.client, &gvk).await.expect("a served kind");
    let api: Api<kube::api::DynamicObject> = match doc["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(env.client.clone(), ns, &resource),
        None => Api::all_with(env.client.clone(), &resource),
    };
    let object: kube::api::DynamicObject = serde_json::from_value(doc.clone()).unwrap();
    let params = kube::api::PatchParams::apply("zklock-tests").force();
    api.patch(name(doc), &params, &kube::api::Patch::Apply(&object))
        .await
        .unwrap_or_else(|e| panic!("apply {}: {e}", name(doc)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_rbac_grants_exactly_the_operators_requests() {
    let scoped = derive_and_check("watchNamespaces (Roles)", true, zklock_testkit::kube::kubeconfig()).await;
    let cluster =
        derive_and_check("default values (ClusterRole)", false, zklock_testkit::kube::private_control_plane("rbac"))
            .await;
    eprintln!("permissions derived from the operator's requests:\n{cluster}\n{scoped}");
}

#[test]
fn a_request_the_chart_does_not_grant_fails_the_check() {
    let docs = documents(&render("zklock-system", None, &[]).unwrap());
    let grants = Grants::from_rendered(&docs);
    let lines = [
        "GET /apis/zklock.io/v1alpha1/lockclaims?watch=true&resourceVersion=1",
        "PATCH /apis/zklock.io/v1alpha1/namespaces/shop/lockclaims/a/status",
        "GET /apis/coordination.k8s.io/v1/namespaces/zklock-system/leases/zklock-leader",
    ];
    let requests: Vec<Request> = lines.iter().map(|l| parse_request(l)).collect();
    assert!(grants.allows(&requests[0]).is_some() && grants.allows(&requests[1]).is_some());
    assert!(grants.allows(&requests[2]).is_some());
    for line in [
        "DELETE /api/v1/namespaces/shop/pods/worker",
        "PUT /apis/zklock.io/v1alpha1/namespaces/shop/lockclaims/a",
        "GET /apis/coordination.k8s.io/v1/namespaces/shop/leases/zklock-leader",
        "PUT /apis/coordination.k8s.io/v1/namespaces/zklock-system/leases/someone-else",
        "POST /api/v1/namespaces/shop/events",
    ] {
        let r = parse_request(line);
        assert!(grants.allows(&r).is_none(), "{line} must not be granted");
        let mut with = requests.clone();
        with.push(r);
        assert!(check(&with, &grants).is_err(), "{line}: the check must fail");
    }
    // And a grant nobody uses fails it too (here: everything but three requests is unused).
    assert!(check(&requests, &grants).unwrap_err().contains("never used"));
}

/// The chart installed for real (`helm install`, with its own epoch policy, RBAC and
/// ServiceAccount), and the operator binary run locally as the chart runs it, with a token of the
/// chart's ServiceAccount (TokenRequest): the API server enforces RBAC, so the operator works with
/// exactly what the chart grants, and a verb the chart lacks fails this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_works_with_the_charts_own_serviceaccount() {
    if !e2e_support::epoch_policy() {
        panic!("installing the chart needs a real API server (the project's control plane, or ZKLOCK_TEST_KUBECONFIG)");
    }
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let env = Env::on(zklock_testkit::kube::kubeconfig(), zk.clone(), false).await;
    let release_ns = format!("{}-rel", env.ns);
    create_namespace(&env, &release_ns).await;
    let release = format!("zl{}", &env.ns[env.ns.len() - 8..]);
    let (host, chroot) = zk.split_at(zk.find('/').unwrap_or(zk.len()));
    let sets = [
        format!("watchNamespaces={{{}}}", env.ns),
        "zookeeper.bundled.enabled=false".to_string(),
        format!("zookeeper.connectString={host}"),
        format!("zookeeper.chroot={chroot}"),
        "replicaCount=1".to_string(),
    ];
    let mut install = helm_on(zklock_testkit::kube::kubeconfig());
    install.args(["install", &release]).arg(chart()).args(["--namespace", &release_ns, "--skip-crds", "--wait=false"]);
    for set in &sets {
        install.args(["--set", set]);
    }
    let out = install.output().expect("run helm install");
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The same objects, rendered, for the operator's args and env.
    let set_refs: Vec<&str> = sets.iter().map(String::as_str).collect();
    let docs = documents(&render_release(&release, &release_ns, None, &set_refs).expect("helm template"));
    let deployment = find(&docs, "Deployment")[0];
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap().to_string();
    let kubeconfig = token_kubeconfig(&env, &token_for(&account, &release_ns));
    let as_the_chart = env.with_kubeconfig(kubeconfig);
    let dir = std::env::temp_dir().join(format!("zklock-chart-install-{}", as_the_chart.ns));
    std::fs::create_dir_all(&dir).unwrap();
    let (audit, log) = (dir.join("api-requests.log"), dir.join("operator.log"));
    let (mut child, metrics) = start_operator(&docs, &as_the_chart, &audit, &log);
    await_leading("installed chart", &metrics, &log).await;
    scenario(&as_the_chart, true).await;
    crate::hooks::run_as_rendered(&as_the_chart, &release, &release_ns, &set_refs).await;
    stop("installed chart", &mut child, &log);
    let forbidden =
        std::fs::read_to_string(&log).unwrap_or_default().lines().filter(|l| l.contains("forbidden")).count();
    assert_eq!(forbidden, 0, "the API server refused requests of the chart's ServiceAccount: see {}", log.display());

    // RBAC of an earlier release (no ClusterLocks): the operator cannot list them, and serves
    // every other claim all the same.
    let binding = find(&docs, "ClusterRoleBinding")
        .into_iter()
        .map(name)
        .find(|n| n.ends_with("-cluster-locks"))
        .expect("the chart binds the ClusterLock grants")
        .to_string();
    let deleted = Command::new(zklock_testkit::kube::kubectl())
        .args(["delete", "clusterrolebinding", &binding])
        .env("KUBECONFIG", zklock_testkit::kube::kubeconfig())
        .output()
        .unwrap();
    assert!(deleted.status.success(), "delete {binding}: {}", String::from_utf8_lossy(&deleted.stderr));
    let log_without = dir.join("operator-without-cluster-locks.log");
    let (mut child, metrics) = start_operator(&docs, &as_the_chart, &dir.join("api-requests-2.log"), &log_without);
    await_leading("installed chart without the ClusterLock grants", &metrics, &log_without).await;
    as_the_chart.claim("without-cluster-locks", "other", json!({})).await;
    as_the_chart.wait_phase("without-cluster-locks", Phase::Held).await;
    stop("installed chart without the ClusterLock grants", &mut child, &log_without);
    let said = std::fs::read_to_string(&log_without).unwrap_or_default();
    assert!(
        said.contains("cannot list ClusterLock objects"),
        "the operator says what to grant: see {}",
        log_without.display()
    );

    let out = helm_on(zklock_testkit::kube::kubeconfig())
        .args(["uninstall", &release, "--namespace", &release_ns, "--wait=false", "--no-hooks"])
        .output()
        .expect("run helm uninstall");
    assert!(out.status.success(), "helm uninstall: {}", String::from_utf8_lossy(&out.stderr));
}

/// A token of ServiceAccount `account` in `ns` (TokenRequest), good for an hour.
pub(crate) fn token_for(account: &str, ns: &str) -> String {
    token_for_on(zklock_testkit::kube::kubeconfig(), account, ns)
}

/// [`token_for`] on the API server of `kubeconfig`.
pub(crate) fn token_for_on(kubeconfig: &std::path::Path, account: &str, ns: &str) -> String {
    let out = Command::new(zklock_testkit::kube::kubectl())
        .args(["create", "token", account, "-n", ns, "--duration=1h"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success() && !token.is_empty(), "a token for ServiceAccount {ns}/{account}: {out:?}");
    token
}

/// A kubeconfig for the API server under test that authenticates with `token` only.
pub(crate) fn token_kubeconfig(env: &Env, token: &str) -> std::path::PathBuf {
    token_kubeconfig_on(zklock_testkit::kube::kubeconfig(), token, &env.ns)
}

/// [`token_kubeconfig`] for the API server of `kubeconfig`, with `namespace` its default.
pub(crate) fn token_kubeconfig_on(kubeconfig: &std::path::Path, token: &str, namespace: &str) -> std::path::PathBuf {
    let original = kube::config::Kubeconfig::read_from(kubeconfig).expect("the test kubeconfig");
    let cluster = original.clusters.first().and_then(|c| c.cluster.clone()).expect("a cluster");
    let server = cluster.server.clone().expect("a server");
    let ca = match (&cluster.certificate_authority, &cluster.certificate_authority_data) {
        (Some(file), _) => format!("certificate-authority: {file}"),
        (None, Some(data)) => format!("certificate-authority-data: {data}"),
        (None, None) => "insecure-skip-tls-verify: true".to_string(),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    {ca}\nusers:\n- name: sa\n  \
         user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: sa, namespace: {}}}\ncurrent-context: c\n",
        namespace
    );
    let path = std::env::temp_dir().join(format!("zklock-sa-{namespace}-{}.kubeconfig", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, text).unwrap();
    path
}

/// The epoch policy and its binding are cluster-scoped; its parameter lives in the release's
/// namespace. Deleting that namespace (instead of `helm uninstall`) used to leave the binding
/// behind with its parameter gone, and the API server then refused every status write in the
/// namespaces it covered, for the next installation too. The chart makes both owned by the
/// release's namespace, so the garbage collector takes them along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_whose_namespace_is_deleted_leaves_no_epoch_binding_behind() {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    assert!(e2e_support::epoch_policy(), "the control plane serves the policy");
    let zk = zklock_testkit::ZkServer::shared().chroot().await;
    let env = Env::on(zklock_testkit::kube::kubeconfig(), zk.clone(), false).await;
    let release_ns = format!("{}-gone", env.ns);
    create_namespace(&env, &release_ns).await;
    let release = format!("zg{}", &env.ns[env.ns.len() - 8..]);
    let (host, chroot) = zk.split_at(zk.find('/').unwrap_or(zk.len()));
    let mut install = helm_on(zklock_testkit::kube::kubeconfig());
    install.args(["install", &release]).arg(chart()).args(["--namespace", &release_ns, "--skip-crds", "--wait=false"]);
    for set in [
        format!("watchNamespaces={{{}}}", env.ns),
        "zookeeper.bundled.enabled=false".to_string(),
        format!("zookeeper.connectString={host}"),
        format!("zookeeper.chroot={chroot}"),
        "replicaCount=1".to_string(),
    ] {
        install.args(["--set", &set]);
    }
    let out = install.output().expect("run helm install");
    assert!(out.status.success(), "helm install: {}", String::from_utf8_lossy(&out.stderr));
    let name = format!("{release}-zklock-leader-epoch");
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(env.client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(env.client.clone());
    let binding = bindings.get(&name).await.expect("the chart's binding");
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let uid = namespaces.get(&release_ns).await.expect("the release's namespace").metadata.uid;
    let owners = binding.metadata.owner_references.unwrap_or_default();
    assert!(
        owners.iter().any(|o| o.kind == "Namespace" && o.name == release_ns && Some(&o.uid) == uid.as_ref()),
        "the binding is owned by the release's namespace: {owners:?}"
    );

    namespaces.delete(&release_ns, &DeleteParams::default()).await.expect("delete the release's namespace");
    let gone = async {
        loop {
            let left = (bindings.get_opt(&name).await, policies.get_opt(&name).await);
            if matches!(left, (Ok(None), Ok(None))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::time::timeout(e2e_support::PATIENCE * 2, gone).await.unwrap_or_else(|_| {
        panic!("the policy and binding {name} outlived their namespace by {:?}", e2e_support::PATIENCE * 2)
    });
}
