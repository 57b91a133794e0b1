//! The verbs: get, list, create, update, patch, delete, deletecollection — the semantics of
//! kube-apiserver's generic registry (k8s.io/apiserver/pkg/registry/generic/registry).

use crate::convert;
use crate::crd;
use crate::error::{qualified, ApiError, ApiResult, FieldError};
use crate::lifecycle;
use crate::meta;
use crate::patch::{self, PatchType};
use crate::query::Query;
use crate::registry::{GroupResource, ResourceDef};
use crate::schema;
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::state::State;
use crate::store::ObjKey;
use serde_json::{json, Map, Value};
use std::sync::Arc;

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// A successful write: status code, response object, and `Warning` headers.
pub struct Written {
    pub code: u16,
    pub object: Value,
    pub warnings: Vec<String>,
}

fn key(def: &ResourceDef, ns: Option<&str>, name: &str) -> ObjKey {
    let ns = if def.namespaced { ns.unwrap_or_default() } else { "" };
    (ns.to_string(), name.to_string())
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str().filter(|s| !s.is_empty())
}

fn meta_mut(obj: &mut Value) -> ApiResult<&mut Map<String, Value>> {
    let m = obj.as_object_mut().ok_or_else(|| ApiError::bad_request("the object provided is not a JSON object"))?;
    let meta = m.entry("metadata").or_insert_with(|| json!({}));
    if meta.is_null() {
        *meta = json!({});
    }
    meta.as_object_mut().ok_or_else(|| {
        ApiError::bad_request("json: cannot unmarshal metadata into Go struct field of type v1.ObjectMeta")
    })
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|f| f.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn set_finalizers(obj: &mut Value, fins: &[String]) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if fins.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".into(), json!(fins));
        }
    }
}

fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null())
}

pub fn get_def_object(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> ApiResult<Value> {
    st.store
        .get(&def.group_resource(), &key(def, ns, name))
        .cloned()
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
}

pub fn get(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> ApiResult<Value> {
    get_def_object(st, def, ns, name).map(|o| convert::to_external(def, o))
}

pub fn selectors(def: &ResourceDef, q: &Query) -> ApiResult<Selectors> {
    Ok(Selectors {
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), def)?,
    })
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if s.len() % 2 != 0 {
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

pub fn parse_rv(raw: &str) -> ApiResult<u64> {
    raw.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {raw}")))
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

fn check_type_meta(def: &ResourceDef, obj: &mut Value, name_hint: &str) -> ApiResult<()> {
    let Some(m) = obj.as_object_mut() else {
        return Err(ApiError::bad_request("the object provided is unrecognized (must be a JSON object)"));
    };
    let kind = m.get("kind").and_then(Value::as_str).filter(|s| !s.is_empty()).map(String::from);
    let av = m.get("apiVersion").and_then(Value::as_str).filter(|s| !s.is_empty()).map(String::from);
    if let Some(av) = &av {
        if *av != def.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                def.api_version()
            )));
        }
    }
    match kind {
        None if def.is_custom() => {
            let raw = serde_json::to_string(obj).unwrap_or_default();
            return Err(ApiError::bad_request(format!("Object 'Kind' is missing in '{raw}'")));
        }
        Some(k) if k != def.kind => {
            if def.is_custom() {
                let e = FieldError::invalid("kind", &json!(k), &format!("must be {}", def.kind));
                return Err(ApiError::invalid(&def.group, &k, name_hint, vec![e]));
            }
            // kube-apiserver's decoder fails to convert the body into the endpoint's type.
            return Err(ApiError::bad_request(format!(
                "{k} in version \"{v}\" cannot be handled as a {kind}: converting ({v}.{k}) to ({g}.{kind}): unknown conversion",
                v = def.version,
                kind = def.kind,
                g = if def.group.is_empty() { "core" } else { def.group.as_str() },
            )));
        }
        _ => {}
    }
    m.insert("kind".into(), json!(def.kind));
    m.insert("apiVersion".into(), json!(def.api_version()));
    Ok(())
}

