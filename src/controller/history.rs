//! A lock's history (docs/design.md, "A lock's history"): every grant and every end of a hold
//! the operator writes joins its lock's `LockHistory`, in batches, off the handoff's path.
//!
//! The grant's status write hands its news over ([`History::granted`], [`History::ended`]) and
//! goes on: nothing here is awaited by a grant. A batch gathers a second's news per lock, and
//! the batches' writes go out one at a time, at most 50 a second over every lock, so that a busy
//! lock costs one history write a second however many handoffs it makes. Each write reads the
//! object and replaces its status on that very copy (a list-map keyed by fencing token: a grant
//! and its end meet in one record whichever batch brings them), so two operators' terms never
//! lose each other's records. What a term had not written when it ended is lost: its claims'
//! Events and the audit log lines have it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::base::{part_tokens, Error, Part};
use super::writer::{Answer, ApiWriter};
use crate::api::history::{history_name, record, GrantRecord, LockHistory, LockHistorySpec};
use crate::api::{LockClaim, LockClaimStatus, Phase, CLUSTER_LABEL_PREFIX};

/// How long a lock's news gather before its write.
const BATCH: Duration = Duration::from_secs(1);
/// Between two history writes, at least: 50 a second over every lock.
const SPACING: Duration = Duration::from_millis(20);
/// The longest pause between batches while they fail.
const MOST_BACKOFF: Duration = Duration::from_secs(30);
/// How often a write that met a newer copy is tried again on a fresh read.
const ATTEMPTS: usize = 3;
/// Records kept waiting for one lock while its writes fail: the newest, as many as a history
/// may keep.
const MAX_WAITING: usize = crate::api::history::MAX_HISTORY_LIMIT as usize;

/// The history object a record goes to: its namespace and the lock's label (`NAME`, or
/// `cluster/NAME`).
type Key = (String, String);

/// One term's history writer.
pub struct History {
    /// The operator's namespace: `ClusterLock`s' histories are kept there.
    home: String,
    /// This cluster's name, where it shares ClusterLocks with others.
    cluster: Option<String>,
    waiting: Mutex<HashMap<Key, Vec<GrantRecord>>>,
    news: Notify,
    /// Said once a term: the `LockHistory` CRD is not served (an upgrade that did not apply it).
    unserved_said: AtomicBool,
}

impl History {
    pub fn new(home: String, cluster: Option<String>) -> History {
        History { home, cluster, waiting: Mutex::default(), news: Notify::new(), unserved_said: AtomicBool::new(false) }
    }

    /// `claim`'s grant was written with `status`: one record per lock it holds, and the audit
    /// line.
    pub fn granted(&self, claim: &LockClaim, parts: &[Part], status: &LockClaimStatus) {
        let now = Timestamp::now();
        let granted = status.acquired_at.clone().unwrap_or(Time(now));
        let waited = claim.metadata.creation_timestamp.as_ref().map(|c| granted.0.duration_since(c.0).as_secs_f64());
        for (part, token) in parts.iter().zip(part_tokens(status, parts)) {
            let Some(token) = token else { continue };
            let record = GrantRecord {
                granted: Some(granted.clone()),
                waited_seconds: waited.map(|w| (w.max(0.0) * 1000.0).round() / 1000.0),
                ..self.record_of(claim, token)
            };
            tracing::info!(
                target: "zklock::audit",
                event = "granted",
                lock = %part.name,
                namespace = %record.namespace,
                claim = %record.claim,
                token,
                holder_pod = record.holder_pod.as_deref().unwrap_or_default(),
                waited_seconds = record.waited_seconds.unwrap_or_default(),
                "lock granted"
            );
            self.keep(self.key(claim, part), record);
        }
    }

