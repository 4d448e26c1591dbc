//! Placement policies: one file each, all behind the [`Policy`] trait.
//!
//! A policy is pure. It sees one node that passed the shared filter
//! ([`crate::fit::check`]) together with the request, and returns a score
//! (higher is better) and the GPUs it would use, or `None` to decline the node.
//! The [`crate::scheduler::Scheduler`] compares nodes (ties go to the earlier node)
//! and caches scores of cacheable policies.

pub mod bestfit;
pub mod binpack;
pub mod clustering;
pub mod dotprod;
pub mod fgd;
mod inputs;
pub mod k8s_binpack;
pub mod k8s_default;
pub mod packing;
pub mod random;
pub mod spread;
pub mod tessera;
pub mod topology;

pub use inputs::{PolicyInputs, SupplyWatch};

use std::sync::Arc;

use rand::RngCore;

use crate::fit::{Fit, GpuSet, NodeView};
use crate::frag::TargetWorkload;
use crate::ledger::Ledger;
use crate::model::Cluster;
pub use crate::model::gpus_per_model;
use crate::placement::Scored;
use crate::request::{GpuAsk, Request};

/// A placement policy.
pub trait Policy: Send + Sync {
    /// The name it is selected by.
    fn name(&self) -> &'static str;

    /// Scores a node that passed the filter and picks its GPUs (from `fit.usable`).
    /// Higher is better. `None` declines the node.
    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        rng: &mut dyn RngCore,
    ) -> Option<Scored>;

    /// Whether the score depends only on the node's state and the request (not on
    /// randomness or other nodes), so the scheduler may cache it between decisions.
    fn cacheable(&self) -> bool {
        true
    }

    /// Whether the policy wants its target workload learned from the pods that arrive
    /// ([`crate::workload::LearnedWorkload`]); its holder rebuilds it when the target moves.
    fn learns_workload(&self) -> bool {
        false
    }

    /// Whether its scores read the free GPU supply ([`PolicyArgs::model_supply`]), so
    /// that callers build it again as the supply moves ([`SupplyWatch`]).
    fn follows_supply(&self) -> bool {
        false
    }
}

/// Arguments every policy may read; each validates what it uses.
#[derive(Debug, Clone, Default)]
pub struct PolicyArgs {
    /// The workload fragmentation is measured against (FGD's "typical pods").
    /// `None` means the built-in distribution calibrated to the openb trace.
    pub workload: Option<Arc<TargetWorkload>>,
    /// The GPU supply of each model id that the model-constrained demand is weighed
    /// against: the GPU compute still free per model ([`Ledger::free_milli_by_model`]), the
    /// inventory ([`gpus_per_model`]) before anything is placed; any unit, only the
    /// shares count. Empty when unknown.
    pub model_supply: Vec<u32>,
}

impl PolicyArgs {
    pub fn workload(&self) -> Arc<TargetWorkload> {
        self.workload
            .clone()
            .unwrap_or_else(|| Arc::new(TargetWorkload::builtin()))
    }

    /// `workload` as the target, with the GPU inventory of `cluster` as the supply
    /// (nothing placed yet).
    pub fn for_cluster(workload: Arc<TargetWorkload>, cluster: &Cluster) -> PolicyArgs {
        PolicyArgs {
            workload: Some(workload),
            model_supply: gpus_per_model(cluster),
        }
    }

    /// `workload` as the target, with the GPU compute `ledger` leaves free as the
    /// supply.
    pub fn for_ledger(workload: Arc<TargetWorkload>, ledger: &Ledger) -> PolicyArgs {
        PolicyArgs {
            workload: Some(workload),
            model_supply: ledger.free_milli_by_model(),
        }
    }
}

/// Every policy name, in the order tables list them.
pub const NAMES: &[&str] = &[
    "random",
    "spread",
    "binpack",
    "bestfit",
    "dotprod",
    "clustering",
    "packing",
    "fgd",
    "topology",
    "tessera",
    "k8s-default",
    "k8s-binpack",
];

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {name:?} (known: {})", NAMES.join(", "))]
pub struct UnknownPolicy {
    pub name: String,
}

/// Builds a policy by name.
pub fn by_name(name: &str, args: &PolicyArgs) -> Result<Box<dyn Policy>, UnknownPolicy> {
    Ok(match name {
        "random" => Box::new(random::Random),
        "spread" => Box::new(spread::Spread),
        "binpack" => Box::new(binpack::Binpack),
        "bestfit" => Box::new(bestfit::BestFit),
        "dotprod" => Box::new(dotprod::DotProd),
        "clustering" => Box::new(clustering::Clustering),
        "packing" => Box::new(packing::Packing),
        "fgd" => Box::new(fgd::Fgd::new(args.workload())),
        "topology" => Box::new(topology::Topology),
        "tessera" => Box::new(tessera::Tessera::new(
            args.workload(),
            &args.model_supply,
            tessera::TesseraParams::default(),
        )),
        "k8s-default" => Box::new(k8s_default::K8sDefault),
        "k8s-binpack" => Box::new(k8s_binpack::K8sBinpack),
        other => {
            return Err(UnknownPolicy {
                name: other.to_string(),
            });
        }
    })
}

// ---- helpers shared by several policies -------------------------------------------------

/// Total GPU compute of the node in milli-GPU (healthy or not).
pub(crate) fn gpu_capacity_milli(view: NodeView<'_>) -> u64 {
    view.node.gpus.len() as u64 * 1000
}

/// Free GPU compute of the node in milli-GPU.
pub(crate) fn gpu_free_milli(view: NodeView<'_>) -> u64 {
    view.used
        .gpus
        .iter()
        .map(|g| u64::from(g.free_cores_milli))
        .sum()
}

/// The lowest-index GPUs that fit (the stock assignment).
pub(crate) fn first_gpus(fit: &Fit) -> GpuSet {
    fit.usable.iter().copied().take(fit.need as usize).collect()
}

/// For a single shared GPU: the usable GPU with the least free compute after the share
/// (best fit), ties to the lowest index. Otherwise the first GPUs.
pub(crate) fn tightest_gpus(view: NodeView<'_>, req: &Request, fit: &Fit) -> GpuSet {
    match &req.gpu {
        GpuAsk::Shared { count: 1, .. } => fit
            .usable
            .iter()
            .copied()
            .min_by_key(|&g| {
                let gu = &view.used.gpus[g as usize];
                (gu.free_cores_milli, gu.free_memory_mib, g)
            })
            .into_iter()
            .collect(),
        _ => first_gpus(fit),
    }
}

/// Per-GPU milli the request takes from each GPU it uses.
pub(crate) fn milli_per_gpu(req: &Request) -> u32 {
    req.gpu.milli_per_gpu()
}
