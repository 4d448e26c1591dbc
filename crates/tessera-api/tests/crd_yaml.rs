//! The CRD in the Helm chart is generated from the Rust type (with only the
//! formats an API server knows, `tessera_api::crd`); this test keeps them equal.
//! Regenerate with `TESSERA_BLESS=1 cargo test -p tessera-api --test crd_yaml`.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tessera_api::crd::crd_of;
use tessera_api::{GpuNode, GpuQueue};

#[test]
fn chart_crds_match_the_types() {
    check("GpuNode", "gpunodes.tessera.io.yaml", crd_of::<GpuNode>());
    check(
        "GpuQueue",
        "gpuqueues.tessera.io.yaml",
        crd_of::<GpuQueue>(),
    );
}

fn check(kind: &str, file: &str, crd: CustomResourceDefinition) {
    let header = format!(
        "# Generated from the {kind} type in crates/tessera-api; do not edit.\n\
         # Regenerate: TESSERA_BLESS=1 cargo test -p tessera-api --test crd_yaml\n"
    );
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/tessera/crds")
        .join(file);
    let yaml = serde_saphyr::to_string(&crd).expect("the CRD serialises");
    let want = format!("{header}{yaml}");
    if std::env::var("TESSERA_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (regenerate with TESSERA_BLESS=1)", path.display()));
    assert!(
        have == want,
        "{} is stale: regenerate with TESSERA_BLESS=1 cargo test -p tessera-api --test crd_yaml",
        path.display()
    );
    // And it reads back as the same object.
    let back: serde_json::Value = serde_saphyr::from_str(&have).expect("valid YAML");
    assert_eq!(back, serde_json::to_value(&crd).unwrap());
}

/// The hand-written example in `deploy/examples/` is a valid GpuNode.
#[test]
fn example_gpunode_parses() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/gpunode.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let gn: GpuNode =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(gn.spec.node_name, gn.metadata.name.clone().unwrap());
    assert_eq!(gn.spec.gpus.len(), 2);
    assert_eq!(gn.spec.gpus[1].links[0].kind, tessera_api::LinkKind::NVLink);
    assert_eq!(gn.spec.gpus[0].memory_mib, 81_920);
}
