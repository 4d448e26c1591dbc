//! Every conversion between Kubernetes objects and core types, in one place.
//!
//! Nodes and `GpuNode`s become core [`Node`]s; pods become core [`Request`]s;
//! a core [`Placement`] becomes the signed [`Allocation`] annotation and back.
//! Nothing here talks to the API server; all inputs come from outside and are
//! checked, never unwrapped.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use smallvec::SmallVec;
use tessera_api::{GpuHealth, GpuNode, LinkKind};
use tessera_core::allocation::{AllocatedGpu, Allocation, MigGrant, VERSION};
use tessera_core::fit;
use tessera_core::model::{
    Architecture, Catalog, Gpu, GpuSpec, Health, Link, MigGeometry, MigInstance, Node,
};
use tessera_core::placement::{GpuGrant, MigSlot, Placement, request_class};
use tessera_core::request::{self, GpuAsk, Isolation, Request, RequestError};
use tessera_core::{Cluster, NodeId};

/// Why a Kubernetes object could not be turned into a core value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("node {node}: {problem}")]
    Node { node: String, problem: String },
    #[error("allocation of pod {pod}: {problem}")]
    Allocation { pod: String, problem: String },
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The pod's UID, or empty.
pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// The node the pod is bound to, if any.
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// The pod's scheduler name (`default-scheduler` when unset).
pub fn scheduler_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or("default-scheduler")
}

/// Succeeded or Failed: the pod holds nothing any more.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The pod's annotations as `(key, value)` pairs.
pub fn annotations(pod: &Pod) -> impl Iterator<Item = (&str, &str)> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

/// The pod's effective resource requests as strings for the core parser.
///
/// CPU and memory follow Kubernetes: the sum over containers, or the largest
/// init container if that is more. Other resources (the GPU ones) are summed
/// over containers when they are integers; a value that is not is passed on
/// as written so the parser names it in its error. Limits stand in for
/// requests the API server would have defaulted from them.
pub fn pod_resources(pod: &Pod) -> Result<Vec<(String, String)>, RequestError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let effective = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if let Some(r) = c.resources.as_ref() {
            for (k, Quantity(v)) in r.limits.iter().flatten() {
                m.insert(k.clone(), v.clone());
            }
            for (k, Quantity(v)) in r.requests.iter().flatten() {
                m.insert(k.clone(), v.clone());
            }
        }
        m
    };
    let mut cpu = 0u64;
    let mut mem = 0u64;
    let mut other: BTreeMap<String, String> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in effective(c) {
            match k.as_str() {
                "cpu" => cpu += request::parse_cpu_milli("cpu", &v)?,
                "memory" => mem += request::parse_memory_mib("memory", &v)?,
                _ => {
                    let merged = match (other.get(&k), v.trim().parse::<u64>()) {
                        (Some(prev), Ok(n)) => match prev.parse::<u64>() {
                            Ok(p) => (p + n).to_string(),
                            Err(_) => prev.clone(),
                        },
                        _ => v,
                    };
                    other.insert(k, merged);
                }
            }
        }
    }
    for c in spec.init_containers.iter().flatten() {
        let e = effective(c);
        if let Some(v) = e.get("cpu") {
            cpu = cpu.max(request::parse_cpu_milli("cpu", v)?);
        }
        if let Some(v) = e.get("memory") {
            mem = mem.max(request::parse_memory_mib("memory", v)?);
        }
    }
    let mut out = vec![
        ("cpu".to_string(), format!("{cpu}m")),
        ("memory".to_string(), format!("{mem}Mi")),
    ];
    out.extend(other);
    Ok(out)
}

/// Parses what the pod asks for with the core's parser (its errors name field and value).
pub fn pod_request(pod: &Pod, catalog: &Catalog) -> Result<Request, RequestError> {
    let resources = pod_resources(pod)?;
    request::parse(
        resources.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        annotations(pod).filter(|(k, _)| *k != tessera_core::allocation::ANNOTATION),
        catalog,
    )
}

/// Whether any container asks for a resource Tessera manages (`tessera.io/*`,
/// `nvidia.com/gpu`, `nvidia.com/mig-*`).
pub fn wants_gpu(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.requests.iter().flatten().chain(r.limits.iter().flatten()))
        .any(|(k, _)| {
            k.starts_with("tessera.io/")
                || k == request::RES_NVIDIA_GPU
                || k.starts_with(request::RES_NVIDIA_MIG_PREFIX)
        })
}

