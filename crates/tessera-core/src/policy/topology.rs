//! `topology`: the node where the pod's GPUs are best connected wins (NVLink over
//! PCIe switch over socket; one NUMA node preferred). Inside the node it takes
//! the best-connected set. Single-GPU pods fall back to best fit.

use rand::RngCore;

use super::{Policy, tightest_gpus};
use crate::fit::{Fit, NodeView, best_connected, topology_quality};
use crate::placement::{ScoreTerm, Scored};
use crate::request::Request;

pub struct Topology;

/// Quality of the best set for `need` GPUs, normalised by the best possible (all NVLink-18, one NUMA).
pub fn normalised_quality(view: NodeView<'_>, set: &[u8]) -> f64 {
    let k = set.len() as f64;
    if k < 2.0 {
        return 0.0;
    }
    let pairs = k * (k - 1.0) / 2.0;
    f64::from(topology_quality(view.node, set)) / (pairs * 118.0 + 50.0)
}

impl Policy for Topology {
    fn name(&self) -> &'static str {
        "topology"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        if fit.need <= 1 {
            let fill = 1.0 - super::spread::least_allocated(view, req);
            return Some(Scored {
                score: fill,
                gpus: tightest_gpus(view, req, fit),
                terms: [ScoreTerm {
                    name: "fill",
                    value: fill,
                }]
                .into_iter()
                .collect(),
            });
        }
        let gpus = best_connected(view.node, &fit.usable, fit.need, req.constraints.nvlink);
        let q = normalised_quality(view, &gpus);
        Some(Scored {
            score: q,
            gpus,
            terms: [ScoreTerm {
                name: "interconnect",
                value: q,
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
    use crate::model::demo::demo_cluster;
    use crate::scheduler::{Decision, Scheduler};
    use rand::SeedableRng;

    #[test]
    fn four_gpus_go_to_an_nvlink_box() {
        let c = demo_cluster();
        let l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(Topology));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let Decision::Place(p) = s.decide(&c, &l, &Request::whole(4, 0, 0), &mut rng) else {
            panic!()
        };
        let node = c.node(p.node);
        assert!(
            node.link(p.grants[0].gpu as usize, p.grants[1].gpu as usize)
                .is_nvlink(),
            "{}",
            node.name
        );
    }
}
