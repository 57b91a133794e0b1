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
