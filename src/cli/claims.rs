//! `zklock queue` and `zklock revoke`: a lock's queue and a claim's revocation through the
//! Kubernetes API, with the user's own identity (no ZooKeeper access needed; the ZooKeeper forms
//! are `zklock admin zk-queue` and `zk-revoke`).

use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde::Serialize;
use serde_json::json;
use zklock::api::{ClaimLockStatus, ClusterLock, Lock, LockClaim, Phase, CLUSTER_LABEL_PREFIX, REVOKE_ANNOTATION};

use super::api::{ApiArgs, Output};

/// One claim in a lock's queue, as `queue` prints it.
#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub namespace: String,
    pub claim: String,
    pub phase: String,
    pub mode: String,
    /// Contenders ahead (0 when Held).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_pod: Option<String>,
}

/// A lock's queue: its object's numbers, if it has one, and its claims, holders first.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Queue {
    pub lock: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    pub claims: Vec<Entry>,
}

/// The entry of `claim` in the queue of the lock labelled `label` (`NAME`, or `cluster/NAME`),
/// if it queues there (pure).
pub fn entry_of(claim: &LockClaim, label: &str) -> Option<Entry> {
    let refs = claim.spec.lock_refs();
    let lock = refs.iter().find(|l| l.label() == label)?;
    let status = claim.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or(Phase::Pending);
    if phase.is_terminal() || claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    // A claim over several locks says where it stands in each.
    let part: Option<&ClaimLockStatus> = status.locks.iter().find(|l| l.lock_name == label);
    Some(Entry {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        claim: claim.metadata.name.clone().unwrap_or_default(),
        phase: format!("{phase:?}"),
        mode: lock.mode.to_string(),
        position: part.map_or(status.position, |p| p.position),
        fencing_token: part.map_or(status.fencing_token.clone(), |p| p.fencing_token.clone()),
        waiting_for: part.map_or(status.waiting_for.clone(), |p| p.waiting_for.clone()),
        holder_pod: claim.spec.holder.as_ref().map(|h| h.pod_name.clone()),
    })
}

/// Holders first (by token: the order they were granted in), then waiters by position, then
/// claims not yet queued (pure).
pub fn order(entries: &mut [Entry]) {
    let rank = |e: &Entry| match e.phase.as_str() {
        "Held" => 0,
        "Waiting" => 1,
        _ => 2,
    };
    let token = |e: &Entry| e.fencing_token.as_deref().and_then(|t| t.parse::<u64>().ok()).unwrap_or(u64::MAX);
    entries.sort_by(|a, b| {
        (rank(a), token(a), a.position.unwrap_or(i64::MAX), &a.namespace, &a.claim).cmp(&(
            rank(b),
            token(b),
            b.position.unwrap_or(i64::MAX),
            &b.namespace,
            &b.claim,
        ))
    });
}

/// Prints the queue of lock `lock` in `namespace` (or of ClusterLock NAME for `cluster/NAME`,
/// whose claims of every namespace this identity may list are shown).
pub async fn queue(api: ApiArgs, namespace: Option<String>, lock: String, output: Output) -> Result<u8, String> {
    let client = api.client().await?;
    let cluster = lock.strip_prefix(CLUSTER_LABEL_PREFIX).map(str::to_string);
    let (claims, namespace, permits): (Api<LockClaim>, Option<String>, Option<u32>) = match &cluster {
        Some(name) => {
            zklock::api::check_lock_name("the ClusterLock", name)?;
            let found = Api::<ClusterLock>::all(client.clone()).get_opt(name).await.map_err(|e| api_error(&e))?;
            let found =
                found.ok_or_else(|| format!("no ClusterLock {name:?} in this cluster (kubectl get clusterlocks)"))?;
            (Api::all(client.clone()), None, found.spec.permits)
        }
        None => {
            zklock::api::check_lock_name("the lock", &lock)?;
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
            let object =
                Api::<Lock>::namespaced(client.clone(), &ns).get_opt(&lock).await.map_err(|e| api_error(&e))?;
            (Api::namespaced(client.clone(), &ns), Some(ns), object.and_then(|l| l.spec.permits))
        }
    };
    let listed = claims.list(&ListParams::default()).await.map_err(|e| api_error(&e))?;
    let mut entries: Vec<Entry> = listed.items.iter().filter_map(|c| entry_of(c, &lock)).collect();
    order(&mut entries);
    let queue = Queue { lock, namespace, permits, claims: entries };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&queue).map_err(|e| e.to_string())?),
        Output::Yaml => print!("{}", serde_yaml::to_string(&queue).map_err(|e| e.to_string())?),
        Output::Table => print!("{}", table(&queue)),
    }
    Ok(0)
}

