//! `zklock history`: a lock's last grants, from its `LockHistory` (who held it, when, for how
//! long, how it ended, how long each waited), through the Kubernetes API.

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;
use zklock::api::history::{history_name, GrantRecord};
use zklock::api::{LockHistory, CLUSTER_LABEL_PREFIX};

use super::api::ApiArgs;

/// How `history` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Columns, as kubectl get prints them
    #[default]
    Table,
    /// More columns: the claim's namespace and UID, cluster, holder pod, when it ended
    Wide,
    Json,
    Yaml,
}

/// What `history -o json|yaml` prints.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Printed {
    pub lock: String,
    pub namespace: String,
    /// Grants recorded since the history began, the ones no longer kept included.
    pub recorded: u64,
    pub grants: Vec<PrintedGrant>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct PrintedGrant {
    #[serde(flatten)]
    pub record: GrantRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_seconds: Option<f64>,
}

/// Prints the history of lock `lock`: `NAME` in `namespace`, or `cluster/NAME`, the history
/// this cluster keeps in the operator's namespace (`operator_namespace`, else found by name).
pub async fn history(
    api: ApiArgs,
    namespace: Option<String>,
    operator_namespace: Option<String>,
    lock: String,
    output: Output,
) -> Result<u8, String> {
    let client = api.client().await?;
    let cluster = lock.strip_prefix(CLUSTER_LABEL_PREFIX);
    zklock::api::check_lock_name(
        if cluster.is_some() { "the ClusterLock" } else { "the lock" },
        cluster.unwrap_or(&lock),
    )?;
    let object = history_name(&lock).ok_or_else(|| {
        format!("lock {lock:?} keeps no history: its name is no Kubernetes object name (a DNS subdomain)")
    })?;
    let refused = |e: kube::Error, where_: &str| match e {
        kube::Error::Api(s) if s.code == 403 => {
            format!("the Kubernetes API refused: {} (ask for get and list on lockhistories {where_})", s.message)
        }
        other => format!("the Kubernetes API: {other}"),
    };
    let (ns, found) = match (cluster, operator_namespace, namespace) {
        (Some(_), None, _) => {
            // Kept in the operator's namespace: found by its name, in every namespace.
            let params = ListParams::default().fields(&format!("metadata.name={object}"));
            let listed = Api::<LockHistory>::all(client).list(&params).await;
            let mut found = listed.map_err(|e| refused(e, "in every namespace, or give --operator-namespace"))?.items;
            if found.len() > 1 {
                let namespaces: Vec<String> = found.iter().filter_map(|h| h.namespace()).collect();
                return Err(format!(
                    "ClusterLock {lock:?} has a history in each of {namespaces:?} (several installations): give \
                     --operator-namespace"
                ));
            }
            let found = found.pop();
            (found.as_ref().and_then(|h| h.namespace()).unwrap_or_else(|| "(every namespace)".into()), found)
        }
        (Some(_), Some(ns), _) | (None, _, Some(ns)) => named(client, ns, &object, &refused).await?,
        (None, _, None) => {
            let ns = client.default_namespace().to_string();
            named(client, ns, &object, &refused).await?
        }
    };
    let Some(found) = found else {
        return Err(format!(
            "no history of lock {lock:?} in {ns} yet: it is written about a second after the lock's first grant \
             (kubectl get lockhistories -A; `zklock check` says whether the operator serves it)"
        ));
    };
    if found.spec.lock != lock {
        return Err(format!("LockHistory {ns}/{object} is the history of {:?}, not of {lock:?}", found.spec.lock));
    }
    let status = found.status.unwrap_or_default();
    let printed = Printed {
        lock,
        namespace: ns,
        recorded: status.recorded,
        grants: status
            .grants
            .into_iter()
            .map(|record| PrintedGrant { held_seconds: record.held_seconds(), record })
            .collect(),
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&printed).map_err(|e| e.to_string())?),
        Output::Yaml => print!("{}", serde_yaml::to_string(&printed).map_err(|e| e.to_string())?),
        Output::Table => print!("{}", table(&printed, false)),
        Output::Wide => print!("{}", table(&printed, true)),
    }
    Ok(0)
}

/// History `object` of namespace `ns`, if there is one.
async fn named(
    client: kube::Client,
    ns: String,
    object: &str,
    refused: &impl Fn(kube::Error, &str) -> String,
) -> Result<(String, Option<LockHistory>), String> {
    let found = Api::<LockHistory>::namespaced(client, &ns).get_opt(object).await;
    let found = found.map_err(|e| refused(e, &format!("in {ns}")))?;
    Ok((ns, found))
}

