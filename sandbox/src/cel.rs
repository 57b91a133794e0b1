//! CEL validation rules of CRD schemas (`x-kubernetes-validations`), evaluated with the
//! `cel` crate: `self` is the value at the rule's schema node, `oldSelf` the value it replaces
//! (rules that mention `oldSelf` are transition rules and only run on updates where an old
//! value exists at the same place).
//!
//! Kubernetes' CEL library functions (quantity, url, ip, ...) are not in the `cel` crate: a rule
//! that calls one is skipped rather than wrongly rejecting the object (see README).

use crate::error::FieldError;
use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn rules(schema: &Value) -> Vec<Value> {
    schema.get("x-kubernetes-validations").and_then(Value::as_array).cloned().unwrap_or_default()
}

enum Outcome {
    Pass,
    Fail(String),
    /// The rule uses something the interpreter lacks; not enforced.
    Unsupported,
}

/// Runs the interpreter, which is third-party code, so that a panic inside it can only ever
/// fail one rule and never the server.
fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// The parser recurses per nesting level; a stack overflow cannot be caught like a panic, so
/// absurdly nested or long rules are refused before they reach it.
fn too_complex(rule: &str) -> Option<&'static str> {
    if rule.len() > 16 * 1024 {
        return Some("rule is longer than 16384 bytes");
    }
    let mut depth = 0usize;
    for c in rule.chars() {
        match c {
            '(' | '[' | '{' => {
                depth += 1;
                if depth > 32 {
                    return Some("rule nests deeper than 32 levels");
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn compile(rule: &str) -> Result<cel::Program, String> {
    if let Some(why) = too_complex(rule) {
        return Err(why.to_string());
    }
    cel::Program::compile(rule).map_err(|e| e.to_string())
}

fn evaluate(rule: &str, this: &Value, old: Option<&Value>) -> Outcome {
    let result = guarded(|| {
        let program = match compile(rule) {
            Ok(p) => p,
            Err(e) => return Outcome::Fail(format!("compilation failed: {e}")),
        };
        let mut ctx = cel::Context::default();
        match cel::to_value(this) {
            Ok(v) => ctx.add_variable_from_value("self", v),
            Err(_) => return Outcome::Unsupported,
        }
        if let Some(o) = old {
            match cel::to_value(o) {
                Ok(v) => ctx.add_variable_from_value("oldSelf", v),
                Err(_) => return Outcome::Unsupported,
            }
        }
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => Outcome::Pass,
            Ok(cel::Value::Bool(false)) => Outcome::Fail(String::new()),
            Ok(other) => Outcome::Fail(format!("rule did not evaluate to a bool: {other:?}")),
            Err(cel::ExecutionError::UndeclaredReference(_)) | Err(cel::ExecutionError::NoSuchOverload(_)) => {
                Outcome::Unsupported
            }
            Err(e) => Outcome::Fail(format!("evaluation error: {e}")),
        }
    });
    result.unwrap_or(Outcome::Unsupported)
}

fn mentions_old_self(rule: &str) -> bool {
    rule.contains("oldSelf")
}

fn schema_type(schema: &Value) -> &str {
    schema.get("type").and_then(Value::as_str).unwrap_or("object")
}

/// Checks that every rule in a CRD's schema parses; kube-apiserver refuses CRDs whose rules
/// do not compile.
pub fn check_rules(schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    for (i, r) in rules(schema).iter().enumerate() {
        let field = format!("{path}.x-kubernetes-validations[{i}].rule");
        match r.get("rule").and_then(Value::as_str) {
            None => errs.push(FieldError::required(field, "")),
            Some(rule) => {
                let parsed = guarded(|| compile(rule).map(|_| ()));
                match parsed {
                    Some(Ok(())) => {}
                    Some(Err(e)) => {
                        errs.push(FieldError::invalid(field, &json!(rule), &format!("compilation failed: {e}")))
                    }
                    None => errs.push(FieldError::invalid(field, &json!(rule), "compilation failed")),
                }
            }
        }
    }
    if let Some(Value::Object(props)) = schema.get("properties") {
        for (k, s) in props {
            check_rules(s, &format!("{path}.properties[{k}]"), errs);
        }
    }
    if let Some(items) = schema.get("items") {
        check_rules(items, &format!("{path}.items"), errs);
    }
    if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        check_rules(ap, &format!("{path}.additionalProperties"), errs);
    }
}

/// Evaluates all rules in `schema` against `new` (and `old` for transition rules).
pub fn validate(schema: &Value, new: &Value, old: Option<&Value>, path: &str, errs: &mut Vec<FieldError>) {
    for r in rules(schema) {
        let Some(rule) = r.get("rule").and_then(Value::as_str) else {
            continue;
        };
        let transition = mentions_old_self(rule);
        if transition && old.is_none() {
            continue;
        }
        let detail = match evaluate(rule, new, if transition { old } else { None }) {
            Outcome::Pass | Outcome::Unsupported => continue,
            Outcome::Fail(why) => {
                let msg = r.get("message").and_then(Value::as_str).map(String::from);
                match (msg, why.is_empty()) {
                    (Some(m), _) => m,
                    (None, true) => format!("failed rule: {rule}"),
                    (None, false) => why,
                }
            }
        };
        let mut field = path.to_string();
        if let Some(fp) = r.get("fieldPath").and_then(Value::as_str) {
            field.push_str(fp);
        }
        let e = match r.get("reason").and_then(Value::as_str) {
            Some("FieldValueForbidden") => FieldError::forbidden(field, &detail),
            Some("FieldValueRequired") => FieldError::required(field, &detail),
            _ => FieldError::invalid(field, &json!(schema_type(schema)), &detail),
        };
        errs.push(e);
    }
    match new {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (k, ps) in props {
                    if let Some(child) = m.get(k) {
                        let old_child = old.and_then(|o| o.get(k));
                        validate(ps, child, old_child, &join(path, k), errs);
                    }
                }
            }
            if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for (k, child) in m {
                    let old_child = old.and_then(|o| o.get(k));
                    validate(ap, child, old_child, &format!("{path}[{k}]"), errs);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                // Only map lists correlate old and new elements (by their keys).
                let keys: Vec<&str> = schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| k.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let is_map = schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map");
                for (i, child) in items.iter().enumerate() {
                    let old_child = if is_map && !keys.is_empty() {
                        old.and_then(Value::as_array)
                            .and_then(|olds| olds.iter().find(|o| keys.iter().all(|k| o.get(k) == child.get(k))))
                    } else {
                        None
                    };
                    validate(is, child, old_child, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "spec is immutable"},
                {"rule": "self.min <= self.max"}
            ],
            "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}
        }}})
    }

    #[test]
    fn rules_and_transition_rules() {
        let s = schema();
        let a = json!({"spec": {"min": 1, "max": 2}});
        let mut errs = vec![];
        validate(&s, &a, None, "", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        let bad = json!({"spec": {"min": 3, "max": 2}});
        validate(&s, &bad, None, "", &mut errs);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].message, "spec: Invalid value: \"object\": failed rule: self.min <= self.max");
        let mut errs = vec![];
        validate(&s, &json!({"spec": {"min": 0, "max": 2}}), Some(&a), "", &mut errs);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].message, "spec: Invalid value: \"object\": spec is immutable");
        let mut errs = vec![];
        check_rules(&json!({"x-kubernetes-validations": [{"rule": "self.("}]}), "root", &mut errs);
        let deep = format!("{}true{}", "(".repeat(5000), ")".repeat(5000));
        check_rules(&json!({"x-kubernetes-validations": [{"rule": deep}]}), "root", &mut errs);
        assert_eq!(errs.len(), 2, "{errs:?}");
    }
}
