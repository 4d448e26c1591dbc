//! `GpuNode`: the GPU inventory of one Kubernetes node.
//!
//! Cluster-scoped, one object per node, named after the node. The node agent
//! writes it (an operator may write one by hand for a node without an agent);
//! the scheduler only reads it. `spec` is what the hardware is (it changes when
//! a GPU is replaced or MIG is reconfigured); `status` is what the agent last
//! observed (per-GPU health and a summary for `kubectl get gpunodes`).
//!
//! Units are in the field names: memory in MiB, never bytes.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of Tessera's custom resources.
pub const GROUP: &str = "tessera.io";
/// Version of [`GpuNode`].
pub const VERSION: &str = "v1alpha1";

/// Node label the device-plugin agent sets to [`NVIDIA_GPU_SERVED`] while it
/// serves `nvidia.com/gpu` (and the MIG "mixed" names) itself, and removes
/// otherwise. Its `Allocate` hands GPUs only to pods Tessera placed, so the
/// extender keeps other schedulers' `nvidia.com/gpu` pods off such nodes
/// instead of letting them be bound and refused at admission.
pub const NVIDIA_GPU_LABEL: &str = "tessera.io/nvidia-gpu-resource";
/// The value of [`NVIDIA_GPU_LABEL`].
pub const NVIDIA_GPU_SERVED: &str = "served";

/// The GPUs of one node, as the node agent discovered them.
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default,
)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    kind = "GpuNode",
    plural = "gpunodes",
    singular = "gpunode",
    shortname = "gn",
    category = "tessera",
    status = "GpuNodeStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "GPU inventory of one Kubernetes node (named after the node), written by the Tessera node agent and read by the Tessera scheduler.",
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".status.model","description":"GPU model (of the first GPU; nodes are homogeneous in practice)"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".status.gpuCount","description":"Number of GPUs"}"#,
    printcolumn = r#"{"name":"Free Memory MiB","type":"integer","jsonPath":".status.freeMemoryMiB","description":"GPU memory not in use, summed over GPUs, as the node agent last saw it"}"#,
    printcolumn = r#"{"name":"Health","type":"string","jsonPath":".status.health","description":"Healthy, Degraded (some GPUs unhealthy) or Unhealthy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeSpec {
    /// The Kubernetes node these GPUs belong to (equal to `metadata.name`).
    pub node_name: String,
    /// Every GPU of the node, in NVML index order.
    #[serde(default)]
    pub gpus: Vec<GpuDevice>,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuDevice {
    /// NVML index on the node.
    pub index: u32,
    /// `GPU-…` UUID.
    #[serde(default)]
    pub uuid: String,
    /// Model name: a catalog name (`A100-80GB`) or the NVML product name
    /// (`NVIDIA A100-SXM4-80GB`); the scheduler resolves either.
    pub model: String,
    /// Total framebuffer memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    #[serde(default)]
    pub sm_count: u32,
    /// NUMA node of the GPU's PCIe root, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u8>,
    /// Links from this GPU to each other GPU of the node; a missing peer means unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<GpuLink>,
    /// MIG mode and the instances that exist on the GPU.
    #[serde(default)]
    pub mig: MigState,
    /// Health as the node agent judges it at discovery; `status.gpus` carries later changes.
    #[serde(default)]
    pub health: GpuHealth,
}

/// How this GPU reaches one peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuLink {
    /// NVML index of the peer GPU.
    pub peer: u32,
    /// Kind of connection.
    pub kind: LinkKind,
    /// Number of NVLink links to the peer (only for `NVLink`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nvlinks: u8,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// Kind of connection between two GPUs, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
pub enum LinkKind {
    /// Direct NVLink (or NVSwitch).
    NVLink,
    /// Same PCIe switch.
    PCIeSwitch,
    /// Same CPU socket, different PCIe switches.
    SameSocket,
    /// Across the CPU socket interconnect.
    CrossSocket,
    /// Not reported.
    #[default]
    Unknown,
}

/// MIG mode of a GPU and its current instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct MigState {
    /// MIG mode is on: the GPU only takes MIG requests.
    #[serde(default)]
    pub enabled: bool,
    /// GPU instances that exist now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstance>,
}

/// One MIG GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// First memory slice of the placement.
    pub start: u8,
    /// Memory slices of the placement.
    pub size: u8,
    /// `MIG-…` UUID of the device.
    #[serde(default)]
    pub uuid: String,
}

/// Whether a GPU may receive work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
pub enum GpuHealth {
    #[default]
    Healthy,
    Unhealthy,
}

