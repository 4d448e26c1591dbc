//! `packing`: fill partly used GPUs first — the artifact's `-GpuPacking 1000`
//! baseline. Tiers, best first: nodes where the pod fits on already partly used
//! GPUs (less leftover is better); nodes that need fully free GPUs on a node that
//! is already in use (fewer free GPUs left is better); completely idle nodes.
//! CPU-only pods score the minimum everywhere.

use rand::RngCore;

use super::{Policy, tightest_gpus};
use crate::fit::{Fit, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::Request;

pub struct Packing;

impl Policy for Packing {
    fn name(&self) -> &'static str {
        "packing"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        if fit.need == 0 {
            return Some(Scored {
                score: 0.0,
                gpus: Default::default(),
                terms: Default::default(),
            });
        }
        let gpus = tightest_gpus(view, req, fit);
        let per = req.gpu.milli_per_gpu();
        let used = &view.used.gpus;
        let partly: Vec<u32> = gpus
            .iter()
            .map(|&g| used[g as usize].free_cores_milli)
            .filter(|&f| f < 1000)
            .collect();
        let n = view.node.gpus.len().max(1) as f64;
        let (tier, within) = if !partly.is_empty() {
            // Leftover on the partly used GPU after the pod, as a share of one GPU.
            let left = partly
                .iter()
                .map(|f| f.saturating_sub(per))
                .min()
                .unwrap_or(0);
            (3.0, 1.0 - f64::from(left) / 1000.0)
        } else if view.used.allocations > 0 {
            let idle_after = view.used.idle_gpus() as f64 - f64::from(fit.need);
            (2.0, 1.0 - idle_after / n)
        } else {
            (1.0, 0.0)
        };
        let score = tier + within.clamp(0.0, 0.999_999);
        Some(Scored {
            score,
            gpus,
            terms: [
                ScoreTerm {
                    name: "tier",
                    value: tier,
                },
                ScoreTerm {
                    name: "within-tier",
                    value: within,
                },
            ]
            .into_iter()
            .collect(),
        })
    }
}
