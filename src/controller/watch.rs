//! What the controller watches: each served scope's claims (kept in its reflector store, noted in
//! the registry in delivery order); holder pods are in `holders`. Claims that leave the API
//! while the lock engine still tracks their node are handed to the orphan release.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use kube::ResourceExt;
use tokio::sync::mpsc;

use super::base::{claim_facts, ids, Uid};
use super::context::Context;
use super::holders::HolderPod;
use super::registry::Seen;
use crate::api::KeptClaim;
use crate::recipe::Mode;

/// The claims of one scope, as the process's watch delivers them to this term (see `feed`),
/// as the controller's trigger stream.
pub fn claims(
    ctx: Arc<Context>,
    events: mpsc::UnboundedReceiver<super::feed::Event>,
) -> impl Stream<Item = Arc<KeptClaim>> + Send + 'static {
    let mut synced = false;
    let mut events = events;
    futures::stream::poll_fn(move |cx| events.poll_recv(cx)).filter_map(move |event| {
        let applied = match event {
            watcher::Event::InitApply(claim) => {
                noted(&ctx, &claim);
                // Listed (or replayed: a term's start) before the re-anchoring is over, only a
                // claim that asks for something is reconciled before the walk that follows it
                // (`Context::serves_reconcile`), so only it is a trigger. The others, every
                // claim at a term's start, would each stand in kube-runtime's scheduler once,
                // to be turned away, and its tables keep the size they grew to for the rest of
                // the process (docs/benchmarks.md, "A term's start: triggers").
                let asks = || claim_facts::asks(&claim, ctx.registry.recorded_phase(&claim));
                (ctx.serving.anchored() || asks()).then_some(claim)
            }
            watcher::Event::Apply(claim) => {
                noted(&ctx, &claim);
                Some(claim)
            }
            watcher::Event::Delete(claim) => {
                if let Some(uid) = claim.metadata.uid.as_deref() {
                    ctx.orphan(uid);
                    // Gone from the store: no reconcile of it will run for the walk to wait on.
                    ctx.serving.reconciled(uid);
                }
                gated_pod_of(&ctx, &claim);
                super::status::locks::claim_changed(&ctx, &claim);
                None
            }
            watcher::Event::InitDone => {
                if !std::mem::replace(&mut synced, true) {
                    ctx.serving.mark_claims_replayed();
                }
                // Claims kept from before a re-list and not in it left the API unseen.
                ctx.sweep();
                None
            }
            watcher::Event::Init => None,
        };
        std::future::ready(applied)
    })
}

/// What every delivery of a claim is noted in: the registry (its first), its gated pod, its
/// `Lock`s' status.
fn noted(ctx: &Context, claim: &KeptClaim) {
    first_seen(ctx, claim);
    gated_pod_of(ctx, claim);
    super::status::locks::claim_changed(ctx, claim);
}

/// A change to a claim made for a pod is news for that pod (and for a new pod of its name).
fn gated_pod_of(ctx: &Context, claim: &KeptClaim) {
    if let (Some(owner), Some(namespace)) = (super::gated::plan::owner_pod(claim), claim.metadata.namespace.as_deref())
    {
        ctx.triggers.pod(ObjectRef::new(&owner.name).within(namespace));
    }
}