/// How often a running node agent refreshes `status.heartbeatTime` when
/// nothing else in its status changed (the contract between agent and
/// scheduler; the scheduler's staleness TTL is a few of these).
///
/// 60 s: at 5,000 nodes that is 83 status writes (and watch events) a second,
/// and a dead agent's node stops taking pods within the TTL (3 periods).
pub const HEARTBEAT_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// What the node agent last observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// Model of the first GPU (for `kubectl get`).
    #[serde(default)]
    pub model: String,
    /// Number of GPUs in `spec.gpus`.
    #[serde(default)]
    pub gpu_count: u32,
    /// GPUs whose health is `Healthy`.
    #[serde(default)]
    pub healthy_gpus: u32,
    /// GPU memory not in use, summed over the node's GPUs, in MiB.
    #[serde(default, rename = "freeMemoryMiB")]
    pub free_memory_mib: u64,
    /// `Healthy` (all GPUs), `Degraded` (some) or `Unhealthy` (none, or no GPUs).
    #[serde(default)]
    pub health: String,
    /// Per-GPU health; overrides `spec.gpus[].health` for the GPUs it names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuCondition>,
    /// When the agent last wrote this status (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<String>,
    /// When the node agent last wrote this status (RFC 3339); a running agent
    /// rewrites it at least every 60 seconds. Its presence promises those
    /// rewrites: the scheduler places no new pods on a node whose GpuNode has
    /// not changed for a few periods (its agent is gone). The scheduler measures
    /// that on its own clock from the changes it sees, never by comparing this
    /// time with its clock. Absent (an older agent, a hand-written object): the
    /// node is never taken as stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<String>,
    /// The agent's MPS control daemons (`--mps-daemons per-gpu`), one per set of
    /// GPUs that MPS shares are served on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mps_daemons: Vec<MpsDaemonState>,
    /// Devices the kubelet has assigned to containers on this node, as its
    /// PodResources API (`/var/lib/kubelet/pod-resources`) lists them, for every
    /// GPU resource (`nvidia.com/*`, `tessera.io/*`) whatever device plugin
    /// served it. The scheduler counts the GPUs held by pods it did not grant
    /// (e.g. admitted by NVIDIA's device plugin before Tessera managed the node)
    /// as used, so they are never handed out twice. `None`: the agent has not
    /// read the kubelet's list yet (or is too old to), so the scheduler cannot
    /// know what such pods hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_resources: Option<PodResourcesReport>,
}

/// What the kubelet's PodResources API said at one read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodResourcesReport {
    /// When the agent read it (RFC 3339).
    pub observed_at: String,
    /// Every container that holds at least one GPU device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerDevices>,
}

/// The GPU devices one container holds, by resource name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDevices {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Extended resource the devices were assigned for, e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// Device IDs exactly as the device plugin advertised them (NVIDIA's plugin:
    /// `GPU-…` or `MIG-…` UUIDs, with `::N` replica suffixes under time-slicing).
    #[serde(default)]
    pub device_ids: Vec<String>,
    /// `GPU-…` UUIDs of the physical GPUs those devices are on, as the agent
    /// resolved them (a MIG device resolves to its parent GPU); empty when it
    /// could not resolve a device, which the scheduler must treat as "any GPU".
    #[serde(default)]
    pub gpu_uuids: Vec<String>,
}

/// One MPS control daemon as the node agent last saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemonState {
    /// UUIDs of the GPUs it serves.
    pub gpus: Vec<String>,
    /// Running now (false: it exited; restarted with backoff while pods hold it).
    pub running: bool,
    /// Starts after the first (exits and failed starts) since the agent started.
    #[serde(default)]
    pub restarts: u32,
    /// How it last exited, or why it did not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
}

/// Health of one GPU and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuCondition {
    /// NVML index of the GPU.
    pub index: u32,
    pub health: GpuHealth,
    /// Why it is unhealthy, e.g. `XID 79: GPU has fallen off the bus`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl GpuNodeSpec {
    /// Health of the GPU with NVML index `index`, `status` (when given) taking precedence.
    pub fn health_of(&self, index: u32, status: Option<&GpuNodeStatus>) -> GpuHealth {
        if let Some(c) = status.and_then(|s| s.gpus.iter().find(|c| c.index == index)) {
            return c.health;
        }
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.health)
            .unwrap_or(GpuHealth::Unhealthy)
    }
}

