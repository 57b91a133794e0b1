//! The controllers kube-controller-manager would run against these resources: the garbage
//! collector (ownerReferences, foreground/orphan deletion), namespace cleanup, and CRD
//! instance cleanup. They act on watch events, asynchronously, as the real ones do.

use crate::api::{self, DeleteOptions, FOREGROUND, ORPHAN};
use crate::crd::CLEANUP_FINALIZER;
use crate::registry::GroupResource;
use crate::server::Shared;
use crate::state::State;
use crate::store::{EventType, ObjKey, StoredEvent};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::broadcast;

type Item = (GroupResource, ObjKey);

fn background() -> DeleteOptions {
    DeleteOptions { propagation: None, uid: None, resource_version: None, dry_run: false }
}

fn uid(obj: &Value) -> Option<String> {
    obj.pointer("/metadata/uid").and_then(Value::as_str).map(String::from)
}

fn terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null())
}

fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == f))
}

fn blocks_owner(dependent: &Value, owner_uid: &str) -> bool {
    dependent.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|refs| {
        refs.iter().any(|r| {
            r.get("uid").and_then(Value::as_str) == Some(owner_uid)
                && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
        })
    })
}

fn is_namespace(gr: &GroupResource) -> bool {
    gr.group.is_empty() && gr.resource == "namespaces"
}

fn is_crd(gr: &GroupResource) -> bool {
    gr.group == "apiextensions.k8s.io" && gr.resource == "customresourcedefinitions"
}

fn needs_work(gr: &GroupResource, obj: &Value) -> bool {
    terminating(obj) && (is_namespace(gr) || is_crd(gr) || has_finalizer(obj, FOREGROUND) || has_finalizer(obj, ORPHAN))
}

pub async fn run(shared: Arc<Shared>, mut rx: broadcast::Receiver<Arc<StoredEvent>>) {
    let mut shutdown = shared.shutdown.clone();
    let mut pending: BTreeSet<Item> = BTreeSet::new();
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let mut batch = Vec::new();
                let mut lagged = false;
                match ev {
                    Ok(e) => batch.push(e),
                    Err(broadcast::error::RecvError::Lagged(_)) => lagged = true,
                    Err(_) => return,
                }
                loop {
                    match rx.try_recv() {
                        Ok(e) => batch.push(e),
                        Err(broadcast::error::TryRecvError::Lagged(_)) => lagged = true,
                        Err(_) => break,
                    }
                }
                let mut st = shared.lock();
                if lagged {
                    full_scan(&mut st, &mut pending);
                }
                for ev in &batch {
                    on_event(&mut st, ev, &mut pending);
                }
                pending.retain(|item| !progress(&mut st, item));
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// After missing events: re-derive all outstanding work from the store itself.
fn full_scan(st: &mut State, pending: &mut BTreeSet<Item>) {
    let mut dangling = Vec::new();
    for gr in st.store.resources() {
        for (k, obj) in st.store.list(&gr, None) {
            if needs_work(&gr, obj) {
                pending.insert((gr.clone(), k.clone()));
            }
            let refs = obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
            for r in refs {
                if let Some(u) = r.get("uid").and_then(Value::as_str) {
                    if st.store.lookup_uid(u).is_none() {
                        dangling.push(u.to_string());
                    }
                }
            }
        }
    }
    for u in dangling {
        owner_gone(st, &u);
    }
}

fn on_event(st: &mut State, ev: &StoredEvent, pending: &mut BTreeSet<Item>) {
    match ev.ty {
        EventType::Deleted => {
            if let Some(u) = uid(&ev.object) {
                owner_gone(st, &u);
            }
        }
        _ => {
            if needs_work(&ev.gr, &ev.object) {
                pending.insert((ev.gr.clone(), ev.key.clone()));
            }
            // A dependent whose owners do not exist (never did, or are already gone) is
            // collected like one whose owner was just deleted.
            let refs = ev.object.pointer("/metadata/ownerReferences").and_then(Value::as_array);
            let uids: Vec<String> = refs
                .into_iter()
                .flatten()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(String::from))
                .collect();
            if !uids.is_empty() && uids.iter().all(|u| st.store.lookup_uid(u).is_none()) {
                if let Some(u) = uids.first() {
                    owner_gone(st, u);
                }
            }
        }
    }
}

/// An owner has disappeared: dependents with other live owners lose the reference; the rest
/// are deleted (background propagation, their own finalizers respected).
fn owner_gone(st: &mut State, owner_uid: &str) {
    for (gr, k) in st.store.dependents_of(owner_uid) {
        let Some(obj) = st.store.get(&gr, &k).cloned() else {
            continue;
        };
        let refs = obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
        let others_alive = refs
            .iter()
            .filter_map(|r| r.get("uid").and_then(Value::as_str))
            .any(|u| u != owner_uid && st.store.lookup_uid(u).is_some());
        if others_alive {
            drop_owner_ref(st, &gr, &k, owner_uid);
        } else if !terminating(&obj) {
            delete(st, &gr, &k);
        }
    }
}