/// The queue as `kubectl get` prints tables (pure).
pub fn table(queue: &Queue) -> String {
    let several_namespaces = queue.namespace.is_none();
    let mut rows: Vec<Vec<String>> = vec![];
    let mut header = vec!["CLAIM", "PHASE", "POSITION", "MODE", "TOKEN", "WAITING FOR", "HOLDER POD"];
    if several_namespaces {
        header.insert(0, "NAMESPACE");
    }
    rows.push(header.iter().map(|h| h.to_string()).collect());
    for e in &queue.claims {
        let mut row = vec![
            e.claim.clone(),
            e.phase.clone(),
            e.position.map_or_else(|| "-".into(), |p| p.to_string()),
            e.mode.clone(),
            e.fencing_token.clone().unwrap_or_else(|| "-".into()),
            e.waiting_for.clone().unwrap_or_else(|| "-".into()),
            e.holder_pod.clone().unwrap_or_else(|| "-".into()),
        ];
        if several_namespaces {
            row.insert(0, e.namespace.clone());
        }
        rows.push(row);
    }
    super::api::columns(&rows, "(nobody holds or waits)")
}

/// Asks the holder of claim `claim` to let go: the `zklock.io/revoke` annotation, which the
/// operator turns into the claim's RevokeRequested condition (and a `zklock exec` holding it
/// sends its command SIGTERM).
pub async fn revoke(api: ApiArgs, namespace: Option<String>, claim: String, reason: String) -> Result<u8, String> {
    let client = api.client().await?;
    let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
    let claims: Api<LockClaim> = Api::namespaced(client, &ns);
    let patch = Patch::Merge(json!({ "metadata": { "annotations": { REVOKE_ANNOTATION: reason } } }));
    match claims.patch(&claim, &PatchParams::default(), &patch).await {
        Ok(_) => {
            eprintln!("lockclaim {ns}/{claim}: revocation requested ({reason})");
            Ok(0)
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Err(format!("no LockClaim {claim:?} in namespace {ns:?} (kubectl get lockclaims -n {ns})"))
        }
        Err(e) => Err(api_error(&e)),
    }
}

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            format!("the Kubernetes API refused: {} (ask for list on lockclaims)", s.message)
        }
        other => format!("the Kubernetes API: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, spec: serde_json::Value, status: serde_json::Value) -> LockClaim {
        serde_json::from_value(json!({
            "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
            "metadata": { "name": name, "namespace": "shop" }, "spec": spec, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_queue_lists_holders_by_token_then_waiters_by_position_and_leaves_out_the_finished() {
        let claims = [
            claim("w2", json!({ "lockName": "db" }), json!({ "phase": "Waiting", "position": 2, "waitingFor": "w1" })),
            claim("h", json!({ "lockName": "db", "mode": "Shared" }), json!({ "phase": "Held", "fencingToken": "9" })),
            claim("new", json!({ "lockName": "db" }), json!({})),
            claim("done", json!({ "lockName": "db" }), json!({ "phase": "Released" })),
            claim("other", json!({ "lockName": "cache" }), json!({ "phase": "Held", "fencingToken": "3" })),
            claim(
                "both",
                json!({ "locks": [{ "lockName": "cache" }, { "lockName": "db" }] }),
                json!({ "phase": "Waiting", "position": 5, "locks": [
                    { "lockName": "cache", "position": 0 },
                    { "lockName": "db", "position": 1, "waitingFor": "h" },
                ]}),
            ),
        ];
        let mut entries: Vec<Entry> = claims.iter().filter_map(|c| entry_of(c, "db")).collect();
        order(&mut entries);
        let names: Vec<&str> = entries.iter().map(|e| e.claim.as_str()).collect();
        assert_eq!(names, ["h", "both", "w2", "new"]);
        assert_eq!((entries[1].position, entries[1].waiting_for.as_deref()), (Some(1), Some("h")), "its place in db");
        assert_eq!(entries[0].mode, "Shared");
        let printed =
            table(&Queue { lock: "db".into(), namespace: Some("shop".into()), permits: None, claims: entries });
        let lines: Vec<&str> = printed.lines().collect();
        assert!(lines[0].starts_with("CLAIM   PHASE") && lines[0].contains("WAITING FOR"), "{printed}");
        assert!(lines[1].starts_with("h ") && lines[1].contains("Held") && lines[1].contains(" 9 "), "{printed}");
        assert_eq!(lines.len(), 5, "{printed}");
    }
}
