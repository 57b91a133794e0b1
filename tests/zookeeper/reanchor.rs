//! Re-anchoring on a new session: the nodes of live contenders come back in the recorded order,
//! holders first, and the lock directory remembers whether foreign clients use it.

use crate::support;

use support::*;
use zklock::recipe::Mode;
use zklock::zk::{ContenderSpec, ContenderState, Recorded};
use zookeeper_client as zkc;

const LOCK: &str = "/locks/ns/anchored";

#[tokio::test]
async fn a_new_session_recreates_the_queue_in_order_and_replaces_the_old_nodes() {
    let connect = chroot().await;
    let old = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let mut h = enqueue(&old, LOCK, Mode::Exclusive).await;
    held(&mut h).await;
    let w1 = enqueue(&old, LOCK, Mode::Shared).await;
    let w2 = enqueue(&old, LOCK, Mode::Exclusive).await;
    let old_nodes = children(&raw, LOCK).await;
    assert_eq!(old_nodes.len(), 3);

    // A new process: its own session, while the old session still lives. It gives the
    // contenders in any order, with what their owner recorded: the engine puts the holder
    // first, then the others in the order of their recorded nodes, then one without a node.
    let new = engine(&connect).await;
    let late = spec(LOCK, Mode::Exclusive);
    let recorded = |c: &Contender, mode, held| Recorded {
        spec: ContenderSpec { id: c.id.clone().into(), lock: LOCK.into(), mode, description: "re-anchored".into() },
        held,
        node: Some(c.node.clone()),
        ticket: None,
    };
    let given = vec![
        Recorded { spec: late.clone(), held: false, node: None, ticket: None },
        recorded(&w2, Mode::Exclusive, false),
        recorded(&h, Mode::Exclusive, true),
        recorded(&w1, Mode::Shared, false),
    ];
    let anchored = new.reanchor(LOCK, given).await.unwrap();
    assert!(!anchored.foreign_seen);
    let order: Vec<&str> = anchored.contenders.iter().map(|(id, _)| &**id).collect();
    assert_eq!(order, [&*h.id, &*w1.id, &*w2.id, &*late.id], "holder, recorded nodes in order, then the rest");
    let [mut h2, mut w1b, mut w2b] = [&h, &w1, &w2].map(|c| new.contender(&c.id));
    held(&mut h2).await;
    assert!(matches!(w1b.state(), ContenderState::Waiting { ahead: 1, .. }), "{:?}", w1b.state());
    assert!(matches!(w2b.state(), ContenderState::Waiting { ahead: 2, .. }), "{:?}", w2b.state());
    let now = children(&raw, LOCK).await;
    assert_eq!(now.len(), 4, "old nodes replaced, not added to: {now:?}");
    assert!(now.iter().all(|n| !old_nodes.contains(n)));

    // The old session's contenders saw their nodes deleted; the old process going away changes
    // nothing for the new one.
    drop(old);
    new.release(&h2.id).await.unwrap();
    held(&mut w1b).await;
    new.release(&w1b.id).await.unwrap();
    held(&mut w2b).await;
}

#[tokio::test]
async fn a_foreign_node_is_remembered_and_can_overtake_a_holder_across_sessions() {
    let connect = chroot().await;
    let old = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let mut h = enqueue(&old, LOCK, Mode::Exclusive).await;
    held(&mut h).await;
    // A Curator-style contender queues behind the holder.
    let foreign = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    raw.create(&format!("{LOCK}/_c_0d1e-lock-"), b"10.0.0.7", &foreign).await.unwrap();
    // The engine marks the directory once it sees the stranger.
    let w = enqueue(&old, LOCK, Mode::Exclusive).await;
    let (marker, _) = raw.get_data(LOCK).await.unwrap();
    assert_eq!(marker, b"-1", "the directory says foreign clients use it");

    let new = engine(&connect).await;
    let recorded = |c: &Contender, held| Recorded {
        spec: ContenderSpec {
            id: c.id.clone().into(),
            lock: LOCK.into(),
            mode: Mode::Exclusive,
            description: String::new(),
        },
        held,
        node: Some(c.node.clone()),
        ticket: None,
    };
    let anchored = new.reanchor(LOCK, vec![recorded(&h, true), recorded(&w, false)]).await.unwrap();
    assert!(anchored.foreign_seen, "the directory's marker says foreign clients use it");
    // The foreign node kept its place; the holder's new node comes after it.
    let (h2, state) = &anchored.contenders[0];
    assert_eq!(**h2, *h.id);
    assert!(matches!(state, ContenderState::Waiting { ahead: 1, .. }), "{state:?}");
}

