//! Compiles Karmada's scheduler-estimator API (`proto/karmada`, taken from Karmada
//! v1.18.2: see its README) with protox (pure Rust, no `protoc`) and generates the
//! tonic server and client.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto/karmada");
    let files = [
        root.join("pkg/estimator/pb/estimator.proto"),
        root.join("pkg/estimator/service/service.proto"),
        root.join("k8s.io/api/core/v1/generated.proto"),
        root.join("k8s.io/apimachinery/pkg/api/resource/generated.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .include_file("karmada.rs")
        .compile_fds(fds)?;
    Ok(())
}
