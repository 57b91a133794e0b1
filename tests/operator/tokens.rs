//! Numbers out of ZooKeeper never go back: when ZooKeeper's data are made anew under a running
//! operator (a new ensemble, a wiped volume), zxids start over, and tokens, tickets and leader
//! epochs handed out after must still be above every one handed out before.

use crate::e2e_support;

use e2e_support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::json;
use zklock::api::{LockClaim, Phase};

/// Every number a claim's status hands out.
fn numbers(claim: &LockClaim) -> Vec<i64> {
    let Some(status) = &claim.status else { return vec![] };
    let parse = |s: &Option<String>| s.as_deref().and_then(|s| s.parse::<i64>().ok());
    [parse(&status.fencing_token), parse(&status.ticket), status.leader_epoch].into_iter().flatten().collect()
}

fn token(claim: &LockClaim) -> i64 {
    let token = claim.status.as_ref().and_then(|s| s.fencing_token.as_deref());
    token.and_then(|t| t.parse().ok()).unwrap_or_else(|| panic!("a Held claim without a fencing token: {token:?}"))
}

/// docs/operations.md: moving to a new ensemble; docs/design.md: fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_tickets_and_epochs_stay_above_every_earlier_one_when_zookeepers_data_are_wiped() {
    let mut zk = zklock_testkit::ZkServer::start();
    let chroot_connect = zk.chroot().await;
    let chroot = chroot_connect.split_once('/').map(|(_, c)| format!("/{c}")).expect("a chroot");
    let env = Env::with_zk(chroot_connect).await;
    let op = Operator::start(&env, &["--zk-session-timeout", "2s"]);
    env.claim("a", "w", json!({})).await;
    let a = env.wait_phase("a", Phase::Held).await;
    // Writes of other clients move the ensemble's zxids well past where a new ensemble's
    // start, as any ensemble in use does.
    let raw = zookeeper_client::Client::connect(zk.connect()).await.expect("connect to ZooKeeper");
    let scratch = format!("{chroot}/scratch");
    let open = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(&scratch, b"", &open).await.expect("create a scratch node");
    for i in 0..300 {
        raw.set_data(&scratch, i.to_string().as_bytes(), None).await.expect("write the scratch node");
    }
    drop(raw);
    env.claim("b", "w", json!({})).await;
    env.wait_phase("b", Phase::Waiting).await;
    env.delete_claim("a").await;
    let b = env.wait_phase("b", Phase::Held).await;
    let before = numbers(&a).into_iter().chain(numbers(&b)).max().expect("numbers handed out before the wipe");

    zk.kill();
    zk.wipe();
    zk.resume();
    // The chroot, made again as whoever made the new ensemble would.
    let raw = zookeeper_client::Client::connect(zk.connect()).await.expect("connect to ZooKeeper");
    raw.create(&chroot, b"", &open).await.expect("make the chroot again");
    drop(raw);

    // A lock nobody held: its first grant after the wipe, once the operator serves again.
    env.claim("d", "v", json!({})).await;
    let d = env.wait_phase("d", Phase::Held).await;
    assert!(token(&d) > before, "a token after the wipe ({}) is not above those before it ({before})", token(&d));
    for number in numbers(&d) {
        assert!(number > before, "{number} handed out after the wipe is not above {before}: {:?}", d.status);
    }
    // Nobody can prove who held b's lock while the data were made anew (a foreign client
    // could have been granted in the empty directory): b's hold ends.
    let b = env.wait("b", "ended", |c| phase_of(c).is_some_and(Phase::is_terminal)).await;
    assert_eq!(phase_of(&b), Some(Phase::Lost), "{:?}", b.status);
    env.claim("c", "w", json!({})).await;
    let c = env.wait_phase("c", Phase::Held).await;
    assert!(
        token(&c) > before,
        "the next holder's token ({}) is not above the last before the wipe ({before})",
        token(&c)
    );

    // The floor the next wipe will start from, kept in the API beside the Lease.
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let floor = maps.get("zklock-token-floor").await.expect("the token floor ConfigMap");
    let floor: i64 = floor.data.and_then(|d| d.get("floor")?.parse().ok()).expect("a floor number");
    for number in numbers(&c).into_iter().chain(numbers(&d)) {
        assert!(number <= floor, "{number} handed out above the floor {floor}");
    }
    assert!(op.metric("zklock_zookeeper_sessions_lost_total").await >= 1.0, "the wipe ended the operator's session");
    env.history.check();
}

/// Writers raising the token floor at once (terms overlapping at a handover) never lower each
/// other's: each write is tested against the version it read, and the one overtaken reads again.
/// Every version of the ConfigMap is seen on a watch: its floor never goes down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_raising_the_token_floor_at_once_never_lower_each_other() {
    use futures::StreamExt;
    use kube::api::{PostParams, WatchEvent, WatchParams};
    use zklock::controller::token_floor::TokenFloor;
    use zklock::zk::token_base::FLOOR_RESERVE;
    const WRITERS: i64 = 3;
    const ROUNDS: i64 = 20;
    let env = Env::new().await;
    let name = "raced-token-floor";
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let mut start = ConfigMap::default();
    start.metadata.name = Some(name.into());
    start.data = Some([("floor".to_string(), "0".to_string())].into());
    let start = maps.create(&PostParams::default(), &start).await.expect("the floor's ConfigMap");
    let from = start.metadata.resource_version.expect("a resourceVersion");
    let params = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(290);
    let mut events = maps.watch(&params, &from).await.expect("a watch of the floor").boxed();

    let mut floors = Vec::new();
    for _ in 0..WRITERS {
        floors.push(TokenFloor::read(&env.client, &env.ns, name).await.expect("a floor for a writer"));
    }
    // Writer w covers w, w + WRITERS, … times 2 × the reserve: every call writes, interleaved.
    let covering = |floor: TokenFloor, w: i64| async move {
        for round in 1..=ROUNDS {
            let value = (round * WRITERS + w) * 2 * FLOOR_RESERVE;
            floor.cover(value).await.unwrap_or_else(|e| panic!("covering {value}: {e}"));
        }
    };
    futures::future::join_all(floors.into_iter().zip(0..).map(|(floor, w)| covering(floor, w))).await;
    let highest = (ROUNDS * WRITERS + WRITERS - 1) * 2 * FLOOR_RESERVE;

    let mut seen: Vec<i64> = Vec::new();
    let read_all = async {
        while let Some(event) = events.next().await {
            let map = match event.expect("a watch event") {
                WatchEvent::Modified(map) | WatchEvent::Added(map) => map,
                other => panic!("the floor's watch: {other:?}"),
            };
            let floor: i64 = map.data.and_then(|d| d.get("floor")?.parse().ok()).expect("a floor number");
            seen.push(floor);
            if floor > highest {
                return;
            }
        }
        panic!("the watch ended before the floor rose above {highest}: {seen:?}");
    };
    tokio::time::timeout(PATIENCE, read_all)
        .await
        .unwrap_or_else(|_| panic!("the floor did not rise above {highest} within {PATIENCE:?}"));
    let lowered: Vec<_> = seen.windows(2).filter(|w| w[1] < w[0]).collect();
    assert!(lowered.is_empty(), "writes lowered the floor: {lowered:?} (every version: {seen:?})");
    assert!(seen.len() as i64 >= ROUNDS, "each writer wrote: {} versions", seen.len());
}
