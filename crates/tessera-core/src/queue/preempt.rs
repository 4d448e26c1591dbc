//! Device-aware preemption (being written: the signature is fixed, the planner is not yet).

use rustc_hash::FxHashMap;

use super::{Budgets, PodMeta, Running};
use crate::Scheduler;
use crate::ledger::{AllocId, Ledger};
use crate::model::{Cluster, NodeId};
use crate::placement::Placement;
use crate::request::Request;

/// What a preemption decision reads.
pub struct Context<'a> {
    pub cluster: &'a Cluster,
    pub ledger: &'a Ledger,
    /// Every running pod the caller knows, by allocation.
    pub running: &'a FxHashMap<AllocId, Running>,
    pub budgets: &'a Budgets,
    pub now_s: u64,
    /// Pods that have run less than this are not evicted.
    pub min_runtime_s: u64,
}

/// Victims whose eviction lets the preemptor run, and where it then goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub node: NodeId,
    pub victims: Vec<AllocId>,
    /// Where the preemptor goes once the victims are gone.
    pub placement: Placement,
    /// GPU time the victims had accumulated (lost if they restart), milli-GPU × s.
    pub gpu_milli_seconds_lost: u64,
}

/// The fewest, cheapest victims that make `request` fit; `None` when no
/// allowed set of victims does. `may_evict` narrows the candidates further
/// (reclaim passes "pods of queues above their fair share").
pub fn plan(
    _scheduler: &mut Scheduler,
    _ctx: &Context<'_>,
    _request: &Request,
    _preemptor: &PodMeta,
    _may_evict: &dyn Fn(&Running) -> bool,
) -> Option<Plan> {
    None
}
