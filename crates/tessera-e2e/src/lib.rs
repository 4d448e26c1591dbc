//! Tessera end to end on real control planes (issue 38): etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager from the folder `TESSERA_E2E_BIN`
//! names, fake GPU nodes with a kubelet stand-in, and Tessera's own binaries
//! run as the chart's service accounts. Without the variable every scenario
//! prints that it did not run. docs/kubernetes.md, "End-to-end suite".

pub mod claims;
pub mod cluster;
pub mod dra;
pub mod fill;
pub mod kubelet;
pub mod plane;
pub mod service;
pub mod stock;
pub mod tessera;
pub mod webhook;

/// Scenarios of one test binary run one at a time: each starts its own
/// control plane, and two at once on a small machine only measure each other.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
