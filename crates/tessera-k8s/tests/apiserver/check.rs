//! What must hold in the API server after any run, judged from the stored
//! objects alone: every bound GPU pod carries a grant signed for it and its
//! node, naming GPUs of that node, and no GPU is granted more memory or
//! compute than it has, nor shared while a whole-GPU pod holds it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use tessera_api::GpuNode;
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_k8s::convert;

use super::{ApiServer, Resource};

/// A GPU's grants, summed.
#[derive(Debug, Default)]
struct Use {
    memory_mib: u64,
    cores_milli: u64,
    holders: Vec<String>,
    whole: bool,
}

/// The outcome of an audit.
#[derive(Debug, Default)]
pub struct Audit {
    pub pods: usize,
    pub bound: usize,
    pub bound_gpu: usize,
    /// One line per broken rule.
    pub violations: Vec<String>,
    /// Over-committed GPUs and the pods (`namespace/name`) holding them.
    pub overcommitted: Vec<(String, Vec<String>)>,
}

/// Whether the pod asks for whole GPUs only (no share resources).
fn whole_gpu(pod: &Pod) -> bool {
    let Ok(resources) = convert::pod_resources(pod) else {
        return false;
    };
    let has = |k: &str| resources.iter().any(|(r, _)| r == k);
    has("tessera.io/gpu")
        && ![
            "tessera.io/gpu-memory",
            "tessera.io/gpu-memory-percent",
            "tessera.io/gpu-cores",
            "tessera.io/gpu-milli",
        ]
        .iter()
        .any(|r| has(r))
}

/// Checks the stored pods against the stored `GpuNode` inventory.
pub fn audit(server: &ApiServer, key: &[u8]) -> Audit {
    let inventory: Vec<GpuNode> = server.objects(Resource::GpuNodes);
    // uuid → (node, memory)
    let gpus: BTreeMap<String, (String, u64)> = inventory
        .iter()
        .flat_map(|g| {
            g.spec
                .gpus
                .iter()
                .map(|d| (d.uuid.clone(), (g.spec.node_name.clone(), d.memory_mib)))
        })
        .collect();
    let pods: Vec<Pod> = server.objects(Resource::Pods);
    let mut audit = Audit {
        pods: pods.len(),
        ..Audit::default()
    };
    let mut used: BTreeMap<String, Use> = BTreeMap::new();
    for pod in &pods {
        let Some(node) = convert::pod_node(pod) else {
            continue;
        };
        audit.bound += 1;
        let key_name = convert::pod_key(pod);
        let grant = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION));
        if !convert::wants_gpu(pod) {
            if grant.is_some() {
                audit.violations.push(format!(
                    "{key_name}: CPU-only pod on {node} carries a GPU grant"
                ));
            }
            continue;
        }
        audit.bound_gpu += 1;
        let Some(value) = grant else {
            audit.violations.push(format!(
                "{key_name}: GPU pod bound to {node} without a grant"
            ));
            continue;
        };
        let allocation = match Allocation::decode_verified(value, key, convert::pod_uid(pod), node)
        {
            Ok(a) => a,
            Err(e) => {
                audit.violations.push(format!(
                    "{key_name}: GPU pod bound to {node} has no valid grant: {e}"
                ));
                continue;
            }
        };
        for g in &allocation.gpus {
            match gpus.get(&g.uuid) {
                Some((owner, _)) if owner == node => {}
                Some((owner, _)) => audit.violations.push(format!(
                    "{key_name}: bound to {node} but granted {} of {owner}",
                    g.uuid
                )),
                None => audit.violations.push(format!(
                    "{key_name}: granted unknown GPU {:?} (index {})",
                    g.uuid, g.index
                )),
            }
            let u = used.entry(g.uuid.clone()).or_default();
            u.memory_mib += g.memory_mib;
            u.cores_milli += u64::from(g.cores_milli);
            u.holders.push(key_name.clone());
            u.whole |= whole_gpu(pod);
        }
    }
    for (uuid, u) in &used {
        let capacity = gpus.get(uuid).map_or(0, |(_, m)| *m);
        if u.memory_mib > capacity || u.cores_milli > 1000 || (u.whole && u.holders.len() > 1) {
            audit.overcommitted.push((uuid.clone(), u.holders.clone()));
            audit.violations.push(format!(
                "GPU {uuid} over-committed: {} of {capacity} MiB, {} of 1000 milli-cores, held by {} pod(s){}: {}",
                u.memory_mib,
                u.cores_milli,
                u.holders.len(),
                if u.whole { " (one whole-GPU)" } else { "" },
                u.holders.join(", ")
            ));
        }
    }
    audit
}
