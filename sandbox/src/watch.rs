//! Watch streams: initial state or resume from a resourceVersion, selector-aware transitions
//! (an object leaving the selector is DELETED for that watcher), bookmarks, timeouts, 410 Gone.

use crate::api;
use crate::convert;
use crate::error::ApiError;
use crate::registry::ResourceDef;
use crate::selector::Selectors;
use crate::state::State;
use crate::store::{EventType, HistoryError, StoredEvent};
use crate::table::TableOptions;
use axum::body::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

pub struct WatchParams {
    /// None: resourceVersion unset or "0" — start with the current state as ADDED events.
    pub rv: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Duration,
    pub selectors: Selectors,
    pub namespace: Option<String>,
    pub table: Option<TableOptions>,
    pub bookmark_interval: Duration,
}

struct Watcher {
    def: Arc<ResourceDef>,
    p: WatchParams,
}

impl Watcher {
    fn visible(&self, obj: &Value) -> bool {
        let ns_ok = match &self.p.namespace {
            Some(ns) if self.def.namespaced => obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns),
            _ => true,
        };
        ns_ok && self.p.selectors.matches(obj)
    }

    fn render(&self, ty: &str, obj: Value) -> Bytes {
        let object = convert::to_external(&self.def, obj);
        let object = match &self.p.table {
            Some(t) => crate::table::table(&self.def, std::slice::from_ref(&object), t, None),
            None => object,
        };
        line(&json!({"type": ty, "object": object}))
    }

    /// The event this watcher sees for a stored change, if any.
    fn translate(&self, ev: &StoredEvent) -> Option<Bytes> {
        let now = self.visible(&ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.visible(p));
        match ev.ty {
            EventType::Added if now => Some(self.render("ADDED", ev.object.clone())),
            EventType::Modified => match (before, now) {
                (true, true) => Some(self.render("MODIFIED", ev.object.clone())),
                (false, true) => Some(self.render("ADDED", ev.object.clone())),
                (true, false) => {
                    let mut old = ev.prev.clone().unwrap_or(Value::Null);
                    if let Some(m) = old.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.insert("resourceVersion".into(), json!(ev.rv.to_string()));
                    }
                    Some(self.render("DELETED", old))
                }
                (false, false) => None,
            },
            EventType::Deleted if before => Some(self.render("DELETED", ev.object.clone())),
            _ => None,
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            &json!({"type": "BOOKMARK", "object": {"kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": meta}}),
        )
    }
}

fn line(v: &Value) -> Bytes {
    let mut s = serde_json::to_vec(v).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

pub fn error_line(e: &ApiError) -> Bytes {
    line(&json!({"type": "ERROR", "object": e.to_status()}))
}

/// Sets up a watch under the state lock and returns the stream of encoded events.
pub fn start(
    st: &State,
    def: Arc<ResourceDef>,
    p: WatchParams,
    shutdown: watch::Receiver<bool>,
) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    if p.send_initial_events && !p.bookmarks {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            vec![crate::error::FieldError::forbidden(
                "allowWatchBookmarks",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            )],
        ));
    }
    let rx = st.store.subscribe();
    let cur = st.store.current_rv();
    let gr = def.group_resource();
    let w = Watcher { def, p };
    let mut initial: Vec<Bytes> = Vec::new();
    let mut failed = false;
    if w.p.send_initial_events || w.p.rv.is_none() {
        for (_, obj) in st.store.list(&gr, w.p.namespace.as_deref().filter(|_| w.def.namespaced)) {
            if w.visible(obj) {
                initial.push(w.render("ADDED", obj.clone()));
            }
        }
        if w.p.send_initial_events {
            initial.push(w.bookmark(cur, true));
        }
    } else if let Some(rv) = w.p.rv {
        match st.store.events_since(&gr, rv) {
            Ok(evs) => initial.extend(evs.iter().filter_map(|e| w.translate(e))),
            Err(HistoryError::Compacted { requested, oldest }) => {
                initial.push(error_line(&ApiError::gone(format!("too old resource version: {requested} ({oldest})"))));
                failed = true;
            }
            Err(HistoryError::TooLarge { requested, current }) => {
                let mut e = ApiError::new(
                    504,
                    "Timeout",
                    format!("Too large resource version: {requested}, current: {current}"),
                );
                e.details = Some(
                    json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
                );
                initial.push(error_line(&e));
                failed = true;
            }
        }
    }
    let (tx, out) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run(w, rx, tx, initial, cur, failed, shutdown));
    Ok(out)
}

