//! Kind-specific rules the built-in registries apply on create and update
//! (pod status reset and spec immutability, namespace phase, secret type, event fields).

use crate::error::FieldError;
use crate::registry::ResourceDef;
use serde_json::{json, Value};

pub fn prepare_create(def: &ResourceDef, obj: &mut Value) {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => {
            // PodStrategy.PrepareForCreate: clients cannot create a pod with a status.
            obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            default_pod_spec(obj);
            // applySchedulingGatedCondition: the API server itself (not the scheduler) marks a
            // pod made with scheduling gates.
            let gated = obj.pointer("/spec/schedulingGates").and_then(Value::as_array).is_some_and(|g| !g.is_empty());
            if gated {
                obj["status"]["conditions"] = json!([{
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": null,
                    "lastTransitionTime": crate::meta::now_rfc3339(),
                    "reason": "SchedulingGated",
                    "message": "Scheduling is blocked due to non-empty scheduling gates",
                }]);
            }
        }
        ("", "namespaces") => {
            obj["status"] = json!({"phase": "Active"});
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            let name = obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
            if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), name);
                }
            }
        }
        ("", "secrets") if obj.get("type").and_then(Value::as_str).is_none_or(str::is_empty) => {
            obj["type"] = json!("Opaque");
        }
        _ => {}
    }
}

fn default_pod_spec(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
    ] {
        spec.entry(k).or_insert(v);
    }
    if let Some(Value::Array(cs)) = spec.get_mut("containers") {
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            let latest =
                c.get("image").and_then(Value::as_str).is_some_and(|i| !i.contains(':') || i.ends_with(":latest"));
            c.entry("imagePullPolicy").or_insert(json!(if latest { "Always" } else { "IfNotPresent" }));
            c.entry("terminationMessagePath").or_insert(json!("/dev/termination-log"));
            c.entry("terminationMessagePolicy").or_insert(json!("File"));
            c.entry("resources").or_insert(json!({}));
        }
    }
}

/// Validation that does not depend on the old object.
pub fn validate(def: &ResourceDef, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => {
            errs.extend(validate_scheduling_gates(obj));
            match obj.pointer("/spec/containers").and_then(Value::as_array) {
                Some(cs) if !cs.is_empty() => {
                    for (i, c) in cs.iter().enumerate() {
                        let f = format!("spec.containers[{i}]");
                        match c.get("name").and_then(Value::as_str) {
                            Some(n) if crate::meta::is_dns1123_label(n) => {}
                            Some(n) => errs.push(FieldError::invalid(
                                format!("{f}.name"),
                                &json!(n),
                                &crate::meta::dns1123_label_message(),
                            )),
                            None => errs.push(FieldError::required(format!("{f}.name"), "")),
                        }
                        if c.get("image").and_then(Value::as_str).is_none_or(|s| s.trim().is_empty()) {
                            errs.push(FieldError::required(format!("{f}.image"), ""));
                        }
                    }
                }
                _ => errs.push(FieldError::required("spec.containers", "")),
            }
        }
        ("", "secrets") => {
            if let Some(Value::Object(data)) = obj.get("data") {
                for (k, v) in data {
                    if !v.as_str().is_some_and(is_base64) {
                        errs.push(FieldError::invalid(format!("data[{k}]"), v, "must be base64-encoded"));
                    }
                }
            }
        }
        ("events.k8s.io", "events") => {
            // The stored (core) names are checked; the messages use the events.k8s.io names.
            for (core, field) in [
                ("eventTime", "eventTime"),
                ("reportingComponent", "reportingController"),
                ("reportingInstance", "reportingInstance"),
                ("action", "action"),
                ("reason", "reason"),
            ] {
                if obj.get(core).is_none_or(|v| v.is_null() || v.as_str() == Some("")) {
                    errs.push(FieldError::required(field, ""));
                }
            }
            let ty = obj.get("type").cloned().unwrap_or(Value::Null);
            if ty != json!("Normal") && ty != json!("Warning") {
                errs.push(FieldError::not_supported("type", &ty, &[json!("Normal"), json!("Warning")]));
            }
        }
        ("", "events") if obj.get("involvedObject").is_none_or(Value::is_null) => {
            errs.push(FieldError::required("involvedObject", ""));
        }
        ("coordination.k8s.io", "leases") => {
            if let Some(d) = obj.pointer("/spec/leaseDurationSeconds").and_then(Value::as_i64) {
                if d <= 0 {
                    errs.push(FieldError::invalid("spec.leaseDurationSeconds", &json!(d), "must be greater than 0"));
                }
            }
        }
        _ => {}
    }
    errs
}

/// Update rules that compare against the old object.
pub fn validate_update(def: &ResourceDef, old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if def.group.is_empty() && def.plural == "pods" {
        // Only images (and a few scheduling fields) of a pod's spec may change.
        let strip = |v: &Value| {
            let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
            for list in ["containers", "initContainers"] {
                if let Some(Value::Array(cs)) = s.get_mut(list) {
                    for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                        c.remove("image");
                    }
                }
            }
            if let Some(m) = s.as_object_mut() {
                m.remove("schedulingGates");
                m.remove("activeDeadlineSeconds");
                m.remove("tolerations");
                m.remove("terminationGracePeriodSeconds");
            }
            s
        };
        // Gates may only be removed (kube-apiserver's validateOnlyDeletedSchedulingGates).
        let gates =
            |v: &Value| v.pointer("/spec/schedulingGates").and_then(Value::as_array).cloned().unwrap_or_default();
        let old_gates = gates(old);
        for (i, gate) in gates(new).iter().enumerate().filter(|(_, g)| !old_gates.contains(g)) {
            let name = gate.get("name").and_then(Value::as_str).unwrap_or_default();
            errs.push(FieldError::forbidden(
                format!("spec.schedulingGates[{i}].name"),
                &format!("only deletion is allowed, but found new scheduling gate '{name}'"),
            ));
        }
        if strip(old) != strip(new) {
            errs.push(FieldError::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
    }
    errs
}

/// A pod's scheduling gates: qualified names, each once, and none left on a pod bound to a node
/// (kube-apiserver's validateSchedulingGates and its nodeName rule on create; on update the
/// node name cannot change, so the rule holds there too).
fn validate_scheduling_gates(pod: &Value) -> Vec<FieldError> {
    let gates = pod.pointer("/spec/schedulingGates").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut errs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, gate) in gates.iter().enumerate() {
        let name = gate.get("name").and_then(Value::as_str).unwrap_or_default();
        let field = format!("spec.schedulingGates[{i}]");
        errs.extend(crate::meta::validate_qualified_name(name, &field));
        if !seen.insert(name) {
            errs.push(FieldError::duplicate(field, &json!(name)));
        }
    }
    let bound = pod.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    if bound && !gates.is_empty() {
        errs.push(FieldError::forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"));
    }
    errs
}

fn is_base64(s: &str) -> bool {
    let t = s.trim_end_matches('=');
    s.len().is_multiple_of(4)
        && s.len() - t.len() <= 2
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}
