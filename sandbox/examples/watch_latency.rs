//! Figures for kube-sandbox: startup time and watch event latency (write → event).
//!
//! `cargo run --release -p kube-sandbox --example watch_latency [-- WRITES [OBJECTS]]`

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use std::time::{Duration, Instant};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let writes: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2000);

    // Startup, in-process: bind, bootstrap namespaces, ready to serve.
    let mut starts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let sb = kube_sandbox::Sandbox::start(kube_sandbox::Options::default()).await?;
        version_ok(&sb).await?;
        starts.push(t.elapsed());
        sb.shutdown().await;
    }
    starts.sort();
    println!(
        "startup (in-process, until /version answers): p50 {} max {}",
        ms(pct(&starts, 0.5)),
        ms(pct(&starts, 1.0))
    );

    // Startup of the binary, if it has been built next to this example.
    if let Some(bin) = std::env::current_exe()?.parent().and_then(|p| p.parent()).map(|p| p.join("kube-sandbox")) {
        if bin.exists() {
            let mut times = Vec::new();
            for _ in 0..10 {
                let dir = std::env::temp_dir().join(format!("kube-sandbox-bench-{}", uuid::Uuid::new_v4().simple()));
                std::fs::create_dir_all(&dir)?;
                let kc = dir.join("kubeconfig");
                let t = Instant::now();
                let mut child = tokio::process::Command::new(&bin)
                    .args(["--port", "0", "--kubeconfig-out"])
                    .arg(&kc)
                    .stdout(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()?;
                let mut out = tokio::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
                let mut line = String::new();
                tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await?;
                times.push(t.elapsed());
                child.kill().await?;
                let _ = std::fs::remove_dir_all(&dir);
            }
            times.sort();
            println!(
                "startup (binary, spawn → URL printed): p50 {} max {}",
                ms(pct(&times, 0.5)),
                ms(pct(&times, 1.0))
            );
        } else {
            println!("startup (binary): skipped, {} not built (cargo build --release -p kube-sandbox)", bin.display());
        }
    }

    // Watch latency through kube-rs: patch a ConfigMap, time until its MODIFIED event arrives.
    let sb = kube_sandbox::Sandbox::start(kube_sandbox::Options::default()).await?;
    let dir = std::env::temp_dir().join(format!("kube-sandbox-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let kc_path = dir.join("kubeconfig");
    std::fs::write(&kc_path, sb.kubeconfig())?;
    let cfg = Config::from_custom_kubeconfig(Kubeconfig::read_from(&kc_path)?, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(cfg)?;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": "bench"}, "data": {"i": "0"}}))?;
    let made = cms.create(&PostParams::default(), &cm).await?;
    let mut stream = cms.watch(&WatchParams::default(), &made.resource_version().unwrap_or_default()).await?.boxed();
    let mut lat = Vec::with_capacity(writes);
    let all = Instant::now();
    for i in 0..writes {
        let t = Instant::now();
        let p = serde_json::json!({"data": {"i": (i + 1).to_string()}});
        let written = cms.patch("bench", &PatchParams::default(), &Patch::Merge(&p)).await?;
        let want = written.resource_version();
        loop {
            match stream.next().await {
                Some(Ok(WatchEvent::Modified(o))) if o.resource_version() == want => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err(format!("watch ended after {i} writes").into()),
            }
        }
        lat.push(t.elapsed());
    }
    let total = all.elapsed();
    lat.sort();
    println!(
        "watch latency over {writes} writes (patch sent → MODIFIED received, kube-rs client): p50 {} p99 {} max {}",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(pct(&lat, 1.0))
    );
    println!("sequential write+event rate: {:.0}/s", writes as f64 / total.as_secs_f64());

    // Scale: many objects in one namespace, as the operator's 10,000-claim runs create.
    let objects: usize = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let before = rss_kib();
    let t = Instant::now();
    let mut tasks = futures::stream::iter(0..objects)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("obj-{i}"), "labels": {"bench": "scale"}},
                    "data": {"payload": "x".repeat(200)}
                }))?;
                cms.create(&PostParams::default(), &cm).await?;
                Ok::<_, Box<dyn std::error::Error>>(())
            }
        })
        .buffer_unordered(16);
    while let Some(r) = tasks.next().await {
        r?;
    }
    let created = t.elapsed();
    let t = Instant::now();
    let listed = cms.list(&kube::api::ListParams::default().labels("bench=scale")).await?.items.len();
    let list_time = t.elapsed();
    let after = rss_kib();
    println!(
        "{objects} objects: created at {:.0}/s (16 in flight), labelled list of {listed} in {}, process RSS +{} MiB",
        objects as f64 / created.as_secs_f64(),
        ms(list_time),
        after.saturating_sub(before) / 1024
    );
    let _ = std::fs::remove_dir_all(&dir);
    sb.shutdown().await;
    Ok(())
}

/// Resident set size of this process (client and in-process sandbox together), in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").trim().to_string()))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Waits until the sandbox answers /version over TCP (a bare HTTP/1.1 request, no client setup).
async fn version_ok(sb: &kube_sandbox::Sandbox) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(sb.addr()).await?;
    s.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    if !buf.starts_with(b"HTTP/1.1 200") {
        return Err(std::io::Error::other("unexpected /version answer"));
    }
    Ok(())
}
