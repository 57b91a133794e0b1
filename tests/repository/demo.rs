//! The README's first command, `scripts/demo.sh`, run as the README shows it, end to end: its
//! own ZooKeeper, its own control plane (scripts/k8s.sh, built once and cached by the test
//! command before), the operator, the shared-locks example and two jobs handing one lock on;
//! then `scripts/demo.sh down`, which must leave nothing running. The only differences from a
//! user's run: the state lives in a directory of the test's own (`ZKLOCK_DEMO_STATE`), and the
//! binary the tests built is used instead of a release build (`ZKLOCK_DEMO_BINARY`: a build
//! inside a test would wait for the lock on the build directory that `cargo test` holds).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The demo builds nothing here; starting the control plane (cached) and the operator, and the
/// two jobs' 5 s of work, take well under a minute on two idle cores.
const DEMO_LIMIT: Duration = Duration::from_secs(300);
const DOWN_LIMIT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README's first ```sh block after the text `after`.
fn readme_command(after: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let start = readme.find(after).unwrap_or_else(|| panic!("README.md has no {after:?}"));
    let rest = &readme[start..];
    let open = rest.find("```sh\n").expect("a ```sh block after it") + 6;
    let close = rest[open..].find("\n```").expect("closed") + open;
    rest[open..close].trim().to_string()
}

/// Stops what the demo started when the test ends, also when it fails (`down` has its own
/// deadlines: each process is asked to stop, then killed).
struct Down {
    env: Vec<(&'static str, String)>,
    state: PathBuf,
    log: PathBuf,
    done: bool,
}

impl Drop for Down {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::process::Command::new("timeout")
                .args(["60", "bash", "scripts/demo.sh", "down"])
                .current_dir(root())
                .envs(self.env.iter().cloned())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.state);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Runs `command` with bash from the repository's root, at most `limit`: its status and output.
async fn run(command: &str, env: &[(&'static str, String)], log: &Path, limit: Duration) -> (bool, String) {
    let file = std::fs::File::create(log).expect("log file");
    let mut child = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", command])
        .current_dir(root())
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        // A group of its own, so that a deadline ends what it started too, not bash alone.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("run bash");
    let status = tokio::time::timeout(limit, child.wait()).await;
    let printed = std::fs::read_to_string(log).unwrap_or_default();
    match status {
        Ok(status) => (status.expect("wait for bash").success(), printed),
        Err(_) => {
            if let Some(group) = child.id() {
                let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).status();
            }
            panic!("`{command}` did not finish within {limit:?}; it printed:\n{printed}")
        }
    }
}

/// Whether process `pid` runs (a zombie, ended but not reaped, does not).
fn alive(pid: &str) -> bool {
    let stat = std::fs::read_to_string(Path::new("/proc").join(pid.trim()).join("stat")).unwrap_or_default();
    // `pid (name) state …`: the state follows the name's closing parenthesis.
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
}

/// The fencing token the demo printed for `job`'s grant.
fn token_of(printed: &str, job: &str) -> u64 {
    let prefix = format!("{job}: Held (fencing token ");
    let line = printed.lines().find(|l| l.contains(&prefix)).unwrap_or_else(|| panic!("no {prefix:?} in:\n{printed}"));
    let after = &line[line.find(&prefix).map_or(0, |i| i + prefix.len())..];
    let token = after.split(')').next().unwrap_or_default();
    token.parse().unwrap_or_else(|_| panic!("{job}'s token is not a number: {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_demo_runs_as_written_and_down_stops_all_it_started() {
    let command = readme_command("Run the demo");
    assert_eq!(command, "scripts/demo.sh", "the README's demo command (this test runs it as written)");
    let state = std::env::temp_dir().join(format!("zklock-demo-{}", uuid::Uuid::new_v4().simple()));
    let binary = std::env::var("ZKLOCK_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zklock").into());
    let env: Vec<(&'static str, String)> = vec![
        ("ZKLOCK_DEMO_STATE", state.display().to_string()),
        ("ZKLOCK_DEMO_BINARY", binary),
        // The control plane the demo starts stops with this test's process, should it be killed.
        ("ZKLOCK_K8S_WATCH_PID", std::process::id().to_string()),
    ];
    let log = std::env::temp_dir().join(format!("zklock-demo-{}.log", uuid::Uuid::new_v4().simple()));
    let mut down = Down { env: env.clone(), state: state.clone(), log: log.clone(), done: false };

    let (ok, printed) = run(&command, &env, &log, DEMO_LIMIT).await;
    eprintln!("{printed}");
    assert!(ok, "`{command}` failed; it printed:\n{printed}");
    for promised in [
        "operator ready",
        "two readers hold 'sales-tables' together; the writer waits",
        "job-a: done; deleting its claim releases the lock",
        "job-b: done; deleting its claim releases the lock",
        "all done",
    ] {
        assert!(printed.contains(promised), "the demo did not say {promised:?}:\n{printed}");
    }
    let (a, b) = (token_of(&printed, "job-a"), token_of(&printed, "job-b"));
    assert!(b > a, "job-b was granted after job-a, with a greater fencing token: {a} then {b}");
    let order = |what: &str| printed.find(what).unwrap_or(usize::MAX);
    assert!(order("job-a: done") < order("job-b: Held"), "job-b held the lock only after job-a let go:\n{printed}");

    let operator = std::fs::read_to_string(state.join("operator.pid")).expect("the demo's operator pid file");
    let zookeeper = printed
        .lines()
        .find_map(|l| l.split(" standalone at ").nth(1))
        .map(|address| address.trim().to_string())
        .unwrap_or_else(|| panic!("the demo says where its ZooKeeper listens:\n{printed}"));
    let planes = std::fs::read_to_string(state.join("k8s/pids")).unwrap_or_default();
    assert!(alive(&operator), "the demo leaves the operator running for the user to try things");

    let (ok, stopped) = run("scripts/demo.sh down", &env, &log, DOWN_LIMIT).await;
    down.done = ok;
    assert!(ok, "`scripts/demo.sh down` failed:\n{stopped}");
    for promised in ["stopped the control plane", "stopped operator", "stopped zookeeper"] {
        assert!(stopped.contains(promised), "`down` did not say {promised:?}:\n{stopped}");
    }
    assert!(!state.exists(), "`down` removes the demo's state");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let left = || {
        std::iter::once(operator.as_str())
            .chain(planes.lines().filter_map(|line| line.split_whitespace().next()))
            .filter(|pid| alive(pid))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // `down` asks each process to stop; ZooKeeper's JVM takes a moment to let its port go.
    while !left().is_empty() || tokio::net::TcpStream::connect(&zookeeper).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "30 s after `down`, processes the demo started still run ({:?}) or its ZooKeeper still listens on {zookeeper}",
            left()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
