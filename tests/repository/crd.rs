//! The checked-in CRDs must be exactly what the types generate.

#[test]
fn checked_in_crds_match_the_types() {
    for (file, generated) in zklock::api::crds() {
        let path = format!("{}/crds/{file}", env!("CARGO_MANIFEST_DIR"));
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(on_disk == generated, "{path} is out of date with crates/api/src: run `cargo run -- crd --dir crds`");
    }
}

#[test]
fn the_cluster_lock_example_reads_as_the_types_and_its_claim_is_valid() {
    let path = format!("{}/examples/manifests/cluster-lock.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut kinds = vec![];
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc).expect("a YAML document");
        match value["kind"].as_str() {
            Some("ClusterLock") => {
                let lock: zklock::api::ClusterLock = serde_json::from_value(value).expect("a ClusterLock");
                assert!(lock.spec.namespace_selector.is_some(), "the example admits some namespaces");
            }
            Some("LockClaim") => {
                let claim: zklock::api::LockClaim = serde_json::from_value(value).expect("a LockClaim");
                let spec = zklock::api::validate(&claim).expect("a valid claim");
                assert_eq!(spec.cluster_locks().collect::<Vec<_>>(), ["payments-db-migration"]);
            }
            other => panic!("{path}: unexpected kind {other:?}"),
        }
        kinds.push(());
    }
    assert_eq!(kinds.len(), 2, "{path}: a ClusterLock and a claim");
}

/// docs/user-guide.md, "Fencing enforced by the API server": the example's Lock enforces
/// fencing, and its object is guarded by that very Lock, with a token, under the names the
/// admission policies read.
#[test]
fn the_fencing_example_guards_its_object_by_its_lock() {
    use zklock::api::fencing_policy::{FENCED_BY, FENCING_TOKEN};
    let path = format!("{}/examples/manifests/fencing.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (mut lock, mut guarded) = (None, None);
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc).expect("a YAML document");
        match value["kind"].as_str() {
            Some("Lock") => lock = Some(serde_json::from_value::<zklock::api::Lock>(value).expect("a Lock")),
            Some("ConfigMap") => {
                guarded =
                    Some(serde_json::from_value::<k8s_openapi::api::core::v1::ConfigMap>(value).expect("a ConfigMap"))
            }
            other => panic!("{path}: unexpected kind {other:?}"),
        }
    }
    let (lock, guarded) = (lock.expect("a Lock"), guarded.expect("a guarded object"));
    assert_eq!(lock.spec.fencing, zklock::api::Fencing::Enforced, "{path}: the Lock enforces fencing");
    let meta = &guarded.metadata;
    assert_eq!(
        meta.labels.as_ref().and_then(|l| l.get(FENCED_BY)),
        lock.metadata.name.as_ref(),
        "{path}: guarded by it"
    );
    assert_eq!(meta.namespace, lock.metadata.namespace, "{path}: a Lock guards objects of its own namespace");
    let token = meta.annotations.as_ref().and_then(|a| a.get(FENCING_TOKEN)).expect("a token");
    assert!(token.parse::<u64>().is_ok(), "{path}: a token is a number: {token}");
    let guide = std::fs::read_to_string(format!("{}/docs/user-guide.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    for line in ["spec:\n  fencing: Enforced", &format!("labels: {{ {FENCED_BY}: db-schema }}")] {
        assert!(
            guide.contains(line) && text.contains(line.trim_end_matches(" }")),
            "the guide shows the example: {line}"
        );
    }
}
