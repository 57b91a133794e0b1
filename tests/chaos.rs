//! The chaos suite (docs/development.md, the chaos suite): three replicas of the real `zklock` binary with leader
//! election, a real three-server ZooKeeper ensemble, the API server under test (each replica
//! reaches it through a proxy of its own), and a workload of claims on a few locks (exclusive
//! and shared, acquire timeouts, holder pods deleted, revocations, claims that another party's
//! finalizer keeps and that are deleted while they wait; one lock a semaphore of two permits;
//! claims of the supersede group `chaos`, never superseded once they held; `zklock acquire`
//! and `zklock exec` clients), while faults are injected again and again.
//!
//! Safety faults: kill -9 of the leader, a hung API connection for the leader, one status write
//! of the leader held back past its timeout and delivered after newer writes, API latency
//! spikes, SIGSTOP of the leader for longer than its lease, a kill of the ZooKeeper leader, a
//! partition of the leader from ZooKeeper long enough to expire its session, the semaphore's
//! permits raised, lowered, its `Lock` deleted and made again, CLI clients killed with SIGTERM
//! or SIGKILL at random moments (their holder pods then go, as a dead pod's would), and a
//! foreign node without a sequence made and removed in a lock of its own (`f0`).
//!
//! Liveness faults: ZooKeeper cut off from the leader alone for four session timeouts (a
//! standby must take over), the epoch policy's parameter deleted, a claim's status edited by
//! somebody else (its leaderEpoch dropped), a directory the operator may not list made by
//! another ZooKeeper client, one non-status PATCH (a finalizer's) held past its timeout, and a
//! rolling restart of every replica with SIGTERM.
//!
//! Every status change is recorded from a watch and the whole history is checked (docs/design.md
//! §4), plus: no holder of the zklock-only locks ever turns Lost, no znode of a gone claim
//! remains, every claim ends Held or final, no claim a killed client left holds once its pod has
//! gone, and the longest stall (a claim non-final while its lock is free in ZooKeeper or its
//! blockers gone, sampled every second) stays within lease duration + session timeout + 5 s.
//! That bound is one fault's: a fault comes only once the one before is over (a leader serves
//! and no claim waits that could be served); the summary counts the faults held back for it.
//!
//! A second cluster (a control plane of this process, two replicas, the same ensemble) shares a
//! `ClusterLock` with the first: its own workers queue for it only, the first cluster's now and
//! then; its leader is killed or cut off from ZooKeeper now and then too. Its history is
//! checked as the first's, and the fencing tokens of that lock's grants in both clusters must
//! grow in the order they were granted. Exclusion across the two clusters' statuses is not
//! judged here: with sessions shorter than a takeover (4 s, for the partitions), a killed
//! leader's holder reads Held until its next leader ends it Lost, after the other cluster was
//! granted; `tests/operator/clusters.rs` judges it with sessions that outlast a takeover.
//!
//! Both clusters also run gated pods (a scheduling gate the operator removes on grant): a pod
//! seen ungated while its claim had no Held record, or after its claim ended, counts as a
//! violation (`pods_started_without_held`). The second cluster's faults include cutting every
//! one of its replicas off from ZooKeeper while their API stays reachable. The merged history
//! of the `ClusterLock` in both clusters is measured for two holders at once
//! (`longest_overlap_of_two_holders`), told apart from an overlap right after a leader's death
//! (its holder reads Held until the next leader ends it; docs/operations.md asks for sessions
//! that outlast a takeover where clusters share locks); in the `chart` profile it must be 0.
//!
//! `ZKLOCK_CHAOS_PROFILE` picks the timings: `fast` (default: 4 s sessions) or `chart` (the
//! chart's defaults: 10 s sessions, 10 s lease, a SIGTERM'd replica killed after 30 s).
//! `ZKLOCK_CHAOS_MINUTES` sets the length (default 3, the test command's run); it prints one
//! summary line starting with `chaos:`. 30-minute runs:
//! `ZKLOCK_CHAOS_MINUTES=30 cargo test --release --test chaos -- --nocapture`, and the same with
//! `ZKLOCK_CHAOS_PROFILE=chart`.

mod e2e_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e_support::*;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use zklock::api::{Lock, LockClaim, Phase};
use zklock_testkit::api_proxy::{ApiProxy, Matcher};
use zklock_testkit::proxy::Proxy;
use zklock_testkit::Ensemble;

const REPLICAS: usize = 3;
const LOCKS: [&str; 6] = ["x0", "x1", "x2", "s0", "p0", "f0"];
/// The lock a foreign client (a sequence-less node) uses now and then: a session loss may
/// end its holders Lost (docs/design.md: re-anchoring), so it is left out of the "never Lost" check.
const FOREIGN_LOCK: &str = "f0";
/// The locks claims over several locks take (the zklock-only ones).
const SEVERAL: [&str; 5] = ["x0", "x1", "x2", "s0", "p0"];
/// `p0` has a `Lock` object: a semaphore of this many permits.
const PERMITS: usize = 2;
const WORKERS: usize = 6;
/// The timings the operators run with (`ZKLOCK_CHAOS_PROFILE`): `fast` (the default, the test
/// command's run), or `chart`, the chart's defaults (session 10 s, lease 10 s, 30 s between a
/// SIGTERM and a kill).
#[derive(Clone, Copy, Debug)]
struct Profile {
    name: &'static str,
    /// The operators' ZooKeeper session timeout.
    session: Duration,
    /// How long a SIGTERM'd replica has before it is killed (the pod's termination grace).
    stop_grace: Duration,
}

fn profile() -> Profile {
    static PROFILE: std::sync::OnceLock<Profile> = std::sync::OnceLock::new();
    *PROFILE.get_or_init(|| match std::env::var("ZKLOCK_CHAOS_PROFILE").as_deref() {
        Ok("chart") => Profile { name: "chart", session: Duration::from_secs(10), stop_grace: Duration::from_secs(30) },
        Ok("fast") | Err(_) => Profile { name: "fast", session: Duration::from_secs(4), stop_grace: LIVENESS },
        Ok(other) => panic!("ZKLOCK_CHAOS_PROFILE={other}: use fast or chart"),
    })
}

/// The operators' ZooKeeper session timeout: in the fast profile short, so that a partition
/// expires it quickly.
fn session_timeout() -> Duration {
    profile().session
}
/// How long a stopped or hung leader stays so: longer than its lease (10 s).
const OUTAGE: Duration = Duration::from_secs(12);
/// A claim not Held or final after this long waits forever, as far as the suite is concerned.
const LIVENESS: Duration = Duration::from_secs(90);
/// The longest a claim may stay non-final while its lock is free in ZooKeeper, or its blocker
/// gone (docs/development.md, the chaos suite): lease duration + session timeout + 5 s.
fn stall_bound() -> Duration {
    zklock::leader::LEASE_DURATION + session_timeout() + Duration::from_secs(5)
}
/// The finalizer of another party some of the workload's claims carry (deleted while they wait).
const OTHER_FINALIZER: &str = "chaos.zklock.io/keep";
/// The root the two clusters share their `ClusterLock` on (docs/design.md: ClusterLocks).
const SHARED_ROOT: &str = "/shared";
/// The second cluster: its replicas and its workers (each on the shared `ClusterLock` only).
const B_REPLICAS: usize = 2;
const B_WORKERS: usize = 2;
/// Of a hundred claims of the first cluster's workers, how many take the shared `ClusterLock`.
const CLUSTER_LOCK_PERCENT: u64 = 10;
/// Of a hundred claims of one lock, how many carry the supersede group `chaos` (newest wins).
const SUPERSEDE_PERCENT: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Fault {
    Kill9,
    ApiHang,
    /// One status write of the leader held back past its timeout, delivered after newer ones.
    ApiLateWrite,
    /// Every API request of the leader slowed down for a while.
    ApiLatency,
    SigStop,
    ZkLeaderKill,
    ZkPartition,
    /// The semaphore's permits raised, lowered, or its `Lock` deleted and made again.
    Permits,
    /// A sequence-less node of a foreign client made and removed in lock f0.
    ForeignNode,
    /// ZooKeeper cut off from the leader only, its API path fine, for four session timeouts:
    /// it must give its term up, and a standby that reaches ZooKeeper take over.
    ZkCut,
    /// The epoch policy's parameter (a ConfigMap) deleted.
    EpochParamDeleted,
    /// A claim's status edited by somebody else: its leaderEpoch dropped.
    StatusEdit,
    /// A directory another ZooKeeper client made where the operator may not even list it.
    UnreadableDir,
    /// One non-status PATCH of a claim (a finalizer's) held past the leader's timeout.
    FinalizerHang,
    /// Every replica stopped with SIGTERM and started again, one after the other, the leader
    /// last (a rollout).
    RollingRestart,
    /// Every replica of the second cluster cut off from ZooKeeper, its API path fine, for two
    /// session timeouts: its ClusterLock holder must be ended before the first cluster is
    /// granted.
    ZkCutCluster,
}

