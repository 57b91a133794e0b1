//! The resource types the server knows: the built-in kinds and whatever CRDs define.

use crate::meta::NameRule;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Storage identity: all versions of one resource share objects, as in etcd.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    pub group: String,
    pub resource: String,
}

impl GroupResource {
    pub fn new(group: &str, resource: &str) -> Self {
        GroupResource { group: group.to_string(), resource: resource.to_string() }
    }
}

#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// One served (group, version, resource).
#[derive(Debug, Clone)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status_subresource: bool,
    /// Whether metadata.generation is maintained (CRs, pods, CRDs; not configmaps).
    pub generation: bool,
    /// PUT without metadata.resourceVersion allowed (false for custom resources).
    pub unconditional_update: bool,
    /// PUT on a missing object creates it (events, leases).
    pub create_on_update: bool,
    /// Successful DELETE returns the object rather than a Status.
    pub return_deleted_object: bool,
    pub name_rule: NameRule,
    /// Field selectors beyond metadata.name / metadata.namespace: label → JSON pointer.
    pub selectable_fields: Vec<(String, String)>,
    pub schema: Option<Value>,
    pub printer_columns: Vec<PrinterColumn>,
    /// Set for custom resources: the owning CRD's name.
    pub crd: Option<String>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    /// Where objects live: events.k8s.io/v1 events are stored as core/v1 events, as in
    /// kube-apiserver, so both views list the same objects.
    pub fn group_resource(&self) -> GroupResource {
        if self.group == "events.k8s.io" && self.plural == "events" {
            return GroupResource::new("", "events");
        }
        GroupResource::new(&self.group, &self.plural)
    }
    pub fn is_custom(&self) -> bool {
        self.crd.is_some()
    }
}