/// The history as `kubectl get` prints tables, newest grant last (pure).
pub fn table(printed: &Printed, wide: bool) -> String {
    let cluster_lock = printed.lock.starts_with(CLUSTER_LABEL_PREFIX);
    let mut header = vec!["TOKEN", "CLAIM", "GRANTED", "WAITED", "HELD", "ENDED AS"];
    if cluster_lock || wide {
        header.insert(1, "NAMESPACE");
    }
    if wide {
        header.extend(["ENDED", "HOLDER POD", "CLUSTER", "CLAIM UID"]);
    }
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    let or_dash = |s: Option<String>| s.unwrap_or_else(|| "-".into());
    let time = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| t.as_ref().map(|t| t.0.to_string());
    for g in &printed.grants {
        let r = &g.record;
        let mut row = vec![
            r.fencing_token.clone(),
            r.claim.clone(),
            or_dash(time(&r.granted)),
            or_dash(r.waited_seconds.map(seconds)),
            or_dash(g.held_seconds.map(seconds)),
            or_dash(r.ended_as.map(|p| format!("{p:?}"))),
        ];
        if cluster_lock || wide {
            row.insert(1, r.namespace.clone());
        }
        if wide {
            row.extend([or_dash(time(&r.ended)), or_dash(r.holder_pod.clone()), or_dash(r.cluster.clone())]);
            row.push(or_dash(r.claim_uid.clone()));
        }
        rows.push(row);
    }
    super::api::columns(&rows, "(no grant recorded)")
}

/// A duration as kubectl prints short ones: `850ms`, `12.3s`, `4m05s`, `2h10m`.
fn seconds(s: f64) -> String {
    let s = s.max(0.0);
    if s < 1.0 {
        format!("{}ms", (s * 1000.0).round() as u64)
    } else if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        let whole = s.round() as u64;
        format!("{}m{:02}s", whole / 60, whole % 60)
    } else {
        let minutes = (s / 60.0).round() as u64;
        format!("{}h{:02}m", minutes / 60, minutes % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use zklock::api::Phase;

    fn at(second: i64) -> Option<Time> {
        Some(Time(Timestamp::from_second(1_800_000_000 + second).unwrap()))
    }

    fn printed(lock: &str) -> Printed {
        let ended = GrantRecord {
            fencing_token: "41".into(),
            claim: "deploy-1".into(),
            namespace: "shop".into(),
            granted: at(0),
            waited_seconds: Some(0.25),
            ended: at(75),
            ended_as: Some(Phase::Released),
            holder_pod: Some("deploy-1-x7".into()),
            ..Default::default()
        };
        let held = GrantRecord {
            fencing_token: "57".into(),
            claim: "deploy-2".into(),
            namespace: "shop".into(),
            granted: at(75),
            waited_seconds: Some(74.6),
            ..Default::default()
        };
        Printed {
            lock: lock.into(),
            namespace: "shop".into(),
            recorded: 2,
            grants: [ended, held]
                .into_iter()
                .map(|r| PrintedGrant { held_seconds: r.held_seconds(), record: r })
                .collect(),
        }
    }

    #[test]
    fn the_table_says_who_held_when_for_how_long_and_how_it_ended() {
        let table = table(&printed("db"), false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        let cells = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(cells(lines[0]), ["TOKEN", "CLAIM", "GRANTED", "WAITED", "HELD", "ENDED", "AS"]);
        assert_eq!(cells(lines[1]), ["41", "deploy-1", "2027-01-15T08:00:00Z", "250ms", "1m15s", "Released"]);
        assert_eq!(cells(lines[2]), ["57", "deploy-2", "2027-01-15T08:01:15Z", "1m15s", "-", "-"]);
    }

    #[test]
    fn wide_and_cluster_locks_name_the_namespace() {
        let wide = table(&printed("db"), true);
        assert!(wide.lines().next().unwrap().starts_with("TOKEN   NAMESPACE   CLAIM"), "{wide}");
        assert!(wide.contains("deploy-1-x7"), "{wide}");
        let cluster = table(&printed("cluster/db"), false);
        assert!(cluster.lines().nth(1).unwrap().starts_with("41      shop"), "{cluster}");
    }

    #[test]
    fn json_carries_how_long_each_was_held() {
        let json = serde_json::to_value(printed("db")).unwrap();
        assert_eq!(json["grants"][0]["heldSeconds"], 75.0);
        assert_eq!(json["grants"][0]["fencingToken"], "41");
        assert!(json["grants"][1].get("heldSeconds").is_none());
    }
}
