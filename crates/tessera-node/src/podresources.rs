//! What the kubelet says each pod holds: its PodResources API (`v1`, served on
//! `/var/lib/kubelet/pod-resources/kubelet.sock`, protocols.md §2.7).
//!
//! Two readers use it. `Allocate` ([`crate::deviceplugin::allocate`]) learns
//! which pods the kubelet knows (it adds a pod to its pod manager before
//! admitting it) and which of their containers already hold devices, so it
//! never answers a call for a pod the kubelet has not reached or has already
//! admitted. The `GpuNode` status carries [`report`]: every container holding
//! a GPU device (`nvidia.com/*`, `tessera.io/*`) whatever plugin served it,
//! with the physical GPUs behind the device IDs, so the scheduler counts GPUs
//! held by pods it did not place (issue 27).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tessera_api::{ContainerDevices, PodResourcesReport};
use tessera_core::allocation::{ANNOTATION, Allocation, KeyRing};

use crate::deviceplugin::NodeView;
use crate::deviceplugin::allocate::PodInfo;
use crate::proto::podresources as prpb;

/// Where the kubelet serves the PodResources API.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// One pod as the kubelet's `List` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletPod {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<KubeletContainer>,
}

/// One container and the devices the kubelet assigned it, per resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletContainer {
    pub name: String,
    /// (resource name, device IDs as the plugin advertised them).
    pub devices: Vec<(String, Vec<String>)>,
}

impl KubeletPod {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The names of the containers holding at least one device of `resource`.
    pub fn holders(&self, resource: &str) -> impl Iterator<Item = &str> {
        self.containers
            .iter()
            .filter(move |c| {
                c.devices
                    .iter()
                    .any(|(r, ids)| r == resource && !ids.is_empty())
            })
            .map(|c| c.name.as_str())
    }

    /// Whether any container holds any device.
    pub fn holds_devices(&self) -> bool {
        self.containers
            .iter()
            .any(|c| c.devices.iter().any(|(_, ids)| !ids.is_empty()))
    }
}

/// Failure to read the kubelet's PodResources API.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PodResourcesError {
    #[error("cannot reach the kubelet's PodResources API at {socket}: {message}")]
    Connect { socket: String, message: String },
    #[error("the kubelet's PodResources List failed: {0}")]
    List(String),
}

/// The kubelet's pods and their devices: the PodResources API in production, a
/// list in tests.
pub trait KubeletPods: Send + Sync {
    fn list(&self) -> BoxFuture<'_, Result<Vec<KubeletPod>, PodResourcesError>>;
}

/// The PodResources API over the kubelet's unix socket.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    pub socket: PathBuf,
}

impl KubeletPods for PodResourcesClient {
    fn list(&self) -> BoxFuture<'_, Result<Vec<KubeletPod>, PodResourcesError>> {
        Box::pin(async move {
            let socket = self.socket.display().to_string();
            let connect = |message: String| PodResourcesError::Connect {
                socket: socket.clone(),
                message,
            };
            let channel = tonic::transport::Endpoint::from_shared(format!("unix://{socket}"))
                .map_err(|e| connect(e.to_string()))?
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(5))
                .connect()
                .await
                .map_err(|e| connect(e.to_string()))?;
            let resp = prpb::pod_resources_lister_client::PodResourcesListerClient::new(channel)
                .list(prpb::ListPodResourcesRequest {})
                .await
                .map_err(|s| PodResourcesError::List(s.message().to_string()))?
                .into_inner();
            Ok(resp.pod_resources.into_iter().map(from_wire).collect())
        })
    }
}

/// Converts one pod of a `List` answer.
pub fn from_wire(p: prpb::PodResources) -> KubeletPod {
    KubeletPod {
        namespace: p.namespace,
        name: p.name,
        containers: p
            .containers
            .into_iter()
            .map(|c| KubeletContainer {
                name: c.name,
                devices: c
                    .devices
                    .into_iter()
                    .map(|d| (d.resource_name, d.device_ids))
                    .collect(),
            })
            .collect(),
    }
}

/// A fixed, changeable list (tests and the fake mode).
#[derive(Debug, Clone, Default)]
pub struct StaticKubeletPods(pub Arc<Mutex<Vec<KubeletPod>>>);

impl StaticKubeletPods {
    pub fn set(&self, pods: Vec<KubeletPod>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = pods;
    }
}

impl KubeletPods for StaticKubeletPods {
    fn list(&self) -> BoxFuture<'_, Result<Vec<KubeletPod>, PodResourcesError>> {
        let pods = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move { Ok(pods) })
    }
}

/// Whether devices of `resource` are GPUs (or parts of one) for the report.
pub fn is_gpu_resource(resource: &str) -> bool {
    resource.starts_with("nvidia.com/") || resource.starts_with("tessera.io/")
}

