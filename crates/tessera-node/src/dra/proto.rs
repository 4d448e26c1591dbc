//! Generated code for the kubelet's DRA and plugin-watcher gRPC APIs (see
//! `proto/dra/`, `proto/pluginregistration/` and `build.rs`).

/// Kubelet DRA driver API `v1` (protocols.md §3.11), advertised as `v1.DRAPlugin`.
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Kubelet DRA driver API `v1beta1` (protocols.md §3.11), advertised as
/// `v1beta1.DRAPlugin`: the same messages, without `Device.share_id`.
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Kubelet plugin-watcher registration API (protocols.md §3.10).
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}
