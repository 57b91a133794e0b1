//! Discovery documents: /version, /api, /api/v1, /apis, /apis/<group>[/<version>], and the
//! aggregated form (apidiscovery.k8s.io/v2) kubectl asks for first.

use crate::registry::{Registry, ResourceDef};
use serde_json::{json, Value};

pub const GIT_VERSION: &str = "v1.37.0";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "emulationMajor": "1",
        "emulationMinor": "37",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "36",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (kube-sandbox, Rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

fn verbs(_def: &ResourceDef) -> Vec<&'static str> {
    vec!["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
}

fn resource_entries(def: &ResourceDef) -> Vec<Value> {
    let mut main = json!({
        "name": def.plural,
        "singularName": def.singular,
        "namespaced": def.namespaced,
        "kind": def.kind,
        "verbs": verbs(def),
        "storageVersionHash": "",
    });
    if !def.short_names.is_empty() {
        main["shortNames"] = json!(def.short_names);
    }
    if !def.categories.is_empty() {
        main["categories"] = json!(def.categories);
    }
    let mut out = vec![main];
    if def.status_subresource {
        out.push(json!({"name": format!("{}/status", def.plural), "singularName": "", "namespaced": def.namespaced, "kind": def.kind, "verbs": ["get", "patch", "update"]}));
    }
    out
}

pub fn core_versions(server: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]})
}

pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs = reg.group_version(group, version)?;
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let resources: Vec<Value> = defs.iter().flat_map(|d| resource_entries(d)).collect();
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

fn group_entry(group: &str, versions: &[String], preferred: &str) -> Value {
    let vs: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    json!({"name": group, "versions": vs, "preferredVersion": {"groupVersion": format!("{group}/{preferred}"), "version": preferred}})
}

pub fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> =
        reg.groups().into_iter().filter(|(g, _, _)| !g.is_empty()).map(|(g, vs, p)| group_entry(&g, &vs, &p)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(reg: &Registry, name: &str) -> Option<Value> {
    let (g, vs, p) = reg.groups().into_iter().find(|(g, _, _)| g == name && !g.is_empty())?;
    let mut v = group_entry(&g, &vs, &p);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

/// apidiscovery.k8s.io/v2 APIGroupDiscoveryList for /api (core) or /apis (named groups).
pub fn aggregated(reg: &Registry, core: bool, api_version: &str) -> Value {
    let items: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _, _)| g.is_empty() == core)
        .map(|(g, vs, _)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = reg
                        .group_version(&g, v)
                        .unwrap_or_default()
                        .iter()
                        .map(|d| {
                            let mut r = json!({
                                "resource": d.plural,
                                "responseKind": {"group": d.group, "version": d.version, "kind": d.kind},
                                "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": d.singular,
                                "verbs": verbs(d),
                            });
                            if !d.short_names.is_empty() {
                                r["shortNames"] = json!(d.short_names);
                            }
                            if !d.categories.is_empty() {
                                r["categories"] = json!(d.categories);
                            }
                            if d.status_subresource {
                                r["subresources"] = json!([{"subresource": "status", "responseKind": {"group": d.group, "version": d.version, "kind": d.kind}, "verbs": ["get", "patch", "update"]}]);
                            }
                            r
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items})
}
