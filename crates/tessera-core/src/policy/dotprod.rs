//! `dotprod`: alignment of the node's free resources with the pod's request — the
//! artifact's `-DotProd 1000 -gpusel best -dimext merge -norm max` baseline. The
//! dimensions are CPU and GPU (all GPUs merged into one), each normalised by the
//! node's capacity; the node whose free vector is least aligned with the request
//! (smallest dot product) scores highest.

use rand::RngCore;

use super::{Policy, gpu_capacity_milli, gpu_free_milli, tightest_gpus};
use crate::fit::{Fit, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::Request;

pub struct DotProd;

/// Dot product of (free CPU, free GPU) and (asked CPU, asked GPU), both normalised by capacity.
pub fn dot(view: NodeView<'_>, req: &Request) -> f64 {
    let cpu_cap = view.node.cpu_milli.max(1) as f64;
    let gpu_cap = gpu_capacity_milli(view).max(1) as f64;
    let free = [
        view.used.free_cpu_milli as f64 / cpu_cap,
        gpu_free_milli(view) as f64 / gpu_cap,
    ];
    let ask = [
        req.cpu_milli as f64 / cpu_cap,
        req.gpu.total_milli() as f64 / gpu_cap,
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
            score: 1.0 - d,
            gpus: tightest_gpus(view, req, fit),
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
        let c = Cluster::new(cat, vec![Node::uniform("n", 10_000, 1, t4, 2)]).unwrap();
        let l = Ledger::new(&c);
        let v = NodeView {
            node: c.node(NodeId(0)),
            used: l.node(NodeId(0)),
            catalog: &c.catalog,
        };
        // free (1, 1) . ask (5000/10000, 1000/2000) = 0.5 + 0.5
        assert_eq!(dot(v, &Request::whole(1, 5000, 0)), 1.0);
    }
}
