//! The node's inventory: its `GpuNode` object (read by the scheduler) and GPU
//! Feature Discovery-style node labels (protocols.md §4.3).
//!
//! `spec` is written with server-side apply (field manager
//! [`FIELD_MANAGER`]) when the hardware view changes; `status` (per-GPU health
//! and a summary) on every health change, and at least once per
//! [`Heartbeat`] period with a fresh `heartbeatTime`, so the scheduler can tell
//! a live agent from a gone one. Labels are merged into the Node.

use std::collections::BTreeMap;

use kube::api::{Api, Patch, PatchParams};
use tessera_api::gpunode as api;
use tessera_core::model::spec::Architecture;

use crate::backend::{GpuInfo, LinkKind};
use crate::deviceplugin::NodeView;
use crate::health::GpuHealth;

/// Field manager for server-side apply.
pub const FIELD_MANAGER: &str = "tessera-node-agent";

/// Failures talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot write GpuNode {node}: {source}")]
    GpuNode { node: String, source: kube::Error },
    #[error("cannot write GpuNode {node} status: {source}")]
    Status { node: String, source: kube::Error },
    #[error("cannot label node {node}: {source}")]
    Labels { node: String, source: kube::Error },
    #[error("cannot delete GpuNode {node}: {source}")]
    Retire { node: String, source: kube::Error },
}

fn link_kind(k: LinkKind) -> api::LinkKind {
    match k {
        LinkKind::Nvlink => api::LinkKind::NVLink,
        LinkKind::PcieSwitch => api::LinkKind::PCIeSwitch,
        LinkKind::SameSocket => api::LinkKind::SameSocket,
        LinkKind::CrossSocket => api::LinkKind::CrossSocket,
    }
}

/// The `GpuNode` spec for these GPUs.
pub fn gpu_node_spec(node: &str, view: &NodeView) -> api::GpuNodeSpec {
    let by_uuid: BTreeMap<&str, u32> = view
        .gpus
        .iter()
        .map(|g| (g.uuid.as_str(), g.index))
        .collect();
    api::GpuNodeSpec {
        node_name: node.to_string(),
        gpus: view
            .gpus
            .iter()
            .map(|g| {
                let geometry = crate::deviceplugin::mig_geometry(g).cloned();
                api::GpuDevice {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone().unwrap_or_else(|| g.product.clone()),
                    memory_mib: g.memory_mib,
                    sm_count: g.sm_count.unwrap_or(0),
                    numa: g.numa_node.and_then(|n| u8::try_from(n).ok()),
                    links: g
                        .links
                        .iter()
                        .filter_map(|l| {
                            Some(api::GpuLink {
                                peer: *by_uuid.get(l.peer_uuid.as_str())?,
                                kind: link_kind(l.kind),
                                nvlinks: u8::try_from(l.nvlinks).unwrap_or(u8::MAX),
                            })
                        })
                        .collect(),
                    mig: api::MigState {
                        enabled: g.mig_enabled,
                        instances: g
                            .mig_instances
                            .iter()
                            .map(|m| api::MigInstance {
                                profile: m.profile.clone(),
                                start: m.start.unwrap_or(0),
                                size: geometry
                                    .as_ref()
                                    .and_then(|geo| geo.profile(&m.profile))
                                    .map(|(_, p)| p.memory_slices)
                                    .unwrap_or(0),
                                uuid: m.uuid.clone(),
                            })
                            .collect(),
                    },
                    health: if view.is_healthy(&g.uuid) {
                        api::GpuHealth::Healthy
                    } else {
                        api::GpuHealth::Unhealthy
                    },
                }
            })
            .collect(),
    }
}

/// The `GpuNode` status: per-GPU health with reasons and the summary.
pub fn gpu_node_status(
    spec: &api::GpuNodeSpec,
    view: &NodeView,
    free_memory_mib: u64,
) -> api::GpuNodeStatus {
    let conditions = view
        .gpus
        .iter()
        .map(|g| match view.health.get(&g.uuid) {
            Some(GpuHealth::Unhealthy { reason, .. }) => api::GpuCondition {
                index: g.index,
                health: api::GpuHealth::Unhealthy,
                reason: reason.clone(),
            },
            _ => api::GpuCondition {
                index: g.index,
                health: api::GpuHealth::Healthy,
                reason: String::new(),
            },
        })
        .collect();
    api::GpuNodeStatus::summarise(spec, conditions, free_memory_mib)
}

/// When the `GpuNode` status is next written with nothing else changed: one
/// write per period, counted from the last write of any cause, so the
/// scheduler sees the object change while the agent lives (its staleness TTL
/// is a few periods) and a quiet node costs one write a period.
#[derive(Debug, Clone, Copy)]
pub struct Heartbeat {
    period: std::time::Duration,
    next: std::time::Instant,
}

impl Heartbeat {
    /// The first heartbeat is due one `period` after `written` (the start-up write).
    pub fn new(period: std::time::Duration, written: std::time::Instant) -> Self {
        Heartbeat {
            period,
            next: written + period,
        }
    }

