//! Objects in memory, one global resourceVersion counter (etcd's revision), and a bounded
//! history of changes so watches can resume and paged lists can read a consistent snapshot.

use crate::registry::GroupResource;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::broadcast;

/// (namespace, name); namespace is "" for cluster-scoped objects. Ordered like etcd keys.
pub type ObjKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub gr: GroupResource,
    pub key: ObjKey,
    pub ty: EventType,
    /// The object after the change (for DELETED: the last state, carrying the delete's rv).
    pub object: Value,
    /// The object before the change; lets watches apply selectors to transitions and lets
    /// paged lists rewind to the revision of their first page.
    pub prev: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum HistoryError {
    /// The requested revision is older than the kept history.
    Compacted {
        requested: u64,
        oldest: u64,
    },
    TooLarge {
        requested: u64,
        current: u64,
    },
}

pub struct Store {
    rv: u64,
    objects: HashMap<GroupResource, BTreeMap<ObjKey, Value>>,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    /// Every event with rv <= compacted_rv has been dropped from history.
    compacted_rv: u64,
    tx: broadcast::Sender<Arc<StoredEvent>>,
    uids: HashMap<String, (GroupResource, ObjKey)>,
    /// owner uid → dependents naming it in ownerReferences.
    dependents: HashMap<String, BTreeSet<(GroupResource, ObjKey)>>,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let (tx, _) = broadcast::channel(16_384);
        Store {
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_rv: 1,
            tx,
            uids: HashMap::new(),
            dependents: HashMap::new(),
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.tx.subscribe()
    }

    pub fn get(&self, gr: &GroupResource, key: &ObjKey) -> Option<&Value> {
        self.objects.get(gr)?.get(key)
    }

    pub fn list<'a>(
        &'a self,
        gr: &GroupResource,
        ns: Option<&'a str>,
    ) -> Box<dyn Iterator<Item = (&'a ObjKey, &'a Value)> + 'a> {
        let Some(m) = self.objects.get(gr) else {
            return Box::new(std::iter::empty());
        };
        match ns {
            Some(ns) => {
                let start = (ns.to_string(), String::new());
                Box::new(m.range(start..).take_while(move |((n, _), _)| n == ns))
            }
            None => Box::new(m.iter()),
        }
    }

    pub fn lookup_uid(&self, uid: &str) -> Option<&(GroupResource, ObjKey)> {
        self.uids.get(uid)
    }

    pub fn dependents_of(&self, uid: &str) -> Vec<(GroupResource, ObjKey)> {
        self.dependents.get(uid).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    pub fn resources(&self) -> Vec<GroupResource> {
        self.objects.keys().cloned().collect()
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn set_rv(obj: &mut Value, rv: u64) {
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
    }

    fn owner_uids(obj: &Value) -> Vec<String> {
        obj.pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .map(|refs| refs.iter().filter_map(|r| r.get("uid")?.as_str().map(String::from)).collect())
            .unwrap_or_default()
    }

    fn uid_of(obj: &Value) -> Option<String> {
        obj.pointer("/metadata/uid").and_then(Value::as_str).map(String::from)
    }

    fn index(&mut self, gr: &GroupResource, key: &ObjKey, old: Option<&Value>, new: Option<&Value>) {
        let entry = (gr.clone(), key.clone());
        if let Some(o) = old {
            for u in Self::owner_uids(o) {
                if let Some(s) = self.dependents.get_mut(&u) {
                    s.remove(&entry);
                    if s.is_empty() {
                        self.dependents.remove(&u);
                    }
                }
            }
            if new.is_none() {
                if let Some(u) = Self::uid_of(o) {
                    self.uids.remove(&u);
                }
            }
        }
        if let Some(n) = new {
            for u in Self::owner_uids(n) {
                self.dependents.entry(u).or_default().insert(entry.clone());
            }
            if let Some(u) = Self::uid_of(n) {
                self.uids.insert(u, entry);
            }
        }
    }

    fn record(&mut self, ev: StoredEvent) {
        let ev = Arc::new(ev);
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(ev);
    }

    /// Stores a new object; the caller has checked it does not exist.
    pub fn insert(&mut self, gr: &GroupResource, key: ObjKey, mut obj: Value) -> Value {
        let rv = self.next_rv();
        Self::set_rv(&mut obj, rv);
        self.index(gr, &key, None, Some(&obj));
        self.objects.entry(gr.clone()).or_default().insert(key.clone(), obj.clone());
        self.record(StoredEvent { rv, gr: gr.clone(), key, ty: EventType::Added, object: obj.clone(), prev: None });
        obj
    }

    /// Replaces an existing object. Returns None if it does not exist.
    pub fn replace(&mut self, gr: &GroupResource, key: ObjKey, mut obj: Value) -> Option<Value> {
        let prev = self.objects.get(gr)?.get(&key)?.clone();
        let rv = self.next_rv();
        Self::set_rv(&mut obj, rv);
        self.index(gr, &key, Some(&prev), Some(&obj));
        self.objects.entry(gr.clone()).or_default().insert(key.clone(), obj.clone());
        self.record(StoredEvent {
            rv,
            gr: gr.clone(),
            key,
            ty: EventType::Modified,
            object: obj.clone(),
            prev: Some(prev),
        });
        Some(obj)
    }

    pub fn remove(&mut self, gr: &GroupResource, key: &ObjKey) -> Option<Value> {
        let prev = self.objects.get_mut(gr)?.remove(key)?;
        let rv = self.next_rv();
        let mut obj = prev.clone();
        Self::set_rv(&mut obj, rv);
        self.index(gr, key, Some(&prev), None);
        self.record(StoredEvent {
            rv,
            gr: gr.clone(),
            key: key.clone(),
            ty: EventType::Deleted,
            object: obj.clone(),
            prev: Some(prev),
        });
        Some(obj)
    }

    pub fn check_revision(&self, rv: u64) -> Result<(), HistoryError> {
        if rv < self.compacted_rv {
            return Err(HistoryError::Compacted { requested: rv, oldest: self.compacted_rv });
        }
        if rv > self.rv {
            return Err(HistoryError::TooLarge { requested: rv, current: self.rv });
        }
        Ok(())
    }

    /// All events of `gr` after `rv`, oldest first.
    pub fn events_since(&self, gr: &GroupResource, rv: u64) -> Result<Vec<Arc<StoredEvent>>, HistoryError> {
        self.check_revision(rv)?;
        let start = self.history.partition_point(|e| e.rv <= rv);
        Ok(self.history.range(start..).filter(|e| e.gr == *gr).cloned().collect())
    }

    /// The objects of `gr` as they were at revision `rv` (a paged list's snapshot).
    pub fn snapshot_at(&self, gr: &GroupResource, rv: u64) -> Result<BTreeMap<ObjKey, Value>, HistoryError> {
        self.check_revision(rv)?;
        let mut m = self.objects.get(gr).cloned().unwrap_or_default();
        for ev in self.history.iter().rev().take_while(|e| e.rv > rv) {
            if ev.gr != *gr {
                continue;
            }
            match &ev.prev {
                Some(p) => {
                    m.insert(ev.key.clone(), p.clone());
                }
                None => {
                    m.remove(&ev.key);
                }
            }
        }
        Ok(m)
    }
}
