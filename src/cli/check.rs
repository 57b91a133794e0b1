//! `zklock check`: is zklock ready to serve claims in a namespace? Each line is one thing a
//! claim needs (the API, the CRDs at this binary's revision, a leader that renews its Lease and
//! is ready, the namespace served, the admission policies bound where the API server serves
//! them), and each line that is not ready says what to do. Read-only: it lists, gets and reads
//! discovery, and says "cannot tell" where the caller may not read something.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::core::{Selector, SelectorExt};
use kube::{Api, ResourceExt};
use zklock::api::{CRD_REVISION, CRD_REVISION_ANNOTATION, FINALIZER};

use super::api::ApiArgs;

/// How long each API call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// How the line starts that says the operator could not be looked for.
pub const CANNOT_LOOK: &str = "cannot look for the Lease";

/// Where the operator is: its namespace (else found by its Lease) and its Lease's name.
#[derive(clap::Args, Clone, Debug)]
pub struct OperatorRef {
    /// Namespace zklock is installed in (default: found by its leader Lease)
    #[arg(long)]
    pub operator_namespace: Option<String>,
    /// Name of the operator's leader Lease (its --lease-name)
    #[arg(long, default_value = zklock::operator::LEASE_NAME)]
    pub lease_name: String,
}

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Ready,
    /// Works, with less than it could (said why).
    Note,
    NotReady,
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Finding {
    pub what: &'static str,
    pub state: State,
    pub said: String,
    /// What to do, for a line that is not ready.
    pub fix: Option<String>,
}

impl Finding {
    fn ready(what: &'static str, said: impl Into<String>) -> Self {
        Self { what, state: State::Ready, said: said.into(), fix: None }
    }
    fn note(what: &'static str, said: impl Into<String>) -> Self {
        Self { what, state: State::Note, said: said.into(), fix: None }
    }
    fn not_ready(what: &'static str, said: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { what, state: State::NotReady, said: said.into(), fix: Some(fix.into()) }
    }
}

/// The report as printed: one line each, the fix indented under a line that is not ready.
pub fn report(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let mark = match f.state {
            State::Ready => "ok      ",
            State::Note => "note    ",
            State::NotReady => "NOT OK  ",
        };
        out.push_str(&format!("{mark}{:<18}{}\n", f.what, f.said));
        if let Some(fix) = &f.fix {
            out.push_str(&format!("        {:<18}→ {fix}\n", ""));
        }
    }
    out
}

/// The operator's installation as its leader Lease shows it.
struct Installation {
    namespace: String,
    lease: Lease,
    /// The leader's pod, where it can be read.
    leader: Option<Pod>,
    /// A pod of the operator's (the leader's, else any replica's): their flags are the same.
    pod: Option<Pod>,
    /// Whether it elects a leader on the Lease (`--no-leader-election`: one replica, no Lease).
    elected: bool,
}

/// Every argument of every container of `pod`.
fn pod_args(pod: &Pod) -> impl Iterator<Item = &String> {
    pod.spec.iter().flat_map(|s| s.containers.iter()).flat_map(|c| c.args.iter().flatten())
}

/// Whether `pod` runs the operator with its flag `--lease-name` (or the default) equal to `lease`.
fn elects_on(pod: &Pod, lease: &str) -> bool {
    let named = pod_args(pod).find_map(|a| a.strip_prefix("--lease-name="));
    named.unwrap_or(zklock::operator::LEASE_NAME) == lease
}

/// The operator's pods, as the chart labels them.
const OPERATOR_PODS: &str = "app.kubernetes.io/name=zklock,app.kubernetes.io/component=operator";

