//! Supply-chain evidence (docs/verify.md): the binary carries the list of crates it was built
//! from (built with cargo auditable, as scripts/test.sh and scripts/build-static.sh build it;
//! read back with rust-audit-info, the command the docs show), and the CycloneDX SBOM that
//! scripts/sbom.sh writes lists every one of them, each at the version Cargo.lock pins.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tool(name: &str) -> PathBuf {
    let tool = root().join(".tools/bin").join(name);
    assert!(tool.exists(), "{name} not found at {}: run TOOLS_WITH_IMAGE=1 scripts/tools.sh", tool.display());
    tool
}

fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what}: {said}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every crate Cargo.lock pins, by name: its versions (a crate may be locked at two).
fn locked() -> BTreeMap<String, BTreeSet<String>> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).expect("Cargo.lock");
    let mut all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            package.lines().find_map(|l| l.strip_prefix(&format!("{key} = \""))?.strip_suffix('"').map(str::to_string))
        };
        if let (Some(name), Some(version)) = (field("name"), field("version")) {
            all.entry(name).or_default().insert(version);
        }
    }
    all
}

/// Crates only the tests use: neither list may name them.
const DEV_ONLY: &[&str] = &["proptest", "promql-parser", "zklock-testkit"];

/// The crates the binary says it was built from, as rust-audit-info reads them: (name, version,
/// source, kind).
fn carried() -> Vec<(String, String, String, String)> {
    let binary = env!("CARGO_BIN_EXE_zklock");
    let out = Command::new(tool("rust-audit-info")).arg(binary).output().expect("rust-audit-info");
    assert!(
        out.status.success(),
        "rust-audit-info finds no dependency list in {binary}: {} (the tests' build must be made with `cargo \
         auditable`, as scripts/test.sh makes it: run `cargo auditable test` rather than `cargo test`)",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout).expect("rust-audit-info answers JSON");
    let packages = info["packages"].as_array().expect("a packages list");
    let text = |p: &Value, key: &str, default: &str| p[key].as_str().unwrap_or(default).to_string();
    packages
        .iter()
        .map(|p| (text(p, "name", ""), text(p, "version", ""), text(p, "source", ""), text(p, "kind", "runtime")))
        .collect()
}

#[test]
fn the_binary_carries_the_crates_it_was_built_from_at_their_locked_versions() {
    let locked = locked();
    let carried = carried();
    let root_package: Vec<_> = carried.iter().filter(|(name, ..)| name == "zklock").collect();
    assert_eq!(root_package.len(), 1, "the binary's own package: {root_package:?}");
    assert_eq!(root_package[0].1, env!("CARGO_PKG_VERSION"));
    for (name, version, ..) in &carried {
        assert!(
            locked.get(name).is_some_and(|v| v.contains(version)),
            "{name} {version} is in the binary's list but not in Cargo.lock"
        );
        assert!(!DEV_ONLY.contains(&name.as_str()), "{name}, used by tests only, is in the binary's list");
    }
    let names: BTreeSet<&str> = carried.iter().map(|(name, ..)| name.as_str()).collect();
    for needed in ["kube-client", "k8s-openapi", "zookeeper-client", "tokio", "rustls", "aws-lc-sys", "zklock-engine"] {
        assert!(names.contains(needed), "{needed} is missing from the binary's list: {names:?}");
    }
    assert!(
        carried.iter().any(|(name, _, _, kind)| name == "cc" && kind == "build"),
        "build dependencies (cc, for aws-lc-sys) are listed as such"
    );
}

#[test]
fn the_sbom_lists_every_crate_the_binary_carries_and_is_reproducible() {
    let dir = std::env::temp_dir().join(format!("zklock-sbom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _remove = Remove(dir.clone());
    let sbom_at = |file: &str| {
        let out = dir.join(file);
        run(
            "scripts/sbom.sh",
            Command::new(root().join("scripts/sbom.sh")).arg(&out).env(
                "PATH",
                format!("{}:{}", root().join(".tools/bin").display(), std::env::var("PATH").unwrap_or_default()),
            ),
        );
        std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()))
    };
    let first = sbom_at("first.cdx.json");
    let second = sbom_at("second.cdx.json");
    let differs = first.lines().zip(second.lines()).find(|(a, b)| a != b);
    assert!(first == second, "two SBOMs of one commit differ: {differs:?}");
    assert!(!first.contains(&std::env::temp_dir().display().to_string()), "the SBOM names a temporary path");
    assert!(
        run(
            "git status",
            Command::new("git").args(["status", "--porcelain", "--untracked-files=all"]).current_dir(root())
        )
        .lines()
        .all(|l| !l.ends_with(".cdx.json")),
        "scripts/sbom.sh left SBOMs in the checkout"
    );

    let sbom: Value = serde_json::from_str(&first).expect("the SBOM is JSON");
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    assert_eq!(sbom["metadata"]["component"]["name"], "zklock", "the SBOM describes zklock: {}", sbom["metadata"]);
    assert_eq!(sbom["metadata"]["component"]["version"], env!("CARGO_PKG_VERSION"));
    // Components may nest (a package's own targets): every name@version at any depth, and each
    // one's package URL names it.
    let mut listed = BTreeSet::new();
    let mut stack: Vec<&Value> = sbom["components"].as_array().expect("components").iter().collect();
    while let Some(component) = stack.pop() {
        let (name, version) = (component["name"].as_str().unwrap_or(""), component["version"].as_str().unwrap_or(""));
        if let Some(purl) = component["purl"].as_str() {
            assert!(purl.starts_with(&format!("pkg:cargo/{name}@{version}")), "{name} {version}: purl {purl}");
        }
        listed.insert((name.to_string(), version.to_string()));
        stack.extend(component["components"].as_array().into_iter().flatten());
    }
    let missing: Vec<_> = carried()
        .into_iter()
        .filter(|(name, ..)| name != "zklock")
        .filter(|(name, version, ..)| !listed.contains(&(name.clone(), version.clone())))
        .map(|(name, version, ..)| format!("{name} {version}"))
        .collect();
    assert!(missing.is_empty(), "crates in the binary but not in the SBOM: {missing:?}");
    for dev in DEV_ONLY {
        assert!(!listed.iter().any(|(name, _)| name == dev), "{dev}, used by tests only, is in the SBOM");
    }
}
