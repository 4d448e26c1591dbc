//! GPU backends: where the agent learns what GPUs the node has and how they are doing.
//!
//! [`GpuBackend`] is an open set (a trait): [`nvml::Nvml`] talks to the real driver,
//! [`fake::Fake`] is described by a YAML file and lets tests inject processes,
//! utilisation, XID events and recovery. The trait is synchronous because NVML is;
//! the agent calls it from blocking tasks.

pub mod fake;
pub mod nvml;

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Static facts about one physical GPU, read at discovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name as NVML reports it, e.g. `NVIDIA A100-SXM4-80GB`.
    pub product: String,
    /// Canonical Tessera model name (`A100-80GB`) when the catalog knows the product.
    pub model: Option<String>,
    /// Total framebuffer in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors, when NVML tells.
    pub sm_count: Option<u32>,
    /// NUMA node the GPU is attached to, when known.
    pub numa_node: Option<u32>,
    /// PCI bus id, e.g. `00000000:07:00.0`.
    pub pci_bus_id: String,
    /// CUDA compute capability `(major, minor)`, when known.
    pub compute_capability: Option<(u32, u32)>,
    /// How this GPU reaches each other GPU of the node.
    pub links: Vec<PeerLink>,
    /// Whether MIG mode is enabled now.
    pub mig_enabled: bool,
    /// Whether the GPU supports MIG at all.
    pub mig_capable: bool,
    /// The MIG devices that exist now (empty without MIG).
    pub mig_instances: Vec<MigInstance>,
}

/// The connection between two GPUs, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkKind {
    /// Direct NVLink (the count of links is in [`PeerLink::nvlinks`]).
    Nvlink,
    /// Behind the same PCIe switch.
    PcieSwitch,
    /// Same CPU socket / NUMA node, through the host bridge.
    SameSocket,
    /// Across the CPU interconnect.
    CrossSocket,
}

impl LinkKind {
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Nvlink => "nvlink",
            LinkKind::PcieSwitch => "pcie-switch",
            LinkKind::SameSocket => "same-socket",
            LinkKind::CrossSocket => "cross-socket",
        }
    }
}

/// One edge of the node's GPU topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerLink {
    pub peer_uuid: String,
    pub kind: LinkKind,
    /// Number of NVLinks to the peer (0 unless `kind` is NVLink).
    #[serde(default)]
    pub nvlinks: u32,
}

/// One MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// `MIG-…` UUID.
    pub uuid: String,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the placement, when known.
    pub start: Option<u8>,
    pub memory_mib: u64,
    pub sm_count: Option<u32>,
}

/// ECC error counters. `None` where the GPU has no ECC or NVML does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EccCounters {
    pub sbe_volatile: Option<u64>,
    pub dbe_volatile: Option<u64>,
    pub sbe_aggregate: Option<u64>,
    pub dbe_aggregate: Option<u64>,
}

/// A process holding memory on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory_mib: u64,
    /// SM utilisation of this process in per cent, when NVML has samples.
    pub sm_util_pct: Option<u32>,
    /// The MIG device the process runs on, if any.
    pub mig_uuid: Option<String>,
}

/// What the backend itself thinks of a GPU's health, independent of XID events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Probe {
    /// Queries work and nothing is pending.
    Ok,
    /// The GPU is failing now (lost from the bus, row remapping failed, ...).
    Failing(String),
    /// Positive evidence that an earlier failure was repaired (e.g. after a GPU reset):
    /// clears an XID hold at once instead of waiting for the quiet period.
    Recovered,
}

/// Dynamic readings of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuReadings {
    pub uuid: String,
    pub utilization_pct: Option<u32>,
    pub memory_used_mib: Option<u64>,
    pub memory_free_mib: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub ecc: EccCounters,
    pub processes: Vec<GpuProcess>,
    pub probe: Probe,
}

/// An XID error reported by the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct XidEvent {
    /// UUID of the physical GPU. Empty when the driver could not say which GPU.
    pub uuid: String,
    pub xid: u64,
}

/// Failures of a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("NVML is unavailable: {0} (no NVIDIA driver on this machine?)")]
    NvmlUnavailable(String),
    #[error("NVML call {call} failed for GPU {gpu}: {message}")]
    Nvml {
        call: &'static str,
        gpu: String,
        message: String,
    },
    #[error("no GPU with UUID {0}")]
    UnknownGpu(String),
    #[error("fake backend config {path}: {message}")]
    FakeConfig { path: String, message: String },
    /// A MIG change the driver refused; `code` is NVML's name for the error. The
    /// GPU's layout is as it was.
    #[error("MIG on GPU {gpu}: {code}: {message}")]
    Mig {
        gpu: String,
        code: &'static str,
        message: String,
    },
}

/// The error of a backend that cannot change MIG layouts.
fn mig_unsupported(gpu: &str) -> BackendError {
    BackendError::Mig {
        gpu: gpu.to_string(),
        code: "NVML_ERROR_NOT_SUPPORTED",
        message: "this backend does not change MIG layouts".into(),
    }
}