impl Installation {
    /// The operator container's value of `flag` (`--flag=V`, `--flag V`) or of its variable
    /// `env` (comma-separated), every occurrence; `None` when the pod cannot be read.
    fn flag(&self, flag: &str, env: &str) -> Option<Vec<String>> {
        let pod = self.pod.as_ref()?;
        let spec = pod.spec.as_ref()?;
        let container = spec
            .containers
            .iter()
            .find(|c| c.args.as_ref().is_some_and(|a| a.first().is_some_and(|a| a == "run")))
            .or_else(|| spec.containers.first())?;
        let args = container.args.clone().unwrap_or_default();
        let mut values = vec![];
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            if let Some(value) = arg.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
                values.push(value.to_string());
            } else if arg == flag {
                values.extend(args.next().cloned());
            }
        }
        if values.is_empty() {
            let from_env = container.env.iter().flatten().find(|e| e.name == env).and_then(|e| e.value.clone());
            values.extend(from_env.iter().flat_map(|v| v.split(',').map(str::to_string)));
        }
        Some(values.into_iter().filter(|v| !v.is_empty()).collect())
    }

    fn has_flag(&self, flag: &str) -> Option<bool> {
        let pod = self.pod.as_ref()?;
        Some(pod_args(pod).any(|a| a == flag || a.starts_with(&format!("{flag}="))))
    }
}

async fn within<T>(call: impl std::future::Future<Output = kube::Result<T>>) -> Result<T, String> {
    match tokio::time::timeout(CALL_DEADLINE, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(kube::Error::Api(status))) => Err(format!("{} ({})", status.message, status.code)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CALL_DEADLINE:?}")),
    }
}

fn forbidden(e: &str) -> bool {
    e.ends_with("(403)")
}

/// Everything `check` looks at, for claims in `namespace`.
pub async fn findings(client: &kube::Client, namespace: &str, operator: &OperatorRef) -> Vec<Finding> {
    let mut out = vec![];
    match within(client.apiserver_version()).await {
        Ok(v) => out.push(Finding::ready("Kubernetes API", format!("v{}.{} ({})", v.major, v.minor, v.git_version))),
        Err(e) => {
            out.push(Finding::not_ready(
                "Kubernetes API",
                format!("no answer: {e}"),
                "give --kubeconfig/--context, or set KUBECONFIG, for the cluster zklock runs in",
            ));
            return out;
        }
    }
    out.extend(crds(client).await);
    let (found, installation) =
        installation(client, operator.operator_namespace.as_deref(), &operator.lease_name).await;
    out.push(found);
    let Some(installation) = installation else { return out };
    out.push(leader(&installation));
    // Read once: whether it exists, and its labels for the policies' selectors.
    let read = within(Api::<Namespace>::all(client.clone()).get_opt(namespace)).await;
    out.push(served(&installation, namespace, read.as_ref().is_ok_and(Option::is_none)));
    out.extend(policies(client, &installation, namespace, &namespace_labels(read, namespace)).await);
    out
}

async fn crds(client: &kube::Client) -> Vec<Finding> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut out = vec![];
    for (_, crd) in zklock::api::crd_objects() {
        let name = crd.name_any();
        let finding = match within(api.get_opt(&name)).await {
            Ok(Some(installed)) => {
                let revision = installed.annotations().get(CRD_REVISION_ANNOTATION).and_then(|r| r.parse::<u32>().ok());
                match revision {
                    Some(r) if r == CRD_REVISION => Finding::ready("CRD", format!("{name}, revision {r}")),
                    Some(r) if r > CRD_REVISION => Finding::note(
                        "CRD",
                        format!("{name} is at revision {r}, newer than this zklock ({CRD_REVISION}): use the CLI of the installed release"),
                    ),
                    other => Finding::not_ready(
                        "CRD",
                        format!(
                            "{name} is at revision {}, this zklock's is {CRD_REVISION}",
                            other.map_or("unknown".to_string(), |r| r.to_string())
                        ),
                        "the operator brings its CRDs to its revision at start (chart value crds.manage): upgrade the \
                         release, or `zklock crd | kubectl apply --server-side --force-conflicts -f -`",
                    ),
                }
            }
            Ok(None) => Finding::not_ready(
                "CRD",
                format!("{name} is not installed"),
                "install the chart (docs/operations.md), or `zklock crd | kubectl apply --server-side -f -`",
            ),
            Err(e) if forbidden(&e) => {
                Finding::note("CRD", format!("{name}: cannot tell, you may not read CRDs ({e})"))
            }
            Err(e) => Finding::not_ready("CRD", format!("{name}: {e}"), "check the API server's health"),
        };
        out.push(finding);
    }
    out
}

