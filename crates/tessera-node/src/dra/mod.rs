//! The node agent as a DRA kubelet plugin (driver `gpu.tessera.io`,
//! protocols.md §3).
//!
//! With Dynamic Resource Allocation the kubelet does not count tokens: the
//! kube-scheduler allocates named devices from the `ResourceSlice`s a driver
//! publishes, records them in the `ResourceClaim`, and the kubelet asks the
//! driver on the node to prepare exactly those devices before the pod starts.
//! This module is that driver:
//!
//! - [`registration`]: the plugin-watcher `Registration` service on
//!   `<registry dir>/gpu.tessera.io-reg.sock`; the kubelet finds the socket,
//!   calls `GetInfo` and learns where the DRA service is and which versions of
//!   it are served.
//! - [`service`]: `NodePrepareResources` / `NodeUnprepareResources`, served as
//!   both `v1.DRAPlugin` and `v1beta1.DRAPlugin` on
//!   `<plugins dir>/gpu.tessera.io/dra.sock`.
//! - [`server`]: binds both sockets and serves them until shutdown. The
//!   kubelet's plugin-watcher client may send a request with no `:authority`
//!   at all; the server routes on the path alone and accepts it (tested).
//! - [`prepare`]: reads each claim's allocation and writes a CDI spec for
//!   exactly its `gpu.tessera.io` devices on this node; unprepare removes it.
//!   [`plan`] is its pure half. On the way it creates an allocated MIG placement's instance ([`mig`],
//!   [`placement`]) and starts a share's MPS daemon ([`share`]); [`records`]
//!   keeps what it set up for which claim across restarts, so unprepare undoes
//!   exactly that. [`occupancy`] refuses a claim whose devices another
//!   prepared claim holds beyond what they allow (two allocators, one device).
//! - [`sweep`]: releases, as their unprepare would, prepared claims the API
//!   server says are gone (deleted, recreated, deallocated) on two sweeps a
//!   period apart: the kubelet's unprepare may never come.
//! - [`apiserver`]: reads claims and publishes the slices (server-side apply)
//!   in the first `resource.k8s.io` version the server serves (v1, v1beta2,
//!   v1beta1).
//! - [`slice`]: the node's `ResourceSlice`s (`resource.k8s.io/v1`), a pure
//!   function of the GPU inventory.
//!
//! - [`driver`]: all of it as one task, what `tessera node-agent --dra` runs.
//!
//! The device plugin and the DRA driver must not hand out the same GPUs: a
//! node is moved from one to the other as a whole (docs/kubernetes.md, "Dynamic
//! Resource Allocation").

pub mod apiserver;
pub mod driver;
pub mod handover;
pub mod mig;
pub mod occupancy;
pub mod placement;
pub mod plan;
pub mod prepare;
pub mod probe;
pub mod proto;
pub mod records;
pub mod registration;
pub mod server;
pub mod service;
pub mod share;
pub mod slice;
pub mod sweep;

use std::path::PathBuf;

/// The DRA driver name: the `driver` of every slice, claim result and device class.
pub const DRIVER_NAME: &str = "gpu.tessera.io";
/// Where the kubelet's plugin watcher looks for registration sockets.
pub const REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Where DRA drivers keep their service sockets, one directory per driver.
pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// `PluginInfo.type` of a DRA driver.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service names advertised in `PluginInfo.supported_versions`, preferred
/// first: the kubelet keeps the first one it supports.
pub const SUPPORTED_SERVICES: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// Where the driver's sockets go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraConfig {
    /// The plugin watcher's directory ([`REGISTRY_DIR`]).
    pub registry_dir: PathBuf,
    /// The driver's own directory (`<PLUGINS_DIR>/gpu.tessera.io`).
    pub plugin_dir: PathBuf,
}

impl Default for DraConfig {
    fn default() -> Self {
        DraConfig {
            registry_dir: REGISTRY_DIR.into(),
            plugin_dir: PathBuf::from(PLUGINS_DIR).join(DRIVER_NAME),
        }
    }
}

impl DraConfig {
    /// `<registry dir>/gpu.tessera.io-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER_NAME}-reg.sock"))
    }

    /// `<plugin dir>/dra.sock`, the endpoint `GetInfo` answers.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }
}
