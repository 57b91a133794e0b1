//! The claims watch of the process, kept across leader terms: a standby lists and follows the
//! claims while it waits to lead, so that a new term starts from a store that is already full.
//! At 10,000 claims the list a term made for itself took 1.1–1.4 s of a leader change in which
//! nothing is granted. Like the informers controller-runtime starts in every replica, before the
//! election: the price is the store's memory in the standby too.
//!
//! A term plans from a state no older than its own start (docs/design.md: fencing): with its own
//! list, made after the fence, that was given. A warm store may lag behind the API server, so
//! each term makes one write to a claim of each scope after the fence (the annotation
//! [`SYNC_ANNOTATION`]) and plans only once the watch has delivered that write: a watch
//! delivers a collection's changes in order, so every write made before it (every status write
//! of an earlier term among them) is in the store by then. Only resourceVersions the API server
//! gave are compared, and only for equality.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};

use super::base::scopes::Scopes;
use super::base::{Error, API_TIMEOUT};
use crate::api::KeptClaim;
use crate::metrics::Metrics;

/// What a term receives: the store's own copies, never clones (replayed at a term's start as
/// clones, 10,000 claims stood in the channel at once as a second copy of the store: 14 MB of a
/// fresh operator's 42 MB peak heap at 10,000 claims).
pub type Event = watcher::Event<Arc<KeptClaim>>;

/// Written by each term to one claim of each served scope, with the term's epoch: the write the
/// term waits to see on its watch before it plans (see the module's text).
pub const SYNC_ANNOTATION: &str = "zklock.io/leader-sync";

/// One served scope's claims (a namespace, or all).
struct Scope {
    /// For the sync write (requests, with their deadline).
    api: Api<KeptClaim>,
    requests: kube::Client,
    store: Store<KeptClaim>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// The current term's receiver of the watch's events (none while standing by).
    subscriber: Mutex<Option<Subscriber>>,
    /// Whether the watch has listed once.
    listed: Mutex<bool>,
    /// Whether a list is under way.
    listing: Mutex<bool>,
    /// The last number given to a claim a watch delivered first (`KeptClaim::arrival`): a
    /// term is handed the store in that order, as if it had followed the watch all along (the
    /// admission gate orders claims created within one second by it). One counter for every
    /// scope: claims of several namespaces queue on a `ClusterLock`.
    arrivals: Arc<std::sync::atomic::AtomicU64>,
    /// Claims whose delivered resourceVersions are being recorded, for a sync write.
    recording: Mutex<Vec<(String, HashSet<String>)>>,
    delivered: Notify,
}

struct Subscriber {
    tx: mpsc::UnboundedSender<Event>,
    /// Subscribed while a list was under way: gets the whole store when it is done.
    replay_when_listed: bool,
}

/// The claims of every served scope, watched for the life of the process.
pub struct ClaimFeeds {
    scopes: Vec<Scope>,
    _watches: tokio::task::JoinSet<()>,
}

impl ClaimFeeds {
    /// Starts watching the claims of `namespaces` (all, if empty): `watches` for the watches,
    /// `requests` for the sync writes.
    pub fn start(
        watches: &kube::Client,
        requests: &kube::Client,
        namespaces: &[String],
        metrics: Arc<Metrics>,
    ) -> ClaimFeeds {
        let mut tasks = tokio::task::JoinSet::new();
        let scopes = Scopes::new(namespaces.to_vec());
        let watched = scopes.apis::<KeptClaim>(watches);
        let requested = scopes.apis::<KeptClaim>(requests);
        let writers: Vec<_> = watched.iter().map(|_| reflector::store::<KeptClaim>()).collect();
        let stores: Vec<Store<KeptClaim>> = writers.iter().map(|(store, _)| store.clone()).collect();
        let arrivals = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let scopes = watched
            .into_iter()
            .zip(requested)
            .zip(writers)
            .map(|((watched, api), (store, writer))| {
                let shared = Arc::new(Shared { arrivals: arrivals.clone(), ..Shared::default() });
                let counted = (stores.clone(), metrics.clone());
                tasks.spawn(follow(watched, writer, shared.clone(), counted));
                Scope { api, requests: requests.clone(), store, shared }
            })
            .collect();
        ClaimFeeds { scopes, _watches: tasks }
    }

    /// Resolves once every scope's watch has listed its claims.
    pub async fn listed(&self) {
        for scope in &self.scopes {
            loop {
                let notified = scope.shared.delivered.notified();
                if *scope.shared.listed.lock() {
                    break;
                }
                notified.await;
            }
        }
    }

