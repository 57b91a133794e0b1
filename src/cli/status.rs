//! `zklock status CLAIM`: where one claim stands, in words: its phase and since when, what it
//! holds or what it waits for (the claim ahead, and how long that one has held), its lease, a
//! revocation asked for, how it ended; and for a claim with no status, why (the lines of
//! `zklock check` that are not ready).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use zklock::api::{conditions, LockClaim, Phase};

use super::api::ApiArgs;
use super::check::{self, State};

use zklock::durations::brief as ago;

fn since(now: Timestamp, then: Timestamp) -> String {
    ago(Duration::try_from(now.duration_since(then)).unwrap_or_default())
}

/// The claim this one waits behind, if `waitingFor` names one of this cluster: those are named
/// bare (another cluster's claim is `<cluster>/<namespace>/<claim>`, a foreign client's node
/// its path).
fn claim_ahead(waiting_for: &str) -> Option<&str> {
    (!waiting_for.is_empty() && !waiting_for.contains('/') && !waiting_for.contains(' ')).then_some(waiting_for)
}

/// The lines `status` prints for `claim` (pure): `ahead` is the claim it waits behind, if read.
pub fn describe(claim: &LockClaim, ahead: Option<&LockClaim>, now: Timestamp) -> Vec<(&'static str, String)> {
    let mut lines = vec![];
    let ns = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    lines.push(("claim", format!("{ns}/{name}")));
    let locks: Vec<String> = claim.spec.lock_refs().iter().map(|l| format!("{} ({})", l.label(), l.mode)).collect();
    lines.push(("locks", locks.join(", ")));
    let created = claim.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let Some(status) = claim.status.as_ref().filter(|s| s.phase.is_some()) else {
        let age = created.map(|c| format!(", created {} ago", since(now, c))).unwrap_or_default();
        lines.push(("phase", format!("none: the operator has not written this claim{age}")));
        return lines;
    };
    let phase = status.phase.unwrap_or(Phase::Pending);
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    // When it came to this phase: the Held condition's last change tells for Held and Waiting.
    let changed = match phase {
        Phase::Held | Phase::Waiting | Phase::Pending => condition(conditions::HELD).map(|c| c.last_transition_time.0),
        _ => condition(conditions::FINISHED).map(|c| c.last_transition_time.0),
    }
    .or(created);
    let for_ = changed.map(|c| format!(" for {}", since(now, c))).unwrap_or_default();
    lines.push(("phase", format!("{phase:?}{for_}")));
    if claim.metadata.deletion_timestamp.is_some() {
        lines.push(("deleting", "the claim is being deleted: the operator releases it, then lets it go".into()));
    }
    if let Some(pod) = &claim.spec.holder {
        lines.push(("holder pod", pod.pod_name.clone()));
    }
    match phase {
        Phase::Held => {
            if let Some(at) = &status.acquired_at {
                lines.push(("held since", format!("{} ({} ago)", at.0, since(now, at.0))));
            }
            if let Some(token) = &status.fencing_token {
                lines.push(("fencing token", token.clone()));
            }
            for part in status.locks.iter().filter(|p| p.fencing_token.is_some()) {
                lines.push((
                    "  token of",
                    format!("{}: {}", part.lock_name, part.fencing_token.clone().unwrap_or_default()),
                ));
            }
            if let Some(expires) = &status.lease_expires_at {
                let left = Duration::try_from(expires.0.duration_since(now)).unwrap_or_default();
                lines.push(("lease", format!("ends at {} (in {}) unless renewed", expires.0, ago(left))));
            }
        }
        Phase::Waiting | Phase::Pending => {
            if let Some(position) = status.position {
                lines.push(("position", format!("{position} ahead")));
            }
            if let Some(waiting_for) = &status.waiting_for {
                let about_ahead = ahead.map(|a| {
                    let ahead_status = a.status.clone().unwrap_or_default();
                    let held =
                        ahead_status.acquired_at.map(|t| format!(", held for {}", since(now, t.0))).unwrap_or_default();
                    let pod = a.spec.holder.as_ref().map(|h| format!(" by pod {}", h.pod_name)).unwrap_or_default();
                    format!(" ({:?}{held}{pod})", ahead_status.phase.unwrap_or(Phase::Pending))
                });
                lines.push(("waiting for", format!("{waiting_for}{}", about_ahead.unwrap_or_default())));
            }
            for part in status.locks.iter().filter(|p| p.waiting_for.is_some()) {
                lines.push((
                    "  in",
                    format!("{}: behind {}", part.lock_name, part.waiting_for.clone().unwrap_or_default()),
                ));
            }
            if let Some(timeout) = claim.spec.acquire_timeout_seconds {
                let left = created.map(|c| {
                    let waited = Duration::try_from(now.duration_since(c)).unwrap_or_default();
                    ago(Duration::from_secs(timeout as u64).saturating_sub(waited))
                });
                lines.push(("gives up", format!("after {timeout}s of waiting ({} left)", left.unwrap_or_default())));
            }
        }
        _ => {}
    }
    if let Some(c) = condition(conditions::REVOKE_REQUESTED).filter(|c| c.status == "True") {
        lines.push(("revocation", format!("asked {} ago: {}", since(now, c.last_transition_time.0), c.message)));
    }
    for type_ in [conditions::INVALID, conditions::FINISHED] {
        if let Some(c) = condition(type_).filter(|c| c.status == "True") {
            lines.push((
                if type_ == conditions::INVALID { "invalid" } else { "ended" },
                format!("{}: {}", c.reason, c.message),
            ));
        }
    }
    lines
}