/// In this order first (a 3-minute run meets about the first nine), then at random.
const FAULTS: [Fault; 15] = [
    Fault::Kill9,
    Fault::ZkCut,
    Fault::ApiLateWrite,
    Fault::EpochParamDeleted,
    Fault::SigStop,
    Fault::StatusEdit,
    Fault::FinalizerHang,
    Fault::RollingRestart,
    Fault::UnreadableDir,
    Fault::ApiHang,
    Fault::ZkPartition,
    Fault::ZkLeaderKill,
    Fault::Permits,
    Fault::ForeignNode,
    Fault::ApiLatency,
];

/// One replica and the means to cut it off.
struct Replica {
    operator: Operator,
    api: ApiProxy,
    /// One proxy per ensemble member.
    zk: Vec<Proxy>,
}

/// A small deterministic generator: the run is reproducible from its seed (printed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    let minutes: f64 = std::env::var("ZKLOCK_CHAOS_MINUTES").ok().and_then(|m| m.parse().ok()).unwrap_or(3.0);
    let seed: u64 = std::env::var("ZKLOCK_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1
    });
    eprintln!("chaos: {minutes} minutes, seed {seed} (ZKLOCK_CHAOS_SEED to repeat)");
    let started = Instant::now();
    let run_for = Duration::from_secs_f64(minutes * 60.0);

    let mut ensemble = Ensemble::start(3);
    let chroot_connect = ensemble.servers[0].chroot().await;
    let chroot = chroot_connect[chroot_connect.find('/').expect("a chroot")..].to_string();
    let env = Arc::new(Env::with_zk(format!("{}{chroot}", ensemble.connect())).await);
    let mut replicas = vec![];
    for _ in 0..REPLICAS {
        let api = ApiProxy::start(&env.kubeconfig).await;
        let mut zk = vec![];
        for server in &ensemble.servers {
            zk.push(Proxy::start(server.addr()).await);
        }
        let connect = zk.iter().map(|p| p.connect_string("")).collect::<Vec<_>>().join(",") + &chroot;
        let timeout = format!("{}s", session_timeout().as_secs());
        let args = ["--zk-session-timeout", &timeout, "--zk-cluster-root", SHARED_ROOT, "--cluster-name", "a"];
        let operator = Operator::start_proxied_with_zk(&env, &api, &connect, &args);
        replicas.push(Replica { operator, api, zk });
    }
    // The second cluster: a control plane of this process, its own root, the same ensemble; a
    // ClusterLock both clusters' claims queue for.
    let env_b = Arc::new(
        Env::on(
            zklock_testkit::kube::private_control_plane("chaos-b"),
            format!("{}{chroot}", ensemble.connect()),
            true,
        )
        .await,
    );
    let cluster_lock = format!("c0-{}", &env.ns["zklock-e2e-".len()..]);
    let cluster_label = format!("cluster/{cluster_lock}");
    let _cluster_locks = [
        TestClusterLock::make(&env, &cluster_lock, TestClusterLock::admitting(&env.ns)).await,
        TestClusterLock::make(&env_b, &cluster_lock, TestClusterLock::admitting(&env_b.ns)).await,
    ];
    let mut replicas_b = vec![];
    for _ in 0..B_REPLICAS {
        let api = ApiProxy::start(&env_b.kubeconfig).await;
        let mut zk = vec![];
        for server in &ensemble.servers {
            zk.push(Proxy::start(server.addr()).await);
        }
        let connect = zk.iter().map(|p| p.connect_string("")).collect::<Vec<_>>().join(",") + &chroot;
        let timeout = format!("{}s", session_timeout().as_secs());
        let args = [
            "--zk-session-timeout",
            &timeout,
            "--zk-root",
            "/b",
            "--zk-cluster-root",
            SHARED_ROOT,
            "--cluster-name",
            "b",
        ];
        let operator = Operator::start_proxied_with_zk(&env_b, &api, &connect, &args);
        replicas_b.push(Replica { operator, api, zk });
    }
    within("a replica to lead", async {
        while leader(&replicas).await.is_none() || leader(&replicas_b).await.is_none() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let locks: kube::Api<Lock> = kube::Api::namespaced(env.client.clone(), &env.ns);
    env.history.set_permits("p0", PERMITS);
    locks.create(&PostParams::default(), &semaphore(PERMITS)).await.expect("create the Lock of p0");

    // The liveness figure, sampled from ZooKeeper and the history until every claim settled.
    let stop_sampling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stalled_now = Arc::new(AtomicUsize::new(0));
    let sampler = tokio::spawn(sample_stalls(
        format!("{}{chroot}", ensemble.connect()),
        env.ns.clone(),
        env.history.clone(),
        stop_sampling.clone(),
        stalled_now.clone(),
    ));

    // The workload, until the deadline.
    let deadline = started + run_for;
    let claims_made = Arc::new(AtomicUsize::new(0));
    let clients = Arc::new(Clients::default());
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let (env, claims_made, cluster_lock) = (env.clone(), claims_made.clone(), cluster_lock.clone());
        let seed = seed.wrapping_add(w as u64 * 7919) | 1;
        workers.spawn(async move { work(&env, w, Rng(seed), deadline, &claims_made, &cluster_lock).await });
    }
    for w in 0..B_WORKERS {
        let (env_b, claims_made, cluster_lock) = (env_b.clone(), claims_made.clone(), cluster_lock.clone());
        let seed = seed.wrapping_add(7 + w as u64 * 6007) | 1;
        workers.spawn(async move { work_b(&env_b, w, Rng(seed), deadline, &claims_made, &cluster_lock).await });
    }
    // The second cluster's faults, beside the first's: its leader killed, or cut off from
    // ZooKeeper long enough for its session to expire.
    // When a leader of either cluster died (kill -9, SIGSTOP past its lease): its ClusterLock
    // holder reads Held until the next leader ends it, and the other cluster may be granted
    // once its session expired meanwhile (docs/operations.md: sessions that outlast a
    // takeover), so an overlap right after one is told apart.
    let a_deaths: Arc<std::sync::Mutex<Vec<Instant>>> = Default::default();
    let b_deaths: Arc<std::sync::Mutex<Vec<Instant>>> = Default::default();
    // Gated pods in both clusters, and when each was seen ungated.
    let ungated: [Ungated; 2] = Default::default();
    for (c, env) in [env.clone(), env_b.clone()].into_iter().enumerate() {
        let (claims_made, ungated) = (claims_made.clone(), ungated[c].clone());
        let seed = seed.wrapping_add(53 + c as u64 * 911) | 1;
        workers.spawn(async move { gated_work(&env, c, Rng(seed), deadline, &claims_made, &ungated).await });
    }
    let b_faults = {
        let b_deaths = b_deaths.clone();
        let seed = seed.wrapping_add(31) | 1;
        tokio::spawn(async move {
            let mut rng = Rng(seed);
            let mut injected = 0usize;
            while Instant::now() + OUTAGE < deadline {
                tokio::time::sleep(Duration::from_secs(8 + rng.below(12))).await;
                let Some(i) = leader(&replicas_b).await else { continue };
                let fault = [Fault::Kill9, Fault::ZkPartition, Fault::ZkCutCluster][rng.below(3) as usize];
                eprintln!("chaos: {:>6.1}s cluster b: {fault:?} on replica {i}", started.elapsed().as_secs_f64());
                match fault {
                    Fault::Kill9 => {
                        b_deaths.lock().unwrap().push(Instant::now());
                        replicas_b[i].operator.restart()
                    }
                    Fault::ZkCutCluster => {
                        for proxy in replicas_b.iter().flat_map(|r| &r.zk) {
                            proxy.set_blackhole(true);
                        }
                        tokio::time::sleep(session_timeout() * 2).await;
                        for proxy in replicas_b.iter().flat_map(|r| &r.zk) {
                            proxy.set_blackhole(false);
                        }
                    }
                    _ => {
                        for proxy in &replicas_b[i].zk {
                            proxy.set_blackhole(true);
                        }
                        tokio::time::sleep(session_timeout() * 2).await;
                        for proxy in &replicas_b[i].zk {
                            proxy.set_blackhole(false);
                        }
                    }
                }
                injected += 1;
            }
            (replicas_b, injected)
        })
    };
    {
        let (env, clients) = (env.clone(), clients.clone());
        let seed = seed.wrapping_add(104_729) | 1;
        workers.spawn(async move { cli_work(&env, Rng(seed), deadline, &clients).await });
    }

    // The faults, one at a time, each kind in turn first, then at random.
    let mut rng = Rng(seed);
    let mut injected: BTreeMap<Fault, usize> = BTreeMap::new();
    // p0's permits now, or `None` while its `Lock` is deleted.
    let mut permits = Some(PERMITS);
    let mut n = 0;
    // Faults that waited over a second for the one before to be over.
    let mut faults_held_back = 0usize;
    while Instant::now() + OUTAGE < deadline {
        tokio::time::sleep(Duration::from_secs(5 + rng.below(10))).await;
        let fault = if n < FAULTS.len() { FAULTS[n] } else { FAULTS[rng.below(FAULTS.len() as u64) as usize] };
        n += 1;
        // One fault at a time: the next comes once the last one is over, that is once a leader
        // serves (ready: its session re-anchored) and no claim that could be served waits. The
        // stall bound is that of one fault; a fault on a leader still taking over (a kill's
        // lease, then a cut 1 s into the new term) stalls for the two added together.
        let waited = Instant::now();
        let i = within("a replica to lead and serve, and no claim to stall", async {
            loop {
                if let Some(i) = leader(&replicas).await {
                    if replicas[i].operator.ready().await && stalled_now.load(Ordering::SeqCst) == 0 {
                        return i;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        let held_back = waited.elapsed();
        if held_back > Duration::from_secs(1) {
            faults_held_back += 1;
        }
        eprintln!(
            "chaos: {:>6.1}s {fault:?} on replica {i} (held back {:.1}s for the last fault to be over)",
            started.elapsed().as_secs_f64(),
            held_back.as_secs_f64()
        );
        if matches!(fault, Fault::Kill9 | Fault::SigStop) {
            a_deaths.lock().unwrap().push(Instant::now());
        }
        if fault == Fault::RollingRestart {
            rolling_restart(&mut replicas, i).await;
        } else {
            let mut chaos = Chaos {
                env: &env,
                locks: &locks,
                ensemble: &mut ensemble,
                rng: &mut rng,
                permits: &mut permits,
                chroot: &chroot,
                n,
            };
            inject(fault, &mut replicas[i], &mut chaos).await;
        }
        *injected.entry(fault).or_default() += 1;
    }
    while let Some(done) = workers.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let (replicas_b, b_injected) = b_faults.await.expect("the second cluster's faults");
    let minutes_run = started.elapsed().as_secs_f64() / 60.0;

    // Every claim ends Held or final; then all go, and so must their znodes.
    let all = env.claims.list(&ListParams::default()).await.expect("list claims");
    let mut stuck = vec![];
    for claim in &all.items {
        let name = claim.metadata.name.clone().unwrap_or_default();
        // Gone counts as settled: a claim its worker deleted last may leave while it is awaited.
        let settled = kube::runtime::wait::await_condition(env.claims.clone(), &name, |c: Option<&LockClaim>| {
            c.is_none_or(held_or_final)
        });
        if !matches!(tokio::time::timeout(LIVENESS, settled).await, Ok(Ok(_))) {
            stuck.push(name);
        }
    }
    let all_b = env_b.claims.list(&ListParams::default()).await.expect("list cluster b's claims");
    for claim in &all_b.items {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let settled = kube::runtime::wait::await_condition(env_b.claims.clone(), &name, |c: Option<&LockClaim>| {
            c.is_none_or(held_or_final)
        });
        if !matches!(tokio::time::timeout(LIVENESS, settled).await, Ok(Ok(_))) {
            stuck.push(format!("b/{name}"));
        }
    }
    stop_sampling.store(true, Ordering::SeqCst);
    let stalls = sampler.await.expect("the stall sampler");
    for (env, all) in [(&env, &all), (&env_b, &all_b)] {
        for claim in &all.items {
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            let _ = env.claims.delete(name, &DeleteParams::default()).await;
        }
        for claim in &all.items {
            env.wait_gone(claim.metadata.name.as_deref().unwrap_or_default()).await;
        }
    }
    let leaked = leaked_znodes(&ensemble, &chroot, &env.ns, &cluster_lock).await;

    let records = env.history.records();
    let names: HashSet<&str> = records.iter().map(|r| r.name.as_str()).collect();
    let grants = records.iter().filter(|r| r.phase == Some(Phase::Held)).map(|r| &r.uid).collect::<HashSet<_>>().len();
    // Holders of the shared ClusterLock may end Lost: a leader killed or cut off longer than
    // its session (4 s here, shorter than a takeover) lets the other cluster be granted.
    let lost: Vec<&str> = records
        .iter()
        .filter(|r| r.phase == Some(Phase::Lost) && r.lock != FOREIGN_LOCK && r.lock != cluster_label)
        .map(|r| r.name.as_str())
        .collect();
    let records_b = env_b.history.records();
    let cluster_grants = grants_in_order(&records, &records_b, &cluster_label);
    let token_violations: Vec<String> = cluster_grants
        .windows(2)
        .filter(|w| w[1].1 <= w[0].1)
        .map(|w| format!("{} ({}) after {} ({})", w[1].0, w[1].1, w[0].0, w[0].1))
        .collect();
    let checked_b = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| env_b.history.check()));
    let deaths = [a_deaths.lock().unwrap().clone(), b_deaths.lock().unwrap().clone()];
    let overlap = merged_overlap(&records, &records_b, &cluster_label, &deaths);
    let mut pods_ungated = 0;
    let mut started_without_held = vec![];
    for (c, history) in [&records, &records_b].into_iter().enumerate() {
        for (pod, at) in ungated[c].lock().unwrap().iter() {
            pods_ungated += 1;
            if let Some(why) = started_without_a_hold(history, pod, *at) {
                started_without_held.push(format!("{}/{pod}: {why}", ['a', 'b'][c]));
            }
        }
    }
    let lost_foreign = records.iter().filter(|r| r.phase == Some(Phase::Lost) && r.lock == FOREIGN_LOCK).count();
    let mut locks_of: HashMap<&str, HashSet<&str>> = HashMap::new();
    for r in &records {
        locks_of.entry(r.uid.as_str()).or_default().insert(r.lock.as_str());
    }
    let over_several = locks_of.values().filter(|l| l.len() > 1).count();
    // Newest wins ends waiters only: a claim that held is never superseded.
    let superseded: Vec<&str> =
        records.iter().filter(|r| r.phase == Some(Phase::Superseded)).map(|r| r.uid.as_str()).collect();
    let superseded_after_held: Vec<&str> = superseded
        .iter()
        .copied()
        .filter(|uid| records.iter().any(|r| r.uid == *uid && r.phase == Some(Phase::Held)))
        .collect();
    let clients_left_holding = clients.left_holding.lock().unwrap().clone();
    let history = env.history.clone();
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| history.check()));
    let violations = usize::from(checked.is_err())
        + usize::from(checked_b.is_err())
        + token_violations.len()
        + lost.len()
        + stuck.len()
        + clients_left_holding.len()
        + started_without_held.len()
        + superseded_after_held.len()
        + usize::from(profile().name == "chart" && overlap.unexcused > Duration::ZERO);
    let faults: Vec<String> = injected.iter().map(|(f, n)| format!("{f:?}={n}")).collect();
    let semaphore_most = env.history.most_held_at_once("p0");
    let behind_gone = longest_wait_behind_gone_holder(&env.history, started);
    let (cli_runs, cli_killed) = (clients.runs.load(Ordering::SeqCst), clients.killed.load(Ordering::SeqCst));
    eprintln!(
        "chaos: minutes={minutes_run:.1} faults: {} faults_held_back={faults_held_back} CliKilled={cli_killed} \
         claims={} grants={grants} transitions={} \
         violations={violations} leaked_znodes={} longest_stall={:.1}s ({}; bound {:?}) \
         longest_wait_behind_gone_holder={:.1}s ({}) p0_most_held_at_once={semaphore_most} cli_clients={cli_runs} \
         f0_lost={lost_foreign} claims_over_several_locks={over_several} cluster_b_claims={} cluster_b_faults={b_injected} \
         cluster_lock_grants={} (a {}, b {}) profile={} longest_overlap_of_two_holders={:.1}s \
         (after a leader's death {:.1}s{}) pods_ungated={pods_ungated} pods_started_without_held={} superseded={} \
         superseded_after_held={}",
        faults.join(" "),
        names.len(),
        records.len(),
        leaked.len(),
        stalls.longest.as_secs_f64(),
        stalls.which,
        stall_bound(),
        behind_gone.0.as_secs_f64(),
        behind_gone.1,
        records_b.iter().map(|r| r.uid.as_str()).collect::<HashSet<_>>().len(),
        cluster_grants.len(),
        cluster_grants.iter().filter(|g| g.2 == 'a').count(),
        cluster_grants.iter().filter(|g| g.2 == 'b').count(),
        profile().name,
        overlap.unexcused.as_secs_f64(),
        overlap.after_death.as_secs_f64(),
        overlap.which.as_deref().map(|w| format!("; {w}")).unwrap_or_default(),
        started_without_held.len(),
        superseded.len(),
        superseded_after_held.len(),
    );
    eprintln!("chaos: claims made by the workload: {}", claims_made.load(Ordering::SeqCst));
    let logs: Vec<String> = replicas.iter().chain(&replicas_b).map(|r| r.operator.log.display().to_string()).collect();
    eprintln!("chaos: operator logs {logs:?}");
    // The verdict, then the replicas stopped (their logs stay in their files), then a last line
    // that says why: the end of the output is what a CI log shows.
    let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if let Err(e) = checked {
            std::panic::resume_unwind(e);
        }
        if let Err(e) = checked_b {
            std::panic::resume_unwind(e);
        }
        assert!(
            token_violations.is_empty(),
            "fencing tokens of {cluster_label} did not grow across the two clusters: {token_violations:?}"
        );
        if !lost.is_empty() {
            // Each such claim's whole record, with the leader terms that wrote it, for the diagnosis.
            let of_lost: Vec<&e2e_support::Record> =
                records.iter().filter(|r| lost.contains(&r.name.as_str())).collect();
            eprintln!("chaos: the records of the claims that turned Lost: {of_lost:#?}");
        }
        assert!(lost.is_empty(), "holders of zklock-only locks turned Lost: {lost:?}");
        assert!(started_without_held.is_empty(), "gated pods started without a Held claim: {started_without_held:?}");
        assert!(superseded_after_held.is_empty(), "claims superseded after they held: {superseded_after_held:?}");
        assert!(pods_ungated > 0, "gated pods were started");
        if profile().name == "chart" {
            assert_eq!(
                overlap.unexcused,
                Duration::ZERO,
                "two holders of {cluster_label} at once in the merged history: {:?}",
                overlap.which
            );
        }
        assert!(
            clients_left_holding.is_empty(),
            "claims of killed clients held after their pod went: {clients_left_holding:?}"
        );
        assert!(stuck.is_empty(), "claims neither Held nor final after {LIVENESS:?}: {stuck:?}");
        assert!(
            stalls.longest <= stall_bound(),
            "a claim stayed non-final for {:?} while it could be served ({}): more than {:?}",
            stalls.longest,
            stalls.which,
            stall_bound()
        );
        assert!(leaked.is_empty(), "znodes left behind: {leaked:?}");
        assert!(semaphore_most >= PERMITS, "p0, a semaphore of {PERMITS} permits, never had that many holders at once");
        assert!(cli_runs > 0, "the CLI clients ran");
        assert!(over_several > 0, "claims over several locks were made");
        for cluster in ['a', 'b'] {
            assert!(cluster_grants.iter().any(|g| g.2 == cluster), "cluster {cluster} was granted {cluster_label}");
        }
        assert_eq!(injected.values().sum::<usize>(), n, "every fault was injected");
    }));
    drop((replicas, replicas_b));
    if let Err(e) = verdict {
        let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
        // A history check's message carries the history: its head says what failed.
        let why: String = why.unwrap_or_default().chars().take(2000).collect();
        eprintln!(
            "chaos: FAILED with seed {seed} (ZKLOCK_CHAOS_SEED={seed} repeats it; operator logs {logs:?}): {why}"
        );
        std::panic::resume_unwind(e);
    }
}

