//! What to do for a gated pod, from the pod and its claim as the watches have them: pure, so
//! every rule is a unit test.
//!
//! A pod asks for a lock with the annotation `zklock.io/lock` (and optionally `zklock.io/mode`,
//! `zklock.io/acquire-timeout-seconds`, `zklock.io/skip-if-held`, `zklock.io/supersede-group`)
//! and the scheduling gate `zklock.io/lock`. The operator makes a LockClaim for it (named as the
//! pod, owned by it, the pod its holder), removes that gate once the claim is Held, and keeps the
//! condition `zklock.io/LockAcquired` on the pod saying where it stands. A pod that will never
//! get its lock because it asked not to wait (skip if held) or a newer pod of its group took its
//! place (newest wins) is ended, never started: its status written as a kubelet would, so that
//! its Job goes on. The annotations are read when the claim is made: the claim, whose spec
//! cannot change, is the record from then on.

use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::conditions::{FINISHED, REVOKE_REQUESTED};
use crate::api::{
    check_lock_name, Holder, KeptClaim, LockClaim, LockClaimSpec, LockRef, Phase, MAX_LOCKS, REVOKE_ANNOTATION,
};
use crate::controller::base::kept_pod::KeptPod;
use crate::recipe::Mode;

/// The scheduling gate that holds a pod back until it holds its lock.
pub const GATE: &str = crate::api::gate_policy::POD_LOCK;
/// The annotation naming the lock (its `lockName`).
pub const LOCK: &str = crate::api::gate_policy::POD_LOCK;
/// The annotation giving the mode: Exclusive (default) or Shared.
pub const MODE: &str = "zklock.io/mode";
/// The annotation giving `acquireTimeoutSeconds`.
pub const ACQUIRE_TIMEOUT: &str = "zklock.io/acquire-timeout-seconds";
/// Skip if held: the pod phase (`Succeeded` or `Failed`) a pod ends in, never started, when its
/// lock is busy (its claim tries once, `acquireTimeoutSeconds: 0`).
pub const SKIP_IF_HELD: &str = "zklock.io/skip-if-held";
/// Newest wins: the claim's `spec.supersede.group`. A superseded pod ends `Succeeded`.
pub const SUPERSEDE_GROUP: &str = "zklock.io/supersede-group";
/// The pod condition of a pod ended without its lock (reason `LockHeld` or `Superseded`): what
/// a Job's `podFailurePolicy` matches.
pub const SKIPPED: &str = "zklock.io/Skipped";

const KNOWN: [&str; 5] = [LOCK, MODE, ACQUIRE_TIMEOUT, SKIP_IF_HELD, SUPERSEDE_GROUP];
const MAX_TIMEOUT_SECONDS: i64 = 31_536_000;

/// What the operator itself knows of the pod's claim besides the watch's copy (read by the
/// caller from the registry and the engine, so that the plan stays pure).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Known {
    /// Its own last word on the claim is Held (`Registry::known_phase`): a copy from the watch
    /// may be older than the operator's own later write, so both must say Held.
    pub held: bool,
    /// This term judged that hold: no re-anchoring verdict on it (`Registry::verdict`), its
    /// locks admit in this session (no pass is judging it), and this term wrote its status
    /// (`Registry::written`; there is no stamp without leader election). A Held an earlier
    /// leader or session left may still end `Lost`: no pod starts under it.
    pub judged: bool,
    /// This term's leader epoch (`Context::epoch`), which the copy must carry.
    pub epoch: Option<i64>,
}

/// What the pod's annotations ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The locks, in the order the annotation names them (`a,b`): one, or several to take
    /// together, each in `mode`.
    pub locks: Vec<String>,
    pub mode: Mode,
    pub acquire_timeout_seconds: Option<i64>,
    /// Skip if held: the phase the pod ends in when its lock is busy.
    pub skip_as: Option<&'static str>,
    pub supersede_group: Option<String>,
}

impl Ask {
    /// The lock names, joined with commas.
    pub fn label(&self) -> String {
        self.locks.join(",")
    }
}

/// The step the pod needs, besides its condition.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Nothing,
    /// Make this claim for the pod (in the pods' creation order, per lock).
    Create {
        locks: Vec<String>,
        claim: Box<LockClaim>,
    },
    /// Delete the claim of an earlier pod of the same name (this UID), to make room.
    DeleteStale {
        uid: String,
    },
    /// Remove the gate at this index of `spec.schedulingGates`.
    Ungate {
        index: usize,
    },
    /// End the never-started pod: its status phase (`Succeeded` or `Failed`) and the condition
    /// [`SKIPPED`] with this reason and message.
    End {
        phase: &'static str,
        reason: &'static str,
        message: String,
    },
    /// Held, but not (yet) by a judgement of this term, or being revoked: the gate stays; look
    /// again soon (a later session's pass may end without a write that would wake the pod).
    Recheck,
}

