//! Just enough OpenAPI for kubectl: v3 documents whose PATCH operations advertise the
//! `fieldValidation` parameter (so kubectl lets the server validate, as against a modern
//! kube-apiserver), CRD schemas for `kubectl explain`, and an empty v2 document.

use crate::registry::{Registry, ResourceDef};
use serde_json::{json, Map, Value};

/// kubectl reads /openapi/v2 only as protobuf (gnostic's openapi_v2.Document). An empty
/// document makes its client-side validation skip kinds it has no schema for, so an unserved
/// kind ends in "no matches for kind", as on a cluster without that API.
pub fn v2_protobuf() -> axum::response::Response {
    // Document { swagger (field 1) = "2.0" }
    let body: Vec<u8> = vec![0x0a, 0x03, b'2', b'.', b'0'];
    let mut r = axum::response::Response::new(axum::body::Body::from(body));
    r.headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/octet-stream"));
    r
}

pub fn v2() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": crate::discovery::GIT_VERSION}, "paths": {}, "definitions": {}})
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

pub fn v3_root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, versions, _) in reg.groups() {
        for v in versions {
            let p = gv_path(&g, &v);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", hash_of(reg, &g, &v))}),
            );
        }
    }
    json!({"paths": paths})
}

/// Changes whenever the served resources of the group-version change, so clients re-fetch.
fn hash_of(reg: &Registry, g: &str, v: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for d in reg.group_version(g, v).unwrap_or_default() {
        let s = format!("{}{}{:?}", d.plural, d.kind, d.schema);
        for b in s.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016X}")
}

fn schema_name(d: &ResourceDef) -> String {
    let group_rev: Vec<&str> = d.group.split('.').rev().collect();
    if d.group.is_empty() {
        format!("io.k8s.api.core.{}.{}", d.version, d.kind)
    } else {
        format!("{}.{}.{}", group_rev.join("."), d.version, d.kind)
    }
}

fn operation(d: &ResourceDef, action: &str, params: &[&str]) -> Value {
    let gvk = json!({"group": d.group, "version": d.version, "kind": d.kind});
    let parameters: Vec<Value> = params
        .iter()
        .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    json!({
        "operationId": format!("{action}{}", d.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
        "parameters": parameters,
        "responses": {"200": {"description": "OK"}},
    })
}

pub fn v3_group_version(reg: &Registry, rest: &[&str]) -> Option<Value> {
    let (g, v) = match rest {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return None,
    };
    let defs = reg.group_version(g, v)?;
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for d in &defs {
        let base = if g.is_empty() { format!("/api/{v}") } else { format!("/apis/{g}/{v}") };
        let coll = if d.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", d.plural)
        } else {
            format!("{base}/{}", d.plural)
        };
        let write = ["dryRun", "fieldManager", "fieldValidation", "pretty"];
        paths.insert(coll.clone(), json!({
            "get": operation(d, "list", &["labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "watch"]),
            "post": operation(d, "post", &write),
        }));
        paths.insert(
            format!("{coll}/{{name}}"),
            json!({
                "get": operation(d, "get", &["pretty"]),
                "put": operation(d, "put", &write),
                "patch": operation(d, "patch", &["dryRun", "fieldManager", "fieldValidation", "force", "pretty"]),
                "delete": operation(d, "delete", &["dryRun", "gracePeriodSeconds", "propagationPolicy"]),
            }),
        );
        if let Some(s) = &d.schema {
            let mut s = s.clone();
            s["x-kubernetes-group-version-kind"] = json!([{"group": d.group, "version": d.version, "kind": d.kind}]);
            schemas.insert(schema_name(d), s);
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": crate::discovery::GIT_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
