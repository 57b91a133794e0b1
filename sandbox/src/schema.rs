//! Structural openAPIV3Schema handling for custom resources: defaulting, pruning of unknown
//! fields, and validation, with the error texts kube-apiserver produces.
//!
//! CEL rules (`x-kubernetes-validations`) are not evaluated here; see README.

use crate::error::FieldError;
use regex::Regex;
use serde_json::{Map, Value};

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn preserves_unknown(s: &Value) -> bool {
    s.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true)
}

fn is_embedded(s: &Value) -> bool {
    s.get("x-kubernetes-embedded-resource").and_then(Value::as_bool) == Some(true)
}

/// Fills in `default`s for absent properties, then recurses, as structural defaulting does.
pub fn apply_defaults(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (k, ps) in props {
                    let absent = m.get(k).is_none()
                        || (m.get(k) == Some(&Value::Null)
                            && ps.get("nullable").and_then(Value::as_bool) != Some(true));
                    if absent {
                        if let Some(d) = ps.get("default") {
                            m.insert(k.clone(), d.clone());
                        }
                    }
                    if let Some(child) = m.get_mut(k) {
                        apply_defaults(ps, child);
                    }
                }
            }
            if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in m.values_mut() {
                    apply_defaults(ap, child);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for child in a {
                    apply_defaults(items, child);
                }
            }
        }
        _ => {}
    }
}