/// Scheduling facts about a node that the core does not model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub ready: bool,
    /// Countable resources the node offers besides CPU and memory (`pods`,
    /// `ephemeral-storage` in MiB, device-plugin resources), see [`crate::hostfit`].
    pub allocatable: BTreeMap<String, u64>,
}

/// Labels, taints, cordon and readiness of a node.
pub fn node_facts(node: &KubeNode) -> NodeFacts {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        // A node without conditions (e.g. registered by hand) is taken as ready.
        .unwrap_or(true);
    NodeFacts {
        name: node.metadata.name.clone().unwrap_or_default(),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        taints: node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
        unschedulable: node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        ready,
        allocatable: crate::hostfit::allocatable(node),
    }
}

/// Whether `toleration` tolerates `taint` (Kubernetes' `ToleratesTaint`).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    match toleration.key.as_deref() {
        None | Some("") => {
            // An empty key with Exists matches every taint.
            toleration.operator.as_deref() == Some("Exists")
        }
        Some(key) if key != taint.key => false,
        Some(_) => match toleration.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            _ => toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        },
    }
}

fn node_err(node: &str, problem: impl Into<String>) -> ConvertError {
    ConvertError::Node {
        node: node.to_string(),
        problem: problem.into(),
    }
}

/// A Kubernetes node plus its `GpuNode` inventory as a core node. Unknown GPU
/// models are added to `catalog` (no MIG tables for them).
pub fn core_node(
    node: &KubeNode,
    inventory: Option<&GpuNode>,
    catalog: &mut Catalog,
) -> Result<Node, ConvertError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(node_err("<unnamed>", "has no metadata.name"));
    }
    let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |key: &str| alloc.and_then(|a| a.get(key)).map(|q| q.0.as_str());
    let cpu_milli = match get("cpu") {
        Some(v) => request::parse_cpu_milli("status.allocatable.cpu", v)
            .map_err(|e| node_err(&name, e.to_string()))?,
        None => 0,
    };
    let memory_mib = match get("memory") {
        Some(v) => request::parse_memory_mib("status.allocatable.memory", v)
            .map_err(|e| node_err(&name, e.to_string()))?,
        None => 0,
    };
    let mut out = Node {
        name: name.clone(),
        cpu_milli,
        memory_mib,
        labels: node.metadata.labels.clone().unwrap_or_default(),
        gpus: Vec::new(),
        links: Vec::new(),
    };
    let Some(inv) = inventory else {
        return Ok(out);
    };
    let mut devices: Vec<&tessera_api::GpuDevice> = inv.spec.gpus.iter().collect();
    devices.sort_by_key(|d| d.index);
    if devices.windows(2).any(|w| w[0].index == w[1].index) {
        return Err(node_err(&name, "GpuNode lists a GPU index twice"));
    }
    if devices.len() > 64 {
        return Err(node_err(
            &name,
            format!(
                "GpuNode lists {} GPUs, at most 64 are supported",
                devices.len()
            ),
        ));
    }
    for d in &devices {
        let model = match catalog.find_product(&d.model, d.memory_mib) {
            Some(id) => id,
            None => catalog
                .add(GpuSpec {
                    name: d.model.clone(),
                    aliases: Vec::new(),
                    memory_mib: d.memory_mib,
                    sm_count: d.sm_count,
                    architecture: Architecture::Unknown,
                    mig: None,
                })
                .map_err(|e| node_err(&name, e.to_string()))?,
        };
        let health = match inv.spec.health_of(d.index, inv.status.as_ref()) {
            GpuHealth::Healthy => Health::Healthy,
            GpuHealth::Unhealthy => Health::Unhealthy,
        };
        out.gpus.push(Gpu {
            index: d.index,
            uuid: d.uuid.clone(),
            model,
            health,
            numa: d.numa,
            mig_enabled: d.mig.enabled,
            mig_instances: mig_instances(d, catalog.spec(model).mig.as_ref()),
        });
    }
    let n = devices.len();
    if devices.iter().any(|d| !d.links.is_empty()) {
        let pos: BTreeMap<u32, usize> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.index, i))
            .collect();
        let mut links = vec![Link::Unknown; n * n];
        for (a, d) in devices.iter().enumerate() {
            for l in &d.links {
                let Some(&b) = pos.get(&l.peer) else {
                    return Err(node_err(
                        &name,
                        format!(
                            "GPU {} links to GPU {}, which is not listed",
                            d.index, l.peer
                        ),
                    ));
                };
                if a != b {
                    links[a * n + b] = match l.kind {
                        LinkKind::NVLink => Link::NvLink(l.nvlinks.max(1)),
                        LinkKind::PCIeSwitch => Link::PcieSwitch,
                        LinkKind::SameSocket => Link::SameSocket,
                        LinkKind::CrossSocket => Link::CrossSocket,
                        LinkKind::Unknown => Link::Unknown,
                    };
                }
            }
        }
        out.links = links;
    }
    Ok(out)
}

