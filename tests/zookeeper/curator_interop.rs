//! A client we did not write, Apache Curator's InterProcessMutex, contends with the engine on one
//! lock path. Both sides mark their critical section with the same ephemeral marker node, which
//! ZooKeeper lets exist only once: a create that fails means the other side held the lock too.

use crate::support;

use std::time::Duration;

use support::*;
use zklock::recipe::{self, Mode};

use zklock_testkit::curator;
use zookeeper_client as zkc;

const ROUNDS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_and_curator_never_hold_at_the_same_time() {
    let connect = chroot().await;
    let engine = engine(&connect).await;
    let marker_client = raw_client(&connect).await;
    let lock = "/locks/shared-with-java";

    let java_connect = connect.clone();
    let java = tokio::task::spawn_blocking(move || {
        curator::run(&["contend", &java_connect, lock, &ROUNDS.to_string(), "/marker"])
    });

    // Start once Curator is in the queue (the JVM takes a while to start), so that the rounds
    // of both sides overlap.
    within("Curator to join the queue", async {
        loop {
            let (children, _, watcher) = match marker_client.get_and_watch_children(lock).await {
                Ok(found) => found,
                Err(zkc::Error::NoNode) => {
                    let (_, watcher) = marker_client.check_and_watch_stat(lock).await.unwrap();
                    watcher.changed().await;
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            if children.iter().any(|c| recipe::parse_child(c).is_some_and(|n| n.ours.is_none())) {
                return;
            }
            watcher.changed().await;
        }
    })
    .await;

    let marker_options = zkc::CreateMode::Ephemeral.with_acls(zkc::Acls::anyone_all());
    let (mut violations, mut waited_for_curator) = (0, 0);
    for _ in 0..ROUNDS {
        let mut c = enqueue(&engine, lock, Mode::Exclusive).await;
        // Curator's nodes are `_c_<uuid>-lock-<seq>`: foreign to the recipe.
        waited_for_curator += usize::from(c.state().waits_for_foreign());
        held(&mut c).await;
        if marker_client.create("/marker", b"zklock", &marker_options).await.is_err() {
            violations += 1;
        }
        tokio::task::yield_now().await;
        if marker_client.delete("/marker", None).await.is_err() {
            violations += 1;
        }
        engine.release(&c.id).await.unwrap();
    }
    let java_out = tokio::time::timeout(Duration::from_secs(120), java).await.expect("Curator peer timed out").unwrap();
    eprintln!("zklock rounds={ROUNDS} violations={violations} waited-for-curator={waited_for_curator}; {java_out}");
    assert_eq!(violations, 0, "zklock saw Curator inside the lock");
    assert!(
        java_out.contains(&format!("rounds={ROUNDS} violations=0")),
        "Curator saw zklock inside the lock: {java_out}"
    );
    assert!(waited_for_curator > 0, "the two sides never actually contended");
}