impl GpuNodeStatus {
    /// The summary fields (`model`, `gpuCount`, `healthyGpus`, `health`) computed
    /// from `spec` and the per-GPU conditions in `gpus`; the caller sets
    /// `freeMemoryMiB` and `lastUpdate`.
    pub fn summarise(spec: &GpuNodeSpec, gpus: Vec<GpuCondition>, free_memory_mib: u64) -> Self {
        let mut status = GpuNodeStatus {
            gpus,
            free_memory_mib,
            ..GpuNodeStatus::default()
        };
        status.model = spec
            .gpus
            .first()
            .map(|g| g.model.clone())
            .unwrap_or_default();
        status.gpu_count = spec.gpus.len() as u32;
        status.healthy_gpus = spec
            .gpus
            .iter()
            .filter(|g| spec.health_of(g.index, Some(&status)) == GpuHealth::Healthy)
            .count() as u32;
        status.health = match (status.healthy_gpus, status.gpu_count) {
            (0, _) => "Unhealthy",
            (h, n) if h == n => "Healthy",
            _ => "Degraded",
        }
        .to_string();
        status
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    fn a100(index: u32) -> GpuDevice {
        GpuDevice {
            index,
            uuid: format!("GPU-{index}"),
            model: "A100-80GB".into(),
            memory_mib: 81_920,
            sm_count: 108,
            numa: Some(0),
            links: vec![GpuLink {
                peer: 1 - index,
                kind: LinkKind::NVLink,
                nvlinks: 12,
            }],
            mig: MigState::default(),
            health: GpuHealth::Healthy,
        }
    }

    #[test]
    fn wire_names_are_stable() {
        let node = GpuNode::new(
            "node-a",
            GpuNodeSpec {
                node_name: "node-a".into(),
                gpus: vec![a100(0), a100(1)],
            },
        );
        let v = serde_json::to_value(&node).unwrap();
        assert_eq!(v["apiVersion"], "tessera.io/v1alpha1");
        assert_eq!(v["kind"], "GpuNode");
        assert_eq!(v["spec"]["nodeName"], "node-a");
        let g = &v["spec"]["gpus"][1];
        assert_eq!(g["memoryMiB"], 81_920);
        assert_eq!(g["smCount"], 108);
        assert_eq!(g["links"][0]["kind"], "NVLink");
        assert_eq!(g["links"][0]["nvlinks"], 12);
        assert_eq!(g["mig"]["enabled"], false);
        assert_eq!(g["health"], "Healthy");
        let back: GpuNode = serde_json::from_value(v).unwrap();
        assert_eq!(back.spec, node.spec);
    }

    #[test]
    fn pod_resources_wire_names_are_stable() {
        let status = GpuNodeStatus {
            pod_resources: Some(PodResourcesReport {
                observed_at: "2026-12-03T08:00:00Z".into(),
                containers: vec![ContainerDevices {
                    namespace: "ml".into(),
                    pod: "train".into(),
                    container: "main".into(),
                    resource: "nvidia.com/gpu".into(),
                    device_ids: vec!["GPU-a::1".into()],
                    gpu_uuids: vec!["GPU-a".into()],
                }],
            }),
            ..GpuNodeStatus::default()
        };
        let v = serde_json::to_value(&status).unwrap();
        let report = &v["podResources"];
        assert_eq!(report["observedAt"], "2026-12-03T08:00:00Z");
        assert_eq!(report["containers"][0]["deviceIds"][0], "GPU-a::1");
        assert_eq!(report["containers"][0]["gpuUuids"][0], "GPU-a");
        let back: GpuNodeStatus = serde_json::from_value(v).unwrap();
        assert_eq!(back, status);
        // An agent too old to report leaves the field out: it reads as None, not as "nothing held".
        let old: GpuNodeStatus =
            serde_json::from_value(serde_json::json!({"health": "Healthy"})).unwrap();
        assert_eq!(old.pod_resources, None);
        // Nor does it heartbeat: None, which the scheduler never expires.
        assert_eq!(old.heartbeat_time, None);
    }

    #[test]
    fn heartbeat_wire_name_is_stable() {
        let status = GpuNodeStatus {
            heartbeat_time: Some("2026-12-04T19:00:00Z".into()),
            ..GpuNodeStatus::default()
        };
        let v = serde_json::to_value(&status).unwrap();
        assert_eq!(v["heartbeatTime"], "2026-12-04T19:00:00Z");
        assert_eq!(serde_json::from_value::<GpuNodeStatus>(v).unwrap(), status);
    }

    #[test]
    fn crd_is_cluster_scoped_with_printer_columns() {
        let crd = GpuNode::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("gpunodes.tessera.io"));
        assert_eq!(crd.spec.scope, "Cluster");
        let version = &crd.spec.versions[0];
        let cols: Vec<&str> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(cols, ["Model", "GPUs", "Free Memory MiB", "Health", "Age"]);
        assert!(version.subresources.as_ref().unwrap().status.is_some());
    }

    #[test]
    fn summary_counts_unhealthy_gpus_from_status() {
        let spec = GpuNodeSpec {
            node_name: "n".into(),
            gpus: vec![a100(0), a100(1)],
        };
        let ok = GpuNodeStatus::summarise(&spec, vec![], 1000);
        assert_eq!(
            (ok.gpu_count, ok.healthy_gpus, ok.health.as_str()),
            (2, 2, "Healthy")
        );
        let bad = vec![GpuCondition {
            index: 1,
            health: GpuHealth::Unhealthy,
            reason: "XID 79".into(),
        }];
        let degraded = GpuNodeStatus::summarise(&spec, bad, 0);
        assert_eq!(
            (degraded.healthy_gpus, degraded.health.as_str()),
            (1, "Degraded")
        );
        assert_eq!(degraded.model, "A100-80GB");
        assert_eq!(spec.health_of(1, Some(&degraded)), GpuHealth::Unhealthy);
        assert_eq!(spec.health_of(9, None), GpuHealth::Unhealthy);
    }
}
