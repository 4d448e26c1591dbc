//! `dotprod`: Tetris-style alignment — the artifact's
//! `-DotProd 1000 -gpusel best -dimext merge -norm max` baseline (`dot_product_score.go`).
//!
//! With `merge` the node's GPUs are one dimension (total free milli-GPU) and with
//! `max` both vectors are divided by the artifact's fixed maxima (128 000 m CPU,
//! 8 000 milli-GPU). Score `trunc(100 · (1 − (free · ask) / 2))`: the node whose
//! free vector is least aligned with the request wins; ties go to the earlier node.
//! GPUs: the `best` selection.

use rand::RngCore;

use super::bestfit::{MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI, artifact_best_gpus};
use super::{Policy, gpu_free_milli};
use crate::fit::{Fit, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::Request;

pub struct DotProd;

/// Dot product of the normalised (free CPU, free GPU) and (asked CPU, asked GPU).
pub fn dot(view: NodeView<'_>, req: &Request) -> f64 {
    let free = [
        view.used.free_cpu_milli as f64 / MAX_SPEC_CPU_MILLI,
        gpu_free_milli(view) as f64 / MAX_SPEC_GPU_MILLI,
    ];
    let ask = [
        req.cpu_milli as f64 / MAX_SPEC_CPU_MILLI,
        req.gpu.total_milli() as f64 / MAX_SPEC_GPU_MILLI,
    ];
    free[0] * ask[0] + free[1] * ask[1]
}

impl Policy for DotProd {
    fn name(&self) -> &'static str {
        "dotprod"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let d = dot(view, req);
        Some(Scored {
            score: (100.0 * (1.0 - d / 2.0)).trunc(),
            gpus: artifact_best_gpus(view, req, fit),
            terms: [ScoreTerm {
                name: "dot-product",
                value: d,
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
    fn dot_arithmetic() {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let c = Cluster::new(cat, vec![Node::uniform("n", 64_000, 1 << 20, t4, 2)]).unwrap();
        let l = Ledger::new(&c);
        let v = NodeView {
            node: c.node(NodeId(0)),
            used: l.node(NodeId(0)),
            catalog: &c.catalog,
        };
        // free (64000/128000, 2000/8000) = (0.5, 0.25); ask (32000/128000, 1000/8000) = (0.25, 0.125)
        // dot = 0.125 + 0.03125 = 0.15625; score trunc(100 · (1 − 0.078125)) = 92.
        let req = Request::whole(1, 32_000, 0);
        assert_eq!(dot(v, &req), 0.15625);
        let fit = crate::fit::check(v, &req).unwrap();
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(0);
        assert_eq!(DotProd.score(v, &req, &fit, &mut rng).unwrap().score, 92.0);
    }
}