/// Finds the leader Lease: in `operator_namespace`, else in every namespace the caller may list.
async fn installation(
    client: &kube::Client,
    operator_namespace: Option<&str>,
    lease_name: &str,
) -> (Finding, Option<Installation>) {
    let name = lease_name;
    let leases: Vec<Lease> = match operator_namespace {
        Some(ns) => match within(Api::<Lease>::namespaced(client.clone(), ns).get_opt(name)).await {
            Ok(lease) => lease.into_iter().collect(),
            Err(e) => {
                return (
                    Finding::not_ready(
                        "operator",
                        format!("Lease {ns}/{name}: {e}"),
                        "check --operator-namespace and your access to Leases there",
                    ),
                    None,
                )
            }
        },
        None => {
            let params = ListParams::default().fields(&format!("metadata.name={name}"));
            match within(Api::<Lease>::all(client.clone()).list(&params)).await {
                Ok(list) => list.items,
                Err(e) => {
                    return (
                        Finding::not_ready(
                            "operator",
                            format!("{CANNOT_LOOK} {name} in every namespace: {e}"),
                            "give --operator-namespace (the namespace the chart was installed in)",
                        ),
                        None,
                    )
                }
            }
        }
    };
    match leases.len() {
        // An operator without leader election keeps no Lease: its pods tell.
        0 if let Some(installation) = unelected(client, operator_namespace).await => {
            let namespace = installation.namespace.clone();
            (
                Finding::ready("operator", format!("installed in {namespace}, without leader election")),
                Some(installation),
            )
        }
        0 => (
            Finding::not_ready(
                "operator",
                format!(
                    "no Lease {name}{}: no operator has ever led",
                    operator_namespace.map(|ns| format!(" in {ns}")).unwrap_or_default()
                ),
                "install the chart (helm install zklock …, docs/operations.md), or give --operator-namespace",
            ),
            None,
        ),
        1 => {
            let lease = leases.into_iter().next().unwrap_or_default();
            let namespace = lease.namespace().unwrap_or_default();
            let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
            let leader = match lease.spec.as_ref().and_then(|s| s.holder_identity.clone()) {
                Some(holder) if !holder.is_empty() => within(pods.get_opt(&holder)).await.ok().flatten(),
                _ => None,
            };
            // Another release's replicas may share the namespace: those electing on this Lease.
            let pod = match &leader {
                Some(pod) => Some(pod.clone()),
                None => within(pods.list(&ListParams::default().labels(OPERATOR_PODS)))
                    .await
                    .ok()
                    .and_then(|list| list.items.into_iter().find(|p| elects_on(p, name))),
            };
            let installation = Installation { namespace: namespace.clone(), lease, leader, pod, elected: true };
            (Finding::ready("operator", format!("installed in {namespace} (Lease {name})")), Some(installation))
        }
        _ => {
            let where_: Vec<String> = leases.iter().filter_map(|l| l.namespace()).collect();
            (
                Finding::not_ready(
                    "operator",
                    format!("Leases {name} in {}: several installations", where_.join(", ")),
                    "give --operator-namespace: the one that serves the namespace",
                ),
                None,
            )
        }
    }
}

