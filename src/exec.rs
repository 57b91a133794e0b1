//! `zklock exec`: runs a command while it holds a lock, like `etcdctl lock` and `consul lock`.
//!
//! The command gets `ZKLOCK_CLAIM`, `ZKLOCK_FENCING_TOKEN`, `ZKLOCK_LOCK` and `ZKLOCK_NAMESPACE`
//! in its environment, and with several locks (`zklock exec a,b`) `ZKLOCK_FENCING_TOKEN_<LOCK>`
//! for each (the lock's name upper-cased, `-` and `.` as `_`). Signals zklock receives are passed on to it (SIGINT only when stdin is
//! not a terminal: a terminal's Ctrl-C reaches the command directly). When the holder is asked
//! to let go (`RevokeRequested`), the command gets SIGTERM, and SIGKILL shortly before the
//! revocation grace period ends (so that it is gone before the lock moves on); when the lock is
//! lost, SIGTERM at once and SIGKILL after [`LOST_GRACE`]. When the command exits, the claim is
//! deleted. zklock exits with the command's status, or with the codes of `acquire::exit`.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use rustix::process::{kill_process, Pid, Signal};
use tokio::time::Instant;

use crate::acquire::{self, exit, Failure, Held, Request};
use crate::api::{LockClaim, Phase};
use crate::signals::{Signals, HANDLED};

/// How long a command whose lock is already gone gets between SIGTERM and SIGKILL.
pub const LOST_GRACE: Duration = Duration::from_secs(5);
/// How much earlier than the end of the revocation grace period the command is killed: the
/// claim's watch event reaches zklock a little after the operator started counting.
const GRACE_MARGIN: Duration = Duration::from_secs(2);

/// Acquires, runs `command`, releases; the answer is zklock's exit code. `signals` are
/// installed before the client is made (see [`crate::signals`]).
pub async fn run(client: kube::Client, request: Request, command: Vec<String>, mut signals: Signals) -> u8 {
    let held = match acquire::acquire(client.clone(), &request, signals.ending()).await {
        Ok(held) => held,
        Err(failure) => {
            eprintln!("zklock: {failure}");
            return failure.code();
        }
    };
    eprintln!("zklock: holding lock {} (fencing token {}); running {}", request.lock, held.fencing_token, command[0]);
    let api: Api<LockClaim> = Api::namespaced(client, &request.namespace);
    let code = supervise(&api, &request, &held, &command, &mut signals).await;
    acquire::delete(&api, &held.claim, &held.uid).await;
    code
}

async fn supervise(
    api: &Api<LockClaim>,
    request: &Request,
    held: &Held,
    command: &[String],
    signals: &mut Signals,
) -> u8 {
    let mut child = tokio::process::Command::new(&command[0]);
    child
        .args(&command[1..])
        .env("ZKLOCK_CLAIM", &held.claim)
        .env("ZKLOCK_FENCING_TOKEN", &held.fencing_token)
        .env("ZKLOCK_LOCK", &request.lock)
        .env("ZKLOCK_NAMESPACE", &request.namespace);
    // Several locks: each one's token of its own.
    for (lock, token) in &held.tokens {
        child.env(acquire::token_variable(lock), token);
    }
    let spawned = child.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("zklock: cannot run {}: {e}", command[0]);
            // As shells do: 127 not found, 126 found but not runnable.
            return if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
        }
    };
    let Some(pid) = child.id().and_then(|id| Pid::from_raw(id as i32)) else {
        // No pid: it has exited already.
        return status_code(child.wait().await.ok());
    };
    let send = |signal: Signal| {
        if let Err(e) = kill_process(pid, signal) {
            tracing::debug!(error = %e, "signal not delivered (the command has exited)");
        }
    };
    let interactive = std::io::stdin().is_terminal();
    let mut claims = std::pin::pin!(acquire::watch(api, &held.claim));
    let mut ending: Option<Failure> = None;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            i = signals.next() => {
                let (_, signal, name, _) = HANDLED[i];
                if !(signal == Signal::INT && interactive) {
                    tracing::debug!(signal = name, "passing the signal on");
                    send(signal);
                }
            }
            seen = claims.next(), if ending.is_none() => {
                let claim = seen.flatten().filter(|c| c.metadata.uid.as_deref() == Some(held.uid.as_str()));
                let phase = claim.as_ref().and_then(|c| c.status.as_ref()).and_then(|s| s.phase);
                let why = match (&claim, phase) {
                    (None, _) => Some(Failure::Lost(format!("LockClaim {} was deleted while the command ran", held.claim))),
                    (Some(c), Some(Phase::Held)) if acquire::revoke_requested(c) => {
                        Some(Failure::Revoked(format!("LockClaim {} was asked to let go", held.claim)))
                    }
                    (Some(c), Some(p)) if p.is_terminal() => Some(acquire::ended(&held.claim, p, &c.status.clone().unwrap_or_default())),
                    _ => None,
                };
                if let Some(why) = why {
                    let grace = match &why {
                        Failure::Revoked(_) if phase == Some(Phase::Held) => {
                            held.grace.saturating_sub(GRACE_MARGIN).max(held.grace / 2)
                        }
                        _ => LOST_GRACE,
                    };
                    eprintln!("zklock: {why}; SIGTERM to the command, SIGKILL in {}s if it is still running", grace.as_secs_f32());
                    send(Signal::TERM);
                    kill_at = Some(Instant::now() + grace);
                    ending = Some(why);
                }
            }
            _ = sleep_until(kill_at) => {
                eprintln!("zklock: the command did not stop in time; SIGKILL");
                send(Signal::KILL);
                kill_at = None;
            }
        }
    };
    match ending {
        Some(why) => {
            eprintln!("zklock: exiting {} ({why})", why.code());
            why.code()
        }
        None => status_code(status),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

/// A child's exit status as a process exit code: its own, or 128 + the signal that ended it.
fn status_code(status: Option<std::process::ExitStatus>) -> u8 {
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => (code & 0xff) as u8,
            (None, Some(signal)) => 128u8.saturating_add(signal as u8),
            (None, None) => exit::ERROR,
        },
        None => exit::ERROR,
    }
}
