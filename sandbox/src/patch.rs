//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch
//! for the built-in kinds.

use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Errors from applying a JSON patch; the server turns them into 422s (decode errors are 400s).
#[derive(Debug)]
pub struct PatchError(pub String);

fn unescape(tok: &str) -> String {
    tok.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(path: &str) -> Result<Vec<String>, PatchError> {
    if path.is_empty() {
        return Ok(vec![]);
    }
    let rest = path.strip_prefix('/').ok_or_else(|| PatchError(format!("invalid JSON pointer {path:?}")))?;
    Ok(rest.split('/').map(unescape).collect())
}

fn parent<'a>(doc: &'a mut Value, toks: &[String], path: &str) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(move |i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| PatchError(format!("doc is missing path: {path:?}: missing value")))?;
    }
    Ok(cur)
}

fn array_index(tok: &str, len: usize, allow_end: bool, path: &str) -> Result<usize, PatchError> {
    if allow_end && tok == "-" {
        return Ok(len);
    }
    let i: usize = tok.parse().map_err(|_| PatchError(format!("invalid array index {tok:?} in {path:?}")))?;
    let max = if allow_end { len } else { len.saturating_sub(1) };
    if i > max || (!allow_end && len == 0) {
        return Err(PatchError(format!("unable to access invalid index: {i} in {path:?}")));
    }
    Ok(i)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let toks = split_pointer(path)?;
    let Some((last, init)) = toks.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent(doc, init, path)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            let i = array_index(last, a.len(), true, path)?;
            a.insert(i, value);
        }
        _ => return Err(PatchError(format!("doc is missing path: {path:?}"))),
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let toks = split_pointer(path)?;
    let Some((last, init)) = toks.split_last() else {
        return Err(PatchError("cannot remove the document root".into()));
    };
    match parent(doc, init, path)? {
        Value::Object(m) => {
            m.remove(last).ok_or_else(|| PatchError(format!("unable to remove nonexistent key: {last}: missing value")))
        }
        Value::Array(a) => {
            let i = array_index(last, a.len(), false, path)?;
            Ok(a.remove(i))
        }
        _ => Err(PatchError(format!("doc is missing path: {path:?}"))),
    }
}

fn parent_exists(doc: &Value, path: &str) -> bool {
    match path.rfind('/') {
        Some(i) => doc.pointer(&path[..i]).is_some_and(|p| p.is_object() || p.is_array()),
        None => false,
    }
}

fn get(doc: &Value, path: &str) -> Result<Value, PatchError> {
    doc.pointer(path).cloned().ok_or_else(|| PatchError(format!("doc is missing path: {path:?}: missing value")))
}

/// Applies an RFC 6902 patch. `ops` must already be a JSON array (checked by the caller).
pub fn json_patch(doc: &mut Value, ops: &[Value]) -> Result<(), PatchError> {
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).ok_or_else(|| PatchError("missing op".into()))?;
        let path = op.get("path").and_then(Value::as_str).ok_or_else(|| PatchError("missing path".into()))?;
        let value = || op.get("value").cloned().ok_or_else(|| PatchError(format!("missing value for {kind}")));
        let from =
            || op.get("from").and_then(Value::as_str).ok_or_else(|| PatchError(format!("missing from for {kind}")));
        match kind {
            "add" => add(doc, path, value()?)?,
            "remove" => {
                remove(doc, path)?;
            }
            "replace" => {
                remove(doc, path)?;
                add(doc, path, value()?)?;
            }
            "move" => {
                let from = from()?;
                if path.starts_with(&format!("{from}/")) {
                    return Err(PatchError("cannot move a value into one of its children".into()));
                }
                let v = remove(doc, from)?;
                add(doc, path, v)?;
            }
            "copy" => {
                let v = get(doc, from()?)?;
                add(doc, path, v)?;
            }
            "test" => {
                let want = value()?;
                // As in the json-patch library kube-apiserver uses, a missing member tests
                // equal to null (kube-runtime's finalizer helper relies on this).
                let got = match doc.pointer(path) {
                    Some(v) => v.clone(),
                    None if want.is_null() && parent_exists(doc, path) => Value::Null,
                    None => return Err(PatchError(format!("doc is missing path: {path:?}: missing value"))),
                };
                if got != want {
                    return Err(PatchError(format!("testing value {path} failed: test failed")));
                }
            }
            other => return Err(PatchError(format!("Unexpected kind: {other}"))),
        }
    }
    Ok(())
}

