//! The cluster as the scheduler sees it: nodes with CPU, memory, labels and GPUs.
//!
//! This is the static side (capacity, topology, health). What is in use lives in
//! the [`crate::ledger::Ledger`], so a placement decision reads both and changes
//! only the ledger.

pub mod demo;
pub mod file;
pub mod single;
pub mod spec;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use spec::{Architecture, Catalog, GpuSpec, MigGeometry, MigProfile, ModelId, ModelSet};

/// Index of a node in its [`Cluster`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct NodeId(pub u32);

/// Whether a GPU may receive work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    #[default]
    Healthy,
    Unhealthy,
}

/// How two GPUs of one node are connected, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum Link {
    /// NVLink with this many links between the pair (NVSwitch systems report the per-GPU count).
    NvLink(u8),
    /// Same PCIe switch.
    PcieSwitch,
    /// Same CPU socket, different PCIe switches.
    SameSocket,
    /// Across the socket interconnect.
    CrossSocket,
    /// Not reported (traces carry no topology).
    #[default]
    Unknown,
}

impl Link {
    /// Relative bandwidth class used by topology scoring: higher is better.
    pub fn rank(self) -> u32 {
        match self {
            Link::NvLink(n) => 100 + u32::from(n),
            Link::PcieSwitch => 40,
            Link::SameSocket => 20,
            Link::CrossSocket => 5,
            Link::Unknown => 10,
        }
    }
    pub fn is_nvlink(self) -> bool {
        matches!(self, Link::NvLink(n) if n > 0)
    }
}

/// One physical GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index on the node.
    pub index: u32,
    /// `GPU-…` UUID; empty when unknown (traces).
    #[serde(default)]
    pub uuid: String,
    pub model: ModelId,
    #[serde(default)]
    pub health: Health,
    /// NUMA node of the GPU's PCIe root, when known.
    #[serde(default)]
    pub numa: Option<u8>,
    /// MIG mode on: the GPU only takes MIG requests.
    #[serde(default)]
    pub mig_enabled: bool,
    /// The MIG instances that exist on the GPU (only when `mig_enabled`). Tessera
    /// grants these, and plans new ones only on nodes that allow dynamic MIG
    /// (`tessera.io/mig-dynamic`), where the node agent creates them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_instances: Vec<MigInstance>,
    /// This entry is one MIG instance of a physical GPU (its `uuid` is the
    /// instance's), served as a GPU of its own because the node's MIG strategy is
    /// `single` ([`single`]). Such an entry takes whole-GPU asks only; no share
    /// and no MIG request lands on it. (A flag, not the parent's UUID: it fits in
    /// the struct's padding; the inventory names the parent where it is needed.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mig_instance: bool,
}

/// One MIG GPU instance that exists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// Index into the GPU model's MIG profile table.
    pub profile: u8,
    /// First memory slice of its placement (its size is the profile's).
    pub start: u8,
    /// `MIG-…` UUID of the device; empty when the inventory does not say.
    #[serde(default)]
    pub uuid: String,
}

/// A node and its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// Allocatable CPU in milli-cores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<Gpu>,
    /// Pairwise links, row-major `gpus.len() × gpus.len()`; empty means all unknown.
    #[serde(default)]
    pub links: Vec<Link>,
}

impl Node {
    /// A node with `count` GPUs of one model and no topology information.
    pub fn uniform(
        name: impl Into<String>,
        cpu_milli: u64,
        memory_mib: u64,
        model: ModelId,
        count: u32,
    ) -> Node {
        Node {
            name: name.into(),
            cpu_milli,
            memory_mib,
            labels: BTreeMap::new(),
            gpus: (0..count)
                .map(|index| Gpu {
                    index,
                    uuid: String::new(),
                    model,
                    health: Health::Healthy,
                    numa: None,
                    mig_enabled: false,
                    mig_instances: Vec::new(),
                    mig_instance: false,
                })
                .collect(),
            links: Vec::new(),
        }
    }

    /// The link between GPUs at positions `a` and `b` of [`Node::gpus`].
    pub fn link(&self, a: usize, b: usize) -> Link {
        let n = self.gpus.len();
        if a == b || self.links.len() != n * n {
            return Link::Unknown;
        }
        self.links[a * n + b]
    }

    /// The model of the node's first GPU (nodes are homogeneous in practice).
    pub fn primary_model(&self) -> Option<ModelId> {
        self.gpus.first().map(|g| g.model)
    }
}

