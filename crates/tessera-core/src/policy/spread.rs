//! `spread`: Kubernetes' LeastAllocated over CPU and GPU — the emptiest node wins,
//! and a share goes to the emptiest GPU. Also the stock device plugin's scoring.

use rand::RngCore;

use super::{Policy, gpu_capacity_milli, gpu_free_milli, milli_per_gpu};
use crate::fit::{Fit, GpuSet, NodeView, best_connected};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

pub struct Spread;

/// Mean free fraction of CPU and GPU after placing the pod, in [0, 1].
pub fn least_allocated(view: NodeView<'_>, req: &Request) -> f64 {
    let cpu_cap = view.node.cpu_milli.max(1) as f64;
    let cpu_free = view.used.free_cpu_milli.saturating_sub(req.cpu_milli) as f64 / cpu_cap;
    let gpu_cap = gpu_capacity_milli(view);
    if gpu_cap == 0 {
        return cpu_free;
    }
    let take = u64::from(req.gpu.gpu_count()) * u64::from(milli_per_gpu(req));
    let gpu_free = gpu_free_milli(view).saturating_sub(take) as f64 / gpu_cap as f64;
    (cpu_free + gpu_free) / 2.0
}

impl Policy for Spread {
    fn name(&self) -> &'static str {
        "spread"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let score = least_allocated(view, req);
        let gpus: GpuSet = match &req.gpu {
            GpuAsk::Shared { count: 1, .. } => fit
                .usable
                .iter()
                .copied()
                .max_by_key(|&g| {
                    (
                        view.used.gpus[g as usize].free_cores_milli,
                        std::cmp::Reverse(g),
                    )
                })
                .into_iter()
                .collect(),
            _ => best_connected(view.node, &fit.usable, fit.need, req.constraints.nvlink),
        };
        Some(Scored {
            score,
            gpus,
            terms: [ScoreTerm {
                name: "least-allocated",
                value: score,
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
    fn emptier_node_scores_higher() {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let c = Cluster::new(
            cat,
            vec![
                Node::uniform("a", 8000, 1000, t4, 2),
                Node::uniform("b", 8000, 1000, t4, 2),
            ],
        )
        .unwrap();
        let mut l = Ledger::new(&c);
        let busy = crate::placement::Placement {
            node: NodeId(0),
            grants: [crate::placement::GpuGrant::whole(0, 15_360)]
                .into_iter()
                .collect(),
            cpu_milli: 4000,
            ..Default::default()
        };
        l.apply(&c, &busy).unwrap();
        let req = Request::whole(1, 2000, 0);
        let v = |i| NodeView {
            node: c.node(NodeId(i)),
            used: l.node(NodeId(i)),
            catalog: &c.catalog,
        };
        // a: CPU (8000-4000-2000)/8000 = 0.25, GPU (1000-1000)/2000 = 0 -> 0.125
        // b: CPU (8000-2000)/8000 = 0.75, GPU (2000-1000)/2000 = 0.5 -> 0.625
        assert_eq!(least_allocated(v(0), &req), 0.125);
        assert_eq!(least_allocated(v(1), &req), 0.625);
    }
}