fn validate_meta(def: &ResourceDef, obj: &Value, creating: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
    if creating {
        if let Some(n) = meta_str(obj, "name") {
            errs.extend(meta::validate_name(def.name_rule, n, "metadata.name"));
        }
    }
    if let Some(l) = meta.get("labels") {
        errs.extend(meta::validate_labels(l, "metadata.labels"));
    }
    if let Some(a) = meta.get("annotations") {
        errs.extend(meta::validate_annotations(a, "metadata.annotations"));
    }
    if let Some(f) = meta.get("finalizers") {
        match f.as_array() {
            Some(list) => {
                for (i, x) in list.iter().enumerate() {
                    let ok = x.as_str().is_some_and(|s| {
                        let (p, n) = s.split_once('/').unwrap_or(("", s));
                        !n.is_empty() && n.len() <= 63 && (p.is_empty() || meta::is_dns1123_subdomain(p))
                    });
                    if !ok {
                        errs.push(FieldError::invalid(
                            format!("metadata.finalizers[{i}]"),
                            x,
                            "name part must consist of alphanumeric characters, '-', '_' or '.'",
                        ));
                    }
                }
            }
            None if !f.is_null() => {
                errs.push(FieldError::invalid("metadata.finalizers", f, "must be a list of strings"))
            }
            None => {}
        }
    }
    if let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut controllers = 0;
        for (i, r) in refs.iter().enumerate() {
            for f in ["apiVersion", "kind", "name", "uid"] {
                if r.get(f).and_then(Value::as_str).is_none_or(str::is_empty) {
                    errs.push(FieldError::invalid(
                        format!("metadata.ownerReferences[{i}].{f}"),
                        r.get(f).unwrap_or(&Value::Null),
                        &format!("{f} must not be empty"),
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errs.push(FieldError::invalid(
                "metadata.ownerReferences",
                &json!(refs),
                "Only one reference can have Controller set to true",
            ));
        }
    }
    errs
}

/// Defaulting, pruning and schema validation of a custom resource. Returns unknown fields.
fn apply_schema(def: &ResourceDef, obj: &mut Value, old: Option<&Value>, errs: &mut Vec<FieldError>) -> Vec<String> {
    let Some(sch) = &def.schema else {
        return Vec::new();
    };
    schema::apply_defaults(sch, obj);
    let mut unknown = Vec::new();
    schema::prune(sch, obj, "", true, &mut unknown);
    let before = errs.len();
    schema::validate(sch, obj, "", errs);
    // CEL rules assume well-typed values, so they only run once the schema is satisfied.
    if errs.len() == before {
        crate::cel::validate(sch, obj, old, "", errs);
    }
    unknown
}

/// fieldValidation=Strict|Warn|Ignore for fields the schema dropped.
fn field_validation(def: &ResourceDef, unknown: &[String], q: &Query) -> ApiResult<Vec<String>> {
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let msgs: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
    match q.get("fieldValidation") {
        Some("Strict") => Err(ApiError::bad_request(format!(
            "{kind} in version \"{v}\" cannot be handled as a {kind}: strict decoding error: {}",
            msgs.join(", "),
            kind = def.kind,
            v = def.version
        ))),
        Some("Ignore") => Ok(Vec::new()),
        _ => Ok(msgs),
    }
}

fn namespace_check(st: &State, def: &ResourceDef, ns: &str, name: &str) -> ApiResult<()> {
    if !def.namespaced {
        return Ok(());
    }
    let nsdef = GroupResource::new("", "namespaces");
    match st.store.get(&nsdef, &(String::new(), ns.to_string())) {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(n) if is_terminating(n) => {
            let mut e = ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                qualified(&def.group, &def.plural)
            ));
            e.details = Some(json!({"name": name, "group": def.group, "kind": def.plural,
                "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}));
            Err(e)
        }
        Some(_) => Ok(()),
    }
}

fn crd_terminating(st: &State, def: &ResourceDef) -> bool {
    let Some(name) = &def.crd else { return false };
    let gr = GroupResource::new("apiextensions.k8s.io", "customresourcedefinitions");
    st.store.get(&gr, &(String::new(), name.clone())).is_some_and(is_terminating)
}

pub fn create(st: &mut State, def: &Arc<ResourceDef>, ns: Option<&str>, body: Value, q: &Query) -> ApiResult<Written> {
    let mut obj = body;
    let hint = meta_str(&obj, "name").unwrap_or_default().to_string();
    check_type_meta(def, &mut obj, &hint)?;
    let mut obj = convert::to_storage(def, obj);
    let meta = meta_mut(&mut obj)?;
    if meta.get("resourceVersion").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::internal("resourceVersion should not be set on objects to be created"));
    }
    let req_ns = if def.namespaced { ns.unwrap_or_default().to_string() } else { String::new() };
    match meta.get("namespace").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        Some(n) if def.namespaced && n != req_ns => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ => {}
    }
    if def.namespaced {
        meta.insert("namespace".into(), json!(req_ns));
    } else {
        meta.remove("namespace");
    }
    let name = match meta.get("name").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        Some(n) => n.to_string(),
        None => match meta.get("generateName").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            Some(g) => {
                let prefix: String = g.chars().take(58).collect();
                format!("{prefix}{}", meta::generated_suffix())
            }
            None => {
                return Err(ApiError::invalid(
                    &def.group,
                    &def.kind,
                    "",
                    vec![FieldError::required("metadata.name", "name or generateName is required")],
                ))
            }
        },
    };
    meta.insert("name".into(), json!(name));
    meta.insert("uid".into(), json!(meta::new_uid()));
    meta.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    meta.remove("selfLink");
    meta.remove("managedFields");
    if def.generation {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    if def.is_custom() && crd_terminating(st, def) {
        return Err(ApiError::method_not_allowed("create not allowed while custom resource definition is terminating"));
    }
    namespace_check(st, def, &req_ns, &name)?;
    if def.status_subresource && def.is_custom() {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    if def.group == "apiextensions.k8s.io" {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
        if let Ok(meta) = meta_mut(&mut obj) {
            let fins = meta.entry("finalizers").or_insert_with(|| json!([]));
            if let Some(a) = fins.as_array_mut() {
                if !a.iter().any(|f| f == crd::CLEANUP_FINALIZER) {
                    a.push(json!(crd::CLEANUP_FINALIZER));
                }
            }
        }
    }
    lifecycle::prepare_create(def, &mut obj);
    let mut errs = validate_meta(def, &obj, true);
    let unknown = apply_schema(def, &mut obj, None, &mut errs);
    errs.extend(lifecycle::validate(def, &obj));
    if def.group == "apiextensions.k8s.io" {
        errs.extend(crd::validate(&obj));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(&def.group, &def.kind, &name, errs));
    }
    let warnings = field_validation(def, &unknown, q)?;
    let k = key(def, Some(&req_ns), &name);
    let gr = def.group_resource();
    if st.store.get(&gr, &k).is_some() {
        return Err(ApiError::already_exists(&def.group, &def.plural, &name));
    }
    if q.dry_run() {
        return Ok(Written { code: 201, object: convert::to_external(def, obj), warnings });
    }
    let stored = st.store.insert(&gr, k.clone(), obj);
    if def.group == "apiextensions.k8s.io" {
        crd_changed(st, &stored);
        // The establishing controller's write follows the create, as in kube-apiserver.
        let mut est = stored.clone();
        est["status"] = crd::established_status(&stored);
        st.store.replace(&gr, k, est);
    }
    Ok(Written { code: 201, object: convert::to_external(def, stored), warnings })
}

