//! Conversion between the stored form of an object and the version a client asked for.
//!
//! Custom resources use the "None" conversion strategy (only apiVersion changes), as a CRD
//! without a conversion webhook does. events.k8s.io/v1 events are stored as core/v1 events
//! and renamed field by field, as kube-apiserver's internal Event type does.

use crate::registry::ResourceDef;
use serde_json::{Map, Value};

/// (core/v1 field, events.k8s.io/v1 field)
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn is_events_v1(def: &ResourceDef) -> bool {
    def.group == "events.k8s.io"
}

fn rename(obj: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(v) = obj.remove(from) {
        obj.insert(to.to_string(), v);
    }
}

/// Request body → stored form.
pub fn to_storage(def: &ResourceDef, mut obj: Value) -> Value {
    if is_events_v1(def) {
        if let Value::Object(m) = &mut obj {
            for (core, ev) in EVENT_FIELDS {
                rename(m, ev, core);
            }
            m.insert("apiVersion".into(), Value::String("v1".into()));
        }
    }
    obj
}

/// Stored form → the version `def` serves.
pub fn to_external(def: &ResourceDef, mut obj: Value) -> Value {
    if let Value::Object(m) = &mut obj {
        if is_events_v1(def) {
            for (core, ev) in EVENT_FIELDS {
                rename(m, core, ev);
            }
        }
        m.insert("apiVersion".into(), Value::String(def.api_version()));
        m.insert("kind".into(), Value::String(def.kind.clone()));
    }
    obj
}
