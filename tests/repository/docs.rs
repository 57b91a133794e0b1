//! The docs, checked against what they describe:
//! - the shell blocks of `docs/getting-started.md` from its section 2 on (a claim taken and
//!   handed on, a gated Job run to completion, `zklock exec`), run verbatim with bash and the
//!   real kubectl against the test control plane, with the operator serving the namespaces
//!   they use (`shop`, `ci`). Sections 1 and 5 install and uninstall the chart with its bundled
//!   ZooKeeper, whose pods need nodes that run containers (kwok runs none); the chart's own
//!   `helm install` is `tests/chart/chart.rs`', and section 5's `kubectl delete lockclaims --all -A`
//!   would delete every other test's claims on a shared control plane;
//! - every test the docs name exists, and every relative link between the pages resolves.

use crate::e2e_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e_support::*;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::DeleteParams;
use kube::runtime::wait::await_condition;
use kube::Api;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The ```sh blocks of `text` between the headings that start with `from` and `to`.
fn shell_blocks(text: &str, from: &str, to: &str) -> Vec<String> {
    let start = text.find(from).unwrap_or_else(|| panic!("no heading {from:?}"));
    let end = text[start..].find(to).map_or(text.len(), |i| start + i);
    let mut blocks = vec![];
    let mut rest = &text[start..end];
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + 6..];
        let close = body.find("\n```").unwrap_or_else(|| panic!("unclosed ```sh block in {from:?}"));
        blocks.push(body[..close].to_string());
        rest = &body[close + 4..];
    }
    blocks
}

/// Runs `script` with bash (errors and unset variables fatal), at most `limit`; its output, or a
/// panic that shows the block and what it printed.
async fn run_block(script: &str, dir: &Path, env: &[(&str, String)], limit: Duration) -> String {
    let out = dir.join("block.out");
    let file = std::fs::File::create(&out).unwrap();
    let mut child = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("run bash");
    let status = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status.expect("wait for bash"),
        Err(_) => panic!("block did not finish within {limit:?}:\n{script}\n--- output:\n{}", read_file(&out)),
    };
    let printed = read_file(&out);
    assert!(status.success(), "block failed ({status}):\n{script}\n--- output:\n{printed}");
    printed
}

fn read_file(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getting_started_runs_as_written() {
    let env = Env::new().await;
    let namespaces: Vec<String> = ["shop", "ci"].iter().map(|s| s.to_string()).collect();
    if epoch_policy() {
        install_epoch_policy(&env.client, "zklock-leader-epoch-docs", &env.ns, &namespaces).await;
    }
    if finalizer_policy() {
        install_finalizer_policy(&env.client, "zklock-finalizer-docs", &namespaces).await;
    }
    // The operator as the chart runs it for these namespaces (its lease and epoch in the
    // test's own namespace, which it serves too).
    let op = Operator::start(&env, &["--watch-namespace", "shop", "--watch-namespace", "ci"]);

    // The page creates its namespaces: those of an earlier run on this cluster go first (the
    // operator finishes their claims).
    let api: Api<Namespace> = Api::all(env.client.clone());
    for ns in &namespaces {
        let Some(uid) = api.get_opt(ns).await.unwrap().and_then(|n| n.metadata.uid) else { continue };
        let _ = api.delete(ns, &DeleteParams::default()).await;
        let gone = await_condition(api.clone(), ns, kube::runtime::conditions::is_deleted(&uid));
        tokio::time::timeout(PATIENCE, gone)
            .await
            .unwrap_or_else(|_| panic!("namespace {ns} of an earlier run not gone within {PATIENCE:?}"))
            .expect("watch of the namespace");
    }

    // A clone's working directory as the page assumes it (its examples/ and charts/), with the
    // page's `./deploy.sh`, which shows that it ran under the lock with a fencing token.
    let dir = std::env::temp_dir().join(format!("zklock-docs-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    for linked in ["examples", "charts"] {
        std::os::unix::fs::symlink(root().join(linked), dir.join(linked)).unwrap();
    }
    let deploy = dir.join("deploy.sh");
    std::fs::write(&deploy, "#!/bin/sh\necho \"deployed $1 with fencing token $ZKLOCK_FENCING_TOKEN\" > deployed\n")
        .unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&deploy).status().unwrap();

    let kubectl = zklock_testkit::kube::kubectl();
    let zklock =
        PathBuf::from(std::env::var("ZKLOCK_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zklock").into()));
    let path = [kubectl.parent(), zklock.parent()]
        .into_iter()
        .flatten()
        .map(|p| p.display().to_string())
        .chain(std::env::var("PATH").ok())
        .collect::<Vec<_>>()
        .join(":");
    let vars = [("KUBECONFIG", env.kubeconfig.display().to_string()), ("PATH", path)];

    let page = read("docs/getting-started.md");
    let blocks = shell_blocks(&page, "## 2.", "## 5.");
    assert!(blocks.len() >= 5, "the page's shell blocks from section 2 on: {blocks:?}");
    for block in &blocks {
        let printed = run_block(block, &dir, &vars, Duration::from_secs(300)).await;
        eprintln!("$ {block}\n{printed}");
    }

    // What the page promises, as the API and the deploy script saw it.
    let deployed = read_file(&dir.join("deployed"));
    let token = deployed.trim().strip_prefix("deployed production with fencing token ");
    assert!(token.is_some_and(|t| t.parse::<u64>().is_ok()), "deploy.sh ran under the lock: {deployed:?}");
    let claims = Command::new(&kubectl)
        .args(["--kubeconfig", &env.kubeconfig.display().to_string(), "-n", "shop", "get", "lockclaims"])
        .args(["-o", "jsonpath={range .items[*]}{.metadata.name} {.status.phase}{\"\\n\"}{end}"])
        .output()
        .unwrap();
    let claims = String::from_utf8_lossy(&claims.stdout).into_owned();
    assert!(
        claims.lines().any(|l| l.starts_with("migrate-") && l.ends_with(" Released")),
        "the Job's pod held the lock and let go when it finished: {claims}"
    );
    for ns in &namespaces {
        let _ = api.delete(ns, &DeleteParams::default()).await;
    }
    drop(op);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Markdown pages of the project: README, ARCHITECTURE and docs/.
fn pages() -> Vec<(String, String)> {
    let mut pages =
        vec![("README.md".to_string(), read("README.md")), ("ARCHITECTURE.md".to_string(), read("ARCHITECTURE.md"))];
    let mut docs: Vec<_> = std::fs::read_dir(root().join("docs")).unwrap().map(|e| e.unwrap().path()).collect();
    docs.sort();
    for path in docs.into_iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
        pages.push((name.clone(), read(&name)));
    }
    pages
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn links_between_the_pages_resolve() {
    let pages = pages();
    let mut broken = vec![];
    for (name, text) in &pages {
        let dir = Path::new(name).parent().unwrap_or(Path::new(""));
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.starts_with("http") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() { name.clone() } else { normalize(&dir.join(file)) };
            if !root().join(&file).exists() {
                broken.push(format!("{name}: {target} (no file {file})"));
                continue;
            }
            if !fragment.is_empty() && file.ends_with(".md") {
                let target_text = read(&file);
                let found = target_text
                    .lines()
                    .filter(|l| l.starts_with('#'))
                    .any(|l| anchor(l.trim_start_matches('#')) == fragment);
                if !found {
                    broken.push(format!("{name}: {target} (no heading #{fragment} in {file})"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

fn normalize(path: &Path) -> String {
    let mut parts: Vec<String> = vec![];
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            c => parts.push(c.as_os_str().to_string_lossy().into_owned()),
        }
    }
    parts.join("/")
}

#[test]
fn every_test_the_docs_name_exists() {
    // Test functions are named as sentences: `a_standby_replica_takes_over_…` (metrics, named
    // `zklock_…` and `process_…`, are not).
    let sources: String = ["tests", "src", "crates", "testkit/src"]
        .iter()
        .flat_map(|dir| walk(&root().join(dir)))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    let mut missing = vec![];
    for (name, text) in pages() {
        for word in text.split('`').skip(1).step_by(2) {
            let looks_like_test = word.matches('_').count() >= 3
                && word.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !word.starts_with("zklock_")
                && !word.starts_with("process_");
            if looks_like_test && !sources.contains(&format!("fn {word}")) {
                missing.push(format!("{name}: {word}"));
            }
        }
    }
    assert!(missing.is_empty(), "the docs name tests that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn every_path_the_docs_name_exists() {
    // `tests/operator/e2e.rs`, `scripts/k8s.sh`, `controller/plan.rs` (in src/): a file moved
    // without its docs is caught here.
    let exts = [".rs", ".sh", ".md", ".yaml", ".json", ".toml", ".java", ".py"];
    let mut missing = vec![];
    for (name, text) in pages() {
        for word in text.split('`').skip(1).step_by(2) {
            let path = word.split_once(' ').map_or(word, |(p, _)| p).trim_end_matches(':');
            let looks_like_path = path.contains('/')
                && exts.iter().any(|e| path.ends_with(e))
                && path.chars().all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
                && !path.starts_with(['/', '.']);
            // Paths inside the crate's source and the chart are often named from there.
            let exists = ["", "src", "charts/zklock"].iter().any(|base| root().join(base).join(path).exists());
            if looks_like_path && !exists {
                missing.push(format!("{name}: {path}"));
            }
        }
    }
    assert!(missing.is_empty(), "the docs name paths that do not exist:\n{}", missing.join("\n"));
}