/// Why a cluster description was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClusterError {
    #[error("node {node}: duplicate node name")]
    DuplicateNode { node: String },
    #[error(
        "node {node}: links table has {found} entries, expected {expected} ({gpus} GPUs squared)"
    )]
    BadLinks {
        node: String,
        found: usize,
        expected: usize,
        gpus: usize,
    },
    #[error("node {node}: GPU model id {model} is not in the catalog")]
    UnknownModel { node: String, model: u8 },
    #[error("node {node}: {count} GPUs is more than the 64 a node may have")]
    TooManyGpus { node: String, count: usize },
    #[error("node {node}: GPU {gpu}: {problem}")]
    BadMigInstance {
        node: String,
        gpu: u32,
        problem: String,
    },
}

/// What is wrong with a GPU's MIG instances, if anything: each must be in MIG
/// mode, of a profile of its model, at a placement the profile allows, and no two
/// may share memory slices (the ledger tracks instances by their slices).
fn mig_instance_problem(catalog: &Catalog, gpu: &Gpu) -> Option<String> {
    if gpu.mig_instances.is_empty() {
        return None;
    }
    if !gpu.mig_enabled {
        return Some("lists MIG instances but is not in MIG mode".into());
    }
    let spec = catalog.spec(gpu.model);
    let Some(geo) = spec.mig.as_ref() else {
        return Some(format!("lists MIG instances but {} has no MIG", spec.name));
    };
    let mut taken = 0u8;
    for m in &gpu.mig_instances {
        let Some(p) = geo.profiles.get(m.profile as usize) else {
            return Some(format!(
                "MIG instance {:?}: profile {} is not in the {} table",
                m.uuid, m.profile, spec.name
            ));
        };
        let Some(mask) = geo.placement_mask(p, m.start) else {
            return Some(format!(
                "MIG instance {:?}: {} cannot start at memory slice {}",
                m.uuid, p.name, m.start
            ));
        };
        if taken & mask != 0 {
            return Some(format!(
                "MIG instance {:?} overlaps another instance",
                m.uuid
            ));
        }
        taken |= mask;
    }
    None
}

/// The static cluster: nodes in a fixed order (ties between equal scores go to the earlier node).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cluster {
    pub catalog: Catalog,
    nodes: Vec<Node>,
    by_name: BTreeMap<String, NodeId>,
}

impl Cluster {
    /// Builds a cluster, checking names, models and link tables.
    pub fn new(catalog: Catalog, nodes: Vec<Node>) -> Result<Cluster, ClusterError> {
        let mut by_name = BTreeMap::new();
        for (i, node) in nodes.iter().enumerate() {
            if by_name
                .insert(node.name.clone(), NodeId(i as u32))
                .is_some()
            {
                return Err(ClusterError::DuplicateNode {
                    node: node.name.clone(),
                });
            }
            let n = node.gpus.len();
            if n > 64 {
                return Err(ClusterError::TooManyGpus {
                    node: node.name.clone(),
                    count: n,
                });
            }
            if !node.links.is_empty() && node.links.len() != n * n {
                return Err(ClusterError::BadLinks {
                    node: node.name.clone(),
                    found: node.links.len(),
                    expected: n * n,
                    gpus: n,
                });
            }
            if let Some(g) = node
                .gpus
                .iter()
                .find(|g| g.model.0 as usize >= catalog.specs().len())
            {
                return Err(ClusterError::UnknownModel {
                    node: node.name.clone(),
                    model: g.model.0,
                });
            }
            for g in &node.gpus {
                if let Some(problem) = mig_instance_problem(&catalog, g) {
                    return Err(ClusterError::BadMigInstance {
                        node: node.name.clone(),
                        gpu: g.index,
                        problem,
                    });
                }
            }
        }
        Ok(Cluster {
            catalog,
            nodes,
            by_name,
        })
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum()
    }

    /// Marks one GPU healthy or not (health is static state: the ledger does not own it).
    pub fn set_health(&mut self, node: NodeId, gpu: usize, health: Health) {
        if let Some(g) = self
            .nodes
            .get_mut(node.0 as usize)
            .and_then(|n| n.gpus.get_mut(gpu))
        {
            g.health = health;
        }
    }

