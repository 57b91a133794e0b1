//! The Helm chart `charts/zklock`, with the real helm and kubectl: lint, render, server-side
//! dry-run against the API server under test, YAML-level checks of what a dry run cannot tell,
//! the values schema, and the chart's ties to the crate (version, CRD, flags).

use crate::chart_support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};

use chart_support::*;
use serde_json::Value;

const NS: &str = "zklock-system";

#[test]
fn chart_versions_follow_the_crate() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let meta: Value = serde_yaml::from_str(&text).unwrap();
    let crate_version = env!("CARGO_PKG_VERSION");
    assert_eq!(meta["appVersion"].as_str(), Some(crate_version), "Chart.yaml appVersion must be Cargo.toml's version");
    assert_eq!(meta["version"].as_str(), Some(crate_version), "Chart.yaml version must be Cargo.toml's version");
}

#[test]
fn chart_crds_are_the_generated_ones() {
    for (file, generated) in zklock::api::crds() {
        let in_chart = std::fs::read_to_string(chart().join("crds").join(file)).unwrap();
        let in_repo = std::fs::read_to_string(root().join("crds").join(file)).unwrap();
        assert!(
            in_chart == generated,
            "charts/zklock/crds/{file} is out of date: run `cargo run -- crd --dir charts/zklock/crds`"
        );
        assert_eq!(in_chart, in_repo, "the chart's {file} differs from crds/{file}");
    }
}

