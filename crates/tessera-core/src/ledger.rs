//! The ledger: what is in use on every node and GPU, and by which allocation.
//!
//! It is the single source of truth inside a process. [`Ledger::apply`] checks a
//! placement against capacity and refuses anything that would over-commit CPU,
//! memory, GPU memory, GPU compute, exclusive GPUs or MIG slices; [`Ledger::release`]
//! gives it back. Checkpoints let a caller try several placements (a gang) and
//! undo them all. Every change is logged by node so that score caches can
//! refresh only what changed.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::model::MigDynamic;
use crate::model::{Cluster, Health, NodeId};
use crate::placement::{GpuGrant, Placement};

/// Identifies one applied placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AllocId(pub u64);

/// Use of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuUse {
    pub free_memory_mib: u64,
    /// Free compute in per-mille (1000 = idle).
    pub free_cores_milli: u32,
    /// Allocations holding part of this GPU.
    pub tenants: u16,
    /// Held whole by one allocation.
    pub exclusive: bool,
    /// MIG memory slices in use (bit i = slice i).
    pub mig_memory_slices: u8,
    /// MIG compute slices in use.
    pub mig_compute_slices: u8,
    /// MIG instances in use per profile (index into the model's profile table).
    pub mig_instances: [u8; 8],
}

impl GpuUse {
    /// A GPU of `memory_mib` that nobody holds any part of.
    pub fn idle(memory_mib: u64) -> GpuUse {
        GpuUse {
            free_memory_mib: memory_mib,
            free_cores_milli: 1000,
            tenants: 0,
            exclusive: false,
            mig_memory_slices: 0,
            mig_compute_slices: 0,
            mig_instances: [0; 8],
        }
    }
    /// Nobody holds any part of it.
    pub fn is_idle(&self) -> bool {
        self.tenants == 0
    }
}

/// Use of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUse {
    pub free_cpu_milli: u64,
    pub free_memory_mib: u64,
    pub gpus: SmallVec<[GpuUse; 8]>,
    /// Resident GPU pods by request class ([`Placement::class`]), with counts.
    pub classes: SmallVec<[(u32, u16); 4]>,
    /// Allocations on this node.
    pub allocations: u32,
    /// Upper bounds over the node's GPUs, kept current by the ledger, so that a
    /// scheduler can skip nodes that cannot fit a request without a pass over the GPUs.
    pub summary: GpuSummary,
}

/// Per-node maxima over its GPUs (counting every GPU, healthy or not, MIG or not:
/// they bound what the fit filter can find, they do not replace it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuSummary {
    /// GPUs nobody holds any part of.
    pub idle_gpus: u8,
    /// Largest free compute on one GPU, per-mille.
    pub max_free_cores_milli: u32,
    /// Largest free memory on one GPU, MiB.
    pub max_free_memory_mib: u64,
}

impl GpuSummary {
    fn of(gpus: &[GpuUse]) -> GpuSummary {
        GpuSummary {
            idle_gpus: gpus.iter().filter(|g| g.is_idle()).count().min(255) as u8,
            max_free_cores_milli: gpus.iter().map(|g| g.free_cores_milli).max().unwrap_or(0),
            max_free_memory_mib: gpus.iter().map(|g| g.free_memory_mib).max().unwrap_or(0),
        }
    }
}

impl NodeUse {
    /// Free compute per GPU in per-mille, in GPU order (the openb trace's view of a node).
    pub fn free_milli(&self) -> impl Iterator<Item = u32> + '_ {
        self.gpus.iter().map(|g| g.free_cores_milli)
    }
    /// GPUs nobody holds any part of.
    pub fn idle_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| g.is_idle()).count()
    }
    /// Allocated GPU compute on this node in milli-GPU.
    pub fn used_milli(&self) -> u64 {
        self.gpus
            .iter()
            .map(|g| u64::from(1000 - g.free_cores_milli))
            .sum()
    }
}