    /// When a write is next due if nothing else causes one.
    pub fn deadline(&self) -> std::time::Instant {
        self.next
    }

    pub fn due(&self, now: std::time::Instant) -> bool {
        now >= self.next
    }

    /// The status was written at `now` (for whatever cause): the next is one period on.
    pub fn written(&mut self, now: std::time::Instant) {
        self.next = now + self.period;
    }
}

/// The wall-clock time a status write carries as `heartbeatTime` (RFC 3339).
/// Only people read it; the scheduler goes by the object changing.
pub fn heartbeat_now() -> String {
    jiff::Timestamp::now().to_string()
}

/// GFD's sanitised product name: `NVIDIA A100-SXM4-80GB` → `A100-SXM4-80GB`, `Tesla T4` → `Tesla-T4`.
pub fn sanitise_product(product: &str) -> String {
    let p = product.trim();
    let p = p.strip_prefix("NVIDIA ").unwrap_or(p);
    p.split_whitespace().collect::<Vec<_>>().join("-")
}

fn family(gpu: &GpuInfo) -> &'static str {
    let catalog = crate::deviceplugin::catalog();
    let arch = gpu
        .model
        .as_deref()
        .and_then(|m| catalog.find(m))
        .map(|id| catalog.spec(id).architecture);
    match (arch, gpu.compute_capability) {
        (Some(Architecture::Pascal), _) | (None, Some((6, _))) => "pascal",
        (Some(Architecture::Volta), _) | (None, Some((7, 0 | 2))) => "volta",
        (Some(Architecture::Turing), _) | (None, Some((7, 5))) => "turing",
        (Some(Architecture::Ampere), _) | (None, Some((8, 0 | 6 | 7))) => "ampere",
        (Some(Architecture::Ada), _) | (None, Some((8, 9))) => "ada-lovelace",
        (Some(Architecture::Hopper), _) | (None, Some((9, _))) => "hopper",
        (Some(Architecture::Blackwell), _) | (None, Some((10 | 12, _))) => "blackwell",
        _ => "undefined",
    }
}

/// GFD-style node labels for the node's GPUs (of the first GPU where they differ).
pub fn node_labels(
    gpus: &[GpuInfo],
    driver_version: Option<&str>,
    cuda_version: Option<&str>,
) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    let Some(first) = gpus.first() else {
        return l;
    };
    let mut put = |k: &str, v: String| {
        l.insert(format!("nvidia.com/{k}"), v);
    };
    put("gpu.product", sanitise_product(&first.product));
    put("gpu.count", gpus.len().to_string());
    put("gpu.memory", first.memory_mib.to_string());
    put("gpu.family", family(first).to_string());
    put("gpu.replicas", "1".into());
    put("gpu.sharing-strategy", "none".into());
    put("gpu.mode", "compute".into());
    if let Some((major, minor)) = first.compute_capability {
        put("gpu.compute.major", major.to_string());
        put("gpu.compute.minor", minor.to_string());
    }
    put(
        "mig.capable",
        gpus.iter().any(|g| g.mig_capable).to_string(),
    );
    put("mps.capable", "true".into());
    if let Some(v) = driver_version {
        let parts: Vec<&str> = v.split('.').collect();
        put("cuda.driver-version.full", v.to_string());
        for (i, name) in ["major", "minor", "revision"].iter().enumerate() {
            if let Some(p) = parts.get(i) {
                put(&format!("cuda.driver-version.{name}"), (*p).to_string());
            }
        }
    }
    if let Some(v) = cuda_version {
        put("cuda.runtime-version.full", v.to_string());
        let mut parts = v.split('.');
        if let Some(p) = parts.next() {
            put("cuda.runtime-version.major", p.to_string());
        }
        if let Some(p) = parts.next() {
            put("cuda.runtime-version.minor", p.to_string());
        }
    }
    l
}

/// Writes the inventory through the Kubernetes API.
#[derive(Clone)]
pub struct Inventory {
    client: kube::Client,
    node: String,
}