/// Merge keys of lists whose patchStrategy is "merge" in the built-in Go types.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "secrets"
        | "resourceClaims"
        | "schedulingGates" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        _ => return None,
    })
}

/// Primitive lists with patchStrategy "merge": union, not replace.
fn is_primitive_merge_list(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge patch as kubectl uses it against built-in kinds: maps merge, lists with a
/// merge key merge element-wise, other lists are replaced; `$patch`, `$retainKeys`,
/// `$deleteFromPrimitiveList` and `$setElementOrder` directives are understood.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut m = p.clone();
            m.remove("$patch");
            *target = Value::Object(m);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some(other) if other != "merge" => {
            return Err(PatchError(format!("Unknown patch type: {other} in map: {patch}")));
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (t.get_mut(field), v) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(inner) if inner.get("$patch").and_then(Value::as_str) == Some("delete") => {
                t.remove(k);
            }
            Value::Object(_) => strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v)?,
            Value::Array(items) => {
                let cur = t.entry(k.clone()).or_insert(Value::Array(vec![]));
                merge_list(k, cur, items)?;
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn merge_list(field: &str, cur: &mut Value, items: &[Value]) -> Result<(), PatchError> {
    if is_primitive_merge_list(field) {
        if !cur.is_array() {
            *cur = Value::Array(vec![]);
        }
        if let Value::Array(c) = cur {
            for it in items {
                if !c.contains(it) {
                    c.push(it.clone());
                }
            }
        }
        return Ok(());
    }
    let Some(key) = merge_key(field) else {
        *cur = Value::Array(items.to_vec());
        return Ok(());
    };
    if items.iter().any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace")) {
        *cur = Value::Array(items.iter().filter(|i| i.get("$patch").is_none()).cloned().collect());
        return Ok(());
    }
    if !cur.is_array() {
        *cur = Value::Array(vec![]);
    }
    let Value::Array(c) = cur else { return Ok(()) };
    for it in items {
        let Some(kv) = it.get(key) else {
            return Err(PatchError(format!("map: {it} does not contain declared merge key: {key}")));
        };
        let pos = c.iter().position(|e| e.get(key) == Some(kv));
        if it.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = pos {
                c.remove(i);
            }
            continue;
        }
        match pos {
            Some(i) => strategic_merge(&mut c[i], it)?,
            None => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, it)?;
                c.push(fresh);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut d = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut d, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(d, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn json_patch_ops() {
        let mut d = json!({"a": [1, 2], "b": {"c": 1}});
        let ops = json!([
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "remove", "path": "/a/0"},
            {"op": "test", "path": "/b/c", "value": 1},
            {"op": "move", "from": "/b/c", "path": "/d"},
        ]);
        json_patch(&mut d, ops.as_array().map(Vec::as_slice).unwrap_or(&[])).map_err(|e| e.0).ok();
        assert_eq!(d, json!({"a": [2, 3], "b": {}, "d": 1}));
        let bad = json!([{"op": "test", "path": "/d", "value": 2}]);
        assert!(json_patch(&mut d, bad.as_array().map(Vec::as_slice).unwrap_or(&[])).is_err());
        let absent_is_null = json!([{"op": "test", "path": "/b/missing", "value": null}]);
        assert!(json_patch(&mut d, absent_is_null.as_array().map(Vec::as_slice).unwrap_or(&[])).is_ok());
        let no_parent = json!([{"op": "test", "path": "/nope/missing", "value": null}]);
        assert!(json_patch(&mut d, no_parent.as_array().map(Vec::as_slice).unwrap_or(&[])).is_err());
    }

    #[test]
    fn strategic_merges_by_key() {
        let mut d = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
                           "metadata": {"finalizers": ["f1"]}});
        let p = json!({"spec": {"containers": [{"name": "b", "image": "z"}, {"name": "a", "$patch": "delete"}]},
                       "metadata": {"finalizers": ["f2"]}});
        strategic_merge(&mut d, &p).ok();
        assert_eq!(
            d,
            json!({"spec": {"containers": [{"name": "b", "image": "z"}]},
                             "metadata": {"finalizers": ["f1", "f2"]}})
        );
    }
}
