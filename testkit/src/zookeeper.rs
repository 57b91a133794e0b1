//! Real ZooKeeper servers on loopback ports with throw-away data directories.
//!
//! [`ZkServer::shared`] starts one standalone server per test process (or uses the ensemble
//! named by `ZK_CONNECT`); [`ZkServer::chroot`] gives each test its own subtree so tests run in
//! parallel. [`ZkServer::start`] and [`Ensemble::start`] give a test servers of its own, for
//! restarts and failover.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
pub const ZOOKEEPER_CONF: &str = "/etc/zookeeper/conf";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings every harness server gets. `tickTime=500` allows session timeouts from 1 s to 10 s,
/// so that expiry tests take seconds. `forceSync=no` keeps transaction logging off the disk's
/// fsync path: test throughput should not depend on the machine's disk.
const NETTY_FOR_TLS: &str = "/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar";
const COMMON_CFG: &str = "tickTime=500\ninitLimit=20\nsyncLimit=10\nmaxClientCnxns=0\n\
admin.enableServer=false\n4lw.commands.whitelist=*\nforceSync=no\npreAllocSize=4096\n\
autopurge.purgeInterval=0\n";

/// One server process (standalone, or one member of an ensemble).
#[derive(Debug)]
pub struct ZkServer {
    connect: String,
    client_port: u16,
    dir: PathBuf,
    process: Option<Child>,
    /// Kept so that dropping the server removes its data directory.
    _tmp: Option<TempDir>,
}

