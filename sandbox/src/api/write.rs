//! create, update (PUT) and patch, including the status subresource and generation rules.

use super::*;

/// A successful write: status code, response object, and `Warning` headers.
pub struct Written {
    pub code: u16,
    pub object: Value,
    pub warnings: Vec<String>,
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
