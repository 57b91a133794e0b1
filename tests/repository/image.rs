//! The operator's image, as scripts/image.sh builds it (from this test build's binary: the
//! release workflow gives it the static release binary): its config read back with skopeo, its
//! root filesystem unpacked with umoci, and the binary run from there as the image's user.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(what: &str, command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (scripts/tools.sh with TOOLS_WITH_IMAGE=1 installs it)"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `args` with the image's binary, from the unpacked `rootfs` only: chrooted as the image's
/// user where this process may (root), else through the rootfs's own dynamic loader and
/// libraries (a static binary needs neither).
fn run_in(rootfs: &Path, args: &[&str]) -> String {
    let is_root = run("id -u", Command::new("id").arg("-u")).trim() == "0";
    if is_root {
        let mut chroot = Command::new("chroot");
        chroot.arg("--userspec=65532:65532").arg(rootfs).arg("/usr/local/bin/zklock").args(args);
        return run("zklock in a chroot of the image", &mut chroot);
    }
    let binary = rootfs.join("usr/local/bin/zklock");
    let loader =
        ["lib64/ld-linux-x86-64.so.2", "lib/ld-linux-aarch64.so.1"].iter().map(|l| rootfs.join(l)).find(|l| l.exists());
    let Some(loader) = loader else {
        return run("the image's static zklock", Command::new(&binary).args(args));
    };
    let dirs: Vec<String> =
        ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu"]
            .iter()
            .map(|d| rootfs.join(d).display().to_string())
            .collect();
    let mut command = Command::new(loader);
    command.arg("--library-path").arg(dirs.join(":")).arg(&binary).args(args);
    run("zklock through the image's own loader", &mut command)
}

#[test]
fn the_image_runs_the_operator_as_a_non_root_user_from_its_own_files() {
    let dir = std::env::temp_dir().join(format!("zklock-image-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let layout = dir.join("oci");
    let mut build = Command::new(root().join("scripts/image.sh"));
    build.args(["--binary", env!("CARGO_BIN_EXE_zklock"), "--revision", "test-revision"]).arg(&layout);
    run("scripts/image.sh", &mut build);
    let version = env!("CARGO_PKG_VERSION");
    let image = format!("{}:{version}", layout.display());

    let config =
        run("skopeo inspect --config", Command::new("skopeo").args(["inspect", "--config", &format!("oci:{image}")]));
    let config: Value = serde_json::from_str(&config).expect("the image config is JSON");
    let c = &config["config"];
    assert_eq!(c["User"], "65532:65532", "non-root, as the chart's securityContext expects: {config}");
    assert_eq!(c["Entrypoint"], serde_json::json!(["/usr/local/bin/zklock"]));
    assert_eq!(c["Cmd"], serde_json::json!(["run"]));
    assert!(c["ExposedPorts"].get("8080/tcp").is_some(), "metrics and probes: {config}");
    let label = |name: &str| c["Labels"][format!("org.opencontainers.image.{name}")].as_str().map(str::to_string);
    assert_eq!(label("version").as_deref(), Some(version));
    assert_eq!(label("revision").as_deref(), Some("test-revision"));
    assert_eq!(label("licenses").as_deref(), Some("Apache-2.0"));
    assert_eq!(config["os"], "linux");
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(config["architecture"], arch);

    let bundle = dir.join("bundle");
    run("umoci unpack", Command::new("umoci").args(["unpack", "--rootless", "--image", &image]).arg(&bundle));
    let rootfs = bundle.join("rootfs");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).expect("/etc/passwd in the image");
    assert!(passwd.contains("nonroot:x:65532:65532:"), "the image's user has a name: {passwd}");
    assert!(rootfs.join("usr/share/doc/zklock/LICENSE").exists(), "the license travels with the image");
    assert!(!rootfs.join("bin/sh").exists(), "no shell, no package manager: the binary and what it links");

    assert_eq!(run_in(&rootfs, &["--version"]).trim(), format!("zklock {version}"));
    let crds = run_in(&rootfs, &["crd"]);
    let expected: Vec<String> = zklock::api::crds().into_iter().map(|(_, yaml)| yaml).collect();
    for crd in &expected {
        assert!(crds.contains(crd.trim()), "`zklock crd` in the image prints this build's CRDs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
