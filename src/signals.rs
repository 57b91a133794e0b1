//! The signals `zklock acquire` and `zklock exec` handle. They are installed before the first
//! API call: a signal that arrives while the claim is being created must withdraw it, not end
//! the process with the claim left behind.

use rustix::process::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The signals handled, with their conventional exit codes (128 + number). While zklock waits
/// for the lock each of them ends it (as its default action would, the claim withdrawn first);
/// while `exec`'s command runs they are passed on to it.
pub const HANDLED: [(SignalKind, Signal, &str, u8); 6] = [
    (SignalKind::interrupt(), Signal::INT, "SIGINT", 130),
    (SignalKind::terminate(), Signal::TERM, "SIGTERM", 143),
    (SignalKind::hangup(), Signal::HUP, "SIGHUP", 129),
    (SignalKind::quit(), Signal::QUIT, "SIGQUIT", 131),
    (SignalKind::user_defined1(), Signal::USR1, "SIGUSR1", 138),
    (SignalKind::user_defined2(), Signal::USR2, "SIGUSR2", 140),
];

pub struct Signals(Vec<(tokio::signal::unix::Signal, usize)>);

impl Signals {
    /// Installs the handlers (from now on these signals no longer end the process by
    /// themselves). Needs a Tokio runtime.
    pub fn install() -> Result<Self, String> {
        let streams = HANDLED.iter().enumerate().map(|(i, (kind, ..))| signal(*kind).map(|s| (s, i)));
        Ok(Signals(streams.collect::<Result<_, _>>().map_err(|e| format!("cannot handle signals: {e}"))?))
    }

    /// The next signal received: its index in [`HANDLED`].
    pub async fn next(&mut self) -> usize {
        let waits = self.0.iter_mut().map(|(s, i)| Box::pin(async move { s.recv().await.map(|_| *i) }));
        match futures::future::select_all(waits).await {
            (Some(i), ..) => i,
            // A signal stream ends only when the runtime shuts down.
            (None, ..) => futures::future::pending().await,
        }
    }

    /// The next signal, as (name, exit code): while waiting for the lock, each ends zklock.
    pub async fn ending(&mut self) -> (&'static str, u8) {
        let i = self.next().await;
        (HANDLED[i].2, HANDLED[i].3)
    }
}