    /// Replaces one GPU's MIG mode and instances, as a node agent reports them after
    /// applying a planned layout (MIG layout is static state, like health). Refused,
    /// changing nothing, when the layout is not valid for the GPU's model.
    pub fn set_mig_layout(
        &mut self,
        node: NodeId,
        gpu: usize,
        enabled: bool,
        instances: Vec<MigInstance>,
    ) -> Result<(), ClusterError> {
        let Some(n) = self.nodes.get_mut(node.0 as usize) else {
            return Ok(());
        };
        let Some(g) = n.gpus.get_mut(gpu) else {
            return Ok(());
        };
        let mut next = g.clone();
        next.mig_enabled = enabled;
        next.mig_instances = instances;
        if let Some(problem) = mig_instance_problem(&self.catalog, &next) {
            return Err(ClusterError::BadMigInstance {
                node: n.name.clone(),
                gpu: next.index,
                problem,
            });
        }
        *g = next;
        Ok(())
    }

    /// Ids of all nodes in order.
    pub fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len() as u32).map(NodeId)
    }
}

/// Node label: what the node agent may do to MIG on this node's GPUs on the
/// scheduler's behalf. `instances`: create and destroy instances on GPUs already in
/// MIG mode; `mode`: also switch idle GPUs into MIG mode (and back). Absent or any
/// other value: nothing, Tessera only grants instances that exist.
pub const LABEL_MIG_DYNAMIC: &str = "tessera.io/mig-dynamic";

/// What a node allows the scheduler to plan for MIG (see [`LABEL_MIG_DYNAMIC`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum MigDynamic {
    /// Only existing instances are granted.
    #[default]
    Off,
    /// Instances may be created in free MIG space of GPUs in MIG mode.
    Instances,
    /// Idle GPUs may also be switched into MIG mode.
    Mode,
}

impl MigDynamic {
    /// The node's setting. An unknown value means [`MigDynamic::Off`]: a typo must
    /// not let the scheduler re-partition GPUs nobody agreed to.
    pub fn of(node: &Node) -> MigDynamic {
        MigDynamic::from_label(node.labels.get(LABEL_MIG_DYNAMIC).map(String::as_str))
    }

    /// The setting a [`LABEL_MIG_DYNAMIC`] value (`None`: no label) says, by the
    /// same rule as [`MigDynamic::of`]; the node agent reads its Node's label with it.
    pub fn from_label(value: Option<&str>) -> MigDynamic {
        match value.map(str::trim) {
            Some("instances") => MigDynamic::Instances,
            Some("mode") => MigDynamic::Mode,
            _ => MigDynamic::Off,
        }
    }
}

/// GPUs of each model id in `cluster` (indexed by [`crate::model::ModelId`]).
pub fn gpus_per_model(cluster: &Cluster) -> Vec<u32> {
    let mut n = vec![0u32; cluster.catalog.specs().len()];
    for node in cluster.nodes() {
        for g in &node.gpus {
            if let Some(c) = n.get_mut(g.model.0 as usize) {
                *c += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_instances_must_be_able_to_exist() {
        let catalog = Catalog::default();
        let a100 = catalog.find("A100-80GB").unwrap();
        let (p3g, _) = catalog
            .spec(a100)
            .mig
            .as_ref()
            .unwrap()
            .profile("3g.40gb")
            .unwrap();
        let with = |enabled: bool, instances: &[(usize, u8)]| {
            let mut n = Node::uniform("n", 1000, 1000, a100, 1);
            n.gpus[0].mig_enabled = enabled;
            n.gpus[0].mig_instances = instances
                .iter()
                .map(|&(profile, start)| MigInstance {
                    profile: profile as u8,
                    start,
                    uuid: format!("MIG-{start}"),
                })
                .collect();
            Cluster::new(catalog.clone(), vec![n])
        };
        assert!(with(true, &[(p3g, 0), (p3g, 4)]).is_ok());
        let problem = |r: Result<Cluster, ClusterError>| match r {
            Err(ClusterError::BadMigInstance { problem, .. }) => problem,
            other => panic!("expected a bad MIG instance, got {other:?}"),
        };
        assert!(problem(with(false, &[(p3g, 0)])).contains("not in MIG mode"));
        assert!(problem(with(true, &[(p3g, 2)])).contains("cannot start at memory slice 2"));
        assert!(problem(with(true, &[(p3g, 4), (p3g, 4)])).contains("overlaps"));
        assert!(problem(with(true, &[(99, 0)])).contains("not in the A100-80GB table"));
    }
}
