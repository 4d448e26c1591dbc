//! `k8s-binpack`: the stock device plugin (whole GPUs only, see [`super::k8s_default`])
//! with kube-scheduler's `MostAllocated` scoring instead of `LeastAllocated` — the
//! set-up operators reach for when LeastAllocated spreads single-GPU pods so thinly
//! that 8-GPU pods never find an empty node.
//!
//! `score = ½ · used CPU after / CPU capacity + ½ · GPUs with a tenant after / GPUs`,
//! i.e. one minus LeastAllocated.

use rand::RngCore;

use super::Policy;
use super::k8s_default::{device_plugin_scored, least_allocated_whole};
use crate::fit::{Fit, NodeView};
use crate::placement::Scored;
use crate::request::Request;

pub struct K8sBinpack;

impl Policy for K8sBinpack {
    fn name(&self) -> &'static str {
        "k8s-binpack"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        device_plugin_scored(
            view,
            req,
            fit,
            "most-allocated",
            1.0 - least_allocated_whole(view, req),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use crate::policy::k8s_default::tests::two_t4_nodes;
    use crate::scheduler::{Decision, Scheduler};
    use rand::SeedableRng;

    /// MostAllocated packs: the second whole GPU joins the first on its node, and a
    /// share still holds a whole GPU of its own.
    #[test]
    fn packs_whole_gpus_onto_used_nodes() {
        let c = two_t4_nodes();
        let mut l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(K8sBinpack));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let req = Request::whole(1, 2000, 1024);
        let Decision::Place(a) = s.decide(&c, &l, &req, &mut rng) else {
            panic!("empty cluster")
        };
        l.apply(&c, &a).unwrap();
        let Decision::Place(b) = s.decide(&c, &l, &req, &mut rng) else {
            panic!("three GPUs idle")
        };
        assert_eq!(a.node, b.node, "packed onto the used node");
        assert_ne!(a.grants[0].gpu, b.grants[0].gpu);
        l.apply(&c, &b).unwrap();
        let share = Request::share_milli(300, 1000, 1024);
        let Decision::Place(p) = s.decide(&c, &l, &share, &mut rng) else {
            panic!("node b is idle")
        };
        assert_ne!(
            p.node, a.node,
            "a share needs an idle GPU under the stock plugin"
        );
    }
}
