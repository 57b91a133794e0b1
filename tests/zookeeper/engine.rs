//! The lock engine against a real ZooKeeper server (started once for this test binary; each
//! test works in a chroot of its own).

use crate::support;

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;
use tokio::sync::mpsc::UnboundedReceiver;
use zklock::recipe::{Limit, Mode};
use zklock::zk::{ContenderState, EngineEvent, LockEngine, LostReason, Recorded, SessionEvent, ZkConfig};
use zklock_testkit::proxy::Proxy;
use zklock_testkit::ZkServer;
use zookeeper_client as zkc;

const LOCK: &str = "/locks/ns/db";

/// An engine that reaches the shared server through a fault-injecting proxy, its event stream,
/// and the direct connect string (chroot included) for other clients.
async fn behind_proxy(session_timeout: Duration) -> (Proxy, Engine, UnboundedReceiver<EngineEvent>, String) {
    let server = ZkServer::shared();
    let connect = server.chroot().await;
    let chroot = &connect[connect.find('/').unwrap()..];
    let proxy = Proxy::start(server.addr()).await;
    let config = ZkConfig::new(proxy.connect_string(chroot)).with_session_timeout(session_timeout);
    let (engine, events) = Engine::connect_with_events(config).await.unwrap();
    (proxy, engine, events, connect)
}

/// Waits until the engine reports that its connection dropped.
async fn disconnected(events: &mut UnboundedReceiver<EngineEvent>) {
    within("the engine to report the disconnection", async {
        while !matches!(events.recv().await, Some(EngineEvent::Session(SessionEvent::Disconnected))) {}
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_contenders_never_overlap() {
    let connect = chroot().await;
    let checker = Arc::new(raw_client(&connect).await);
    let engines = futures_join(4, |_| engine(&connect)).await;
    // A global clock orders every start and end record across all contenders.
    let clock = Arc::new(AtomicI64::new(0));
    let holding = Arc::new(AtomicUsize::new(0));
    let records: Arc<Mutex<Vec<(i64, i64, i64)>>> = Arc::default();
    let mut tasks = vec![];
    for i in 0..20 {
        let engine = engines[i % engines.len()].clone();
        let (clock, holding, records, checker) = (clock.clone(), holding.clone(), records.clone(), checker.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = enqueue(&engine, LOCK, Mode::Exclusive).await;
            let token = held(&mut c).await;
            let start = clock.fetch_add(1, Ordering::SeqCst);
            let others = holding.fetch_add(1, Ordering::SeqCst);
            // The work under the lock: a marker node that only one holder at a time can create.
            let marker = checker.create("/marker", b"", &zkc::CreateMode::Ephemeral.with_acls(zkc::Acls::anyone_all()));
            let created = marker.await.is_ok();
            let deleted = checker.delete("/marker", None).await.is_ok();
            holding.fetch_sub(1, Ordering::SeqCst);
            let end = clock.fetch_add(1, Ordering::SeqCst);
            records.lock().unwrap().push((start, end, token));
            engine.release(&c.id).await.expect("release");
            (others, created && deleted)
        }));
    }
    for task in tasks {
        let (others, marker_ok) = within("a contender", task).await.expect("contender task");
        assert_eq!(others, 0, "another contender held the lock at the same time");
        assert!(marker_ok, "the marker node showed two holders");
    }
    let mut records = records.lock().unwrap().clone();
    assert_eq!(records.len(), 20);
    records.sort();
    for pair in records.windows(2) {
        assert!(pair[0].1 < pair[1].0, "intervals overlap: {:?} and {:?}", pair[0], pair[1]);
        assert!(pair[0].2 < pair[1].2, "fencing tokens must increase: {:?} then {:?}", pair[0], pair[1]);
    }
}

async fn futures_join<T, F: std::future::Future<Output = T>>(n: usize, f: impl Fn(usize) -> F) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(f(i).await);
    }
    out
}

#[tokio::test]
async fn shared_holders_are_granted_together_and_wait_for_an_earlier_exclusive() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let mut r1 = enqueue(&engine, LOCK, Mode::Shared).await;
    let mut r2 = enqueue(&engine, LOCK, Mode::Shared).await;
    let mut w3 = enqueue(&engine, LOCK, Mode::Exclusive).await;
    let mut r4 = enqueue(&engine, LOCK, Mode::Shared).await;
    held(&mut r1).await;
    held(&mut r2).await;
    assert!(matches!(w3.state(), ContenderState::Waiting { ahead: 2, .. }), "{:?}", w3.state());
    match r4.state() {
        ContenderState::Waiting { watching, ahead } => {
            assert!(w3.node.ends_with(&watching), "a shared waiter watches the exclusive node before it");
            assert_eq!(ahead, 3);
        }
        other => panic!("r4 must wait behind the exclusive w3, is {other:?}"),
    }
    // w3 watches r2, the node right before it, so r1 leaving does not wake it.
    assert!(matches!(w3.state(), ContenderState::Waiting { watching, .. } if r2.node.ends_with(&watching)));
    let woken = engine.stats().predecessor_notifications;
    engine.release(&r1.id).await.unwrap();
    // ZooKeeper delivers a session's watch events before the answers to its later requests,
    // so after this round trip any wake-up caused by the release has arrived.
    engine.queue(LOCK).await.unwrap();
    tokio::task::yield_now().await;
    assert_eq!(engine.stats().predecessor_notifications, woken, "r1's release woke a waiter");
    assert!(is_waiting(&w3.state()));
    engine.release(&r2.id).await.unwrap();
    held(&mut w3).await;
    assert!(is_waiting(&r4.state()), "r4 waits while the exclusive w3 holds");
    engine.release(&w3.id).await.unwrap();
    held(&mut r4).await;
    engine.release(&r4.id).await.unwrap();
}

