//! The verbs: get, list, create, update, patch, delete, deletecollection — the semantics of
//! kube-apiserver's generic registry (k8s.io/apiserver/pkg/registry/generic/registry).
//! This module holds what all verbs share: object metadata rules, type checks, schema
//! application; the verbs themselves live in `read`, `write` and `delete`.

mod delete;
mod read;
mod write;

pub use delete::{delete, delete_collection, finish_delete, DeleteOptions};
pub use read::{get, list, list_object};
pub use write::{create, patch, update};

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

pub fn selectors(def: &ResourceDef, q: &Query) -> ApiResult<Selectors> {
    Ok(Selectors {
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), def)?,
    })
}

pub fn parse_rv(raw: &str) -> ApiResult<u64> {
    raw.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {raw}")))
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
