//! `random`: a uniformly random feasible node — the artifact's
//! `-Random 1000 -gpusel random` baseline (`random_score.go`: a pre-score step
//! gives one random feasible node the maximum score). Inside the node a share
//! takes a random usable GPU and whole GPUs the lowest-index idle ones.

use rand::RngCore;

use super::Policy;
use crate::fit::{Fit, GpuSet, NodeView};
use crate::placement::Scored;
use crate::request::{GpuAsk, Request};

/// Random placement (seeded through the RNG the scheduler passes in).
pub struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn score(
        &self,
        _view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        // A random score per node makes the arg-max a uniform pick among feasible nodes.
        let score = f64::from(rng.next_u32());
        // The artifact's `random` GPU selection: a one-GPU share goes to a uniformly
        // random usable GPU; whole GPUs are the lowest-index idle ones.
        let gpus: GpuSet = match &req.gpu {
            GpuAsk::Shared { count: 1, .. } if !fit.usable.is_empty() => {
                let i = (rng.next_u32() as usize) % fit.usable.len();
                [fit.usable[i]].into_iter().collect()
            }
            _ => super::first_gpus(fit),
        };
        Some(Scored {
            score,
            gpus,
            terms: Default::default(),
        })
    }

    fn cacheable(&self) -> bool {
        false
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
    fn same_seed_same_choice_and_spreads_over_nodes() {
        let c = demo_cluster();
        let l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(Random));
        let pick = |seed| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            match Scheduler::new(Box::new(Random)).decide(
                &c,
                &l,
                &Request::whole(1, 0, 0),
                &mut rng,
            ) {
                Decision::Place(p) => (p.node, p.grants[0].gpu),
                d => panic!("{d:?}"),
            }
        };
        assert_eq!(pick(3), pick(3));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let nodes: std::collections::BTreeSet<_> = (0..50)
            .filter_map(
                |_| match s.decide(&c, &l, &Request::whole(1, 0, 0), &mut rng) {
                    Decision::Place(p) => Some(p.node),
                    _ => None,
                },
            )
            .collect();
        assert!(
            nodes.len() > 5,
            "50 random picks landed on only {} nodes",
            nodes.len()
        );
    }
}