#[tokio::test]
async fn grants_follow_queue_order() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let mut queue = vec![];
    for i in 0..12 {
        queue.push(enqueue(&engine, LOCK, if i % 3 == 2 { Mode::Shared } else { Mode::Exclusive }).await);
    }
    let mut tokens = vec![];
    for i in 0..queue.len() {
        tokens.push(held(&mut queue[i]).await);
        for later in &queue[i + 1..] {
            assert!(!later.state().is_held(), "{} was granted before {}", later.id, queue[i].id);
        }
        engine.release(&queue[i].id).await.unwrap();
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "fencing tokens must increase: {tokens:?}");
}

/// What a lock that is not there yet costs ZooKeeper, in its own server (its request counter
/// is this engine's alone): the node's multi-op (refused: no directory), the same with the
/// directory, the queue read, the node's stat (the multi-op's answer carries none here, and the
/// czxid is the fencing token), the release. Seven before: the directory was made on its own,
/// after a create of its parent, which is there but for a namespace's first lock. A lock whose
/// directory is there costs four.
#[tokio::test]
async fn a_lock_made_beside_others_costs_zookeeper_five_requests() {
    let zk = ZkServer::start();
    let engine = engine(&zk.chroot().await).await;
    let received = || zk.requests_received().expect("the server's srvr counters");
    let mut first = enqueue(&engine, "/locks/ns/first", Mode::Exclusive).await;
    held(&mut first).await;
    engine.release(&first.id).await.unwrap();
    // Whatever the srvr command itself counts (a ping in between only adds, and is caught below).
    let own = (0..3).map(|_| received()).collect::<Vec<_>>().windows(2).map(|w| w[1] - w[0]).min().unwrap_or(0);
    // A ping may fall in a round and only ever adds: the fewest of three rounds.
    let round = |lock: &'static str| {
        let engine = &engine;
        async move {
            let before = received();
            let mut c = enqueue(engine, lock, Mode::Exclusive).await;
            held(&mut c).await;
            engine.release(&c.id).await.unwrap();
            received() - before - own
        }
    };
    let mut fewest = u64::MAX;
    for lock in ["/locks/ns/a", "/locks/ns/b", "/locks/ns/c"] {
        fewest = fewest.min(round(lock).await);
    }
    assert_eq!(fewest, 5, "requests for a lock made, held and released");
    // Taken again while its directory is kept (30 s idle): the multi-op, the queue read, the
    // node's stat, the release.
    let mut fewest = u64::MAX;
    for lock in ["/locks/ns/a", "/locks/ns/b", "/locks/ns/c"] {
        fewest = fewest.min(round(lock).await);
    }
    assert_eq!(fewest, 4, "requests for a lock whose directory is there");
}

#[tokio::test]
async fn one_release_wakes_exactly_one_of_200_waiters() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let mut queue = vec![];
    for _ in 0..200 {
        queue.push(enqueue(&engine, LOCK, Mode::Exclusive).await);
    }
    held(&mut queue[0]).await;
    for c in &mut queue[1..] {
        wait_state(c, "a waiter", is_waiting).await;
    }
    let base = engine.stats();
    for i in 0..queue.len() - 1 {
        engine.release(&queue[i].id).await.unwrap();
        held(&mut queue[i + 1]).await;
        let now = engine.stats();
        let woken = now.predecessor_notifications - base.predecessor_notifications;
        assert_eq!(woken, i as u64 + 1, "release {i} woke {} waiters in all", woken - i as u64);
        assert_eq!(now.children_reads - base.children_reads, i as u64 + 1, "re-reads of the directory");
    }
    // Nobody else woke up afterwards either.
    for c in &queue[queue.len() - 1..] {
        assert!(c.state().is_held());
    }
    assert_eq!(engine.stats().predecessor_notifications - base.predecessor_notifications, 199);
}

fn permits(n: u32) -> Limit {
    Limit::from_permits(Some(n))
}

/// How many of `queue` hold now, after the engine has settled (every contender decided).
fn holding(queue: &[Contender]) -> usize {
    queue.iter().filter(|c| c.state().is_held()).count()
}

#[tokio::test]
async fn with_three_permits_three_hold_in_queue_order_and_a_release_wakes_one_waiter() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    engine.set_limit(LOCK, permits(3));
    let mut queue = vec![];
    for i in 0..10 {
        // Shared or not, each takes a permit.
        queue.push(enqueue(&engine, LOCK, if i % 4 == 1 { Mode::Shared } else { Mode::Exclusive }).await);
    }
    let mut tokens = vec![];
    for c in &mut queue[..3] {
        tokens.push(held(c).await);
    }
    for c in &mut queue[3..] {
        wait_state(c, "a waiter", is_waiting).await;
    }
    let base = engine.stats();
    // The oldest holder leaves first: the first waiter alone is woken, one read each.
    for i in 0..7 {
        engine.release(&queue[i].id).await.unwrap();
        tokens.push(held(&mut queue[i + 3]).await);
        assert_eq!(holding(&queue), 3);
        for later in &queue[i + 4..] {
            assert!(!later.state().is_held(), "{} granted out of order", later.id);
        }
        let now = engine.stats();
        assert_eq!(now.predecessor_notifications - base.predecessor_notifications, i as u64 + 1);
        assert_eq!(now.children_reads - base.children_reads, i as u64 + 1);
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "fencing tokens must increase: {tokens:?}");
    for c in &queue[7..] {
        engine.release(&c.id).await.unwrap();
    }
}

