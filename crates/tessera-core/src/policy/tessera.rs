//! `tessera`: Tessera's default policy.
//!
//! It starts from FGD's insight — place each pod where the expected
//! fragmentation of the node (over the workload the cluster actually sees) grows
//! least — and corrects the artifact's weaknesses:
//! - the score is not squashed through a sigmoid and truncated to an integer, so
//!   near-equal nodes are told apart instead of falling to first-fit by name;
//! - among equally fragmenting nodes it fills the fuller node (keeps idle GPUs
//!   idle for whole and multi-GPU pods);
//! - multi-GPU pods take the best-connected GPUs (NVLink, one NUMA node).
//!
//! The terms are combined here and only here:
//! `score = frag_removed_gpus + 0.05 · fill_after + 0.01 · interconnect`,
//! where `frag_removed_gpus` is `(F_before − F_after) / 1000` (GPUs of fragment
//! removed, usually in ±1), `fill_after` is the node's allocated GPU share after
//! placement in [0, 1], and `interconnect` the normalised topology quality in [0, 1].

use std::sync::Arc;

use rand::RngCore;

use super::{Policy, gpu_capacity_milli, gpu_free_milli};
use crate::fit::{Fit, NodeView, best_connected};
use crate::frag::TargetWorkload;
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

pub struct Tessera {
    workload: Arc<TargetWorkload>,
}

impl Tessera {
    pub fn new(workload: Arc<TargetWorkload>) -> Tessera {
        Tessera { workload }
    }
}

const FILL_WEIGHT: f64 = 0.05;
const TOPOLOGY_WEIGHT: f64 = 0.01;

impl Policy for Tessera {
    fn name(&self) -> &'static str {
        "tessera"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let (gpus, before, after) = match &req.gpu {
            GpuAsk::Whole { count } if *count > 1 => {
                let gpus = best_connected(view.node, &fit.usable, fit.need, req.constraints.nvlink);
                let (b, a) = super::fgd::frag_before_after(view, req, &gpus, &self.workload);
                (gpus, b, a)
            }
            _ => super::fgd::least_frag_choice(view, req, fit, &self.workload),
        };
        let frag_removed = (before - after) / 1000.0;
        let cap = gpu_capacity_milli(view).max(1) as f64;
        let fill = 1.0 - gpu_free_milli(view).saturating_sub(req.gpu.total_milli()) as f64 / cap;
        let interconnect = super::topology::normalised_quality(view, &gpus);
        let score = frag_removed + FILL_WEIGHT * fill + TOPOLOGY_WEIGHT * interconnect;
        Some(Scored {
            score,
            gpus,
            terms: [
                ScoreTerm {
                    name: "frag-removed-gpus",
                    value: frag_removed,
                },
                ScoreTerm {
                    name: "fill-after",
                    value: fill,
                },
                ScoreTerm {
                    name: "interconnect",
                    value: interconnect,
                },
            ]
            .into_iter()
            .collect(),
        })
    }
}
