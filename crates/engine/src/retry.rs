//! Retrying ZooKeeper calls through connection loss.
//!
//! The client reconnects by itself within the session; a call that fails with `ConnectionLoss`
//! (or that the server does not answer in time) may or may not have been applied. Reads are
//! simply repeated. Writes whose outcome matters (create, delete) handle the unknown outcome
//! themselves and use [`is_unknown_outcome`] to tell it apart.

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use zookeeper_client as zk;

/// An answer the server may never give (a stuck connection) must not hang a contender forever.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Errors after which the request may or may not have been applied: the connection failed
/// under it. Besides `ConnectionLoss`, the client reports a reset connection as a `Custom` I/O
/// error for requests in flight (seen when an ensemble member is killed).
pub fn is_unknown_outcome(err: &zk::Error) -> bool {
    matches!(
        err,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::Custom(_)
            | zk::Error::UnexpectedError(_)
            | zk::Error::SessionMoved
    )
}

/// Errors that end the session: no retry can succeed.
pub fn is_session_end(err: &zk::Error) -> bool {
    matches!(err, zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed)
}

/// Runs one call with a timeout; a timeout reads as `zk::Error::Timeout`.
pub async fn timed<T>(call: impl Future<Output = Result<T, zk::Error>>) -> Result<T, zk::Error> {
    tokio::time::timeout(CALL_TIMEOUT, call).await.unwrap_or(Err(zk::Error::Timeout))
}

/// Delays between attempts: exponential from 5 ms to 500 ms with jitter (so that the many
/// contenders of one session, cut off together, do not all come back at the same instant),
/// and no limit on attempts: a connection loss ends when the session does, and then the call
/// fails with the session's end.
const DELAYS: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(FIRST_BACKOFF)
    .with_max_delay(MAX_BACKOFF)
    .with_jitter()
    .without_max_times();

/// Backoff between attempts of a loop that decides for itself what to retry.
pub struct Backoff(ExponentialBackoff);

impl Backoff {
    pub fn new() -> Self {
        Backoff(DELAYS.build())
    }

    pub async fn wait(&mut self) {
        // Without a limit on attempts, the delays never run out.
        tokio::time::sleep(self.0.next().unwrap_or(MAX_BACKOFF)).await;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// How often a read-then-write (a write tested against the version read, a create that may
/// find the node made) is tried while other writers overtake it. Each overtaking is another
/// writer's write landing, so a handful is contention and this many in a row is writers
/// fighting over one node (or a node made and deleted again and again): a fault to report, not
/// a reason to spin.
pub const CONTENDED_ATTEMPTS: u32 = 32;

/// The attempts of one read-then-write, as `while contention.attempt().await { … continue … }`:
/// the first attempt starts at once; each later one (the last was overtaken by another writer)
/// after a little wait (the same jittered backoff, so that two writers that keep overtaking
/// each other fall out of step), until [`CONTENDED_ATTEMPTS`] were made.
pub struct Contention {
    made: u32,
    backoff: Backoff,
}

impl Contention {
    pub fn new() -> Self {
        Contention { made: 0, backoff: Backoff::new() }
    }

    /// Whether another attempt may be made (after waiting, if one was made already).
    pub async fn attempt(&mut self) -> bool {
        if self.made >= CONTENDED_ATTEMPTS {
            return false;
        }
        if self.made > 0 {
            self.backoff.wait().await;
        }
        self.made += 1;
        true
    }
}

impl Default for Contention {
    fn default() -> Self {
        Self::new()
    }
}

/// Repeats an idempotent call (a read, or a write whose repetition is harmless) until it
/// succeeds or fails for a reason other than a lost connection or throttling.
pub async fn idempotent<T, F, Fut>(mut call: F) -> Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    (|| timed(call()))
        .retry(DELAYS)
        .sleep(tokio::time::sleep)
        .when(|e| is_unknown_outcome(e) || *e == zk::Error::Throttled)
        .notify(|e, _| tracing::debug!(error = %e, "ZooKeeper call failed; repeating it"))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_contended_write_is_tried_a_bounded_number_of_times_the_first_at_once() {
        let start = tokio::time::Instant::now();
        let mut contention = Contention::new();
        assert!(contention.attempt().await);
        assert_eq!(start.elapsed(), Duration::ZERO, "the first attempt waits for nothing");
        let mut made = 1;
        while contention.attempt().await {
            made += 1;
        }
        assert_eq!(made, CONTENDED_ATTEMPTS);
        assert!(start.elapsed() >= FIRST_BACKOFF * (CONTENDED_ATTEMPTS - 1), "backs off between attempts");
        assert!(!contention.attempt().await, "stays spent");
    }
}
