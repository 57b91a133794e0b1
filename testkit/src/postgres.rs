//! A real PostgreSQL server for the fencing recipes' tests (Debian's `postgresql` package,
//! which `scripts/tools.sh` installs): a throw-away cluster made with `initdb` in a temporary
//! directory, its server listening on a loopback port of its own, stopped and removed when the
//! value goes. PostgreSQL refuses to run as root: as root the cluster belongs to, and the server
//! runs as, the package's `postgres` user.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::zookeeper::TempDir;

pub struct PgServer {
    pub port: u16,
    process: Child,
    _dir: TempDir,
}

/// Where Debian puts the server's programs (not on PATH): the newest major version installed.
fn bin_dir() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("PostgreSQL's initdb is not under /usr/lib/postgresql/*/bin: install Debian's postgresql (scripts/tools.sh)")
    })
}

/// Whether this runs as root (asked once).
fn as_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
    })
}

/// `program` with `args`, as the `postgres` user when this runs as root (`setpriv` execs the
/// program itself, so the process this starts is the server, and stopping it stops the server).
fn command(program: &Path, args: &[&str]) -> Command {
    if as_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(program).args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    }
}

impl PgServer {
    pub fn start() -> PgServer {
        let bin = bin_dir();
        let dir = TempDir::new("zklock-pg");
        let data = dir.path().join("data");
        if as_root() {
            let owned = Command::new("chown").args(["-R", "postgres:"]).arg(dir.path()).status();
            assert!(owned.is_ok_and(|s| s.success()), "chown of {} to postgres failed", dir.path().display());
        }
        let data_arg = data.display().to_string();
        let init = command(&bin.join("initdb"), &["-D", &data_arg, "-A", "trust", "-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run initdb: {e}"));
        assert!(init.status.success(), "initdb: {}", String::from_utf8_lossy(&init.stderr));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free loopback port: {e}"));
        let socket_dir = dir.path().display().to_string();
        let port_arg = port.to_string();
        let args = ["-D", &data_arg, "-p", &port_arg, "-h", "127.0.0.1", "-k", &socket_dir, "-F", "-c", "fsync=off"];
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap_or_else(|e| panic!("server log: {e}"));
        let process = command(&bin.join("postgres"), &args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start postgres: {e}"));
        let server = PgServer { port, process, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.psql(&["-c", "SELECT 1"]).status.success() {
            let log = std::fs::read_to_string(server._dir.path().join("server.log")).unwrap_or_default();
            assert!(Instant::now() < deadline, "PostgreSQL on port {port} not answering within 30 s; its log:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Runs `psql` against the server (database `postgres`, stopping at the first error) with
    /// `args`; its whole output.
    pub fn psql(&self, args: &[&str]) -> Output {
        Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres"])
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run psql (Debian's postgresql-client): {e}"))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // A fast shutdown (SIGINT: sessions ended, shared memory given back), then SIGKILL if it
        // has not ended within ten seconds.
        let _ = Command::new("kill").args(["-INT", &self.process.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.process.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
