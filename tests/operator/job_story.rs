//! A user's story, as a user runs it, on a real control plane: two Jobs made from
//! `examples/manifests/job-gated.yaml` (their pod templates carry the `zklock.io/lock`
//! annotation and scheduling gate). The job controller makes the pods, the operator claims the
//! lock for each, the scheduler binds the ungated pod to the kwok node, kwok runs it to
//! completion, the Job completes, and only then is the second Job's pod ungated. The waits are
//! `kubectl wait --for=condition=complete`, as users write them.
//!
//! It needs the job controller, the scheduler and a node: the project's control plane
//! (`scripts/k8s.sh`) or a real cluster (`ZKLOCK_TEST_KUBECONFIG`), never kube-sandbox.

use crate::e2e_support;

use e2e_support::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::Value;
use zklock::api::Phase;

fn job(name: &str) -> Job {
    example_job("job-gated.yaml", name)
}

/// The Job of `examples/manifests/<file>`, named `name`.
fn example_job(file: &str, name: &str) -> Job {
    let path = format!("{}/examples/manifests/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut job: Value = serde_yaml::from_str(&text).unwrap();
    job["metadata"]["name"] = name.into();
    serde_json::from_value(job).unwrap()
}

/// The one pod of Job `name`, once the job controller has made it.
async fn pod_of(pods: &Api<Pod>, name: &str) -> Pod {
    let selector = format!("batch.kubernetes.io/job-name={name}");
    let made = async {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
        loop {
            tick.tick().await;
            if let Some(pod) = pods.list(&ListParams::default().labels(&selector)).await.unwrap().items.pop() {
                return pod;
            }
        }
    };
    tokio::time::timeout(PATIENCE, made).await.unwrap_or_else(|_| panic!("no pod of Job {name} in {PATIENCE:?}"))
}

/// The pod's `zklock.io/Skipped` condition, as (status, reason), and whether a node ran it.
fn skipped(pod: &Pod) -> (Option<(String, String)>, Option<String>) {
    let status = pod.status.as_ref();
    let condition = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "zklock.io/Skipped")
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()));
    (condition, pod.spec.as_ref().and_then(|s| s.node_name.clone()))
}

/// The examples `job-skip-if-held.yaml` and `job-newest-wins.yaml` as a user runs them: a Job
/// whose lock is held is skipped (its pod ended Succeeded, never started, the Job complete);
/// of two deploy Jobs waiting behind a holder the older is superseded (complete, never started)
/// and the newer runs once the holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_skips_a_held_lock_and_only_the_newest_waiting_deploy_runs() {
    let env = Env::new().await;
    let _op = env.operator();
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let create = |job: Job| {
        let jobs = jobs.clone();
        async move { jobs.create(&PostParams::default(), &job).await.expect("create the Job") }
    };

    env.claim("report-holder", "nightly-report", serde_json::json!({})).await;
    env.wait_phase("report-holder", Phase::Held).await;
    create(example_job("job-skip-if-held.yaml", "nightly-report")).await;
    env.kubectl(&["wait", "--for=condition=complete", "job/nightly-report", "--timeout=120s"]);
    let pod = pod_of(&pods, "nightly-report").await;
    let pod = pods.get(&pod.name_any()).await.unwrap();
    assert_eq!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded"));
    assert_eq!(skipped(&pod), (Some(("True".into(), "LockHeld".into())), None), "ended, never started");
    let claim = env.wait_phase(&pod.name_any(), Phase::Expired).await;
    assert_eq!(claim.spec.acquire_timeout_seconds, Some(0), "skip if held: the claim tries once");

    env.claim("deploy-holder", "deploy-production", serde_json::json!({})).await;
    env.wait_phase("deploy-holder", Phase::Held).await;
    create(example_job("job-newest-wins.yaml", "deploy-1")).await;
    let first = pod_of(&pods, "deploy-1").await.name_any();
    env.wait_phase(&first, Phase::Waiting).await;
    create(example_job("job-newest-wins.yaml", "deploy-2")).await;
    let second = pod_of(&pods, "deploy-2").await.name_any();
    env.kubectl(&["wait", "--for=condition=complete", "job/deploy-1", "--timeout=120s"]);
    let claim = env.wait_phase(&first, Phase::Superseded).await;
    assert!(condition(&claim, "Finished").is_some_and(|c| c.2.contains(&second)), "{:?}", claim.status);
    let pod = pods.get(&first).await.unwrap();
    assert_eq!(skipped(&pod), (Some(("True".into(), "Superseded".into())), None), "ended, never started");
    assert_eq!(env.status(&second).await, Some(Phase::Waiting), "the newest waits behind the holder");
    env.delete_claim("deploy-holder").await;
    env.kubectl(&["wait", "--for=condition=complete", "job/deploy-2", "--timeout=120s"]);
    let pod = pods.get(&second).await.unwrap();
    assert_eq!(skipped(&pod), (None, Some("kwok-node-0".into())), "the newest ran on the node");
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gated_jobs_run_one_after_the_other() {
    let env = Env::new().await;
    let _op = env.operator();
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    for name in ["first", "second"] {
        jobs.create(&PostParams::default(), &job(name)).await.unwrap_or_else(|e| panic!("create Job {name}: {e}"));
        // Pods queue in the order they are made, and the job controller syncs new Jobs on
        // several workers at once: the second Job is made once the first's pod exists, so that
        // "first" is first for the operator too.
        pod_of(&pods, name).await;
    }
    env.kubectl(&["wait", "--for=condition=complete", "job/first", "--timeout=120s"]);
    env.kubectl(&["wait", "--for=condition=complete", "job/second", "--timeout=120s"]);

    // Each Job's pod was claimed for, ran on the kwok node, and its claim was released when it
    // finished; the second was granted only after the first's ended (the history says so).
    let mut by_job = vec![];
    for name in ["first", "second"] {
        let selector = format!("batch.kubernetes.io/job-name={name}");
        let listed = pods.list(&ListParams::default().labels(&selector)).await.unwrap();
        assert_eq!(listed.items.len(), 1, "one pod of Job {name}");
        let pod = &listed.items[0];
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        assert_eq!(node.as_deref(), Some("kwok-node-0"), "the scheduler placed {}", pod.name_any());
        let claim = env.wait(&pod.name_any(), "released", |c| phase_of(c) == Some(Phase::Released)).await;
        assert!(condition(&claim, "Finished").is_some_and(|c| c.1 == "HolderGone"), "{:?}", claim.status);
        by_job.push(pod.name_any());
    }
    assert_eq!(env.history.grants("db-migrations"), by_job, "granted in the order the Jobs were made");
    env.history.check();
}
