//! labelSelector and fieldSelector parsing and matching, following
//! k8s.io/apimachinery/pkg/labels and pkg/fields.

use crate::error::ApiError;
use crate::registry::ResourceDef;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

fn parse_set(s: &str, raw: &str) -> Result<Vec<String>, ApiError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| label_err(raw, "found '', expected: '('"))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

fn label_err(raw: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {why} (in selector {raw:?})"))
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

impl LabelSelector {
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if raw.trim().is_empty() {
            return Ok(LabelSelector { reqs });
        }
        for part in split_top(raw) {
            let p = part.trim();
            if p.is_empty() {
                return Err(label_err(raw, "found '', expected: identifier"));
            }
            let (key, op) = if let Some(k) = p.strip_prefix('!') {
                (k.trim().to_string(), LabelOp::NotExists)
            } else if let Some((k, v)) = p.split_once("!=") {
                (k.trim().to_string(), LabelOp::NotEq(v.trim().to_string()))
            } else if let Some((k, v)) = p.split_once("==") {
                (k.trim().to_string(), LabelOp::Eq(v.trim().to_string()))
            } else if let Some((k, v)) = p.split_once('=') {
                (k.trim().to_string(), LabelOp::Eq(v.trim().to_string()))
            } else if let Some(idx) = p.find(" notin ") {
                (p[..idx].trim().to_string(), LabelOp::NotIn(parse_set(&p[idx + 7..], raw)?))
            } else if let Some(idx) = p.find(" in ") {
                (p[..idx].trim().to_string(), LabelOp::In(parse_set(&p[idx + 4..], raw)?))
            } else if p.contains(' ') || p.contains('(') {
                return Err(label_err(raw, &format!("unexpected token in {p:?}")));
            } else {
                (p.to_string(), LabelOp::Exists)
            };
            if !valid_key(&key) {
                return Err(label_err(raw, &format!("invalid label key {key:?}")));
            }
            if let LabelOp::Eq(v) | LabelOp::NotEq(v) = &op {
                if v.contains([' ', '(', ')', '=', '!']) {
                    return Err(label_err(raw, &format!("invalid label value {v:?}")));
                }
            }
            reqs.push((key, op));
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|(k, op)| match op {
            LabelOp::Eq(v) => get(k) == Some(v.as_str()),
            LabelOp::NotEq(v) => get(k) != Some(v.as_str()),
            LabelOp::In(vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelOp::NotIn(vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelOp::Exists => get(k).is_some(),
            LabelOp::NotExists => get(k).is_none(),
        })
    }
}

#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    /// (JSON pointer, wanted value, equal?)
    reqs: Vec<(String, String, bool)>,
}

impl FieldSelector {
    pub fn parse(raw: &str, def: &ResourceDef) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if raw.trim().is_empty() {
            return Ok(FieldSelector { reqs });
        }
        for part in raw.split(',') {
            let p = part.trim();
            let (field, value, eq) = if let Some((f, v)) = p.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = p.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = p.split_once('=') {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{raw}'; can't understand '{p}'")));
            };
            let field = field.trim();
            let pointer = match field {
                "metadata.name" => "/metadata/name".to_string(),
                "metadata.namespace" => "/metadata/namespace".to_string(),
                other => match def.selectable_fields.iter().find(|(f, _)| f == other) {
                    Some((_, ptr)) => ptr.clone(),
                    None => return Err(ApiError::bad_request(format!("field label not supported: {other}"))),
                },
            };
            reqs.push((pointer, value.trim().to_string(), eq));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(ptr, want, eq)| {
            // Absent fields compare as the empty string, as the field-set conversions do.
            let got = match obj.pointer(ptr) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (got == *want) == *eq
        })
    }
}

#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "a", "tier": "web"}}});
        let m = |s: &str| LabelSelector::parse(s).map(|l| l.matches(&o));
        assert_eq!(m("app=a").ok(), Some(true));
        assert_eq!(m("app!=a").ok(), Some(false));
        assert_eq!(m("app in (a, b),tier").ok(), Some(true));
        assert_eq!(m("app notin (a)").ok(), Some(false));
        assert_eq!(m("!missing").ok(), Some(true));
        assert!(m("app in a").is_err());
        assert!(m("a=b=c").is_err());
    }
}
