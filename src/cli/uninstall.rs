//! `zklock admin before-uninstall`: the chart's pre-delete step. Every claim carries the
//! operator's finalizer until the operator has released it; once the operator is gone nobody
//! removes it, and deleting such a claim, or its namespace, hangs. So before the operator goes:
//! refuse, naming the claims, or (when asked) delete them and wait until the operator has
//! released each. Nothing else is ever done to a claim: dropping the finalizer ourselves would
//! race the running operator, and ungating a gated pod would run it without its lock.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::ResourceExt;
use zklock::api::{LockClaim, FINALIZER};

use super::api::ApiArgs;

/// The claims that still carry the finalizer, as `namespace/name (phase)`, in `namespaces` (all
/// when empty).
async fn finalized(client: &kube::Client, namespaces: &[String]) -> Result<Vec<LockClaim>, String> {
    let apis: Vec<Api<LockClaim>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
    };
    let mut found = Vec::new();
    for api in apis {
        let list = api.list(&ListParams::default()).await.map_err(|e| api_error(&e))?;
        found.extend(list.items.into_iter().filter(|c| c.finalizers().iter().any(|f| f == FINALIZER)));
    }
    Ok(found)
}

fn describe(claim: &LockClaim) -> String {
    let phase = claim.status.as_ref().and_then(|s| s.phase).map_or("new".to_string(), |p| format!("{p:?}"));
    let deleting = if claim.metadata.deletion_timestamp.is_some() { ", being deleted" } else { "" };
    format!("{}/{} ({phase}{deleting})", claim.namespace().unwrap_or_default(), claim.name_any())
}

/// The operator's leader Lease.
struct LeaseRef {
    namespace: String,
    name: String,
}

pub async fn before_uninstall(
    api: ApiArgs,
    namespaces: Vec<String>,
    delete_claims: bool,
    timeout: Duration,
    lease_namespace: Option<String>,
    lease_name: String,
) -> Result<u8, String> {
    let client = api.client().await?;
    let namespaces: Vec<String> = namespaces.into_iter().filter(|n| !n.is_empty()).collect();
    // With --delete-claims the operator is told first, then the claims are listed: one it made
    // for a gated pod until it knew is in the list.
    let lease = lease_namespace.filter(|_| delete_claims).map(|namespace| LeaseRef { namespace, name: lease_name });
    if let Some(lease) = &lease {
        if !finalized(&client, &namespaces).await?.is_empty() {
            mark_uninstalling(&client, lease).await?;
        }
    }
    let claims = finalized(&client, &namespaces).await?;
    if claims.is_empty() {
        if let Some(lease) = &lease {
            unmark(&client, lease).await;
        }
        println!("no LockClaim carries {FINALIZER}: nothing keeps the operator");
        return Ok(0);
    }
    let listed: Vec<String> = claims.iter().map(describe).collect();
    if !delete_claims {
        eprintln!(
            "zklock: {} LockClaim(s) still carry the operator's finalizer {FINALIZER}; without the operator they, \
             and their namespaces, could not be deleted:\n  {}\nDelete them first (their Jobs or pods, or \
             `kubectl delete lockclaims -n NAMESPACE --all`) and uninstall again, or uninstall with \
             `--set uninstall.deleteClaims=true` to have them deleted and released before the operator goes.",
            listed.len(),
            listed.join("\n  ")
        );
        return Ok(1);
    }
    let released = delete_and_wait(&client, claims, &namespaces, timeout).await;
    if let Some(lease) = &lease {
        // The operators that saw the mark keep to it until they stop; the next installation,
        // which finds the same Lease, must not.
        unmark(&client, lease).await;
    }
    released
}

