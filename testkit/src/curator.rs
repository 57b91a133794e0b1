//! Apache Curator peers: `interop/java/CuratorPeer.java`, compiled with the system's `javac`
//! against Debian's Curator and ZooKeeper jars, and run as a separate process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Debian's jars the peer needs (Curator, the ZooKeeper client, and their dependencies).
const JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
    "netty-handler",
    "netty-transport-native-epoll",
];

fn classpath(classes: &Path) -> String {
    let mut parts = vec![classes.display().to_string()];
    for jar in JARS {
        let path = format!("/usr/share/java/{jar}.jar");
        if !Path::new(&path).exists() {
            panic!("{path} is missing: run `scripts/zookeeper.sh install` (installs zookeeper and libcurator-recipes-java)");
        }
        parts.push(path);
    }
    parts.join(":")
}

/// Compiles the peer once per process and returns its classes directory.
fn classes() -> &'static PathBuf {
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let source = crate::workspace_root().join("interop/java/CuratorPeer.java");
        let out = std::env::temp_dir().join(format!("zklock-curator-{}", std::process::id()));
        std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));
        let status = Command::new("javac")
            .arg("-d")
            .arg(&out)
            .arg("-cp")
            .arg(classpath(&out))
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("cannot run javac (is a JDK 17 installed?): {e}"));
        assert!(status.success(), "javac failed on {}", source.display());
        out
    })
}

/// A command running the Curator peer with `args`; the caller runs or spawns it.
pub fn command(args: &[&str]) -> Command {
    let classes = classes();
    let mut command = Command::new("java");
    command.arg("-cp").arg(classpath(classes)).arg("CuratorPeer").args(args);
    command
}

/// Runs the peer to completion and returns its standard output; panics with its output when it
/// fails.
pub fn run(args: &[&str]) -> String {
    let Output { status, stdout, stderr } =
        command(args).output().unwrap_or_else(|e| panic!("cannot run the Curator peer: {e}"));
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    assert!(
        status.success(),
        "Curator peer {args:?} failed ({status}):\n{stdout}\n{}",
        String::from_utf8_lossy(&stderr)
    );
    stdout
}
