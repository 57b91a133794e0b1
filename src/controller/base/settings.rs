//! The controller's fixed intervals: how soon a claim is looked at again for each reason, and
//! the windows its plans use. Named here so that a delay is found by its reason.

use std::time::Duration;

/// How long a claim waits for its holder pod to appear before it is Invalid. Covers a claim
/// applied together with (or just before) the Job or pod that will hold it.
pub const HOLDER_APPEAR_WINDOW: Duration = Duration::from_secs(30);
/// How often every claim is looked at again, as a safety net (the paced walk, see `pace`), unless
/// the operator is told otherwise (`--resync-period`); and the farthest ahead a claim's own
/// deadline is scheduled.
pub const RESYNC: Duration = Duration::from_secs(300);

/// How soon a grant that waits for another claim's write is tried again at the latest: the
/// registry wakes it the moment that write is made, so this is only a backstop.
pub const GRANT_BACKSTOP: Duration = Duration::from_secs(1);
/// How long a grant waits within its reconcile for the previous holder's finalizer removal to be
/// answered, before it leaves that to the wake-up (`GRANT_BACKSTOP`): a reconcile slot is held
/// meanwhile, so only briefly.
pub const HOLDER_DEPARTURE: Duration = Duration::from_millis(200);
/// How soon a copy is looked at again when a newer one is on its way (the watch brings it; this
/// is a backstop for a lost event), or an object is not ready to be acted on yet.
pub const NEWER_COPY_BACKSTOP: Duration = Duration::from_secs(1);
/// How soon a finalizer patch that met a newer object is tried again.
pub const FINALIZER_RETRY: Duration = Duration::from_millis(500);
/// How soon a grant held back by the uninstallation is looked at again.
pub const DRAINING_RECHECK: Duration = Duration::from_secs(5);

/// A `Lock`'s status is written this long after the first change of its claims after a quiet
/// spell (a handoff's release and grant, a few milliseconds apart, make one write) ...
pub const STATUS_WINDOW: Duration = Duration::from_millis(50);
/// ... and its writes are at least this far apart, however often its claims change (for a
/// `ClusterLock`: its looks at the queue) ...
pub const STATUS_SPACING: Duration = Duration::from_millis(500);
/// ... and the status writes of all `Lock` objects at least this far apart (at most 50 a second:
/// when more than 25 locks are busy each one's refreshes come further apart; for
/// `ClusterLock`s, their looks). A `Lock`'s status is for people and dashboards: it must not
/// take the API server from the grants.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(20);
