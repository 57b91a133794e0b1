//! The CLI as a release ships it: `scripts/archive.sh` packs the binary with `kubectl-zklock`,
//! completions and man pages; `scripts/krew.sh` writes krew's manifest from the archives; and
//! krew itself (built from its Go module by scripts/tools.sh) installs the plugin from that
//! manifest and archive, after which `kubectl-zklock` answers as `kubectl zklock`.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what}: {said}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A directory of the test's own, removed when the test ends (also when it fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn krew() -> PathBuf {
    let krew = root().join(".tools/bin/krew");
    assert!(krew.exists(), "krew not found at {}: run TOOLS_WITH_IMAGE=1 scripts/tools.sh", krew.display());
    krew
}

#[test]
fn a_release_archive_installs_with_krew_and_answers_as_kubectl_zklock() {
    let dir = Scratch(std::env::temp_dir().join(format!("zklock-archives-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let version = env!("CARGO_PKG_VERSION");
    let out = dir.0.join("dist");
    let archive = run(
        "scripts/archive.sh",
        Command::new(root().join("scripts/archive.sh"))
            .args(["--binary", env!("CARGO_BIN_EXE_zklock"), "--version", version, "--os", "linux", "--arch", "amd64"])
            .arg(&out),
    );
    let archive = PathBuf::from(archive.trim());
    let name = format!("zklock-{version}-linux-amd64");
    assert_eq!(archive, out.join(format!("{name}.tar.gz")));
    let listed = run("tar -tvzf", Command::new("tar").arg("-tvzf").arg(&archive));
    for file in [
        "zklock",
        "kubectl-zklock",
        "completions/zklock.bash",
        "completions/_zklock",
        "completions/zklock.fish",
        "man/man1/zklock.1",
        "man/man1/zklock-check.1",
        "LICENSE",
        "README.md",
    ] {
        assert!(listed.lines().any(|l| l.ends_with(&format!("{name}/{file}"))), "the archive has {file}:\n{listed}");
    }
    assert!(
        !listed.lines().any(|l| l.starts_with('l') || l.starts_with('h')),
        "no links (krew refuses them):\n{listed}"
    );
    // The same inputs make the same archive.
    let first = std::fs::read(&archive).unwrap();
    run(
        "scripts/archive.sh again",
        Command::new(root().join("scripts/archive.sh"))
            .args(["--binary", env!("CARGO_BIN_EXE_zklock"), "--version", version, "--os", "linux", "--arch", "amd64"])
            .arg(&out),
    );
    assert!(std::fs::read(&archive).unwrap() == first, "two packings of one binary differ");
    // The CI examples take the binary out with exactly this (examples/integrations/).
    let unpacked = dir.0.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    run(
        "tar -xz --strip-components=1 (as the CI examples do)",
        Command::new("sh").arg("-c").arg(format!(
            "tar -xz -C '{}' --strip-components=1 {name}/zklock < '{}'",
            unpacked.display(),
            archive.display()
        )),
    );
    let said = run("the unpacked zklock --version", Command::new(unpacked.join("zklock")).arg("--version"));
    assert!(said.contains(version), "{said}");

    let base = format!("https://github.com/zklock/zklock/releases/download/v{version}");
    let manifest = run(
        "scripts/krew.sh",
        Command::new(root().join("scripts/krew.sh")).args(["--version", version, "--base-url", &base]).arg(&out),
    );
    let parsed: serde_json::Value = serde_yaml::from_str(&manifest).expect("the manifest is YAML");
    let platform = &parsed["spec"]["platforms"][0];
    assert_eq!(platform["uri"], format!("{base}/{name}.tar.gz"));
    let sha = std::fs::read_to_string(out.join(format!("{name}.tar.gz.sha256"))).unwrap();
    assert_eq!(platform["sha256"].as_str(), sha.split_whitespace().next());
    let manifest_file = dir.0.join("zklock.yaml");
    std::fs::write(&manifest_file, &manifest).unwrap();

    let krew_root = dir.0.join("krew");
    run(
        "krew install --manifest --archive",
        Command::new(krew())
            .env("KREW_ROOT", &krew_root)
            .arg("install")
            .arg(format!("--manifest={}", manifest_file.display()))
            .arg(format!("--archive={}", archive.display()))
            .stdin(std::process::Stdio::null()),
    );
    let plugin = krew_root.join("bin/kubectl-zklock");
    let help = run("kubectl-zklock --help", Command::new(&plugin).arg("--help"));
    assert!(help.contains("Usage: kubectl zklock <COMMAND>"), "{help}");
    let version_line = run("kubectl-zklock --version", Command::new(&plugin).arg("--version"));
    assert!(version_line.contains(version), "{version_line}");
    // A manifest whose checksum is not the archive's is refused.
    let wrong = manifest.replace(platform["sha256"].as_str().unwrap(), &"0".repeat(64));
    std::fs::write(&manifest_file, wrong).unwrap();
    let refused = Command::new(krew())
        .env("KREW_ROOT", dir.0.join("krew-refused"))
        .arg("install")
        .arg(format!("--manifest={}", manifest_file.display()))
        .arg(format!("--archive={}", archive.display()))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success(), "krew took an archive against a wrong checksum");
}
