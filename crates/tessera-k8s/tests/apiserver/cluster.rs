//! Objects for scheduler tests on the double: Ready nodes with `GpuNode`
//! inventory (A100-80GB), and pods asking for whole GPUs, GPU shares or CPU only.

use serde_json::{Value, json};
use tessera_api::{GpuDevice, GpuNode, GpuNodeSpec};

use super::{ApiServer, Resource};

/// Memory of one GPU of the test nodes.
pub const GPU_MEMORY_MIB: u64 = 81_920;

/// Creates `count` nodes `gpu-node-N` with `gpus` GPUs each; returns their names.
pub fn add_gpu_nodes(server: &ApiServer, count: usize, gpus: u32) -> Vec<String> {
    (0..count)
        .map(|i| {
            let name = format!("gpu-node-{i}");
            let node = ready_node(&name);
            server.create(Resource::Nodes, &node).expect("node");
            let inventory = GpuNode::new(
                &name,
                GpuNodeSpec {
                    node_name: name.clone(),
                    gpus: (0..gpus)
                        .map(|index| GpuDevice {
                            index,
                            uuid: format!("GPU-{name}-{index}"),
                            model: "A100-80GB".into(),
                            memory_mib: GPU_MEMORY_MIB,
                            sm_count: 108,
                            ..GpuDevice::default()
                        })
                        .collect(),
                },
            );
            server
                .create(Resource::GpuNodes, &inventory)
                .expect("gpunode");
            name
        })
        .collect()
}

/// What a test pod asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Whole GPUs (`tessera.io/gpu`).
    Whole(u32),
    /// One GPU shared: memory in GiB and compute in per cent.
    Share {
        memory_gib: u32,
        cores_pct: u32,
    },
    CpuOnly,
}

/// A pod of `scheduler` in `namespace` with `shape` plus CPU and memory requests.
pub fn pod(
    namespace: &str,
    name: &str,
    scheduler: &str,
    shape: Shape,
    cpu_milli: u32,
    memory_mib: u32,
    priority: i32,
) -> Value {
    let mut limits = json!({"cpu": format!("{cpu_milli}m"), "memory": format!("{memory_mib}Mi")});
    match shape {
        Shape::Whole(n) => limits["tessera.io/gpu"] = json!(n.to_string()),
        Shape::Share {
            memory_gib,
            cores_pct,
        } => {
            limits["tessera.io/gpu-memory"] = json!(format!("{memory_gib}Gi"));
            limits["tessera.io/gpu-cores"] = json!(cores_pct.to_string());
        }
        Shape::CpuOnly => {}
    }
    json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": scheduler,
            "priority": priority,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9",
                            "resources": {"limits": limits}}]
        }
    })
}

/// Whether a stored pod is bound.
pub fn node_of(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

/// Pods bound so far.
pub fn bound(server: &ApiServer) -> usize {
    server.count(Resource::Pods, |p| node_of(p).is_some())
}

/// A Ready node `name` with 64 CPUs, 512 GiB and 110 pod slots (its GPUs are
/// in a GpuNode or in ResourceSlices, added apart).
pub fn ready_node(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        }
    })
}