/// The condition the pod should carry, and whether a change to it is worth a Warning event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub acquired: bool,
    pub reason: &'static str,
    pub message: String,
    pub warning: bool,
}

impl Report {
    fn ok(acquired: bool, reason: &'static str, message: String) -> Self {
        Report { acquired, reason, message, warning: false }
    }

    fn problem(reason: &'static str, message: String) -> Self {
        Report { acquired: false, reason, message, warning: true }
    }

    /// Whether the pod already carries this condition (then nothing is written, and no event).
    pub fn is_shown_by(&self, current: Option<&PodCondition>) -> bool {
        current.is_some_and(|c| {
            c.status == if self.acquired { "True" } else { "False" }
                && c.reason.as_deref() == Some(self.reason)
                && c.message.as_deref() == Some(self.message.as_str())
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodPlan {
    pub step: Step,
    pub report: Option<Report>,
}

impl PodPlan {
    fn nothing() -> Self {
        PodPlan { step: Step::Nothing, report: None }
    }

    fn report(report: Report) -> Self {
        PodPlan { step: Step::Nothing, report: Some(report) }
    }
}

/// Reads the annotations of a pod that has some: the lock it asks for, or what to fix.
pub fn read(pod: &KeptPod) -> Result<Ask, Report> {
    let invalid = |message: String| Report::problem("InvalidAnnotation", message);
    if let Some(unknown) =
        pod.metadata.annotations.iter().flatten().map(|(k, _)| k).find(|k| !KNOWN.contains(&k.as_str()))
    {
        return Err(invalid(format!(
            "unknown annotation {unknown}: zklock reads {LOCK}, {MODE}, {ACQUIRE_TIMEOUT}, {SKIP_IF_HELD} and \
             {SUPERSEDE_GROUP}; fix the pod template and recreate the pod"
        )));
    }
    let Some(lock_name) = pod.annotation(LOCK) else {
        return Err(Report::problem(
            "MissingLockAnnotation",
            format!(
                "the pod has scheduling gate {GATE} but no annotation {LOCK} naming the lock it waits for: annotate it \
                 (kubectl annotate pod {} {LOCK}=LOCK-NAME) or fix the pod template",
                pod.name()
            ),
        ));
    };
    let mut locks: Vec<String> = vec![];
    for name in lock_name.split(',').map(str::trim) {
        check_lock_name(&format!("annotation {LOCK}"), name).map_err(invalid)?;
        if locks.iter().any(|l| l == name) {
            return Err(invalid(format!("annotation {LOCK} names lock {name:?} twice: name each lock once")));
        }
        locks.push(name.to_string());
    }
    if locks.len() > MAX_LOCKS {
        return Err(invalid(format!(
            "annotation {LOCK} names {} locks: a pod may take at most {MAX_LOCKS}",
            locks.len()
        )));
    }
    let mode = match pod.annotation(MODE) {
        None | Some("Exclusive") => Mode::Exclusive,
        Some("Shared") => Mode::Shared,
        Some(other) => return Err(invalid(format!("annotation {MODE} is {other:?}; use Exclusive or Shared"))),
    };
    let acquire_timeout_seconds = match pod.annotation(ACQUIRE_TIMEOUT) {
        None => None,
        Some(text) => match text.trim().parse::<i64>() {
            Ok(s) if (0..=MAX_TIMEOUT_SECONDS).contains(&s) => Some(s),
            _ => {
                return Err(invalid(format!(
                    "annotation {ACQUIRE_TIMEOUT} is {text:?}; use a whole number of seconds from 0 to \
                     {MAX_TIMEOUT_SECONDS} (0: try once, never queue)"
                )))
            }
        },
    };
    let skip_as = match pod.annotation(SKIP_IF_HELD) {
        None => None,
        Some(value) => Some(skip_phase(value).ok_or_else(|| {
            invalid(format!(
                "annotation {SKIP_IF_HELD} is {value:?}: give the phase the pod ends in when its lock is held, \
                 Succeeded (the Job counts the skipped run as done) or Failed (as failed: see podFailurePolicy)"
            ))
        })?),
    };
    if skip_as.is_some() && acquire_timeout_seconds.is_some() {
        return Err(invalid(format!(
            "annotations {SKIP_IF_HELD} and {ACQUIRE_TIMEOUT} together: skipping means trying once; give one of them"
        )));
    }
    let supersede_group = match pod.annotation(SUPERSEDE_GROUP) {
        None => None,
        Some(_) if skip_as.is_some() => {
            return Err(invalid(format!(
                "annotations {SKIP_IF_HELD} and {SUPERSEDE_GROUP} together: a pod that never waits supersedes \
                 nothing; give one of them"
            )))
        }
        Some(_) if locks.len() > 1 => {
            return Err(invalid(format!(
                "annotation {SUPERSEDE_GROUP} goes with one lock in {LOCK}: a claim over several locks cannot be \
                 superseded"
            )))
        }
        Some(group) => {
            crate::api::check_group(group).map_err(|e| invalid(format!("annotation {SUPERSEDE_GROUP}: {e}")))?;
            Some(group.to_string())
        }
    };
    Ok(Ask { locks, mode, acquire_timeout_seconds, skip_as, supersede_group })
}

/// The pod phase a `zklock.io/skip-if-held` value names, if it names one.
fn skip_phase(value: &str) -> Option<&'static str> {
    ["Succeeded", "Failed"].into_iter().find(|phase| *phase == value)
}

/// The claim made for a pod: named as the pod (so that `kubectl get lockclaim POD` finds it),
/// owned by it (the garbage collector deletes it with the pod), the pod its holder (so that the
/// lock is released when the pod finishes or is deleted).
pub fn claim_for(pod: &KeptPod, ask: &Ask) -> LockClaim {
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name().into(),
        uid: pod.uid().into(),
        controller: Some(true),
        // Blocking the owner's deletion needs the right to set finalizers on pods; the claim's
        // own finalizer already keeps it until its node is gone.
        block_owner_deletion: None,
    };
    // The phase a skipped pod ends in, kept with the claim (the record from then on: a pod's
    // annotations may change).
    let annotations = ask.skip_as.map(|phase| [(SKIP_IF_HELD.to_string(), phase.to_string())].into());
    LockClaim {
        metadata: ObjectMeta {
            name: Some(pod.name().into()),
            namespace: Some(pod.namespace().into()),
            owner_references: Some(vec![owner]),
            annotations,
            // Its finalizer from the start: no write to add it.
            finalizers: Some(vec![crate::api::FINALIZER.to_string()]),
            ..ObjectMeta::default()
        },
        spec: LockClaimSpec {
            holder: Some(Holder { pod_name: pod.name().into(), namespace: None }),
            // Skip if held: try once, never queue.
            acquire_timeout_seconds: ask.acquire_timeout_seconds.or(ask.skip_as.map(|_| 0)),
            supersede: ask.supersede_group.clone().map(|group| Box::new(crate::api::Supersede { group })),
            ..match &ask.locks[..] {
                [one] => LockClaimSpec::one(one.clone(), ask.mode),
                several => LockClaimSpec {
                    lock_name: None,
                    mode: None,
                    locks: Some(several.iter().map(|l| LockRef::namespaced(l.clone(), ask.mode)).collect()),
                    ..LockClaimSpec::one("", ask.mode)
                },
            }
        },
        status: None,
    }
}

/// Which pod, if any, the claim was made for: its owner of kind Pod.
pub fn owner_pod(claim: &KeptClaim) -> Option<&OwnerReference> {
    claim.metadata.owner_references.iter().flatten().find(|o| o.kind == "Pod" && o.api_version == "v1")
}

/// What to do for `pod`, given the claim of the same name (if the claim watch has one) and what
/// the operator knows of that claim itself (see [`Known`]).
pub fn plan(pod: &KeptPod, claim: Option<&KeptClaim>, known: Known) -> PodPlan {
    let finished = matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed"));
    if pod.metadata.deletion_timestamp.is_some() || finished {
        return PodPlan::nothing();
    }
    let gate = pod.gates.iter().position(|g| g == GATE);
    let acquired = pod.condition.as_ref().is_some_and(|c| c.status == "True");
    let name = pod.name();
    let asks = gate.is_some() || pod.annotation(LOCK).is_some();
    match claim {
        Some(claim) => match owner_pod(claim) {
            Some(owner) if owner.uid == pod.uid() => for_own_claim(pod, claim, gate, known),
            // Made for an earlier pod of this name, which is gone (this pod has the name now),
            // and this one asks for a lock: its own claim needs the name. A claim owned by a pod
            // of another name was not made for a gated pod: somebody else's, left alone.
            Some(owner) if owner.name == name && asks => PodPlan {
                step: Step::DeleteStale { uid: claim.metadata.uid.clone().unwrap_or_default() },
                report: None,
            },
            _ if !asks => PodPlan::nothing(),
            _ => PodPlan::report(Report::problem(
                "ClaimNameTaken",
                format!(
                    "a LockClaim named {name} exists and was not made for this pod; the pod's claim takes its pod's \
                     name: delete or rename that claim"
                ),
            )),
        },
        None => match (gate, pod.annotation(LOCK).is_some()) {
            (None, false) => PodPlan::nothing(),
            // Granted earlier; its claim has been deleted since.
            (None, true) if acquired => PodPlan::nothing(),
            (None, true) => PodPlan::report(Report::problem(
                "NotGated",
                format!(
                    "the pod has annotation {LOCK} but not scheduling gate {GATE}, so nothing holds it back: it runs \
                     without the lock. Add spec.schedulingGates: [{{name: {GATE}}}] to the pod template"
                ),
            )),
            (Some(_), _) => match read(pod) {
                Err(problem) => PodPlan::report(problem),
                Ok(ask) => PodPlan {
                    report: Some(waiting(pod, &ask.label())),
                    step: Step::Create { locks: ask.locks.clone(), claim: Box::new(claim_for(pod, &ask)) },
                },
            },
        },
    }
}

fn for_own_claim(pod: &KeptPod, claim: &KeptClaim, gate: Option<usize>, known: Known) -> PodPlan {
    let lock = &claim.spec.lock_label();
    let name = pod.name();
    match claim.phase() {
        // A pod whose gate is gone runs already: only its condition is kept.
        Some(Phase::Held) if known.held && (gate.is_none() || judged_here(claim, known)) => {
            let tokens: Vec<String> = claim
                .lock_statuses()
                .iter()
                .map(|l| format!("{} {}", l.lock_name, l.fencing_token.as_deref().unwrap_or("?")))
                .collect();
            let token =
                if tokens.is_empty() { claim.fencing_token().unwrap_or("?").to_string() } else { tokens.join(", ") };
            let report = Report::ok(
                true,
                "Acquired",
                format!("LockClaim {name} holds lock {lock} (fencing token {token}); scheduling gate {GATE} removed"),
            );
            let step = gate.map_or(Step::Nothing, |index| Step::Ungate { index });
            PodPlan { step, report: Some(report) }
        }
        // Not judged by this term (a verdict may still end it Lost), or being revoked: a pod
        // starts only under a Held that nobody is taking back (docs/design.md: gated pods).
        Some(Phase::Held) if known.held => PodPlan { step: Step::Recheck, report: Some(waiting(pod, lock)) },
        // The pod had the lock and ran; how its claim ended since is the claim's story.
        Some(phase) if phase.is_terminal() && pod.condition.as_ref().is_some_and(|c| c.status == "True") => {
            PodPlan::nothing()
        }
        // Never started and never to be: ended as the pod asked, so that its Job goes on. A
        // superseded pod counts as done: the newer one does the work, and a failed one would be
        // replaced by its Job with a pod newer still, which would supersede the newest.
        Some(phase @ (Phase::Superseded | Phase::Expired)) if gate.is_some() => {
            let why = claim.condition_message(FINISHED).unwrap_or_default();
            let skip_as =
                claim.metadata.annotations.as_ref().and_then(|a| a.get(SKIP_IF_HELD)).and_then(|p| skip_phase(p));
            let (end, reason) = match phase {
                Phase::Superseded => (Some("Succeeded"), "Superseded"),
                _ => (skip_as, "LockHeld"),
            };
            match end {
                Some(end) => PodPlan {
                    step: Step::End {
                        phase: end,
                        reason,
                        message: format!(
                            "LockClaim {name} ended {phase:?} before lock {lock} was granted: {why}. \
                                          The pod was not started and ends {end}"
                        ),
                    },
                    report: None,
                },
                None => ended_gated(name, lock, phase, why),
            }
        }
        Some(phase) if phase.is_terminal() => {
            ended_gated(name, lock, phase, claim.condition_message(FINISHED).unwrap_or_default())
        }
        _ => PodPlan::report(waiting(pod, lock)),
    }
}

/// The claim ended before a grant and the pod did not ask to be ended then: it stays gated.
fn ended_gated(name: &str, lock: &str, phase: Phase, why: &str) -> PodPlan {
    PodPlan::report(Report::problem(
        phase_reason(phase),
        format!(
            "LockClaim {name} ended {phase:?} before lock {lock} was granted: {why}. The pod stays gated: delete it \
             (or its Job) to give up, or delete the LockClaim to queue again"
        ),
    ))
}

/// Whether the claim's Held is one this term judged (see [`Known::judged`]), carried by the
/// copy at hand, and nobody is taking it back (a revocation asked for, by annotation or in the
/// znode, ends the hold after its grace: the pod would start only to be told to stop).
fn judged_here(claim: &KeptClaim, known: Known) -> bool {
    let revoking = claim.condition_true(REVOKE_REQUESTED)
        || claim.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(REVOKE_ANNOTATION));
    known.judged && (known.epoch.is_none() || claim.leader_epoch() == known.epoch) && !revoking
}

fn waiting(pod: &KeptPod, lock: &str) -> Report {
    let (name, namespace) = (pod.name(), pod.namespace());
    Report::ok(
        false,
        "Waiting",
        format!(
            "LockClaim {name} waits for lock {lock}: kubectl get lockclaim -n {namespace} {name} shows its place in \
             the queue"
        ),
    )
}

fn phase_reason(phase: Phase) -> &'static str {
    match phase {
        Phase::Released => "Released",
        Phase::Revoked => "Revoked",
        Phase::Expired => "Expired",
        Phase::Lost => "Lost",
        Phase::Superseded => "Superseded",
        _ => "Invalid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::base::kept_pod::CONDITION;
    use serde_json::{json, Value};

    fn pod(annotations: Value, gates: &[&str], condition: Option<(&str, &str)>) -> KeptPod {
        let gates: Vec<Value> = gates.iter().map(|g| json!({ "name": g })).collect();
        let conditions: Vec<Value> = condition
            .iter()
            .map(|(status, reason)| json!({"type": CONDITION, "status": status, "reason": reason, "message": "m"}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "job-abc", "namespace": "shop", "uid": "pod-1", "annotations": annotations},
            "spec": {"containers": [], "schedulingGates": gates},
            "status": {"phase": "Pending", "conditions": conditions},
        }))
        .unwrap()
    }

    fn claim_of(pod: &KeptPod, phase: Option<Phase>) -> KeptClaim {
        let mut claim = claim_for(pod, &read(pod).unwrap());
        claim.metadata.uid = Some("claim-1".into());
        claim.status = phase.map(|phase| crate::api::LockClaimStatus {
            phase: Some(phase),
            fencing_token: Some("42".into()),
            leader_epoch: Some(7),
            ..Default::default()
        });
        claim.into()
    }

    /// Held, as the operator knows it, by a judgement of this term (epoch 7).
    const JUDGED: Known = Known { held: true, judged: true, epoch: Some(7) };

    fn gated(annotations: Value) -> KeptPod {
        pod(annotations, &["example.com/other", GATE], None)
    }

    #[test]
    fn a_gated_pod_gets_a_claim_named_and_owned_as_the_pod_with_its_lock_mode_and_timeout() {
        let p = gated(json!({LOCK: "db", MODE: "Shared", ACQUIRE_TIMEOUT: "600"}));
        let plan = plan(&p, None, Known::default());
        let Step::Create { locks, claim } = plan.step else { panic!("{plan:?}") };
        assert_eq!(locks, ["db"]);
        assert_eq!(claim.metadata.name.as_deref(), Some("job-abc"));
        let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("Pod", "pod-1", Some(true)));
        assert_eq!(claim.spec.holder.as_ref().map(|h| h.pod_name.as_str()), Some("job-abc"));
        assert_eq!(claim.metadata.finalizers, Some(vec![crate::api::FINALIZER.to_string()]), "no write to add it");
        assert_eq!((claim.spec.mode, claim.spec.acquire_timeout_seconds), (Some(Mode::Shared), Some(600)));
        let report = plan.report.unwrap();
        assert_eq!((report.acquired, report.reason, report.warning), (false, "Waiting", false));
        let plain = plan_of(&gated(json!({ LOCK: "db" })));
        assert!(
            matches!(plain.step, Step::Create { ref claim, .. } if claim.spec.mode == Some(Mode::Exclusive) && claim.spec.acquire_timeout_seconds.is_none())
        );
    }

    #[test]
    fn a_pod_asking_for_several_locks_gets_a_claim_over_all_of_them_in_one_mode() {
        let plan = plan_of(&gated(json!({LOCK: "db, search-index", MODE: "Shared"})));
        let Step::Create { locks, claim } = plan.step else { panic!("{plan:?}") };
        assert_eq!(locks, ["db", "search-index"]);
        assert_eq!((claim.spec.lock_name.as_deref(), claim.spec.mode), (None, None));
        let refs: Vec<(String, Mode)> = claim.spec.locks.unwrap().into_iter().map(|l| (l.label(), l.mode)).collect();
        assert_eq!(refs, [("db".to_string(), Mode::Shared), ("search-index".to_string(), Mode::Shared)]);
        for (bad, needle) in [("a,a", "twice"), ("a,,b", "not a valid lock name"), ("a,B", "not a valid lock name")] {
            let plan = plan_of(&gated(json!({ LOCK: bad })));
            let report = plan.report.unwrap();
            assert_eq!(report.reason, "InvalidAnnotation", "{bad}");
            assert!(report.message.contains(needle), "{bad}: {}", report.message);
        }
    }

    fn plan_of(p: &KeptPod) -> PodPlan {
        plan(p, None, Known::default())
    }

    #[test]
    fn bad_annotations_are_reported_on_the_pod_and_nothing_is_made() {
        for (annotations, gates, reason, needle) in [
            (json!({}), vec![GATE], "MissingLockAnnotation", "no annotation zklock.io/lock"),
            (json!({ LOCK: "db" }), vec![], "NotGated", "runs without the lock"),
            (json!({ LOCK: "Bad_Name" }), vec![GATE], "InvalidAnnotation", "annotation zklock.io/lock \"Bad_Name\""),
            (json!({ LOCK: "db", MODE: "shared" }), vec![GATE], "InvalidAnnotation", "use Exclusive or Shared"),
            (json!({ LOCK: "db", ACQUIRE_TIMEOUT: "10m" }), vec![GATE], "InvalidAnnotation", "whole number"),
            (json!({ LOCK: "db", ACQUIRE_TIMEOUT: "-1" }), vec![GATE], "InvalidAnnotation", "whole number"),
            (
                json!({ LOCK: "db", "zklock.io/acquire-timeout": "5" }),
                vec![GATE],
                "InvalidAnnotation",
                "unknown annotation",
            ),
            (json!({ LOCK: "db", SKIP_IF_HELD: "true" }), vec![GATE], "InvalidAnnotation", "Succeeded"),
            (
                json!({ LOCK: "db", SKIP_IF_HELD: "Failed", ACQUIRE_TIMEOUT: "5" }),
                vec![GATE],
                "InvalidAnnotation",
                "give one",
            ),
            (json!({ LOCK: "a,b", SUPERSEDE_GROUP: "g" }), vec![GATE], "InvalidAnnotation", "goes with one lock"),
            (json!({ LOCK: "db", SUPERSEDE_GROUP: "Prod" }), vec![GATE], "InvalidAnnotation", "supersede group"),
            (
                json!({ LOCK: "db", SKIP_IF_HELD: "Succeeded", SUPERSEDE_GROUP: "prod" }),
                vec![GATE],
                "InvalidAnnotation",
                "never waits",
            ),
        ] {
            let p = pod(annotations.clone(), &gates, None);
            let plan = plan_of(&p);
            assert_eq!(plan.step, Step::Nothing, "{annotations}");
            let report = plan.report.unwrap_or_else(|| panic!("{annotations}: no report"));
            assert_eq!((report.reason, report.warning, report.acquired), (reason, true, false), "{annotations}");
            assert!(report.message.contains(needle), "{annotations}: {}", report.message);
        }
        assert_eq!(plan_of(&pod(json!({}), &[], None)), PodPlan::nothing(), "not a gated pod at all");
        assert_eq!(plan_of(&pod(json!({}), &["example.com/other"], None)), PodPlan::nothing(), "somebody else's gate");
    }

    #[test]
    fn the_gate_goes_when_the_claim_is_held_and_the_operator_knows_it() {
        let p = gated(json!({ LOCK: "db" }));
        let held = claim_of(&p, Some(Phase::Held));
        let stale = plan(&p, Some(&held), Known::default());
        assert_eq!(stale.step, Step::Nothing, "a Held copy the operator has not written (or has since changed)");
        let go = plan(&p, Some(&held), JUDGED);
        assert_eq!(go.step, Step::Ungate { index: 1 }, "only zklock's gate, at its index");
        let report = go.report.unwrap();
        assert!(report.acquired && report.message.contains("fencing token 42"), "{report:?}");
        let ungated = pod(json!({ LOCK: "db" }), &["example.com/other"], None);
        assert_eq!(plan(&ungated, Some(&held), JUDGED).step, Step::Nothing, "gate gone: only the condition");
        let waiting = plan(&p, Some(&claim_of(&p, Some(Phase::Waiting))), Known::default());
        assert_eq!((waiting.step, waiting.report.unwrap().reason), (Step::Nothing, "Waiting"));
    }

    /// A Held whose claim is as `edit` leaves it.
    fn held_as(p: &KeptPod, edit: impl FnOnce(&mut LockClaim)) -> KeptClaim {
        let mut claim = claim_of(p, Some(Phase::Held)).to_claim();
        edit(&mut claim);
        claim.into()
    }

    #[test]
    fn a_pod_starts_only_under_a_held_this_term_judged_and_nobody_takes_back() {
        let p = gated(json!({ LOCK: "db" }));
        let mine = claim_of(&p, Some(Phase::Held));
        assert_eq!(plan(&p, Some(&mine), JUDGED).step, Step::Ungate { index: 1 });
        // An earlier leader's grant, before this term wrote the claim, or with a re-anchoring
        // verdict pending, or while a pass judges its locks: it may still end Lost.
        let unjudged = plan(&p, Some(&mine), Known { judged: false, ..JUDGED });
        assert_eq!((unjudged.step, unjudged.report.unwrap().reason), (Step::Recheck, "Waiting"));
        let earlier = held_as(&p, |c| c.status.as_mut().unwrap().leader_epoch = Some(6));
        assert_eq!(plan(&p, Some(&earlier), JUDGED).step, Step::Recheck, "the copy must carry this term's write");
        assert_eq!(
            plan(&p, Some(&earlier), Known { epoch: None, ..JUDGED }).step,
            Step::Ungate { index: 1 },
            "without leader election there is no epoch to carry"
        );
        // Asked to let go (in the znode, by another client, or by the annotation): not started.
        let asked = held_as(&p, |c| {
            let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            let conditions = &mut c.status.as_mut().unwrap().conditions;
            crate::api::conditions::set(conditions, REVOKE_REQUESTED, true, "RevokeRequested", "drain", None, &at);
        });
        assert_eq!(plan(&p, Some(&asked), JUDGED).step, Step::Recheck, "revoke requested");
        let annotated = held_as(&p, |c| {
            c.metadata.annotations = Some([(REVOKE_ANNOTATION.to_string(), "drain".to_string())].into());
        });
        assert_eq!(plan(&p, Some(&annotated), JUDGED).step, Step::Recheck, "revocation annotated");
        // A pod that runs already is left alone, whatever this term knows.
        let ran = pod(json!({ LOCK: "db" }), &[], Some(("True", "Acquired")));
        let shown = plan(&ran, Some(&earlier), Known { judged: false, ..JUDGED });
        assert_eq!((shown.step, shown.report.unwrap().reason), (Step::Nothing, "Acquired"));
    }

    #[test]
    fn a_claim_that_ends_before_the_grant_keeps_the_pod_gated_and_says_why() {
        let p = gated(json!({ LOCK: "db" }));
        for phase in [Phase::Expired, Phase::Revoked, Phase::Invalid, Phase::Lost, Phase::Released] {
            let plan = plan(&p, Some(&claim_of(&p, Some(phase))), Known::default());
            assert_eq!(plan.step, Step::Nothing, "{phase:?}: not ungated");
            let report = plan.report.unwrap();
            assert!(report.warning && report.message.contains(&format!("ended {phase:?}")), "{report:?}");
        }
        let ran = pod(json!({ LOCK: "db" }), &[], Some(("True", "Acquired")));
        assert_eq!(plan(&ran, Some(&claim_of(&ran, Some(Phase::Released))), Known::default()), PodPlan::nothing());
        assert_eq!(plan(&ran, None, Known::default()), PodPlan::nothing(), "claim deleted after the pod ran");
    }

    #[test]
    fn a_pod_that_asked_not_to_wait_or_was_superseded_is_ended_never_started() {
        let skip = gated(json!({ LOCK: "db", SKIP_IF_HELD: "Failed" }));
        let Step::Create { claim, .. } = plan_of(&skip).step else { panic!("a claim is made") };
        assert_eq!(claim.spec.acquire_timeout_seconds, Some(0), "skip if held: try once");
        let kept = claim.metadata.annotations.as_ref().and_then(|a| a.get(SKIP_IF_HELD));
        assert_eq!(kept.map(String::as_str), Some("Failed"), "the phase to end in, kept with the claim");
        let ended = plan(&skip, Some(&claim_of(&skip, Some(Phase::Expired))), Known::default());
        let Step::End { phase, reason, message } = ended.step else { panic!("{ended:?}") };
        assert_eq!((phase, reason), ("Failed", "LockHeld"));
        assert!(message.contains("ended Expired") && message.contains("ends Failed"), "{message}");

        let deploy = gated(json!({ LOCK: "db", SUPERSEDE_GROUP: "prod" }));
        let Step::Create { claim, .. } = plan_of(&deploy).step else { panic!("a claim is made") };
        assert_eq!(claim.spec.supersede.map(|s| s.group).as_deref(), Some("prod"));
        let ended = plan(&deploy, Some(&claim_of(&deploy, Some(Phase::Superseded))), Known::default());
        assert!(
            matches!(ended.step, Step::End { phase: "Succeeded", reason: "Superseded", .. }),
            "superseded counts as done (a failed pod's replacement would supersede the newest): {ended:?}"
        );
        // Without skip if held an expired claim leaves the pod gated, as before; a pod that ran
        // (no gate) is never ended.
        let plain = gated(json!({ LOCK: "db" }));
        assert_eq!(plan(&plain, Some(&claim_of(&plain, Some(Phase::Expired))), Known::default()).step, Step::Nothing);
        let ran = pod(json!({ LOCK: "db", SKIP_IF_HELD: "Failed" }), &[], None);
        assert_eq!(plan(&ran, Some(&claim_of(&ran, Some(Phase::Expired))), Known::default()).step, Step::Nothing);
        // The claim is the record: the pod's annotation changed since does not change the end.
        let mut edited = skip.clone();
        edited.metadata.annotations.as_mut().unwrap().insert(SKIP_IF_HELD.into(), "Succeeded".into());
        let ended = plan(&edited, Some(&claim_of(&skip, Some(Phase::Expired))), Known::default());
        assert!(matches!(ended.step, Step::End { phase: "Failed", .. }), "{ended:?}");
    }

    #[test]
    fn a_claim_of_the_same_name_not_made_for_this_pod_is_replaced_or_reported() {
        let p = gated(json!({ LOCK: "db" }));
        let mut earlier = claim_of(&p, Some(Phase::Released));
        earlier.metadata.owner_references.as_mut().unwrap()[0].uid = "pod-0".into();
        assert_eq!(plan(&p, Some(&earlier), Known::default()).step, Step::DeleteStale { uid: "claim-1".into() });
        let mut users = claim_of(&p, Some(Phase::Held));
        users.metadata.owner_references = None;
        let report = plan(&p, Some(&users), JUDGED).report.unwrap();
        assert_eq!((report.reason, report.warning), ("ClaimNameTaken", true));
        // Owned by a pod of another name: not a gated pod's claim, never deleted.
        let mut other_pods = claim_of(&p, Some(Phase::Held));
        let owner = &mut other_pods.metadata.owner_references.as_mut().unwrap()[0];
        (owner.name, owner.uid) = ("somebody-else".into(), "pod-9".into());
        let report = plan(&p, Some(&other_pods), JUDGED).report.unwrap();
        assert_eq!(report.reason, "ClaimNameTaken");
        // A pod that asks for no lock deletes nobody's claim, whatever its owner.
        let plain = pod(json!({}), &[], None);
        assert_eq!(plan(&plain, Some(&earlier), Known::default()), PodPlan::nothing());
    }

    #[test]
    fn finished_or_deleted_pods_are_left_alone() {
        let mut p = gated(json!({ LOCK: "db" }));
        p.phase = Some("Failed".into());
        assert_eq!(plan_of(&p), PodPlan::nothing());
        let mut p = gated(json!({ LOCK: "db" }));
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(plan_of(&p), PodPlan::nothing());
    }

    #[test]
    fn a_condition_already_shown_is_not_written_again() {
        let p = gated(json!({ LOCK: "db" }));
        let report = plan_of(&p).report.unwrap();
        let mut shown = PodCondition { type_: CONDITION.into(), status: "False".into(), ..Default::default() };
        shown.reason = Some("Waiting".into());
        shown.message = Some(report.message.clone());
        assert!(report.is_shown_by(Some(&shown)));
        shown.status = "True".into();
        assert!(!report.is_shown_by(Some(&shown)));
        assert!(!report.is_shown_by(None));
    }
}
