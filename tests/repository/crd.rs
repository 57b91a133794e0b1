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