/// The MIG instances of a GPU that Tessera can grant: those of a profile in the
/// model's table, at a placement the profile allows, not overlapping one already
/// taken. Others (a profile this build does not know, a hand-written placement that
/// cannot be) are left out rather than failing the node: they are never granted, and
/// the node's other GPUs stay schedulable. A GPU not in MIG mode has none.
fn mig_instances(d: &tessera_api::GpuDevice, geo: Option<&MigGeometry>) -> Vec<MigInstance> {
    let (Some(geo), true) = (geo, d.mig.enabled) else {
        return Vec::new();
    };
    let mut taken = 0u8;
    let mut out = Vec::with_capacity(d.mig.instances.len());
    for m in &d.mig.instances {
        let Some((pi, p)) = geo.profile(&m.profile) else {
            continue;
        };
        match geo.placement_mask(p, m.start) {
            Some(mask) if mask & taken == 0 => taken |= mask,
            _ => continue,
        }
        out.push(MigInstance {
            profile: pi as u8,
            start: m.start,
            uuid: m.uuid.clone(),
        });
    }
    out
}

/// The annotation value's content for a placement (unsigned; the binder signs it).
pub fn allocation_of(
    placement: &Placement,
    cluster: &Cluster,
    pod: &Pod,
    req: &Request,
    policy: &str,
) -> Allocation {
    let node = cluster.node(placement.node);
    let gpus = placement
        .grants
        .iter()
        .map(|g| {
            let gpu = &node.gpus[g.gpu as usize];
            // The instance the slot stands for, named by its UUID: the node agent
            // hands over exactly that device.
            let mig = g.mig.map(|slot| MigGrant {
                profile: cluster
                    .catalog
                    .spec(gpu.model)
                    .mig
                    .as_ref()
                    .and_then(|geo| geo.profiles.get(slot.profile as usize))
                    .map(|p| p.name.clone())
                    .unwrap_or_default(),
                start: slot.start,
                size: slot.size,
                uuid: gpu
                    .mig_instances
                    .iter()
                    .find(|m| m.profile == slot.profile && m.start == slot.start)
                    .map(|m| m.uuid.clone())
                    .unwrap_or_default(),
            });
            AllocatedGpu {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                memory_mib: g.memory_mib,
                cores_milli: g.cores_milli,
                mig,
            }
        })
        .collect();
    Allocation {
        version: VERSION,
        pod_uid: pod_uid(pod).to_string(),
        pod: pod_key(pod),
        node: node.name.clone(),
        policy: policy.to_string(),
        isolation: req.isolation,
        gpus,
        signature: String::new(),
    }
}

