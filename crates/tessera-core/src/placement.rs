//! Placements: a decision as data (the node, the exact GPUs, the score that
//! chose them) and a policy's verdict on one node ([`Scored`]). The
//! [`crate::scheduler::Scheduler`] makes them; the caller applies them (ledger,
//! Kubernetes binding or simulator event). Data only: this module depends on
//! the model and the request, nothing that decides, so the ledger, the fit
//! filter, the policies and the judge all build on it without a cycle.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::model::NodeId;
use crate::request::Request;

/// GPU positions on a node (indices into `Node::gpus`).
pub type GpuSet = SmallVec<[u8; 8]>;

/// A MIG placement on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigSlot {
    /// Index into the model's MIG profile table.
    pub profile: u8,
    /// First memory slice.
    pub start: u8,
    /// Memory slices.
    pub size: u8,
    /// Compute slices.
    pub compute: u8,
}

impl MigSlot {
    /// The memory slices as a bitmask.
    pub fn mask(&self) -> u8 {
        let ones: u16 = (1u16 << self.size) - 1;
        ((ones << self.start) & 0xff) as u8
    }
}

/// What one GPU gives to one placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuGrant {
    /// Position of the GPU in its node's GPU list.
    pub gpu: u8,
    pub memory_mib: u64,
    /// Compute in per-mille.
    pub cores_milli: u32,
    /// The whole GPU, nobody else.
    pub exclusive: bool,
    pub mig: Option<MigSlot>,
}

impl GpuGrant {
    pub fn whole(gpu: u8, memory_mib: u64) -> GpuGrant {
        GpuGrant {
            gpu,
            memory_mib,
            cores_milli: 1000,
            exclusive: true,
            mig: None,
        }
    }
    pub fn shared(gpu: u8, memory_mib: u64, cores_milli: u32) -> GpuGrant {
        GpuGrant {
            gpu,
            memory_mib,
            cores_milli,
            exclusive: false,
            mig: None,
        }
    }
}

/// One named part of a score, for explanations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScoreTerm {
    pub name: &'static str,
    pub value: f64,
}

/// A decision: the node, the exact GPUs and the score that chose them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    pub grants: SmallVec<[GpuGrant; 8]>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Request class (GPU count and per-GPU milli) for policies that group alike pods; 0 for CPU-only.
    pub class: u32,
    pub score: f64,
    #[serde(skip_deserializing)]
    pub terms: Vec<ScoreTerm>,
}

/// The class of a request: GPU count and per-GPU milli packed in one number (0 for CPU-only).
pub fn request_class(req: &Request) -> u32 {
    let n = req.gpu.gpu_count();
    if n == 0 {
        return 0;
    }
    (n << 16)
        | (req.gpu.milli_per_gpu() & 0xffff)
        | if matches!(req.gpu, crate::request::GpuAsk::Mig { .. }) {
            1 << 15
        } else {
            0
        }
}

/// A policy's verdict on one node: score (higher is better), GPUs and the score's parts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scored {
    pub score: f64,
    pub gpus: GpuSet,
    pub terms: SmallVec<[ScoreTerm; 4]>,
}