/// Re-registers the resources a CRD serves after any write to it.
fn crd_changed(st: &mut State, crd_obj: &Value) {
    let Some(name) = meta_str(crd_obj, "name").map(String::from) else {
        return;
    };
    st.registry.remove_crd(&name);
    for (def, storage) in crd::resource_defs(crd_obj) {
        st.registry.add(def, storage);
    }
}

/// The parts of an object that count as "spec" for metadata.generation.
fn generation_view(def: &ResourceDef, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        if def.status_subresource {
            m.remove("status");
        }
    }
    v
}

/// Shared tail of update and patch: `new` is the full desired object.
#[allow(clippy::too_many_arguments)]
fn apply_update(
    st: &mut State,
    def: &Arc<ResourceDef>,
    k: ObjKey,
    current: Value,
    mut new: Value,
    status_only: bool,
    require_rv: bool,
    q: &Query,
) -> ApiResult<Written> {
    let name = k.1.clone();
    check_type_meta(def, &mut new, &name)?;
    let mut new = convert::to_storage(def, new);
    let body_name = meta_str(&new, "name").map(String::from);
    if body_name.as_deref() != Some(name.as_str()) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            body_name.unwrap_or_default()
        )));
    }
    if def.namespaced {
        if let Some(n) = meta_str(&new, "namespace") {
            if n != k.0 {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the object ({n}) does not match the namespace on the request ({})",
                    k.0
                )));
            }
        }
    }
    let cur_rv = meta_str(&current, "resourceVersion").unwrap_or_default().to_string();
    match meta_str(&new, "resourceVersion") {
        Some(rv) if rv != cur_rv => {
            return Err(ApiError::stale(&def.group, &def.plural, &name));
        }
        Some(_) => {}
        None if require_rv && !def.unconditional_update => {
            return Err(ApiError::invalid(
                &def.group,
                &def.kind,
                &name,
                vec![FieldError::invalid("metadata.resourceVersion", &json!("0x0"), "must be specified for an update")],
            ));
        }
        None => {}
    }
    if let Some(uid) = meta_str(&new, "uid") {
        if Some(uid) != meta_str(&current, "uid") {
            return Err(ApiError::invalid(
                &def.group,
                &def.kind,
                &name,
                vec![FieldError::invalid("metadata.uid", &json!(uid), "field is immutable")],
            ));
        }
    }
    if status_only {
        // The /status subresource takes nothing but status from the request.
        let status = new.get("status").cloned();
        new = current.clone();
        if let Some(m) = new.as_object_mut() {
            match status {
                Some(s) => {
                    m.insert("status".into(), s);
                }
                None => {
                    m.remove("status");
                }
            }
        }
    } else {
        let meta = meta_mut(&mut new)?;
        for f in
            ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace", "generation"]
        {
            match current.get("metadata").and_then(|m| m.get(f)) {
                Some(v) => {
                    meta.insert(f.into(), v.clone());
                }
                None => {
                    meta.remove(f);
                }
            }
        }
        meta.remove("selfLink");
        meta.remove("managedFields");
        if def.status_subresource {
            if let Some(m) = new.as_object_mut() {
                match current.get("status") {
                    Some(s) => {
                        m.insert("status".into(), s.clone());
                    }
                    None => {
                        m.remove("status");
                    }
                }
            }
        }
    }
    if let Ok(meta) = meta_mut(&mut new) {
        meta.insert("resourceVersion".into(), json!(cur_rv));
    }
    let mut errs = validate_meta(def, &new, false);
    if is_terminating(&current) {
        let old_f = finalizers(&current);
        if finalizers(&new).iter().any(|f| !old_f.contains(f)) {
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                "no new finalizers can be added if the object is being deleted",
            ));
        }
    }
    let unknown = apply_schema(def, &mut new, Some(&current), &mut errs);
    errs.extend(lifecycle::validate(def, &new));
    errs.extend(lifecycle::validate_update(def, &current, &new));
    if def.group == "apiextensions.k8s.io" {
        errs.extend(crd::validate(&new));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(&def.group, &def.kind, &name, errs));
    }
    let warnings = field_validation(def, &unknown, q)?;
    if def.generation && generation_view(def, &current) != generation_view(def, &new) {
        let g = current.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
        if let Ok(meta) = meta_mut(&mut new) {
            meta.insert("generation".into(), json!(g + 1));
        }
    }
    if new == current {
        // A no-op write is not persisted: no new resourceVersion, no watch event.
        return Ok(Written { code: 200, object: convert::to_external(def, current), warnings });
    }
    if q.dry_run() {
        return Ok(Written { code: 200, object: convert::to_external(def, new), warnings });
    }
    if is_terminating(&current) && finalizers(&new).is_empty() && !namespace_pending(def, &new) {
        // As kube-apiserver: an update that empties the finalizers of an object being deleted
        // is not written; the object is deleted instead (one DELETED event, no MODIFIED).
        let gone = finish_delete(st, def, &k).ok_or_else(|| ApiError::not_found(&def.group, &def.plural, &name))?;
        return Ok(Written { code: 200, object: convert::to_external(def, gone), warnings });
    }
    let gr = def.group_resource();
    let stored =
        st.store.replace(&gr, k.clone(), new).ok_or_else(|| ApiError::not_found(&def.group, &def.plural, &name))?;
    if def.group == "apiextensions.k8s.io" {
        crd_changed(st, &stored);
    }
    Ok(Written { code: 200, object: convert::to_external(def, stored), warnings })
}