/// Deletes `claims` and waits until the operator has released each, within `timeout`.
async fn delete_and_wait(
    client: &kube::Client,
    claims: Vec<LockClaim>,
    namespaces: &[String],
    timeout: Duration,
) -> Result<u8, String> {
    let listed: Vec<String> = claims.iter().map(describe).collect();
    println!("deleting {} LockClaim(s) and waiting until the operator has released each:", listed.len());
    for line in &listed {
        println!("  {line}");
    }
    let waits = futures::stream::iter(claims)
        .map(|claim| {
            let client = client.clone();
            async move {
                let ns = claim.namespace().unwrap_or_default();
                let name = claim.name_any();
                let api: Api<LockClaim> = Api::namespaced(client, &ns);
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                    Err(e) => return Err(format!("delete {ns}/{name}: {}", api_error(&e))),
                }
                let uid = claim.uid().unwrap_or_default();
                await_condition(api, &name, conditions::is_deleted(&uid))
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("wait for {ns}/{name}: {e}"))
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>();
    match tokio::time::timeout(timeout, waits).await {
        Ok(Ok(_)) => {
            println!("every claim released");
            Ok(0)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => {
            let left: Vec<String> = finalized(client, namespaces).await?.iter().map(describe).collect();
            Err(format!(
                "{} LockClaim(s) not released within {timeout:?} (is the operator running and leading?):\n  {}",
                left.len(),
                left.join("\n  ")
            ))
        }
    }
}

/// Marks the operator's leader Lease as being uninstalled, and waits until the leader has read
/// the mark: its next renewal is a write tested against the version it read, so a renewal that
/// lands after the mark was made on a read that had it. From then on the operator makes no claim
/// for a gated pod, removes no gate and grants nothing new: deleting every claim then leaves
/// none made again behind (with its finalizer, for ever once the operator is gone), and starts no
/// pod while the pods of the holders just deleted still run.
async fn mark_uninstalling(client: &kube::Client, lease: &LeaseRef) -> Result<(), String> {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    use zklock::api::UNINSTALLING_ANNOTATION;
    let (namespace, lease_name) = (lease.namespace.as_str(), lease.name.as_str());
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let mark = serde_json::json!({ "metadata": { "annotations": { UNINSTALLING_ANNOTATION: "helm uninstall" } } });
    let marked = match leases.patch(lease_name, &PatchParams::default(), &Patch::Merge(&mark)).await {
        Ok(lease) => lease,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            println!("no Lease {namespace}/{lease_name}: no operator has led here");
            return Ok(());
        }
        Err(e) => return Err(format!("mark the Lease {namespace}/{lease_name}: {}", lease_error(&e))),
    };
    let version = marked.resource_version();
    let deadline = 3 * zklock::leader::LEASE_DURATION;
    let renewed = await_condition(leases, lease_name, move |lease: Option<&Lease>| {
        lease.is_some_and(|l| {
            l.resource_version() != version
                && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).is_some_and(|h| !h.is_empty())
        })
    });
    match tokio::time::timeout(deadline, renewed).await {
        Ok(Ok(_)) => {
            println!("the operator knows it is being uninstalled: it grants nothing new and makes no claim");
            Ok(())
        }
        Ok(Err(e)) => Err(format!("watch the Lease {namespace}/{lease_name}: {e}")),
        Err(_) => Err(format!(
            "no operator renewed the Lease {namespace}/{lease_name} within {deadline:?}: is it running and leading? \
             Without it the claims cannot be released"
        )),
    }
}

/// Takes the mark of [`mark_uninstalling`] away again.
async fn unmark(client: &kube::Client, lease: &LeaseRef) {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    let (namespace, name) = (lease.namespace.as_str(), lease.name.as_str());
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let unmark = serde_json::json!({ "metadata": { "annotations": { zklock::api::UNINSTALLING_ANNOTATION: null } } });
    match leases.patch(name, &PatchParams::default(), &Patch::Merge(&unmark)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => eprintln!("zklock: could not take the mark off the Lease {namespace}/{name}: {}", lease_error(&e)),
    }
}

fn lease_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            format!("the Kubernetes API refused: {} (the step needs get, patch, list and watch on leases)", s.message)
        }
        other => format!("the Kubernetes API: {other}"),
    }
}

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            format!("the Kubernetes API refused: {} (the step needs list, delete and watch on lockclaims)", s.message)
        }
        other => format!("the Kubernetes API: {other}"),
    }
}