/// The containers holding GPU devices, with the physical GPUs behind them.
///
/// Device IDs resolve by their shape (NVIDIA's plugin and Tessera's own
/// `nvidia.com/gpu` and MIG resources): `GPU-…` is the GPU, `GPU-…::N` a
/// time-slicing replica of it, `MIG-…` an instance of the GPU in `view` that
/// has it. `tessera.io/gpu` slot IDs and the MIG tokens of GPUs where the agent
/// creates instances (`GPU-…::<profile>-<k>`) are tokens only: the GPUs are those the
/// pod's verified decision grants the container (`key`, `node`: the decision's
/// check). Where one device does not resolve, `gpu_uuids` is left empty, which
/// the scheduler reads as "any GPU".
pub fn report(
    kubelet: &[KubeletPod],
    pods: &[PodInfo],
    view: &NodeView,
    key: &KeyRing,
    node: &str,
    observed_at: String,
) -> PodResourcesReport {
    let mut containers = Vec::new();
    for p in kubelet {
        for c in &p.containers {
            for (resource, ids) in &c.devices {
                if ids.is_empty() || !is_gpu_resource(resource) {
                    continue;
                }
                let gpus = if resource == tessera_core::request::RES_GPU
                    || ids.iter().any(|id| crate::deviceplugin::is_mig_token(id))
                {
                    granted_gpus(p, &c.name, pods, view, key, node)
                } else {
                    ids.iter()
                        .map(|id| device_gpu(id, view))
                        .collect::<Option<Vec<_>>>()
                };
                let mut gpu_uuids = gpus.unwrap_or_default();
                gpu_uuids.sort();
                gpu_uuids.dedup();
                containers.push(ContainerDevices {
                    namespace: p.namespace.clone(),
                    pod: p.name.clone(),
                    container: c.name.clone(),
                    resource: resource.clone(),
                    device_ids: ids.clone(),
                    gpu_uuids,
                });
            }
        }
    }
    containers.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container, &a.resource).cmp(&(
            &b.namespace,
            &b.pod,
            &b.container,
            &b.resource,
        ))
    });
    PodResourcesReport {
        observed_at,
        containers,
    }
}

/// The physical GPU of one device ID, `None` when its shape is unknown or a MIG
/// instance is not on this node.
fn device_gpu(id: &str, view: &NodeView) -> Option<String> {
    let base = crate::deviceplugin::device_gpu(id);
    if base.starts_with("GPU-") {
        return Some(base.to_string());
    }
    if base.starts_with("MIG-") {
        return view
            .gpus
            .iter()
            .find(|g| g.mig_instances.iter().any(|m| m.uuid == base))
            .map(|g| g.uuid.clone());
    }
    None
}

/// The GPUs a Tessera decision grants `container` of the kubelet's pod `p`.
fn granted_gpus(
    p: &KubeletPod,
    container: &str,
    pods: &[PodInfo],
    view: &NodeView,
    key: &KeyRing,
    node: &str,
) -> Option<Vec<String>> {
    let pod = pods
        .iter()
        .find(|x| x.namespace == p.namespace && x.name == p.name)?;
    let alloc =
        Allocation::decode_verified(pod.annotations.get(ANNOTATION)?, key, &pod.uid, node).ok()?;
    alloc
        .gpus_of(container)?
        .into_iter()
        .map(|g| view.grant_gpu(g).map(|x| x.uuid.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deviceplugin::test_view;
    use tessera_core::allocation::{AllocatedGpu, VERSION};
    use tessera_core::request::Isolation;

    fn kpod(name: &str, container: &str, resource: &str, ids: &[&str]) -> KubeletPod {
        KubeletPod {
            namespace: "ml".into(),
            name: name.into(),
            containers: vec![KubeletContainer {
                name: container.into(),
                devices: vec![(resource.into(), ids.iter().map(|s| s.to_string()).collect())],
            }],
        }
    }

    #[test]
    fn report_resolves_every_plugins_device_ids_to_gpus() {
        let view = test_view();
        // A Tessera pod whose decision grants GPU-3 although the kubelet's slot
        // token names GPU-0: the decision, not the token, says what it holds.
        let alloc = Allocation {
            version: VERSION,
            pod_uid: "uid-t".into(),
            pod: "ml/tess".into(),
            node: "n".into(),
            policy: "tessera".into(),
            isolation: Isolation::Exclusive,
            gpus: vec![AllocatedGpu {
                index: 3,
                uuid: "GPU-3".into(),
                memory_mib: 1,
                cores_milli: 1000,
                mig: None,
            }],
            containers: Vec::new(),
            signature: String::new(),
        };
        let tess = PodInfo {
            uid: "uid-t".into(),
            namespace: "ml".into(),
            name: "tess".into(),
            phase: "Running".into(),
            annotations: [(ANNOTATION.to_string(), alloc.encode_signed(b"k"))].into(),
            ..PodInfo::default()
        };
        let kubelet = vec![
            kpod("whole", "main", "nvidia.com/gpu", &["GPU-1"]),
            kpod(
                "sliced",
                "main",
                "nvidia.com/gpu",
                &["GPU-2::3", "GPU-2::4"],
            ),
            kpod("mig", "main", "nvidia.com/mig-3g.40gb", &["MIG-x"]),
            kpod(
                "gone-mig",
                "main",
                "nvidia.com/mig-1g.10gb",
                &["MIG-nowhere"],
            ),
            kpod("tess", "main", "tessera.io/gpu", &["GPU-0::0"]),
            kpod("forged", "main", "tessera.io/gpu", &["GPU-0::1"]),
            kpod("nic", "main", "example.com/nic", &["eth1"]),
            kpod("cpu", "main", "tessera.io/gpu", &[]),
        ];
        let r = report(
            &kubelet,
            &[tess],
            &view,
            &KeyRing::new(b"k".to_vec()),
            "n",
            "2026-12-03T08:00:00Z".into(),
        );
        let got: Vec<(&str, Vec<&str>)> = r
            .containers
            .iter()
            .map(|c| {
                (
                    c.pod.as_str(),
                    c.gpu_uuids.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                // A forged or missing decision and an unknown MIG instance: "any GPU".
                ("forged", vec![]),
                ("gone-mig", vec![]),
                ("mig", vec!["GPU-4"]),
                ("sliced", vec!["GPU-2"]),
                ("tess", vec!["GPU-3"]),
                ("whole", vec!["GPU-1"]),
            ]
        );
        assert_eq!(r.containers[3].device_ids, ["GPU-2::3", "GPU-2::4"]);
        assert_eq!(r.observed_at, "2026-12-03T08:00:00Z");
    }
}