    /// `claim`, which held with `before`, ended as `phase`: its records get their end.
    pub fn ended(&self, claim: &LockClaim, parts: &[Part], before: &LockClaimStatus, phase: Phase) {
        let now = Time(Timestamp::now());
        for (part, token) in parts.iter().zip(part_tokens(before, parts)) {
            let Some(token) = token else { continue };
            let record = GrantRecord {
                // Known again here, so that a record whose grant's batch was lost (a term that
                // ended before writing it) is whole.
                granted: before.acquired_at.clone(),
                ended: Some(now.clone()),
                ended_as: Some(phase),
                ..self.record_of(claim, token)
            };
            let held = record.held_seconds().unwrap_or_default();
            tracing::info!(
                target: "zklock::audit",
                event = "ended",
                lock = %part.name,
                namespace = %record.namespace,
                claim = %record.claim,
                token,
                ended_as = ?phase,
                held_seconds = (held * 1000.0).round() / 1000.0,
                "hold ended"
            );
            self.keep(self.key(claim, part), record);
        }
    }

    fn record_of(&self, claim: &LockClaim, token: i64) -> GrantRecord {
        GrantRecord {
            fencing_token: token.to_string(),
            claim: claim.name_any(),
            namespace: claim.namespace().unwrap_or_default(),
            claim_uid: claim.metadata.uid.clone(),
            cluster: self.cluster.clone(),
            holder_pod: claim.spec.holder.as_ref().map(|h| h.pod_name.clone()),
            ..Default::default()
        }
    }

    fn key(&self, claim: &LockClaim, part: &Part) -> Key {
        let namespace = if part.name.starts_with(CLUSTER_LABEL_PREFIX) {
            self.home.clone()
        } else {
            claim.namespace().unwrap_or_default()
        };
        (namespace, part.name.clone())
    }

    fn keep(&self, key: Key, record: GrantRecord) {
        if history_name(&key.1).is_none() {
            // A lockName no object can be named after keeps no history (the audit line has it).
            return;
        }
        let mut waiting = self.waiting.lock();
        let first = waiting.is_empty();
        let records = waiting.entry(key).or_default();
        records.push(record);
        let excess = records.len().saturating_sub(MAX_WAITING);
        records.drain(..excess);
        drop(waiting);
        if first {
            self.news.notify_one();
        }
    }

    /// The locks with records waiting.
    fn waiting_keys(&self) -> Vec<Key> {
        self.waiting.lock().keys().cloned().collect()
    }

    /// The records waiting for one lock, taken: one lock's at a time are in flight, so that a
    /// term that ends mid-batch loses at most those.
    fn take(&self, key: &Key) -> Option<Vec<GrantRecord>> {
        self.waiting.lock().remove(key)
    }

    /// Records whose write failed wait for the next batch, before what came meanwhile.
    fn put_back(&self, key: Key, mut records: Vec<GrantRecord>) {
        let mut waiting = self.waiting.lock();
        let newer = waiting.remove(&key).unwrap_or_default();
        records.extend(newer);
        let excess = records.len().saturating_sub(MAX_WAITING);
        records.drain(..excess);
        waiting.insert(key, records);
    }
}

/// The term's history writer: a batch a second, for as long as the term runs; while batches
/// fail (the API server out of reach), less often, up to every [`MOST_BACKOFF`].
pub async fn keep(history: &History, writer: &ApiWriter) -> Result<(), Error> {
    let mut pause = BATCH;
    loop {
        let news = history.news.notified();
        let mut news = std::pin::pin!(news);
        news.as_mut().enable();
        if history.waiting.lock().is_empty() {
            news.await;
        }
        tokio::time::sleep(pause).await;
        let failed = write_waiting(history, writer).await;
        pause = if failed == 0 { BATCH } else { (pause * 2).min(MOST_BACKOFF) };
    }
}

/// Writes every lock's records waiting, each write [`SPACING`] after the last; what fails
/// waits for the next batch (one log line says how many locks' did). Answers how many failed.
pub async fn write_waiting(history: &History, writer: &ApiWriter) -> usize {
    let mut failed: Vec<String> = vec![];
    for key in history.waiting_keys() {
        let Some(records) = history.take(&key) else { continue };
        match write(writer, &key, records.clone()).await {
            Ok(()) => {}
            Err(Failed::Never(why)) => {
                tracing::warn!(namespace = %key.0, lock = %key.1, why, "history records not kept");
            }
            Err(Failed::Unserved(why)) => {
                if !history.unserved_said.swap(true, Ordering::Relaxed) {
                    tracing::warn!(why, "locks keep no history this term");
                }
            }
            Err(Failed::Later(why)) => {
                failed.push(format!("{}/{}: {why}", key.0, key.1));
                history.put_back(key, records);
            }
        }
    }
    if let Some(first) = failed.first() {
        tracing::info!(locks = failed.len(), first = %first, "history not written; tried again later");
    }
    failed.len()
}

