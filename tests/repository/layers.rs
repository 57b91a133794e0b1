//! The code map holds: the layer crates' manifests allow no import upwards (the compiler does the
//! rest), the lock engine's files import only files below them (the layers
//! `crates/engine/src/lib.rs` describes), and so do the controller's (the floors
//! `src/controller/mod.rs` describes). Read from the sources, so that a new import in the wrong direction
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

/// `src/controller`'s modules in floors, lowest first; a module may use only modules listed
/// before it (src/controller/mod.rs says what each floor holds).
const CONTROLLER_LAYERS: &[&[&str]] = &[
    // 0: vocabulary and the pure cores.
    &["base", "admission", "ledger", "throttle"],
    // 1: capabilities, each owning its state.
    &[
        "numbers",
        "api_fence",
        "token_floor",
        "events",
        "writer",
        "history",
        "registry",
        "arrivals",
        "holders",
        "serving",
        "stores",
        "triggers",
        "fencing",
        "context",
        "report",
    ],
    // 2: the pipelines.
    &["claim", "gated", "status"],
    // 3: the term's tasks.
    &["feed", "watch", "anchor", "pace", "positions", "supervisor"],
    // 4: the wiring of a term.
    &["term"],
];

/// The files of the controller's directory modules, lowest first (`mod`, the face, on top).
const CONTROLLER_DIRECTORIES: &[(&str, &[&str])] = &[
    ("base", &["error", "ids", "kept_pod", "scopes", "settings", "claim_facts", "mod"]),
    (
        "claim",
        &["plan", "inputs", "supersede", "guard", "enqueue", "status_write", "effects", "decide", "unreadable", "mod"],
    ),
    ("gated", &["plan", "mod"]),
    ("registry", &["book", "mod"]),
    ("status", &["limits_feed", "locks", "cluster_locks", "mod"]),
];

/// The modules of `src/controller` that `code` (a file `depth` directories below it: 0 for
/// `src/controller/x.rs`, 1 for `src/controller/claim/x.rs`) uses, by `crate::controller::` or
/// by `super::`.
fn controller_uses(code: &str, depth: usize, modules: &[&str]) -> Vec<String> {
    let up = "super::".repeat(depth + 1);
    let mut found: Vec<String> = modules
        .iter()
        .filter(|m| {
            [
                format!("crate::controller::{m}::"),
                format!("crate::controller::{m};"),
                format!("{up}{m}::"),
                format!("{up}{m};"),
            ]
            .iter()
            .any(|p| code.contains(p.as_str()))
                || (depth == 0 && braced_uses(code).iter().any(|u| u == *m))
                || braced_after(code, "use crate::controller::{").iter().any(|u| u == *m)
        })
        .map(|m| m.to_string())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The first path segments of the `PREFIX a, b::c, …};` lists in `code`.
fn braced_after(code: &str, prefix: &str) -> Vec<String> {
    braced_uses(&code.replace(prefix, "use super::{"))
}

/// A file's code outside comments and tests.
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    text.split("#[cfg(test)]")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every arrow between the controller's modules: (from, to, upward). `from` is a module, or
/// `dir/file` inside a directory module.
fn controller_arrows() -> Vec<(String, String, bool)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller");
    let order: Vec<&str> = CONTROLLER_LAYERS.iter().flat_map(|floor| floor.iter().copied()).collect();
    let rank = |m: &str| order.iter().position(|o| *o == m);
    let mut arrows = vec![];
    for module in &order {
        let (files, inner): (Vec<(String, std::path::PathBuf)>, &[&str]) = match CONTROLLER_DIRECTORIES
            .iter()
            .find(|(d, _)| d == module)
        {
            Some((_, inner)) => (
                inner.iter().map(|f| (format!("{module}/{f}"), root.join(module).join(format!("{f}.rs")))).collect(),
                inner,
            ),
            None => (vec![(module.to_string(), root.join(format!("{module}.rs")))], &[]),
        };
        for (name, path) in files {
            let code = code_of(&path);
            // A directory's mod.rs is its module: `super::` there is the controller.
            let depth = usize::from(!inner.is_empty() && !name.ends_with("/mod"));
            for used in controller_uses(&code, depth, &order) {
                if used != *module {
                    arrows.push((name.clone(), used.clone(), rank(&used) >= rank(module)));
                }
            }
            // Inside a directory module: its files by their own order (`mod` may use them all).
            if let Some(me) = inner.iter().position(|f| *f != "mod" && name.ends_with(&format!("/{f}"))) {
                let siblings: Vec<&str> = inner.iter().copied().filter(|f| *f != "mod").collect();
                for used in uses(&path, &siblings) {
                    let theirs = inner.iter().position(|f| *f == used).unwrap_or(0);
                    arrows.push((name.clone(), format!("{module}/{used}"), theirs >= me));
                }
            }
        }
    }
    arrows
}

