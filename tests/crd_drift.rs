//! The committed CRD must be exactly what the Rust types generate.

#[test]
fn committed_crd_matches_the_rust_types() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/crd.yaml")).unwrap();
    assert!(
        committed == tekton_mutex::crd_yaml(),
        "config/crd.yaml is stale: regenerate it with `cargo run --bin tekton-mutex -- crd > config/crd.yaml`"
    );
}