/// The placement an allocation annotation stands for, to replay into a ledger.
pub fn placement_of(
    allocation: &Allocation,
    cluster: &Cluster,
    node: NodeId,
    req: &Request,
) -> Result<Placement, ConvertError> {
    let n = cluster.node(node);
    let fail = |problem: String| ConvertError::Allocation {
        pod: allocation.pod.clone(),
        problem,
    };
    let mut grants: SmallVec<[GpuGrant; 8]> = SmallVec::new();
    for a in &allocation.gpus {
        let Some(pos) = n.gpus.iter().position(|g| g.index == a.index) else {
            return Err(fail(format!(
                "node {} has no GPU with index {}",
                n.name, a.index
            )));
        };
        if let Some(m) = &a.mig {
            let gpu = &n.gpus[pos];
            let spec = cluster.catalog.spec(gpu.model);
            let Some((geo, (pi, p))) = spec
                .mig
                .as_ref()
                .and_then(|geo| Some((geo, geo.profile(&m.profile)?)))
            else {
                return Err(fail(format!(
                    "GPU {} ({}) has no MIG profile {:?}",
                    a.index, spec.name, m.profile
                )));
            };
            // The instance the agent handed over is the one with this UUID; where the
            // inventory lists it, its placement there is the truth. An annotation
            // without a UUID, or an instance the inventory no longer lists, keeps
            // the placement written, so the slices stay counted either way.
            let start = gpu
                .mig_instances
                .iter()
                .find(|i| !m.uuid.is_empty() && i.uuid == m.uuid && i.profile as usize == pi)
                .map_or(m.start, |i| i.start);
            if geo.placement_mask(p, start).is_none() {
                return Err(fail(format!(
                    "GPU {}: MIG {} cannot start at memory slice {start}",
                    a.index, m.profile
                )));
            }
            let slot = MigSlot {
                profile: pi as u8,
                start,
                size: p.memory_slices,
                compute: p.compute_slices,
            };
            // Memory and compute from the profile, as the scheduler granted them.
            grants.push(fit::mig_grant(pos as u8, geo, p, slot));
            continue;
        }
        let exclusive = matches!(req.gpu, GpuAsk::Whole { .. })
            || (req.gpu == GpuAsk::None
                && allocation.isolation == Isolation::Exclusive
                && a.cores_milli == 1000);
        grants.push(GpuGrant {
            gpu: pos as u8,
            memory_mib: a.memory_mib,
            cores_milli: a.cores_milli,
            exclusive,
            mig: None,
        });
    }
    Ok(Placement {
        node,
        grants,
        cpu_milli: req.cpu_milli,
        memory_mib: req.memory_mib,
        class: request_class(req),
        score: 0.0,
        terms: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};

    use super::*;

    pub(crate) fn pod_with(resources: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ml".into()),
                uid: Some("uid-p".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(
                            resources
                                .iter()
                                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn requests_sum_over_containers_and_parse() {
        let mut pod = pod_with(
            &[("cpu", "500m"), ("memory", "1Gi"), ("tessera.io/gpu", "1")],
            &[],
        );
        let spec = pod.spec.as_mut().unwrap();
        let mut second = spec.containers[0].clone();
        second.name = "d".into();
        spec.containers.push(second);
        let req = pod_request(&pod, &Catalog::default()).unwrap();
        // 500m + 500m, 1024 + 1024 MiB, 1 + 1 GPUs.
        assert_eq!(
            (req.cpu_milli, req.memory_mib, req.gpu.gpu_count()),
            (1000, 2048, 2)
        );
        assert!(wants_gpu(&pod));
    }

    #[test]
    fn parser_errors_name_the_field() {
        let pod = pod_with(
            &[("tessera.io/gpu", "1"), ("tessera.io/gpu-memory", "-5")],
            &[],
        );
        let e = pod_request(&pod, &Catalog::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tessera.io/gpu-memory"), "{e}");
        let pod = pod_with(&[("tessera.io/mig-9g.999gb", "1")], &[]);
        let e = pod_request(&pod, &Catalog::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown MIG profile"), "{e}");
    }

    #[test]
    fn toleration_matching() {
        let taint = Taint {
            key: "gpu".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let tol =
            |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
                key: key.map(str::to_string),
                operator: Some(op.into()),
                value: value.map(str::to_string),
                effect: effect.map(str::to_string),
                ..Default::default()
            };
        assert!(tolerates(
            &tol(Some("gpu"), "Equal", Some("true"), None),
            &taint
        ));
        assert!(tolerates(
            &tol(Some("gpu"), "Exists", None, Some("NoSchedule")),
            &taint
        ));
        assert!(tolerates(&tol(None, "Exists", None, None), &taint));
        assert!(!tolerates(
            &tol(Some("gpu"), "Equal", Some("false"), None),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some("gpu"), "Exists", None, Some("NoExecute")),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some("other"), "Exists", None, None),
            &taint
        ));
    }
}
