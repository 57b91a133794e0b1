//! get and list: paged lists read a consistent snapshot of the first page's revision.

use super::*;

fn get_def_object(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> ApiResult<Value> {
    st.store
        .get(&def.group_resource(), &key(def, ns, name))
        .cloned()
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
}

pub fn get(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> ApiResult<Value> {
    get_def_object(st, def, ns, name).map(|o| convert::to_external(def, o))
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// Continue tokens carry the revision of the first page and the last key returned.
fn encode_continue(rv: u64, last: &ObjKey) -> String {
    format!("{rv}.{}.{}", hex(&last.0), hex(&last.1))
}

fn decode_continue(tok: &str) -> Option<(u64, ObjKey)> {
    let mut it = tok.splitn(3, '.');
    let rv = it.next()?.parse().ok()?;
    Some((rv, (unhex(it.next()?)?, unhex(it.next()?)?)))
}

pub fn list(st: &State, def: &ResourceDef, ns: Option<&str>, q: &Query) -> ApiResult<(Vec<Value>, Value)> {
    let sel = selectors(def, q)?;
    let limit = match q.get("limit") {
        Some(l) => l.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?.max(0) as usize,
        None => 0,
    };
    let gr = def.group_resource();
    let ns = if def.namespaced { ns } else { None };
    let (rv, start): (u64, Option<ObjKey>) = match q.get("continue") {
        Some(tok) => {
            let (rv, last) = decode_continue(tok).ok_or_else(|| {
                ApiError::bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
                )
            })?;
            (rv, Some(last))
        }
        None => match (q.get("resourceVersion"), q.get("resourceVersionMatch")) {
            (Some(rv), Some("Exact")) => (parse_rv(rv)?, None),
            _ => (st.store.current_rv(), None),
        },
    };
    let snapshot = if rv == st.store.current_rv() {
        None
    } else {
        Some(st.store.snapshot_at(&gr, rv).map_err(|_| {
            if start.is_some() {
                ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
            } else {
                ApiError::gone(format!("too old resource version: {rv} ({})", st.store.current_rv()))
            }
        })?)
    };
    let iter: Box<dyn Iterator<Item = (&ObjKey, &Value)>> = match &snapshot {
        Some(m) => Box::new(m.iter().filter(move |((n, _), _)| ns.is_none_or(|ns| ns == n))),
        None => st.store.list(&gr, ns),
    };
    let mut items = Vec::new();
    let mut last: Option<ObjKey> = None;
    let mut more = 0usize;
    for (k, obj) in iter {
        if start.as_ref().is_some_and(|s| k <= s) || !sel.matches(obj) {
            continue;
        }
        if limit > 0 && items.len() >= limit {
            more += 1;
            continue;
        }
        items.push(convert::to_external(def, obj.clone()));
        last = Some(k.clone());
    }
    let mut list_meta = json!({"resourceVersion": rv.to_string()});
    if more > 0 {
        if let Some(l) = &last {
            list_meta["continue"] = json!(encode_continue(rv, l));
            if sel.is_empty() {
                list_meta["remainingItemCount"] = json!(more);
            }
        }
    }
    Ok((items, list_meta))
}

pub fn list_object(def: &ResourceDef, items: Vec<Value>, list_meta: Value) -> Value {
    // Typed built-in lists omit kind/apiVersion on items; unstructured (custom) lists keep them.
    let items: Vec<Value> = if def.is_custom() {
        items
    } else {
        items
            .into_iter()
            .map(|mut o| {
                if let Some(m) = o.as_object_mut() {
                    m.remove("kind");
                    m.remove("apiVersion");
                }
                o
            })
            .collect()
    };
    json!({"kind": def.list_kind, "apiVersion": def.api_version(), "metadata": list_meta, "items": items})
}