#[tokio::test]
async fn a_raise_of_permits_grants_at_once_and_a_lower_limit_takes_nothing_away() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    engine.set_limit(LOCK, permits(2));
    let mut queue = vec![];
    for _ in 0..8 {
        queue.push(enqueue(&engine, LOCK, Mode::Exclusive).await);
    }
    let mut tokens = vec![held(&mut queue[0]).await, held(&mut queue[1]).await];
    for c in &mut queue[2..] {
        wait_state(c, "a waiter", is_waiting).await;
    }
    // Raised to 5: three more at once, from a read that shows nothing new, each with a
    // token of its own above every earlier one.
    engine.set_limit(LOCK, permits(5));
    for c in &mut queue[2..5] {
        tokens.push(held(c).await);
    }
    let mut later: Vec<i64> = tokens[2..].to_vec();
    later.sort_unstable();
    later.dedup();
    assert_eq!(later.len(), 3, "three grants, three tokens: {tokens:?}");
    assert!(later[0] > tokens[1], "above the earlier grants: {tokens:?}");
    assert!(engine.stats().grant_stamps >= 2, "grants after the first of one read write for a token");
    for c in &queue[5..] {
        assert!(is_waiting(&c.state()));
    }
    // Lowered to 2: the five keep it; grants stop until fewer than two hold.
    engine.set_limit(LOCK, permits(2));
    for i in 0..3 {
        engine.release(&queue[i].id).await.unwrap();
        wait_state(&mut queue[i], "released", |s| *s == ContenderState::Released).await;
        assert_eq!(holding(&queue[5..]), 0, "granted while {} of 2 permits were taken", 4 - i);
    }
    // (The fourth release leaves one holder: from then on a grant is due, so asserting that
    // none came after it, as this loop once did for four releases, raced with that grant.)
    engine.release(&queue[3].id).await.unwrap();
    // One left of the five: the first waiter gets the second permit.
    let next = held(&mut queue[5]).await;
    assert!(next > *tokens.iter().max().unwrap());
    assert!(is_waiting(&queue[6].state()));
    // Back to a mutex: nobody more until everyone ahead is gone.
    engine.set_limit(LOCK, Limit::Mutex);
    engine.release(&queue[4].id).await.unwrap();
    wait_state(&mut queue[4], "released", |s| *s == ContenderState::Released).await;
    assert!(is_waiting(&queue[6].state()), "a mutex holds one: queue[5] does");
    engine.release(&queue[5].id).await.unwrap();
    held(&mut queue[6]).await;
}

#[tokio::test]
async fn revocation_requests_reach_the_holder_whoever_writes_them() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let mut a = enqueue(&engine, LOCK, Mode::Exclusive).await;
    let token = held(&mut a).await;
    let mut b = enqueue(&engine, LOCK, Mode::Exclusive).await;
    wait_state(&mut b, "b to wait", is_waiting).await;

    engine.request_revocation(&a.node, "maintenance window").await.unwrap();
    let s = wait_state(&mut a, "a revoke request", |s| matches!(s, ContenderState::RevokeRequested { .. })).await;
    assert_eq!(s, ContenderState::RevokeRequested { reason: "maintenance window".into(), fencing_token: Some(token) });
    // The description survives in the node's data.
    let (body, _) = raw.get_data(&a.node).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["owner"], "zklock");
    assert_eq!(body["revoke"]["reason"], "maintenance window");
    assert!(is_waiting(&b.state()), "a revoke request alone does not move the queue");

    // A waiter asked to leave learns it too; raw `unlock` and Curator's marker both count.
    raw.set_data(&b.node, b"unlock", None).await.unwrap();
    wait_state(&mut b, "b revoke request", |s| {
        matches!(s, ContenderState::RevokeRequested { fencing_token: None, .. })
    })
    .await;
    engine.release(&a.id).await.unwrap();
    let s = wait_state(&mut b, "b held, still revoked", |s| s.is_held()).await;
    assert!(matches!(s, ContenderState::RevokeRequested { .. }), "the request is sticky: {s:?}");
    let mut c = enqueue(&engine, LOCK, Mode::Exclusive).await;
    raw.set_data(&c.node, b"__REVOKE__", None).await.unwrap();
    wait_state(&mut c, "c revoke request", |s| matches!(s, ContenderState::RevokeRequested { .. })).await;
    assert_eq!(engine.stats().revocations_written, 1);
}

