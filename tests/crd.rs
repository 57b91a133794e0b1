//! The checked-in CRD must be exactly what the types generate.

#[test]
fn checked_in_crd_matches_the_types() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/lockclaims.zklock.io.yaml");
    let on_disk = std::fs::read_to_string(path).expect("crds/lockclaims.zklock.io.yaml is missing");
    let generated = zklock::api::crd_yaml();
    assert!(
        on_disk == generated,
        "{path} is out of date with src/api: run `cargo run -- crd > crds/lockclaims.zklock.io.yaml`"
    );
}
