//! kazoo (the Python ZooKeeper client, from PyPI) peers: `interop/python/kazoo_peer.py`, run with
//! the system's Python against the copy of kazoo that `scripts/tools.sh` installs.

use std::path::PathBuf;
use std::process::Command;

/// Where `scripts/tools.sh` installs kazoo.
fn site() -> PathBuf {
    let site = crate::workspace_root().join(".tools/python");
    if !site.join("kazoo").is_dir() {
        panic!("kazoo is missing from {}: run `scripts/tools.sh` (installs it from PyPI)", site.display());
    }
    site
}

/// A command running the kazoo peer with `args`; the caller runs or spawns it.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new("python3");
    command.env("PYTHONPATH", site()).arg(crate::workspace_root().join("interop/python/kazoo_peer.py")).args(args);
    command
}
