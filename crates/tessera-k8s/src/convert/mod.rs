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
use tessera_core::model::single::{self, MigStrategy};
use tessera_core::model::{
    Architecture, Catalog, Gpu, GpuSpec, Health, Link, MigGeometry, MigInstance, Node,
};
use tessera_core::placement::{GpuGrant, MigSlot, Placement, request_class};
use tessera_core::request::{self, GpuAsk, Isolation, Request, RequestError};
use tessera_core::{Cluster, NodeId, containers};

/// Why a Kubernetes object could not be turned into a core value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("node {node}: {problem}")]
    Node { node: String, problem: String },
    #[error("allocation of pod {pod}: {problem}")]
    Allocation { pod: String, problem: String },
    /// The grant names a GPU (by UUID) the node's inventory does not list: it
    /// disappeared, or the annotation was written for another node.
    #[error("allocation of pod {pod}: node {node} has no GPU {uuid}")]
    GpuGone {
        pod: String,
        node: String,
        uuid: String,
    },
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

/// Held back by scheduling gates (Kueue's admission gate, for one): the API
/// server refuses to bind it (409) until every gate is removed, and no
/// scheduler may place it before then.
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
}

/// `spec.preemptionPolicy: Never`: the pod waits for room and never evicts
/// others to get it (kube-scheduler's DefaultPreemption skips it too).
pub fn never_preempts(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never")
}

/// The pod's annotations as `(key, value)` pairs.
pub fn annotations(pod: &Pod) -> impl Iterator<Item = (&str, &str)> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

/// The pod's containers as the core sees them: init containers (sidecars when
/// `restartPolicy: Always`) in spec order, then app containers. Requests win
/// over limits; limits stand in for requests the API server would have
/// defaulted from them.
pub fn pod_containers(pod: &Pod) -> Vec<containers::Container> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let convert = |c: &k8s_openapi::api::core::v1::Container, kind| {
        let mut resources = BTreeMap::new();
        if let Some(r) = c.resources.as_ref() {
            for (k, Quantity(v)) in r.limits.iter().flatten().chain(r.requests.iter().flatten()) {
                resources.insert(k.clone(), v.clone());
            }
        }
        containers::Container {
            name: c.name.clone(),
            kind,
            resources,
        }
    };
    let init = spec.init_containers.iter().flatten().map(|c| {
        let kind = if c.restart_policy.as_deref() == Some("Always") {
            containers::ContainerKind::Sidecar
        } else {
            containers::ContainerKind::Init
        };
        convert(c, kind)
    });
    init.chain(
        spec.containers
            .iter()
            .map(|c| convert(c, containers::ContainerKind::App)),
    )
    .collect()
}

/// The pod's effective resource requests as strings for the core parser:
/// Kubernetes' rule (the larger of the largest init container and the sum of
/// app containers and sidecars) and Tessera's rules for GPU shares over
/// containers, in [`containers::effective_request`], which the node agent
/// shares. Overflowing sums are refused.
pub fn pod_resources(pod: &Pod) -> Result<Vec<(String, String)>, RequestError> {
    containers::effective_request(&pod_containers(pod))
}

/// The pod `namespace/name` in a listed set.
pub fn find_pod<'a>(pods: &'a [Pod], namespace: &str, name: &str) -> Option<&'a Pod> {
    pods.iter().find(|p| {
        p.metadata.namespace.as_deref() == Some(namespace)
            && p.metadata.name.as_deref() == Some(name)
    })
}

/// Parses what the pod asks for with the core's parser (its errors name field and value).
pub fn pod_request(pod: &Pod, catalog: &Catalog) -> Result<Request, RequestError> {
    request_from(&pod_resources(pod)?, pod, catalog)
}

/// [`pod_request`] from the pod's [`pod_resources`], already computed.
fn request_from(
    resources: &[(String, String)],
    pod: &Pod,
    catalog: &Catalog,
) -> Result<Request, RequestError> {
    request::parse(
        resources.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        annotations(pod).filter(|(k, _)| *k != tessera_core::allocation::ANNOTATION),
        catalog,
    )
}

/// Both things a pod asks, from one reading of its containers: what the core
/// places ([`pod_request`]) and the countable node resources
/// ([`crate::hostfit::host_ask`]), each with its own outcome.
pub struct PodAsks {
    pub request: Result<Request, RequestError>,
    pub host: Result<crate::hostfit::HostAsk, String>,
}

/// [`PodAsks`] for `pod`: the effective request is computed once.
pub fn pod_asks(pod: &Pod, catalog: &Catalog) -> PodAsks {
    match pod_resources(pod) {
        Ok(resources) => PodAsks {
            request: request_from(&resources, pod, catalog),
            host: crate::hostfit::host_ask_from(&resources),
        },
        Err(e) => PodAsks {
            host: Err(e.to_string()),
            request: Err(e),
        },
    }
}