fn builtin(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> ResourceDef {
    ResourceDef {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: vec![],
        categories: vec![],
        status_subresource: false,
        generation: false,
        unconditional_update: true,
        create_on_update: false,
        return_deleted_object: false,
        name_rule: NameRule::Subdomain,
        selectable_fields: vec![],
        schema: None,
        printer_columns: vec![],
        crd: None,
    }
}

fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

pub fn builtins() -> Vec<ResourceDef> {
    let mut ns = builtin("", "v1", "namespaces", "Namespace", false);
    ns.short_names = vec!["ns".into()];
    ns.status_subresource = true;
    ns.return_deleted_object = true;
    ns.name_rule = NameRule::Label;
    ns.selectable_fields = fields(&[("status.phase", "/status/phase")]);

    let mut pods = builtin("", "v1", "pods", "Pod", true);
    pods.short_names = vec!["po".into()];
    pods.categories = vec!["all".into()];
    pods.status_subresource = true;
    pods.generation = true;
    pods.return_deleted_object = true;
    pods.selectable_fields = fields(&[
        ("spec.nodeName", "/spec/nodeName"),
        ("spec.restartPolicy", "/spec/restartPolicy"),
        ("spec.schedulerName", "/spec/schedulerName"),
        ("spec.serviceAccountName", "/spec/serviceAccountName"),
        ("spec.hostNetwork", "/spec/hostNetwork"),
        ("status.phase", "/status/phase"),
        ("status.podIP", "/status/podIP"),
        ("status.nominatedNodeName", "/status/nominatedNodeName"),
    ]);

    let mut events = builtin("", "v1", "events", "Event", true);
    events.short_names = vec!["ev".into()];
    events.create_on_update = true;
    events.name_rule = NameRule::PathSegment;
    events.selectable_fields = fields(&[
        ("involvedObject.kind", "/involvedObject/kind"),
        ("involvedObject.namespace", "/involvedObject/namespace"),
        ("involvedObject.name", "/involvedObject/name"),
        ("involvedObject.uid", "/involvedObject/uid"),
        ("involvedObject.apiVersion", "/involvedObject/apiVersion"),
        ("involvedObject.resourceVersion", "/involvedObject/resourceVersion"),
        ("involvedObject.fieldPath", "/involvedObject/fieldPath"),
        ("reason", "/reason"),
        ("reportingComponent", "/reportingComponent"),
        ("source", "/source/component"),
        ("type", "/type"),
    ]);

    // events.k8s.io/v1 is another view of the same stored events (see convert.rs).
    let mut events2 = builtin("events.k8s.io", "v1", "events", "Event", true);
    events2.short_names = vec!["ev".into()];
    events2.create_on_update = true;
    events2.name_rule = NameRule::PathSegment;
    events2.selectable_fields = fields(&[
        ("regarding.kind", "/involvedObject/kind"),
        ("regarding.namespace", "/involvedObject/namespace"),
        ("regarding.name", "/involvedObject/name"),
        ("regarding.uid", "/involvedObject/uid"),
        ("regarding.apiVersion", "/involvedObject/apiVersion"),
        ("regarding.resourceVersion", "/involvedObject/resourceVersion"),
        ("regarding.fieldPath", "/involvedObject/fieldPath"),
        ("reason", "/reason"),
        ("reportingController", "/reportingComponent"),
        ("type", "/type"),
    ]);

    let mut secrets = builtin("", "v1", "secrets", "Secret", true);
    secrets.selectable_fields = fields(&[("type", "/type")]);
    let mut cms = builtin("", "v1", "configmaps", "ConfigMap", true);
    cms.short_names = vec!["cm".into()];
    let mut sas = builtin("", "v1", "serviceaccounts", "ServiceAccount", true);
    sas.short_names = vec!["sa".into()];

    let mut leases = builtin("coordination.k8s.io", "v1", "leases", "Lease", true);
    leases.create_on_update = true;

    let mut crds =
        builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", false);
    crds.short_names = vec!["crd".into(), "crds".into()];
    crds.categories = vec!["api-extensions".into()];
    crds.status_subresource = true;
    crds.generation = true;

    vec![ns, pods, events, secrets, cms, sas, events2, leases, crds]
}

/// Group-versions in discovery order, each with its resources.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    /// (group, version) → plural → def. BTreeMap keeps discovery output stable.
    served: BTreeMap<(String, String), BTreeMap<String, Arc<ResourceDef>>>,
    /// Group order for /apis: built-ins first, CRD groups after, as registered.
    group_order: Vec<String>,
    /// Preferred (storage) version per group.
    preferred: BTreeMap<String, String>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut r = Registry::default();
        for def in builtins() {
            r.add(def, true);
        }
        r
    }

    pub fn add(&mut self, def: ResourceDef, preferred: bool) {
        if !self.group_order.contains(&def.group) {
            self.group_order.push(def.group.clone());
        }
        if preferred || !self.preferred.contains_key(&def.group) {
            self.preferred.insert(def.group.clone(), def.version.clone());
        }
        self.served
            .entry((def.group.clone(), def.version.clone()))
            .or_default()
            .insert(def.plural.clone(), Arc::new(def));
    }

    /// Drops everything a CRD contributed.
    pub fn remove_crd(&mut self, crd_name: &str) {
        for resources in self.served.values_mut() {
            resources.retain(|_, d| d.crd.as_deref() != Some(crd_name));
        }
        self.served.retain(|_, r| !r.is_empty());
        let live: Vec<String> = self.served.keys().map(|(g, _)| g.clone()).collect();
        self.group_order.retain(|g| live.contains(g));
        self.preferred.retain(|g, _| live.contains(g));
        for (g, v) in self.preferred.clone() {
            if !self.served.contains_key(&(g.clone(), v)) {
                if let Some((_, v2)) = self.served.keys().find(|(g2, _)| *g2 == g) {
                    self.preferred.insert(g, v2.clone());
                }
            }
        }
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.served.get(&(group.to_string(), version.to_string()))?.get(plural).cloned()
    }

    pub fn group_version(&self, group: &str, version: &str) -> Option<Vec<Arc<ResourceDef>>> {
        self.served.get(&(group.to_string(), version.to_string())).map(|m| m.values().cloned().collect())
    }

    pub fn groups(&self) -> Vec<(String, Vec<String>, String)> {
        self.group_order
            .iter()
            .map(|g| {
                let versions: Vec<String> =
                    self.served.keys().filter(|(g2, _)| g2 == g).map(|(_, v)| v.clone()).collect();
                let preferred =
                    self.preferred.get(g).cloned().or_else(|| versions.first().cloned()).unwrap_or_default();
                // The preferred version is listed first, as kube-apiserver orders by priority.
                let mut ordered = vec![preferred.clone()];
                ordered.extend(versions.into_iter().filter(|v| *v != preferred));
                (g.clone(), ordered, preferred)
            })
            .collect()
    }

    /// The preferred-version definition for a stored resource (used by GC and namespace cleanup).
    pub fn any_version(&self, gr: &GroupResource) -> Option<Arc<ResourceDef>> {
        if let Some(v) = self.preferred.get(&gr.group) {
            if let Some(d) = self.lookup(&gr.group, v, &gr.resource) {
                return Some(d);
            }
        }
        self.served.iter().filter(|((g, _), _)| *g == gr.group).find_map(|(_, m)| m.get(&gr.resource).cloned())
    }
}