impl std::fmt::Debug for Inventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inventory")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Inventory {
    pub fn new(client: kube::Client, node: String) -> Self {
        Inventory { client, node }
    }

    fn params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Applies the `GpuNode` spec.
    pub async fn publish_spec(&self, spec: &api::GpuNodeSpec) -> Result<(), InventoryError> {
        let api: Api<api::GpuNode> = Api::all(self.client.clone());
        let obj = serde_json::json!({
            "apiVersion": format!("{}/{}", api::GROUP, api::VERSION),
            "kind": "GpuNode",
            "metadata": { "name": self.node },
            "spec": spec,
        });
        api.patch(&self.node, &Self::params(), &Patch::Apply(&obj))
            .await
            .map_err(|e| InventoryError::GpuNode {
                node: self.node.clone(),
                source: e,
            })?;
        Ok(())
    }

    /// Deletes the node's `GpuNode`, when the node has left the device-plugin
    /// path (the DRA driver serves it): without one, Tessera's scheduler places
    /// no pod there. The delete is made on the object read just before (its UID
    /// and resourceVersion as preconditions), so a `GpuNode` written meanwhile is
    /// not removed unseen; `Ok(false)` when there is none.
    pub async fn retire(&self) -> Result<bool, InventoryError> {
        let api: Api<api::GpuNode> = Api::all(self.client.clone());
        let err = |source| InventoryError::Retire {
            node: self.node.clone(),
            source,
        };
        let Some(current) = api.get_opt(&self.node).await.map_err(err)? else {
            return Ok(false);
        };
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: current.metadata.uid.clone(),
                resource_version: current.metadata.resource_version.clone(),
            }),
            ..Default::default()
        };
        match api.delete(&self.node, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(err(e)),
        }
    }

    /// The `gpu.tessera.io` ResourceSlices that serve this node (see
    /// [`crate::dra::apiserver::driver_slices_on`]); empty without DRA.
    pub async fn dra_slices(&self) -> Result<Vec<String>, kube::Error> {
        crate::dra::apiserver::driver_slices_on(&self.client, &self.node).await
    }

    /// A Warning event on this node (see [`crate::dra::handover::node_warning`]).
    pub async fn warn_on_node(&self, reason: &str, message: &str) -> Result<(), kube::Error> {
        crate::dra::handover::node_warning(
            &self.client,
            &self.node,
            reason,
            message,
            "tessera-node-agent",
        )
        .await
    }

    /// Applies the `GpuNode` status.
    pub async fn publish_status(&self, status: &api::GpuNodeStatus) -> Result<(), InventoryError> {
        let api: Api<api::GpuNode> = Api::all(self.client.clone());
        let obj = serde_json::json!({
            "apiVersion": format!("{}/{}", api::GROUP, api::VERSION),
            "kind": "GpuNode",
            "metadata": { "name": self.node },
            "status": status,
        });
        api.patch_status(&self.node, &Self::params(), &Patch::Apply(&obj))
            .await
            .map_err(|e| InventoryError::Status {
                node: self.node.clone(),
                source: e,
            })?;
        Ok(())
    }

    /// Merges labels into the Node object.
    pub async fn publish_labels(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), InventoryError> {
        self.patch_labels(serde_json::json!(labels)).await
    }

    /// Sets (`Some`) or removes (`None`) one label of the Node.
    pub async fn publish_label(
        &self,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), InventoryError> {
        self.patch_labels(serde_json::json!({ key: value })).await
    }

    /// A merge patch of the Node's labels (`null` removes one).
    async fn patch_labels(&self, labels: serde_json::Value) -> Result<(), InventoryError> {
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let patch = serde_json::json!({ "metadata": { "labels": labels } });
        api.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| InventoryError::Labels {
                node: self.node.clone(),
                source: e,
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::GpuBackend;
    use crate::backend::fake::Fake;

    /// A write of any cause restarts the period; nothing is due before it ends.
    #[test]
    fn heartbeat_is_due_one_period_after_the_last_write() {
        let period = std::time::Duration::from_secs(30);
        let t0 = std::time::Instant::now();
        let mut hb = Heartbeat::new(period, t0);
        assert!(!hb.due(t0 + period / 2));
        assert!(hb.due(t0 + period));
        // A health change wrote the status at 20 s: the heartbeat moves to 50 s.
        hb.written(t0 + std::time::Duration::from_secs(20));
        assert!(!hb.due(t0 + period));
        assert_eq!(hb.deadline(), t0 + std::time::Duration::from_secs(50));
        assert!(hb.due(t0 + std::time::Duration::from_secs(50)));
    }

    #[test]
    fn labels_follow_gfd() {
        let fake = Fake::from_yaml(
            "gpus:\n  - { uuid: GPU-a, product: NVIDIA A100-SXM4-80GB, computeCapability: \"8.0\" }\n  - { uuid: GPU-b, product: NVIDIA A100-SXM4-80GB }\n",
            "t",
        )
        .unwrap();
        let l = node_labels(&fake.discover().unwrap(), Some("550.54.15"), Some("12.4"));
        assert_eq!(l["nvidia.com/gpu.product"], "A100-SXM4-80GB");
        assert_eq!(l["nvidia.com/gpu.count"], "2");
        assert_eq!(l["nvidia.com/gpu.memory"], "81920");
        assert_eq!(l["nvidia.com/gpu.family"], "ampere");
        assert_eq!(l["nvidia.com/gpu.compute.major"], "8");
        assert_eq!(l["nvidia.com/mig.capable"], "true");
        assert_eq!(l["nvidia.com/cuda.driver-version.revision"], "15");
        assert_eq!(l["nvidia.com/cuda.runtime-version.minor"], "4");
        assert_eq!(sanitise_product("Tesla T4"), "Tesla-T4");
    }
}
