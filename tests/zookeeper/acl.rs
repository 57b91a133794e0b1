//! With credentials (`--zk-auth`), what another ZooKeeper client may and may not do: it may
//! contend in a lock directory (make and delete its own node, as Curator does), but it may not
//! write the leader epoch (which would fence the leader at will) nor a directory's marker of
//! foreign clients (resetting it would make a later re-anchoring keep holders in a lock foreign
//! clients use). Also for nodes made open before the operator had credentials.

use crate::support;

use std::time::Duration;

use support::*;
use zklock::recipe::Mode;
use zklock::zk::ZkConfig;
use zookeeper_client as zkc;

const SHARED: &str = "/locks/ns/shared";
const FRESH: &str = "/locks/ns/fresh";
const EPOCH: &str = "/leader-epoch";

#[tokio::test]
async fn with_credentials_only_zklock_writes_the_epoch_and_the_markers_and_others_still_contend() {
    let connect = chroot().await;
    // Another client, without credentials. It made a lock directory first, open to all (as
    // Curator does), and an earlier zklock without credentials left the epoch open too.
    let other = raw_client(&connect).await;
    let open = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    other.mkdir(SHARED, &open).await.unwrap();
    other.create(EPOCH, b"", &open).await.unwrap();
    let contender = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    other.create(&format!("{SHARED}/_c_other-lock-"), b"", &contender).await.unwrap();

    let mut config = ZkConfig::new(connect.clone()).with_session_timeout(Duration::from_secs(4));
    config.digest_auth = Some("zklock:s3cret".into());
    let engine = Engine::connect(config).await.unwrap();
    engine.take_epoch(EPOCH, "the leader").await.unwrap();
    // Queued behind the stranger: the engine sees it and marks the directory.
    let waiter = enqueue(&engine, SHARED, Mode::Exclusive).await;
    let (marker, _) = other.get_data(SHARED).await.unwrap();
    assert_eq!(marker, b"-1", "the directory is marked as shared with foreign clients");
    let mut held = enqueue(&engine, FRESH, Mode::Exclusive).await;
    support::held(&mut held).await;

    for path in [EPOCH, SHARED, FRESH] {
        let write = other.set_data(path, b"0", None).await;
        assert_eq!(write.err(), Some(zkc::Error::NoAuth), "another client wrote {path}");
        let reopen = other.set_acl(path, &zkc::Acls::anyone_all(), None).await;
        assert_eq!(reopen.err(), Some(zkc::Error::NoAuth), "another client reopened {path}");
    }
    for dir in [SHARED, FRESH] {
        let (_, sequence) = other.create(&format!("{dir}/_c_again-lock-"), b"", &contender).await.unwrap();
        let node = format!("{dir}/_c_again-lock-{sequence}");
        other.delete(&node, None).await.unwrap_or_else(|e| panic!("another client deletes its own node in {dir}: {e}"));
    }
    // Our own nodes cannot be rewritten. (They can be deleted: ZooKeeper checks a delete
    // against the directory, which must let every contender delete its own node. A holder
    // whose node another client deletes is Lost, before anybody else is granted.)
    let path = if held.node.starts_with('/') { held.node.clone() } else { format!("{FRESH}/{}", held.node) };
    assert_eq!(other.set_data(&path, b"x", None).await.err(), Some(zkc::Error::NoAuth));
    assert!(is_waiting(&waiter.state()));
}

const PEER: &str = "curator:peer-pw";

async fn client_as(connect: &str, credentials: &str) -> zkc::Client {
    zkc::Client::connector()
        .with_auth("digest", credentials.as_bytes())
        .connect(connect)
        .await
        .unwrap_or_else(|e| panic!("client as {credentials}: {e}"))
}