    /// Each scope's store.
    pub fn stores(&self) -> Vec<Store<KeptClaim>> {
        self.scopes.iter().map(|scope| scope.store.clone()).collect()
    }

    /// Each scope's events from now on for the term that begins: first the store's content (as
    /// a list's), then every change the watch delivers. Taken after the fence and [`Self::sync`]:
    /// the replay is where the term's registry takes each claim's phase from (the first copy
    /// it sees), and a replay taken before the fence missed an earlier leader's write that
    /// landed before it (a Held the ledger never learned). The term's receivers replace any
    /// earlier term's.
    pub fn subscribe(&self) -> Vec<mpsc::UnboundedReceiver<Event>> {
        self.scopes.iter().map(|scope| scope.shared.subscribe(&scope.store)).collect()
    }

    /// After the fence: one write to a claim of each scope, awaited on the watch (see the
    /// module's text); all scopes at once. A scope without a claim has none to plan from.
    pub async fn sync(&self, epoch: i64, leadership: &crate::leader::Leadership) -> Result<(), Error> {
        futures::future::try_join_all(self.scopes.iter().map(|scope| scope.sync(epoch, leadership))).await?;
        Ok(())
    }
}

impl Scope {
    async fn sync(&self, epoch: i64, leadership: &crate::leader::Leadership) -> Result<(), Error> {
        loop {
            self.shared.until_listed(leadership, API_TIMEOUT).await?;
            // A consistent read (no resourceVersion): the claim exists now.
            let listed = tokio::time::timeout(API_TIMEOUT, self.api.list_metadata(&ListParams::default().limit(1)))
                .await
                .map_err(|_| Error::Timeout { call: "list_claims" })?
                .map_err(|source| Error::Write { call: "list_claims", source })?;
            let Some(claim) = listed.items.into_iter().next() else { return Ok(()) };
            let (Some(name), Some(uid)) = (claim.metadata.name, claim.metadata.uid) else {
                return Err(Error::Malformed("a name and a uid"));
            };
            let api = match claim.metadata.namespace.as_deref() {
                Some(ns) => Api::<KeptClaim>::namespaced(self.requests.clone(), ns),
                None => self.api.clone(),
            };
            // Recorded from before the write: its event cannot come earlier.
            self.shared.recording.lock().push((uid.clone(), HashSet::new()));
            // The uid makes the write fail (409) on another claim of the same name.
            let patch = serde_json::json!({
                "metadata": { "uid": uid, "annotations": { SYNC_ANNOTATION: epoch.to_string() } }
            });
            let written = tokio::time::timeout(
                API_TIMEOUT,
                api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await;
            let result = match written {
                Ok(Ok(written)) => match written.metadata.resource_version {
                    Some(version) => self.delivered(&uid, &version).await.map(|()| true),
                    None => Err(Error::Malformed("a resourceVersion")),
                },
                // Gone (or another of its name) meanwhile: another claim, from a new list.
                Ok(Err(kube::Error::Api(e))) if e.code == 404 || e.code == 409 => Ok(false),
                Ok(Err(source)) => Err(Error::Write { call: "sync_claim_watch", source }),
                Err(_) => Err(Error::Timeout { call: "sync_claim_watch" }),
            };
            self.shared.recording.lock().retain(|(u, _)| *u != uid);
            if result? {
                return Ok(());
            }
        }
    }

    /// Waits until the watch has delivered version `version` of claim `uid`. A watch that does
    /// not within [`API_TIMEOUT`] cannot be planned from: the term gives up (another replica, or
    /// this one after its pause, tries with a watch that works).
    async fn delivered(&self, uid: &str, version: &str) -> Result<(), Error> {
        let seen = || self.shared.recording.lock().iter().any(|(u, versions)| u == uid && versions.contains(version));
        let waited = tokio::time::timeout(API_TIMEOUT, async {
            loop {
                let notified = self.shared.delivered.notified();
                if seen() {
                    return;
                }
                notified.await;
            }
        })
        .await;
        waited.map_err(|_| {
            Error::CannotServe(format!(
                "the claim watch did not deliver this term's write to claim {uid} within {API_TIMEOUT:?}"
            ))
        })
    }
}

/// The watch of one scope, for the life of the process: into `writer`'s store, then to the
/// term's subscriber, if any.
async fn follow(
    api: Api<KeptClaim>,
    writer: reflector::store::Writer<KeptClaim>,
    shared: Arc<Shared>,
    (stores, metrics): (Vec<Store<KeptClaim>>, Arc<Metrics>),
) {
    let store = writer.as_reader();
    watcher(api, watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECONDS))
        .default_backoff()
        .map_ok(|event| number(&shared, &store, event))
        .reflect(writer)
        .for_each(|event| {
            match event {
                Ok(event) => deliver(&shared, &store, event),
                Err(e) => tracing::warn!(error = %e, "claim watch failed; retrying"),
            }
            let watched: usize = stores.iter().map(Store::len).sum();
            metrics.claims_watched.set(i64::try_from(watched).unwrap_or(i64::MAX));
            std::future::ready(())
        })
        .await
}