#[test]
fn lint_strict_passes_for_every_value_set() {
    let sets = value_sets();
    assert!(sets.len() >= 4, "the defaults and at least three other value sets: {sets:?}");
    for (label, values) in sets {
        let mut cmd = helm();
        cmd.args(["lint", "--strict", "--namespace", NS]).arg(chart());
        if let Some(values) = &values {
            cmd.arg("--values").arg(values);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "helm lint --strict with {label}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn values_schema_rejects_bad_values() {
    // (the --set pairs, what the error must mention)
    let cases: &[(&[&str], &[&str])] = &[
        (&["replicaCount=-1"], &["/replicaCount", "minimum"]),
        (&["replicaCount=0"], &["/replicaCount", "minimum"]),
        (&["zookeeper.bundled.enabled=false"], &["/zookeeper/connectString", "minLength"]),
        (
            &["zookeeper.bundled.enabled=false", "zookeeper.connectString=zk:2181/chroot"],
            &["/zookeeper/connectString", "pattern"],
        ),
        (&["zookeeper.connectString=zk:2181"], &["/zookeeper/connectString", "maxLength"]),
        (&["logFormat=xml"], &["/logFormat", "json", "text"]),
        (&["zookeeper.bundled.replicas=2"], &["/zookeeper/bundled/replicas", "1, 3"]),
        (&["leaderElection.enabled=false"], &["/replicaCount", "must be 1"]),
        (&["replicas=2"], &["additional properties 'replicas'"]),
        (&["zookeeper.tls.enabled=true"], &["/zookeeper/tls/existingSecret"]),
        (&["zookeeper.sessionTimeout=10 seconds"], &["/zookeeper/sessionTimeout", "pattern"]),
        (&["zookeeper.chroot=no-slash"], &["/zookeeper/chroot", "pattern"]),
        (&["zookeeper.root=/"], &["/zookeeper/root", "pattern"]),
        (&["watchNamespaces={Team_A}"], &["/watchNamespaces/0", "pattern"]),
        (&["metrics.port=70000"], &["/metrics/port", "maximum"]),
        (&["image.digest=latest"], &["/image/digest", "pattern"]),
        (&["image.pullPolicy=Sometimes"], &["/image/pullPolicy"]),
    ];
    let mut table = String::new();
    for (sets, expected) in cases {
        let error = match render(NS, None, sets) {
            Ok(_) => panic!("the schema accepted {sets:?}"),
            Err(e) => e,
        };
        assert!(
            error.contains("values don't meet the specifications of the schema"),
            "{sets:?}: not a schema error: {error}"
        );
        for word in *expected {
            assert!(error.contains(word), "{sets:?}: the error does not mention {word:?}:\n{error}");
        }
        let first = error.lines().rfind(|l| l.trim_start().starts_with("- at")).unwrap_or("").trim();
        table.push_str(&format!("{:<70} {first}\n", sets.join(" ")));
    }
    eprintln!("schema rejections:\n{table}");
}

/// Flags of `zklock run --help`.
fn run_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_zklock")).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    help.lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| format!("--{}", l.split([' ', '=', '<']).next().unwrap()))
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

fn operator_container(docs: &[Value]) -> &Value {
    let deployments = find(docs, "Deployment");
    assert_eq!(deployments.len(), 1, "one Deployment");
    &deployments[0]["spec"]["template"]["spec"]["containers"][0]
}

/// The operator's args as flag → values.
fn operator_args(docs: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for arg in strings(&operator_container(docs)["args"]).into_iter().skip(1) {
        let (flag, value) = arg.split_once('=').map_or((arg.clone(), String::new()), |(f, v)| (f.into(), v.into()));
        flags.entry(flag).or_default().push(value);
    }
    flags
}

#[test]
fn every_operator_flag_is_reachable_from_values() {
    let known = run_flags();
    let mut used = BTreeSet::new();
    for (label, values) in value_sets() {
        let docs = documents(&render(NS, values.as_deref(), &[]).unwrap());
        let container = operator_container(&docs);
        assert_eq!(strings(&container["args"]).first().map(String::as_str), Some("run"), "{label}");
        // The binary accepts the args as rendered: it gets past parsing (clap exits with 2 on a
        // usage error) and stops at the first thing missing here (a mounted file, or the API).
        let args = strings(&container["args"]);
        let out = Command::new(env!("CARGO_BIN_EXE_zklock"))
            .args(&args)
            .env("KUBECONFIG", std::env::temp_dir().join("zklock-chart-no-kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(1)
                && (stderr.contains("no Kubernetes API") || stderr.contains("cannot read --zk-")),
            "{label}: zklock {args:?}: {:?}\n{stderr}",
            out.status
        );
        for flag in operator_args(&docs).keys() {
            assert!(known.contains(flag), "{label}: the chart passes {flag}, which `zklock run` does not know");
            used.insert(flag.clone());
        }
    }
    // --zk-auth and --zk-previous-auth take the password on the command line; the chart passes
    // a Secret file instead (ZKLOCK_ZK_AUTH through extraEnv remains possible).
    let on_the_command_line = ["--zk-auth", "--zk-previous-auth"];
    let missing: Vec<_> =
        known.iter().filter(|f| !used.contains(*f) && !on_the_command_line.contains(&f.as_str())).collect();
    assert!(missing.is_empty(), "flags of `zklock run` no value set reaches: {missing:?}");
}

fn check_pod_spec(label: &str, what: &str, spec: &Value) {
    let pod = &spec["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true, "{label} {what}: runAsNonRoot");
    assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault", "{label} {what}: seccomp");
    let init = spec["initContainers"].as_array().cloned().unwrap_or_default();
    for c in spec["containers"].as_array().unwrap().iter().chain(&init) {
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{label} {what}: read-only root filesystem");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{label} {what}: no privilege escalation");
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{label} {what}: drop ALL capabilities");
        assert!(c["resources"]["requests"].is_object(), "{label} {what}: resource requests");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{label} {what}: a memory limit");
        if init.contains(c) {
            continue;
        }
        for probe in ["readinessProbe", "livenessProbe"] {
            if let Some(command) = c[probe]["exec"]["command"].as_array() {
                assert!(!command.is_empty(), "{label} {what}: {probe} runs a command");
                continue;
            }
            let port = &c[probe]["httpGet"]["port"];
            let ports: Vec<&Value> = c["ports"].as_array().unwrap().iter().map(|p| &p["name"]).collect();
            assert!(ports.contains(&port), "{label} {what}: {probe} port {port} is not a container port");
        }
    }
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

/// Paths of `original` that do not survive `typed` (unknown fields, or values of another type).
fn lost_fields(original: &Value, typed: &Value, path: &str, lost: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, v) in o {
                match t.get(k) {
                    Some(tv) => lost_fields(v, tv, &format!("{path}.{k}"), lost),
                    None => lost.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(o), Value::Array(t)) if o.len() == t.len() => {
            for (i, (v, tv)) in o.iter().zip(t).enumerate() {
                lost_fields(v, tv, &format!("{path}[{i}]"), lost);
            }
        }
        (Value::Number(o), Value::Number(t)) if o.as_f64() == t.as_f64() => {}
        (o, t) if o == t => {}
        (o, t) => lost.push(format!("{path}: {o} became {t}")),
    }
}

/// Strict schema check of a built-in kind: it must deserialize into the k8s-openapi type, and
/// every field must survive the round trip (k8s-openapi drops unknown fields). Returns false for
/// kinds without a type here.
fn typed_round_trip(doc: &Value) -> Result<bool, String> {
    use k8s_openapi::api::{admissionregistration, apps, core, networking, policy, rbac};
    fn trip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Result<bool, String> {
        let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
        let mut lost = vec![];
        lost_fields(doc, &serde_json::to_value(&typed).unwrap(), "", &mut lost);
        if lost.is_empty() {
            Ok(true)
        } else {
            Err(format!("unknown or mistyped fields: {lost:?}"))
        }
    }
    match kind(doc) {
        "Deployment" => trip::<apps::v1::Deployment>(doc),
        "StatefulSet" => trip::<apps::v1::StatefulSet>(doc),
        "Service" => trip::<core::v1::Service>(doc),
        "ServiceAccount" => trip::<core::v1::ServiceAccount>(doc),
        "ConfigMap" => trip::<core::v1::ConfigMap>(doc),
        "Secret" => trip::<core::v1::Secret>(doc),
        "Pod" => trip::<core::v1::Pod>(doc),
        "Job" => trip::<k8s_openapi::api::batch::v1::Job>(doc),
        "PodDisruptionBudget" => trip::<policy::v1::PodDisruptionBudget>(doc),
        "NetworkPolicy" => trip::<networking::v1::NetworkPolicy>(doc),
        "Role" => trip::<rbac::v1::Role>(doc),
        "RoleBinding" => trip::<rbac::v1::RoleBinding>(doc),
        "ClusterRole" => trip::<rbac::v1::ClusterRole>(doc),
        "ClusterRoleBinding" => trip::<rbac::v1::ClusterRoleBinding>(doc),
        "ValidatingAdmissionPolicy" => trip::<admissionregistration::v1::ValidatingAdmissionPolicy>(doc),
        "ValidatingAdmissionPolicyBinding" => trip::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(doc),
        "MutatingAdmissionPolicy" => trip::<admissionregistration::v1::MutatingAdmissionPolicy>(doc),
        "MutatingAdmissionPolicyBinding" => trip::<admissionregistration::v1::MutatingAdmissionPolicyBinding>(doc),
        _ => Ok(false),
    }
}

/// YAML-level checks of what a server-side dry run does not judge (labels, selectors, probes, ...).
fn check_documents(label: &str, docs: &[Value], values: &Value, ns: &str) {
    let cluster_scoped = [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Namespace",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    ];
    let mut seen = BTreeSet::new();
    for doc in docs {
        assert!(doc["apiVersion"].is_string() && !kind(doc).is_empty(), "{label}: a document without apiVersion/kind");
        let name = name(doc);
        assert!(!name.is_empty() && name.len() <= 63, "{label}: bad name {name:?} ({})", kind(doc));
        let ns_ok = if cluster_scoped.contains(&kind(doc)) {
            doc["metadata"]["namespace"].is_null()
        } else {
            doc["metadata"]["namespace"].is_string()
        };
        assert!(ns_ok, "{label}: {} {name}: namespace set exactly on namespaced kinds", kind(doc));
        let key = format!("{}/{}/{}", kind(doc), doc["metadata"]["namespace"].as_str().unwrap_or(""), name);
        let typed = typed_round_trip(doc).unwrap_or_else(|e| panic!("{label}: {key}: {e}"));
        assert!(
            typed || matches!(kind(doc), "ServiceMonitor" | "PrometheusRule"),
            "{label}: {key}: no schema check for this kind"
        );
        assert!(seen.insert(key.clone()), "{label}: {key} rendered twice");
        let wildcard = doc["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| ["apiGroups", "resources", "verbs"].iter().any(|k| strings(&r[k]).iter().any(|s| s == "*")));
        assert!(!wildcard, "{label}: {key} has a wildcard rule");
    }

    // The operator.
    let deployment = find(docs, "Deployment")[0];
    let template = &deployment["spec"]["template"];
    assert!(
        labels_match(&deployment["spec"]["selector"]["matchLabels"], &template["metadata"]["labels"]),
        "{label}: Deployment selector"
    );
    assert_eq!(deployment["spec"]["replicas"], values["replicaCount"], "{label}: replicas");
    check_pod_spec(label, "operator", &template["spec"]);
    let spread = template["spec"]["topologySpreadConstraints"].as_array().expect("topology spread");
    assert!(spread.iter().all(|c| labels_match(&c["labelSelector"]["matchLabels"], &template["metadata"]["labels"])));
    let container = operator_container(docs);
    let args = operator_args(docs);
    let env: Vec<&Value> = container["env"].as_array().unwrap().iter().collect();
    let pod_name = env.iter().find(|e| e["name"] == "POD_NAME").expect("POD_NAME");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name",
        "{label}: identity from the downward API"
    );
    let port = values["metrics"]["port"].as_u64().unwrap();
    assert_eq!(args["--metrics-addr"], [format!("0.0.0.0:{port}")], "{label}");
    assert_eq!(container["ports"][0]["containerPort"].as_u64(), Some(port), "{label}");
    if values["leaderElection"]["enabled"] == true {
        assert_eq!(args["--lease-namespace"], [ns], "{label}: the Lease lives in the release namespace");
        let lease = values["leaderElection"]["leaseName"].as_str().expect("leaderElection.leaseName");
        assert_eq!(args["--lease-name"], [lease], "{label}: the Lease of leaderElection.leaseName");
        let granted: Vec<String> = find(docs, "Role")
            .into_iter()
            .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
            .filter(|rule| rule["resources"] == serde_json::json!(["leases"]))
            .flat_map(|rule| strings(&rule["resourceNames"]))
            .collect();
        assert_eq!(granted, [lease], "{label}: the operator may use that Lease alone");
        check_epoch_policy(label, docs, values, &args, ns);
    } else {
        assert!(args.contains_key("--no-leader-election") && values["replicaCount"] == 1, "{label}");
    }
    check_finalizer_policy(label, docs, values);
    check_fencing_policy(label, docs, values, &args, ns);
    check_dashboard(label, docs, values);
    assert_eq!(args["--log-format"], [values["logFormat"].as_str().unwrap()], "{label}");
    let watch: Vec<String> = strings(&values["watchNamespaces"]);
    assert_eq!(args.get("--watch-namespace").cloned().unwrap_or_default(), watch, "{label}: watched namespaces");
    let zk = &values["zookeeper"];
    let connect = &args["--zk-connect"][0];
    let chroot = zk["chroot"].as_str().unwrap();
    if zk["bundled"]["enabled"] == true {
        let services: Vec<&str> = find(docs, "Service").into_iter().map(name).collect();
        let host = connect.split(':').next().unwrap();
        let service = host.split('.').next().unwrap();
        assert!(
            services.contains(&service) && host.ends_with(&format!(".{ns}.svc")),
            "{label}: {connect} is no bundled Service"
        );
        assert!(connect.ends_with(&format!(":2181{chroot}")), "{label}: {connect}");
    } else {
        assert_eq!(connect, &format!("{}{chroot}", zk["connectString"].as_str().unwrap()), "{label}");
    }
    // With the bundled ensemble and no Secret given, credentials the operator makes once: the
    // render names the Secret and holds none (a render that drew them would draw new ones at
    // every `helm template`), and the operator may read and create that Secret alone.
    let generated =
        zk["bundled"]["enabled"] == true && zk["auth"]["generate"] == true && zk["auth"]["existingSecret"] == "";
    let auth_secret = zk["auth"]["existingSecret"].clone();
    assert!(find(docs, "Secret").is_empty(), "{label}: the chart renders no Secret");
    if generated {
        let zookeeper = find(docs, "StatefulSet").into_iter().map(name).next().expect("the bundled StatefulSet");
        let secret = format!("{zookeeper}-auth");
        assert_eq!(args.get("--zk-auth-secret"), Some(&vec![secret.clone()]), "{label}: the credentials' Secret");
        assert!(!args.contains_key("--zk-auth-file"), "{label}: generated credentials are read through the API");
        let grants = find(docs, "Role")
            .into_iter()
            .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
            .filter(|rule| rule["resources"] == serde_json::json!(["secrets"]))
            .map(|rule| (strings(&rule["verbs"]), strings(&rule["resourceNames"])))
            .collect::<Vec<_>>();
        assert_eq!(
            grants,
            [(vec!["create".to_string()], vec![]), (vec!["get".to_string()], vec![secret])],
            "{label}: the operator's only Secret permissions"
        );
    } else {
        assert!(!args.contains_key("--zk-auth-secret"), "{label}: no generated credentials");
    }
    if generated || zk["auth"]["existingSecret"] != "" {
        assert!(
            args.contains_key("--zk-auth-file") || args.contains_key("--zk-auth-secret"),
            "{label}: the operator gets no credentials"
        );
        assert_eq!(
            args.get("--zk-contenders").map(|v| v[0].as_str()),
            Some(zk["auth"]["contenders"].as_str().filter(|c| !c.is_empty()).unwrap_or("listed")),
            "{label}"
        );
    }
    for (flag, secret) in [("--zk-auth-file", &auth_secret), ("--zk-tls-ca", &zk["tls"]["existingSecret"])] {
        if let Some(file) = args.get(flag) {
            let volumes = template["spec"]["volumes"].as_array().expect("volumes");
            let mounts = container["volumeMounts"].as_array().expect("mounts");
            let mount = mounts.iter().find(|m| file[0].starts_with(m["mountPath"].as_str().unwrap())).expect("mounted");
            let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
            assert_eq!(&volume["secret"]["secretName"], secret, "{label}: {flag} comes from the Secret");
        }
    }

    // Services and budgets select pods the chart makes.
    let pod_labels: Vec<&Value> = docs
        .iter()
        .filter(|d| matches!(kind(d), "Deployment" | "StatefulSet"))
        .map(|d| &d["spec"]["template"]["metadata"]["labels"])
        .collect();
    for doc in docs.iter().filter(|d| matches!(kind(d), "Service" | "PodDisruptionBudget" | "NetworkPolicy")) {
        let selector = match kind(doc) {
            "Service" => &doc["spec"]["selector"],
            "PodDisruptionBudget" => &doc["spec"]["selector"]["matchLabels"],
            _ => &doc["spec"]["podSelector"]["matchLabels"],
        };
        assert!(
            pod_labels.iter().any(|l| labels_match(selector, l)),
            "{label}: {} {} selects no pod",
            kind(doc),
            name(doc)
        );
    }
    if let Some(monitor) = find(docs, "ServiceMonitor").first() {
        let service =
            find(docs, "Service").into_iter().find(|s| name(s).ends_with("-metrics")).expect("metrics Service");
        assert!(
            labels_match(&monitor["spec"]["selector"]["matchLabels"], &service["metadata"]["labels"]),
            "{label}: ServiceMonitor"
        );
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], service["spec"]["ports"][0]["name"], "{label}");
    }

    // The bundled ensemble.
    let bundled = find(docs, "StatefulSet");
    assert_eq!(bundled.len(), usize::from(zk["bundled"]["enabled"] == true), "{label}: StatefulSet iff bundled");
    if let Some(sts) = bundled.first() {
        let replicas = zk["bundled"]["replicas"].as_u64().unwrap();
        assert_eq!(sts["spec"]["replicas"].as_u64(), Some(replicas));
        check_pod_spec(label, "zookeeper", &sts["spec"]["template"]["spec"]);
        let headless =
            find(docs, "Service").into_iter().find(|s| name(s) == sts["spec"]["serviceName"]).expect("headless");
        assert_eq!(headless["spec"]["clusterIP"], "None");
        assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
        let config = find(docs, "ConfigMap")
            .into_iter()
            .find_map(|m| m["data"]["zoo.cfg"].as_str())
            .expect("the bundled ensemble's zoo.cfg");
        let servers = config.lines().filter(|l| l.starts_with("server.")).count() as u64;
        assert_eq!(servers, if replicas == 1 { 0 } else { replicas }, "{label}: zoo.cfg servers\n{config}");
        let claims = sts["spec"]["volumeClaimTemplates"].as_array().map_or(0, Vec::len);
        assert_eq!(
            claims,
            usize::from(zk["bundled"]["persistence"]["enabled"] == true),
            "{label}: PVCs iff persistence"
        );
        assert_eq!(find(docs, "PodDisruptionBudget").iter().filter(|p| name(p).ends_with("-zookeeper")).count(), 1);
    }
    assert_eq!(
        find(docs, "NetworkPolicy").is_empty(),
        values["networkPolicy"]["enabled"] != true,
        "{label}: NetworkPolicies iff networkPolicy.enabled"
    );
}

/// The leader epoch's admission policy: rendered (with the parameter the operator is told of and
/// its RBAC) exactly when asked for, and the very objects `zklock::api::epoch_policy` makes.
fn check_epoch_policy(label: &str, docs: &[Value], values: &Value, args: &BTreeMap<String, Vec<String>>, ns: &str) {
    use zklock::api::epoch_policy::{epoch_policy, epoch_policy_binding};
    // The epoch's: the credentials' policy (credentials-policy.yaml) is another.
    let epoch = |d: &&Value| name(d).ends_with("-leader-epoch");
    let policies: Vec<&Value> = find(docs, "ValidatingAdmissionPolicy").into_iter().filter(epoch).collect();
    let bindings: Vec<&Value> = find(docs, "ValidatingAdmissionPolicyBinding").into_iter().filter(epoch).collect();
    if values["leaderElection"]["epochPolicy"] != true {
        assert!(policies.is_empty() && bindings.is_empty(), "{label}: no policy when epochPolicy is off");
        assert!(args.contains_key("--no-epoch-policy"), "{label}: the operator is told there is none");
        return;
    }
    assert_eq!((policies.len(), bindings.len()), (1, 1), "{label}: one policy, one binding");
    let name = args["--epoch-param"][0].clone();
    let watched = strings(&values["watchNamespaces"]);
    let spec = |v: serde_json::Value| v["spec"].clone();
    assert_eq!(policies[0]["spec"], spec(serde_json::to_value(epoch_policy(&name)).unwrap()), "{label}: the policy");
    let binding = epoch_policy_binding(&name, &name, &name, ns, &watched);
    assert_eq!(bindings[0]["spec"], spec(serde_json::to_value(binding).unwrap()), "{label}: the binding");
    let rules: Vec<&Value> = find(docs, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["namespace"] == ns)
        .flat_map(|r| r["rules"].as_array().unwrap().iter())
        .collect();
    let named = rules
        .iter()
        .any(|r| strings(&r["resources"]) == ["configmaps"] && strings(&r["resourceNames"]) == [name.clone()]);
    assert!(named, "{label}: the operator may read and raise its epoch's ConfigMap");
}

/// The fencing policies: rendered exactly when asked for, the very objects
/// `zklock::api::fencing_policy` makes for the parameter the operator is told of, and the
/// operator may write those parameters (by name) where they live.
fn check_fencing_policy(label: &str, docs: &[Value], values: &Value, args: &BTreeMap<String, Vec<String>>, ns: &str) {
    use zklock::api::fencing_policy::fencing_policies;
    let param = args["--fencing-param"][0].clone();
    let fencing = |d: &&Value| name(d) == param || name(d) == format!("{param}-cluster-locks");
    let policies: Vec<&Value> = find(docs, "ValidatingAdmissionPolicy").into_iter().filter(fencing).collect();
    let bindings: Vec<&Value> = find(docs, "ValidatingAdmissionPolicyBinding").into_iter().filter(fencing).collect();
    let rules: Vec<&Value> = find(docs, "Role")
        .into_iter()
        .chain(find(docs, "ClusterRole"))
        .flat_map(|r| r["rules"].as_array().unwrap().iter())
        .collect();
    let may_write = |configmap: &str| {
        rules.iter().any(|r| strings(&r["resources"]) == ["configmaps"] && strings(&r["resourceNames"]) == [configmap])
    };
    if values["fencing"]["admissionPolicy"] != true {
        assert!(policies.is_empty() && bindings.is_empty(), "{label}: no fencing policy when it is off");
        assert!(!may_write(&param), "{label}: no fencing parameters to write when it is off");
        return;
    }
    assert_eq!((policies.len(), bindings.len()), (2, 2), "{label}: two fencing policies, two bindings");
    let watched = strings(&values["watchNamespaces"]);
    let (made_policies, made_bindings) = fencing_policies(&param, &param, ns, &watched);
    let made = made_policies.iter().map(serde_json::to_value).chain(made_bindings.iter().map(serde_json::to_value));
    for (rendered, made) in policies.iter().chain(&bindings).zip(made) {
        let made = made.expect("the objects made are plain data");
        assert_eq!(rendered["spec"], made["spec"], "{label}: fencing {} {}", kind(rendered), name(rendered));
    }
    assert!(may_write(&param), "{label}: the operator may write the Locks' fencing parameter");
    assert!(may_write(&format!("{param}-cluster-locks")), "{label}: and the ClusterLocks'");
}

/// The finalizer's admission policy: rendered exactly when asked for (and the API server serves
/// it: the renders say it does), and the very objects `zklock::api::finalizer_policy` makes.
fn check_finalizer_policy(label: &str, docs: &[Value], values: &Value) {
    use zklock::api::finalizer_policy::{finalizer_policy, finalizer_policy_binding};
    use zklock::api::gate_policy::{gate_policy, gate_policy_binding};
    let watched = strings(&values["watchNamespaces"]);
    let spec = |v: serde_json::Value| v["spec"].clone();
    // (what, on, suffix of the name, the policy and binding the crate makes)
    type Make = fn(&str, &[String]) -> (Value, Value);
    let made: [(&str, bool, &str, Make); 2] = [
        ("finalizer", values["claims"]["finalizerPolicy"] == true, "-finalizer", |name, watched| {
            let policy = serde_json::to_value(finalizer_policy(name)).unwrap();
            (policy, serde_json::to_value(finalizer_policy_binding(name, name, watched)).unwrap())
        }),
        ("gate", values["gatedPods"]["admissionPolicy"] == true, "-gate", |name, watched| {
            let policy = serde_json::to_value(gate_policy(name)).unwrap();
            (policy, serde_json::to_value(gate_policy_binding(name, name, watched)).unwrap())
        }),
    ];
    for (what, on, suffix, make) in made {
        let policies: Vec<&Value> =
            find(docs, "MutatingAdmissionPolicy").into_iter().filter(|d| name(d).ends_with(suffix)).collect();
        let bindings: Vec<&Value> =
            find(docs, "MutatingAdmissionPolicyBinding").into_iter().filter(|d| name(d).ends_with(suffix)).collect();
        if !on {
            assert!(policies.is_empty() && bindings.is_empty(), "{label}: no {what} policy when it is off");
            continue;
        }
        assert_eq!((policies.len(), bindings.len()), (1, 1), "{label}: one {what} policy, one binding");
        let name = name(policies[0]).to_string();
        let (policy, binding) = make(&name, &watched);
        assert_eq!(policies[0]["spec"], spec(policy), "{label}: the {what} policy");
        assert_eq!(bindings[0]["spec"], spec(binding), "{label}: the {what} binding");
    }
}

/// The Grafana dashboard: shipped exactly when asked for, valid JSON, and every metric its
/// queries read is one the operator exports (a renamed metric would leave a panel empty).
fn check_dashboard(label: &str, docs: &[Value], values: &Value) {
    let maps: Vec<&Value> = find(docs, "ConfigMap").into_iter().filter(|m| name(m).ends_with("-dashboard")).collect();
    if values["metrics"]["grafanaDashboard"]["enabled"] != true {
        assert!(maps.is_empty(), "{label}: no dashboard unless asked for");
        return;
    }
    assert_eq!(maps.len(), 1, "{label}: one dashboard");
    assert_eq!(maps[0]["metadata"]["labels"]["grafana_dashboard"], "1", "{label}: the sidecar's label");
    let json = maps[0]["data"]["zklock.json"].as_str().expect("the dashboard's JSON");
    let dashboard: Value = serde_json::from_str(json).expect("the dashboard is JSON");
    // Families are written once they have a series: one each.
    let metrics = zklock::metrics::Metrics::default();
    metrics.set_phase_counts(&Default::default());
    metrics.acquire_wait.observe("ns", "lock", 0.1);
    let call = zklock::metrics::CallLabel { method: "GET".into(), resource: "pods".into(), outcome: "200".into() };
    metrics.api_calls.get_or_create(&call).inc();
    metrics.reconcile_errors.get_or_create(&zklock::metrics::ErrorLabel { error: "timeout".into() }).inc();
    let exported: BTreeSet<String> = metrics
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut read = BTreeSet::new();
    for target in panels.iter().flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default()) {
        let expr = target["expr"].as_str().expect("a query");
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if let Some(metric) = word.strip_prefix("zklock_").map(|_| word) {
                let base = ["_bucket", "_count", "_sum", "_total"]
                    .iter()
                    .find_map(|suffix| metric.strip_suffix(suffix))
                    .unwrap_or(metric);
                read.insert(base.to_string());
            }
        }
    }
    let missing: Vec<&String> = read.iter().filter(|m| !exported.contains(*m)).collect();
    assert!(missing.is_empty(), "{label}: the dashboard reads metrics the operator does not export: {missing:?}");
    for wanted in
        ["zklock_claims", "zklock_acquire_wait_seconds", "zklock_oldest_waiter_seconds", "zklock_handoff_seconds"]
    {
        assert!(read.contains(wanted), "{label}: the dashboard shows {wanted}");
    }
}

