//! Generated code for the kubelet gRPC APIs (see `proto/` and `build.rs`).

/// Kubelet device plugin API `v1beta1` (protocols.md §2).
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// Kubelet PodResources API `v1` (protocols.md §2.7).
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod podresources {
    tonic::include_proto!("v1");
}