/// An operator run without leader election, found by its pods (in `operator_namespace`, else in
/// every namespace the caller may list).
async fn unelected(client: &kube::Client, operator_namespace: Option<&str>) -> Option<Installation> {
    let api: Api<Pod> = match operator_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pods = within(api.list(&ListParams::default().labels(OPERATOR_PODS))).await.ok()?.items;
    let pod = pods.into_iter().find(|p| pod_args(p).any(|a| a == "--no-leader-election"))?;
    Some(Installation {
        namespace: pod.namespace().unwrap_or_default(),
        lease: Lease::default(),
        leader: Some(pod.clone()),
        pod: Some(pod),
        elected: false,
    })
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status.iter().flat_map(|s| s.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True")
}

fn leader(installation: &Installation) -> Finding {
    if !installation.elected {
        let name = installation.leader.as_ref().map(|p| p.name_any()).unwrap_or_default();
        let ns = &installation.namespace;
        return match installation.leader.as_ref().is_some_and(pod_ready) {
            true => Finding::ready("leader", format!("{name}, ready (one replica, no leader election)")),
            false => Finding::not_ready(
                "leader",
                format!("{name} is not ready (it has not finished its first sync with ZooKeeper)"),
                format!(
                    "kubectl -n {ns} logs {name}: a ZooKeeper it cannot reach or authenticate to is the usual cause"
                ),
            ),
        };
    }
    let spec = installation.lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(10).max(1) as u64);
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let ns = &installation.namespace;
    let (Some(holder), Some(renewed)) = (holder, renewed) else {
        return Finding::not_ready(
            "leader",
            "no replica leads",
            format!("kubectl -n {ns} get pods -l {OPERATOR_PODS}; kubectl -n {ns} logs -l {OPERATOR_PODS} --tail 20"),
        );
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
    let age = Duration::try_from(age).unwrap_or_default();
    if age > duration {
        return Finding::not_ready(
            "leader",
            format!(
                "{holder} last renewed the Lease {}s ago (it lasts {}s): no replica leads",
                age.as_secs(),
                duration.as_secs()
            ),
            format!("kubectl -n {ns} get pods -l {OPERATOR_PODS}; kubectl -n {ns} logs -l {OPERATOR_PODS} --tail 20"),
        );
    }
    let ready = installation.leader.as_ref().map(pod_ready);
    match ready {
        Some(true) => Finding::ready("leader", format!("{holder}, ready, renewed {}s ago", age.as_secs())),
        Some(false) => Finding::not_ready(
            "leader",
            format!("{holder} leads but is not ready (it has not finished its first sync with ZooKeeper)"),
            format!("kubectl -n {ns} logs {holder}: a ZooKeeper it cannot reach or authenticate to is the usual cause"),
        ),
        None => Finding::note(
            "leader",
            format!(
                "{holder}, renewed {}s ago; its pod cannot be read here, so its readiness is not known",
                age.as_secs()
            ),
        ),
    }
}

fn namespace_labels(read: Result<Option<Namespace>, String>, namespace: &str) -> BTreeMap<String, String> {
    match read {
        Ok(Some(ns)) => ns.labels().clone(),
        // Every namespace carries its name as a label (since 1.21); enough for the selectors
        // the chart writes.
        _ => BTreeMap::from([("kubernetes.io/metadata.name".to_string(), namespace.to_string())]),
    }
}

fn served(installation: &Installation, namespace: &str, missing: bool) -> Finding {
    if missing {
        return Finding::not_ready("namespace", format!("{namespace} does not exist"), "create it, or give -n");
    }
    match installation.flag("--watch-namespace", "ZKLOCK_WATCH_NAMESPACE") {
        None => Finding::note("namespace", format!("{namespace}: the operator's pod cannot be read, so what it serves is not known")),
        Some(served) if served.is_empty() => Finding::ready("namespace", format!("{namespace} (the operator serves every namespace)")),
        Some(served) if served.iter().any(|s| s == namespace) => {
            Finding::ready("namespace", format!("{namespace} (among {})", served.join(", ")))
        }
        Some(served) => Finding::not_ready(
            "namespace",
            format!("{namespace} is not served: the operator serves {} only", served.join(", ")),
            format!("add {namespace} to the chart's watchNamespaces (helm upgrade … --reuse-values --set 'watchNamespaces={{{},{namespace}}}')", served.join(",")),
        ),
    }
}

fn covers(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let selector = selector.cloned().unwrap_or_default();
    Selector::try_from(selector).is_ok_and(|s| s.matches(labels))
}

async fn policies(
    client: &kube::Client,
    installation: &Installation,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<Finding> {
    let mut out = vec![];
    // The leader epoch's policy: on unless the operator runs without it.
    let epoch_off = installation.has_flag("--no-epoch-policy") == Some(true)
        || installation.has_flag("--no-leader-election") == Some(true);
    if epoch_off {
        out.push(Finding::note(
            "epoch policy",
            "off: the operator runs without it (a deposed leader's late writes are not refused)",
        ));
    } else {
        // The parameter the operator names; where its pod cannot be read, any in its namespace
        // (the chart names it after the release).
        let param = installation
            .flag("--epoch-param", "ZKLOCK_EPOCH_PARAM")
            .map(|values| values.last().cloned().unwrap_or_else(|| zklock::api::epoch_policy::EPOCH_PARAM.to_string()));
        out.push(epoch_policy(client, &installation.namespace, param.as_deref(), namespace, labels).await);
    }
    out.extend(mutating_policies(client, namespace, labels).await);
    out
}

async fn epoch_policy(
    client: &kube::Client,
    operator_ns: &str,
    param: Option<&str>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Finding {
    let what = "epoch policy";
    let fix = format!(
        "install it with the chart (leaderElection.epochPolicy), or `zklock admin epoch-policy --param-namespace {operator_ns} | kubectl apply -f -`"
    );
    let bindings =
        match within(Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()).list(&Default::default())).await {
            Ok(list) => list.items,
            Err(e) if forbidden(&e) => {
                return Finding::note(what, format!("cannot tell: you may not list admission policy bindings ({e})"))
            }
            Err(e) => return Finding::not_ready(what, e, "check the API server's health"),
        };
    let ours: Vec<&ValidatingAdmissionPolicyBinding> = bindings
        .iter()
        .filter(|b| {
            b.spec.param_ref.as_ref().is_some_and(|p| {
                p.namespace.as_deref() == Some(operator_ns) && (param.is_none() || p.name.as_deref() == param)
            })
        })
        .collect();
    let Some(binding) = ours
        .iter()
        .find(|b| covers(b.spec.match_resources.as_ref().and_then(|m| m.namespace_selector.as_ref()), labels))
    else {
        return if ours.is_empty() {
            let param = param.unwrap_or("…");
            Finding::not_ready(what, format!("no binding with the parameter {operator_ns}/{param}"), fix)
        } else {
            Finding::not_ready(
                what,
                format!("its binding does not cover {namespace}"),
                "add the namespace to the chart's watchNamespaces",
            )
        };
    };
    let policy = binding.spec.policy_name.clone();
    let param = binding.spec.param_ref.as_ref().and_then(|p| p.name.clone()).unwrap_or_default();
    let param = param.as_str();
    match within(Api::<ValidatingAdmissionPolicy>::all(client.clone()).get_opt(&policy)).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Finding::not_ready(
                what,
                format!("binding {} names policy {policy}, which does not exist", binding.name_any()),
                fix,
            )
        }
        Err(e) => return Finding::note(what, format!("policy {policy}: cannot tell ({e})")),
    }
    match within(Api::<ConfigMap>::namespaced(client.clone(), operator_ns).get_opt(param)).await {
        Ok(Some(cm)) if cm.data.as_ref().is_some_and(|d| d.contains_key("epoch")) => {
            Finding::ready(what, format!("{policy}, bound to {namespace}, epoch in {operator_ns}/{param}"))
        }
        Ok(_) => Finding::not_ready(
            what,
            format!("{policy} is bound, but {operator_ns}/{param} holds no epoch yet: every status write is refused until the leader writes it"),
            format!("wait for a leader (kubectl -n {operator_ns} logs -l {OPERATOR_PODS} --tail 20)"),
        ),
        Err(e) => Finding::note(what, format!("{policy}, bound to {namespace}; its parameter cannot be read here ({e})")),
    }
}

