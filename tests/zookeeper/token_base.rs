//! The token base (docs/design.md: fencing tokens): a term's numbers are above the token floor
//! it is given, the base is raised by the one leader of an unshared root, and refused where
//! clusters share it until an administrator raises it with `zklock admin raise-token-base`.

use crate::support;

use support::*;
use zklock::zk::{Error, Installation, Layout};

/// A leader's term of `layout`: the root, the epoch, the base over `floor`.
async fn term(connect: &str, layout: &Layout, name: &str, floor: i64) -> (Engine, Result<i64, Error>) {
    let engine = engine(connect).await;
    let mine = Installation { installation: name.into(), holder: format!("{name}-0") };
    engine.take_root(layout, mine).await.unwrap_or_else(|e| panic!("take the root of {name}: {e}"));
    engine.take_epoch(&layout.epoch(), name).await.unwrap_or_else(|e| panic!("{name}'s epoch: {e}"));
    let base = engine.take_token_base(layout, floor, floor).await;
    (engine, base)
}

/// A holder's token in a fresh lock of `layout`.
async fn a_token(engine: &Engine, layout: &Layout, lock: &str) -> i64 {
    engine.admit();
    let mut holder = enqueue(engine, &layout.lock("ns", lock), zklock::recipe::Mode::Exclusive).await;
    held(&mut holder).await
}

#[tokio::test]
async fn a_leader_alone_on_its_root_raises_the_base_over_its_floor_and_hands_out_numbers_above_it() {
    let connect = chroot().await;
    let layout = Layout::new("/alone").unwrap();
    let (first, base) = term(&connect, &layout, "alone", 0).await;
    assert_eq!(base.expect("a new base"), 0, "no floor yet: tokens are the zxids themselves");
    let low = a_token(&first, &layout, "l1").await;
    drop(first);
    // As after the ensemble's data were made anew: the floor kept outside is far above.
    let floor = low + (1 << 41);
    let (next, base) = term(&connect, &layout, "alone", floor).await;
    assert!(base.expect("raised by the leader alone") > 0);
    assert!(next.epoch().expect("an epoch") > floor, "the epoch is handed out above the floor");
    let token = a_token(&next, &layout, "l2").await;
    assert!(token > floor, "token {token} not above the floor {floor}");
}

#[tokio::test]
async fn a_shared_base_behind_a_clusters_floor_is_refused_until_raised_by_the_admin_command() {
    let connect = chroot().await;
    let shared = |own: &str, cluster: &str| Layout::new(own).unwrap().with_shared_root("/shared", cluster).unwrap();
    let (eu, eu_layout) = (shared("/eu", "eu-1"), "eu");
    let (_eu_engine, base) = term(&connect, &eu, eu_layout, 1 << 41).await;
    assert!(base.expect("made from eu's floor") > 0);
    // Another cluster whose floor is higher still: its numbers would not be above it.
    let us = shared("/us", "us-1");
    let floor = 1 << 43;
    let (us_engine, refused) = term(&connect, &us, "us", floor).await;
    let refused = refused.expect_err("a shared base is not raised under another cluster");
    assert!(matches!(refused, Error::TokensBehindFloor { .. }), "{refused}");
    assert!(refused.to_string().contains("zklock admin raise-token-base --above"), "{refused}");
    drop(us_engine);

    // docs/operations.md: moving to a new ZooKeeper ensemble.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zklock"))
        .args(["admin", "raise-token-base", "--zk-connect", &connect, "--zk-root", "/us"])
        .args(["--zk-cluster-root", "/shared", "--above", &floor.to_string()])
        .output()
        .expect("run zklock admin raise-token-base");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("/shared/token-base"), "{said}");
    let (us_engine, base) = term(&connect, &us, "us", floor).await;
    base.expect("the raised base puts us above its floor");
    let token = a_token(&us_engine, &us, "l").await;
    assert!(token > floor, "token {token} not above the floor {floor}");
}