/// Why the ledger refused a change. Placements come from the scheduler, so these
/// mean a stale decision or a bug, never a normal "does not fit".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("node {0:?} does not exist")]
    NoSuchNode(NodeId),
    #[error("node {node}: GPU {gpu} does not exist")]
    NoSuchGpu { node: String, gpu: u8 },
    #[error("node {node}: not enough CPU ({want} m asked, {free} m free)")]
    Cpu { node: String, want: u64, free: u64 },
    #[error("node {node}: not enough memory ({want} MiB asked, {free} MiB free)")]
    Memory { node: String, want: u64, free: u64 },
    #[error("node {node}: GPU {gpu} cannot take this grant ({why})")]
    Gpu {
        node: String,
        gpu: u8,
        why: &'static str,
    },
    #[error("node {node}: a placement names GPU {gpu} twice")]
    DuplicateGpu { node: String, gpu: u8 },
    #[error("allocation {0:?} is not in the ledger")]
    UnknownAllocation(AllocId),
    #[error("checkpoint is not the innermost open one")]
    BadCheckpoint,
}

#[derive(Debug, Clone)]
enum JournalOp {
    Applied(AllocId),
    Released(AllocId, Box<Placement>),
}

/// A point to roll back to (see [`Ledger::checkpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a checkpoint must be committed or rolled back"]
pub struct Checkpoint {
    depth: usize,
    journal_len: usize,
}

/// The ledger of one cluster.
#[derive(Debug, Clone)]
pub struct Ledger {
    nodes: Vec<NodeUse>,
    allocations: FxHashMap<AllocId, Placement>,
    next_id: u64,
    used_milli: u64,
    /// Allocated GPU compute by model id, in milli-GPU.
    used_by_model: Vec<u64>,
    /// GPUs of each model id in the cluster.
    gpus_by_model: Vec<u32>,
    /// The model id of every GPU, by node (what a release needs to count it back).
    gpu_models: Vec<SmallVec<[u8; 8]>>,
    journal: Vec<JournalOp>,
    open_checkpoints: usize,
    /// Nodes changed, in order; `change_base` entries were dropped from the front.
    changes: Vec<NodeId>,
    change_base: u64,
}

impl Ledger {
    /// An empty ledger for `cluster`.
    pub fn new(cluster: &Cluster) -> Ledger {
        let nodes = cluster
            .nodes()
            .iter()
            .map(|n| {
                let gpus: SmallVec<[GpuUse; 8]> = n
                    .gpus
                    .iter()
                    .map(|g| GpuUse::idle(cluster.catalog.spec(g.model).memory_mib))
                    .collect();
                NodeUse {
                    free_cpu_milli: n.cpu_milli,
                    free_memory_mib: n.memory_mib,
                    summary: GpuSummary::of(&gpus),
                    gpus,
                    classes: SmallVec::new(),
                    allocations: 0,
                }
            })
            .collect();
        Ledger {
            nodes,
            allocations: FxHashMap::default(),
            next_id: 1,
            used_milli: 0,
            used_by_model: vec![0; cluster.catalog.specs().len()],
            gpus_by_model: crate::model::gpus_per_model(cluster),
            gpu_models: cluster
                .nodes()
                .iter()
                .map(|n| n.gpus.iter().map(|g| g.model.0).collect())
                .collect(),
            journal: Vec::new(),
            open_checkpoints: 0,
            changes: Vec::new(),
            change_base: 0,
        }
    }

    pub fn node(&self, id: NodeId) -> &NodeUse {
        &self.nodes[id.0 as usize]
    }

    pub fn nodes(&self) -> &[NodeUse] {
        &self.nodes
    }

    pub fn allocation(&self, id: AllocId) -> Option<&Placement> {
        self.allocations.get(&id)
    }

    pub fn allocations(&self) -> impl Iterator<Item = (AllocId, &Placement)> {
        self.allocations.iter().map(|(k, v)| (*k, v))
    }

    pub fn allocation_count(&self) -> usize {
        self.allocations.len()
    }

    /// Allocated GPU compute across the cluster, in milli-GPU.
    pub fn used_milli(&self) -> u64 {
        self.used_milli
    }

    /// Allocated GPU compute by model id ([`crate::model::ModelId`]), in milli-GPU.
    pub fn used_milli_by_model(&self) -> &[u64] {
        &self.used_by_model
    }

