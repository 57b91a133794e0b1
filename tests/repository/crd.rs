//! The checked-in CRDs must be exactly what the types generate.

#[test]
fn checked_in_crds_match_the_types() {
    for (file, generated) in zklock::api::crds() {
        let path = format!("{}/crds/{file}", env!("CARGO_MANIFEST_DIR"));
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(on_disk == generated, "{path} is out of date with crates/api/src: run `cargo run -- crd --dir crds`");
    }
}