impl Shared {
    /// Waits, while this process leads, until the watch has listed and no list is under way: the
    /// sync write's event comes only after a list in progress, and a list of 100,000 claims on a
    /// busy API server outlasts the delivery's deadline (a fresh leader at that size gave its
    /// first term up). A list that delivers nothing for `quiet` (a watch that fails again and
    /// again) gives the term up as a late delivery does: no term keeps the Lease waiting for a
    /// watch that does not work.
    async fn until_listed(&self, leadership: &crate::leader::Leadership, quiet: Duration) -> Result<(), Error> {
        let mut progress = tokio::time::Instant::now();
        loop {
            leadership.time_left().ok_or(Error::NotLeading)?;
            let notified = self.delivered.notified();
            if *self.listed.lock() && !*self.listing.lock() {
                return Ok(());
            }
            if progress.elapsed() > quiet {
                return Err(Error::CannotServe(format!("the claim watch's list delivered nothing for {quiet:?}")));
            }
            // Woken by the watch's next event; the lease is looked at again at least each second.
            if tokio::time::timeout(quiet.min(Duration::from_secs(1)), notified).await.is_ok() {
                progress = tokio::time::Instant::now();
            }
        }
    }

    /// The store's content as a list's events, then every change delivered from now on.
    fn subscribe(&self, store: &Store<KeptClaim>) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut subscriber = self.subscriber.lock();
        // Under the subscriber's lock, which every delivery takes: an event the store had before
        // this snapshot may come once more, none is missed. A claim that comes twice is one
        // claim; one deleted after the snapshot comes as a deletion.
        replay(&tx, store, *self.listed.lock());
        // A list under way keeps what it has read so far out of the store until it is done:
        // the term gets the whole store again then.
        *subscriber = Some(Subscriber { tx, replay_when_listed: *self.listing.lock() });
        rx
    }
}

/// The store's content as a list's events, in the order the watch first delivered the claims
/// (its end too, if `listed`).
fn replay(tx: &mpsc::UnboundedSender<Event>, store: &Store<KeptClaim>, listed: bool) {
    let _ = tx.send(watcher::Event::Init);
    let mut claims = store.state();
    claims.sort_by_key(|c| c.arrival);
    for claim in claims {
        let _ = tx.send(watcher::Event::InitApply(claim));
    }
    if listed {
        let _ = tx.send(watcher::Event::InitDone);
    }
}

/// Numbers a claim the watch delivers (before it goes into `store`): the number of the copy
/// the store has of the same claim (same UID: a claim made again under the same name is
/// another), or the next one.
fn number(
    shared: &Shared,
    store: &Store<KeptClaim>,
    mut event: watcher::Event<KeptClaim>,
) -> watcher::Event<KeptClaim> {
    if let watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) = &mut event {
        let known = store
            .get(&reflector::ObjectRef::from_obj(claim))
            .filter(|kept| kept.metadata.uid == claim.metadata.uid)
            .map(|kept| kept.arrival);
        claim.arrival = known.unwrap_or_else(|| shared.arrivals.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
    }
    event
}

