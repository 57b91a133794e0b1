//! API errors rendered as `meta/v1 Status` objects, with the codes and reasons kube-apiserver
//! uses (k8s.io/apimachinery/pkg/api/errors), so clients branch on them the same way.

use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// A field error, as in k8s.io/apimachinery/pkg/util/validation/field.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// `FieldValueRequired`, `FieldValueInvalid`, ...
    pub cause: &'static str,
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        let message = if detail.is_empty() {
            format!("{field}: Required value")
        } else {
            format!("{field}: Required value: {detail}")
        };
        FieldError { cause: "FieldValueRequired", field, message }
    }
    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        let field = field.into();
        let message = format!("{field}: Invalid value: {}: {detail}", show_value(value));
        FieldError { cause: "FieldValueInvalid", field, message }
    }
    pub fn not_supported(field: impl Into<String>, value: &Value, allowed: &[Value]) -> Self {
        let field = field.into();
        let list: Vec<String> = allowed.iter().map(show_value).collect();
        let message =
            format!("{field}: Unsupported value: {}: supported values: {}", show_value(value), list.join(", "));
        FieldError { cause: "FieldValueNotSupported", field, message }
    }
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        let message = format!("{field}: Forbidden: {detail}");
        FieldError { cause: "FieldValueForbidden", field, message }
    }
    pub fn too_long(field: impl Into<String>, max: u64) -> Self {
        let field = field.into();
        let message = format!("{field}: Too long: may not be more than {max} bytes");
        FieldError { cause: "FieldValueTooLong", field, message }
    }
    pub fn too_many(field: impl Into<String>, len: usize, max: u64) -> Self {
        let field = field.into();
        let message = format!("{field}: Too many: {len}: must have at most {max} items");
        FieldError { cause: "FieldValueTooMany", field, message }
    }
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        let field = field.into();
        let message = format!("{field}: Duplicate value: {}", show_value(value));
        FieldError { cause: "FieldValueDuplicate", field, message }
    }
}

/// Go's `%#v`-ish rendering that field errors use: strings quoted, numbers bare.
fn show_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into(), details: None }
    }
    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    /// 404 for a path that names no resource at all.
    pub fn no_route() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource").with_details(json!({}))
    }
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", qualified(group, plural)))
            .with_details(json!({"name": name, "group": group, "kind": plural}))
    }
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", qualified(group, plural)))
            .with_details(json!({"name": name, "group": group, "kind": plural}))
    }
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{name}\": {why}", qualified(group, plural)),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub fn invalid(group: &str, kind: &str, name: &str, errors: Vec<FieldError>) -> Self {
        let joined = if errors.len() == 1 {
            errors[0].message.clone()
        } else {
            format!("[{}]", errors.iter().map(|e| e.message.as_str()).collect::<Vec<_>>().join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| {
                // Causes carry the field separately; their message is the part after "field: ".
                let prefix = format!("{}: ", e.field);
                let msg = e.message.strip_prefix(&prefix).unwrap_or(&e.message);
                json!({"reason": e.cause, "message": msg, "field": e.field})
            })
            .collect();
        Self::new(422, "Invalid", format!("{} \"{name}\" is invalid: {joined}", qualified(group, kind)))
            .with_details(json!({"name": name, "group": group, "kind": kind, "causes": causes}))
    }
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// `pods`, `lockclaims.zklock.io`: how kube-apiserver names a group resource in messages.
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}
