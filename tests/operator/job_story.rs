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
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/manifests/job-gated.yaml")).unwrap();
    let mut job: Value = serde_yaml::from_str(&text).unwrap();
    job["metadata"]["name"] = name.into();
    serde_json::from_value(job).unwrap()
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
        let selector = format!("batch.kubernetes.io/job-name={name}");
        let made = async {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            loop {
                tick.tick().await;
                if !pods.list(&ListParams::default().labels(&selector)).await.unwrap().items.is_empty() {
                    return;
                }
            }
        };
        tokio::time::timeout(PATIENCE, made).await.unwrap_or_else(|_| panic!("no pod of Job {name} in {PATIENCE:?}"));
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