#[tokio::test]
async fn a_node_deleted_by_someone_else_turns_its_contender_lost() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let mut a = enqueue(&engine, LOCK, Mode::Exclusive).await;
    held(&mut a).await;
    let mut b = enqueue(&engine, LOCK, Mode::Exclusive).await;
    let mut c = enqueue(&engine, LOCK, Mode::Exclusive).await;
    wait_state(&mut c, "c waits", is_waiting).await;

    // Deleting a waiter's node: it is lost, and the one behind it now waits for a.
    raw.delete(&b.node, None).await.unwrap();
    let s = wait_state(&mut b, "b lost", |s| s.is_final()).await;
    assert_eq!(s, ContenderState::Lost { why: LostReason::DeletedByOther });
    let s = wait_state(&mut c, "c to watch a", |s| matches!(s, ContenderState::Waiting { ahead: 1, .. })).await;
    assert!(matches!(s, ContenderState::Waiting { watching, .. } if a.node.ends_with(&watching)));

    // Deleting the holder's node: it is lost, and the next in line holds.
    raw.delete(&a.node, None).await.unwrap();
    let s = wait_state(&mut a, "a lost", |s| s.is_final()).await;
    assert_eq!(s, ContenderState::Lost { why: LostReason::DeletedByOther });
    held(&mut c).await;
    // Remembered as lost (so that the operator can tell why) until released, then forgotten.
    let lost = Some(ContenderState::Lost { why: LostReason::DeletedByOther });
    assert_eq!((engine.state(&a.id), engine.state(&b.id)), (lost.clone(), lost));
    assert_eq!(engine.node(&a.id).as_deref(), Some(a.node.as_str()), "with the node it had");
    for x in [&a, &b] {
        assert!(!engine.release(&x.id).await.unwrap(), "releasing a lost contender deletes nothing");
        assert!(engine.state(&x.id).is_none(), "released: forgotten");
    }
}

#[tokio::test]
async fn no_znodes_remain_after_every_contender_released() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let mut all = vec![];
    for (i, lock) in ["/locks/a/x", "/locks/a/y", "/locks/b/x"].iter().enumerate() {
        for j in 0..5 {
            all.push(enqueue(&engine, lock, if (i + j) % 2 == 0 { Mode::Shared } else { Mode::Exclusive }).await);
        }
    }
    assert_eq!(engine.stats().creates, 15);
    // Release in an order that mixes holders and waiters.
    all.reverse();
    for c in &all {
        assert!(engine.release(&c.id).await.unwrap());
    }
    for lock in ["/locks/a/x", "/locks/a/y", "/locks/b/x"] {
        assert_eq!(children(&raw, lock).await, Vec::<String>::new(), "{lock} still has nodes");
    }
    assert_eq!(engine.stats().deletes, 15);
    for c in &mut all {
        let s = wait_state(c, "the release to be reported", |s| s.is_final()).await;
        assert_eq!(s, ContenderState::Released);
    }
}

#[tokio::test]
async fn a_lost_create_answer_yields_exactly_one_node() {
    let server = ZkServer::shared();
    let connect = server.chroot().await;
    let chroot = &connect[connect.find('/').unwrap()..];
    let proxy = Proxy::start(server.addr()).await;
    let engine = engine(&proxy.connect_string(chroot)).await;
    let raw = raw_client(&connect).await;
    // The directory exists first, so that the cut create is the contender's own.
    let _warm = enqueue(&engine, LOCK, Mode::Exclusive).await;
    engine.release(&_warm.id).await.unwrap();

    proxy.cut_after_next_create();
    let mut c = within("enqueue through a cut connection", engine.enqueue(spec(LOCK, Mode::Exclusive))).await.unwrap();
    assert_eq!(proxy.cuts(), 1, "the proxy cut the connection after the create");
    let stats = engine.stats();
    assert_eq!(stats.create_unknown_outcomes, 1);
    assert_eq!(stats.nodes_adopted, 1, "the node was found by its contender id");
    let mine: Vec<String> = children(&raw, LOCK).await.into_iter().filter(|n| n.contains(&c.id)).collect();
    assert_eq!(mine.len(), 1, "exactly one node for the contender: {mine:?}");
    assert!(c.node.ends_with(&mine[0]));
    held(&mut c).await;
}

#[tokio::test]
async fn an_earlier_sessions_node_with_the_same_id_is_removed() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let spec = spec(LOCK, Mode::Exclusive);
    raw.mkdir(LOCK, &zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all())).await.unwrap();
    let stale = format!("{LOCK}/{}", zklock::recipe::node_prefix(&spec.id, spec.mode));
    let options = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    raw.create(&stale, b"", &options).await.unwrap();
    let mut c = engine.enqueue(spec).await.unwrap();
    held(&mut c).await;
    assert_eq!(engine.stats().duplicates_deleted, 1);
    assert_eq!(children(&raw, LOCK).await.len(), 1);
}

#[tokio::test]
async fn session_expiry_turns_every_contender_lost_and_a_new_session_works() {
    let (proxy, engine, mut events, connect) = behind_proxy(Duration::from_secs(2)).await;
    let raw = raw_client(&connect).await;
    let mut a = enqueue(&engine, LOCK, Mode::Exclusive).await;
    held(&mut a).await;
    let mut b = enqueue(&engine, LOCK, Mode::Shared).await;
    wait_state(&mut b, "b waits", is_waiting).await;

    assert!(engine.admitting());
    proxy.set_blackhole(true);
    // Admission ends with the session, before any contender is reported lost: whoever reacts
    // to a loss must not mistake it for a node deleted in a live, admitted session.
    let first_loss = within("a contender to be reported lost", async {
        loop {
            match events.recv().await {
                Some(EngineEvent::Contender { state: ContenderState::Lost { .. }, .. }) => return engine.admitting(),
                Some(_) => {}
                None => panic!("event stream closed"),
            }
        }
    })
    .await;
    assert!(!first_loss, "still admitting when the first contender was reported lost");
    for c in [&mut a, &mut b] {
        let s = wait_state(c, "lost after expiry", |s| s.is_final()).await;
        assert_eq!(s, ContenderState::Lost { why: LostReason::SessionExpired });
    }
    assert!(engine.enqueue(spec(LOCK, Mode::Exclusive)).await.is_err(), "no enqueue without a session");
    // The server expired the session too: its ephemeral nodes are gone.
    within("the server to drop the nodes", async {
        loop {
            let (left, _, watcher) = raw.get_and_watch_children(LOCK).await.unwrap();
            if left.is_empty() {
                break;
            }
            watcher.changed().await;
        }
    })
    .await;

    proxy.set_blackhole(false);
    engine.reconnect().await.unwrap();
    // A new session admits nobody until it is re-anchored.
    assert!(!engine.admitting());
    let early = engine.enqueue(spec(LOCK, Mode::Exclusive)).await;
    assert!(matches!(early, Err(zklock::zk::Error::NotAdmitted)), "enqueue before admission: {early:?}");
    assert!(children(&raw, LOCK).await.is_empty(), "no node was made");
    engine.admit().unwrap();
    let mut c = enqueue(&engine, LOCK, Mode::Exclusive).await;
    held(&mut c).await;
    assert!(!engine.release(&a.id).await.unwrap(), "a is gone with its session");
    let mut saw_lost = false;
    while let Ok(event) = events.try_recv() {
        saw_lost |= matches!(event, EngineEvent::Session(SessionEvent::Lost { .. }));
    }
    assert!(saw_lost, "the event stream reports the session loss");
}

