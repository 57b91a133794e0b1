//! The code map holds: the layer crates' manifests allow no import upwards (the compiler does the
//! rest), the lock engine's files import only files below them (the layers
//! `crates/engine/src/lib.rs` describes), and the gated pod's plan and pod modules do not import
//! each other both ways. Read from the sources, so that a new import in the wrong direction
//! fails here with the file and the module it reached for.

use std::collections::BTreeMap;
use std::path::Path;

/// `crates/engine/src`'s files, lowest first; a file may use only files listed before it.
const ZK_LAYERS: &[&str] = &[
    "recipe", // pure: no I/O
    "layout", // where everything is in ZooKeeper
    "data",
    "contender",
    "config",
    "retry",
    "stats",
    "declaration",
    "book",
    "acl",
    "fence",
    "token_base",
    "core", // shared
    "ops",  // the ZooKeeper operations
    "root", // the installation that owns the root
    "anchor",
    "rounds",
    "session",
    "enqueue", // the tasks
    "permits",
    "engine", // the face
];

/// The sibling modules `file` uses (through `super::NAME` outside comments and tests).
fn uses(file: &Path, siblings: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let braced = braced_uses(&code);
    let mut found: Vec<String> = siblings
        .iter()
        .filter(|s| {
            [format!("super::{s}::"), format!("super::{s};"), format!("crate::{s}::")].iter().any(|p| code.contains(p))
                || braced.iter().any(|u| u == *s)
        })
        .map(|s| s.to_string())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The first path segments of `use super::{a, b::c, …};` lists.
fn braced_uses(code: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = code;
    while let Some(i) = rest.find("use super::{") {
        rest = &rest[i + "use super::{".len()..];
        let end = rest.find("};").unwrap_or(rest.len());
        let mut depth = 0;
        let mut item = String::new();
        for c in rest[..end].chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(item.trim().split("::").next().unwrap_or_default().to_string());
                    item.clear();
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                item.push(c);
            }
        }
        out.push(item.trim().split("::").next().unwrap_or_default().to_string());
    }
    out
}

#[test]
fn the_lock_engine_imports_only_downwards() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/engine/src");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|name| name != "lib")
        .collect();
    files.sort();
    let mut listed: Vec<String> = ZK_LAYERS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(
        files, listed,
        "every file of crates/engine/src has its place in ZK_LAYERS (and crates/engine/src/lib.rs says where)"
    );
    let mut upwards = BTreeMap::new();
    for (rank, name) in ZK_LAYERS.iter().enumerate() {
        let above: Vec<String> = uses(&dir.join(format!("{name}.rs")), ZK_LAYERS)
            .into_iter()
            .filter(|used| ZK_LAYERS.iter().position(|l| l == used).is_some_and(|r| r >= rank))
            .filter(|used| used != name)
            .collect();
        if !above.is_empty() {
            upwards.insert(*name, above);
        }
    }
    assert!(upwards.is_empty(), "files that use files at or above their layer: {upwards:?}");
}

/// The direct dependencies a crate of the workspace declares (only those can its code import).
fn dependencies(krate: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates").join(krate).join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let section = text.split("[dependencies]").nth(1).unwrap_or_default().split("\n[").next().unwrap_or_default();
    section
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['=', ' ', '.']).next().map(str::to_string))
        .collect()
}

/// The layers are crates: the compiler refuses an import their manifests do not allow, and these
/// manifests allow no import upwards. The engine knows no Kubernetes, metrics or API types; the
/// API types know no ZooKeeper client, runtime or metrics; the client stack knows no zklock.
#[test]
fn the_layer_crates_allow_no_import_upwards() {
    let engine = dependencies("engine");
    assert!(engine.contains(&"zookeeper-client".to_string()), "the reader reads: {engine:?}");
    for forbidden in ["kube", "k8s-openapi", "prometheus-client", "zklock-api", "zklock"] {
        assert!(!engine.iter().any(|d| d == forbidden), "crates/engine must not depend on {forbidden}: {engine:?}");
    }
    let api = dependencies("api");
    assert!(api.contains(&"kube".to_string()), "the reader reads: {api:?}");
    for forbidden in ["zookeeper-client", "tokio", "prometheus-client", "zklock"] {
        assert!(!api.iter().any(|d| d == forbidden), "crates/api must not depend on {forbidden}: {api:?}");
    }
    // The client stack is shared with the test kit, which the operator's tests use: it knows
    // nothing of zklock.
    let client = dependencies("kube-client");
    assert!(client.contains(&"kube".to_string()), "the reader reads: {client:?}");
    for forbidden in ["zookeeper-client", "prometheus-client"] {
        assert!(
            !client.iter().any(|d| d == forbidden),
            "crates/kube-client must not depend on {forbidden}: {client:?}"
        );
    }
    assert!(
        !client.iter().any(|d| d.starts_with("zklock")),
        "crates/kube-client must depend on no zklock crate: {client:?}"
    );
}

#[test]
fn the_gated_pods_plan_and_pod_modules_do_not_import_each_other() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller/gated");
    let plan = uses(&dir.join("plan.rs"), &["pod"]);
    let pod = uses(&dir.join("pod.rs"), &["plan"]);
    assert!(plan.is_empty() || pod.is_empty(), "plan.rs uses {plan:?} and pod.rs uses {pod:?}: a circle");
}

#[test]
fn the_import_reader_sees_imports() {
    // The checks above pass trivially if `uses` finds nothing: it must find these.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/engine/src");
    let engine = uses(&dir.join("engine.rs"), ZK_LAYERS);
    for expected in ["core", "enqueue", "ops", "rounds", "session", "anchor", "fence"] {
        assert!(engine.iter().any(|u| u == expected), "engine.rs uses {expected}: {engine:?}");
    }
    let plan = uses(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller/gated/plan.rs"), &["pod"]);
    assert_eq!(plan, ["pod"], "gated/plan.rs uses gated/pod.rs");
}