impl ZkServer {
    /// The process-wide server: `ZKLOCK_TEST_ZK` (or `ZK_CONNECT`) if set, else a standalone
    /// server started once.
    pub fn shared() -> &'static ZkServer {
        static SHARED: OnceLock<ZkServer> = OnceLock::new();
        let given = std::env::var("ZKLOCK_TEST_ZK").or_else(|_| std::env::var("ZK_CONNECT"));
        SHARED.get_or_init(|| match given {
            Ok(connect) if !connect.is_empty() => {
                let first = connect.split(['/', ',']).next().unwrap_or_default().to_string();
                let version = four_letter(&first, "srvr").map(|s| version_of(&s)).unwrap_or_else(|e| {
                    panic!("ZKLOCK_TEST_ZK/ZK_CONNECT={connect} but {first} does not answer `srvr`: {e}")
                });
                eprintln!("zookeeper {version} (given) at {connect}");
                ZkServer { connect, client_port: 0, dir: PathBuf::new(), process: None, _tmp: None }
            }
            // The shared server outlives every test of the process; its watchdog (see `spawn`)
            // stops it when the process exits.
            _ => ZkServer::start(),
        })
    }

    /// A standalone server of the caller's own.
    pub fn start() -> ZkServer {
        Self::start_with("")
    }

    /// A standalone server with a TLS client port (Netty) beside the plain one, requiring client
    /// certificates of `pki`'s CA; returns it and the TLS port's `127.0.0.1:PORT`.
    pub fn start_tls(pki: &crate::tls::TestPki) -> (ZkServer, String) {
        let secure = free_port();
        let server = Self::start_with(&pki.server_cfg(secure));
        // The server answers on its plain port before its secure one listens (seen on a loaded
        // machine: a TLS connect right after the start found no host).
        let address = format!("127.0.0.1:{secure}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "ZooKeeper's secure port {address} not listening within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (server, address)
    }

    /// A standalone server of the caller's own that grants sessions up to `max` (the harness's
    /// `tickTime` caps them at 10 s otherwise): for operators whose session must outlast a
    /// leader takeover.
    pub fn start_with_max_session(max: Duration) -> ZkServer {
        Self::start_with(&format!("maxSessionTimeout={}\n", max.as_millis()))
    }

    fn start_with(extra_cfg: &str) -> ZkServer {
        let tmp = TempDir::new("zklock-zk");
        let port = free_port();
        let dir = tmp.path().to_path_buf();
        let cfg = format!(
            "{COMMON_CFG}dataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n{extra_cfg}",
            dir.display()
        );
        std::fs::write(dir.join("zoo.cfg"), cfg).unwrap_or_else(|e| panic!("cannot write zoo.cfg: {e}"));
        let mut server =
            ZkServer { connect: format!("127.0.0.1:{port}"), client_port: port, dir, process: None, _tmp: Some(tmp) };
        server.resume();
        let version = four_letter(&server.connect, "srvr").map(|s| version_of(&s)).unwrap_or_default();
        eprintln!("zookeeper {version} standalone at {}", server.connect);
        server
    }

    /// `host:port[,...]` of the server (or ensemble), without chroot.
    pub fn connect(&self) -> &str {
        &self.connect
    }

    /// The server's own (java) process, for its CPU time: the child of the watchdog this
    /// process started (none for a server named by `ZKLOCK_TEST_ZK`, or one not running).
    pub fn java_pid(&self) -> Option<u32> {
        let watchdog = self.process.as_ref()?.id().to_string();
        std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command name (which may hold spaces): state, then the parent's PID.
            let (command, rest) = stat.rsplit_once(')')?;
            let parent = rest.split_whitespace().nth(1)?;
            (parent == watchdog && command.ends_with("(java")).then_some(pid)
        })
    }

    /// The requests the server has received so far (every client's, pings and this command
    /// included), from its `srvr` command.
    pub fn requests_received(&self) -> Option<u64> {
        let srvr = four_letter(&self.connect, "srvr").ok()?;
        srvr.lines().find_map(|l| l.strip_prefix("Received: ")?.trim().parse().ok())
    }

    pub fn addr(&self) -> SocketAddr {
        let first = self.connect.split(['/', ',']).next().unwrap_or_default();
        first.parse().unwrap_or_else(|e| panic!("{first} is not host:port: {e}"))
    }

    /// A fresh subtree for one test: `connect/zklock-test-<uuid>`. The node is created here, so
    /// the returned connect string is ready to use.
    pub async fn chroot(&self) -> String {
        let name = format!("/zklock-test-{}", uuid::Uuid::new_v4().simple());
        let client = zookeeper_client::Client::connect(&self.connect)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to ZooKeeper at {}: {e}", self.connect));
        let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
        client.create(&name, b"", &options).await.unwrap_or_else(|e| panic!("cannot create chroot {name}: {e}"));
        format!("{}{name}", self.connect)
    }

    /// Stops the process (kill -9: the server gets no chance to tidy up), keeping its data.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            // TERM reaches the watchdog shell, whose trap kills the JVM with -9.
            let _ = Command::new("kill").arg(process.id().to_string()).status();
            let _ = process.wait();
        }
    }

    /// Starts the process again on the same port and data, and waits until it serves.
    pub fn resume(&mut self) {
        assert!(self.process.is_none(), "server at {} is already running", self.connect);
        self.process = Some(spawn(&self.dir.join("zoo.cfg"), &self.dir.join("zookeeper.log")));
        wait_serving(
            &format!("127.0.0.1:{}", self.client_port),
            self.process.as_mut(),
            &self.dir.join("zookeeper.log"),
        );
    }

    /// Makes the stopped server's data anew (as a new ensemble, or a wiped volume, would have
    /// them): its snapshots and transaction logs go, its configuration stays.
    pub fn wipe(&mut self) {
        assert!(self.process.is_none(), "stop the server at {} before wiping its data", self.connect);
        let data = self.dir.join("version-2");
        if data.exists() {
            std::fs::remove_dir_all(&data).unwrap_or_else(|e| panic!("cannot wipe {}: {e}", data.display()));
        }
    }

    /// The data directory (holds `zoo.cfg` and `zookeeper.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A three-node ensemble on loopback ports.
#[derive(Debug)]
pub struct Ensemble {
    pub servers: Vec<ZkServer>,
}