/// A foreign node made between re-anchoring's listing and its multi-op (the multi's guard,
/// the directory's data version, does not see new children) is still found: the directory
/// counts as shared with foreign clients, so a recorded holder there does not claim continuity.
#[tokio::test]
async fn a_foreign_node_made_during_re_anchoring_is_caught_after_the_commit() {
    let server = zklock_testkit::ZkServer::shared();
    let connect = server.chroot().await;
    let chroot = connect[connect.find('/').unwrap()..].to_string();
    let proxy = zklock_testkit::proxy::Proxy::start(server.addr()).await;
    let engine = engine(&proxy.connect_string(&chroot)).await;
    let raw = std::sync::Arc::new(raw_client(&connect).await);
    let options = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    raw.mkdir(LOCK, &options).await.unwrap();
    let stranger = raw.clone();
    proxy.before_next_multi(move || async move {
        let options = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
        stranger.create(&format!("{LOCK}/_c_stranger-lock-"), b"", &options).await.unwrap();
    });
    let holder = spec(LOCK, Mode::Exclusive);
    let anchored =
        engine.reanchor(LOCK, vec![Recorded { spec: holder, held: true, node: None, ticket: None }]).await.unwrap();
    assert!(anchored.foreign_seen, "the stranger's node made during re-anchoring was noticed");
    let (marker, _) = raw.get_data(LOCK).await.unwrap();
    assert_eq!(marker, b"-1", "and recorded in the directory");
    let names = children(&raw, LOCK).await;
    assert_eq!(names.len(), 2, "{names:?}");
}

/// Lowering a lock's permits takes nothing away, and neither does a new session: the recorded
/// holders come back first and keep the lock whatever the limit is now (docs/design.md: re-anchoring). Also
/// when the `Lock` went (a mutex now) with several exclusive holders recorded.
#[tokio::test]
async fn recorded_holders_keep_the_lock_across_a_new_session_whatever_its_limit_is_now() {
    use zklock::recipe::Limit;
    for now in [Limit::from_permits(Some(1)), Limit::Mutex] {
        let connect = chroot().await;
        let old = engine(&connect).await;
        old.set_limit(LOCK, Limit::from_permits(Some(3)));
        let mut holders = vec![];
        for _ in 0..3 {
            let mut h = enqueue(&old, LOCK, Mode::Exclusive).await;
            held(&mut h).await;
            holders.push(h);
        }
        let waiter = enqueue(&old, LOCK, Mode::Exclusive).await;

        let new = engine(&connect).await;
        new.set_limit(LOCK, now);
        let recorded = |c: &Contender, held| Recorded {
            spec: ContenderSpec {
                id: c.id.clone().into(),
                lock: LOCK.into(),
                mode: Mode::Exclusive,
                description: String::new(),
            },
            held,
            node: Some(c.node.clone()),
            ticket: None,
        };
        let mut given: Vec<Recorded> = holders.iter().map(|h| recorded(h, true)).collect();
        given.push(recorded(&waiter, false));
        let anchored = new.reanchor(LOCK, given).await.unwrap();
        for (id, state) in &anchored.contenders[..3] {
            assert!(state.is_held(), "{now:?}: recorded holder {id} kept the lock: {state:?}");
        }
        let mut waiter = new.contender(&waiter.id);
        assert!(is_waiting(&waiter.state()), "{now:?}: {:?}", waiter.state());
        // Only once fewer hold than the limit now allows is the waiter granted.
        for h in &holders[..2] {
            new.release(&h.id).await.unwrap();
        }
        // A read of the directory decides nothing new: one holder left, and the limit is one.
        new.refresh_positions(LOCK, 10).await.unwrap();
        let state =
            wait_state(&mut waiter, "one ahead", |s| matches!(s, ContenderState::Waiting { ahead: 1, .. })).await;
        assert!(!state.is_held(), "{now:?}: granted beside a holder");
        new.release(&holders[2].id).await.unwrap();
        held(&mut waiter).await;
    }
}

