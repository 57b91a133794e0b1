//! HTTP front end: authentication, routing of API paths, content negotiation, and turning
//! verb results into responses. Never panics on request data.

use crate::api::{self, DeleteOptions};
use crate::discovery;
use crate::error::ApiError;
use crate::openapi;
use crate::patch::PatchType;
use crate::query::Query;
use crate::registry::ResourceDef;
use crate::state::State;
use crate::table::{self, TableOptions};
use crate::watch;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use parking_lot::{Mutex, MutexGuard};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Largest request body accepted, as kube-apiserver's 3 MiB limit.
const MAX_BODY: usize = 3 * 1024 * 1024;

pub struct Shared {
    pub state: Mutex<State>,
    pub token: String,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    pub bookmark_interval: Duration,
    pub server_url: String,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

fn json_response(code: u16, v: &Value, warnings: &[String]) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(h) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            r.headers_mut().append("warning", h);
        }
    }
    r
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &e.to_status(), &[])
}

fn text(code: StatusCode, s: &'static str) -> Response {
    let mut r = Response::new(Body::from(s));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> &str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

pub async fn handle(shared: Arc<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    match path.as_str() {
        "/healthz" | "/readyz" | "/livez" => return text(StatusCode::OK, "ok"),
        "/version" | "/version/" => return json_response(200, &discovery::version(), &[]),
        _ => {}
    }
    // client-go (kubectl) never sends a bearer token over plain HTTP, so a request without
    // credentials is the loopback admin; presenting the wrong credentials is refused.
    let auth = header_str(&parts.headers, header::AUTHORIZATION);
    if !auth.is_empty() && auth.strip_prefix("Bearer ").map(str::trim) != Some(shared.token.as_str()) {
        return error_response(&ApiError::unauthorized());
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                "Request entity too large: limit is 3145728",
            ))
        }
    };
    let q = Query::parse(parts.uri.query());
    match route(&shared, &parts.method, &path, &parts.headers, &q, body) {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn wants_aggregated(accept: &str) -> Option<&'static str> {
    let first = accept.split(',').next().unwrap_or("");
    if !first.contains("as=APIGroupDiscoveryList") {
        return None;
    }
    if first.contains("v=v2beta1") {
        Some("apidiscovery.k8s.io/v2beta1")
    } else {
        Some("apidiscovery.k8s.io/v2")
    }
}

fn aggregated_response(v: &Value, api_version: &str) -> Response {
    let mut r = json_response(200, v, &[]);
    let ver = api_version.rsplit('/').next().unwrap_or("v2");
    if let Ok(h) =
        HeaderValue::from_str(&format!("application/json;g=apidiscovery.k8s.io;v={ver};as=APIGroupDiscoveryList"))
    {
        r.headers_mut().insert(header::CONTENT_TYPE, h);
    }
    r
}

fn route(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    q: &Query,
    body: Bytes,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let accept = header_str(headers, header::ACCEPT);
    let discovery_get = |r: Result<Response, ApiError>| {
        if *method == Method::GET {
            r
        } else {
            Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"))
        }
    };
    match segs.as_slice() {
        ["api"] => {
            let st = shared.lock();
            discovery_get(Ok(match wants_aggregated(accept) {
                Some(av) => aggregated_response(&discovery::aggregated(&st.registry, true, av), av),
                None => json_response(200, &discovery::core_versions(&shared.server_url), &[]),
            }))
        }
        ["apis"] => {
            let st = shared.lock();
            discovery_get(Ok(match wants_aggregated(accept) {
                Some(av) => aggregated_response(&discovery::aggregated(&st.registry, false, av), av),
                None => json_response(200, &discovery::group_list(&st.registry), &[]),
            }))
        }
        ["api", "v1"] => {
            let st = shared.lock();
            let v = discovery::resource_list(&st.registry, "", "v1").ok_or_else(ApiError::no_route)?;
            discovery_get(Ok(json_response(200, &v, &[])))
        }
        ["apis", g] => {
            let st = shared.lock();
            let v = discovery::group(&st.registry, g).ok_or_else(ApiError::no_route)?;
            discovery_get(Ok(json_response(200, &v, &[])))
        }
        ["apis", g, v] => {
            let st = shared.lock();
            let doc = discovery::resource_list(&st.registry, g, v).ok_or_else(ApiError::no_route)?;
            discovery_get(Ok(json_response(200, &doc, &[])))
        }
        ["openapi", "v2"] if accept.contains("protobuf") => discovery_get(Ok(openapi::v2_protobuf())),
        ["openapi", "v2"] => discovery_get(Ok(json_response(200, &openapi::v2(), &[]))),
        ["openapi", "v3"] => {
            let st = shared.lock();
            discovery_get(Ok(json_response(200, &openapi::v3_root(&st.registry), &[])))
        }
        ["openapi", "v3", rest @ ..] => {
            let st = shared.lock();
            let doc = openapi::v3_group_version(&st.registry, rest).ok_or_else(ApiError::no_route)?;
            discovery_get(Ok(json_response(200, &doc, &[])))
        }
        ["api", "v1", rest @ ..] => resource(shared, method, "", "v1", rest, headers, q, body),
        ["apis", g, v, rest @ ..] => resource(shared, method, g, v, rest, headers, q, body),
        _ => Err(ApiError::no_route()),
    }
}

#[derive(Clone, Copy)]
enum Target<'a> {
    Collection,
    Item(&'a str),
    Sub(&'a str, &'a str),
}

fn lookup(st: &State, g: &str, v: &str, plural: &str) -> Option<Arc<ResourceDef>> {
    st.registry.lookup(g, v, plural)
}