    /// GPU compute still free by model id, in milli-GPU (saturating at `u32::MAX`):
    /// the supply Tessera's model pressure is weighed against
    /// ([`crate::policy::PolicyArgs::model_supply`]).
    pub fn free_milli_by_model(&self) -> Vec<u32> {
        self.gpus_by_model
            .iter()
            .zip(&self.used_by_model)
            .map(|(&n, &used)| {
                u32::try_from((u64::from(n) * 1000).saturating_sub(used)).unwrap_or(u32::MAX)
            })
            .collect()
    }

    /// Applies a placement, or refuses it without changing anything.
    pub fn apply(
        &mut self,
        cluster: &Cluster,
        placement: &Placement,
    ) -> Result<AllocId, LedgerError> {
        let id = AllocId(self.next_id);
        self.apply_as(cluster, id, placement)?;
        self.next_id += 1;
        if self.open_checkpoints > 0 {
            self.journal.push(JournalOp::Applied(id));
        }
        Ok(id)
    }

    /// Applies a placement that was granted earlier (replayed from a bound pod's
    /// grant): the same checks as [`Ledger::apply`] but the GPUs' health, since a
    /// GPU that turned unhealthy under a running pod is still held by it. Only new
    /// grants avoid unhealthy GPUs.
    pub fn apply_existing(
        &mut self,
        cluster: &Cluster,
        placement: &Placement,
    ) -> Result<AllocId, LedgerError> {
        let id = AllocId(self.next_id);
        self.check_as(cluster, placement, false)?;
        self.apply_checked(id, placement);
        self.next_id += 1;
        if self.open_checkpoints > 0 {
            self.journal.push(JournalOp::Applied(id));
        }
        Ok(id)
    }

    fn check(&self, cluster: &Cluster, p: &Placement) -> Result<(), LedgerError> {
        self.check_as(cluster, p, true)
    }

    /// `new_grant`: the placement is being decided now, so its GPUs must be healthy.
    fn check_as(
        &self,
        cluster: &Cluster,
        p: &Placement,
        new_grant: bool,
    ) -> Result<(), LedgerError> {
        let idx = p.node.0 as usize;
        let (node, used) = match (cluster.nodes().get(idx), self.nodes.get(idx)) {
            (Some(n), Some(u)) => (n, u),
            _ => return Err(LedgerError::NoSuchNode(p.node)),
        };
        let name = || node.name.clone();
        if p.cpu_milli > used.free_cpu_milli {
            return Err(LedgerError::Cpu {
                node: name(),
                want: p.cpu_milli,
                free: used.free_cpu_milli,
            });
        }
        if p.memory_mib > used.free_memory_mib {
            return Err(LedgerError::Memory {
                node: name(),
                want: p.memory_mib,
                free: used.free_memory_mib,
            });
        }
        let mut seen = 0u64;
        for grant in &p.grants {
            let gi = grant.gpu as usize;
            let (gpu, gu) = match (node.gpus.get(gi), used.gpus.get(gi)) {
                (Some(g), Some(u)) => (g, u),
                _ => {
                    return Err(LedgerError::NoSuchGpu {
                        node: name(),
                        gpu: grant.gpu,
                    });
                }
            };
            if seen & (1 << gi) != 0 {
                return Err(LedgerError::DuplicateGpu {
                    node: name(),
                    gpu: grant.gpu,
                });
            }
            seen |= 1 << gi;
            let fail = |why| {
                Err(LedgerError::Gpu {
                    node: name(),
                    gpu: grant.gpu,
                    why,
                })
            };
            if new_grant && gpu.health != Health::Healthy {
                return fail("unhealthy");
            }
            if gu.exclusive {
                return fail("held exclusively");
            }
            match &grant.mig {
                Some(slot) => {
                    let spec = cluster.catalog.spec(gpu.model);
                    // A planned switch into MIG mode: only where the node allows it and
                    // nothing but MIG instances is on the GPU.
                    let mig_grants: u16 = gu.mig_instances.iter().map(|&n| u16::from(n)).sum();
                    let switch_ok =
                        MigDynamic::of(node) == MigDynamic::Mode && gu.tenants == mig_grants;
                    let Some(geo) = spec.mig.as_ref().filter(|_| gpu.mig_enabled || switch_ok)
                    else {
                        return fail("not in MIG mode");
                    };
                    let Some(profile) = geo.profiles.get(slot.profile as usize) else {
                        return fail("no such MIG profile");
                    };
                    if slot.size != profile.memory_slices || !profile.starts.contains(&slot.start) {
                        return fail("MIG placement not allowed for the profile");
                    }
                    if gu.mig_memory_slices & slot.mask() != 0 {
                        return fail("MIG memory slices taken");
                    }
                    if gu.mig_compute_slices + profile.compute_slices > geo.compute_slices {
                        return fail("MIG compute slices exhausted");
                    }
                    if gu.mig_instances[slot.profile as usize] >= profile.max_instances {
                        return fail("MIG profile at its instance limit");
                    }
                }
                None => {
                    if gpu.mig_enabled || gu.mig_memory_slices != 0 {
                        return fail("in MIG mode");
                    }
                    if gpu.mig_instance && !grant.exclusive {
                        return fail("a MIG instance served as a GPU is granted whole only");
                    }
                    if grant.exclusive && !gu.is_idle() {
                        return fail("not idle");
                    }
                    if grant.memory_mib > gu.free_memory_mib {
                        return fail("not enough free memory");
                    }
                    if grant.cores_milli > gu.free_cores_milli {
                        return fail("not enough free compute");
                    }
                }
            }
        }
        Ok(())
    }

