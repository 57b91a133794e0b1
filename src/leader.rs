//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it:
//! the holder renews the lease every `renew_every`; a candidate takes it over only when the
//! lease record has not changed for a whole `lease_duration` as measured by the candidate's own
//! clock (so clock skew between replicas does not matter); every write is guarded by the
//! lease's resourceVersion, so two candidates can never both win.
//!
//! A leader that cannot renew within `renew_deadline` (shorter than the lease duration) steps
//! down on its own, before anybody else can take over. Every request has a timeout well inside
//! that deadline: a hung connection must not keep a replica "leading" (kube's client sets no
//! request timeout of its own). The deadline is counted from when the last successful renewal
//! was *sent*, so that no answer, however late, extends it beyond what other replicas see.
//!
//! A candidate also watches the Lease, and tries at once when the holder gives it up (a
//! graceful stop), instead of at its next retry.
//!
//! [`Leadership`] is the one answer to "may this process write": a deadline that each renewal
//! pushes on and a step-down clears. It is judged by the monotonic clock, which runs on while
//! the process is stopped (SIGSTOP), so a leader that resumes after its lease ran out reads
//! "not leading" before its next write, even before its renewal loop has run again.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

pub const LEASE_DURATION: Duration = Duration::from_secs(10);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(7);
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// Longest wait for one Lease request; with the retry period it fits twice into the renew
/// deadline, so one hung request does not cost the lease.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A retry timed to a lease's expiry comes this long after it (the clock's granularity).
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

/// Whether this process may write: until a deadline that renewals push on, or for good
/// without leader election. Cheap to clone and to ask.
#[derive(Clone, Debug)]
pub struct Leadership {
    until: watch::Receiver<Option<Instant>>,
    /// The installation is being removed: its Lease says so (see [`Leadership::draining`]).
    draining: watch::Receiver<bool>,
}

impl Leadership {
    /// Leading for good (no leader election: one replica only).
    pub fn always() -> Self {
        // Far enough to never pass, near enough not to overflow the clock.
        let (_, until) = watch::channel(Some(Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)));
        Leadership { until, draining: watch::channel(false).1 }
    }

    /// Whether the installation is being removed (`helm uninstall` with `deleteClaims`): the
    /// Lease, read at every renewal, carried [`crate::api::UNINSTALLING_ANNOTATION`] (for the
    /// rest of the process: restart it if the uninstall is called off). Then no
    /// claim is made for a gated pod, no gate removed and nothing new granted, so that deleting
    /// every claim leaves none behind and starts no pod while earlier holders' pods still run.
    pub fn draining(&self) -> bool {
        *self.draining.borrow()
    }

    pub fn is_leading(&self) -> bool {
        self.time_left().is_some()
    }

    /// How long this process may still write, if it may.
    pub fn time_left(&self) -> Option<Duration> {
        let until = (*self.until.borrow())?;
        until.checked_duration_since(Instant::now()).filter(|left| !left.is_zero())
    }

    /// Resolves once this process may not write any more.
    pub async fn lost(&mut self) {
        loop {
            let Some(until) = *self.until.borrow_and_update() else { return };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return,
                changed = self.until.changed() => if changed.is_err() { return },
            }
        }
    }
}

/// The lease duration a lease record gives its holder.
fn lease_duration(spec: &LeaseSpec) -> Duration {
    spec.lease_duration_seconds.map_or(LEASE_DURATION, |s| Duration::from_secs(s.max(1) as u64))
}

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// The last lease record seen (holder, renew time, transitions) and when it was first seen.
    observed: Option<(String, std::time::Instant)>,
    /// Until when we lead: the send time of the last successful renewal plus the renew
    /// deadline; `None` while we do not.
    leading: watch::Sender<Option<Instant>>,
    /// The UID of the Lease object, once read: the same for every replica of an installation
    /// (they elect on it), different for any other.
    uid: Option<String>,
    /// How long, by our clock, until the lease seen held by another expires unless renewed.
    expires_in: Option<Duration>,
    /// Whether the Lease last read carries [`crate::api::UNINSTALLING_ANNOTATION`].
    draining: watch::Sender<bool>,
}

impl LeaseLock {
    pub fn new(api: Api<Lease>, name: &str, identity: &str) -> Self {
        LeaseLock {
            api,
            name: name.into(),
            identity: identity.into(),
            observed: None,
            leading: watch::channel(None).0,
            uid: None,
            expires_in: None,
            draining: watch::channel(false).0,
        }
    }

    /// The UID of the Lease elected on, once read (always, once it was acquired).
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// Whether we lead, as every writer asks it.
    pub fn leadership(&self) -> Leadership {
        Leadership { until: self.leading.subscribe(), draining: self.draining.subscribe() }
    }

