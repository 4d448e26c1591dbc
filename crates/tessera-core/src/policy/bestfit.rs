//! `bestfit`: the artifact's `-BestFit 1000` baseline (`best_fit_score.go`).
//!
//! Score `trunc(100 · (1 − (0.5 · (free CPU − asked CPU) / 128 000
//! + 0.5 · (free GPU − asked GPU) / 8 000)))`, where the free GPU is the node's total
//! free milli-GPU and 128 000 m CPU and 8 000 milli-GPU are the artifact's fixed
//! "max spec" normalisers (not the node's own capacity). The integer score makes
//! near-equal nodes tie; ties go to the earlier node. The artifact's min-max
//! normalisation over nodes keeps the order and the ties, so it is left out.
//! GPUs: the artifact's default `best` selection ([`artifact_best_gpus`]).

use rand::RngCore;

use super::{Policy, gpu_free_milli};
use crate::fit::{Fit, GpuSet, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

pub struct BestFit;

/// The artifact's CPU normaliser (`MaxSpecCpu`), in milli-CPU.
pub const MAX_SPEC_CPU_MILLI: f64 = 128_000.0;
/// The artifact's GPU normaliser (`MaxSpecGpu`), in milli-GPU.
pub const MAX_SPEC_GPU_MILLI: f64 = 8_000.0;

/// Weighted free share left after placing `req`: lower is a better fit.
pub fn leftover(view: NodeView<'_>, req: &Request) -> f64 {
    let cpu = view.used.free_cpu_milli.saturating_sub(req.cpu_milli) as f64 / MAX_SPEC_CPU_MILLI;
    let gpu =
        gpu_free_milli(view).saturating_sub(req.gpu.total_milli()) as f64 / MAX_SPEC_GPU_MILLI;
    0.5 * cpu + 0.5 * gpu
}

/// The artifact's `best` GPU selection (`allocateGpuIdBasedOnBestFit`): a one-GPU share
/// goes to the usable GPU with the least free milli-GPU (first index on ties); whole
/// GPUs are the lowest-index idle ones.
pub fn artifact_best_gpus(view: NodeView<'_>, req: &Request, fit: &Fit) -> GpuSet {
    match &req.gpu {
        GpuAsk::Shared { count: 1, .. } => fit
            .usable
            .iter()
            .copied()
            .min_by_key(|&g| (view.used.gpus[g as usize].free_cores_milli, g))
            .into_iter()
            .collect(),
        _ => super::first_gpus(fit),
    }
}

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let left = leftover(view, req);
        Some(Scored {
            score: ((1.0 - left) * 100.0).trunc(),
            gpus: artifact_best_gpus(view, req, fit),
            terms: [ScoreTerm {
                name: "leftover",
                value: left,
            }]
            .into_iter()
            .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use crate::model::{Catalog, Cluster, Node, NodeId};

    #[test]
    fn leftover_and_score_arithmetic() {
        let cat = Catalog::default();
        let g2 = cat.find("G2").unwrap();
        let c = Cluster::new(cat, vec![Node::uniform("n", 96_000, 1 << 20, g2, 8)]).unwrap();
        let l = Ledger::new(&c);
        let v = NodeView {
            node: c.node(NodeId(0)),
            used: l.node(NodeId(0)),
            catalog: &c.catalog,
        };
        let req = Request::whole(2, 24_000, 0);
        // CPU (96000-24000)/128000 = 0.5625; GPU (8000-2000)/8000 = 0.75;
        // 0.5*0.5625 + 0.5*0.75 = 0.65625 → score trunc(34.375) = 34.
        assert_eq!(leftover(v, &req), 0.65625);
        let fit = crate::fit::check(v, &req).unwrap();
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(0);
        let s = BestFit.score(v, &req, &fit, &mut rng).unwrap();
        assert_eq!(s.score, 34.0);
        assert_eq!(s.gpus.as_slice(), &[0, 1]);
    }
}