    fn apply_as(
        &mut self,
        cluster: &Cluster,
        id: AllocId,
        p: &Placement,
    ) -> Result<(), LedgerError> {
        self.check(cluster, p)?;
        self.apply_checked(id, p);
        Ok(())
    }

    fn apply_checked(&mut self, id: AllocId, p: &Placement) {
        let node = &mut self.nodes[p.node.0 as usize];
        node.free_cpu_milli -= p.cpu_milli;
        node.free_memory_mib -= p.memory_mib;
        node.allocations += 1;
        let models = &self.gpu_models[p.node.0 as usize];
        for grant in &p.grants {
            let gu = &mut node.gpus[grant.gpu as usize];
            apply_grant(gu, grant);
            self.used_milli += u64::from(grant.cores_milli);
            self.used_by_model[models[grant.gpu as usize] as usize] += u64::from(grant.cores_milli);
        }
        if p.class != 0 {
            match node.classes.iter_mut().find(|(c, _)| *c == p.class) {
                Some((_, n)) => *n += 1,
                None => node.classes.push((p.class, 1)),
            }
        }
        self.allocations.insert(id, p.clone());
        let node = &mut self.nodes[p.node.0 as usize];
        node.summary = GpuSummary::of(&node.gpus);
        self.log_change(p.node);
    }

    /// Releases an allocation and returns its placement.
    pub fn release(&mut self, id: AllocId) -> Result<Placement, LedgerError> {
        let p = self.release_quiet(id)?;
        if self.open_checkpoints > 0 {
            self.journal
                .push(JournalOp::Released(id, Box::new(p.clone())));
        }
        Ok(p)
    }

    fn release_quiet(&mut self, id: AllocId) -> Result<Placement, LedgerError> {
        let p = self
            .allocations
            .remove(&id)
            .ok_or(LedgerError::UnknownAllocation(id))?;
        let node = &mut self.nodes[p.node.0 as usize];
        node.free_cpu_milli += p.cpu_milli;
        node.free_memory_mib += p.memory_mib;
        node.allocations -= 1;
        let models = &self.gpu_models[p.node.0 as usize];
        for grant in &p.grants {
            let gu = &mut node.gpus[grant.gpu as usize];
            gu.free_memory_mib += grant.memory_mib;
            gu.free_cores_milli += grant.cores_milli;
            gu.tenants -= 1;
            if grant.exclusive {
                gu.exclusive = false;
            }
            if let Some(slot) = &grant.mig {
                gu.mig_memory_slices &= !slot.mask();
                gu.mig_compute_slices -= slot.compute;
                gu.mig_instances[slot.profile as usize] -= 1;
            }
            self.used_milli -= u64::from(grant.cores_milli);
            self.used_by_model[models[grant.gpu as usize] as usize] -= u64::from(grant.cores_milli);
        }
        if p.class != 0
            && let Some(pos) = node.classes.iter().position(|(c, _)| *c == p.class)
        {
            node.classes[pos].1 -= 1;
            if node.classes[pos].1 == 0 {
                node.classes.swap_remove(pos);
            }
        }
        let node = &mut self.nodes[p.node.0 as usize];
        node.summary = GpuSummary::of(&node.gpus);
        self.log_change(p.node);
        Ok(p)
    }