/// Whether any container (init containers and sidecars included, as in
/// [`pod_resources`]) asks for a resource Tessera manages (`tessera.io/*`,
/// `nvidia.com/gpu`, `nvidia.com/mig-*`).
pub fn wants_gpu(pod: &Pod) -> bool {
    pod_containers(pod)
        .iter()
        .flat_map(|c| c.resources.keys())
        .any(|k| containers::is_gpu_resource(k))
}

/// Whether any container asks for a GPU device resource of any plugin: those
/// [`wants_gpu`] names and the other `nvidia.com/gpu*` resources (e.g.
/// `nvidia.com/gpu.shared` under NVIDIA's time-slicing).
pub fn asks_gpu_device(pod: &Pod) -> bool {
    pod_containers(pod)
        .iter()
        .flat_map(|c| c.resources.keys())
        .any(|k| containers::is_gpu_resource(k) || k.starts_with("nvidia.com/gpu"))
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
            mig_instance: false,
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
    // The GPU Operator's "single" MIG strategy: every instance is a GPU.
    if MigStrategy::of(&out.labels) == MigStrategy::Single {
        single::serve_instances_whole(&mut out, catalog)
            .map_err(|e| node_err(&name, e.to_string()))?;
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
                // A share at an isolation level may get an instance the scheduler
                // planned: the agent creates it (and switches the GPU's mode first).
                create: fit::mig_layout::mig_intent(gpu, &slot).0,
                enable_mig_mode: fit::mig_layout::mig_intent(gpu, &slot).1,
            });
            AllocatedGpu {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                memory_mib: g.memory_mib,
                cores_milli: g.cores_milli,
                mig,
            }
        })
        .collect::<Vec<_>>();
    // Only pods with several GPU containers get the list (see the allocation
    // module); a grant that cannot be split leaves it empty, and the node agent
    // then refuses such a pod rather than give every container every GPU.
    let containers = containers::gpu_demands(&pod_containers(pod))
        .ok()
        .filter(|d| d.len() > 1)
        .and_then(|d| containers::assign(&d, gpus.len()).ok())
        .unwrap_or_default();
    Allocation {
        version: VERSION,
        pod_uid: pod_uid(pod).to_string(),
        pod: pod_key(pod),
        node: node.name.clone(),
        policy: policy.to_string(),
        // The mechanism the scheduler chose when the pod asked for a level only.
        isolation: match (req.level, placement.grants.first()) {
            (Some(_), Some(g)) => fit::mig_layout::mechanism(req, g),
            _ => req.isolation,
        },
        gpus,
        containers,
        signature: String::new(),
    }
}

/// A granted MIG instance that the node, as read now, lists in the other form
/// than the grant names it: a whole GPU (single strategy) that is an instance of
/// a GPU in MIG mode now, or an instance granted by profile that is a GPU of its
/// own now. `None` when neither names it.
fn instance_grant(cluster: &Cluster, n: &Node, a: &AllocatedGpu) -> Option<GpuGrant> {
    if let Some(m) = a.mig.as_ref().filter(|m| !m.uuid.is_empty()) {
        let pos = n.gpus.iter().position(|g| g.uuid == m.uuid)?;
        let spec = cluster.catalog.spec(n.gpus[pos].model);
        return Some(GpuGrant::whole(pos as u8, spec.memory_mib));
    }
    if a.mig.is_some() || a.uuid.is_empty() {
        return None;
    }
    let (pos, gpu, inst) = n.gpus.iter().enumerate().find_map(|(pos, g)| {
        let inst = g.mig_instances.iter().find(|m| m.uuid == a.uuid)?;
        Some((pos, g, inst))
    })?;
    let geo = cluster.catalog.spec(gpu.model).mig.as_ref()?;
    let p = geo.profiles.get(inst.profile as usize)?;
    let slot = MigSlot {
        profile: inst.profile,
        start: inst.start,
        size: p.memory_slices,
        compute: p.compute_slices,
    };
    Some(fit::mig_grant(pos as u8, geo, p, slot))
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
        // The GPU is the one with the granted UUID, the node agent's key: NVML
        // renumbers the others when one disappears, so an index may now name
        // another GPU. Only a grant without a UUID falls back to its index.
        let pos = if a.uuid.is_empty() {
            n.gpus.iter().position(|g| g.index == a.index)
        } else {
            n.gpus.iter().position(|g| g.uuid == a.uuid)
        };
        let Some(pos) = pos else {
            // The node's MIG strategy changed under a running pod: its instance is
            // still its own, counted as the node is read now.
            if let Some(grant) = instance_grant(cluster, n, a) {
                grants.push(grant);
                continue;
            }
            if !a.uuid.is_empty() {
                return Err(ConvertError::GpuGone {
                    pod: allocation.pod.clone(),
                    node: n.name.clone(),
                    uuid: a.uuid.clone(),
                });
            }
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
mod tests;