#[tokio::test]
async fn with_listed_contenders_only_they_contend_and_nobody_else_may_delete_a_node() {
    let connect = chroot().await;
    let stranger = raw_client(&connect).await;
    let peer = client_as(&connect, PEER).await;
    let mallory = client_as(&connect, "mallory:guessed").await;
    // The peer made a lock directory first, open to all (Curator's default ACL).
    let opened = "/locks/ns/made-by-the-peer";
    let open = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    peer.mkdir(opened, &open).await.unwrap();

    let mut config = ZkConfig::new(connect.clone()).with_session_timeout(Duration::from_secs(4));
    config.digest_auth = Some("zklock:s3cret".into());
    config.contenders = zklock::zk::Contenders::Listed(vec![PEER.into()]);
    let engine = Engine::connect(config).await.unwrap();
    let mut ours = Vec::new();
    for dir in [FRESH, opened] {
        let mut c = enqueue(&engine, dir, Mode::Exclusive).await;
        support::held(&mut c).await;
        ours.push((dir, c));
    }

    let contender = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    for (dir, held) in &ours {
        let node = if held.node.starts_with('/') { held.node.clone() } else { format!("{dir}/{}", held.node) };
        for (who, other) in [("an unauthenticated client", &stranger), ("an unlisted identity", &mallory)] {
            let made = other.create(&format!("{dir}/_c_x-lock-"), b"", &contender).await;
            assert_eq!(made.err(), Some(zkc::Error::NoAuth), "{who} made a node in {dir}");
            assert_eq!(other.delete(&node, None).await.err(), Some(zkc::Error::NoAuth), "{who} deleted {node}");
            let reopen = other.set_acl(dir, &zkc::Acls::anyone_all(), None).await;
            assert_eq!(reopen.err(), Some(zkc::Error::NoAuth), "{who} reopened {dir}");
        }
        let (_, sequence) = peer.create(&format!("{dir}/_c_peer-lock-"), b"", &contender).await.unwrap();
        peer.delete(&format!("{dir}/_c_peer-lock-{sequence}"), None)
            .await
            .unwrap_or_else(|e| panic!("the listed peer deletes its own node in {dir}: {e}"));
        assert!(stranger.get_data(&node).await.is_ok(), "everybody may still read {node}");
    }
    // Taking up a directory the peer left open closed it: the peer cannot reopen it either.
    let (acl, _) = stranger.get_acl(opened).await.unwrap();
    assert!(
        acl.iter().all(|a| a.scheme() != "world" || a.permission() == zkc::Permission::READ),
        "{opened} still open: {acl:?}"
    );
    for (_, held) in &ours {
        assert!(held.state().is_held(), "{} lost the lock", held.id);
    }
}

/// docs/operations.md: rotating ZooKeeper credentials — the operator's and a listed contender's,
/// by the documented steps: add the new identity beside the old (`previous_auth`), roll, drop
/// the old. Nobody is locked out on the way, and the old identities are out at the end.
#[tokio::test]
async fn rotating_the_operators_and_a_contenders_credentials_as_documented_locks_nobody_out() {
    use zklock::zk::{Contenders, Error, Installation, Layout};
    const OLD: &str = "zklock:old-pw";
    const NEW: &str = "zklock:new-pw";
    const PEER_OLD: &str = "curator:old-pw";
    const PEER_NEW: &str = "curator:new-pw";
    let connect = chroot().await;
    let layout = Layout::new("/zklock").unwrap();
    let term = |own: &'static str, previous: &[&'static str], peers: &[&'static str]| {
        let mut config = ZkConfig::new(connect.clone()).with_session_timeout(Duration::from_secs(4));
        config.digest_auth = Some(own.into());
        config.previous_auth = previous.iter().map(|p| p.to_string()).collect();
        config.contenders = Contenders::Listed(peers.iter().map(|p| p.to_string()).collect());
        let layout = layout.clone();
        async move {
            let engine = Engine::connect(config).await?;
            let mine = Installation { installation: "rotating".into(), holder: own.into() };
            engine.take_root(&layout, mine).await?;
            engine.take_epoch(&layout.epoch(), own).await?;
            engine.take_token_base(&layout, 0, 0).await?;
            engine.admit();
            Ok::<Engine, Error>(engine)
        }
    };
    let dir = layout.lock("ns", "l");
    let identity = |credentials: &str| zklock::zk::digest_id(credentials);
    let acl_of = |client: &zkc::Client, path: String| {
        let client = client.clone();
        async move {
            let (acl, _) = client.get_acl(&path).await.unwrap_or_else(|e| panic!("ACL of {path}: {e}"));
            acl.iter().map(|a| (a.id().to_string(), a.permission())).collect::<Vec<_>>()
        }
    };

    let first = term(OLD, &[], &[PEER_OLD]).await.expect("the first term, under the old credentials");
    let mut holder = enqueue(&first, &dir, Mode::Exclusive).await;
    support::held(&mut holder).await;
    let peer = client_as(&connect, PEER_OLD).await;
    let contender = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    let (_, sequence) = peer.create(&format!("{dir}/_c_peer-lock-"), b"", &contender).await.unwrap();
    let peer_node = format!("{dir}/_c_peer-lock-{sequence}");
    drop(first);

    // The new credential alone: locked out of the root the old one made, and told how to rotate.
    let refused = term(NEW, &[], &[PEER_OLD]).await.err().expect("the new credential alone is refused");
    assert!(matches!(refused, Error::RootCredentials { .. }), "{refused}");
    assert!(refused.to_string().contains("--zk-previous-auth"), "{refused}");

    // 1. Add: the new credential with the old one as previous; the new contender listed too.
    let second = term(NEW, &[OLD], &[PEER_OLD, PEER_NEW]).await.expect("the term adding the new credential");
    // Digest identities show only to a client that may change the ACL (others see `user:x`).
    let observer = client_as(&connect, NEW).await;
    for path in [layout.root().to_string(), layout.epoch(), layout.token_base(), dir.clone()] {
        let acl = acl_of(&observer, path.clone()).await;
        for who in [identity(NEW), identity(OLD)] {
            assert!(acl.iter().any(|(id, p)| *id == who && *p == zkc::Permission::ALL), "{path}: {who} in {acl:?}");
        }
    }
    // The contenders roll meanwhile: one still in its session under the old credential lets go
    // of the node it holds, one under the new credential contends.
    peer.delete(&peer_node, None).await.expect("a contender under the old credential deletes its own node");
    let peer_rotated = client_as(&connect, PEER_NEW).await;
    let (_, sequence) = peer_rotated.create(&format!("{dir}/_c_peer-lock-"), b"", &contender).await.unwrap();
    peer_rotated.delete(&format!("{dir}/_c_peer-lock-{sequence}"), None).await.expect("the rotated contender");
    drop((peer, second));

    // 2. Drop the old ones.
    let third = term(NEW, &[], &[PEER_NEW]).await.expect("the term under the new credentials alone");
    for path in [layout.root().to_string(), layout.epoch(), dir.clone()] {
        let acl = acl_of(&observer, path.clone()).await;
        assert!(!acl.iter().any(|(id, _)| *id == identity(OLD) || *id == identity(PEER_OLD)), "{path}: {acl:?}");
    }
    let old = client_as(&connect, OLD).await;
    assert_eq!(old.set_data(&layout.epoch(), b"x", None).await.err(), Some(zkc::Error::NoAuth), "the old identity");
    let old_peer = client_as(&connect, PEER_OLD).await;
    let made = old_peer.create(&format!("{dir}/_c_x-lock-"), b"", &contender).await;
    assert_eq!(made.err(), Some(zkc::Error::NoAuth), "the old contender identity still contends");
    let mut next = enqueue(&third, &dir, Mode::Exclusive).await;
    support::held(&mut next).await;
}

