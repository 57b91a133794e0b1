//! CustomResourceDefinitions: validating them, turning them into served resources, and the
//! status the establishing controller of kube-apiserver writes.

use crate::error::FieldError;
use crate::meta::NameRule;
use crate::registry::{PrinterColumn, ResourceDef};
use serde_json::{json, Value};

pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

fn s<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str).filter(|x| !x.is_empty())
}

pub fn validate(crd: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let group = s(crd, "/spec/group");
    let plural = s(crd, "/spec/names/plural");
    let kind = s(crd, "/spec/names/kind");
    match group {
        None => errs.push(FieldError::required("spec.group", "")),
        Some(g) if !g.contains('.') => {
            errs.push(FieldError::invalid("spec.group", &json!(g), "should be a domain with at least one dot"))
        }
        Some(g) if !crate::meta::is_dns1123_subdomain(g) => {
            errs.push(FieldError::invalid("spec.group", &json!(g), &crate::meta::dns1123_subdomain_message()))
        }
        _ => {}
    }
    match plural {
        None => errs.push(FieldError::required("spec.names.plural", "")),
        Some(p) if !crate::meta::is_dns1123_label(p) => {
            errs.push(FieldError::invalid("spec.names.plural", &json!(p), &crate::meta::dns1123_label_message()))
        }
        _ => {}
    }
    if kind.is_none() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    if let (Some(g), Some(p), Some(name)) = (group, plural, s(crd, "/metadata/name")) {
        if name != format!("{p}.{g}") {
            errs.push(FieldError::invalid("metadata.name", &json!(name), "must be spec.names.plural+\".\"+spec.group"));
        }
    }
    let scope = crd.pointer("/spec/scope").cloned().unwrap_or(Value::Null);
    if scope != json!("Namespaced") && scope != json!("Cluster") {
        errs.push(FieldError::not_supported("spec.scope", &scope, &[json!("Cluster"), json!("Namespaced")]));
    }
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            "spec.versions",
            &json!(null),
            "must have exactly one version marked as storage version",
        ));
    } else {
        let storage = versions.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).count();
        if storage != 1 {
            errs.push(FieldError::invalid(
                "spec.versions",
                &json!(storage),
                "must have exactly one version marked as storage version",
            ));
        }
        for (i, v) in versions.iter().enumerate() {
            if s(v, "/name").is_none() {
                errs.push(FieldError::required(format!("spec.versions[{i}].name"), ""));
            }
            match v.pointer("/schema/openAPIV3Schema") {
                None => errs.push(FieldError::required(
                    format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    "schemas are required",
                )),
                Some(sch) if sch.get("type").and_then(Value::as_str) != Some("object") => {
                    errs.push(FieldError::invalid(
                        format!("spec.versions[{i}].schema.openAPIV3Schema.type"),
                        sch.get("type").unwrap_or(&Value::Null),
                        "must be object at the root",
                    ))
                }
                Some(sch) => {
                    crate::cel::check_rules(sch, &format!("spec.versions[{i}].schema.openAPIV3Schema"), &mut errs)
                }
            }
        }
    }
    errs
}

/// The served resources of a CRD, storage version first.
pub fn resource_defs(crd: &Value) -> Vec<(ResourceDef, bool)> {
    let name = s(crd, "/metadata/name").unwrap_or_default().to_string();
    let group = s(crd, "/spec/group").unwrap_or_default().to_string();
    let names = crd.pointer("/spec/names").cloned().unwrap_or(Value::Null);
    let kind = s(&names, "/kind").unwrap_or_default().to_string();
    let plural = s(&names, "/plural").unwrap_or_default().to_string();
    let strs = |ptr: &str| -> Vec<String> {
        names
            .pointer(ptr)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let namespaced = s(crd, "/spec/scope") == Some("Namespaced");
    let mut out = Vec::new();
    for v in crd.pointer("/spec/versions").and_then(Value::as_array).into_iter().flatten() {
        if v.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let version = s(v, "/name").unwrap_or_default().to_string();
        let mut columns: Vec<PrinterColumn> = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| PrinterColumn {
                name: s(c, "/name").unwrap_or_default().into(),
                type_: s(c, "/type").unwrap_or("string").into(),
                format: s(c, "/format").unwrap_or_default().into(),
                description: s(c, "/description").unwrap_or_default().into(),
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                json_path: s(c, "/jsonPath").unwrap_or_default().into(),
            })
            .collect();
        if columns.is_empty() {
            // The apiextensions-apiserver default when a CRD declares no columns.
            columns.push(PrinterColumn {
                name: "Age".into(),
                type_: "date".into(),
                format: String::new(),
                description: "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata".into(),
                priority: 0,
                json_path: ".metadata.creationTimestamp".into(),
            });
        }
        let selectable = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|f| {
                let p = s(f, "/jsonPath")?;
                let label = p.trim_start_matches('.').to_string();
                Some((label.clone(), format!("/{}", label.replace('.', "/"))))
            })
            .collect();
        let def = ResourceDef {
            group: group.clone(),
            version,
            plural: plural.clone(),
            singular: s(&names, "/singular").map(String::from).unwrap_or_else(|| kind.to_lowercase()),
            kind: kind.clone(),
            list_kind: s(&names, "/listKind").map(String::from).unwrap_or_else(|| format!("{kind}List")),
            namespaced,
            short_names: strs("/shortNames"),
            categories: strs("/categories"),
            status_subresource: v.pointer("/subresources/status").is_some_and(Value::is_object),
            generation: true,
            unconditional_update: false,
            create_on_update: false,
            return_deleted_object: true,
            name_rule: NameRule::Subdomain,
            selectable_fields: selectable,
            schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            printer_columns: columns,
            crd: Some(name.clone()),
        };
        let storage = v.get("storage").and_then(Value::as_bool) == Some(true);
        out.push((def, storage));
    }
    out
}

/// The status kube-apiserver's naming and establishing controllers write.
pub fn established_status(crd: &Value) -> Value {
    let now = crate::meta::now_rfc3339();
    let mut names = crd.pointer("/spec/names").filter(|n| n.is_object()).cloned().unwrap_or_else(|| json!({}));
    let kind = s(crd, "/spec/names/kind").unwrap_or_default().to_string();
    if names.get("singular").is_none() {
        names["singular"] = json!(kind.to_lowercase());
    }
    if names.get("listKind").is_none() {
        names["listKind"] = json!(format!("{kind}List"));
    }
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    json!({
        "acceptedNames": names,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "storedVersions": stored,
    })
}
