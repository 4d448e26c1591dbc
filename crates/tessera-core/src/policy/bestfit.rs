//! `bestfit`: the node left with the least free CPU and GPU after placement wins —
//! the artifact's `-BestFit 1000` baseline: minimise
//! `0.5 · free CPU after / CPU capacity + 0.5 · free GPU after / GPU capacity`.

use rand::RngCore;

use super::{Policy, gpu_capacity_milli, gpu_free_milli, tightest_gpus};
use crate::fit::{Fit, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::Request;

pub struct BestFit;

/// Weighted free share left after placing `req`, in [0, 1]: lower is a better fit.
pub fn leftover(view: NodeView<'_>, req: &Request) -> f64 {
    let cpu = view.used.free_cpu_milli.saturating_sub(req.cpu_milli) as f64
        / view.node.cpu_milli.max(1) as f64;
    let cap = gpu_capacity_milli(view).max(1) as f64;
    let gpu = gpu_free_milli(view).saturating_sub(req.gpu.total_milli()) as f64 / cap;
    0.5 * cpu + 0.5 * gpu
}

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "bestfit"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let left = leftover(view, req);
        Some(Scored {
            score: -left,
            gpus: tightest_gpus(view, req, fit),
            terms: [ScoreTerm {
                name: "leftover",
                value: left,
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
    fn leftover_arithmetic() {
        let cat = Catalog::default();
        let g2 = cat.find("G2").unwrap();
        let c = Cluster::new(cat, vec![Node::uniform("n", 96_000, 1, g2, 8)]).unwrap();
        let l = Ledger::new(&c);
        let v = NodeView {
            node: c.node(NodeId(0)),
            used: l.node(NodeId(0)),
            catalog: &c.catalog,
        };
        // CPU (96000-24000)/96000 = 0.75; GPU (8000-2000)/8000 = 0.75; 0.5*0.75 + 0.5*0.75
        assert_eq!(leftover(v, &Request::whole(2, 24_000, 0)), 0.75);
    }
}
