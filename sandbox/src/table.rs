//! The `meta.k8s.io/v1 Table` rendering kubectl asks for with `Accept: ...;as=Table`:
//! printer columns of CRDs and the columns kube-apiserver's printers give built-in kinds.

use crate::meta::{age_of, human_duration, parse_rfc3339, unix_now};
use crate::registry::{PrinterColumn, ResourceDef};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    pub include: IncludeObject,
}

impl TableOptions {
    pub fn from_query(q: &crate::query::Query) -> Self {
        let include = match q.get("includeObject") {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        };
        TableOptions { include }
    }
}

/// Does the Accept header ask for a Table (and does the server then answer with one)?
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.";

fn col(name: &str, ty: &str, format: &str, desc: &str, priority: i64) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": desc, "priority": priority})
}

fn name_col() -> Value {
    col("Name", "string", "name", NAME_DESC, 0)
}

fn age_col() -> Value {
    col("Age", "string", "", AGE_DESC, 0)
}

fn s(o: &Value, ptr: &str) -> Value {
    o.pointer(ptr).cloned().unwrap_or(Value::Null)
}

fn count(o: &Value, ptrs: &[&str]) -> usize {
    ptrs.iter().map(|p| o.pointer(p).and_then(Value::as_object).map_or(0, |m| m.len())).sum()
}

fn name_of(o: &Value) -> Value {
    s(o, "/metadata/name")
}

type Cells = fn(&Value) -> Vec<Value>;

fn builtin_columns(def: &ResourceDef) -> (Vec<Value>, Cells) {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "namespaces") => (
            vec![name_col(), col("Status", "string", "", "The status of the namespace", 0), age_col()],
            |o| vec![name_of(o), s(o, "/status/phase"), json!(age_of(o))],
        ),
        ("", "pods") => (
            vec![
                name_col(),
                col("Ready", "string", "", "The aggregate readiness state of this pod for accepting traffic.", 0),
                col("Status", "string", "", "The aggregate status of the containers in this pod.", 0),
                col("Restarts", "string", "", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.", 0),
                age_col(),
                col("IP", "string", "", "IP address allocated to the pod. Routable at least within the cluster.", 1),
                col("Node", "string", "", "NodeName is a request to schedule this pod onto a specific node.", 1),
            ],
            |o| {
                let total = o.pointer("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
                let statuses = o.pointer("/status/containerStatuses").and_then(Value::as_array);
                let ready = statuses.map_or(0, |a| a.iter().filter(|c| c.get("ready") == Some(&json!(true))).count());
                let restarts: i64 = statuses.map_or(0, |a| a.iter().filter_map(|c| c.get("restartCount").and_then(Value::as_i64)).sum());
                let mut status = s(o, "/status/reason");
                if status.is_null() {
                    status = s(o, "/status/phase");
                }
                if o.pointer("/metadata/deletionTimestamp").is_some() {
                    status = json!("Terminating");
                }
                let node = o.pointer("/spec/nodeName").cloned().unwrap_or(json!("<none>"));
                let ip = o.pointer("/status/podIP").cloned().unwrap_or(json!("<none>"));
                vec![name_of(o), json!(format!("{ready}/{total}")), status, json!(restarts.to_string()), json!(age_of(o)), ip, node]
            },
        ),
        ("", "configmaps") => (
            vec![name_col(), col("Data", "string", "", "Data contains the configuration data.", 0), age_col()],
            |o| vec![name_of(o), json!(count(o, &["/data", "/binaryData"])), json!(age_of(o))],
        ),
        ("", "secrets") => (
            vec![name_col(), col("Type", "string", "", "Used to facilitate programmatic handling of secret data.", 0), col("Data", "string", "", "Data contains the secret data.", 0), age_col()],
            |o| vec![name_of(o), s(o, "/type"), json!(count(o, &["/data"])), json!(age_of(o))],
        ),
        ("", "serviceaccounts") => (
            vec![name_col(), col("Secrets", "string", "", "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.", 0), age_col()],
            |o| vec![name_of(o), json!(o.get("secrets").and_then(Value::as_array).map_or(0, Vec::len)), json!(age_of(o))],
        ),
        ("", "events") | ("events.k8s.io", "events") => (
            vec![
                col("Last Seen", "string", "", "Time when last event was observed", 0),
                col("Type", "string", "", "Type of this event (Normal, Warning), new types could be added in the future.", 0),
                col("Reason", "string", "", "Reason why the action was taken. It is human-readable.", 0),
                col("Object", "string", "", "The object that this event is about.", 0),
                col("Message", "string", "", "A human-readable description of the status of this operation.", 0),
            ],
            |o| {
                let at = ["/lastTimestamp", "/deprecatedLastTimestamp", "/eventTime", "/metadata/creationTimestamp"]
                    .iter()
                    .find_map(|p| o.pointer(p).and_then(Value::as_str).and_then(parse_rfc3339));
                let seen = at.map_or_else(|| "<unknown>".to_string(), |t| human_duration(unix_now() - t));
                let reg = o.get("involvedObject").or_else(|| o.get("regarding")).cloned().unwrap_or(Value::Null);
                let kind = reg.get("kind").and_then(Value::as_str).unwrap_or_default().to_lowercase();
                let name = reg.get("name").and_then(Value::as_str).unwrap_or_default();
                let msg = o.get("message").or_else(|| o.get("note")).cloned().unwrap_or(Value::Null);
                vec![json!(seen), s(o, "/type"), s(o, "/reason"), json!(format!("{kind}/{name}")), msg]
            },
        ),
        ("coordination.k8s.io", "leases") => (
            vec![name_col(), col("Holder", "string", "", "HolderIdentity contains the identity of the holder of a current lease.", 0), age_col()],
            |o| vec![name_of(o), s(o, "/spec/holderIdentity"), json!(age_of(o))],
        ),
        ("apiextensions.k8s.io", _) => (
            vec![name_col(), col("Created At", "date", "", AGE_DESC, 0)],
            |o| vec![name_of(o), s(o, "/metadata/creationTimestamp")],
        ),
        _ => (vec![name_col(), age_col()], |o| vec![name_of(o), json!(age_of(o))]),
    }
}

