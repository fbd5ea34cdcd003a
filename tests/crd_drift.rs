//! The committed CRD must be exactly what the Rust types generate.

use tekton_mutex::manifests::CRD_FILE;

#[test]
fn committed_crd_matches_the_rust_types() {
    let path = format!("{}/config/{CRD_FILE}", env!("CARGO_MANIFEST_DIR"));
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        committed == tekton_mutex::crd_yaml(),
        "config/{CRD_FILE} is stale: regenerate it with `cargo run --bin tekton-mutex -- crd > config/{CRD_FILE}`"
    );
}
