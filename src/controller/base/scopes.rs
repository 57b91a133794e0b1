//! The scopes the operator serves: one per watched namespace (`--watch-namespace`), or one for
//! all namespaces. Every per-scope list (stores, triggers, watches) is indexed the same way.

use k8s_openapi::NamespaceResourceScope;
use kube::Api;

#[derive(Clone, Debug, Default)]
pub struct Scopes {
    /// Empty: one scope for all namespaces.
    namespaces: Vec<String>,
}

impl Scopes {
    pub fn new(namespaces: Vec<String>) -> Self {
        Scopes { namespaces }
    }

    /// The namespaces served; empty = all.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// How many scopes there are.
    pub fn count(&self) -> usize {
        self.namespaces.len().max(1)
    }

    /// The scope that serves objects of `namespace`; none for a namespace not served.
    pub fn of(&self, namespace: Option<&str>) -> Option<usize> {
        if self.namespaces.is_empty() {
            Some(0)
        } else {
            self.namespaces.iter().position(|n| Some(n.as_str()) == namespace)
        }
    }

    /// The namespace scope `scope` is confined to; none for all namespaces.
    pub fn namespace(&self, scope: usize) -> Option<&str> {
        self.namespaces.get(scope).map(String::as_str)
    }

    /// One `Api` per scope, through `client` (the request client or the watch client).
    pub fn apis<K>(&self, client: &kube::Client) -> Vec<Api<K>>
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        if self.namespaces.is_empty() {
            vec![Api::all(client.clone())]
        } else {
            self.namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_maps_to_its_scope_and_all_namespaces_to_the_one() {
        let all = Scopes::new(vec![]);
        assert_eq!((all.count(), all.of(Some("a")), all.of(None), all.namespace(0)), (1, Some(0), Some(0), None));
        let two = Scopes::new(vec!["a".into(), "b".into()]);
        assert_eq!((two.count(), two.of(Some("b")), two.of(Some("c")), two.of(None)), (2, Some(1), None, None));
        assert_eq!(two.namespace(1), Some("b"));
    }
}
