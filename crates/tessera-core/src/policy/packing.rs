//! `packing`: fill partly used GPUs first — the artifact's `-GpuPacking 1000`
//! baseline (`gpu_packing_score.go`), integer scores as there:
//! - every GPU of the node is idle: `max(33 − idle GPUs, idle GPUs)` (smaller idle
//!   nodes first);
//! - the pod needs idle GPUs on a node already in use: `max(50 − idle GPUs used, 33)`;
//! - the pod fits on partly used GPUs: `max(100 − (Σ trunc(free·100/1000)) / 10, 50)`
//!   over the GPUs it would use (the least free that fit), so the fullest GPU wins.
//!
//! CPU-only pods score 0 everywhere (the earlier node wins). GPUs: `best` selection.

use rand::RngCore;

use super::Policy;
use super::bestfit::artifact_best_gpus;
use crate::fit::{Fit, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::Request;

pub struct Packing;

/// The artifact's packing score (0–100) of a node for a GPU request.
pub fn packing_score(view: NodeView<'_>, req: &Request) -> i64 {
    let free: smallvec::SmallVec<[i64; 8]> = view
        .used
        .gpus
        .iter()
        .map(|g| i64::from(g.free_cores_milli))
        .collect();
    let idle = free.iter().filter(|&&f| f == 1000).count() as i64;
    if idle == free.len() as i64 {
        return (33 - idle).max(idle);
    }
    // GPUs in ascending order of free milli (stable), taking those that fit.
    let mut order: smallvec::SmallVec<[usize; 8]> = (0..free.len()).collect();
    order.sort_by_key(|&i| free[i]);
    let per = i64::from(req.gpu.milli_per_gpu());
    let mut need = i64::from(req.gpu.gpu_count());
    let (mut idle_used, mut ratio_sum) = (0i64, 0i64);
    for &i in &order {
        if need == 0 {
            break;
        }
        if per <= free[i] {
            need -= 1;
            if free[i] == 1000 {
                idle_used += 1;
            }
            ratio_sum += free[i] * 100 / 1000;
        }
    }
    if need != 0 {
        return 0;
    }
    if idle_used > 0 {
        (50 - idle_used).max(33)
    } else {
        (100 - ratio_sum / 10).max(50)
    }
}

impl Policy for Packing {
    fn name(&self) -> &'static str {
        "packing"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        if fit.need == 0 {
            return Some(Scored::default());
        }
        let s = packing_score(view, req);
        Some(Scored {
            score: s as f64,
            gpus: artifact_best_gpus(view, req, fit),
            terms: [ScoreTerm {
                name: "packing",
                value: s as f64,
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
    use crate::placement::{GpuGrant, Placement};

    #[test]
    fn packing_tiers() {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let c = Cluster::new(
            cat,
            vec![
                Node::uniform("a", 64_000, 1 << 20, t4, 2),
                Node::uniform("b", 64_000, 1 << 20, t4, 8),
            ],
        )
        .unwrap();
        let mut l = Ledger::new(&c);
        l.apply(
            &c,
            &Placement {
                node: NodeId(0),
                grants: [GpuGrant::shared(1, 0, 350)].into_iter().collect(),
                ..Default::default()
            },
        )
        .unwrap();
        let s = |id: u32, req: &Request| {
            let v = NodeView {
                node: c.node(NodeId(id)),
                used: l.node(NodeId(id)),
                catalog: &c.catalog,
            };
            packing_score(v, req)
        };
        // Node a: GPU 1 has 650 free. A 500 share fits there: 100 − trunc(650·100/1000)/10 = 100 − 6.
        assert_eq!(s(0, &Request::share_milli(500, 0, 0)), 94);
        // A 700 share needs the idle GPU 0 on a used node: max(50 − 1, 33).
        assert_eq!(s(0, &Request::share_milli(700, 0, 0)), 49);
        // Idle 8-GPU node b: max(33 − 8, 8) = 25.
        assert_eq!(s(1, &Request::whole(1, 0, 0)), 25);
    }
}