#[tokio::test]
async fn changes_made_while_disconnected_are_caught_up_after_reconnecting() {
    // Long enough a session that the disconnection below does not expire it.
    let (proxy, behind_proxy, mut events, connect) = behind_proxy(Duration::from_secs(20)).await;
    let direct = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let other_lock = "/locks/ns/cache";
    let mut holder = enqueue(&direct, LOCK, Mode::Exclusive).await;
    held(&mut holder).await;
    let mut waiter = enqueue(&behind_proxy, LOCK, Mode::Exclusive).await;
    wait_state(&mut waiter, "the waiter waits", is_waiting).await;
    let mut revoked = enqueue(&behind_proxy, other_lock, Mode::Exclusive).await;
    held(&mut revoked).await;
    let session = behind_proxy.session_id();

    proxy.set_blackhole(true);
    disconnected(&mut events).await;
    // Both changes happen while the engine cannot hear of them; persistent watches do not
    // replay them after the reconnection (ZOOKEEPER-4698).
    direct.release(&holder.id).await.unwrap();
    raw.set_data(&revoked.node, b"unlock", None).await.unwrap();
    proxy.set_blackhole(false);

    held(&mut waiter).await;
    let state =
        wait_state(&mut revoked, "the revocation request", |s| matches!(s, ContenderState::RevokeRequested { .. }))
            .await;
    assert!(state.is_held(), "a holder asked to let go still holds until it releases: {state:?}");
    assert_eq!(behind_proxy.session_id(), session, "the session lived through the disconnection");
}

#[tokio::test]
async fn an_id_that_comes_back_after_its_release_is_a_new_contender() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let mut holder = enqueue(&engine, LOCK, Mode::Exclusive).await;
    held(&mut holder).await;
    let again = spec(LOCK, Mode::Exclusive);
    let first = engine.enqueue(again.clone()).await.unwrap();
    assert!(engine.release(&first.id).await.unwrap());
    // The same id comes back (a claim re-enqueued after a session loss does this).
    let mut second = engine.enqueue(again).await.unwrap();
    wait_state(&mut second, "the new incarnation waits", is_waiting).await;
    assert_ne!(first.node, second.node, "a node of its own");
    engine.release(&holder.id).await.unwrap();
    held(&mut second).await;
}

#[tokio::test]
async fn a_dropped_connection_asks_holders_of_foreign_shared_locks_to_let_go() {
    let (proxy, engine, mut events, connect) = behind_proxy(Duration::from_secs(20)).await;
    let raw = raw_client(&connect).await;
    // A lock another ZooKeeper client uses: the engine sees its node while deciding.
    let shared_lock = "/locks/ns/shared-with-curator";
    raw.mkdir(shared_lock, &zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all())).await.unwrap();
    let options = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    let (_, foreign_seq) = raw.create(&format!("{shared_lock}/_c_1234-lock-"), b"", &options).await.unwrap();
    let mut in_shared = enqueue(&engine, shared_lock, Mode::Exclusive).await;
    wait_state(&mut in_shared, "behind the foreign node", is_waiting).await;
    raw.delete(&format!("{shared_lock}/_c_1234-lock-{foreign_seq}"), None).await.unwrap();
    let token = held(&mut in_shared).await;
    let mut in_ours = enqueue(&engine, LOCK, Mode::Exclusive).await;
    held(&mut in_ours).await;

    proxy.set_blackhole(true);
    let state =
        wait_state(&mut in_shared, "asked to let go", |s| matches!(s, ContenderState::RevokeRequested { .. })).await;
    assert_eq!(state.fencing_token(), Some(token), "still the holder until it releases: {state:?}");
    disconnected(&mut events).await;
    assert!(matches!(in_ours.state(), ContenderState::Held { .. }), "a zklock-only hold is not disturbed");
    // The shared hold must end before the session (20 s) can expire on the server: at most
    // the session less the detection (5 s at most here) and the margin (2 s) from now.
    let left = engine.hold_deadline(&in_shared.id).expect("a deadline for the shared hold") - Instant::now();
    assert!(left <= Duration::from_secs(13), "{left:?}");
    assert_eq!(engine.hold_deadline(&in_ours.id), None, "a zklock-only hold has no deadline");
    proxy.set_blackhole(false);
    within("the engine to report the reconnection", async {
        while !matches!(events.recv().await, Some(EngineEvent::Session(SessionEvent::Reconnected))) {}
    })
    .await;
    assert_eq!(engine.hold_deadline(&in_shared.id), None, "the session lives: its grace period applies");
    // Sticky: the request stands after the connection comes back, and the zklock-only hold is
    // untouched.
    let request = in_shared.state();
    assert!(matches!(request, ContenderState::RevokeRequested { .. }), "{request:?}");
    engine.release(&in_shared.id).await.unwrap();
    assert!(in_ours.state().is_held());
}