fn drop_owner_ref(st: &mut State, gr: &GroupResource, k: &ObjKey, owner_uid: &str) {
    let Some(mut obj) = st.store.get(gr, k).cloned() else {
        return;
    };
    if let Some(refs) = obj.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) {
        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid));
        if refs.is_empty() {
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("ownerReferences");
            }
        }
    }
    st.store.replace(gr, k.clone(), obj);
}

fn delete(st: &mut State, gr: &GroupResource, k: &ObjKey) {
    let Some(def) = st.registry.any_version(gr) else {
        return;
    };
    let ns = if def.namespaced { Some(k.0.clone()) } else { None };
    let _ = api::delete(st, &def, ns.as_deref(), &k.1, &background());
}

/// Removes one finalizer; when it was the last one the object is deleted instead of updated,
/// as kube-apiserver does for an update that empties the finalizers of a deleting object.
fn remove_finalizer(st: &mut State, gr: &GroupResource, k: &ObjKey, f: &str) {
    let Some(mut obj) = st.store.get(gr, k).cloned() else { return };
    let mut empty = false;
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(a) = m.get_mut("finalizers").and_then(Value::as_array_mut) {
            a.retain(|x| x != f);
            empty = a.is_empty();
        }
        if empty {
            m.remove("finalizers");
        }
    }
    let ns_waiting =
        is_namespace(gr) && obj.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    if empty && !ns_waiting && terminating(&obj) {
        match st.registry.any_version(gr) {
            Some(def) => {
                api::finish_delete(st, &def, k);
            }
            None => {
                st.store.remove(gr, k);
            }
        }
    } else {
        st.store.replace(gr, k.clone(), obj);
    }
}

/// One step of work on a terminating object; true when nothing is left to do.
fn progress(st: &mut State, item: &Item) -> bool {
    let (gr, k) = item;
    let Some(obj) = st.store.get(gr, k).cloned() else {
        return true;
    };
    if !terminating(&obj) {
        return true;
    }
    let Some(u) = uid(&obj) else { return true };
    if has_finalizer(&obj, ORPHAN) {
        for (dgr, dk) in st.store.dependents_of(&u) {
            drop_owner_ref(st, &dgr, &dk, &u);
        }
        remove_finalizer(st, gr, k, ORPHAN);
        return false;
    }
    if has_finalizer(&obj, FOREGROUND) {
        // All dependents are deleted; the owner waits only for those that block it.
        let deps = st.store.dependents_of(&u);
        let blocking = deps.iter().any(|(dgr, dk)| st.store.get(dgr, dk).is_some_and(|d| blocks_owner(d, &u)));
        for (dgr, dk) in deps {
            if st.store.get(&dgr, &dk).is_some_and(|d| !terminating(d)) {
                delete(st, &dgr, &dk);
            }
        }
        if !blocking {
            remove_finalizer(st, gr, k, FOREGROUND);
        }
        return false;
    }
    if is_namespace(gr) {
        let mut left = 0;
        for rgr in st.store.resources() {
            let namespaced = st.registry.any_version(&rgr).is_some_and(|d| d.namespaced);
            if !namespaced {
                continue;
            }
            let keys: Vec<ObjKey> = st.store.list(&rgr, Some(&k.1)).map(|(k, _)| k.clone()).collect();
            left += keys.len();
            for dk in keys {
                if st.store.get(&rgr, &dk).is_some_and(|d| !terminating(d)) {
                    delete(st, &rgr, &dk);
                }
            }
        }
        if left == 0 {
            let mut done = obj.clone();
            done["spec"] = json!({});
            let has_meta_fins =
                done.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
            if has_meta_fins {
                st.store.replace(gr, k.clone(), done);
            } else if let Some(def) = st.registry.any_version(gr) {
                api::finish_delete(st, &def, k);
            }
            return true;
        }
        return false;
    }
    if is_crd(gr) && has_finalizer(&obj, CLEANUP_FINALIZER) {
        let group = obj.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
        let plural = obj.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default();
        let cr = GroupResource::new(group, plural);
        let keys: Vec<ObjKey> = st.store.list(&cr, None).map(|(k, _)| k.clone()).collect();
        if keys.is_empty() {
            remove_finalizer(st, gr, k, CLEANUP_FINALIZER);
            return true;
        }
        for dk in keys {
            if st.store.get(&cr, &dk).is_some_and(|d| !terminating(d)) {
                delete(st, &cr, &dk);
            }
        }
        return false;
    }
    true
}
