//! Every Kubernetes call the controller makes goes through here: a write only while this
//! process leads (docs/design.md: fencing), and every call with a deadline, so that no reconcile
//! waits on the API server for ever and a deposed leader writes nothing. Events about objects
//! are published here too, the one place that decides what a failed publication means.

use std::future::Future;

use k8s_openapi::api::core::v1::ObjectReference;

use super::base::{Error, API_TIMEOUT};
use super::events::EventWriter;
use crate::leader::Leadership;

/// What the API answered a write (or a read): the outer error is ours (not leading, no answer in
/// time), the inner the API server's.
pub type Answer<T> = Result<Result<T, kube::Error>, Error>;

pub struct ApiWriter {
    /// Reads and writes, each with a deadline (see [`crate::client::Clients`]).
    client: kube::Client,
    leadership: Leadership,
    events: EventWriter,
}

impl ApiWriter {
    pub fn new(client: kube::Client, leadership: Leadership, events: EventWriter) -> Self {
        ApiWriter { client, leadership, events }
    }

    /// The client for requests (not watches).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// Runs one Kubernetes write, if this process still leads, and gives up on it when the
    /// leadership ends first (the outer error) or after [`API_TIMEOUT`]; the inner result is the
    /// API's.
    pub async fn write<T>(&self, call: &'static str, f: impl Future<Output = Result<T, kube::Error>>) -> Answer<T> {
        let left = self.leadership.time_left().ok_or(Error::NotLeading)?;
        match tokio::time::timeout(left.min(API_TIMEOUT), f).await {
            Ok(answer) => Ok(answer),
            // Renewals may have extended the leadership meanwhile: only a lost one is NotLeading.
            Err(_) if !self.leadership.is_leading() => Err(Error::NotLeading),
            Err(_) => Err(Error::Timeout { call }),
        }
    }

    /// Runs one Kubernetes read, giving up after [`API_TIMEOUT`]. Reads need no leadership:
    /// nothing is decided on a read alone that a write does not test again.
    pub async fn read<T>(&self, call: &'static str, f: impl Future<Output = Result<T, kube::Error>>) -> Answer<T> {
        tokio::time::timeout(API_TIMEOUT, f).await.map_err(|_| Error::Timeout { call })
    }

    /// Publishes an Event about `regarding`, as a write. Events are for people; the object's
    /// status carries the truth: a publication that fails is logged, and the caller goes on.
    pub async fn publish(&self, regarding: &ObjectReference, warning: bool, reason: &str, note: &str) {
        let published = self.write("publish_event", self.events.publish(regarding, warning, reason, note)).await;
        if let Some(error) = write_error(published) {
            let object = regarding.name.as_deref().unwrap_or_default();
            tracing::info!(object, reason, %error, "could not publish an event");
        }
    }
}

/// A write's failure, for a log line: refused, timed out, or not written (not leading).
pub fn write_error<T>(answer: Answer<T>) -> Option<String> {
    answer.map_or_else(|e| Some(e.to_string()), |r| r.err().map(|e| e.to_string()))
}