/// The event with the store's copy of its claim (the one just put there: this task is the
/// store's only writer); a deleted claim, out of the store, in an `Arc` of its own.
fn shared_copy(store: &Store<KeptClaim>, event: watcher::Event<KeptClaim>) -> Event {
    let kept = |claim: KeptClaim| store.get(&reflector::ObjectRef::from_obj(&claim)).unwrap_or_else(|| Arc::new(claim));
    match event {
        watcher::Event::Apply(claim) => watcher::Event::Apply(kept(claim)),
        watcher::Event::InitApply(claim) => watcher::Event::InitApply(kept(claim)),
        watcher::Event::Delete(claim) => watcher::Event::Delete(Arc::new(claim)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Hands one event of the watch, already in `store`, to the term, if any.
fn deliver(shared: &Shared, store: &Store<KeptClaim>, event: watcher::Event<KeptClaim>) {
    if let watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) = &event {
        let mut recording = shared.recording.lock();
        if !recording.is_empty() {
            if let (Some(uid), Some(version)) = (claim.metadata.uid.as_deref(), &claim.metadata.resource_version) {
                for (_, versions) in recording.iter_mut().filter(|(u, _)| u == uid) {
                    versions.insert(version.clone());
                }
            }
        }
    }
    let mut subscriber = shared.subscriber.lock();
    match event {
        watcher::Event::Init => *shared.listing.lock() = true,
        watcher::Event::InitDone => {
            *shared.listing.lock() = false;
            *shared.listed.lock() = true;
        }
        _ => {}
    }
    let sent = match subscriber.as_mut() {
        Some(Subscriber { tx, replay_when_listed })
            if *replay_when_listed && matches!(event, watcher::Event::InitDone) =>
        {
            *replay_when_listed = false;
            replay(tx, store, true);
            !tx.is_closed()
        }
        Some(Subscriber { tx, .. }) => tx.send(shared_copy(store, event)).is_ok(),
        None => true,
    };
    if !sent {
        // The term ended.
        *subscriber = None;
    }
    drop(subscriber);
    shared.delivered.notify_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, version: &str) -> KeptClaim {
        let mut claim: KeptClaim = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": {}}),
        )
        .expect("a claim");
        claim.metadata.resource_version = Some(version.into());
        claim
    }

    fn names(rx: &mut mpsc::UnboundedReceiver<Event>) -> Vec<String> {
        let mut seen = vec![];
        let name = |c: &KeptClaim| c.metadata.name.clone().unwrap_or_default();
        while let Ok(event) = rx.try_recv() {
            seen.push(match event {
                watcher::Event::Init => "init".to_string(),
                watcher::Event::InitApply(c) => format!("list {}", name(&c)),
                watcher::Event::InitDone => "listed".to_string(),
                watcher::Event::Apply(c) => format!("apply {}", name(&c)),
                watcher::Event::Delete(c) => format!("delete {}", name(&c)),
            });
        }
        seen
    }

    /// Into the store first, then to the term: as `follow` does.
    fn watch(writer: &mut reflector::store::Writer<KeptClaim>, shared: &Shared, event: watcher::Event<KeptClaim>) {
        let event = number(shared, &writer.as_reader(), event);
        writer.apply_watcher_event(&event);
        deliver(shared, &writer.as_reader(), event);
    }

    #[tokio::test]
    async fn a_term_waits_for_a_list_that_progresses_and_gives_up_on_one_that_does_not() {
        let leading = crate::leader::Leadership::always();
        let quiet = Duration::from_millis(200);
        let stuck = Shared::default();
        let waited = tokio::time::timeout(Duration::from_secs(5), stuck.until_listed(&leading, quiet)).await;
        assert!(matches!(waited, Ok(Err(Error::CannotServe(_)))), "a watch that lists nothing gives the term up");

        let slow = Arc::new(Shared::default());
        *slow.listing.lock() = true;
        let lister = {
            let slow = slow.clone();
            tokio::spawn(async move {
                // Pages for three times `quiet`, then the end of the list.
                for _ in 0..12 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    slow.delivered.notify_waiters();
                }
                *slow.listing.lock() = false;
                *slow.listed.lock() = true;
                slow.delivered.notify_waiters();
            })
        };
        let started = std::time::Instant::now();
        let waited = tokio::time::timeout(Duration::from_secs(5), slow.until_listed(&leading, quiet)).await;
        assert!(matches!(waited, Ok(Ok(()))), "a list that progresses is waited for");
        assert!(started.elapsed() >= Duration::from_millis(500), "until its end");
        lister.await.expect("the lister ran");
    }

    #[test]
    fn a_term_gets_the_store_as_a_list_then_every_change_and_a_standby_gets_none() {
        let (store, mut writer) = reflector::store::<KeptClaim>();
        let shared = Shared::default();
        watch(&mut writer, &shared, watcher::Event::Init);
        watch(&mut writer, &shared, watcher::Event::InitApply(claim("a", "1")));
        let mut early = shared.subscribe(&store);
        assert_eq!(names(&mut early), ["init"], "subscribed while the first list is under way: nothing listed yet");
        watch(&mut writer, &shared, watcher::Event::InitApply(claim("b", "2")));
        watch(&mut writer, &shared, watcher::Event::InitDone);
        let mut listed = names(&mut early);
        listed[2..4].sort();
        assert_eq!(
            listed,
            ["list b", "init", "list a", "list b", "listed"],
            "the rest of the list as it comes, then the whole store (a was read before the term came)"
        );
        drop(early);
        watch(&mut writer, &shared, watcher::Event::Apply(claim("c", "3")));
        assert!(shared.subscriber.lock().is_none(), "an ended term is let go of at the next change");

        let mut term = shared.subscribe(&store);
        let mut replayed = names(&mut term);
        replayed[1..4].sort();
        assert_eq!(replayed, ["init", "list a", "list b", "list c", "listed"]);
        watch(&mut writer, &shared, watcher::Event::Delete(claim("a", "4")));
        assert_eq!(names(&mut term), ["delete a"]);
    }

    #[test]
    fn a_term_gets_the_stores_own_copies_never_clones() {
        let (store, mut writer) = reflector::store::<KeptClaim>();
        let shared = Shared::default();
        for event in [watcher::Event::Init, watcher::Event::InitApply(claim("a", "1")), watcher::Event::InitDone] {
            watch(&mut writer, &shared, event);
        }
        let mut term = shared.subscribe(&store);
        watch(&mut writer, &shared, watcher::Event::Apply(claim("b", "2")));
        let kept = |name: &str| store.get(&reflector::ObjectRef::new(name).within("ns")).expect("in the store");
        let mut claims = vec![];
        while let Ok(event) = term.try_recv() {
            if let watcher::Event::InitApply(c) | watcher::Event::Apply(c) = event {
                claims.push(c);
            }
        }
        assert_eq!(claims.len(), 2, "the replayed claim and the changed one");
        for claim in claims {
            let name = claim.metadata.name.clone().unwrap_or_default();
            assert!(Arc::ptr_eq(&claim, &kept(&name)), "{name} is the store's copy");
        }
    }

    #[test]
    fn a_term_gets_the_claims_in_the_order_the_watch_first_delivered_them() {
        let (store, mut writer) = reflector::store::<KeptClaim>();
        let shared = Shared::default();
        watch(&mut writer, &shared, watcher::Event::Init);
        watch(&mut writer, &shared, watcher::Event::InitDone);
        let created: Vec<String> = (0..30).map(|i| format!("c{}", (i * 7) % 30)).collect();
        for (i, name) in created.iter().enumerate() {
            watch(&mut writer, &shared, watcher::Event::Apply(claim(name, &i.to_string())));
        }
        watch(&mut writer, &shared, watcher::Event::Apply(claim("c7", "99")));
        let mut term = shared.subscribe(&store);
        let replayed: Vec<String> =
            names(&mut term).into_iter().filter_map(|e| e.strip_prefix("list ").map(str::to_string)).collect();
        assert_eq!(replayed, created, "as first delivered, not as the store hashes them");
    }

    #[test]
    fn a_claim_keeps_its_number_across_a_relist_and_a_claim_made_again_gets_a_new_one() {
        let (store, mut writer) = reflector::store::<KeptClaim>();
        let shared = Shared::default();
        for (i, name) in ["a", "b"].into_iter().enumerate() {
            watch(&mut writer, &shared, watcher::Event::Apply(claim(name, &i.to_string())));
        }
        // Watched again from a list (after a desync): the store keeps its copies until it is done.
        watch(&mut writer, &shared, watcher::Event::Init);
        watch(&mut writer, &shared, watcher::Event::InitApply(claim("b", "5")));
        watch(&mut writer, &shared, watcher::Event::InitApply(claim("a", "6")));
        watch(&mut writer, &shared, watcher::Event::InitDone);
        let number =
            |name: &str| store.state().iter().find(|c| c.metadata.name.as_deref() == Some(name)).map(|c| c.arrival);
        assert_eq!((number("a"), number("b")), (Some(1), Some(2)));
        let mut again = claim("a", "7");
        again.metadata.uid = Some("a-again".into());
        watch(&mut writer, &shared, watcher::Event::Apply(again));
        assert_eq!(number("a"), Some(3), "another claim of the same name is numbered as new");
    }

    #[test]
    fn the_versions_a_sync_waits_for_are_recorded_only_for_its_claim() {
        let (_, mut writer) = reflector::store::<KeptClaim>();
        let shared = Shared::default();
        shared.recording.lock().push(("a".into(), HashSet::new()));
        watch(&mut writer, &shared, watcher::Event::Apply(claim("b", "5")));
        watch(&mut writer, &shared, watcher::Event::Apply(claim("a", "6")));
        watch(&mut writer, &shared, watcher::Event::Apply(claim("a", "7")));
        let recording = shared.recording.lock();
        let versions: std::collections::BTreeSet<&str> = recording[0].1.iter().map(String::as_str).collect();
        assert_eq!(versions, ["6", "7"].into());
    }
}
