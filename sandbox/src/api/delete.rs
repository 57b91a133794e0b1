//! delete and deletecollection: finalizers, propagation policies, preconditions.

use super::*;

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