/// Each grant of `lock` in either cluster (the first Held record of each claim), in the order
/// the test saw them: (claim, fencing token, cluster).
fn grants_in_order(a: &[Record], b: &[Record], lock: &str) -> Vec<(String, u64, char)> {
    let mut grants: Vec<(Instant, String, u64, char)> = vec![];
    for (records, cluster) in [(a, 'a'), (b, 'b')] {
        let mut seen = HashSet::new();
        for r in records.iter().filter(|r| r.lock == lock && r.phase == Some(Phase::Held)) {
            let token = r.fencing.as_deref().and_then(|t| t.parse().ok()).unwrap_or(0);
            if seen.insert(r.uid.clone()) {
                grants.push((r.at, format!("{cluster}/{}", r.name), token, cluster));
            }
        }
    }
    grants.sort_by_key(|g| g.0);
    grants.into_iter().map(|(_, name, token, cluster)| (name, token, cluster)).collect()
}

/// The second cluster's workers: claim after claim on the shared `ClusterLock`, held a moment
/// and deleted; now and then one that gives up after two seconds.
async fn work_b(env: &Env, worker: usize, mut rng: Rng, deadline: Instant, made: &AtomicUsize, cluster_lock: &str) {
    let mut i = 0;
    while Instant::now() < deadline {
        i += 1;
        let name = format!("b{worker}-{i}");
        let mut spec = json!({ "clusterLockName": cluster_lock });
        if rng.below(4) == 0 {
            spec["acquireTimeoutSeconds"] = json!(2);
        }
        env.claim_spec(&name, spec).await;
        made.fetch_add(1, Ordering::SeqCst);
        let claim = env.wait(&name, "Held or final", held_or_final).await;
        if phase_of(&claim) == Some(Phase::Held) {
            tokio::time::sleep(Duration::from_millis(50 + rng.below(300))).await;
        }
        let _ = env.claims.delete(&name, &DeleteParams::default()).await;
        tokio::time::sleep(Duration::from_millis(rng.below(1000))).await;
    }
}