/// The finalizer and gate policies (MutatingAdmissionPolicy, Kubernetes 1.36): each only saves
/// work or a field, so a missing one is a note, not a failure.
async fn mutating_policies(client: &kube::Client, namespace: &str, labels: &BTreeMap<String, String>) -> Vec<Finding> {
    let policies = match within(Api::<MutatingAdmissionPolicy>::all(client.clone()).list(&Default::default())).await {
        Ok(list) => list.items,
        Err(e) if e.ends_with("(404)") => {
            return vec![Finding::note(
                "finalizer, gate",
                "this API server serves no MutatingAdmissionPolicy (before 1.36): the operator adds its finalizer \
                 itself, and a gated pod needs the zklock.io/lock scheduling gate in its spec",
            )]
        }
        Err(e) => return vec![Finding::note("finalizer, gate", format!("cannot tell ({e})"))],
    };
    let bindings = within(Api::<MutatingAdmissionPolicyBinding>::all(client.clone()).list(&Default::default()))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut out = vec![];
    for (what, marker, without) in [
        (
            "finalizer policy",
            FINALIZER,
            "the operator adds its finalizer to each claim itself (one write more per claim)",
        ),
        (
            "gate policy",
            "schedulingGates",
            "a pod annotated zklock.io/lock is not gated unless its spec has the zklock.io/lock scheduling gate",
        ),
    ] {
        let named: Vec<String> = policies
            .iter()
            .filter(|p| serde_json::to_string(&p.spec).is_ok_and(|s| s.contains(marker)))
            .map(|p| p.name_any())
            .collect();
        let bound = bindings.iter().find(|b| {
            b.spec.as_ref().is_some_and(|s| {
                s.policy_name.as_ref().is_some_and(|p| named.contains(p))
                    && covers(s.match_resources.as_ref().and_then(|m| m.namespace_selector.as_ref()), labels)
            })
        });
        out.push(match bound {
            Some(b) => Finding::ready(
                what,
                format!(
                    "{}, bound to {namespace}",
                    b.spec.as_ref().and_then(|s| s.policy_name.clone()).unwrap_or_default()
                ),
            ),
            None => Finding::note(what, format!("none bound to {namespace}: {without}")),
        });
    }
    out
}