/// After a change of credentials a new term takes every directory of the root over (hundreds
/// here, walked many at a time), and marks the root done only after a walk that reached every
/// node: a directory it cannot read leaves the root unmarked, so that the next term walks
/// again, and that one, with nothing in its way, marks it.
#[tokio::test]
async fn the_takeover_walk_reaches_every_directory_and_marks_the_root_only_when_whole() {
    use zklock::zk::{Installation, Layout};
    const OLD: &str = "zklock:walk-old";
    const NEW: &str = "zklock:walk-new";
    const DIRECTORIES: usize = 400;
    let connect = chroot().await;
    let layout = Layout::new("/zklock").unwrap();
    let term = |own: &'static str, previous: Option<&'static str>| {
        let mut config = ZkConfig::new(connect.clone()).with_session_timeout(Duration::from_secs(4));
        config.digest_auth = Some(own.into());
        config.previous_auth = previous.iter().map(|p| p.to_string()).collect();
        let layout = layout.clone();
        async move {
            let engine = Engine::connect(config).await.unwrap_or_else(|e| panic!("connect as {own}: {e}"));
            let mine = Installation { installation: "walk".into(), holder: own.into() };
            engine.take_root(&layout, mine).await.unwrap_or_else(|e| panic!("the root, as {own}: {e}"));
            engine
        }
    };
    drop(term(OLD, None).await);
    // The directories an operator under the old credentials made: its identity alone.
    let old = client_as(&connect, OLD).await;
    let theirs = zkc::CreateMode::Persistent.with_acls(zkc::Acls::creator_all());
    let dirs: Vec<String> =
        (0..DIRECTORIES).map(|i| layout.lock(&format!("ns-{}", i % 20), &format!("l-{i}"))).collect();
    for dir in &dirs {
        old.mkdir(dir, &theirs).await.unwrap_or_else(|e| panic!("{dir}: {e}"));
    }
    // One directory nobody of zklock's may read: a stranger's alone.
    let stranger =
        zkc::Acl::new(zkc::Permission::ALL, zkc::AuthId::new("digest", &zklock::zk::digest_id("stranger:pw")));
    let hidden = layout.lock("ns-0", "hidden");
    old.create(&hidden, b"", &zkc::CreateMode::Persistent.with_acls(zkc::Acls::new(&[stranger]))).await.unwrap();
    let new_identity = zklock::zk::digest_id(NEW);
    let names_new = |client: zkc::Client, path: String| {
        let new_identity = new_identity.clone();
        async move {
            let (acl, _) = client.get_acl(&path).await.unwrap_or_else(|e| panic!("ACL of {path}: {e}"));
            acl.iter().any(|a| a.id() == new_identity && a.permission() == zkc::Permission::ALL)
        }
    };

    drop(term(NEW, Some(OLD)).await);
    for dir in &dirs {
        assert!(names_new(old.clone(), dir.clone()).await, "{dir} was not taken over");
    }
    assert!(
        !names_new(old.clone(), layout.root().to_string()).await,
        "the root was marked done though {hidden} could not be read"
    );

    old.delete(&hidden, None).await.unwrap();
    drop(term(NEW, Some(OLD)).await);
    assert!(names_new(old.clone(), layout.root().to_string()).await, "a whole walk marks the root");
}
