//! `k8s-default`: the stock Kubernetes set-up that Tessera replaces — the NVIDIA
//! device plugin with whole GPUs only, and kube-scheduler's LeastAllocated scoring.
//!
//! The stock device plugin exposes `nvidia.com/gpu` as a count of whole devices,
//! so a pod that only needs a share of a GPU still holds a whole one and nobody
//! else can use the rest. This policy models exactly that: it only ever picks
//! *idle* GPUs (no tenant at all), declines nodes without enough of them, and takes
//! the lowest-index idle GPUs as the device plugin does. The grant itself still
//! records the pod's requested share, so simulators can tell useful utilisation
//! (requested milli-GPU in use) from GPUs held.
//!
//! Node score: LeastAllocated over CPU and GPU, counting GPUs as the device plugin
//! does (a GPU with any tenant is used):
//! `score = ½ · free CPU after / CPU capacity + ½ · idle GPUs after / GPUs`.

use rand::RngCore;

use super::Policy;
use crate::fit::{Fit, GpuSet, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

pub struct K8sDefault;

/// Mean free fraction of CPU and whole idle GPUs after placing the pod, in [0, 1].
pub fn least_allocated_whole(view: NodeView<'_>, req: &Request) -> f64 {
    let cpu_cap = view.node.cpu_milli.max(1) as f64;
    let cpu_free = view.used.free_cpu_milli.saturating_sub(req.cpu_milli) as f64 / cpu_cap;
    let gpus = view.node.gpus.len();
    if gpus == 0 {
        return cpu_free;
    }
    let idle_after = view
        .used
        .idle_gpus()
        .saturating_sub(req.gpu.gpu_count() as usize);
    (cpu_free + idle_after as f64 / gpus as f64) / 2.0
}

/// The stock set-up's answer on a node: the device plugin's GPUs
/// ([`device_plugin_gpus`]) with the node score `score`, reported as `term`.
pub fn device_plugin_scored(
    view: NodeView<'_>,
    req: &Request,
    fit: &Fit,
    term: &'static str,
    score: f64,
) -> Option<Scored> {
    Some(Scored {
        score,
        gpus: device_plugin_gpus(view, req, fit)?,
        terms: [ScoreTerm {
            name: term,
            value: score,
        }]
        .into_iter()
        .collect(),
    })
}

/// The GPUs the stock device plugin would hand out: the lowest-index *idle* ones
/// (a GPU with any tenant is taken); `None` when too few are idle or the pod asks
/// for a MIG instance (not something the whole-GPU plugin offers).
pub fn device_plugin_gpus(view: NodeView<'_>, req: &Request, fit: &Fit) -> Option<GpuSet> {
    match &req.gpu {
        GpuAsk::Mig { .. } => None,
        GpuAsk::None => Some(GpuSet::new()),
        GpuAsk::Whole { .. } | GpuAsk::Shared { .. } => {
            let idle: GpuSet = fit
                .usable
                .iter()
                .copied()
                .filter(|&g| view.used.gpus[g as usize].is_idle())
                .take(fit.need as usize)
                .collect();
            (idle.len() >= fit.need as usize).then_some(idle)
        }
    }
}

impl Policy for K8sDefault {
    fn name(&self) -> &'static str {
        "k8s-default"
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
            "least-allocated",
            least_allocated_whole(view, req),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use crate::model::{Catalog, Cluster, Node, NodeId};
    use crate::scheduler::{Decision, Scheduler};
    use rand::SeedableRng;

    /// Two nodes of two T4 GPUs and 8 CPUs each.
    pub(crate) fn two_t4_nodes() -> Cluster {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        Cluster::new(
            cat,
            vec![
                Node::uniform("a", 8000, 64_000, t4, 2),
                Node::uniform("b", 8000, 64_000, t4, 2),
            ],
        )
        .unwrap()
    }

    /// Four 300-milli shares on 4 GPUs: each takes a GPU of its own, the fifth waits,
    /// although only 1200 of 4000 milli-GPU are requested.
    #[test]
    fn a_share_holds_a_whole_gpu() {
        let c = two_t4_nodes();
        let mut l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(K8sDefault));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let req = Request::share_milli(300, 1000, 1024);
        let mut used = Vec::new();
        for _ in 0..4 {
            let Decision::Place(p) = s.decide(&c, &l, &req, &mut rng) else {
                panic!("a GPU is still idle")
            };
            used.push((p.node, p.grants[0].gpu));
            l.apply(&c, &p).unwrap();
        }
        used.sort();
        used.dedup();
        assert_eq!(used.len(), 4, "four distinct GPUs");
        assert_eq!(l.used_milli(), 1200);
        assert!(matches!(
            s.decide(&c, &l, &req, &mut rng),
            Decision::Unschedulable(_)
        ));
    }

    /// LeastAllocated spreads: the second whole GPU goes to the other, emptier node.
    #[test]
    fn spreads_over_nodes() {
        let c = two_t4_nodes();
        let mut l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(K8sDefault));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let req = Request::whole(1, 2000, 1024);
        let Decision::Place(a) = s.decide(&c, &l, &req, &mut rng) else {
            panic!()
        };
        l.apply(&c, &a).unwrap();
        let Decision::Place(b) = s.decide(&c, &l, &req, &mut rng) else {
            panic!()
        };
        assert_ne!(a.node, b.node);
        // Node a after a second pod: CPU (8000-2000-2000)/8000 = 0.5, GPUs 0/2 -> 0.25;
        // node b (empty) after it: CPU 0.75, GPUs 1/2 -> 0.625.
        let v = |i| NodeView {
            node: c.node(NodeId(i)),
            used: l.node(NodeId(i)),
            catalog: &c.catalog,
        };
        assert_eq!(least_allocated_whole(v(a.node.0), &req), 0.25);
    }
}