/// A directory marked as shared with foreign clients before (by an earlier process), with no
/// foreign node in it now: the engine learns it from the marker, so a dropped connection asks
/// its holder to let go there too.
#[tokio::test]
async fn a_lock_marked_shared_earlier_is_known_as_such_without_a_foreign_node() {
    let (proxy, engine, mut events, connect) = behind_proxy(Duration::from_secs(20)).await;
    let raw = raw_client(&connect).await;
    let marked = "/locks/ns/marked-earlier";
    raw.mkdir(marked, &zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all())).await.unwrap();
    raw.set_data(marked, b"-1", None).await.unwrap();
    let mut holder = enqueue(&engine, marked, Mode::Exclusive).await;
    held(&mut holder).await;
    proxy.set_blackhole(true);
    wait_state(&mut holder, "asked to let go", |s| matches!(s, ContenderState::RevokeRequested { .. })).await;
    disconnected(&mut events).await;
    proxy.set_blackhole(false);
    engine.release(&holder.id).await.unwrap();
}

/// docs/design.md: fencing: once a new leader took the epoch, the old leader's engine (its process and
/// session still alive) can change no lock: no create, no delete, no revocation, no re-anchor.
#[tokio::test]
async fn a_deposed_leaders_engine_is_fenced_by_the_next_epoch() {
    const EPOCH: &str = "/leader-epoch";
    let connect = chroot().await;
    let raw = raw_client(&connect).await;
    let old = engine(&connect).await;
    let first = old.take_epoch(EPOCH, "old").await.unwrap();
    let mut holder = enqueue(&old, LOCK, Mode::Exclusive).await;
    held(&mut holder).await;
    let mut fenced = old.fenced();
    assert!(!*fenced.borrow(), "not fenced while its epoch is current");

    let new = engine(&connect).await;
    let second = new.take_epoch(EPOCH, "new").await.unwrap();
    assert!(second > first, "each leader takes a higher epoch ({first} then {second})");

    let refused = old.enqueue(spec(LOCK, Mode::Exclusive)).await;
    assert!(matches!(refused, Err(zklock::zk::Error::Fenced { .. })), "create after the new epoch: {refused:?}");
    within("the old engine to report itself fenced", fenced.wait_for(|f| *f)).await.unwrap();
    let release = old.release(&holder.id).await;
    assert!(matches!(release, Err(zklock::zk::Error::Fenced { .. })), "delete after the new epoch: {release:?}");
    let revoke = old.request_revocation(&holder.node, "stale").await;
    assert!(matches!(revoke, Err(zklock::zk::Error::Fenced { .. })), "revocation after the new epoch: {revoke:?}");
    let reanchor = old
        .reanchor(LOCK, vec![Recorded { spec: spec(LOCK, Mode::Exclusive), held: false, node: None, ticket: None }])
        .await;
    assert!(matches!(reanchor, Err(zklock::zk::Error::Fenced { .. })), "re-anchor after the new epoch: {reanchor:?}");
    let left = children(&raw, LOCK).await;
    assert_eq!(left.len(), 1, "only the holder's node, untouched: {left:?}");
    assert!(holder.node.ends_with(&left[0]));
    let (data, _) = raw.get_data(&holder.node).await.unwrap();
    assert!(!String::from_utf8_lossy(&data).contains("stale"), "no revocation request was written");

    // The new leader's writes go through.
    let mut next = enqueue(&new, LOCK, Mode::Exclusive).await;
    wait_state(&mut next, "the new leader's contender queues", is_waiting).await;
}