/// Namespaces wait for spec.finalizers ("kubernetes") as well as metadata.finalizers.
fn namespace_pending(def: &ResourceDef, obj: &Value) -> bool {
    def.group.is_empty()
        && def.plural == "namespaces"
        && obj.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

pub fn update(
    st: &mut State,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    body: Value,
    status_only: bool,
    q: &Query,
) -> ApiResult<Written> {
    let k = key(def, ns, name);
    if !body.is_object() {
        return Err(ApiError::bad_request("the object provided is unrecognized (must be a JSON object)"));
    }
    match st.store.get(&def.group_resource(), &k).cloned() {
        Some(current) => apply_update(st, def, k, current, body, status_only, true, q),
        None if def.create_on_update && !status_only => {
            let body_name = meta_str(&body, "name").map(String::from);
            if body_name.as_deref() != Some(name) {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    body_name.unwrap_or_default()
                )));
            }
            let mut body = body;
            if let Ok(m) = meta_mut(&mut body) {
                m.remove("resourceVersion");
            }
            create(st, def, ns, body, q)
        }
        None => Err(ApiError::not_found(&def.group, &def.plural, name)),
    }
}

#[allow(clippy::too_many_arguments)] // mirrors the request: target, patch type, body, subresource, options
pub fn patch(
    st: &mut State,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    ptype: PatchType,
    body: &[u8],
    status_only: bool,
    q: &Query,
) -> ApiResult<Written> {
    let accepted = if def.is_custom() {
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    } else {
        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
    };
    match ptype {
        PatchType::Apply => {
            return Err(ApiError::unsupported_media_type(format!(
                "server-side apply (application/apply-patch+yaml) is not implemented by kube-sandbox; use a JSON merge patch, JSON patch or update instead - accepted media types here: {}",
                "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (built-in kinds)"
            )))
        }
        PatchType::Strategic if def.is_custom() => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted}"
            )))
        }
        _ => {}
    }
    let patch_doc: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let k = key(def, ns, name);
    let current = st
        .store
        .get(&def.group_resource(), &k)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    let mut doc = convert::to_external(def, current.clone());
    match ptype {
        PatchType::Json => {
            let ops = patch_doc.as_array().ok_or_else(|| {
                ApiError::bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
            })?;
            patch::json_patch(&mut doc, ops).map_err(|e| ApiError::unprocessable(e.0))?;
        }
        PatchType::Merge => {
            if !patch_doc.is_object() {
                return Err(ApiError::bad_request(
                    "json: cannot unmarshal into a JSON object: merge patch must be an object",
                ));
            }
            patch::merge_patch(&mut doc, &patch_doc);
        }
        PatchType::Strategic => {
            if !patch_doc.is_object() {
                return Err(ApiError::bad_request("strategic merge patch must be a JSON object"));
            }
            patch::strategic_merge(&mut doc, &patch_doc).map_err(|e| ApiError::unprocessable(e.0))?;
        }
        PatchType::Apply => {}
    }
    apply_update(st, def, k, current, doc, status_only, false, q)
}