/// Queues one encoded event for the client. A client that stops reading must not keep the
/// watch (and with it a graceful server shutdown) alive past its timeout or the shutdown.
async fn deliver(tx: &mpsc::Sender<Bytes>, b: Bytes, shutdown: &mut watch::Receiver<bool>, deadline: Instant) -> bool {
    tokio::select! {
        r = tx.send(b) => r.is_ok(),
        _ = shutdown.changed() => false,
        _ = tokio::time::sleep_until(deadline) => false,
    }
}

async fn run(
    w: Watcher,
    mut rx: broadcast::Receiver<Arc<StoredEvent>>,
    tx: mpsc::Sender<Bytes>,
    initial: Vec<Bytes>,
    mut last_rv: u64,
    failed: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let start = Instant::now();
    let deadline = start + w.p.timeout;
    for b in initial {
        if !deliver(&tx, b, &mut shutdown, deadline).await {
            return;
        }
    }
    if failed {
        return;
    }
    let gr = w.def.group_resource();
    // kube-apiserver sends a bookmark ~2s before a watch times out, and about every minute.
    let mut next_bookmark = start + w.p.bookmark_interval;
    let pre_timeout = deadline.checked_sub(Duration::from_secs(2)).filter(|t| *t > start);
    let mut pre_timeout_sent = false;
    loop {
        let wake = match pre_timeout.filter(|_| !pre_timeout_sent) {
            Some(t) if w.p.bookmarks => t.min(next_bookmark),
            _ => next_bookmark,
        };
        tokio::select! {
            ev = rx.recv() => match ev {
                Ok(ev) => {
                    if ev.rv <= last_rv {
                        continue;
                    }
                    last_rv = ev.rv;
                    if ev.gr != gr {
                        continue;
                    }
                    if let Some(b) = w.translate(&ev) {
                        if !deliver(&tx, b, &mut shutdown, deadline).await {
                            return;
                        }
                    }
                }
                // A watcher that fell behind is closed; the client resumes from its last rv.
                Err(_) => return,
            },
            _ = tokio::time::sleep_until(wake), if w.p.bookmarks => {
                // Drain what is already queued so the bookmark never skips an event.
                loop {
                    match rx.try_recv() {
                        Ok(ev) => {
                            if ev.rv <= last_rv { continue; }
                            last_rv = ev.rv;
                            if ev.gr == gr {
                                if let Some(b) = w.translate(&ev) {
                                    if !deliver(&tx, b, &mut shutdown, deadline).await { return; }
                                }
                            }
                        }
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(_) => return,
                    }
                }
                if !deliver(&tx, w.bookmark(last_rv, false), &mut shutdown, deadline).await {
                    return;
                }
                let now = Instant::now();
                if pre_timeout.is_some_and(|t| now >= t) {
                    pre_timeout_sent = true;
                }
                if now >= next_bookmark {
                    next_bookmark = now + w.p.bookmark_interval;
                }
            },
            _ = tokio::time::sleep_until(deadline) => return,
            _ = shutdown.changed() => return,
        }
    }
}

/// Parses the watch-related query parameters.
pub fn params(
    def: &ResourceDef,
    q: &crate::query::Query,
    ns: Option<&str>,
    table: Option<TableOptions>,
    bookmark_interval: Duration,
) -> Result<WatchParams, ApiError> {
    let rv = match q.get("resourceVersion") {
        None | Some("0") => None,
        Some(r) => Some(api::parse_rv(r)?),
    };
    // 0 or unset: kube-apiserver picks a random time between 30 and 60 minutes.
    let secs = match q.get("timeoutSeconds") {
        Some(t) => t.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
        None => 0,
    };
    let timeout = if secs == 0 {
        Duration::from_secs(1800 + (crate::meta::unix_now() as u64 % 1800))
    } else {
        Duration::from_secs(secs)
    };
    Ok(WatchParams {
        rv,
        send_initial_events: q.is_true("sendInitialEvents"),
        bookmarks: q.is_true("allowWatchBookmarks"),
        timeout,
        selectors: api::selectors(def, q)?,
        namespace: ns.map(String::from),
        table,
        bookmark_interval,
    })
}