/// The watch delivers new claims in creation order: note it before any reconcile of them (and
/// before the first pass judges its locks: see `anchor::listed_holds`).
pub(super) fn first_seen(ctx: &Context, claim: &KeptClaim) {
    let (Some(uid), Some(name), Some(namespace)) =
        (claim.metadata.uid.as_deref(), claim.metadata.name.as_deref(), claim.metadata.namespace.as_deref())
    else {
        return;
    };
    if ctx.registry.key(uid).is_some() {
        // Known: every later event of the claim (each status write comes back as one) stops here.
        return;
    }
    if claim_facts::cleaned_up(claim) {
        // Its cleanup is over (another finalizer keeps the object): nothing of it is served, so
        // it waits at no gate and is counted in no lock.
        return;
    }
    let uid = ctx.engine.id(uid).unwrap_or_else(|| uid.into());
    let phase = claim.phase();
    let locks: Vec<(String, bool)> = if claim.unreadable.is_some() {
        // What it asks for cannot be read: it is never enqueued, and waits at no gate. Known
        // all the same (a claim the registry does not know is taken for gone, and its nodes
        // released), with the locks its status records it holds (a waiter gives its place up).
        let keeps = claim_facts::keeps_nodes(phase);
        let recorded = if keeps { claim_facts::recorded_parts(claim, &uid) } else { vec![] };
        recorded.iter().map(|(part, _)| (part.lock.clone(), part.mode == Mode::Exclusive)).collect()
    } else {
        claim
            .spec
            .lock_refs()
            .iter()
            .filter_map(|l| Some((ids::path_of_ref(&ctx.layout, namespace, l)?, l.mode == Mode::Exclusive)))
            .collect()
    };
    let created = claim.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
    let pod = claim.spec.holder.as_ref().map(|h| h.pod_name.as_str()).filter(|_| claim.unreadable.is_none());
    ctx.registry.first_seen(&uid, Seen { name, namespace, locks: &locks, pod, arrival: claim.arrival }, created, phase);
    // Its holder pod's deletion may have come before the claim did (a new term's pod watch
    // lists before its claims are replayed): then nothing else would reconcile it before the
    // walk reaches it.
    if pod.is_some() && ctx.holder_may_be_gone(claim) {
        ctx.trigger(&uid);
    }
}

/// The claims a pod holds, as the controller's objects.
pub fn claims_of_pod(ctx: &Context, pod: &HolderPod) -> Vec<ObjectRef<KeptClaim>> {
    let namespace = pod.namespace().unwrap_or_default();
    ctx.registry.claims_of_pod(&namespace, &pod.name_any()).iter().filter_map(|uid| ctx.object_ref(uid)).collect()
}

/// Releases the nodes of claims that left the API while the engine still tracks them. Normally
/// a claim's node goes first (the finalizer); if somebody removed the finalizer by hand, the
/// node would hold the lock for a claim nobody can see any more and block every waiter for good.
/// One task, so that a ZooKeeper outage never holds up a watch.
pub async fn release_orphans(ctx: Arc<Context>, mut orphans: mpsc::UnboundedReceiver<Uid>) {
    // Before every scope has listed its claims, a claim missing from the stores may simply not
    // be listed yet.
    ctx.serving.wait_synced().await;
    while let Some(uid) = orphans.recv().await {
        if ctx.is_served(&uid) {
            continue;
        }
        let parts = ctx.parts_tracked(&uid);
        if !parts.is_empty() {
            tracing::warn!(uid = %uid, "a claim was deleted without its finalizer; releasing its znode");
            if let Err(error) = ctx.engine.release_group(&ids::ids(&parts)).await {
                tracing::warn!(uid = %uid, %error, "could not release an orphaned znode; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
                ctx.orphan(&uid);
                continue;
            }
        }
        ctx.registry.forget(&uid);
        ctx.metrics.set_phase_counts(&ctx.registry.phase_counts());
    }
}

/// Every pod of one scope, as [`HolderPod`]s in `writer`'s store: any change to one (or its
/// deletion) reconciles the claims it holds. After a re-list every claim with a holder is
/// looked at, in case a deletion was missed in the gap.
pub fn holder_pods(
    ctx: Arc<Context>,
    api: Api<HolderPod>,
    writer: Writer<HolderPod>,
) -> impl Stream<Item = Result<HolderPod, watcher::Error>> + Send + 'static {
    watcher(api, watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECONDS))
        .default_backoff()
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::InitDone) => {
                for uid in ctx.registry.claims_with_holders() {
                    ctx.trigger(&uid);
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                // Before the claims it holds are triggered (downstream): their reconciles see it.
                ctx.holder_pods.deleted(pod, |(ns, name)| !ctx.registry.claims_of_pod(ns, name).is_empty());
            }
            Err(e) => tracing::debug!(error = %e, "pod watch error; the watcher retries"),
            Ok(_) => {}
        })
        .touched_objects()
}
