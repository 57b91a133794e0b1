//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it:
//! the holder renews the lease every `renew_every`; a candidate takes it over only when the
//! lease record has not changed for a whole `lease_duration` as measured by the candidate's own
//! clock (so clock skew between replicas does not matter); every write is guarded by the
//! lease's resourceVersion, so two candidates can never both win.
//!
//! A leader that cannot renew within `renew_deadline` (shorter than the lease duration) steps
//! down on its own, before anybody else can take over.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

pub const LEASE_DURATION: Duration = Duration::from_secs(10);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(7);
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// The last lease record seen (holder, renew time, transitions) and when it was first seen.
    observed: Option<(String, Instant)>,
}

impl LeaseLock {
    pub fn new(api: Api<Lease>, name: &str, identity: &str) -> Self {
        LeaseLock { api, name: name.into(), identity: identity.into(), observed: None }
    }

    pub fn identity(&self) -> &str {
        &self.identity
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
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = format!("{holder}|{:?}|{:?}", spec.renew_time.as_ref().map(|t| t.0), spec.lease_transitions);
        let seen_since = match &self.observed {
            Some((r, at)) if *r == record => *at,
            _ => {
                self.observed = Some((record, Instant::now()));
                Instant::now()
            }
        };
        let duration = spec.lease_duration_seconds.map_or(LEASE_DURATION, |s| Duration::from_secs(s.max(1) as u64));
        let ours = holder == self.identity;
        let expired = holder.is_empty() || seen_since.elapsed() >= duration;
        if !ours && !expired {
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

    /// Waits until we hold the lease.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election: cannot reach the lease"),
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    /// Renews while we lead; returns when leadership is lost (not renewed within the deadline,
    /// or taken over).
    pub async fn hold(&mut self) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => {
                    tracing::warn!("leader election: the lease was taken over");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "leader election: renewal failed"),
            }
            if last_renewed.elapsed() >= RENEW_DEADLINE {
                tracing::warn!("leader election: could not renew within {RENEW_DEADLINE:?}; stepping down");
                return;
            }
        }
    }
}
