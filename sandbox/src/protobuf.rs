//! Decoding of the protobuf request bodies kubectl's typed clients send
//! (`kubectl create namespace|configmap|secret|serviceaccount`). Only these kinds are
//! understood; their field numbers are those of k8s.io/api's generated.proto. Anything else
//! is left to the caller to refuse with 415.

use serde_json::{json, Map, Value};

/// kube-apiserver's protobuf envelope starts with these bytes, then a `runtime.Unknown`.
const MAGIC: &[u8] = b"k8s\x00";

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn fields(buf: &[u8]) -> Option<Vec<(u64, Wire<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let tag = varint(buf, &mut pos)?;
        let (num, wt) = (tag >> 3, tag & 7);
        let w = match wt {
            0 => Wire::Varint(varint(buf, &mut pos)?),
            1 => {
                pos = pos.checked_add(8).filter(|p| *p <= buf.len())?;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len())?;
                let b = &buf[pos..end];
                pos = end;
                Wire::Bytes(b)
            }
            5 => {
                pos = pos.checked_add(4).filter(|p| *p <= buf.len())?;
                Wire::Fixed
            }
            _ => return None,
        };
        out.push((num, w));
    }
    Some(out)
}

fn string(w: &Wire) -> Option<String> {
    match w {
        Wire::Bytes(b) => String::from_utf8(b.to_vec()).ok(),
        _ => None,
    }
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// A `map<string, string|bytes>` entry.
fn map_entry(buf: &[u8], bytes_value: bool) -> Option<(String, Value)> {
    let mut key = String::new();
    let mut value = json!("");
    for (n, w) in fields(buf)? {
        match (n, &w) {
            (1, _) => key = string(&w)?,
            (2, Wire::Bytes(b)) if bytes_value => value = json!(base64(b)),
            (2, _) => value = json!(string(&w)?),
            _ => {}
        }
    }
    Some((key, value))
}

fn insert_entry(obj: &mut Map<String, Value>, field: &str, w: &Wire, bytes_value: bool) -> Option<()> {
    let Wire::Bytes(b) = w else { return None };
    let (k, v) = map_entry(b, bytes_value)?;
    let m = obj.entry(field).or_insert_with(|| json!({}));
    m.as_object_mut()?.insert(k, v);
    Some(())
}

/// Proto3 strings are always present; an empty one means unset, as Go's omitempty has it.
fn set_str(obj: &mut Map<String, Value>, field: &str, w: &Wire) -> Option<()> {
    let s = string(w)?;
    if !s.is_empty() {
        obj.insert(field.to_string(), json!(s));
    }
    Some(())
}

fn push(obj: &mut Map<String, Value>, field: &str, v: Value) -> Option<()> {
    obj.entry(field).or_insert_with(|| json!([])).as_array_mut()?.push(v);
    Some(())
}

fn owner_reference(buf: &[u8]) -> Option<Value> {
    let mut m = Map::new();
    for (n, w) in fields(buf)? {
        match (n, &w) {
            (1, _) => set_str(&mut m, "kind", &w)?,
            (3, _) => set_str(&mut m, "name", &w)?,
            (4, _) => set_str(&mut m, "uid", &w)?,
            (5, _) => set_str(&mut m, "apiVersion", &w)?,
            (6, Wire::Varint(v)) => {
                m.insert("controller".into(), json!(*v != 0));
            }
            (7, Wire::Varint(v)) => {
                m.insert("blockOwnerDeletion".into(), json!(*v != 0));
            }
            _ => {}
        }
    }
    Some(Value::Object(m))
}

fn object_meta(buf: &[u8]) -> Option<Value> {
    let mut m = Map::new();
    for (n, w) in fields(buf)? {
        match n {
            1 => set_str(&mut m, "name", &w)?,
            2 => set_str(&mut m, "generateName", &w)?,
            3 => set_str(&mut m, "namespace", &w)?,
            5 => set_str(&mut m, "uid", &w)?,
            6 => set_str(&mut m, "resourceVersion", &w)?,
            11 => insert_entry(&mut m, "labels", &w, false)?,
            12 => insert_entry(&mut m, "annotations", &w, false)?,
            13 => match &w {
                Wire::Bytes(b) => push(&mut m, "ownerReferences", owner_reference(b)?)?,
                _ => return None,
            },
            14 => push(&mut m, "finalizers", json!(string(&w)?))?,
            _ => {}
        }
    }
    Some(Value::Object(m))
}

fn name_only(buf: &[u8], name_field: u64) -> Option<Value> {
    let mut m = Map::new();
    for (n, w) in fields(buf)? {
        if n == name_field {
            m.insert("name".into(), json!(string(&w)?));
        }
    }
    Some(Value::Object(m))
}

fn object(kind: &str, raw: &[u8]) -> Option<Value> {
    let mut m = Map::new();
    for (n, w) in fields(raw)? {
        let meta = |w: &Wire| match w {
            Wire::Bytes(b) => object_meta(b),
            _ => None,
        };
        match (kind, n) {
            (_, 1) => {
                m.insert("metadata".into(), meta(&w)?);
            }
            ("Namespace", 2) => {
                let Wire::Bytes(b) = w else { return None };
                let mut fins = Vec::new();
                for (fnum, fw) in fields(b)? {
                    if fnum == 1 {
                        fins.push(json!(string(&fw)?));
                    }
                }
                m.insert("spec".into(), json!({"finalizers": fins}));
            }
            ("ConfigMap", 2) | ("Secret", 4) => {
                let field = if kind == "Secret" { "stringData" } else { "data" };
                insert_entry(&mut m, field, &w, false)?
            }
            ("ConfigMap", 3) => insert_entry(&mut m, "binaryData", &w, true)?,
            ("Secret", 2) => insert_entry(&mut m, "data", &w, true)?,
            ("Secret", 3) => set_str(&mut m, "type", &w)?,
            ("ConfigMap", 4) | ("Secret", 5) => {
                if let Wire::Varint(v) = w {
                    m.insert("immutable".into(), json!(v != 0));
                }
            }
            ("ServiceAccount", 2) => {
                let Wire::Bytes(b) = w else { return None };
                push(&mut m, "secrets", name_only(b, 3)?)?;
            }
            ("ServiceAccount", 3) => {
                let Wire::Bytes(b) = w else { return None };
                push(&mut m, "imagePullSecrets", name_only(b, 1)?)?;
            }
            ("ServiceAccount", 4) => {
                if let Wire::Varint(v) = w {
                    m.insert("automountServiceAccountToken".into(), json!(v != 0));
                }
            }
            _ => {}
        }
    }
    Some(Value::Object(m))
}

/// Decodes a protobuf body into the JSON form, for the kinds listed above.
/// Returns None when the body is not a protobuf envelope of one of those kinds.
pub fn decode(body: &[u8]) -> Option<Value> {
    let unknown = body.strip_prefix(MAGIC)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    for (n, w) in fields(unknown)? {
        match (n, &w) {
            (1, Wire::Bytes(tm)) => {
                for (tn, tw) in fields(tm)? {
                    match tn {
                        1 => api_version = string(&tw)?,
                        2 => kind = string(&tw)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(b)) => raw = Some(*b),
            _ => {}
        }
    }
    if api_version != "v1" || !matches!(kind.as_str(), "Namespace" | "ConfigMap" | "Secret" | "ServiceAccount") {
        return None;
    }
    let mut obj = object(&kind, raw.unwrap_or(&[]))?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Some(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((num << 3) | 2) as u8, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_a_configmap_envelope() {
        let entry = [field(1, b"k"), field(2, b"v")].concat();
        let meta = field(1, b"cm1");
        let raw = [field(1, &meta), field(2, &entry)].concat();
        let tm = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &tm), field(2, &raw)].concat();
        let v = decode(&body).unwrap_or_default();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1"}, "data": {"k": "v"}})
        );
        assert_eq!(base64(b"ab"), "YWI=");
        assert!(decode(b"k8s\x00\xff\xff").is_none());
    }
}