    /// Opens a checkpoint: everything applied or released after it can be undone.
    pub fn checkpoint(&mut self) -> Checkpoint {
        self.open_checkpoints += 1;
        Checkpoint {
            depth: self.open_checkpoints,
            journal_len: self.journal.len(),
        }
    }

    /// Keeps everything since the checkpoint.
    pub fn commit(&mut self, cp: Checkpoint) -> Result<(), LedgerError> {
        if cp.depth != self.open_checkpoints {
            return Err(LedgerError::BadCheckpoint);
        }
        self.open_checkpoints -= 1;
        if self.open_checkpoints == 0 {
            self.journal.clear();
        }
        Ok(())
    }

    /// Undoes everything since the checkpoint, newest first.
    pub fn rollback(&mut self, cluster: &Cluster, cp: Checkpoint) -> Result<(), LedgerError> {
        if cp.depth != self.open_checkpoints {
            return Err(LedgerError::BadCheckpoint);
        }
        while self.journal.len() > cp.journal_len {
            match self.journal.pop() {
                Some(JournalOp::Applied(id)) => {
                    self.release_quiet(id)?;
                }
                Some(JournalOp::Released(id, p)) => {
                    // It was held before: its GPUs' health since then does not matter.
                    self.check_as(cluster, &p, false)?;
                    self.apply_checked(id, &p);
                }
                None => break,
            }
        }
        self.open_checkpoints -= 1;
        Ok(())
    }

    /// Records that a node's static state changed (health), so score caches refresh it.
    pub fn touch(&mut self, node: NodeId) {
        self.log_change(node);
    }

    fn log_change(&mut self, node: NodeId) {
        // Keep the log bounded: caches further behind than this rebuild from scratch.
        let cap = (self.nodes.len() * 4).max(1024);
        if self.changes.len() >= cap * 2 {
            let drop = self.changes.len() - cap;
            self.changes.drain(..drop);
            self.change_base += drop as u64;
        }
        self.changes.push(node);
    }

    /// Position after the newest change.
    pub fn change_cursor(&self) -> u64 {
        self.change_base + self.changes.len() as u64
    }

    /// Nodes changed since `cursor`, or `None` when the log no longer reaches back that far.
    pub fn changes_since(&self, cursor: u64) -> Option<&[NodeId]> {
        let start = cursor.checked_sub(self.change_base)? as usize;
        self.changes.get(start..)
    }
}