/// `--zk-tls-*`: the engine reaches ZooKeeper over TLS (a real server with a Netty TLS client
/// port that requires client certificates), and a wrong CA, a missing client certificate or a
/// plain-text port are refused with an error that says what to check.
#[tokio::test]
async fn tls_with_the_right_ca_works_and_anything_else_is_refused_clearly() {
    use zklock::zk::{Error, TlsPem};
    use zklock_testkit::tls::TestPki;
    let pki = TestPki::generate();
    let (server, secure) = ZkServer::start_tls(&pki);
    let tls = TlsPem { ca: pki.ca_pem(), identity: Some(pki.client_pem()) };
    let config =
        |connect: &str, tls: TlsPem| ZkConfig::new(connect).with_session_timeout(Duration::from_secs(4)).with_tls(tls);

    // The server's first TLS handshakes run in a JVM still warming up; with the suite's other
    // servers starting on the same two cores they took longer than the 4 s connect timeout
    // (`NoHosts`, twice in a row on a loaded machine). The right configuration is tried again
    // until a deadline, as the operator retries its first connect; the refusals below still must
    // come, each with its reason.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let engine = loop {
        match Engine::connect(config(&secure, tls.clone())).await {
            Ok(engine) => break engine,
            Err(e) if std::time::Instant::now() < deadline => eprintln!("TLS with the right CA, again: {e}"),
            Err(e) => panic!("TLS with the right CA: not connected within 60 s: {e:?}"),
        }
    };
    let mut c = enqueue(&engine, LOCK, Mode::Exclusive).await;
    held(&mut c).await;
    let raw = raw_client(server.connect()).await;
    assert_eq!(children(&raw, LOCK).await.len(), 1, "the node made over TLS is on the server");

    let other = TestPki::generate();
    let refusals = [
        ("a wrong CA", config(&secure, TlsPem { ca: other.ca_pem(), identity: tls.identity.clone() })),
        ("no client certificate", config(&secure, TlsPem { ca: pki.ca_pem(), identity: None })),
        ("TLS to the plain-text port", config(server.connect(), tls.clone())),
    ];
    for (what, config) in refusals {
        let refused = within(what, LockEngine::connect(config)).await.err();
        eprintln!("{what}: {refused:?}");
        match refused {
            Some(e @ Error::ConnectTls { .. }) => {
                assert!(e.to_string().contains("--zk-tls-ca"), "{what}: the message says what to check: {e}")
            }
            other => panic!("{what}: expected a TLS connect error, got {other:?}"),
        }
    }
    let plain = within("plain text to the TLS port", LockEngine::connect(ZkConfig::new(&secure))).await;
    assert!(plain.is_err(), "a plain-text client on the TLS port is refused");
    let bad_pem = config(&secure, TlsPem { ca: "not a certificate".into(), identity: None });
    match LockEngine::connect(bad_pem).await.err() {
        Some(e @ Error::Tls(_)) => assert!(e.to_string().contains("--zk-tls-ca"), "{e}"),
        other => panic!("a CA that is not PEM: {other:?}"),
    }
}

/// The operator's sessions are detached: a leader that steps down or exits leaves its nodes to
/// the session timeout, so that the next leader's re-anchoring replaces them in one step and no
/// foreign waiter sees the lock free in between. An engine that is not detached closes its
/// session, and its nodes go at once.
#[tokio::test]
async fn a_detached_engine_leaves_its_nodes_to_the_session_timeout() {
    let connect = chroot().await;
    let raw = raw_client(&connect).await;
    for detached in [false, true] {
        let mut config = ZkConfig::new(&connect).with_session_timeout(Duration::from_secs(4));
        config.detached = detached;
        let engine = Engine::connect(config).await.unwrap();
        let mut c = enqueue(&engine, LOCK, Mode::Exclusive).await;
        held(&mut c).await;
        let node = c.node.clone();
        let (_, watcher) = raw.check_and_watch_stat(&node).await.unwrap();
        let dropped = std::time::Instant::now();
        drop((c, engine));
        let event = within("the node to go", watcher.changed()).await;
        assert_eq!(event.event_type, zkc::EventType::NodeDeleted);
        let gone_after = dropped.elapsed();
        eprintln!("detached={detached}: node gone {gone_after:?} after the engine");
        if detached {
            assert!(
                gone_after >= Duration::from_secs(2),
                "kept until the session timed out, went after {gone_after:?}"
            );
        } else {
            assert!(gone_after < Duration::from_secs(2), "closed with the engine, went after {gone_after:?}");
        }
    }
}

/// Locks no longer used do not pile up: when the last contender leaves, the lock's directory
/// goes, and its namespace's directory once that is empty too; a directory where a foreign
/// node was ever seen stays, to keep its mark, and one with another client's node is never
/// touched.
#[tokio::test]
async fn empty_lock_directories_are_removed_unless_marked_foreign() {
    let connect = chroot().await;
    let mut config = ZkConfig::new(&connect).with_session_timeout(Duration::from_secs(4));
    config.idle_directory_grace = Duration::from_millis(100);
    let engine = Engine::connect(config).await.unwrap();
    let raw = raw_client(&connect).await;
    let gone = |path: &'static str| {
        let raw = &raw;
        async move {
            within(&format!("{path} to be removed"), async {
                loop {
                    let (stat, watcher) = raw.check_and_watch_stat(path).await.unwrap();
                    if stat.is_none() {
                        return;
                    }
                    watcher.changed().await;
                }
            })
            .await
        }
    };
    let a = enqueue(&engine, "/locks/ns1/a", Mode::Exclusive).await;
    let b = enqueue(&engine, "/locks/ns1/b", Mode::Exclusive).await;
    engine.release(&a.id).await.unwrap();
    gone("/locks/ns1/a").await;
    assert!(raw.check_stat("/locks/ns1").await.unwrap().is_some(), "the namespace still has lock b");
    engine.release(&b.id).await.unwrap();
    gone("/locks/ns1/b").await;
    gone("/locks/ns1").await;
    assert!(engine.stats().directories_removed >= 2);
    // Used again: made again.
    let mut again = enqueue(&engine, "/locks/ns1/a", Mode::Exclusive).await;
    held(&mut again).await;
    engine.release(&again.id).await.unwrap();

    // A foreign node seen once: the directory keeps its mark, empty or not.
    let options = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    raw.mkdir("/locks/ns2/shared", &zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all())).await.unwrap();
    let (_, foreign) = raw.create("/locks/ns2/shared/_c_x-lock-", b"", &options).await.unwrap();
    let mut ours = enqueue(&engine, "/locks/ns2/shared", Mode::Exclusive).await;
    wait_state(&mut ours, "ours waits behind the foreign node", is_waiting).await;
    raw.delete(&format!("/locks/ns2/shared/_c_x-lock-{foreign}"), None).await.unwrap();
    held(&mut ours).await;
    engine.release(&ours.id).await.unwrap();
    let mut last = enqueue(&engine, "/locks/ns2/shared", Mode::Exclusive).await;
    held(&mut last).await;
    engine.release(&last.id).await.unwrap();
    let (marker, _) = raw.get_data("/locks/ns2/shared").await.unwrap();
    assert_eq!(marker, b"-1", "the mark stays");
}