    /// One attempt, bounded by [`REQUEST_TIMEOUT`]; a success extends the leadership.
    async fn attempt(&mut self) -> Result<bool, kube::Error> {
        let sent = Instant::now();
        let result = match tokio::time::timeout(REQUEST_TIMEOUT, self.try_acquire_or_renew()).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(format!("no answer from the API within {REQUEST_TIMEOUT:?}").into())),
        };
        match result {
            Ok(true) => {
                self.leading.send_replace(Some(sent + RENEW_DEADLINE));
            }
            Ok(false) => self.step_down(),
            Err(_) => {}
        }
        result
    }

    /// Notes the lease record `spec` as seen now, unless it is the one seen last; answers since
    /// when the record seen is unchanged, by our clock.
    fn observe(&mut self, spec: &LeaseSpec) -> std::time::Instant {
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        let record = format!("{holder}|{:?}|{:?}", spec.renew_time.as_ref().map(|t| t.0), spec.lease_transitions);
        match &self.observed {
            Some((r, at)) if *r == record => *at,
            _ => {
                let now = std::time::Instant::now();
                self.observed = Some((record, now));
                now
            }
        }
    }

    /// Stops leading at once (every writer sees it on its next check).
    pub fn step_down(&self) {
        self.leading.send_replace(None);
    }

    /// One attempt to acquire or renew; true while we hold the lease.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(made) => {
                    self.uid = made.metadata.uid;
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        self.uid.clone_from(&lease.metadata.uid);
        // Read before any renewal is written: a renewal carries the resourceVersion of this
        // read, so once one lands after the mark was written, this process has seen it. Kept
        // for the rest of the process (the uninstall step takes the mark away when it is done,
        // so that the next installation, which finds the same Lease, is not drained).
        let marked =
            lease.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(crate::api::UNINSTALLING_ANNOTATION));
        if marked {
            self.draining.send_if_modified(|d| !std::mem::replace(d, true));
        }
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let seen_since = self.observe(&spec);
        let duration = lease_duration(&spec);
        let ours = holder == self.identity;
        let expired = holder.is_empty() || seen_since.elapsed() >= duration;
        if !ours && !expired {
            self.expires_in = duration.checked_sub(seen_since.elapsed());
            return Ok(false);
        }
        let mut new_spec = spec.clone();
        new_spec.renew_time = Some(now.clone());
        new_spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        if !ours {
            new_spec.holder_identity = Some(self.identity.clone());
            new_spec.acquire_time = Some(now);
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(new_spec);
        // `replace` carries the resourceVersion we read: a concurrent writer makes it fail.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on shutdown), so that another replica can take over at once.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        self.step_down();
        match tokio::time::timeout(REQUEST_TIMEOUT, self.give_up()).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(format!("no answer from the API within {REQUEST_TIMEOUT:?}").into())),
        }
    }

    async fn give_up(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else { return Ok(()) };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits until we hold the lease: an attempt every [`RETRY_PERIOD`], or at the moment the
    /// lease seen expires if that is sooner; and one at once when the lease's watch shows it
    /// given up (a leader's graceful stop), so that a standby takes over in the time of a watch
    /// event rather than up to a retry period later. Each renewal the watch shows is noted when
    /// it comes (a poll would note it up to a retry period late, and the takeover after a crash
    /// would come that much later too; noting it sooner never lets it come before the lease
    /// duration has passed since the renewal was written, which is after the holder sent it).
    pub async fn acquire(&mut self) {
        use futures::StreamExt;
        let mut leases = std::pin::pin!(self.leases());
        loop {
            match self.attempt().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election: cannot reach the lease"),
            }
            loop {
                let wait = self.expires_in.map_or(RETRY_PERIOD, |left| RETRY_PERIOD.min(left + EXPIRY_MARGIN));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => break,
                    // A watch that cannot run (RBAC of an earlier release: no list/watch on the
                    // Lease) leaves the retry period, as before.
                    Some(spec) = leases.next() => {
                        if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
                            break;
                        }
                        let seen_since = self.observe(&spec);
                        match lease_duration(&spec).checked_sub(seen_since.elapsed()) {
                            Some(left) => self.expires_in = Some(left),
                            None => break,
                        }
                    }
                }
            }
            self.expires_in = None;
        }
    }

    /// The lease's watch: its record each time it changes.
    fn leases(&self) -> impl futures::Stream<Item = LeaseSpec> + Send + 'static {
        use futures::StreamExt;
        use kube::runtime::{watcher, WatchStreamExt};
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(crate::client::WATCH_TIMEOUT_SECONDS);
        watcher(self.api.clone(), config).default_backoff().applied_objects().filter_map(|lease| {
            let spec = match lease {
                Ok(lease) => Some(lease.spec.unwrap_or_default()),
                Err(e) => {
                    tracing::debug!(error = %e, "leader election: the lease's watch failed; polling meanwhile");
                    None
                }
            };
            std::future::ready(spec)
        })
    }

    /// Renews while we lead; returns, no longer leading, when leadership is lost (not renewed
    /// within the deadline, or taken over).
    pub async fn hold(&mut self) {
        let mut leadership = self.leadership();
        let renewals = async {
            loop {
                tokio::time::sleep(RETRY_PERIOD).await;
                match self.attempt().await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!("leader election: the lease was taken over");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "leader election: renewal failed"),
                }
            }
        };
        tokio::select! {
            _ = renewals => {}
            _ = leadership.lost() => {
                tracing::warn!("leader election: could not renew within {RENEW_DEADLINE:?}; stepping down");
            }
        }
        self.step_down();
    }
}