/// The controller's modules import only downwards: a new import in the wrong direction fails
/// here with the file and what it reached for. Every file has its place in the lists.
#[test]
fn the_controller_imports_only_downwards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller");
    let mut on_disk = vec![];
    for entry in std::fs::read_dir(&root).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).unwrap().filter_map(Result::ok) {
                on_disk.push(format!("{stem}/{}", inner.path().file_stem().unwrap().to_string_lossy()));
            }
        } else if stem != "mod" {
            on_disk.push(stem);
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = CONTROLLER_LAYERS
        .iter()
        .flat_map(|floor| floor.iter())
        .flat_map(|m| match CONTROLLER_DIRECTORIES.iter().find(|(d, _)| d == m) {
            Some((_, inner)) => inner.iter().map(|f| format!("{m}/{f}")).collect(),
            None => vec![m.to_string()],
        })
        .collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "every file of src/controller has its place in CONTROLLER_LAYERS (and its mod.rs says where)"
    );
    let arrows = controller_arrows();
    let upward: Vec<String> = arrows.iter().filter(|a| a.2).map(|(from, to, _)| format!("{from} -> {to}")).collect();
    println!(
        "src/controller: {} modules on {} floors, {} arrows between them, {} upward",
        CONTROLLER_LAYERS.iter().map(|f| f.len()).sum::<usize>(),
        CONTROLLER_LAYERS.len(),
        arrows.len(),
        upward.len()
    );
    assert!(upward.is_empty(), "files that use modules at or above their own: {upward:#?}");
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
fn the_import_reader_sees_imports() {
    // The checks above pass trivially if `uses` finds nothing: it must find these.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/engine/src");
    let engine = uses(&dir.join("engine.rs"), ZK_LAYERS);
    for expected in ["core", "enqueue", "ops", "rounds", "session", "anchor", "fence"] {
        assert!(engine.iter().any(|u| u == expected), "engine.rs uses {expected}: {engine:?}");
    }
    let arrows = controller_arrows();
    for (from, to) in [
        ("term", "claim"),
        ("claim/decide", "claim/plan"),
        ("claim/mod", "base"),
        ("context", "registry"),
        ("gated/mod", "admission"),
        ("gated/plan", "base"),
    ] {
        assert!(arrows.iter().any(|(f, t, _)| f == from && t == to), "{from} uses {to}: {arrows:?}");
    }
}

/// A lock's permits reach the engine from one place, the watch feed of `Lock`s and
/// `ClusterLock`s (`status/limits_feed.rs`, through `LimitSource::declare`/`undeclare`), in the
/// order the watch delivers changes. A reconcile's copy may be older than a lower limit or the
/// object's deletion: declaring from it handed out permits the Lock no longer gave (the chaos
/// suite saw two exclusive holders of a Lock deleted 4 s before, seed 1795914931268861609).
#[test]
fn only_the_watch_feed_tells_the_engine_a_locks_permits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller");
    let mut found = vec![];
    for file in crate::docs::walk(&root) {
        let code = code_of(&file);
        let mut function = String::new();
        for line in code.lines() {
            if let Some(rest) = line.trim_start().split("fn ").nth(1).filter(|_| line.contains("fn ")) {
                function = rest.split(['(', '<']).next().unwrap_or_default().to_string();
            }
            let declares = [".set_limit(", "engine.declare("].iter().any(|call| line.contains(call));
            if declares && !matches!(function.as_str(), "declare" | "undeclare") {
                let name = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
                found.push(format!("src/controller/{name}: in fn {function}: {}", line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a lock's permits told to the engine outside the watch feed's LimitSource::declare/undeclare:\n{}",
        found.join("\n")
    );
}