impl Ensemble {
    pub fn start(size: usize) -> Ensemble {
        let mut picked = free_ports(3 * size).into_iter();
        let mut next = || picked.next().unwrap_or_else(free_port);
        let ports: Vec<(u16, u16, u16)> = (0..size).map(|_| (next(), next(), next())).collect();
        let members: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, election))| format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1))
            .collect();
        let servers: Vec<ZkServer> = ports
            .iter()
            .enumerate()
            .map(|(i, (client, _, _))| {
                let tmp = TempDir::new("zklock-ens");
                let dir = tmp.path().to_path_buf();
                std::fs::write(dir.join("myid"), format!("{}\n", i + 1)).unwrap_or_else(|e| panic!("myid: {e}"));
                let cfg = format!(
                    "{COMMON_CFG}dataDir={}\nclientPort={client}\nclientPortAddress=127.0.0.1\n{members}",
                    dir.display()
                );
                std::fs::write(dir.join("zoo.cfg"), cfg).unwrap_or_else(|e| panic!("zoo.cfg: {e}"));
                ZkServer {
                    connect: format!("127.0.0.1:{client}"),
                    client_port: *client,
                    dir,
                    process: None,
                    _tmp: Some(tmp),
                }
            })
            .collect();
        let ensemble = Self::run(servers);
        eprintln!("zookeeper ensemble of {size} at {}", ensemble.connect());
        ensemble
    }

    /// An ensemble run from a server configuration made elsewhere (the chart's `zoo.cfg`), moved
    /// to loopback: every setting is kept but the places (data directories, ports, the members'
    /// addresses, which become 127.0.0.1 ports of this process's choosing). Answers it and each
    /// member's metrics port (Prometheus provider), if the configuration serves one.
    pub fn from_config(cfg: &str) -> (Ensemble, Vec<Option<u16>>) {
        let members: Vec<u32> =
            cfg.lines().filter_map(|l| l.strip_prefix("server.")?.split_once('=')?.0.parse().ok()).collect();
        assert!(!members.is_empty(), "the configuration names no server.N members:\n{cfg}");
        // Held until all are picked: no port twice (a member that cannot bind exits).
        let mut picked = free_ports(5 * members.len()).into_iter();
        let ports: Vec<[u16; 5]> =
            members.iter().map(|_| std::array::from_fn(|_| picked.next().unwrap_or_else(free_port))).collect();
        let address = |id: u32| {
            let i = members.iter().position(|m| *m == id).unwrap_or_else(|| panic!("no member {id}"));
            let [client, peer, election, ..] = ports[i];
            format!("127.0.0.1:{peer}:{election};127.0.0.1:{client}")
        };
        let metrics = cfg.contains("metricsProvider.className=");
        let mut servers = Vec::new();
        let mut metrics_ports = Vec::new();
        for (i, id) in members.iter().enumerate() {
            let [client, _, _, admin, metrics_port] = ports[i];
            let tmp = TempDir::new("zklock-cfg");
            let dir = tmp.path().to_path_buf();
            std::fs::write(dir.join("myid"), format!("{id}\n")).unwrap_or_else(|e| panic!("myid: {e}"));
            let mut out = String::new();
            for line in cfg.lines() {
                let (key, _) = line.split_once('=').unwrap_or((line, ""));
                let moved = match key.trim() {
                    "dataDir" => format!("dataDir={}", dir.display()),
                    "dataLogDir" => format!("dataLogDir={}/datalog", dir.display()),
                    "clientPort" => format!("clientPort={client}\nclientPortAddress=127.0.0.1"),
                    "admin.serverPort" => format!("admin.serverPort={admin}\nadmin.serverAddress=127.0.0.1"),
                    "metricsProvider.httpPort" => format!("metricsProvider.httpPort={metrics_port}"),
                    "metricsProvider.httpHost" => "metricsProvider.httpHost=127.0.0.1".to_string(),
                    "quorumListenOnAllIPs" => "quorumListenOnAllIPs=false".to_string(),
                    k if k.starts_with("server.") => {
                        let id: u32 = k["server.".len()..].parse().unwrap_or_else(|e| panic!("{line}: {e}"));
                        format!("server.{id}={}", address(id))
                    }
                    _ => line.to_string(),
                };
                out.push_str(&moved);
                out.push('\n');
            }
            std::fs::write(dir.join("zoo.cfg"), out).unwrap_or_else(|e| panic!("zoo.cfg: {e}"));
            metrics_ports.push(metrics.then_some(metrics_port));
            servers.push(ZkServer {
                connect: format!("127.0.0.1:{client}"),
                client_port: client,
                dir,
                process: None,
                _tmp: Some(tmp),
            });
        }
        let ensemble = Self::run(servers);
        eprintln!("zookeeper ensemble of {} from a given zoo.cfg at {}", members.len(), ensemble.connect());
        (ensemble, metrics_ports)
    }

    /// Starts the members, whose `zoo.cfg` and `myid` are written: all of them before waiting
    /// for any, since a member serves only once a quorum runs.
    fn run(mut servers: Vec<ZkServer>) -> Ensemble {
        for s in &mut servers {
            s.process = Some(spawn(&s.dir.join("zoo.cfg"), &s.dir.join("zookeeper.log")));
        }
        for s in &mut servers {
            wait_serving(&s.connect.clone(), s.process.as_mut(), &s.dir.join("zookeeper.log"));
        }
        Ensemble { servers }
    }

    pub fn connect(&self) -> String {
        self.servers.iter().map(|s| s.connect.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The index of the member that is the leader now, if any answers so.
    pub fn leader(&self) -> Option<usize> {
        self.servers.iter().position(|s| {
            s.process.is_some() && four_letter(&s.connect, "srvr").is_ok_and(|r| r.contains("Mode: leader"))
        })
    }
}

fn java_classpath() -> String {
    if !Path::new(ZOOKEEPER_JAR).exists() {
        panic!("ZooKeeper is not installed ({ZOOKEEPER_JAR} is missing): run `scripts/zookeeper.sh install`");
    }
    // Debian's zookeeper.jar names netty's transport and handler in its manifest but not the
    // codec and resolver that the Netty connection factory (TLS client ports) needs.
    format!("{ZOOKEEPER_CONF}:{ZOOKEEPER_JAR}:{NETTY_FOR_TLS}")
}

/// ZooKeeper's Prometheus metrics provider and its libraries (Debian packages none of them):
/// `scripts/zookeeper.sh install` puts them here.
fn metrics_classpath() -> String {
    let cache = std::env::var("ZKLOCK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/zklock"));
    let dir = cache.join("zookeeper-metrics-3.8.0");
    let jars: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jar"))
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    if !jars.iter().any(|j| j.contains("zookeeper-prometheus-metrics")) {
        panic!(
            "the configuration serves Prometheus metrics but {} lacks ZooKeeper's provider: run `scripts/zookeeper.sh install`",
            dir.display()
        );
    }
    jars.join(":")
}