fn held_or_final(c: &LockClaim) -> bool {
    phase_of(c).is_some_and(|p| p == Phase::Held || p.is_terminal())
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIVENESS, f).await.unwrap_or_else(|_| panic!("timed out after {LIVENESS:?}: {what}"))
}

/// The replica that says it leads, if one does.
async fn leader(replicas: &[Replica]) -> Option<usize> {
    for (i, r) in replicas.iter().enumerate() {
        if r.operator.metric("zklock_leader").await == 1.0 {
            return Some(i);
        }
    }
    None
}

/// What a fault may change besides the replica it hits.
struct Chaos<'a> {
    env: &'a Env,
    locks: &'a kube::Api<Lock>,
    ensemble: &'a mut Ensemble,
    rng: &'a mut Rng,
    permits: &'a mut Option<usize>,
    chroot: &'a str,
    /// The fault's number in the run.
    n: usize,
}

async fn inject(fault: Fault, replica: &mut Replica, chaos: &mut Chaos<'_>) {
    match fault {
        Fault::Kill9 => replica.operator.restart(),
        Fault::ApiHang => {
            replica.api.set_hung(true);
            tokio::time::sleep(OUTAGE).await;
            replica.api.set_hung(false);
        }
        Fault::ApiLateWrite => {
            // The leader's next status write is held past its timeout (the leader goes on and
            // writes newer ones), then delivered: it must be refused.
            let path = format!("/namespaces/{}/lockclaims/", chaos.env.ns);
            let held = replica.api.hold_next(Matcher { method: "PATCH", path_contains: path, status: None });
            if held.caught(OUTAGE).await {
                tokio::time::sleep(OUTAGE).await;
            }
            let answer = held.deliver(LIVENESS).await;
            eprintln!("chaos: the late write was answered {answer:?}");
        }
        Fault::ApiLatency => {
            let latency = Duration::from_millis(200 + chaos.rng.below(1300));
            replica.api.set_latency(latency);
            tokio::time::sleep(OUTAGE).await;
            replica.api.set_latency(Duration::ZERO);
        }
        Fault::SigStop => {
            replica.operator.pause();
            tokio::time::sleep(OUTAGE).await;
            replica.operator.resume();
        }
        Fault::ZkLeaderKill => {
            if let Some(leader) = chaos.ensemble.leader() {
                chaos.ensemble.servers[leader].kill();
                tokio::time::sleep(Duration::from_secs(2)).await;
                chaos.ensemble.servers[leader].resume();
            }
        }
        Fault::ZkPartition => {
            for proxy in &replica.zk {
                proxy.set_blackhole(true);
            }
            // The client gives the session up after 7/5 of its timeout; the server sooner.
            tokio::time::sleep(session_timeout() * 2).await;
            for proxy in &replica.zk {
                proxy.set_blackhole(false);
            }
        }
        Fault::Permits => change_permits(chaos).await,
        Fault::ZkCut => {
            for proxy in &replica.zk {
                proxy.set_blackhole(true);
            }
            tokio::time::sleep(session_timeout() * 4).await;
            for proxy in &replica.zk {
                proxy.set_blackhole(false);
            }
        }
        Fault::EpochParamDeleted => {
            let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                kube::Api::namespaced(chaos.env.client.clone(), &chaos.env.ns);
            let deleted = configmaps.delete(zklock::api::epoch_policy::EPOCH_PARAM, &DeleteParams::default()).await;
            eprintln!("chaos: the epoch parameter deleted: {:?}", deleted.map(|_| ()));
        }
        Fault::StatusEdit => {
            let all = chaos.env.claims.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
            let live: Vec<&LockClaim> = all
                .iter()
                .filter(|c| c.status.as_ref().is_some_and(|s| s.leader_epoch.is_some()))
                .filter(|c| !phase_of(c).is_some_and(Phase::is_terminal))
                .collect();
            if !live.is_empty() {
                let claim = live[chaos.rng.below(live.len() as u64) as usize];
                let name = claim.metadata.name.clone().unwrap_or_default();
                let edit: json_patch::Patch =
                    serde_json::from_value(json!([{ "op": "remove", "path": "/status/leaderEpoch" }])).unwrap();
                let edited =
                    chaos.env.claims.patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(edit)).await;
                eprintln!("chaos: {name}'s leaderEpoch dropped by hand: {:?}", edited.map(|_| ()));
            }
        }
        Fault::UnreadableDir => {
            let stranger = zookeeper_client::Client::connector()
                .with_auth("digest", b"stranger:secret")
                .connect(&format!("{}{}", chaos.ensemble.connect(), chaos.chroot))
                .await
                .expect("connect to ZooKeeper");
            let dir = format!("/zklock/locks/{}/stranger-{}", chaos.env.ns, chaos.n);
            let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::creator_all());
            let made = stranger.create(&dir, b"", &options).await;
            eprintln!("chaos: {dir} made readable by its creator only: {:?}", made.map(|_| ()));
        }
        Fault::FinalizerHang => {
            // The leader's next non-status PATCH of a claim (a finalizer's removal, mostly).
            let path = format!("/namespaces/{}/lockclaims/", chaos.env.ns);
            let held = replica.api.hold_next(Matcher { method: "PATCH", path_contains: path, status: Some(false) });
            if held.caught(OUTAGE).await {
                tokio::time::sleep(OUTAGE).await;
            }
            let answer = held.deliver(LIVENESS).await;
            eprintln!("chaos: the held finalizer patch was answered {answer:?}");
        }
        Fault::RollingRestart => unreachable!("handled with every replica: see rolling_restart"),
        Fault::ZkCutCluster => unreachable!("the second cluster's: see b_faults"),
        Fault::ForeignNode => {
            // kazoo's Semaphore lease looks like this: a plain child, holding ahead of everybody.
            let client = zookeeper_client::Client::connect(&chaos.env.zk).await.expect("connect to ZooKeeper");
            let dir = format!("/zklock/locks/{}/{FOREIGN_LOCK}", chaos.env.ns);
            let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
            let _ = client.mkdir(&dir, &options).await;
            let lease = format!("{dir}/foreign-lease");
            let ephemeral = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
            client.create(&lease, b"", &ephemeral).await.expect("make the foreign node");
            tokio::time::sleep(Duration::from_secs(2 + chaos.rng.below(5))).await;
            client.delete(&lease, None).await.expect("remove the foreign node");
        }
    }
}