/// A group (one claim over several locks): its nodes are made in one multi-op, so two groups
/// named over the same locks in opposite orders stand in the same order in both; each part
/// follows its own lock's recipe (a foreign contender ahead in one lock holds up that part
/// only), and the group is released in one multi-op.
#[tokio::test]
async fn a_group_is_enqueued_and_released_at_once_and_keeps_one_order_in_every_lock() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let (a, b) = ("/locks/ns/group-a", "/locks/ns/group-b");
    let part = |group: &str, i: usize, lock: &str| zklock::zk::ContenderSpec {
        id: format!("{group}-x{i}").into(),
        lock: lock.into(),
        mode: Mode::Exclusive,
        description: group.into(),
    };
    // A Curator-style contender holds b first.
    let options = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    raw.mkdir(b, &zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all())).await.unwrap();
    let (_, foreign_seq) = raw.create(&format!("{b}/_c_f00d-lock-"), b"", &options).await.unwrap();
    let first = engine.enqueue_group(vec![part("g1", 0, a), part("g1", 1, b)]).await.unwrap();
    assert!(first[0].is_held(), "g1 holds a: {first:?}");
    assert!(matches!(first[1], ContenderState::Waiting { ahead: 1, .. }), "and waits behind the stranger in b");
    // g2 names the locks the other way round: behind g1 in both.
    let second = engine.enqueue_group(vec![part("g2", 0, b), part("g2", 1, a)]).await.unwrap();
    assert!(second.iter().all(|s| matches!(s, ContenderState::Waiting { .. })), "{second:?}");
    let in_a = children(&raw, a).await;
    let in_b = children(&raw, b).await;
    let order = |names: &[String]| -> Vec<String> {
        zklock::recipe::queue(names).iter().filter_map(|c| c.ours.map(|(id, _)| id[..2].to_string())).collect()
    };
    assert_eq!(order(&in_a), ["g1", "g2"]);
    assert_eq!(order(&in_b), ["g1", "g2"], "the same order in every lock they share");
    raw.delete(&format!("{b}/_c_f00d-lock-{foreign_seq}"), None).await.unwrap();
    let mut g1b = engine.contender("g1-x1");
    held(&mut g1b).await;
    assert!(engine.release_group(&["g1-x0", "g1-x1"]).await.unwrap());
    for id in ["g2-x0", "g2-x1"] {
        held(&mut engine.contender(id)).await;
    }
    assert_eq!(order(&children(&raw, a).await), ["g2"], "both of g1's nodes went");
    assert_eq!(order(&children(&raw, b).await), ["g2"]);
    assert!(!engine.release_group(&["g1-x0", "g1-x1"]).await.unwrap(), "released already");
}

/// A re-anchoring pass admits lock by lock (docs/design.md: re-anchoring): a lock it is to
/// re-anchor takes no new contender until it was (a node made before would jump the recorded
/// queue), every other lock takes them at once, and a second pass in the same session
/// re-anchors only the locks the first left undone (the others have new contenders already).
#[tokio::test]
async fn a_reanchoring_pass_admits_each_lock_once_it_is_reanchored() {
    use std::collections::HashSet;
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let (a, b, free) = ("/locks/ns/pass-a", "/locks/ns/pass-b", "/locks/ns/pass-free");
    let set = |locks: &[&str]| locks.iter().map(|l| l.to_string()).collect::<HashSet<String>>();
    let (session, todo) = engine.begin_reanchoring(set(&[a, b])).unwrap();
    assert_eq!(todo, set(&[a, b]));
    assert!(!engine.admitting(), "two locks wait for the pass");
    assert!(engine.admitting_in([free]) && !engine.admitting_in([free, a]));
    let early = engine.enqueue(spec(a, Mode::Exclusive)).await;
    assert!(matches!(early, Err(zklock::zk::Error::NotAdmitted)), "enqueue before {a} is re-anchored: {early:?}");
    let both = engine.enqueue_group(vec![spec(free, Mode::Exclusive), spec(a, Mode::Exclusive)]).await;
    assert!(matches!(both, Err(zklock::zk::Error::NotAdmitted)), "a group with {a} in it: {both:?}");
    assert!(children(&raw, a).await.is_empty(), "no node was made in {a}");
    held(&mut enqueue(&engine, free, Mode::Exclusive).await).await;

    engine.reanchor(a, vec![]).await.unwrap();
    engine.admit_lock(session + 1, a);
    assert!(!engine.admitting_in([a]), "another session's word admits nothing");
    engine.admit_lock(session, a);
    held(&mut enqueue(&engine, a, Mode::Exclusive).await).await;

    let (_, todo) = engine.begin_reanchoring(set(&[a, b, free])).unwrap();
    assert_eq!(todo, set(&[b]), "the same session's second pass: only what the first left undone");
    assert!(engine.admitting_in([a, free]) && !engine.admitting_in([b]));
    engine.admit().unwrap();
    assert!(engine.admitting(), "the pass is over: every lock");
}