/// Starts a server under a small shell watchdog that kills it when this process exits, so
/// that no test run leaves a ZooKeeper behind, whatever way it ends.
fn spawn(cfg: &Path, log: &Path) -> Child {
    let mut classpath = java_classpath();
    if std::fs::read_to_string(cfg).is_ok_and(|c| c.contains("metricsProvider.className=")) {
        classpath = format!("{classpath}:{}", metrics_classpath());
    }
    let script = format!(
        "java -Xmx256m -Dzookeeper.log.dir={dir} -cp '{classpath}' \
         org.apache.zookeeper.server.quorum.QuorumPeerMain '{cfg}' >>'{log}' 2>&1 & zk=$!; \
         trap 'kill -9 $zk 2>/dev/null' EXIT; trap 'kill -9 $zk 2>/dev/null; exit 0' TERM INT; \
         while kill -0 {parent} 2>/dev/null && kill -0 $zk 2>/dev/null; do sleep 0.2; done",
        dir = cfg.parent().map(|p| p.display().to_string()).unwrap_or_default(),
        cfg = cfg.display(),
        log = log.display(),
        parent = std::process::id(),
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start ZooKeeper (is Java 17 installed?): {e}"))
}

fn wait_serving(connect: &str, mut process: Option<&mut Child>, log: &Path) {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        // `srvr` answers only once the server serves requests (not while it is still electing).
        if four_letter(connect, "srvr").is_ok_and(|r| r.contains("Mode:")) {
            return;
        }
        if let Some(p) = process.as_deref_mut() {
            if let Ok(Some(status)) = p.try_wait() {
                // The log goes with its temporary directory: its end is in the message.
                let log = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!("ZooKeeper at {connect} exited during start-up ({status}); its log ends:\n{}", tail.join("\n"));
            }
        }
        if Instant::now() > deadline {
            panic!("ZooKeeper at {connect} did not start within {START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends a four-letter command and returns the answer.
pub fn four_letter(addr: &str, command: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(command.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    if answer.contains("not currently serving") || answer.is_empty() {
        return Err(std::io::Error::other(format!("not serving: {answer:?}")));
    }
    Ok(answer)
}

fn version_of(srvr: &str) -> String {
    srvr.lines()
        .find_map(|l| l.strip_prefix("Zookeeper version: "))
        .map(|v| v.split(['-', ',']).next().unwrap_or(v).to_string())
        .unwrap_or_else(|| "(unknown version)".into())
}

/// `n` distinct free loopback ports (each listener held until all are bound).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("no free loopback port: {e}")))
        .collect();
    held.iter().map(|l| l.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("no local address: {e}"))).collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// A directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