/// A rollout: every replica stopped with SIGTERM and started again, one after the other, each
/// waited for until it is ready again; the leader (`leader`) last.
async fn rolling_restart(replicas: &mut [Replica], leader: usize) {
    let order = (0..replicas.len()).filter(|i| *i != leader).chain([leader]);
    for i in order {
        // As the kubelet does: killed once the termination grace is over.
        let stopped = replicas[i].operator.terminate_within(profile().stop_grace);
        assert!(stopped.is_some(), "replica {i} did not stop within {:?} of its SIGTERM", profile().stop_grace);
        replicas[i].operator.restart();
        let operator = &replicas[i].operator;
        within("a restarted replica to be ready", async {
            while !operator.ready().await {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
    }
}

/// p0's permits raised, lowered, or its `Lock` deleted and made again. The history checker is
/// told of a raise before it, of a lower limit once the Lock's status shows it in force, and of
/// a deletion (a mutex: one exclusive holder) a moment after it (the leader's watch sees it).
async fn change_permits(chaos: &mut Chaos<'_>) {
    let history = &chaos.env.history;
    match (*chaos.permits, chaos.rng.below(3)) {
        (None, _) => {
            history.set_permits("p0", PERMITS);
            chaos.locks.create(&PostParams::default(), &semaphore(PERMITS)).await.expect("make p0's Lock again");
            *chaos.permits = Some(PERMITS);
        }
        (Some(_), 0) => {
            chaos.locks.delete("p0", &DeleteParams::default()).await.expect("delete p0's Lock");
            tokio::time::sleep(Duration::from_secs(3)).await;
            history.set_permits("p0", 1);
            *chaos.permits = None;
        }
        (Some(now), _) => {
            let to = if now > 1 && chaos.rng.below(2) == 0 { now - 1 } else { now + 1 };
            if to > now {
                history.set_permits("p0", to);
            }
            let patch = json!({ "spec": { "permits": to } });
            chaos.locks.patch("p0", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change p0's permits");
            if to < now {
                let in_force =
                    kube::runtime::wait::await_condition(chaos.locks.clone(), "p0", move |l: Option<&Lock>| {
                        l.and_then(|l| l.status.as_ref()).is_some_and(|s| s.permits == Some(to as u32))
                    });
                // A leader hung by the next fault may take a while; the checker is told once known.
                if tokio::time::timeout(LIVENESS, in_force).await.is_ok() {
                    history.set_permits("p0", to);
                } else {
                    panic!("p0's lower permits ({to}) never showed in its status");
                }
            }
            *chaos.permits = Some(to);
        }
    }
}

fn semaphore(permits: usize) -> Lock {
    serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "Lock",
        "metadata": { "name": "p0" }, "spec": { "permits": permits },
    }))
    .expect("a Lock")
}

/// What the CLI worker saw.
#[derive(Default)]
struct Clients {
    runs: AtomicUsize,
    killed: AtomicUsize,
    /// Claims of killed clients still holding after their holder pod went.
    left_holding: std::sync::Mutex<Vec<String>>,
}

/// `zklock acquire` and `zklock exec`, the real binary, each with a holder pod (as in an init
/// container), killed with SIGTERM or SIGKILL at a random moment now and then; then the pod goes
/// (a killed container's pod ends too): whatever claim the client left must end.
async fn cli_work(env: &Env, mut rng: Rng, deadline: Instant, clients: &Clients) {
    let mut i = 0;
    while Instant::now() < deadline {
        i += 1;
        let name = format!("cli-{i}");
        let pod = format!("{name}-pod");
        env.pod(&pod).await;
        let lock = LOCKS[rng.below(3) as usize];
        let exec = rng.below(2) == 0;
        let mut args =
            vec![if exec { "exec" } else { "acquire" }, lock, "-n", &env.ns, "--name", &name, "--holder-pod", &pod];
        let hold = format!("{}", 0.05 + rng.below(300) as f64 / 1000.0);
        if exec {
            args.extend(["--", "sleep", &hold]);
        }
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_zklock"))
            .args(&args)
            .env("KUBECONFIG", &env.kubeconfig)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("run zklock");
        clients.runs.fetch_add(1, Ordering::SeqCst);
        // Killed at a random moment (before its create, while it waits, while it holds), or left alone.
        let kill = rng.below(3);
        if kill > 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
            if let Some(pid) = child.id() {
                let signal = if kill == 1 { "-TERM" } else { "-KILL" };
                let _ = std::process::Command::new("kill").args([signal, &pid.to_string()]).status();
                clients.killed.fetch_add(1, Ordering::SeqCst);
            }
        }
        let _ = tokio::time::timeout(PATIENCE, child.wait()).await;
        let _ = env.pods.delete(&pod, &DeleteParams::default()).await;
        // Whatever the client left must end now that its pod has gone (or be gone already).
        let ended = async {
            loop {
                match env.claims.get_opt(&name).await {
                    Ok(Some(c)) if !phase_of(&c).is_some_and(|p| p.is_terminal()) => {}
                    Ok(_) => return,
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        if tokio::time::timeout(LIVENESS, ended).await.is_err() {
            clients.left_holding.lock().unwrap().push(name.clone());
        }
        let _ = env.claims.delete(&name, &DeleteParams::default()).await;
        tokio::time::sleep(Duration::from_millis(rng.below(500))).await;
    }
}

/// One worker: claim after claim on a random lock, each ended in one of the ways users end
/// them, until the deadline.
async fn work(env: &Env, worker: usize, mut rng: Rng, deadline: Instant, made: &AtomicUsize, cluster_lock: &str) {
    let mut i = 0;
    while Instant::now() < deadline {
        i += 1;
        let name = format!("w{worker}-{i}");
        let lock = LOCKS[rng.below(LOCKS.len() as u64) as usize];
        let mut spec = json!({ "lockName": lock });
        if lock.starts_with('s') && rng.below(2) == 0 {
            spec["mode"] = json!("Shared");
        }
        // Now and then a claim over two or three locks (of the zklock-only ones), taken together.
        if rng.below(100) < 15 {
            let mut several: Vec<&str> = vec![];
            while several.len() < 2 + rng.below(2) as usize {
                let pick = SEVERAL[rng.below(SEVERAL.len() as u64) as usize];
                if !several.contains(&pick) {
                    several.push(pick);
                }
            }
            let locks: Vec<serde_json::Value> = several
                .iter()
                .map(|l| {
                    let shared = l.starts_with('s') && rng.below(2) == 0;
                    json!({ "lockName": l, "mode": if shared { "Shared" } else { "Exclusive" } })
                })
                .collect();
            spec = json!({ "locks": locks });
        }
        // Now and then the ClusterLock the second cluster's claims queue for too.
        if rng.below(100) < CLUSTER_LOCK_PERCENT {
            spec = json!({ "clusterLockName": cluster_lock });
        }
        // Now and then newest wins: a later claim of the group ends this one while it waits.
        if spec.get("locks").is_none() && rng.below(100) < SUPERSEDE_PERCENT {
            spec["supersede"] = json!({ "group": "chaos" });
        }
        let kind = rng.below(100);
        if (55..60).contains(&kind) {
            kept_by_another(env, &name, spec, &mut rng).await;
            made.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        let pod = (60..75).contains(&kind).then(|| format!("{name}-pod"));
        if let Some(pod) = &pod {
            env.pod(pod).await;
            spec["holder"] = json!({ "podName": pod });
        }
        if (75..85).contains(&kind) {
            spec["acquireTimeoutSeconds"] = json!(2);
        }
        if kind >= 85 {
            spec["revocationGracePeriodSeconds"] = json!(1);
        }
        env.claim_spec(&name, spec).await;
        made.fetch_add(1, Ordering::SeqCst);
        // Should the wait fail, what the lock's directory held just before says why.
        let dump =
            tokio::spawn(dump_lock_after(env.zk.clone(), env.ns.clone(), lock, PATIENCE - Duration::from_secs(3)));
        let claim = env.wait(&name, "Held or final", held_or_final).await;
        dump.abort();
        if phase_of(&claim) == Some(Phase::Held) {
            tokio::time::sleep(Duration::from_millis(50 + rng.below(300))).await;
            if let Some(pod) = &pod {
                let _ = env.pods.delete(pod, &DeleteParams::default()).await;
                env.wait(&name, "final after its pod went", |c| phase_of(c).is_some_and(Phase::is_terminal)).await;
            } else if kind >= 85 {
                let patch = json!({ "metadata": { "annotations": { "zklock.io/revoke": "chaos" } } });
                let _ = env.claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                env.wait(&name, "final after revocation", |c| phase_of(c).is_some_and(Phase::is_terminal)).await;
            }
        } else if let Some(pod) = &pod {
            let _ = env.pods.delete(pod, &DeleteParams::default()).await;
        }
        let _ = env.claims.delete(&name, &DeleteParams::default()).await;
    }
}

/// A claim that another party's finalizer keeps, deleted once it waits (or holds): its cleanup
/// must be done at once and hold nothing up, in this term or the next; the other party lets go
/// of it a moment later.
async fn kept_by_another(env: &Env, name: &str, spec: serde_json::Value, rng: &mut Rng) {
    let claim: LockClaim = serde_json::from_value(json!({
        "apiVersion": "zklock.io/v1alpha1", "kind": "LockClaim",
        "metadata": { "name": name, "finalizers": [OTHER_FINALIZER] }, "spec": spec,
    }))
    .expect("claim json");
    env.claims.create(&PostParams::default(), &claim).await.unwrap_or_else(|e| panic!("create claim {name}: {e}"));
    env.wait(name, "queued, held or final", |c| phase_of(c).is_some_and(|p| p != Phase::Pending)).await;
    let _ = env.claims.delete(name, &DeleteParams::default()).await;
    tokio::time::sleep(Duration::from_millis(rng.below(3000))).await;
    for _ in 0..100 {
        let Ok(Some(now)) = env.claims.get_opt(name).await else { return };
        let finalizers = now.metadata.finalizers.clone().unwrap_or_default();
        let kept: Vec<&String> = finalizers.iter().filter(|f| *f != OTHER_FINALIZER).collect();
        if kept.len() == finalizers.len() {
            return;
        }
        let version = now.metadata.resource_version.clone().unwrap_or_default();
        let patch: json_patch::Patch = serde_json::from_value(json!([
            { "op": "test", "path": "/metadata/resourceVersion", "value": version },
            { "op": "replace", "path": "/metadata/finalizers", "value": kept },
        ]))
        .expect("a JSON patch");
        if env.claims.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not take {OTHER_FINALIZER} off {name}");
}

/// The liveness figure (docs/design.md: liveness): every second, which claims stay non-final and not Held
/// while they could be served: their lock is free in ZooKeeper (no node holds it), or every node
/// that holds it ahead of them belongs to a claim that is final, being deleted or gone. The longest
/// such run of any claim in any lock is the stall. Lock f0 is left out: a foreign node holds
/// it now and then. A lock with permits is judged as a mutex (its second holder counts as
/// waiting behind the first: never a stall more than there is).
struct Stalls {
    longest: Duration,
    which: String,
}

async fn sample_stalls(
    zk: String,
    ns: String,
    history: History,
    stop: Arc<std::sync::atomic::AtomicBool>,
    stalled_now: Arc<AtomicUsize>,
) -> Stalls {
    let mut stalls = Stalls { longest: Duration::ZERO, which: "none".into() };
    let Ok(client) = zookeeper_client::Client::connect(&zk).await else { return stalls };
    // The latest record of each claim in each lock, and how far the history was read.
    let mut latest: HashMap<(String, String), Record> = HashMap::new();
    let mut read = 0;
    let mut since: HashMap<(String, String), Instant> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let fresh = history.records_since(read);
        read += fresh.len();
        for r in fresh {
            latest.insert((r.uid.clone(), r.lock.clone()), r);
        }
        let now = Instant::now();
        let alive = |uid: &str, lock: &str| {
            latest
                .get(&(uid.to_string(), lock.to_string()))
                .is_none_or(|r| !r.gone && !r.deleting && !r.phase.is_some_and(Phase::is_terminal))
        };
        let mut stalled = HashSet::new();
        for lock in LOCKS.iter().filter(|l| **l != FOREIGN_LOCK) {
            let Ok(children) = client.list_children(&format!("/zklock/locks/{ns}/{lock}")).await else { continue };
            let queue = zklock::recipe::queue(&children);
            let limit = zklock::recipe::Limit::default();
            let holds = |name: &str| zklock::recipe::decide_in(&queue, name, limit) == zklock::recipe::Decision::Held;
            let claim_of =
                |c: &zklock::recipe::Child| c.ours.map(|(id, _)| zklock::controller::claim_of(id).to_string());
            // A holder whose claim is gone holds nobody up for long: it counts as gone.
            let live_holder =
                queue.iter().filter(|c| holds(c.name)).any(|c| claim_of(c).is_none_or(|uid| alive(&uid, lock)));
            for ((uid, on), r) in &latest {
                // Held is served (its node comes back with the next session, if gone). A claim
                // whose holder pod does not exist (a killed client's pod deleted before any
                // operator bound it) cannot be served: it waits for the pod to appear, then
                // ends Invalid (docs/user-guide.md, a window of 30 s).
                let holder_missing = r.why.as_deref().is_some_and(|w| w.starts_with("HolderPodNotFound"));
                if on != lock || !alive(uid, lock) || r.phase == Some(Phase::Held) || holder_missing {
                    continue;
                }
                let mine = queue.iter().find(|c| claim_of(c).as_deref() == Some(uid.as_str()));
                let waits_for_nothing = match mine {
                    Some(node) => !holds(node.name) && !live_holder,
                    None => !live_holder,
                };
                if waits_for_nothing {
                    stalled.insert((uid.clone(), on.clone()));
                }
            }
        }
        stalled_now.store(stalled.len(), Ordering::SeqCst);
        since.retain(|key, _| stalled.contains(key));
        for key in stalled {
            let start = *since.entry(key.clone()).or_insert(now);
            let stall = now.duration_since(start);
            if stall > stalls.longest {
                let name = latest.get(&key).map_or_else(String::new, |r| r.name.clone());
                stalls = Stalls { longest: stall, which: format!("{name} on {}", key.1) };
            }
        }
    }
    stalls
}

/// After `delay`, prints the nodes of `lock` with their sessions (a worker's wait is about to
/// fail: this is what it waited behind).
async fn dump_lock_after(zk: String, namespace: String, lock: &str, delay: Duration) {
    tokio::time::sleep(delay).await;
    let Ok(client) = zookeeper_client::Client::connect(&zk).await else { return };
    let dir = format!("/zklock/locks/{namespace}/{lock}");
    let mut lines = vec![];
    for node in client.list_children(&dir).await.unwrap_or_default() {
        let path = format!("{dir}/{node}");
        let owner = client.check_stat(&path).await.ok().flatten().map(|s| format!("{:#x}", s.ephemeral_owner));
        lines.push(format!("  {node} owner={owner:?}"));
    }
    let epoch =
        client.get_data("/zklock/leader-epoch").await.map(|(d, s)| (String::from_utf8_lossy(&d).into_owned(), s.mzxid));
    eprintln!("chaos: a wait on {lock} is about to fail; leader epoch {epoch:?}; its directory:\n{}", lines.join("\n"));
}

/// Nodes of zklock claims still in the test's lock directories.
async fn leaked_znodes(ensemble: &Ensemble, chroot: &str, namespace: &str, cluster_lock: &str) -> Vec<String> {
    let client = zookeeper_client::Client::connect(&format!("{}{chroot}", ensemble.connect())).await.expect("connect");
    let dir = format!("/zklock/locks/{namespace}");
    // Nodes of replicas killed or cut off live until their (detached) session times out.
    let settle = Instant::now() + session_timeout() * 3;
    loop {
        let mut leaked = vec![];
        let mut dirs: Vec<String> =
            client.list_children(&dir).await.unwrap_or_default().iter().map(|lock| format!("{dir}/{lock}")).collect();
        dirs.push(format!("{SHARED_ROOT}/locks/{cluster_lock}"));
        for lock in dirs {
            for node in client.list_children(&lock).await.unwrap_or_default() {
                if zklock::recipe::parse_child(&node).is_some_and(|c| c.ours.is_some()) {
                    leaked.push(format!("{lock}/{node}"));
                }
            }
        }
        if leaked.is_empty() || Instant::now() > settle {
            return leaked;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The longest time between a lock's last holder ending (with claims waiting) and the next
/// grant on that lock, over the whole history; with which lock, holder and next claim, and
/// when it began (seconds since `started`), to find it in the fault log and the operators' logs.
fn longest_wait_behind_gone_holder(history: &History, started: Instant) -> (Duration, String) {
    let mut holders: HashMap<String, HashSet<String>> = HashMap::new();
    let mut waiting: HashMap<String, HashSet<String>> = HashMap::new();
    let mut free_since: HashMap<String, (Instant, String)> = HashMap::new();
    let mut longest = (Duration::ZERO, "none".to_string());
    for r in history.records() {
        let held = r.phase == Some(Phase::Held) && !r.gone;
        let lock_holders = holders.entry(r.lock.clone()).or_default();
        let lock_waiting = waiting.entry(r.lock.clone()).or_default();
        if held {
            if lock_holders.is_empty() {
                if let Some((since, ended)) = free_since.remove(&r.lock) {
                    let waited = r.at.duration_since(since);
                    if waited > longest.0 {
                        let at = since.saturating_duration_since(started).as_secs_f64();
                        longest = (waited, format!("{ended} then {} on {} from {at:.1}s", r.name, r.lock));
                    }
                }
            }
            lock_holders.insert(r.uid.clone());
            lock_waiting.remove(&r.uid);
        } else {
            let was_holder = lock_holders.remove(&r.uid);
            if r.phase == Some(Phase::Waiting) && !r.gone {
                lock_waiting.insert(r.uid.clone());
            } else {
                lock_waiting.remove(&r.uid);
            }
            if was_holder && lock_holders.is_empty() && !lock_waiting.is_empty() {
                free_since.insert(r.lock.clone(), (r.at, r.name.clone()));
            }
            if lock_waiting.is_empty() {
                free_since.remove(&r.lock);
            }
        }
    }
    longest
}

/// Gated pods of one cluster, by name, and when each was seen without its gate.
type Ungated = Arc<std::sync::Mutex<Vec<(String, Instant)>>>;

/// Gated pods on lock `g0`, one after the other: made with the operator's scheduling gate, seen
/// ungated (or given up on after their acquire timeout), held a moment, deleted.
async fn gated_work(env: &Env, cluster: usize, mut rng: Rng, deadline: Instant, made: &AtomicUsize, seen: &Ungated) {
    use k8s_openapi::api::core::v1::Pod;
    let mut i = 0;
    while Instant::now() < deadline {
        i += 1;
        let name = format!("g{cluster}-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": {
                "zklock.io/lock": "g0", "zklock.io/acquire-timeout-seconds": "20" } },
            "spec": {
                "schedulerName": "zklock-chaos-no-scheduler",
                "schedulingGates": [{ "name": "zklock.io/lock" }],
                "containers": [{ "name": "main", "image": "busybox:1.36", "command": ["true"] }],
            },
        }))
        .expect("a gated pod");
        if env.pods.create(&PostParams::default(), &pod).await.is_err() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        made.fetch_add(1, Ordering::SeqCst);
        let ungated = |p: Option<&Pod>| {
            p.is_some_and(|p| {
                let gates = p.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref());
                !gates.is_some_and(|g| g.iter().any(|g| g.name == "zklock.io/lock"))
            })
        };
        let waited = kube::runtime::wait::await_condition(env.pods.clone(), &name, ungated);
        // Its acquire timeout, and then some: a pod still gated by then is given up on.
        if let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_secs(40), waited).await {
            seen.lock().unwrap().push((name.clone(), Instant::now()));
            tokio::time::sleep(Duration::from_millis(100 + rng.below(500))).await;
        }
        let _ = env.pods.delete(&name, &DeleteParams::default().grace_period(0)).await;
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
    }
}

/// Why pod `pod`, seen ungated at `at`, started without its claim (named as the pod) held: no
/// Held record of the claim by then (with 2 s for the two watches' order), or a final one before.
fn started_without_a_hold(records: &[Record], pod: &str, at: Instant) -> Option<String> {
    let of_claim: Vec<&Record> = records.iter().filter(|r| r.name == pod).collect();
    if let Some(ended) = of_claim.iter().find(|r| r.at < at && r.phase.is_some_and(Phase::is_terminal)) {
        return Some(format!("ungated after its claim ended {:?} ({:?})", ended.phase, ended.why));
    }
    let held = of_claim.iter().any(|r| r.phase == Some(Phase::Held) && r.at <= at + Duration::from_secs(2));
    (!held).then(|| format!("no Held record by then: {:?}", of_claim.iter().map(|r| r.phase).collect::<Vec<_>>()))
}

/// The longest time two claims of the two clusters read Held at once on mutex `lock`, in the
/// merged history (the two watches' delivery times): `after_death` where a leader of the
/// cluster of the one granted first died shortly before, `unexcused` otherwise.
struct Overlap {
    unexcused: Duration,
    after_death: Duration,
    which: Option<String>,
}

fn merged_overlap(a: &[Record], b: &[Record], lock: &str, deaths: &[Vec<Instant>; 2]) -> Overlap {
    let now = Instant::now();
    // (cluster, claim, held from, held until)
    let mut holds: Vec<(usize, String, Instant, Instant)> = vec![];
    for (c, records) in [a, b].into_iter().enumerate() {
        let mut open: HashMap<&str, (Instant, &str)> = HashMap::new();
        for r in records.iter().filter(|r| r.lock == lock) {
            let holding = r.phase == Some(Phase::Held) && !r.gone;
            match (open.get(r.uid.as_str()), holding) {
                (None, true) => {
                    open.insert(&r.uid, (r.at, &r.name));
                }
                (Some(&(from, name)), false) => {
                    holds.push((c, name.to_string(), from, r.at));
                    open.remove(r.uid.as_str());
                }
                _ => {}
            }
        }
        holds.extend(open.into_values().map(|(from, name)| (c, name.to_string(), from, now)));
    }
    // A takeover's span: the lease, a session, and the new term's start.
    let span = zklock::leader::LEASE_DURATION + session_timeout() + Duration::from_secs(10);
    let mut overlap = Overlap { unexcused: Duration::ZERO, after_death: Duration::ZERO, which: None };
    for (i, x) in holds.iter().enumerate() {
        for y in holds.iter().skip(i + 1).filter(|y| y.0 != x.0) {
            let (from, until) = (x.2.max(y.2), x.3.min(y.3));
            let Some(length) = until.checked_duration_since(from).filter(|d| !d.is_zero()) else { continue };
            let first = if x.2 <= y.2 { x } else { y };
            let died = deaths[first.0].iter().any(|d| *d <= from && from.duration_since(*d) <= span);
            let what =
                format!("{}/{} and {}/{} Held at once for {length:.1?}", ['a', 'b'][x.0], x.1, ['a', 'b'][y.0], y.1);
            if died {
                overlap.after_death = overlap.after_death.max(length);
            } else if length > overlap.unexcused {
                overlap.unexcused = length;
                overlap.which = Some(what);
            }
        }
    }
    overlap
}

#[cfg(test)]
mod checks {
    use super::*;

    fn record(name: &str, phase: Phase, at: Instant) -> Record {
        Record {
            at,
            name: name.into(),
            uid: format!("uid-{name}"),
            lock: "cluster/c0".into(),
            exclusive: true,
            phase: Some(phase),
            held_condition: phase == Phase::Held,
            finished_condition: phase.is_terminal(),
            fencing: None,
            leader_epoch: None,
            why: None,
            deleting: false,
            gone: false,
        }
    }

    #[test]
    fn two_holders_in_two_clusters_at_once_are_an_overlap_unless_a_leader_just_died() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let a = [record("h", Phase::Held, t), record("h", Phase::Lost, t + s(5))];
        let b = [record("n", Phase::Held, t + s(3)), record("n", Phase::Released, t + s(8))];
        let overlap = merged_overlap(&a, &b, "cluster/c0", &[vec![], vec![]]);
        assert_eq!(overlap.unexcused, s(2));
        assert!(overlap.which.is_some_and(|w| w.contains("a/h and b/n")));
        let overlap = merged_overlap(&a, &b, "cluster/c0", &[vec![t + s(1)], vec![]]);
        assert_eq!((overlap.unexcused, overlap.after_death), (Duration::ZERO, s(2)), "a's leader died first");
        let b = [record("n", Phase::Held, t + s(5)), record("n", Phase::Released, t + s(8))];
        assert_eq!(
            merged_overlap(&a, &b, "cluster/c0", &[vec![], vec![]]).unexcused,
            Duration::ZERO,
            "one after the other"
        );
    }

    #[test]
    fn a_pod_ungated_without_a_held_claim_or_after_it_ended_is_found() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let held = [record("p", Phase::Waiting, t), record("p", Phase::Held, t + s(1))];
        assert_eq!(started_without_a_hold(&held, "p", t + s(1)), None);
        assert!(started_without_a_hold(&held[..1], "p", t + s(1)).is_some(), "never Held");
        let lost = [record("p", Phase::Held, t), record("p", Phase::Lost, t + s(1))];
        assert!(started_without_a_hold(&lost, "p", t + s(2)).is_some(), "ungated after its claim was Lost");
    }
}
