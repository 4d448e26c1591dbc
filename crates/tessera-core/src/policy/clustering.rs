//! `clustering`: keep alike pods together — the artifact's `-GpuClustering 1000`
//! baseline. Tiers, best first: a node whose only resident GPU class is the pod's;
//! a node with several classes, one of them the pod's; an idle node; any other.
//! Within a tier, more-allocated nodes score higher. CPU-only pods score the
//! minimum everywhere.

use rand::RngCore;

use super::{Policy, gpu_capacity_milli, gpu_free_milli, tightest_gpus};
use crate::fit::{Fit, NodeView};
use crate::placement::{ScoreTerm, Scored, request_class};
use crate::request::Request;

pub struct Clustering;

/// Tier of a node for a request class: 3 best, 0 worst.
pub fn tier(view: NodeView<'_>, class: u32) -> u32 {
    let classes = &view.used.classes;
    if classes.is_empty() {
        if view.used.allocations == 0 { 1 } else { 0 }
    } else if classes.len() == 1 && classes[0].0 == class {
        3
    } else if classes.iter().any(|(c, _)| *c == class) {
        2
    } else {
        0
    }
}

impl Policy for Clustering {
    fn name(&self) -> &'static str {
        "clustering"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let class = request_class(req);
        if class == 0 {
            return Some(Scored {
                score: 0.0,
                gpus: Default::default(),
                terms: Default::default(),
            });
        }
        let t = tier(view, class);
        let cap = gpu_capacity_milli(view).max(1) as f64;
        let allocated = 1.0 - gpu_free_milli(view) as f64 / cap;
        // The tier decides; allocation only orders nodes inside a tier (allocated < 1).
        let score = f64::from(t) + allocated.min(0.999_999);
        Some(Scored {
            score,
            gpus: tightest_gpus(view, req, fit),
            terms: [
                ScoreTerm {
                    name: "tier",
                    value: f64::from(t),
                },
                ScoreTerm {
                    name: "allocated",
                    value: allocated,
                },
            ]
            .into_iter()
            .collect(),
        })
    }
}