enum Failed {
    /// Dropped: they can never be written.
    Never(String),
    /// Dropped, and said once a term: no history can be written (the CRD is not installed, or
    /// the operator may not write it).
    Unserved(String),
    /// Tried again with the next batch: no answer, or the API server's own trouble.
    Later(String),
}

impl Failed {
    /// What a refusal of call `what` means for the records.
    fn of<T>(answer: Answer<T>, what: &str) -> Failed {
        match answer {
            // A namespace being deleted refuses new objects: its history goes with it.
            Answer::Refused { status, .. } if status.code == 403 && status.message.contains("being terminated") => {
                Failed::Never(format!("{what} refused: {}", status.message))
            }
            Answer::Refused { status, .. } if status.code == 403 => Failed::Unserved(format!(
                "{what} refused: {} (grant the operator get and create on lockhistories and update on \
                 lockhistories/status, as the chart does)",
                status.message
            )),
            Answer::Refused { status, .. } if status.code < 500 && status.code != 429 => {
                Failed::Never(format!("{what} refused: {} ({})", status.message, status.code))
            }
            answer => Failed::Later(answer.error().unwrap_or_default()),
        }
    }
}

async fn write(writer: &ApiWriter, (namespace, label): &Key, records: Vec<GrantRecord>) -> Result<(), Failed> {
    let Some(name) = history_name(label) else {
        return Err(Failed::Never(format!("{label:?} is no object name")));
    };
    let api: Api<LockHistory> = Api::namespaced(writer.client().clone(), namespace);
    for _ in 0..ATTEMPTS {
        let found = match writer.read("get_lock_history", api.get_opt(&name)).await {
            Answer::Done(found) => found,
            answer => return Err(Failed::of(answer, "reading the LockHistory")),
        };
        let mut history = match found {
            Some(history) => history,
            None => {
                let fresh = LockHistory::new(&name, LockHistorySpec { lock: label.clone(), limit: None });
                tokio::time::sleep(SPACING).await;
                match writer.write("create_lock_history", api.create(&PostParams::default(), &fresh)).await {
                    Answer::Done(made) => made,
                    // Made meanwhile (another term's late batch): read again.
                    Answer::Refused { status, .. } if status.code == 409 => continue,
                    // The resource itself unknown (the CRD not applied), rather than the
                    // namespace gone.
                    Answer::Refused { status, .. }
                        if status.code == 404 && status.message.contains("could not find the requested resource") =>
                    {
                        return Err(Failed::Unserved(
                            "the LockHistory CRD is not served: apply the CRDs of this version (`zklock crd | \
                             kubectl apply -f -`)"
                                .into(),
                        ))
                    }
                    answer => return Err(Failed::of(answer, "making the LockHistory")),
                }
            }
        };
        if history.spec.lock != *label {
            return Err(Failed::Never(format!(
                "LockHistory {namespace}/{name} is the history of {:?}: rename one of the locks",
                history.spec.lock
            )));
        }
        let mut status = history.status.take().unwrap_or_default();
        record(&mut status, records.clone(), history.spec.limit);
        history.status = Some(status);
        // A replace on the copy read: refused (409) if anything wrote it since.
        let params = PostParams::default();
        tokio::time::sleep(SPACING).await;
        match writer.write("replace_lock_history_status", api.replace_status(&name, &params, &history)).await {
            Answer::Done(_) => return Ok(()),
            // Changed since the read; or deleted since (made again on the next attempt).
            Answer::Refused { status, .. } if status.code == 409 || status.code == 404 => continue,
            answer => return Err(Failed::of(answer, "writing the LockHistory's status")),
        }
    }
    Err(Failed::Later(format!("LockHistory {namespace}/{name} changed under each of {ATTEMPTS} writes")))
}
