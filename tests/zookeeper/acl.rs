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