/// `zklock check`: prints the report; 0 when nothing is not ready. With `wait`, looks again
/// every two seconds until then or until `wait` has passed.
pub async fn check(
    api: ApiArgs,
    namespace: Option<String>,
    operator: &OperatorRef,
    wait: Option<Duration>,
) -> Result<u8, String> {
    let config = api.config().await?;
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = zklock::client::builder(config).map_err(|e| format!("no Kubernetes API: {e}"))?.build();
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    loop {
        let findings = findings(&client, &namespace, operator).await;
        let ready = findings.iter().all(|f| f.state != State::NotReady);
        match deadline {
            Some(deadline) if !ready && tokio::time::Instant::now() < deadline => {
                let first =
                    findings.iter().find(|f| f.state == State::NotReady).map(|f| format!("{}: {}", f.what, f.said));
                eprintln!("waiting: {}", first.unwrap_or_default());
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            _ => {
                print!("{}", report(&findings));
                return Ok(if ready { 0 } else { 1 });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_what_to_do_under_each_line_that_is_not_ready() {
        let text = report(&[
            Finding::ready("CRD", "lockclaims.zklock.io, revision 4"),
            Finding::not_ready("leader", "no replica leads", "kubectl logs"),
        ]);
        assert_eq!(
            text,
            "ok      CRD               lockclaims.zklock.io, revision 4\n\
             NOT OK  leader            no replica leads\n\
             \x20                         → kubectl logs\n"
        );
    }

    #[test]
    fn a_selector_covers_the_namespaces_it_names() {
        let labels = BTreeMap::from([("kubernetes.io/metadata.name".to_string(), "shop".to_string())]);
        assert!(covers(None, &labels), "no selector: every namespace");
        let only = |names: &[&str]| -> LabelSelector {
            serde_json::from_value(serde_json::json!({
                "matchExpressions": [{ "key": "kubernetes.io/metadata.name", "operator": "In", "values": names }]
            }))
            .unwrap()
        };
        assert!(covers(Some(&only(&["ci", "shop"])), &labels));
        assert!(!covers(Some(&only(&["ci"])), &labels));
    }
}
