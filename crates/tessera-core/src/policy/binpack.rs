//! `binpack`: Kubernetes' MostAllocated over CPU and GPU — the fullest node wins,
//! and a share goes to the fullest GPU that still has room (best fit).

use rand::RngCore;

use super::{Policy, tightest_gpus};
use crate::fit::{Fit, NodeView, best_connected};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

pub struct Binpack;

impl Policy for Binpack {
    fn name(&self) -> &'static str {
        "binpack"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let score = 1.0 - super::spread::least_allocated(view, req);
        let gpus = match &req.gpu {
            GpuAsk::Shared { count: 1, .. } => tightest_gpus(view, req, fit),
            _ => best_connected(view.node, &fit.usable, fit.need, req.constraints.nvlink),
        };
        Some(Scored {
            score,
            gpus,
            terms: [ScoreTerm {
                name: "most-allocated",
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
    use crate::model::demo::demo_cluster;
    use crate::scheduler::{Decision, Scheduler};
    use rand::SeedableRng;

    #[test]
    fn second_share_joins_the_first_gpu() {
        let c = demo_cluster();
        let mut l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(Binpack));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let req = Request::share_milli(400, 1000, 1024);
        let Decision::Place(a) = s.decide(&c, &l, &req, &mut rng) else {
            panic!()
        };
        l.apply(&c, &a).unwrap();
        let Decision::Place(b) = s.decide(&c, &l, &req, &mut rng) else {
            panic!()
        };
        assert_eq!((a.node, a.grants[0].gpu), (b.node, b.grants[0].gpu));
        l.apply(&c, &b).unwrap();
        // 400 + 400 + 400 > 1000: the third goes to another GPU.
        let Decision::Place(third) = s.decide(&c, &l, &req, &mut rng) else {
            panic!()
        };
        assert_ne!((third.node, third.grants[0].gpu), (a.node, a.grants[0].gpu));
    }
}
