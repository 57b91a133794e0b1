//! Object metadata rules: names, labels, timestamps, generated names.

use crate::error::FieldError;
use regex::Regex;
use serde_json::Value;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

const DNS1123_LABEL: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN: &str = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const QUALIFIED_NAME: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

/// The patterns are constants, so compilation cannot fail; if it ever did, nothing would match.
fn anchored(cell: &'static OnceLock<Option<Regex>>, pat: &str) -> Option<&'static Regex> {
    cell.get_or_init(|| Regex::new(&format!("^{pat}$")).ok()).as_ref()
}

pub fn is_dns1123_label(s: &str) -> bool {
    static R: OnceLock<Option<Regex>> = OnceLock::new();
    s.len() <= 63 && anchored(&R, DNS1123_LABEL).is_some_and(|r| r.is_match(s))
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    static R: OnceLock<Option<Regex>> = OnceLock::new();
    s.len() <= 253 && anchored(&R, DNS1123_SUBDOMAIN).is_some_and(|r| r.is_match(s))
}

pub fn dns1123_label_message() -> String {
    format!(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{DNS1123_LABEL}')"
    )
}

pub fn dns1123_subdomain_message() -> String {
    format!(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{DNS1123_SUBDOMAIN}')"
    )
}

/// Which name rule a resource uses (kube-apiserver picks one per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    Subdomain,
    Label,
    /// Path-segment rules only (e.g. events may carry dots and long names).
    PathSegment,
}

pub fn validate_name(rule: NameRule, name: &str, field: &str) -> Vec<FieldError> {
    let mut errs = validate_path_segment(name, field);
    if !errs.is_empty() {
        return errs;
    }
    let v = Value::String(name.to_string());
    match rule {
        NameRule::Subdomain if !is_dns1123_subdomain(name) => {
            if name.len() > 253 {
                errs.push(FieldError::invalid(field, &v, "must be no more than 253 characters"));
            } else {
                errs.push(FieldError::invalid(field, &v, &dns1123_subdomain_message()));
            }
        }
        NameRule::Label if !is_dns1123_label(name) => {
            if name.len() > 63 {
                errs.push(FieldError::invalid(field, &v, "must be no more than 63 characters"));
            } else {
                errs.push(FieldError::invalid(field, &v, &dns1123_label_message()));
            }
        }
        _ => {}
    }
    errs
}

pub fn validate_path_segment(name: &str, field: &str) -> Vec<FieldError> {
    let v = Value::String(name.to_string());
    if name == "." || name == ".." {
        return vec![FieldError::invalid(field, &v, &format!("may not be '{name}'"))];
    }
    for bad in ["/", "%"] {
        if name.contains(bad) {
            return vec![FieldError::invalid(field, &v, &format!("may not contain '{bad}'"))];
        }
    }
    Vec::new()
}

/// `prefix/name` label and annotation keys (and other qualified names, such as scheduling gates).
pub fn validate_qualified_name(key: &str, field: &str) -> Option<FieldError> {
    static R: OnceLock<Option<Regex>> = OnceLock::new();
    let matches = |x: &str| anchored(&R, QUALIFIED_NAME).is_some_and(|r| r.is_match(x));
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let v = Value::String(key.to_string());
    if let Some(p) = prefix {
        if p.is_empty() || !is_dns1123_subdomain(p) {
            return Some(FieldError::invalid(field, &v, "prefix part must be a lowercase RFC 1123 subdomain"));
        }
    }
    if name.is_empty() || name.len() > 63 || !matches(name) {
        return Some(FieldError::invalid(
            field,
            &v,
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        ));
    }
    None
}

pub fn validate_labels(labels: &Value, field: &str) -> Vec<FieldError> {
    static R: OnceLock<Option<Regex>> = OnceLock::new();
    let matches = |x: &str| anchored(&R, LABEL_VALUE).is_some_and(|r| r.is_match(x));
    let mut errs = Vec::new();
    let Some(map) = labels.as_object() else {
        if !labels.is_null() {
            errs.push(FieldError::invalid(field, labels, "must be a map of strings"));
        }
        return errs;
    };
    for (k, v) in map {
        if let Some(e) = validate_qualified_name(k, field) {
            errs.push(e);
        }
        match v.as_str() {
            Some(s) if s.len() <= 63 && matches(s) => {}
            _ => errs.push(FieldError::invalid(
                field,
                v,
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            )),
        }
    }
    errs
}

pub fn validate_annotations(ann: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(map) = ann.as_object() else {
        if !ann.is_null() {
            errs.push(FieldError::invalid(field, ann, "must be a map of strings"));
        }
        return errs;
    };
    let mut total = 0usize;
    for (k, v) in map {
        if let Some(e) = validate_qualified_name(&k.to_lowercase(), field) {
            errs.push(e);
        }
        match v.as_str() {
            Some(s) => total += k.len() + s.len(),
            None => errs.push(FieldError::invalid(field, v, "annotation values must be strings")),
        }
    }
    if total > 256 * 1024 {
        errs.push(FieldError::too_long(field, 256 * 1024));
    }
    errs
}

/// RFC 3339 in UTC with second precision, as metav1.Time serialises.
pub fn now_rfc3339() -> String {
    format_rfc3339(unix_now())
}

pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

pub fn format_rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` into Unix seconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = s.get(19..)?;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = frac.get(digits..)?;
    }
    let offset = if rest == "Z" || rest == "z" {
        0
    } else {
        let sign = match rest.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let oh = rest.get(1..3)?.parse::<i64>().ok()?;
        let om = rest.get(4..6)?.parse::<i64>().ok()?;
        sign * (oh * 3600 + om * 60)
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset)
}

// Howard Hinnant's civil calendar algorithms.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// kube's `HumanDuration` (k8s.io/apimachinery/pkg/util/duration), used for AGE cells.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        let y = d / 365;
        if d % 365 == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{}d", d % 365)
        }
    } else {
        format!("{}y", d / 365)
    }
}

pub fn age_of(obj: &Value) -> String {
    match obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str).and_then(parse_rfc3339) {
        Some(t) => human_duration(unix_now() - t),
        None => "<unknown>".into(),
    }
}

/// The suffix kube-apiserver appends to `generateName`: 5 characters from an alphabet
/// without vowels (so no words) and without confusable digits.
pub fn generated_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes.iter().take(5).map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char).collect()
}

pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        for t in [0i64, 951_782_400, 1_700_000_000, 4_102_444_800] {
            assert_eq!(parse_rfc3339(&format_rfc3339(t)), Some(t));
        }
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339("2024-02-29T12:00:00.123456+01:00"), Some(1_709_204_400));
        assert_eq!(parse_rfc3339("garbage"), None);
    }

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_label("a.b"));
        assert_eq!(validate_name(NameRule::Subdomain, "Bad_Name", "metadata.name").len(), 1);
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3 * 86_400 + 3600), "3d1h");
    }
}