/// How long each API call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// Whether two claims queue for one lock at least.
fn shares_a_lock(claim: &LockClaim, other: &LockClaim) -> bool {
    let labels = |c: &LockClaim| c.spec.lock_refs().iter().map(|l| l.label()).collect::<Vec<_>>();
    let theirs = labels(other);
    labels(claim).iter().any(|l| theirs.contains(l))
}

fn print(lines: &[(&'static str, String)]) {
    for (what, said) in lines {
        println!("{what:<14}{said}");
    }
}

/// `zklock status CLAIM`: 0 when the claim was read.
pub async fn status(
    api: ApiArgs,
    namespace: Option<String>,
    claim: String,
    operator: &check::OperatorRef,
) -> Result<u8, String> {
    let config = api.config().await?;
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = zklock::client::builder(config).map_err(|e| format!("no Kubernetes API: {e}"))?.build();
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), &namespace);
    let within = |call| tokio::time::timeout(CALL_DEADLINE, call);
    let read = within(claims.get_opt(&claim))
        .await
        .map_err(|_| format!("reading LockClaim {namespace}/{claim}: no answer within {CALL_DEADLINE:?}"))?
        .map_err(|e| format!("reading LockClaim {namespace}/{claim}: {e}"))?;
    let found = read
        .ok_or_else(|| format!("no LockClaim {claim:?} in namespace {namespace} (zklock status -n NAMESPACE CLAIM)"))?;
    let waiting_for = found.status.as_ref().and_then(|s| s.waiting_for.clone());
    let ahead = match waiting_for.as_deref().and_then(claim_ahead) {
        // A bare name is a claim of this cluster, of this namespace or (a ClusterLock) another:
        // the one here counts only if it queues for one of the same locks.
        Some(name) => within(claims.get_opt(name))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
            .filter(|ahead| shares_a_lock(&found, ahead)),
        None => None,
    };
    print(&describe(&found, ahead.as_ref(), Timestamp::now()));
    if found.status.as_ref().and_then(|s| s.phase).is_none() {
        // Why the operator has not written it: what `check` finds not ready.
        let findings = check::findings(&client, &namespace, operator).await;
        let not_ready: Vec<_> = findings.into_iter().filter(|f| f.state != State::Ready).collect();
        if not_ready.iter().any(|f| f.said.starts_with(check::CANNOT_LOOK)) {
            println!("\nwhy: zklock status cannot tell (you may not look for the operator everywhere):");
        } else if not_ready.iter().all(|f| f.state == State::Note) {
            println!(
                "\nzklock looks ready to serve {namespace}: a claim just created gets its status within a second; \
                 if it stays without one, read the leader's log (zklock check names it)"
            );
        } else {
            println!("\nwhy: zklock is not ready to serve {namespace}:");
        }
        print!("{}", check::report(&not_ready));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(json: serde_json::Value) -> LockClaim {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_waiter_says_whom_it_waits_for_and_how_long_that_one_has_held() {
        let now: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        let waiter = claim(serde_json::json!({
            "metadata": { "name": "b", "namespace": "shop", "creationTimestamp": "2026-11-29T09:58:00Z" },
            "spec": { "lockName": "db", "acquireTimeoutSeconds": 600 },
            "status": { "phase": "Waiting", "position": 1, "waitingFor": "a",
                "conditions": [{ "type": "Held", "status": "False", "reason": "Waiting", "message": "",
                                 "lastTransitionTime": "2026-11-29T09:59:00Z" }] }
        }));
        let holder = claim(serde_json::json!({
            "metadata": { "name": "a", "namespace": "shop" },
            "spec": { "lockName": "db", "holder": { "podName": "deploy-1" } },
            "status": { "phase": "Held", "acquiredAt": "2026-11-29T09:45:00Z" }
        }));
        let lines = describe(&waiter, Some(&holder), now);
        let text: Vec<String> = lines.iter().map(|(w, s)| format!("{w}: {s}")).collect();
        assert!(text.contains(&"phase: Waiting for 1m0s".to_string()), "{text:#?}");
        assert!(text.contains(&"waiting for: a (Held, held for 15m0s by pod deploy-1)".to_string()), "{text:#?}");
        assert!(text.contains(&"gives up: after 600s of waiting (8m0s left)".to_string()), "{text:#?}");
        assert_eq!(claim_ahead("a"), Some("a"));
        assert_eq!(claim_ahead("eu-1/shop/a"), None, "another cluster's");
        assert_eq!(claim_ahead("/zklock/locks/shop/db/_c_x-lock-0000000001"), None);
    }

    #[test]
    fn a_claim_without_status_says_so() {
        let now: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        let fresh = claim(serde_json::json!({
            "metadata": { "name": "c", "namespace": "shop", "creationTimestamp": "2026-11-29T09:59:30Z" },
            "spec": { "lockName": "db" }
        }));
        let lines = describe(&fresh, None, now);
        assert_eq!(lines.last().unwrap().1, "none: the operator has not written this claim, created 30s ago");
    }
}
