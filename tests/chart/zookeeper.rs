//! The bundled ZooKeeper, closed by default, proven with the real server: an ensemble of
//! Debian's ZooKeeper run from the chart's own rendered `zoo.cfg` (moved to loopback ports), the
//! operator's ZooKeeper flags as the chart renders them (with credentials as the operator makes them), and
//! Apache Curator with the generated contender credentials. A client without credentials, or
//! with credentials of its own making, cannot delete, make or rewrite zklock's nodes; zklock and
//! the listed Curator client share a lock; ZooKeeper serves its Prometheus metrics.

use crate::chart_support::*;
use crate::support::{self, within, Engine};

use std::io::{Read, Write};
use std::time::Duration;

use clap::Parser;
use zklock::recipe::{self, Mode};
use zklock_testkit::curator;
use zklock_testkit::zookeeper::Ensemble;
use zookeeper_client as zkc;

/// `zklock run`'s flags, parsed as the binary parses them.
#[derive(Parser)]
struct Run {
    #[command(flatten)]
    args: zklock::operator::RunArgs,
}

const ROUNDS: usize = 3;

#[tokio::test]
async fn the_bundled_ensemble_keeps_strangers_out_while_zklock_and_a_listed_curator_client_share_a_lock() {
    let docs = documents(&render("zk-closed", None, &["zookeeper.bundled.replicas=3"]).unwrap());
    let zoo_cfg = find(&docs, "ConfigMap")
        .into_iter()
        .find_map(|c| c["data"]["zoo.cfg"].as_str())
        .expect("a ConfigMap with zoo.cfg")
        .to_string();
    assert!(zoo_cfg.contains("enforce.auth.enabled=true"), "the ensemble must require authentication:\n{zoo_cfg}");
    // The credentials the operator makes at its first start (src/operator/credentials.rs), as
    // their Secret holds them.
    let made = zklock::operator::credentials::Credentials::generate().unwrap();
    let data = made.data();
    let credential = |key: &str| String::from_utf8(data[key].0.clone()).unwrap();
    let (operator, contender) = (credential("operator"), credential("contender"));
    assert!(operator.starts_with("digest:zklock:") && contender.starts_with("digest:contender:"));
    assert_ne!(operator, contender);
    assert!(find(&docs, "Secret").is_empty(), "the chart renders no credentials");

    let deployment = find(&docs, "Deployment").into_iter().next().expect("the operator's Deployment");
    let rendered = strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(rendered.iter().any(|a| a == "--zk-contenders=listed"), "--zk-contenders=listed not among {rendered:?}");
    assert!(
        rendered.iter().any(|a| a.starts_with("--zk-auth-secret=") && a.ends_with("-zookeeper-auth")),
        "--zk-auth-secret not among {rendered:?}"
    );

    let (ensemble, metrics) = tokio::task::spawn_blocking(move || Ensemble::from_config(&zoo_cfg)).await.unwrap();
    let connect = ensemble.connect();
    let mut argv = vec!["zklock".to_string(), format!("--zk-connect={connect}")];
    argv.extend(rendered.iter().filter(|a| a.starts_with("--zk-") && !a.starts_with("--zk-connect")).cloned());
    let options = Run::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .args
        .into_options()
        .unwrap()
        .with_credentials(made.clone());
    let root = options.layout.root().to_string();
    let mut zk = options.zk;
    zk.detached = false;
    zk.session_timeout = Duration::from_secs(6);
    let engine = Engine::connect(zk).await.unwrap_or_else(|e| panic!("zklock with the rendered flags: {e}"));
    let lock = format!("{root}/locks/ns/shared-with-curator");
    let mut ours = support::enqueue(&engine, &lock, Mode::Exclusive).await;
    support::held(&mut ours).await;

    // Curator, with the contender credentials, queues behind zklock's holder.
    let (java_connect, java_lock, java_auth) = (connect.clone(), lock.clone(), contender.clone());
    let java = tokio::task::spawn_blocking(move || {
        let out = curator::command(&["contend", &java_connect, &java_lock, &ROUNDS.to_string(), "/marker"])
            .env("CURATOR_AUTH", java_auth)
            .output()
            .expect("run the Curator peer");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    });
    let watcher = client_as(&connect, &operator).await;
    within("Curator to queue behind zklock's holder", async {
        loop {
            let (children, _, changed) = watcher.get_and_watch_children(&lock).await.unwrap();
            if children.iter().any(|c| recipe::parse_child(c).is_some_and(|n| n.ours.is_none())) {
                return;
            }
            changed.changed().await;
        }
    })
    .await;
    assert!(ours.state().is_held(), "zklock's holder lost the lock to a waiter");

    // Strangers: no credentials (the ensemble ends such a session at its first request), and
    // credentials of their own making (authenticated, but no identity the ACLs name).
    let node = if ours.node.starts_with('/') { ours.node.clone() } else { format!("{lock}/{}", ours.node) };
    let stranger = zkc::Client::connector().connect(&connect).await;
    if let Ok(stranger) = stranger {
        assert!(stranger.delete(&node, None).await.is_err(), "a client without credentials deleted {node}");
    }
    let mallory = client_as(&connect, "digest:mallory:guessed").await;
    let open = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
    assert_eq!(mallory.delete(&node, None).await.err(), Some(zkc::Error::NoAuth), "mallory deleted {node}");
    let made = mallory.create(&format!("{lock}/_c_mallory-lock-"), b"", &open).await;
    assert_eq!(made.err(), Some(zkc::Error::NoAuth), "mallory joined the queue");
    assert_eq!(mallory.set_data(&lock, b"0", None).await.err(), Some(zkc::Error::NoAuth), "mallory reset the marker");
    assert!(watcher.check_stat(&node).await.unwrap().is_some(), "{node} is gone");

    // zklock lets go; Curator takes the lock its rounds, then zklock again.
    engine.release(&ours.id).await.unwrap();
    let (ok, out) = within("the Curator peer's rounds", java).await.unwrap();
    assert!(ok && out.contains(&format!("rounds={ROUNDS} violations=0")), "Curator: {out}");
    let mut again = support::enqueue(&engine, &lock, Mode::Exclusive).await;
    support::held(&mut again).await;

    // ZooKeeper's own metrics, on the port the chart names.
    let port = metrics[0].expect("the rendered zoo.cfg serves metrics");
    let scraped = tokio::task::spawn_blocking(move || http_get(port, "/metrics")).await.unwrap();
    for series in ["znode_count", "num_alive_connections", "jvm_memory_bytes_used"] {
        assert!(
            scraped.contains(series),
            "no {series} in ZooKeeper's /metrics:\n{}",
            &scraped[..scraped.len().min(2000)]
        );
    }
    drop(ensemble);
}

async fn client_as(connect: &str, credentials: &str) -> zkc::Client {
    let user_password = credentials.strip_prefix("digest:").unwrap_or(credentials);
    zkc::Client::connector()
        .with_auth("digest", user_password.as_bytes())
        .connect(connect)
        .await
        .unwrap_or_else(|e| panic!("connect as {}: {e}", user_password.split(':').next().unwrap_or_default()))
}

fn http_get(port: u16, path: &str) -> String {
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("metrics port {port}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}