/// Drops fields the schema does not declare; returns their paths for fieldValidation.
pub fn prune(schema: &Value, v: &mut Value, path: &str, root: bool, unknown: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let keep_meta = root || is_embedded(schema);
            if let Some(ap) = additional {
                for (k, child) in m.iter_mut() {
                    prune(ap, child, &format!("{path}[{k}]"), false, unknown);
                }
                return;
            }
            if preserves_unknown(schema) && props.is_none() {
                return;
            }
            let empty = Map::new();
            let props = props.unwrap_or(&empty);
            let preserve = preserves_unknown(schema);
            m.retain(|k, _| {
                let keep = props.contains_key(k)
                    || preserve
                    || (keep_meta && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
                if !keep {
                    unknown.push(join(path, k));
                }
                keep
            });
            for (k, child) in m.iter_mut() {
                if let Some(ps) = props.get(k) {
                    prune(ps, child, &join(path, k), false, unknown);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for (i, child) in a.iter_mut().enumerate() {
                    prune(items, child, &format!("{path}[{i}]"), false, unknown);
                }
            }
        }
        _ => {}
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(want: &str, v: &Value) -> bool {
    match (want, v) {
        ("object", Value::Object(_)) | ("array", Value::Array(_)) | ("string", Value::String(_)) => true,
        ("boolean", Value::Bool(_)) | ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

fn num(s: &Value, key: &str) -> Option<f64> {
    s.get(key).and_then(Value::as_f64)
}

fn uint(s: &Value, key: &str) -> Option<u64> {
    s.get(key).and_then(Value::as_u64)
}

/// Validates `v` against `schema`; `path` is the field path (`spec.items[0].name`).
pub fn validate(schema: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let int_or_string = schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if v.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) == Some(true) {
            return;
        }
        if let Some(t) = schema.get("type").and_then(Value::as_str) {
            errs.push(FieldError::invalid(
                path,
                &Value::String("null".into()),
                &format!("{path} in body must be of type {t}: \"null\""),
            ));
        }
        return;
    }
    if int_or_string {
        if !(type_ok("integer", v) || type_ok("string", v)) {
            let tn = Value::String(type_name(v).into());
            errs.push(FieldError::invalid(
                path,
                &tn,
                &format!("{path} in body must be of type integer,string: \"{}\"", type_name(v)),
            ));
            return;
        }
    } else if let Some(t) = schema.get("type").and_then(Value::as_str) {
        if !type_ok(t, v) {
            let tn = Value::String(type_name(v).into());
            errs.push(FieldError::invalid(
                path,
                &tn,
                &format!("{path} in body must be of type {t}: \"{}\"", type_name(v)),
            ));
            return;
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.contains(v) {
            errs.push(FieldError::not_supported(path, v, allowed));
        }
    }
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = num(schema, "minimum") {
                let excl = schema.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
                if (excl && x <= min) || (!excl && x < min) {
                    let rel = if excl { "greater than" } else { "greater than or equal to" };
                    errs.push(FieldError::invalid(
                        path,
                        v,
                        &format!("{path} in body should be {rel} {}", fmt_num(min)),
                    ));
                }
            }
            if let Some(max) = num(schema, "maximum") {
                let excl = schema.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
                if (excl && x >= max) || (!excl && x > max) {
                    let rel = if excl { "less than" } else { "less than or equal to" };
                    errs.push(FieldError::invalid(
                        path,
                        v,
                        &format!("{path} in body should be {rel} {}", fmt_num(max)),
                    ));
                }
            }
            if let Some(m) = num(schema, "multipleOf") {
                if m > 0.0 && (x / m).fract().abs() > 1e-9 {
                    errs.push(FieldError::invalid(
                        path,
                        v,
                        &format!("{path} in body should be a multiple of {}", fmt_num(m)),
                    ));
                }
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = uint(schema, "maxLength") {
                if len > max {
                    errs.push(FieldError::too_long(path, max));
                }
            }
            if let Some(min) = uint(schema, "minLength") {
                if len < min {
                    errs.push(FieldError::invalid(
                        path,
                        v,
                        &format!("{path} in body should be at least {min} chars long"),
                    ));
                }
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
                match Regex::new(p) {
                    Ok(re) if re.is_match(s) => {}
                    _ => errs.push(FieldError::invalid(path, v, &format!("{path} in body should match '{p}'"))),
                }
            }
        }
        Value::Array(a) => {
            if let Some(max) = uint(schema, "maxItems") {
                if a.len() as u64 > max {
                    errs.push(FieldError::too_many(path, a.len(), max));
                }
            }
            if let Some(min) = uint(schema, "minItems") {
                if (a.len() as u64) < min {
                    errs.push(FieldError::invalid(
                        path,
                        &Value::from(a.len()),
                        &format!("{path} in body should have at least {min} items"),
                    ));
                }
            }
            let list_type = schema.get("x-kubernetes-list-type").and_then(Value::as_str);
            let unique = schema.get("uniqueItems").and_then(Value::as_bool) == Some(true);
            if list_type == Some("set") || unique {
                for (i, it) in a.iter().enumerate() {
                    if a[..i].contains(it) {
                        errs.push(FieldError::duplicate(format!("{path}[{i}]"), it));
                    }
                }
            }
            if list_type == Some("map") {
                if let Some(Value::Array(keys)) = schema.get("x-kubernetes-list-map-keys") {
                    let key_of = |it: &Value| {
                        keys.iter().map(|k| k.as_str().and_then(|k| it.get(k)).cloned()).collect::<Vec<_>>()
                    };
                    for (i, it) in a.iter().enumerate() {
                        let k = key_of(it);
                        if a[..i].iter().any(|o| key_of(o) == k) {
                            errs.push(FieldError::duplicate(format!("{path}[{i}]"), it));
                        }
                    }
                }
            }
            if let Some(items) = schema.get("items") {
                for (i, it) in a.iter().enumerate() {
                    validate(items, it, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(m) => {
            if let Some(max) = uint(schema, "maxProperties") {
                if m.len() as u64 > max {
                    errs.push(FieldError::too_many(path, m.len(), max));
                }
            }
            if let Some(min) = uint(schema, "minProperties") {
                if (m.len() as u64) < min {
                    errs.push(FieldError::invalid(
                        path,
                        &Value::from(m.len()),
                        &format!("{path} in body should have at least {min} properties"),
                    ));
                }
            }
            if let Some(Value::Array(req)) = schema.get("required") {
                for r in req.iter().filter_map(Value::as_str) {
                    if !m.contains_key(r) {
                        errs.push(FieldError::required(join(path, r), ""));
                    }
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let skip_meta = path.is_empty() || is_embedded(schema);
            for (k, child) in m {
                if skip_meta && matches!(k.as_str(), "metadata" | "apiVersion" | "kind") {
                    continue;
                }
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    validate(ps, child, &join(path, k), errs);
                } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    validate(ap, child, &format!("{path}[{k}]"), errs);
                }
            }
        }
        _ => {}
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(subs)) = schema.get(key) {
            let results: Vec<Vec<FieldError>> = subs
                .iter()
                .map(|s| {
                    let mut e = Vec::new();
                    validate(s, v, path, &mut e);
                    e
                })
                .collect();
            let ok = results.iter().filter(|e| e.is_empty()).count();
            match key {
                "allOf" => errs.extend(results.into_iter().flatten()),
                "anyOf" if ok == 0 && !subs.is_empty() => errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!("{path} in body must match at least one schema (anyOf)"),
                )),
                "oneOf" if ok != 1 && !subs.is_empty() => errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!("{path} in body must match exactly one schema (oneOf)"),
                )),
                _ => {}
            }
        }
    }
    if let Some(not) = schema.get("not") {
        let mut e = Vec::new();
        validate(not, v, path, &mut e);
        if e.is_empty() {
            errs.push(FieldError::invalid(path, v, &format!("{path} in body must not validate the schema (not)")));
        }
    }
}

fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["lockName"], "properties": {
            "lockName": {"type": "string", "pattern": "^[a-z]+$"},
            "mode": {"type": "string", "enum": ["Exclusive", "Shared"], "default": "Exclusive"},
            "n": {"type": "integer", "minimum": 0, "maximum": 10}}}}})
    }

    #[test]
    fn defaults_prunes_and_validates() {
        let s = schema();
        let mut o = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {}, "spec": {"lockName": "ab", "extra": 1}});
        apply_defaults(&s, &mut o);
        let mut unknown = vec![];
        prune(&s, &mut o, "", true, &mut unknown);
        assert_eq!(unknown, vec!["spec.extra".to_string()]);
        assert_eq!(o["spec"]["mode"], "Exclusive");
        let mut errs = vec![];
        validate(&s, &o, "", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        let bad = json!({"spec": {"lockName": "AB", "mode": "X", "n": 11}});
        let mut errs = vec![];
        validate(&s, &bad, "", &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.lockName", "spec.mode", "spec.n"]);
        let mut errs = vec![];
        validate(&s, &json!({"spec": {}}), "", &mut errs);
        assert_eq!(errs[0].message, "spec.lockName: Required value");
    }
}