/// Splits `[namespaces/<ns>/]<plural>[/<name>[/<sub>]]`.
fn resolve<'a>(
    st: &State,
    g: &str,
    v: &str,
    rest: &[&'a str],
) -> Result<(Arc<ResourceDef>, Option<&'a str>, Target<'a>), ApiError> {
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] if lookup(st, g, v, plural).is_some_and(|d| d.namespaced) => {
            (Some(*ns), {
                let mut r = vec![*plural];
                r.extend_from_slice(tail);
                r
            })
        }
        other => (None, other.to_vec()),
    };
    let def = rest.first().and_then(|p| lookup(st, g, v, p)).ok_or_else(ApiError::no_route)?;
    if ns.is_none() && def.namespaced && rest.len() > 1 {
        return Err(ApiError::no_route());
    }
    let target = match rest.as_slice() {
        [_] => Target::Collection,
        [_, name] => Target::Item(name),
        [_, name, sub] => Target::Sub(name, sub),
        _ => return Err(ApiError::no_route()),
    };
    Ok((def, ns, target))
}

fn parse_body(def: &ResourceDef, headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = header_str(headers, header::CONTENT_TYPE);
    let parsed: Result<Value, String> = if ct.starts_with("application/yaml") || ct.starts_with("application/x-yaml") {
        serde_yaml::from_slice::<Value>(body).map_err(|e| e.to_string())
    } else if ct.starts_with("application/vnd.kubernetes.protobuf") {
        return crate::protobuf::decode(body).ok_or_else(|| {
            ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (kube-sandbox decodes protobuf only for v1 Namespace, ConfigMap, Secret and ServiceAccount, not {})",
                def.kind
            ))
        });
    } else if ct.starts_with("application/cbor") {
        return Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (kube-sandbox does not decode {ct})"
        )));
    } else {
        serde_json::from_slice::<Value>(body).map_err(|e| e.to_string())
    };
    let v = parsed.map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {e}",
            def.kind
        ))
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: expected a JSON object",
            def.kind
        )));
    }
    Ok(v)
}

#[allow(clippy::too_many_arguments)]
fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    g: &str,
    v: &str,
    rest: &[&str],
    headers: &HeaderMap,
    q: &Query,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut st = shared.lock();
    let (def, ns, target) = resolve(&st, g, v, rest)?;
    let accept = header_str(headers, header::ACCEPT);
    let table = if table::wants_table(accept) { Some(TableOptions::from_query(q)) } else { None };
    if let Some(ns) = ns {
        if !crate::meta::validate_path_segment(ns, "metadata.namespace").is_empty() {
            return Err(ApiError::no_route());
        }
    }
    let is_sub = matches!(target, Target::Sub(..));
    match (target, method.clone()) {
        (Target::Collection, Method::GET) if q.is_true("watch") => {
            let p = watch::params(&def, q, ns, table, shared.bookmark_interval)?;
            let rx = watch::start(&st, def, p, shared.shutdown.clone())?;
            drop(st);
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
            });
            let mut r = Response::new(Body::from_stream(stream));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            Ok(r)
        }
        (Target::Collection, Method::GET) => {
            let (items, meta) = api::list(&st, &def, ns, q)?;
            let v = match table {
                Some(t) => table::table(&def, &items, &t, Some(meta)),
                None => api::list_object(&def, items, meta),
            };
            Ok(json_response(200, &v, &[]))
        }
        (Target::Collection, Method::POST) => {
            if def.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ));
            }
            let obj = parse_body(&def, headers, &body)?;
            let w = api::create(&mut st, &def, ns, obj, q)?;
            Ok(json_response(w.code, &w.object, &w.warnings))
        }
        (Target::Collection, Method::DELETE) => {
            if def.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ));
            }
            let opts = DeleteOptions::parse(&body, q)?;
            let v = api::delete_collection(&mut st, &def, ns, q, &opts)?;
            Ok(json_response(200, &v, &[]))
        }
        (Target::Item(name), m) | (Target::Sub(name, "status"), m) => {
            let status = is_sub;
            if status && !def.status_subresource {
                return Err(ApiError::no_route());
            }
            let errs = crate::meta::validate_path_segment(name, "metadata.name");
            if !errs.is_empty() {
                return Err(ApiError::invalid(&def.group, &def.kind, name, errs));
            }
            match m {
                Method::GET => {
                    let obj = api::get(&st, &def, ns, name)?;
                    let v = match table {
                        Some(t) => table::table(
                            &def,
                            std::slice::from_ref(&obj),
                            &t,
                            Some(
                                serde_json::json!({"resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or_default()}),
                            ),
                        ),
                        None => obj,
                    };
                    Ok(json_response(200, &v, &[]))
                }
                Method::PUT => {
                    let obj = parse_body(&def, headers, &body)?;
                    let w = api::update(&mut st, &def, ns, name, obj, status, q)?;
                    Ok(json_response(w.code, &w.object, &w.warnings))
                }
                Method::PATCH => {
                    let ct = header_str(headers, header::CONTENT_TYPE);
                    let pt = PatchType::from_content_type(ct).ok_or_else(|| {
                        ApiError::unsupported_media_type(format!(
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml{}",
                            if def.is_custom() { "" } else { ", application/strategic-merge-patch+json" }
                        ))
                    })?;
                    let w = api::patch(&mut st, &def, ns, name, pt, &body, status, q)?;
                    Ok(json_response(w.code, &w.object, &w.warnings))
                }
                Method::DELETE if !status => {
                    let opts = DeleteOptions::parse(&body, q)?;
                    let (code, v) = api::delete(&mut st, &def, ns, name, &opts)?;
                    Ok(json_response(code, &v, &[]))
                }
                _ => {
                    Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"))
                }
            }
        }
        (Target::Sub(..), _) => Err(ApiError::no_route()),
        (Target::Collection, _) => {
            Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"))
        }
    }
}
