//! Every Kubernetes call the controller makes goes through here: a write only while this
//! process leads (docs/design.md: fencing), and every call with a deadline, so that no reconcile
//! waits on the API server for ever and a deposed leader writes nothing. Events about objects
//! are published here too, the one place that decides what a failed publication means.

use std::future::Future;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::core::Status;

use super::base::{Error, API_TIMEOUT};
use super::events::EventWriter;
use crate::leader::Leadership;

/// What came of a write (or a read), told apart once: the callers ask what they expect of it
/// instead of matching nested results.
#[derive(Debug)]
pub enum Answer<T> {
    /// The API server did it.
    Done(T),
    /// The API server answered no: nothing changed.
    Refused { call: &'static str, status: Box<Status> },
    /// No answer of the API server's: this process does not lead, the deadline passed, or the
    /// request or its answer was lost on the way. A write may have landed all the same.
    Unanswered(Error),
}

impl<T> Answer<T> {
    fn of(call: &'static str, result: Result<T, kube::Error>) -> Self {
        match result {
            Ok(done) => Answer::Done(done),
            Err(kube::Error::Api(status)) => Answer::Refused { call, status },
            Err(source) => Answer::Unanswered(Error::Write { call, source }),
        }
    }

    /// The API server's answer, or the reconcile's error.
    pub fn into_result(self) -> Result<T, Error> {
        match self {
            Answer::Done(done) => Ok(done),
            Answer::Refused { call, status } => Err(Error::Write { call, source: kube::Error::Api(status) }),
            Answer::Unanswered(e) => Err(e),
        }
    }

    /// Like [`Answer::into_result`], with a refusal of one of the `expected` codes (the object
    /// is gone already, say) as `None`.
    pub fn expecting(self, expected: &[u16]) -> Result<Option<T>, Error> {
        match self {
            Answer::Refused { status, .. } if expected.contains(&status.code) => Ok(None),
            answer => answer.into_result().map(Some),
        }
    }

    /// What went wrong, for a log line; `None` when it was done.
    pub fn error(&self) -> Option<String> {
        match self {
            Answer::Done(_) => None,
            Answer::Refused { call, status } => {
                Some(format!("{call}: {} ({} {})", status.message, status.code, status.reason))
            }
            Answer::Unanswered(e) => Some(e.to_string()),
        }
    }
}

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
    /// leadership ends first or after [`API_TIMEOUT`].
    pub async fn write<T>(&self, call: &'static str, f: impl Future<Output = Result<T, kube::Error>>) -> Answer<T> {
        let Some(left) = self.leadership.time_left() else { return Answer::Unanswered(Error::NotLeading) };
        match tokio::time::timeout(left.min(API_TIMEOUT), f).await {
            Ok(result) => Answer::of(call, result),
            // Renewals may have extended the leadership meanwhile: only a lost one is NotLeading.
            Err(_) if !self.leadership.is_leading() => Answer::Unanswered(Error::NotLeading),
            Err(_) => Answer::Unanswered(Error::Timeout { call }),
        }
    }

    /// Runs one Kubernetes read, giving up after [`API_TIMEOUT`]. Reads need no leadership:
    /// nothing is decided on a read alone that a write does not test again.
    pub async fn read<T>(&self, call: &'static str, f: impl Future<Output = Result<T, kube::Error>>) -> Answer<T> {
        match tokio::time::timeout(API_TIMEOUT, f).await {
            Ok(result) => Answer::of(call, result),
            Err(_) => Answer::Unanswered(Error::Timeout { call }),
        }
    }

    /// Publishes an Event about `regarding`, as a write. Events are for people; the object's
    /// status carries the truth: a publication that fails is logged, and the caller goes on.
    pub async fn publish(&self, regarding: &ObjectReference, warning: bool, reason: &str, note: &str) {
        let published = self.write("publish_event", self.events.publish(regarding, warning, reason, note)).await;
        if let Some(error) = published.error() {
            let object = regarding.name.as_deref().unwrap_or_default();
            tracing::info!(object, reason, %error, "could not publish an event");
        }
    }
}
