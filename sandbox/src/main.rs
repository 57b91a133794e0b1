//! `kube-sandbox --port 0 --kubeconfig-out PATH [--crd-dir DIR]`
#![forbid(unsafe_code)]

use kube_sandbox::{Options, Sandbox};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: kube-sandbox [--port N] [--kubeconfig-out PATH] [--crd-dir DIR] [--token TOKEN]";

fn parse() -> Result<(Options, Option<PathBuf>), String> {
    let mut opts = Options::default();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value\n{USAGE}"));
        match a.as_str() {
            "--port" => opts.port = val("--port")?.parse().map_err(|e| format!("--port: {e}"))?,
            "--kubeconfig-out" => out = Some(PathBuf::from(val("--kubeconfig-out")?)),
            "--crd-dir" => opts.crd_dir = Some(PathBuf::from(val("--crd-dir")?)),
            "--token" => opts.token = Some(val("--token")?),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok((opts, out))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let (opts, out) = match parse() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let sandbox = match Sandbox::start(opts).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kube-sandbox: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = out {
        if let Err(e) = std::fs::write(&path, sandbox.kubeconfig()) {
            eprintln!("kube-sandbox: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!("{}", sandbox.url());
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kube-sandbox: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    sandbox.shutdown().await;
    ExitCode::SUCCESS
}