fn apply_grant(gu: &mut GpuUse, grant: &GpuGrant) {
    gu.free_memory_mib -= grant.memory_mib;
    gu.free_cores_milli -= grant.cores_milli;
    gu.tenants += 1;
    if grant.exclusive {
        gu.exclusive = true;
    }
    if let Some(slot) = &grant.mig {
        gu.mig_memory_slices |= slot.mask();
        gu.mig_compute_slices += slot.compute;
        gu.mig_instances[slot.profile as usize] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Catalog, Node};
    use crate::placement::{GpuGrant, MigSlot};
    use proptest::prelude::*;

    fn cluster() -> Cluster {
        let catalog = Catalog::default();
        let a100 = catalog.find("A100-80GB").unwrap();
        let mut mig_node = Node::uniform("mig", 64_000, 256_000, a100, 2);
        mig_node.gpus[0].mig_enabled = true;
        Cluster::new(
            catalog,
            vec![Node::uniform("n0", 32_000, 128_000, a100, 4), mig_node],
        )
        .unwrap()
    }

    fn share(node: u32, gpu: u8, mem: u64, cores: u32) -> Placement {
        Placement {
            node: NodeId(node),
            grants: [GpuGrant::shared(gpu, mem, cores)].into_iter().collect(),
            cpu_milli: 1000,
            memory_mib: 1000,
            class: 1,
            ..Placement::default()
        }
    }

    #[test]
    fn refuses_over_commit_and_releases() {
        let c = cluster();
        let mut l = Ledger::new(&c);
        let a = l.apply(&c, &share(0, 0, 40_000, 600)).unwrap();
        // 600 + 500 > 1000 per-mille of compute.
        assert!(matches!(
            l.apply(&c, &share(0, 0, 1_000, 500)),
            Err(LedgerError::Gpu { .. })
        ));
        let b = l.apply(&c, &share(0, 0, 40_000, 400)).unwrap();
        // The GPU's 81,920 MiB is now 80,000 used: 2,000 more does not fit.
        assert!(l.apply(&c, &share(0, 0, 2_000, 0)).is_err());
        assert_eq!(l.used_milli(), 1000);
        l.release(a).unwrap();
        l.release(b).unwrap();
        assert_eq!(l.node(NodeId(0)), Ledger::new(&c).node(NodeId(0)));
        assert_eq!(l.release(a), Err(LedgerError::UnknownAllocation(a)));
    }

    #[test]
    fn a_grant_on_a_gpu_that_turned_unhealthy_is_still_held() {
        let mut c = cluster();
        let mut nodes = c.nodes().to_vec();
        nodes[0].gpus[2].health = Health::Unhealthy;
        c = Cluster::new(c.catalog.clone(), nodes).unwrap();
        let mut l = Ledger::new(&c);
        // A new grant avoids the GPU ...
        assert!(matches!(
            l.apply(&c, &share(0, 2, 1_000, 100)),
            Err(LedgerError::Gpu {
                why: "unhealthy",
                ..
            })
        ));
        // ... but a pod already running there still holds it, CPU and memory included.
        let held = l.apply_existing(&c, &share(0, 2, 40_000, 600)).unwrap();
        assert_eq!(l.node(NodeId(0)).gpus[2].free_cores_milli, 400);
        assert_eq!(l.node(NodeId(0)).free_cpu_milli, 31_000);
        // Undoing its release (a preemption's dry run) restores it despite the health.
        let cp = l.checkpoint();
        l.release(held).unwrap();
        l.rollback(&c, cp).unwrap();
        assert_eq!(l.node(NodeId(0)).gpus[2].free_cores_milli, 400);
        // Over-commit is still refused.
        assert!(l.apply_existing(&c, &share(0, 2, 1_000, 500)).is_err());
    }

    #[test]
    fn mig_slots_are_exclusive() {
        let c = cluster();
        let mut l = Ledger::new(&c);
        let geo = c
            .catalog
            .spec(c.node(NodeId(1)).gpus[0].model)
            .mig
            .clone()
            .unwrap();
        let (p3g, _) = geo.profile("3g.40gb").unwrap();
        let slot = |start| Placement {
            node: NodeId(1),
            grants: [GpuGrant {
                gpu: 0,
                memory_mib: 40_192,
                cores_milli: 0,
                exclusive: false,
                mig: Some(MigSlot {
                    profile: p3g as u8,
                    start,
                    size: 4,
                    compute: 3,
                }),
            }]
            .into_iter()
            .collect(),
            ..Placement::default()
        };
        l.apply(&c, &slot(0)).unwrap();
        assert!(l.apply(&c, &slot(0)).is_err(), "the same slices twice");
        assert!(
            l.apply(&c, &slot(2)).is_err(),
            "start 2 is not a 3g placement"
        );
        l.apply(&c, &slot(4)).unwrap();
        // A whole-GPU grant on a MIG GPU is refused.
        let whole = Placement {
            node: NodeId(1),
            grants: [GpuGrant::whole(0, 81_920)].into_iter().collect(),
            ..Placement::default()
        };
        assert!(l.apply(&c, &whole).is_err());
    }

    #[test]
    fn rollback_restores_state() {
        let c = cluster();
        let mut l = Ledger::new(&c);
        let keep = l.apply(&c, &share(0, 1, 1_000, 100)).unwrap();
        let before = l.nodes().to_vec();
        let cp = l.checkpoint();
        l.apply(&c, &share(0, 0, 1_000, 100)).unwrap();
        l.release(keep).unwrap();
        l.apply(&c, &share(1, 1, 1_000, 900)).unwrap();
        l.rollback(&c, cp).unwrap();
        assert_eq!(l.nodes(), &before[..]);
        assert!(l.allocation(keep).is_some());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Apply {
            node: u32,
            gpu: u8,
            mem: u64,
            cores: u32,
            whole: bool,
            cpu: u64,
        },
        Release(usize),
        Checkpoint,
        Rollback,
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..2, 0u8..4, 0u64..90_000, 0u32..1200, any::<bool>(), 0u64..40_000)
                .prop_map(|(node, gpu, mem, cores, whole, cpu)| Op::Apply { node, gpu, mem, cores, whole, cpu }),
            2 => (0usize..64).prop_map(Op::Release),
            1 => Just(Op::Checkpoint),
            1 => Just(Op::Rollback),
            1 => Just(Op::Commit),
        ]
    }

    proptest! {
        /// Under any sequence of applies, releases, checkpoints and rollbacks the ledger
        /// never over-commits anything, and its totals always equal the sum of what it holds.
        #[test]
        fn never_over_commits(ops in proptest::collection::vec(op(), 1..120)) {
            let c = cluster();
            let mut l = Ledger::new(&c);
            let mut live: Vec<AllocId> = Vec::new();
            let mut cps: Vec<(Checkpoint, Vec<NodeUse>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Apply { node, gpu, mem, cores, whole, cpu } => {
                        let grant = if whole { GpuGrant::whole(gpu, mem) } else { GpuGrant::shared(gpu, mem, cores) };
                        let p = Placement {
                            node: NodeId(node),
                            grants: [grant].into_iter().collect(),
                            cpu_milli: cpu,
                            memory_mib: mem / 10,
                            class: 7,
                            ..Placement::default()
                        };
                        if let Ok(id) = l.apply(&c, &p) { live.push(id); }
                    }
                    Op::Release(i) => {
                        if !live.is_empty() {
                            let id = live.swap_remove(i % live.len());
                            l.release(id).unwrap();
                        }
                    }
                    Op::Checkpoint => { let snap = l.nodes().to_vec(); cps.push((l.checkpoint(), snap)); }
                    Op::Rollback => if let Some((cp, snap)) = cps.pop() {
                        l.rollback(&c, cp).unwrap();
                        prop_assert_eq!(l.nodes(), &snap[..]);
                        live.retain(|id| l.allocation(*id).is_some());
                        live.extend(l.allocations().map(|(id, _)| id).filter(|id| !live.contains(id)).collect::<Vec<_>>());
                    },
                    Op::Commit => if let Some((cp, _)) = cps.pop() { l.commit(cp).unwrap(); },
                }
                // Invariants: free = capacity - sum of live grants, never negative (u64 would wrap).
                for (ni, node) in c.nodes().iter().enumerate() {
                    let u = &l.nodes()[ni];
                    let held: Vec<&Placement> = l.allocations().map(|(_, p)| p).filter(|p| p.node.0 as usize == ni).collect();
                    prop_assert_eq!(u.free_cpu_milli + held.iter().map(|p| p.cpu_milli).sum::<u64>(), node.cpu_milli);
                    prop_assert_eq!(u.free_memory_mib + held.iter().map(|p| p.memory_mib).sum::<u64>(), node.memory_mib);
                    for (gi, g) in u.gpus.iter().enumerate() {
                        let grants: Vec<&GpuGrant> = held.iter().flat_map(|p| p.grants.iter()).filter(|gr| gr.gpu as usize == gi).collect();
                        prop_assert!(g.free_cores_milli <= 1000);
                        prop_assert_eq!(g.free_cores_milli + grants.iter().map(|gr| gr.cores_milli).sum::<u32>(), 1000);
                        prop_assert_eq!(g.free_memory_mib + grants.iter().map(|gr| gr.memory_mib).sum::<u64>(), 81_920);
                        prop_assert_eq!(g.tenants as usize, grants.len());
                        if grants.iter().any(|gr| gr.exclusive) { prop_assert_eq!(grants.len(), 1); }
                    }
                }
                prop_assert_eq!(l.used_milli(), l.nodes().iter().map(|n| n.used_milli()).sum::<u64>());
                let mut by_model = vec![0u64; c.catalog.specs().len()];
                for (n, u) in c.nodes().iter().zip(l.nodes()) {
                    for (g, gu) in n.gpus.iter().zip(&u.gpus) {
                        by_model[g.model.0 as usize] += u64::from(1000 - gu.free_cores_milli);
                    }
                }
                prop_assert_eq!(l.used_milli_by_model(), by_model.as_slice());
            }
        }
    }
}
