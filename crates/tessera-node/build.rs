//! Compiles the kubelet gRPC APIs under `proto/` with protox (pure Rust, no
//! `protoc` needed) and generates tonic clients and servers for all of them:
//! the device plugin, PodResources, the plugin-watcher registration and the DRA
//! driver service (v1 and v1beta1).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        root.join("deviceplugin/v1beta1/api.proto"),
        root.join("podresources/v1/api.proto"),
        root.join("pluginregistration/v1/api.proto"),
        root.join("dra/v1/api.proto"),
        root.join("dra/v1beta1/api.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