/// Every `.rs` file under `dir`.
pub(crate) fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The `zklock` command lines a text shows: its fenced code blocks line by line, its inline code
/// spans, and for a script every line.
fn command_snippets(name: &str, text: &str) -> Vec<String> {
    if !name.ends_with(".md") {
        return text.lines().map(str::to_string).collect();
    }
    let (mut snippets, mut prose) = (vec![], String::new());
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced {
            snippets.push(line.to_string());
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    snippets.extend(prose.split('`').skip(1).step_by(2).map(str::to_string));
    snippets
}

/// The words after each `zklock` that stands where a command is run (first in its line or span,
/// after `kubectl`, a shell operator or a path), up to the end of its arguments.
fn zklock_invocations(snippet: &str) -> Vec<Vec<String>> {
    // A shell comment shows no command (`# … (also: kubectl zklock ...)`).
    let code = snippet.split(" #").next().unwrap_or_default();
    let code = if code.trim_start().starts_with('#') { "" } else { code };
    let words: Vec<&str> = code.split_whitespace().collect();
    let before_a_command = ["kubectl", "$", "&&", "||", "|", ";", "then", "do", "exec", "time", "run:", "run", "-"];
    let ends = ["|", "||", "&&", ";", "#", ">", "2>", "--", ")"];
    let mut found = vec![];
    for (i, word) in words.iter().enumerate() {
        // A path to a binary runs it; a variable set to one (`ZKLOCK_BENCH_OPERATOR=…/zklock`)
        // does not.
        // `zklock`, a script's `"$zklock"`, `$(zklock …`.
        let bare = word.trim_start_matches("$(").trim_matches(|c| c == '"' || c == '\'');
        let runs = matches!(bare, "zklock" | "$zklock" | "${zklock}")
            || (word.ends_with("/zklock") && !word.contains([':', '=']));
        let placed = i == 0 || before_a_command.contains(&words[i - 1]);
        if !runs || !placed {
            continue;
        }
        let args = words[i + 1..]
            .iter()
            .take_while(|w| !ends.contains(w) && !w.starts_with('#'))
            .map(|w| w.trim_matches(|c| c == '[' || c == ']' || c == '"' || c == '\'').to_string())
            .filter(|w| !w.is_empty())
            .collect();
        found.push(args);
    }
    found
}

/// The subcommands a `--help` lists under "Commands:".
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn every_zklock_command_the_docs_show_exists() {
    // Docs and scripts show `zklock exec … --timeout 30m`, `zklock admin epoch-policy`: each
    // subcommand is looked up in the built binary's help, each flag in that subcommand's help,
    // so that a command renamed or moved (the demo's `epoch-policy`, once) fails here, not for
    // a user who types it.
    let binary = std::env::var("ZKLOCK_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zklock").into());
    let mut helps: std::collections::HashMap<Vec<String>, Option<String>> = Default::default();
    let mut help = |path: &[String]| {
        helps
            .entry(path.to_vec())
            .or_insert_with(|| {
                let out = Command::new(&binary).args(path).arg("--help").output().expect("run zklock --help");
                out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            })
            .clone()
    };
    let mut texts = pages();
    for dir in ["scripts", "examples"] {
        let mut scripts: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .flat_map(|p| {
                if p.is_dir() {
                    std::fs::read_dir(&p).into_iter().flatten().flatten().map(|e| e.path()).collect()
                } else {
                    vec![p]
                }
            })
            // Scripts, and the CI jobs of the integration examples (their `run:` and `script:`).
            .filter(|p| p.extension().is_some_and(|e| e == "sh" || e == "yml"))
            .collect();
        scripts.sort();
        for path in scripts {
            let name = path.strip_prefix(root()).unwrap_or(&path).display().to_string();
            texts.push((name, read_file(&path)));
        }
    }
    let (mut checked, mut wrong) = (0, vec![]);
    for (name, text) in &texts {
        for snippet in command_snippets(name, text) {
            for args in zklock_invocations(&snippet) {
                let mut path: Vec<String> = vec![];
                let mut positional = false;
                for arg in &args {
                    let Some(text) = help(&path) else { break };
                    if let Some(flag) = arg.strip_prefix('-').map(|_| arg.split('=').next().unwrap_or(arg)) {
                        let listed =
                            text.split(|c: char| c.is_whitespace() || ",[]=<>".contains(c)).any(|word| word == flag);
                        if !listed {
                            wrong.push(format!(
                                "{name}: `zklock {}`: no {flag} in `zklock {} --help`",
                                args.join(" "),
                                path.join(" ")
                            ));
                        }
                    } else if !positional && subcommands(&text).contains(arg) {
                        path.push(arg.clone());
                    } else if !positional && !subcommands(&text).is_empty() {
                        // `zklock admin epoch-polcy`: a command group takes no positional word.
                        let group =
                            if path.is_empty() { String::new() } else { format!(" of `zklock {}`", path.join(" ")) };
                        wrong.push(format!("{name}: `zklock {}`: no subcommand {arg}{group}", args.join(" ")));
                        break;
                    } else {
                        positional = true;
                    }
                }
                if help(&path).is_none() {
                    wrong.push(format!(
                        "{name}: `zklock {}`: `zklock {} --help` fails",
                        args.join(" "),
                        path.join(" ")
                    ));
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} zklock command lines checked against the binary's help");
    assert!(checked >= 30, "the docs show zklock commands; found only {checked}: is the scan broken?");
    assert!(wrong.is_empty(), "commands the docs show that the binary does not have:\n{}", wrong.join("\n"));
}
