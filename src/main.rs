#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use zklock::zk::{LockEngine, ZkConfig};

/// zklock: lease-style locks as Kubernetes custom resources, backed by ZooKeeper.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the LockClaim CustomResourceDefinition as YAML (what crds/ and the chart hold).
    Crd,
    /// Print the queue of one lock, holders first, as ZooKeeper has it.
    Queue {
        /// ZooKeeper connect string: HOST:PORT[,HOST:PORT...][/chroot]
        #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
        zk_connect: String,
        /// Absolute path of the lock directory, e.g. /zklock/locks/shop/db-migrations
        lock: String,
    },
    /// Ask the holder of a lock node to let go, by writing a revocation request into its data.
    Revoke {
        #[arg(long, env = "ZKLOCK_ZK_CONNECT")]
        zk_connect: String,
        /// Full path of the node to revoke
        node: String,
        #[arg(long, default_value = "revoked with zklock revoke")]
        reason: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zklock: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), zklock::zk::Error> {
    let config = |connect: String| ZkConfig::new(connect).with_session_timeout(Duration::from_secs(10));
    match cli.command {
        Command::Crd => {
            print!("{}", zklock::api::crd_yaml());
            Ok(())
        }
        Command::Queue { zk_connect, lock } => {
            let engine = LockEngine::connect(config(zk_connect)).await?;
            let queue = engine.queue(&lock).await?;
            let names: Vec<&str> = queue.iter().map(|e| e.node.as_str()).collect();
            println!("{:<4} {:<10} {:<38} NODE", "POS", "MODE", "CONTENDER");
            for (position, entry) in queue.iter().enumerate() {
                let id = entry.id.as_deref().unwrap_or("(foreign)");
                let held = matches!(zklock::recipe::decide(&names, &entry.node), zklock::recipe::Decision::Held);
                let pos = if held { "held".to_string() } else { position.to_string() };
                println!("{pos:<4} {:<10} {id:<38} {}", entry.mode.to_string(), entry.node);
            }
            Ok(())
        }
        Command::Revoke { zk_connect, node, reason } => {
            let engine = LockEngine::connect(config(zk_connect)).await?;
            engine.request_revocation(&node, &reason).await
        }
    }
}