/// Which nodes are ours is read from their data, not their names: a node the zklock of another
/// root made (named exactly as ours, as an operator of another cluster sharing the lock would
/// make it) is not deleted by re-anchoring, keeps its place, and counts as foreign use (it may
/// have held the lock in our session gap). Before, every node named as ours was taken for one of
/// our earlier sessions' and deleted.
#[tokio::test]
async fn a_node_another_roots_zklock_made_is_not_ours_to_re_anchor_away() {
    let connect = chroot().await;
    let old = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let mut h = enqueue(&old, LOCK, Mode::Exclusive).await;
    held(&mut h).await;
    let id = "0d1e5f00-0000-4000-8000-00000000beef";
    let data = serde_json::json!({ "owner": "zklock", "id": id, "mode": "Exclusive", "root": "another-root" });
    let theirs = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    raw.create(&format!("{LOCK}/write-{id}-lock-"), &serde_json::to_vec(&data).unwrap(), &theirs).await.unwrap();
    let their_node = children(&raw, LOCK).await.into_iter().find(|n| n.contains(id)).expect("their node");

    let new = engine(&connect).await;
    let recorded = Recorded {
        spec: ContenderSpec {
            id: h.id.clone().into(),
            lock: LOCK.into(),
            mode: Mode::Exclusive,
            description: String::new(),
        },
        held: true,
        node: Some(h.node.clone()),
        ticket: None,
    };
    let anchored = new.reanchor(LOCK, vec![recorded]).await.unwrap();
    let now = children(&raw, LOCK).await;
    assert!(now.contains(&their_node), "another root's node stays: {now:?}");
    assert!(!now.contains(&h.node), "our earlier session's node goes: {now:?}");
    assert!(anchored.foreign_seen, "another root's node is foreign use");
    let (marker, _) = raw.get_data(LOCK).await.unwrap();
    assert_eq!(marker, b"-1", "the directory says others use it");
    let (_, state) = &anchored.contenders[0];
    assert!(matches!(state, ContenderState::Waiting { ahead: 1, .. }), "behind their node: {state:?}");
}

/// Curator makes lock directories as containers, which ZooKeeper removes once empty: a holder's
/// directory can vanish in a session gap (our node gone with the session, the foreign client's
/// released), and with it the marker that says foreign clients use it. A directory made after
/// a recorded contender first queued there counts as shared with foreign clients: the holder
/// cannot claim continuity (issue 53).
#[tokio::test]
async fn a_directory_made_again_since_a_contender_queued_counts_as_used_by_foreign_clients() {
    const REAPED: &str = "/locks/ns/reaped";
    let connect = chroot().await;
    let old = engine(&connect).await;
    let raw = raw_client(&connect).await;
    let mut h = enqueue(&old, REAPED, Mode::Exclusive).await;
    held(&mut h).await;
    let ticket = old.ticket(&h.id).expect("a ticket");
    // The session ends with the node; the empty directory is removed (as ZooKeeper reaps a
    // container), and made again by somebody else, unmarked.
    drop(old);
    let node = format!("{REAPED}/{}", h.node.rsplit('/').next().unwrap());
    if let (Some(_), gone) = raw.check_and_watch_stat(&node).await.unwrap() {
        within("h's node to go with its session", gone.changed()).await;
    }
    raw.delete(REAPED, None).await.unwrap();
    raw.create(REAPED, b"", &zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all())).await.unwrap();

    let new = engine(&connect).await;
    let recorded = Recorded {
        spec: ContenderSpec {
            id: h.id.clone().into(),
            lock: REAPED.into(),
            mode: Mode::Exclusive,
            description: "h".into(),
        },
        held: true,
        node: Some(h.node.clone()),
        ticket: Some(ticket),
    };
    let anchored = new.reanchor(REAPED, vec![recorded]).await.unwrap();
    assert!(anchored.foreign_seen, "nothing recorded in the directory survived its removal");
    let (marker, _) = raw.get_data(REAPED).await.unwrap();
    assert_eq!(marker, b"-1", "and it is marked from now on");
    new.release(&h.id).await.unwrap();
}