/// A source of GPU facts, readings and XID events.
pub trait GpuBackend: Send + Sync {
    /// Short name for logs: `nvml` or `fake`.
    fn name(&self) -> &'static str;
    /// Driver version, when there is a driver.
    fn driver_version(&self) -> Option<String>;
    /// CUDA driver API version as `major.minor`, when there is a driver.
    fn cuda_version(&self) -> Option<String> {
        None
    }
    /// Every GPU of the node with its static facts, ordered by index.
    fn discover(&self) -> Result<Vec<GpuInfo>, BackendError>;
    /// Current readings of one GPU.
    fn read(&self, uuid: &str) -> Result<GpuReadings, BackendError>;
    /// XID events since the last call, waiting up to `timeout` for the first one.
    fn wait_xid_events(&self, timeout: Duration) -> Result<Vec<XidEvent>, BackendError>;
    /// Switches MIG mode on or off. The GPU must run nothing, and hold no instance
    /// to be switched off.
    fn set_mig_mode(&self, gpu: &str, enabled: bool) -> Result<(), BackendError> {
        let _ = enabled;
        Err(mig_unsupported(gpu))
    }
    /// Creates a GPU instance of `profile` at memory slice `start` and one compute
    /// instance filling it (what a container is handed), as planned by the
    /// scheduler. Refused, changing nothing, when the placement is not allowed or
    /// touches an existing instance.
    fn create_mig_instance(
        &self,
        gpu: &str,
        profile: &str,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        let _ = (profile, start);
        Err(mig_unsupported(gpu))
    }
    /// Destroys a MIG instance (compute and GPU instance). Refused while a process runs on it.
    fn destroy_mig_instance(&self, gpu: &str, mig_uuid: &str) -> Result<(), BackendError> {
        let _ = mig_uuid;
        Err(mig_unsupported(gpu))
    }
}

/// A backend with no GPUs, for tools that report on a node whose NVML cannot
/// be loaded (`tessera doctor snapshot`). The agent does not serve with it: it
/// retries NVML, not Ready meanwhile ([`crate::startup::wait_for_backend`]).
#[derive(Debug, Clone)]
pub struct Unavailable {
    pub reason: String,
}

impl GpuBackend for Unavailable {
    fn name(&self) -> &'static str {
        "nvml (unavailable)"
    }
    fn driver_version(&self) -> Option<String> {
        None
    }
    fn discover(&self) -> Result<Vec<GpuInfo>, BackendError> {
        Ok(Vec::new())
    }
    fn read(&self, uuid: &str) -> Result<GpuReadings, BackendError> {
        Err(BackendError::UnknownGpu(uuid.to_string()))
    }
    fn wait_xid_events(&self, timeout: Duration) -> Result<Vec<XidEvent>, BackendError> {
        std::thread::sleep(timeout);
        Ok(Vec::new())
    }
}

/// Reads which cgroup a process lives in (`/proc/<pid>/cgroup` on a real node).
/// Behind a trait so tests can say where processes live.
pub trait ProcReader: Send + Sync {
    /// The cgroup path(s) of `pid`, or `None` when the process is gone.
    fn cgroup(&self, pid: u32) -> Option<String>;
}

/// Reads `/proc/<pid>/cgroup` under a proc root (normally `/proc`, or the host's
/// `/proc` mounted into the agent's container).
#[derive(Debug, Clone)]
pub struct HostProc {
    pub root: std::path::PathBuf,
}

impl Default for HostProc {
    fn default() -> Self {
        HostProc {
            root: "/proc".into(),
        }
    }
}

impl ProcReader for HostProc {
    fn cgroup(&self, pid: u32) -> Option<String> {
        std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")).ok()
    }
}

/// Pod UID and container ID found in a process's cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupOwner {
    pub pod_uid: String,
    pub container_id: Option<String>,
}

/// Finds the pod UID (and container ID) in a cgroup file's text. Understands the
/// cgroupfs layout (`/kubepods/burstable/pod<uid>/<cid>`) and the systemd layout
/// (`kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<cid>.scope`).
pub fn parse_cgroup(text: &str) -> Option<CgroupOwner> {
    for line in text.lines() {
        // "hierarchy-id:controllers:path"; the path is the part after the second ':'.
        let path = line.splitn(3, ':').nth(2).unwrap_or(line);
        if !path.contains("kubepods") {
            continue;
        }
        let mut pod_uid = None;
        let mut container_id = None;
        for segment in path.split('/') {
            if let Some(uid) = pod_segment_uid(segment) {
                pod_uid = Some(uid);
            } else if pod_uid.is_some() && !segment.is_empty() {
                container_id = Some(container_segment_id(segment));
            }
        }
        if let Some(pod_uid) = pod_uid {
            return Some(CgroupOwner {
                pod_uid,
                container_id,
            });
        }
    }
    None
}

fn pod_segment_uid(segment: &str) -> Option<String> {
    let segment = segment.strip_suffix(".slice").unwrap_or(segment);
    let uid = match segment.strip_prefix("pod") {
        // cgroupfs: pod<uid with dashes>
        Some(uid) => uid.to_string(),
        // systemd: kubepods-burstable-pod<uid_with_underscores>
        None => segment
            .rsplit('-')
            .next()?
            .strip_prefix("pod")?
            .replace('_', "-"),
    };
    (uid.len() >= 8 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
}

fn container_segment_id(segment: &str) -> String {
    let s = segment.strip_suffix(".scope").unwrap_or(segment);
    s.rsplit('-').next().unwrap_or(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_name_their_pod() {
        let v1 = "12:memory:/kubepods/burstable/pod0f4c8c53-1b2a-4c1e-9d7a-2a1f0e3b4c5d/abc123\n";
        assert_eq!(
            parse_cgroup(v1),
            Some(CgroupOwner {
                pod_uid: "0f4c8c53-1b2a-4c1e-9d7a-2a1f0e3b4c5d".into(),
                container_id: Some("abc123".into())
            })
        );
        let systemd = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f4c8c53_1b2a_4c1e_9d7a_2a1f0e3b4c5d.slice/cri-containerd-deadbeef.scope\n";
        assert_eq!(
            parse_cgroup(systemd),
            Some(CgroupOwner {
                pod_uid: "0f4c8c53-1b2a-4c1e-9d7a-2a1f0e3b4c5d".into(),
                container_id: Some("deadbeef".into())
            })
        );
        assert_eq!(
            parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(parse_cgroup(""), None);
    }
}
