//! End to end, `zklock acquire` and `zklock exec`: the real binary as operator and as client
//! (through KUBECONFIG, the claim API only), a real ZooKeeper, the Kubernetes API under test.

use crate::e2e_support;

use std::process::{Output, Stdio};
use std::time::Duration;

use e2e_support::*;
use kube::ResourceExt;
use serde_json::json;
use tokio::process::{Child, Command};
use zklock::api::Phase;

pub(crate) fn zklock(env: &Env, args: &[&str]) -> Command {
    // `ZKLOCK_TEST_BINARY`: another build, e.g. the one before a fix, to see a test fail without it.
    let binary = std::env::var("ZKLOCK_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zklock").into());
    let mut cmd = Command::new(binary);
    // The namespace right after the subcommand: after `--` it would be the command's.
    cmd.arg(args[0])
        .args(["-n", &env.ns])
        .args(&args[1..])
        .env("KUBECONFIG", zklock_testkit::kube::kubeconfig())
        .env_remove("POD_NAME")
        .env_remove("POD_UID")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

pub(crate) async fn finish(child: Child, what: &str) -> Output {
    match tokio::time::timeout(PATIENCE, child.wait_with_output()).await {
        Ok(out) => out.expect("wait for zklock"),
        Err(_) => panic!("{what} did not end within {PATIENCE:?}"),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until a file exists with content; returns it.
async fn read_when_written(path: &std::path::Path) -> String {
    let written = async {
        loop {
            match std::fs::read_to_string(path) {
                Ok(s) if s.ends_with('\n') => return s,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    tokio::time::timeout(PATIENCE, written).await.unwrap_or_else(|_| panic!("{} was never written", path.display()))
}

/// The only claim of `lock` in the namespace.
async fn claim_of(env: &Env, lock: &str) -> String {
    let found = async {
        loop {
            let list = env.claims.list(&Default::default()).await.expect("list claims");
            if let Some(c) = list.items.iter().find(|c| c.spec.names_lock(lock)) {
                return c.name_any();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, found).await.expect("a claim for the lock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_prints_the_claim_and_token_waits_in_line_and_times_out() {
    let env = Env::new().await;
    let _op = env.operator();
    let env_file = tempdir(&env).join("lock.env");
    let args = ["acquire", "deploy", "--env-file", env_file.to_str().unwrap()];
    let first = finish(zklock(&env, &args).spawn().unwrap(), "the first acquire").await;
    assert!(first.status.success(), "{}", text(&first.stderr));
    let out = text(&first.stdout);
    assert_eq!(std::fs::read_to_string(&env_file).unwrap(), out, "--env-file holds what is printed");
    let claim = out.lines().find_map(|l| l.strip_prefix("ZKLOCK_CLAIM=")).expect("the claim's name").to_string();
    let token = out.lines().find_map(|l| l.strip_prefix("ZKLOCK_FENCING_TOKEN=")).expect("the token").to_string();
    let held = env.wait_phase(&claim, Phase::Held).await;
    assert_eq!(held.status.unwrap().fencing_token.as_deref(), Some(token.as_str()));

    // Busy: shows where it waits (and, every heartbeat, how long it has and how long the claim
    // ahead has held), then gives up with the timeout code and takes its claim along.
    let timed = ["acquire", "deploy", "--timeout", "6s", "--heartbeat", "2s"];
    let busy = finish(zklock(&env, &timed).spawn().unwrap(), "a timed acquire").await;
    let err = text(&busy.stderr);
    assert_eq!(busy.status.code(), Some(75), "{err}");
    assert!(err.contains("1 ahead, behind ") && err.contains(&claim), "{err}");
    let beat = format!("still waiting after 2s: Waiting, 1 ahead, behind {claim} (Held for ");
    assert!(err.contains(&beat), "the heartbeat {beat:?}: {err}");
    // A waiter that gets the lock once the holder goes.
    let waiter = zklock(&env, &["acquire", "deploy", "--name", "second"]).spawn().unwrap();
    env.wait_phase("second", Phase::Waiting).await;
    env.delete_claim(&claim).await;
    let second = finish(waiter, "the waiting acquire").await;
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(text(&second.stdout).contains("ZKLOCK_CLAIM=second\n"));
    // Stopped while waiting: the SIGTERM code, and the claim is withdrawn.
    let stopped = zklock(&env, &["acquire", "deploy", "--name", "third"]).spawn().unwrap();
    env.wait_phase("third", Phase::Waiting).await;
    std::process::Command::new("kill").args(["-TERM", &stopped.id().unwrap().to_string()]).status().unwrap();
    let out = finish(stopped, "a stopped acquire").await;
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    env.wait_gone("third").await;
    let remaining: Vec<String> =
        env.claims.list(&Default::default()).await.unwrap().iter().map(|c| c.name_any()).collect();
    assert_eq!(remaining, ["second"], "the timed-out claim was deleted");
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_from_an_init_container_leaves_a_claim_its_pod_owns() {
    let env = Env::new().await;
    let _op = env.operator();
    let pod = env.pod("migrate-x7k2p").await;
    let uid = pod.uid().expect("a created pod has a UID");
    // As the example's init container runs it: POD_NAME and POD_UID from the downward API.
    let mut init = zklock(&env, &["acquire", "db", "--name", "init"]);
    init.env("POD_NAME", "migrate-x7k2p").env("POD_UID", &uid);
    let out = finish(init.spawn().unwrap(), "the init container's acquire").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let claim = env.wait_phase("init", Phase::Held).await;
    let owners = claim.metadata.owner_references.expect("the claim is owned by its pod");
    assert_eq!(
        owners.iter().map(|o| (o.kind.as_str(), o.name.as_str(), o.uid.as_str())).collect::<Vec<_>>(),
        [("Pod", "migrate-x7k2p", uid.as_str())]
    );
    assert_eq!(claim.spec.holder.map(|h| h.pod_name).as_deref(), Some("migrate-x7k2p"));
    // The pod goes: the lock is released and the garbage collector takes the claim along.
    env.pods.delete("migrate-x7k2p", &Default::default()).await.unwrap();
    // (Whether the claim shows Released before it goes is a race between the operator's status
    // write and the garbage collector's deletion, which the operator does not write over: a
    // deleted claim gets no final status. What matters is that the lock is free.)
    env.history.await_gone("init").await;
    let next = finish(
        zklock(&env, &["acquire", "db", "--name", "next", "--timeout", "30s"]).spawn().unwrap(),
        "an acquire after the pod went",
    )
    .await;
    assert!(next.status.success(), "the lock was left held: {}", text(&next.stderr));
    env.delete_claim("next").await;
    // The history has everything before the deletion once it has the deletion.
    env.history.await_gone("next").await;
    assert_eq!(env.history.grants("db"), vec!["init", "next"]);
    env.history.check();
    // A UID without the pod's name is refused before anything is made.
    let bad = finish(zklock(&env, &["acquire", "db", "--holder-pod-uid", &uid]).spawn().unwrap(), "acquire").await;
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("--holder-pod"), "{}", text(&bad.stderr));
    assert!(env.claims.list(&Default::default()).await.unwrap().items.is_empty());
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_the_command_with_its_token_and_exits_with_its_status() {
    let env = Env::new().await;
    let _op = env.operator();
    let dir = tempdir(&env);
    let seen = dir.join("seen");
    let script = format!("echo \"$ZKLOCK_CLAIM $ZKLOCK_FENCING_TOKEN $ZKLOCK_LOCK\" > {}; exit 3", seen.display());
    let out = finish(zklock(&env, &["exec", "ci", "--", "sh", "-c", &script]).spawn().unwrap(), "exec").await;
    assert_eq!(out.status.code(), Some(3), "the command's status: {}", text(&out.stderr));
    let seen = std::fs::read_to_string(&seen).expect("the command ran");
    let parts: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!((parts.len(), parts[2]), (3, "ci"), "{seen}");
    // exec deletes its claim as it ends: once the history has that, it has the grant before it.
    env.history.await_gone(parts[0]).await;
    let token = env.history.records().into_iter().filter(|r| r.name == parts[0]).find_map(|r| r.fencing);
    assert_eq!(token.as_deref(), Some(parts[1]), "the command saw its claim's fencing token");

    let missing = finish(zklock(&env, &["exec", "ci", "--", "/no/such/command"]).spawn().unwrap(), "exec").await;
    assert_eq!(missing.status.code(), Some(127));
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stops_the_command_on_revocation_and_when_the_lock_is_lost() {
    let env = Env::new().await;
    let _op = env.operator();
    let dir = tempdir(&env);
    // A command that stops on SIGTERM (and says when its trap is set: a signal before that
    // would end the shell without running the trap).
    let (got, ready) = (dir.join("got-term"), dir.join("ready"));
    let polite = format!(
        "trap 'echo term > {}; exit 0' TERM; echo > {}; while true; do sleep 0.1; done",
        got.display(),
        ready.display()
    );
    let child = zklock(&env, &["exec", "maint", "--", "sh", "-c", &polite]).spawn().unwrap();
    let claim = claim_of(&env, "maint").await;
    env.wait_phase(&claim, Phase::Held).await;
    read_when_written(&ready).await;
    env.annotate(&claim, "zklock.io/revoke", "maintenance window").await;
    assert_eq!(read_when_written(&got).await, "term\n");
    let out = finish(child, "a revoked exec").await;
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    env.history.await_gone(&claim).await;

    // A command that ignores SIGTERM is killed before the grace period ends.
    std::fs::remove_file(&ready).unwrap();
    let stubborn = format!("trap '' TERM; echo > {}; while true; do sleep 0.1; done", ready.display());
    let started = std::time::Instant::now();
    let args = ["exec", "maint", "--revocation-grace-period", "3s", "--", "sh", "-c", &stubborn];
    let child = zklock(&env, &args).spawn().unwrap();
    let claim = claim_of(&env, "maint").await;
    env.wait_phase(&claim, Phase::Held).await;
    read_when_written(&ready).await;
    env.annotate(&claim, "zklock.io/revoke", "now").await;
    let out = finish(child, "a revoked exec whose command ignores SIGTERM").await;
    assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("SIGKILL"), "{}", text(&out.stderr));
    assert!(started.elapsed() < PATIENCE);
    env.history.await_gone(&claim).await;

    // The claim deleted under a running command: the lock is lost.
    std::fs::remove_file(&ready).unwrap();
    let child = zklock(&env, &["exec", "maint", "--", "sh", "-c", &polite]).spawn().unwrap();
    let claim = claim_of(&env, "maint").await;
    env.wait_phase(&claim, Phase::Held).await;
    read_when_written(&ready).await;
    std::fs::remove_file(&got).unwrap();
    env.delete_claim(&claim).await;
    assert_eq!(read_when_written(&got).await, "term\n");
    let out = finish(child, "an exec whose claim was deleted").await;
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    env.history.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_passes_signals_on_and_releases_the_lock() {
    let env = Env::new().await;
    let _op = env.operator();
    let dir = tempdir(&env);
    let (got, ready) = (dir.join("got"), dir.join("ready"));
    let script = format!(
        "trap 'echo hup >> {0}' HUP; trap 'echo term >> {0}; exit 7' TERM; echo > {1}; while true; do sleep 0.1; done",
        got.display(),
        ready.display()
    );
    let child = zklock(&env, &["exec", "jobs", "--", "sh", "-c", &script]).spawn().unwrap();
    let claim = claim_of(&env, "jobs").await;
    env.wait_phase(&claim, Phase::Held).await;
    // The command's traps are set (a signal before would end the shell without running them).
    read_when_written(&ready).await;
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert_eq!(read_when_written(&got).await, "hup\n");
    std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let out = finish(child, "a signalled exec").await;
    assert_eq!(out.status.code(), Some(7), "the command's own status: {}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "hup\nterm\n");
    env.history.await_gone(&claim).await;
    // Released: the next one gets the lock at once.
    env.claim("next", "jobs", json!({})).await;
    env.wait_phase("next", Phase::Held).await;
    env.history.check();
}

fn tempdir(env: &Env) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("zklock-commands-{}", env.ns));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A signal that arrives while the claim's create is on its way: the create may still land,
/// and the claim must not be left holding with nobody to release it. The proxy holds the create
/// back until after the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_the_claim_is_created_withdraws_it() {
    use zklock_testkit::api_proxy::{ApiProxy, Matcher};
    let env = Env::new().await;
    let _op = env.operator();
    let proxy = ApiProxy::start(zklock_testkit::kube::kubeconfig()).await;
    let path = format!("/namespaces/{}/lockclaims", env.ns);
    let create = proxy.hold_next(Matcher { method: "POST", path_contains: path, status: None });
    let mut cmd = zklock(&env, &["acquire", "interrupted"]);
    cmd.env("KUBECONFIG", proxy.kubeconfig(&tempdir(&env)));
    let child = cmd.spawn().unwrap();
    assert!(create.caught(PATIENCE).await, "acquire sent its create");
    std::process::Command::new("kill").args(["-TERM", &child.id().unwrap().to_string()]).status().unwrap();
    // The create lands after the signal.
    assert_eq!(create.deliver(PATIENCE).await, Some(201), "the held create made the claim");
    let out = finish(child, "an interrupted acquire").await;
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    // It was made (the history saw it) and withdrawn.
    let made = env.history.await_record("the claim acquire made", |r| r.lock == "interrupted").await;
    env.history.await_gone(&made.name).await;
    env.history.check();
}

/// Held, but nobody can learn it (stdout closed): the lock is let go, not held blind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_its_stdout_closed_releases_the_lock() {
    let env = Env::new().await;
    let _op = env.operator();
    let mut child = zklock(&env, &["acquire", "unread"]).spawn().unwrap();
    drop(child.stdout.take());
    let out = finish(child, "acquire with a closed stdout").await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("releasing the lock"), "{}", text(&out.stderr));
    let claim = env.history.await_record("the claim acquire made", |r| r.lock == "unread").await;
    env.history.await_gone(&claim.name).await;
    env.history.check();
}

/// `zklock exec a,b`: one claim over both locks; the command runs once both are held, with each
/// lock's fencing token of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_two_locks_gives_the_command_a_token_per_lock() {
    let env = Env::new().await;
    let _op = env.operator();
    let dir = tempdir(&env);
    let seen = dir.join("seen");
    let script = format!(
        "echo \"$ZKLOCK_CLAIM $ZKLOCK_LOCK $ZKLOCK_FENCING_TOKEN_DB $ZKLOCK_FENCING_TOKEN_SEARCH_INDEX\" > {}",
        seen.display()
    );
    let out =
        finish(zklock(&env, &["exec", "db,search-index", "--", "sh", "-c", &script]).spawn().unwrap(), "exec").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = std::fs::read_to_string(&seen).expect("the command ran");
    let words: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(words.len(), 4, "{seen}");
    assert_eq!(words[1], "db,search-index");
    env.history.await_gone(words[0]).await;
    let token = |lock: &str| {
        env.history.records().into_iter().filter(|r| r.name == words[0] && r.lock == lock).find_map(|r| r.fencing)
    };
    assert_eq!(token("db").as_deref(), Some(words[2]), "the db lock's own token");
    assert_eq!(token("search-index").as_deref(), Some(words[3]), "the search-index lock's own token");
    env.history.check();
}

/// A claim `zklock acquire` makes carries the operator's finalizer from creation. In a namespace
/// no operator serves, a stopped acquire deleted its claim, which then stayed Terminating for
/// good (nothing removes the finalizer) and held up the namespace's deletion. The command now
/// takes the finalizer off a claim no operator ever wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_acquire_in_a_namespace_no_operator_serves_leaves_no_claim_behind() {
    let env = Env::new().await;
    let waiting = zklock(&env, &["acquire", "unserved", "--name", "alone"]).spawn().unwrap();
    env.wait("alone", "created", |_| true).await;
    std::process::Command::new("kill").args(["-TERM", &waiting.id().unwrap().to_string()]).status().unwrap();
    let out = finish(waiting, "a stopped acquire").await;
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    env.wait_gone("alone").await;
    assert!(text(&out.stderr).contains("no operator served"), "it says what it did: {}", text(&out.stderr));

    // Waiting for a status that does not come, the heartbeat says what to run.
    let mut waiting = zklock(&env, &["acquire", "unserved", "--name", "unheard", "--heartbeat", "1s"]).spawn().unwrap();
    let hint =
        format!("LockClaim {}/unheard has no status yet; `zklock check -n {}` says what zklock lacks", env.ns, env.ns);
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(waiting.stderr.take().unwrap()));
    let mut said = vec![];
    let heard = async {
        while let Ok(Some(line)) = lines.next_line().await {
            let found = line.contains(&hint);
            said.push(line);
            if found {
                return true;
            }
        }
        false
    };
    let heard = tokio::time::timeout(PATIENCE, heard).await;
    assert!(matches!(heard, Ok(true)), "the heartbeat {hint:?} within {PATIENCE:?}; it said {said:#?}");
    std::process::Command::new("kill").args(["-TERM", &waiting.id().unwrap().to_string()]).status().unwrap();
    let out = finish(waiting, "a stopped acquire").await;
    assert_eq!(out.status.code(), Some(143));
    env.wait_gone("unheard").await;
}