/// On a cluster that does not serve MutatingAdmissionPolicy (before 1.36) the chart renders
/// none, and the operator adds the finalizer itself.
#[test]
fn no_finalizer_policy_where_the_api_server_does_not_serve_it() {
    let out = helm().args(["template", "zklock"]).arg(chart()).args(["--namespace", "zklock-system"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs = documents(&String::from_utf8(out.stdout).unwrap());
    assert!(
        find(&docs, "MutatingAdmissionPolicy").is_empty() && find(&docs, "MutatingAdmissionPolicyBinding").is_empty()
    );
    let with = documents(&render("zklock-system", None, &[]).unwrap());
    assert_eq!(find(&with, "MutatingAdmissionPolicy").len(), 2, "the finalizer's and the gate's, where served");
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new(zklock_testkit::kube::kubectl())
        .args(args)
        .env("KUBECONFIG", zklock_testkit::kube::kubeconfig())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The effective values of a set (the defaults with the file merged over them).
fn effective_values(values: Option<&std::path::Path>) -> Value {
    let mut cmd = helm();
    cmd.args(["show", "values"]).arg(chart());
    let defaults: Value = serde_yaml::from_slice(&cmd.output().unwrap().stdout).unwrap();
    fn merge(base: &mut Value, over: &Value) {
        match (base, over) {
            (Value::Object(b), Value::Object(o)) => {
                for (k, v) in o {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
            (b, o) => *b = o.clone(),
        }
    }
    let mut merged = defaults;
    if let Some(file) = values {
        let over: Value = serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        merge(&mut merged, &over);
    }
    merged
}

/// The pod a Deployment or StatefulSet would make, for a server-side check of the pod spec
/// (the API under test serves pods, not the workload kinds). A StatefulSet's claim templates
/// become persistentVolumeClaim volumes, as the controller would mount them.
fn pod_of_template(doc: &Value) -> Option<Value> {
    if !matches!(kind(doc), "Deployment" | "StatefulSet" | "Job") {
        return None;
    }
    let template = &doc["spec"]["template"];
    let mut spec = template["spec"].clone();
    for claim in doc["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten() {
        let name = claim["metadata"]["name"].clone();
        let volume = serde_json::json!({ "name": name, "persistentVolumeClaim": { "claimName": format!("{}-{}-0", name.as_str().unwrap(), self::name(doc)) } });
        spec["volumes"].as_array_mut().unwrap().push(volume);
    }
    Some(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": format!("{}-0", name(doc)), "namespace": doc["metadata"]["namespace"], "labels": template["metadata"]["labels"] },
        "spec": spec,
    }))
}

#[test]
fn rendered_manifests_are_valid() {
    // Namespaces the manifests go to, so that server-side dry-run can check namespaced objects.
    let mut served = BTreeSet::new();
    let mut checked_by_yaml = BTreeSet::new();
    let (ok, out) = kubectl(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&std::fs::read_to_string(chart().join("crds/lockclaims.zklock.io.yaml")).unwrap()),
    );
    assert!(ok, "the chart's CRD, server-side dry-run: {out}");
    // A release namespace of its own (the API under test may be a real cluster).
    let ns = format!("zklock-chart-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let (ok, out) = kubectl(&["create", "namespace", &ns], None);
    assert!(ok, "create namespace {ns}: {out}");
    // That enforces the `restricted` Pod Security level: every pod the chart renders must pass it.
    let (ok, out) = kubectl(
        &[
            "label",
            "namespace",
            &ns,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
        None,
    );
    assert!(ok, "label namespace {ns}: {out}");
    let mut listing = String::new();
    let mut made = vec![];
    for (label, values) in value_sets() {
        let rendered =
            render(&ns, values.as_deref(), &[]).unwrap_or_else(|e| panic!("helm template with {label}: {e}"));
        let docs = documents(&rendered);
        let effective = effective_values(values.as_deref());
        check_documents(&label, &docs, &effective, &ns);
        // A real API server refuses objects in namespaces that do not exist: the namespaces a
        // value set serves are made for the dry run (and removed after, if made here).
        for watched in strings(&effective["watchNamespaces"]) {
            let (exists, _) = kubectl(&["get", "namespace", &watched], None);
            if !exists {
                let (ok, out) = kubectl(&["create", "namespace", &watched], None);
                assert!(ok, "create namespace {watched}: {out}");
                made.push(watched);
            }
        }
        listing.push_str(&format!("{label}:\n"));
        // A real API server refuses a pod whose ServiceAccount does not exist (the dry runs make
        // none): the one the chart makes, or the existing one it is told of.
        let ensure_account = |pod: &Value| {
            let pod_ns = pod["metadata"]["namespace"].as_str().unwrap_or(&ns).to_string();
            if let Some(account) = pod["spec"]["serviceAccountName"].as_str() {
                let (ok, out) = kubectl(&["get", "serviceaccount", account, "-n", &pod_ns], None);
                if !ok && out.contains("NotFound") {
                    let (ok, out) = kubectl(&["create", "serviceaccount", account, "-n", &pod_ns], None);
                    assert!(ok, "create the ServiceAccount {account}: {out}");
                }
            }
        };
        for doc in &docs {
            if kind(doc) == "Pod" {
                ensure_account(doc);
            }
            let yaml = serde_yaml::to_string(doc).unwrap();
            let (ok, out) = kubectl(&["apply", "--dry-run=server", "--validate=strict", "-f", "-"], Some(&yaml));
            let what = format!("{} {}", kind(doc), name(doc));
            let how = if ok {
                served.insert(kind(doc).to_string());
                "server dry-run"
            } else if out.contains("no matches for kind") || out.contains("ensure CRDs are installed first") {
                checked_by_yaml.insert(kind(doc).to_string());
                "YAML checks"
            } else {
                panic!("{label}: {what} rejected by the API server (dry-run):\n{out}\n{yaml}");
            };
            listing.push_str(&format!("  {what:<55} {how}\n"));
            if let Some(pod) = pod_of_template(doc) {
                ensure_account(&pod);
                let yaml = serde_yaml::to_string(&pod).unwrap();
                let (ok, out) = kubectl(&["apply", "--dry-run=server", "--validate=strict", "-f", "-"], Some(&yaml));
                assert!(ok, "{label}: the pod template of {what} rejected by the API server (dry-run):\n{out}\n{yaml}");
                listing.push_str(&format!("  {:<55} server dry-run (as a Pod)\n", format!("{what} pod template")));
                // In a namespace that enforces the restricted level (the release's does).
                let mut restricted = pod.clone();
                restricted["metadata"]["namespace"] = Value::String(ns.clone());
                ensure_account(&restricted);
                let yaml = serde_yaml::to_string(&restricted).unwrap();
                let (ok, out) = kubectl(&["apply", "--dry-run=server", "--validate=strict", "-f", "-"], Some(&yaml));
                assert!(ok, "{label}: {what}'s pod under the restricted Pod Security level:\n{out}");
            }
        }
    }
    for namespace in made {
        let _ = kubectl(&["delete", "namespace", &namespace, "--wait=false"], None);
    }
    eprintln!("{listing}server-side dry-run: {served:?}\nYAML-level checks only (not served by the API under test): {checked_by_yaml:?}");
    assert!(served.contains("ServiceAccount") && served.contains("ConfigMap"), "the served kinds went through dry-run");
}

/// On OpenShift (`security.openshift.io/v1` served) every pod takes the UID and group its
/// namespace's range assigns: the chart names none, and still asks for a non-root user.
#[test]
fn on_openshift_no_pod_names_a_user_or_group() {
    let out = helm()
        .args(["template", "zklock"])
        .arg(chart())
        .args(["--namespace", NS, "--api-versions", "security.openshift.io/v1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs = documents(&String::from_utf8(out.stdout).unwrap());
    let elsewhere = documents(&render(NS, None, &[]).unwrap());
    let pods = |docs: &[Value]| -> Vec<Value> { docs.iter().filter_map(pod_of_template).collect() };
    assert!(pods(&elsewhere).iter().any(|p| p["spec"]["securityContext"]["runAsUser"].is_number()), "a UID elsewhere");
    let openshift = pods(&docs);
    assert!(openshift.len() >= 2, "the operator's and ZooKeeper's pods: {}", openshift.len());
    for pod in openshift {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let contexts = std::iter::once(&pod["spec"]["securityContext"]).chain(
            ["containers", "initContainers"]
                .iter()
                .flat_map(|k| pod["spec"][*k].as_array().into_iter().flatten())
                .map(|c| &c["securityContext"]),
        );
        for context in contexts {
            for field in ["runAsUser", "runAsGroup", "fsGroup"] {
                assert!(context[field].is_null(), "{name}: {field} {}", context[field]);
            }
        }
        assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true, "{name}");
    }
}

/// NOTES warn of what the cluster lacks: without MutatingAdmissionPolicy (a client-side dry run
/// knows of none) the finalizer and the gate policies are missing; an API server that serves it
/// (1.36 and later, asked by a server-side dry run) gets no warning of it, an older one the same
/// warning.
#[test]
fn notes_warn_where_the_cluster_lacks_what_the_chart_relies_on() {
    // A release of its own in a namespace that exists: the server-side dry run looks its
    // cluster-scoped objects up (the test kit's are named after the release `zklock`).
    let release = format!("zn{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let notes = |mut cmd: Command, extra: &[&str]| -> String {
        let out =
            cmd.args(["install", &release]).arg(chart()).args(["--namespace", "default"]).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split("NOTES:").nth(1).expect("NOTES").to_string()
    };
    let old = notes(helm(), &["--dry-run=client"]);
    assert!(old.contains("WARNING: this cluster serves no MutatingAdmissionPolicy"), "{old}");
    let served = notes(helm_on(zklock_testkit::kube::kubeconfig()), &["--dry-run=server"]);
    let policies = crate::e2e_support::serves_mutating_admission_policy();
    // The API server under test: 1.36 and later serve it, and NOTES say nothing; before, they warn.
    assert_eq!(served.contains("WARNING: this cluster serves no MutatingAdmissionPolicy"), !policies, "{served}");
    if policies {
        assert!(!served.contains("WARNING"), "{served}");
    }
    let unfenced = notes(helm(), &["--dry-run=client", "--set", "leaderElection.epochPolicy=false"]);
    assert!(unfenced.contains("WARNING: the leader-epoch admission policy is off"), "{unfenced}");
}

#[test]
fn notes_show_how_to_take_a_first_lock() {
    let out =
        helm().args(["install", "zklock"]).arg(chart()).args(["--namespace", NS, "--dry-run=client"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let notes = text.split("NOTES:").nth(1).expect("NOTES");
    for needle in ["kind: LockClaim", "kubectl wait --for=condition=Held lockclaim/my-first-claim", "zklock.io/release"]
    {
        assert!(notes.contains(needle), "NOTES lacks {needle:?}:\n{notes}");
    }
}

#[test]
fn example_manifests_fit_the_chart() {
    // The chart's CRD installed (as `helm install` does from crds/), the examples' claims pass
    // server-side validation in a namespace the default install serves.
    let crd = chart().join("crds/lockclaims.zklock.io.yaml");
    let (ok, out) = kubectl(&["apply", "-f", crd.to_str().unwrap()], None);
    assert!(ok, "{out}");
    let (ok, out) =
        kubectl(&["wait", "--for=condition=Established", "crd/lockclaims.zklock.io", "--timeout=60s"], None);
    assert!(ok, "{out}");
    let ns = format!("zklock-examples-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let (ok, out) = kubectl(&["create", "namespace", &ns], None);
    assert!(ok, "{out}");
    let examples = root().join("examples/manifests");
    for file in ["claim.yaml", "shared-locks.yaml"] {
        let path = examples.join(file);
        let (ok, out) =
            kubectl(&["apply", "--dry-run=server", "--validate=strict", "-n", &ns, "-f", path.to_str().unwrap()], None);
        assert!(ok, "{file}: {out}");
    }
    // The gated Job's pods pass the API server's pod validation (scheduling gates included).
    let job = std::fs::read_to_string(examples.join("job-gated.yaml")).unwrap();
    let docs = documents(&job);
    let template = &find(&docs, "Job")[0]["spec"]["template"];
    assert_eq!(template["metadata"]["annotations"]["zklock.io/lock"], "db-migrations");
    let mut pod = template.clone();
    pod["apiVersion"] = "v1".into();
    pod["kind"] = "Pod".into();
    pod["metadata"]["name"] = "migrate-abcde".into();
    let (ok, out) = kubectl(
        &["create", "--dry-run=server", "--validate=strict", "-n", &ns, "-f", "-"],
        Some(&serde_json::to_string(&pod).unwrap()),
    );
    assert!(ok, "a pod of job-gated.yaml: {out}");
    // What `zklock acquire` and `zklock exec` do (tests/operator/lock_commands.rs) is granted.
    for file in ["job-init-acquire.yaml", "ci-role.yaml"] {
        let docs = documents(&std::fs::read_to_string(examples.join(file)).unwrap());
        let verbs = strings(&find(&docs, "Role")[0]["rules"][0]["verbs"]);
        for verb in ["create", "get", "list", "watch", "delete"] {
            assert!(verbs.iter().any(|v| v == verb), "{file}: the Role lacks {verb}");
        }
    }
}

#[test]
fn the_schema_check_catches_unknown_and_mistyped_fields() {
    let docs = documents(&render(NS, None, &[]).unwrap());
    let deployment = find(&docs, "Deployment")[0].clone();
    assert_eq!(typed_round_trip(&deployment), Ok(true));
    let mut typo = deployment.clone();
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = serde_json::json!({});
    assert!(typed_round_trip(&typo).unwrap_err().contains("readinesProbe"));
    let mut mistyped = deployment;
    mistyped["spec"]["replicas"] = serde_json::json!("two");
    assert!(typed_round_trip(&mistyped).is_err());
}

/// `helm upgrade --reuse-values` gives the templates the earlier release's values only: every
/// template first fills what they lack from this chart's defaults, a copy of values.yaml (Helm
/// gives templates no access to values.yaml itself). `upgrade.rs` upgrades for real.
#[test]
fn every_template_fills_values_an_earlier_release_lacks_from_the_defaults() {
    let values = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let defaults = std::fs::read_to_string(chart().join("files/defaults.yaml")).unwrap();
    assert!(values == defaults, "charts/zklock/files/defaults.yaml differs from values.yaml: copy values.yaml over it");
    let fill = r#"{{- include "zklock.fillDefaults" (list .Values (.Files.Get "files/defaults.yaml" | fromYaml)) -}}"#;
    for entry in std::fs::read_dir(chart().join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        if path.extension().is_some_and(|e| e == "tpl") {
            continue;
        }
        let (fill_at, first_use) = (text.find(fill), text.find(".Values"));
        assert!(
            first_use.is_none() || fill_at.is_some_and(|at| first_use >= Some(at)),
            "{} must say {fill} before it reads .Values",
            path.display()
        );
    }
}

/// Platforms differ: `ci/platform-values.yaml` (no fixed user, a mirror for both images, an
/// extra flag, volume and mount, a probe of its own) reaches the rendered pods, and
/// `rendered_manifests_are_valid` has the API server accept them.
#[test]
fn platform_overrides_reach_the_rendered_pods() {
    let values = chart().join("ci/platform-values.yaml");
    let docs = documents(&render(NS, Some(&values), &[]).expect("helm template with the platform values"));
    let pod = &find(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    let zookeeper = &find(&docs, "StatefulSet")[0]["spec"]["template"]["spec"];
    for (what, spec) in [("operator", pod), ("zookeeper", zookeeper)] {
        let context = &spec["securityContext"];
        assert!(
            context.get("runAsUser").is_none() && context.get("fsGroup").is_none(),
            "{what}: no fixed user: {context}"
        );
        assert_eq!(context["runAsNonRoot"], true, "{what}");
        for c in
            spec["containers"].as_array().unwrap().iter().chain(spec["initContainers"].as_array().into_iter().flatten())
        {
            let image = c["image"].as_str().unwrap();
            assert!(image.starts_with("mirror.example:5000/"), "{what}: {image} from the mirror");
        }
    }
    let operator = operator_container(&docs);
    assert!(strings(&operator["args"]).contains(&"--default-ttl-seconds-after-finished=3600".to_string()));
    assert_eq!(operator["readinessProbe"]["periodSeconds"], 2, "the probe given replaces the chart's");
    assert_eq!(operator["livenessProbe"]["httpGet"]["path"], "/healthz", "the probe not given stays the chart's");
    let mounts = operator["volumeMounts"].as_array().expect("mounts");
    assert!(mounts.iter().any(|m| m["mountPath"] == "/etc/platform-ca"), "{mounts:?}");
    let volumes = pod["volumes"].as_array().expect("volumes");
    assert!(volumes.iter().any(|v| v["configMap"]["name"] == "platform-ca-bundle"), "{volumes:?}");

    // The defaults: a fixed non-root user, the images as named.
    let docs = documents(&render(NS, None, &[]).expect("helm template"));
    let pod = &find(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert!(operator_container(&docs)["image"].as_str().unwrap().starts_with("ghcr.io/zklock/zklock:"));
}

/// The alerts name only series the operator exports (a renamed metric would silence an alert
/// for good), and each says what to do.
#[test]
fn alert_rules_name_only_metrics_the_operator_exports() {
    let docs = documents(&render(NS, None, &["metrics.prometheusRule.enabled=true"]).expect("helm template"));
    let rule = find(&docs, "PrometheusRule");
    assert_eq!(rule.len(), 1, "one PrometheusRule when enabled");
    // Families with labels are written once they have a series.
    let metrics = zklock::metrics::Metrics::default();
    metrics.acquire_wait.observe("shop", "db", 0.5);
    metrics.set_phase_counts(&Default::default());
    let exported: BTreeSet<String> = metrics
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next().map(str::to_string))
        .collect();
    let rules = rule[0]["spec"]["groups"][0]["rules"].as_array().expect("rules");
    let alerts: BTreeSet<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
    for wanted in ["ZklockNoLeader", "ZklockClaimWaitingBehindAFreeLock", "ZklockLockWithoutGrants"] {
        assert!(alerts.contains(wanted), "{wanted} in {alerts:?}");
    }
    for rule in rules {
        let expr = rule["expr"].as_str().expect("an expression");
        if let Err(e) = promql_parser::parser::parse(expr) {
            panic!("{}: the expression is no PromQL ({e}):\n{expr}", rule["alert"]);
        }
        let names = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("zklock_"));
        for name in names {
            let base =
                ["_count", "_sum", "_bucket", "_total"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
            assert!(
                exported.contains(base),
                "{}: {name} is not a metric the operator exports ({exported:?})",
                rule["alert"]
            );
        }
        assert!(rule["annotations"]["description"].as_str().is_some_and(|d| d.len() > 40), "{}", rule["alert"]);
    }
    let none = documents(&render(NS, None, &[]).expect("helm template"));
    assert!(find(&none, "PrometheusRule").is_empty(), "off by default, like the ServiceMonitor");
}

/// Artifact Hub's annotations in Chart.yaml say what the chart holds: every CRD of `crds/` (kind,
/// version, plural), examples the API server accepts, and exactly the images the chart renders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_hub_metadata_matches_the_crds_and_the_rendered_images() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let meta: Value = serde_yaml::from_str(&text).unwrap();
    let annotation = |key: &str| -> Value {
        let raw = meta["annotations"][key].as_str().unwrap_or_else(|| panic!("Chart.yaml lacks annotation {key}"));
        serde_yaml::from_str(raw).unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let listed: BTreeSet<(String, String, String)> = annotation("artifacthub.io/crds")
        .as_array()
        .expect("a list of CRDs")
        .iter()
        .map(|c| {
            assert!(c["displayName"].is_string() && c["description"].is_string(), "{c}");
            (
                c["kind"].as_str().unwrap().into(),
                c["version"].as_str().unwrap().into(),
                c["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    let shipped: BTreeSet<(String, String, String)> = zklock::api::crd_objects()
        .into_iter()
        .map(|(_, crd)| {
            let version = crd.spec.versions.iter().find(|v| v.storage).expect("a storage version").name.clone();
            (crd.spec.names.kind.clone(), version, crd.spec.names.plural.clone())
        })
        .collect();
    assert_eq!(listed, shipped, "artifacthub.io/crds lists the CRDs of crds/");

    // Each example as the API server takes it (dry run, strict), and one per CRD.
    let examples = annotation("artifacthub.io/crdsExamples");
    let kinds: BTreeSet<&str> = examples.as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds, shipped.iter().map(|(k, _, _)| k.as_str()).collect(), "an example per CRD");
    let client = zklock_testkit::kube::client().await;
    zklock_testkit::install::crds(&client, "zklock-chart-tests").await.expect("the CRDs");
    let ns = format!("zklock-artifacthub-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let (ok, out) = kubectl(&["create", "namespace", &ns], None);
    assert!(ok, "{out}");
    for example in examples.as_array().unwrap() {
        let yaml = serde_yaml::to_string(example).unwrap();
        let (ok, out) = kubectl(&["apply", "--dry-run=server", "--validate=strict", "-n", &ns, "-f", "-"], Some(&yaml));
        assert!(ok, "Artifact Hub example {}: {out}", example["metadata"]["name"]);
    }
    let _ = kubectl(&["delete", "namespace", &ns, "--wait=false"], None);

    // The images: those the default install renders, hooks included.
    let app_version = meta["appVersion"].as_str().unwrap();
    let listed: BTreeSet<String> = annotation("artifacthub.io/images")
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["image"].as_str().unwrap().to_string())
        .collect();
    let docs = documents(&render("zklock-system", None, &[]).unwrap());
    let mut rendered = BTreeSet::new();
    for doc in &docs {
        let pod = match kind(doc) {
            "Pod" => &doc["spec"],
            "Job" | "Deployment" | "StatefulSet" => &doc["spec"]["template"]["spec"],
            _ => continue,
        };
        for container in
            ["containers", "initContainers"].iter().flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
        {
            rendered.insert(container["image"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(listed, rendered, "artifacthub.io/images lists what the chart runs");
    assert!(listed.contains(&format!("ghcr.io/zklock/zklock:{app_version}")), "the operator's image at appVersion");
}