/// Evaluates the simple JSONPath subset printer columns use:
/// `.a.b`, `.a[0].b`, `.a[?(@.type=="Ready")].status`.
pub fn jsonpath(obj: &Value, path: &str) -> Option<Value> {
    let p = path.trim().trim_start_matches('{').trim_end_matches('}').trim();
    let p = p.strip_prefix('$').unwrap_or(p);
    let mut cur = obj.clone();
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            cur = cur.get(field)?.clone();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, v) = filter.split_once("==")?;
                let want = v.trim().trim_matches(|c| c == '"' || c == '\'');
                let arr = cur.as_array()?;
                cur = arr
                    .iter()
                    .find(|e| match e.get(k.trim()) {
                        Some(Value::String(s)) => s == want,
                        Some(other) => {
                            let shown = other.to_string();
                            shown == want
                        }
                        None => false,
                    })?
                    .clone();
            } else {
                let i: usize = inner.trim().parse().ok()?;
                cur = cur.get(i)?.clone();
            }
        } else {
            return None;
        }
    }
    Some(cur)
}

fn custom_cell(c: &PrinterColumn, obj: &Value) -> Value {
    let Some(v) = jsonpath(obj, &c.json_path) else {
        return Value::Null;
    };
    match c.type_.as_str() {
        "date" => match v.as_str().and_then(parse_rfc3339) {
            Some(t) => json!(human_duration(unix_now() - t)),
            None => json!("<invalid>"),
        },
        "integer" => match v.as_f64() {
            Some(f) => json!(f as i64),
            None => v,
        },
        "string" => match v {
            Value::String(s) => json!(s),
            Value::Null => Value::Null,
            other => json!(other.to_string()),
        },
        _ => v,
    }
}

/// Renders external-form objects as a Table.
pub fn table(def: &ResourceDef, objects: &[Value], opts: &TableOptions, list_meta: Option<Value>) -> Value {
    type RowCells = Box<dyn Fn(&Value) -> Vec<Value>>;
    let (columns, cells): (Vec<Value>, RowCells) = if def.is_custom() {
        let mut cols = vec![name_col()];
        cols.extend(def.printer_columns.iter().map(|c| col(&c.name, &c.type_, &c.format, &c.description, c.priority)));
        let pcs = def.printer_columns.clone();
        (
            cols,
            Box::new(move |o: &Value| {
                let mut row = vec![name_of(o)];
                row.extend(pcs.iter().map(|c| custom_cell(c, o)));
                row
            }),
        )
    } else {
        let (cols, f) = builtin_columns(def);
        (cols, Box::new(f))
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(o)});
            match opts.include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata").cloned().unwrap_or(json!({}))});
                }
                IncludeObject::Object => row["object"] = o.clone(),
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.unwrap_or_else(|| json!({})),
        "columnDefinitions": columns,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_subset() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"l": [1, 2]}});
        assert_eq!(jsonpath(&o, ".status.conditions[?(@.type==\"Ready\")].status"), Some(json!("True")));
        assert_eq!(jsonpath(&o, ".spec.l[1]"), Some(json!(2)));
        assert_eq!(jsonpath(&o, ".spec.missing"), None);
    }
}