/// DeleteOptions from the body and/or query.
pub struct DeleteOptions {
    pub propagation: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    pub fn parse(body: &[u8], q: &Query) -> ApiResult<Self> {
        let b: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("couldn't decode DeleteOptions: {e}")))?
        };
        if !b.is_object() {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        }
        let mut propagation = b
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .map(String::from)
            .or_else(|| q.get("propagationPolicy").map(String::from));
        if propagation.is_none() {
            match b
                .get("orphanDependents")
                .and_then(Value::as_bool)
                .or_else(|| q.get("orphanDependents").map(|v| v == "true"))
            {
                Some(true) => propagation = Some("Orphan".into()),
                Some(false) => propagation = Some("Background".into()),
                None => {}
            }
        }
        if let Some(p) = &propagation {
            if !matches!(p.as_str(), "Orphan" | "Background" | "Foreground") {
                return Err(ApiError::unprocessable(format!(
                    "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                )));
            }
        }
        let dry =
            b.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All")) || q.dry_run();
        Ok(DeleteOptions {
            propagation,
            uid: b.pointer("/preconditions/uid").and_then(Value::as_str).map(String::from),
            resource_version: b.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(String::from),
            dry_run: dry,
        })
    }
}

/// Removes the object for good (all finalizers done) and unregisters CRDs.
pub fn finish_delete(st: &mut State, def: &ResourceDef, k: &ObjKey) -> Option<Value> {
    let gr = def.group_resource();
    let gone = st.store.remove(&gr, k)?;
    if def.group == "apiextensions.k8s.io" {
        st.registry.remove_crd(&k.1);
    }
    Some(gone)
}

pub fn delete(
    st: &mut State,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<(u16, Value)> {
    let k = key(def, ns, name);
    let gr = def.group_resource();
    let current = st.store.get(&gr, &k).cloned().ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    if let Some(uid) = &opts.uid {
        let have = meta_str(&current, "uid").unwrap_or_default();
        if uid != have {
            return Err(ApiError::conflict(
                &def.group,
                &def.plural,
                name,
                &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
            ));
        }
    }
    if let Some(rv) = &opts.resource_version {
        let have = meta_str(&current, "resourceVersion").unwrap_or_default();
        if rv != have {
            return Err(ApiError::conflict(&def.group, &def.plural, name, &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}")));
        }
    }
    let mut fins = finalizers(&current);
    match opts.propagation.as_deref() {
        Some("Foreground") => {
            fins.retain(|f| f != ORPHAN);
            if !fins.iter().any(|f| f == FOREGROUND) {
                fins.push(FOREGROUND.into());
            }
        }
        Some("Orphan") => {
            fins.retain(|f| f != FOREGROUND);
            if !fins.iter().any(|f| f == ORPHAN) {
                fins.push(ORPHAN.into());
            }
        }
        Some(_) => {
            fins.retain(|f| f != FOREGROUND && f != ORPHAN);
        }
        None => {}
    }
    let is_ns = def.group.is_empty() && def.plural == "namespaces";
    if !fins.is_empty() || is_ns {
        // Graceful: mark for deletion; the object stays until its finalizers are gone.
        let mut marked = current.clone();
        set_finalizers(&mut marked, &fins);
        if let Ok(meta) = meta_mut(&mut marked) {
            if !meta.contains_key("deletionTimestamp") {
                meta.insert("deletionTimestamp".into(), json!(meta::now_rfc3339()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
        }
        if is_ns {
            marked["status"] = json!({"phase": "Terminating"});
        }
        if def.group == "apiextensions.k8s.io" {
            if let Some(conds) = marked.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
                conds.retain(|c| c.get("type") != Some(&json!("Terminating")));
                conds.push(json!({"type": "Terminating", "status": "True", "lastTransitionTime": meta::now_rfc3339(), "reason": "InstanceDeletionPending", "message": "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon"}));
            }
        }
        if opts.dry_run || marked == current {
            return Ok((200, convert::to_external(def, marked)));
        }
        let stored =
            st.store.replace(&gr, k, marked).ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
        return Ok((200, convert::to_external(def, stored)));
    }
    if opts.dry_run {
        return Ok((200, convert::to_external(def, current)));
    }
    let gone = finish_delete(st, def, &k).ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    if def.return_deleted_object {
        Ok((200, convert::to_external(def, gone)))
    } else {
        Ok((
            200,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                   "details": {"name": name, "group": def.group, "kind": def.plural, "uid": meta_str(&gone, "uid")}}),
        ))
    }
}

pub fn delete_collection(
    st: &mut State,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    q: &Query,
    opts: &DeleteOptions,
) -> ApiResult<Value> {
    let sel = selectors(def, q)?;
    let gr = def.group_resource();
    let ns = if def.namespaced { ns } else { None };
    let names: Vec<ObjKey> = st.store.list(&gr, ns).filter(|(_, o)| sel.matches(o)).map(|(k, _)| k.clone()).collect();
    let mut items = Vec::new();
    for (n, name) in names {
        let nsopt = if def.namespaced { Some(n.as_str()) } else { None };
        if let Ok((_, obj)) = delete(st, def, nsopt, &name, opts) {
            items.push(obj);
        }
    }
    Ok(list_object(def, items, json!({"resourceVersion": st.store.current_rv().to_string()})))
}
