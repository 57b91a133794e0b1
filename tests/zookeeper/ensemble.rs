//! The engine on a three-node ensemble: losing the leader moves the session to another server;
//! the session, its nodes and the queue survive, and the lock is handed on as usual.

use crate::support;

use support::*;
use zklock::recipe::Mode;
use zklock::zk::{ContenderState, EngineEvent, SessionEvent, ZkConfig};
use zklock_testkit::Ensemble;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_failover_keeps_the_session_and_the_queue() {
    let mut ensemble = Ensemble::start(3);
    let config = ZkConfig::new(ensemble.connect()).with_session_timeout(std::time::Duration::from_secs(10));
    let (engine, mut events) = Engine::connect_with_events(config).await.unwrap();
    let lock = "/locks/failover";
    let mut a = enqueue(&engine, lock, Mode::Exclusive).await;
    let token = held(&mut a).await;
    let mut b = enqueue(&engine, lock, Mode::Exclusive).await;
    wait_state(&mut b, "b waits", is_waiting).await;
    let session = engine.session_id();

    // Every member serves (Ensemble::start waits for it), so one of them leads.
    let leader = ensemble.leader().expect("a serving ensemble has a leader");
    ensemble.servers[leader].kill();

    // The release goes through once a new leader serves writes.
    within("release after failover", engine.release(&a.id)).await.unwrap();
    let b_token = held(&mut b).await;
    assert!(b_token > token, "fencing tokens increase across the failover");
    assert_eq!(engine.session_id(), session, "the session survived the failover");
    assert!(!matches!(b.state(), ContenderState::Lost { .. }));
    while let Ok(event) = events.try_recv() {
        assert!(!matches!(event, EngineEvent::Session(SessionEvent::Lost { .. })), "the session must not be lost");
    }
    engine.release(&b.id).await.unwrap();
}

/// Every server restarted in turn, so the engine ends up on one that has never seen its
/// watch: the engine must register its persistent watch there again (zookeeper-client 0.11
/// leaves persistent watches out of what it re-registers after a reconnection), or it would
/// hear of no change for the rest of the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_its_predecessor_go_after_every_server_restarted() {
    let mut ensemble = Ensemble::start(3);
    let config = ZkConfig::new(ensemble.connect()).with_session_timeout(std::time::Duration::from_secs(20));
    let engine = Engine::connect(config.clone()).await.unwrap();
    let other = Engine::connect(config).await.unwrap();
    let lock = "/locks/restarts";
    let mut holder = enqueue(&other, lock, Mode::Exclusive).await;
    held(&mut holder).await;
    let mut waiter = enqueue(&engine, lock, Mode::Exclusive).await;
    wait_state(&mut waiter, "the waiter waits", is_waiting).await;
    let session = engine.session_id();

    for i in 0..ensemble.servers.len() {
        ensemble.servers[i].kill();
        ensemble.servers[i].resume();
    }
    // Both engines are connected again (the release waits for it); the waiter hears of it.
    within("the holder's release", other.release(&holder.id)).await.unwrap();
    held(&mut waiter).await;
    assert_eq!(engine.session_id(), session, "the session survived the restarts");
    engine.release(&waiter.id).await.unwrap();
}
