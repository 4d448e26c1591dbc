//! `clustering`: keep alike pods together — the artifact's `-GpuClustering 1000`
//! baseline (`gpu_clustering_score.go`).
//!
//! A pod's "affinity" is `share-gpu` for every one-GPU share (whatever its size) and
//! `N-gpu` for N whole GPUs; a node's affinities are those of its resident GPU pods.
//! With `b = trunc(25 · (8000 − free milli-GPU of the node) / 8000)` (integer
//! arithmetic, so fuller nodes and nodes with fewer GPUs score higher):
//! - 75 + b: the node hosts only the pod's affinity;
//! - 50 + b: the node hosts several affinities, the pod's among them;
//! - 25 + b: the node hosts no GPU pod;
//! - b: the node hosts other affinities only.
//!
//! CPU-only pods score 0 everywhere (the earlier node wins). GPUs: `best` selection.

use rand::RngCore;
use smallvec::SmallVec;

use super::bestfit::artifact_best_gpus;
use super::{Policy, gpu_free_milli};
use crate::fit::{Fit, NodeView};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

pub struct Clustering;

/// The artifact's GPU affinity of a request class ([`crate::placement::request_class`]):
/// 0 for a one-GPU share, else the GPU count.
fn affinity_of_class(class: u32) -> u32 {
    let count = class >> 16;
    let milli = class & 0x7fff;
    if count == 1 && milli < 1000 { 0 } else { count }
}

fn affinity_of(req: &Request) -> Option<u32> {
    match &req.gpu {
        GpuAsk::None => None,
        GpuAsk::Shared { count: 1, .. } => Some(0),
        g => Some(g.gpu_count()),
    }
}

/// Tier (3 best … 0) of a node for a pod of affinity `a`.
pub fn tier(view: NodeView<'_>, a: u32) -> u32 {
    let mut tags: SmallVec<[u32; 4]> = SmallVec::new();
    for &(class, n) in &view.used.classes {
        let t = affinity_of_class(class);
        if n > 0 && class != 0 && !tags.contains(&t) {
            tags.push(t);
        }
    }
    match (tags.contains(&a), tags.len()) {
        (true, 1) => 3,
        (true, _) => 2,
        (false, 0) => 1,
        (false, _) => 0,
    }
}

impl Policy for Clustering {
    fn name(&self) -> &'static str {
        "clustering"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let Some(a) = affinity_of(req) else {
            return Some(Scored::default());
        };
        let t = tier(view, a);
        let left = gpu_free_milli(view) as i64;
        let within = 25 * (8000 - left) / 8000;
        let score = 25 * i64::from(t) + within;
        Some(Scored {
            score: score as f64,
            gpus: artifact_best_gpus(view, req, fit),
            terms: [
                ScoreTerm {
                    name: "tier",
                    value: f64::from(t),
                },
                ScoreTerm {
                    name: "within-tier",
                    value: within as f64,
                },
            ]
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
    use crate::placement::{GpuGrant, Placement, request_class};

    #[test]
    fn tiers_and_within_tier_arithmetic() {
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
        // A 300-milli share on node a's GPU 0.
        let share = Request::share_milli(300, 1000, 0);
        l.apply(
            &c,
            &Placement {
                node: NodeId(0),
                grants: [GpuGrant::shared(0, 0, 300)].into_iter().collect(),
                class: request_class(&share),
                cpu_milli: 1000,
                ..Default::default()
            },
        )
        .unwrap();
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(0);
        let mut score = |id: u32, req: &Request| {
            let v = NodeView {
                node: c.node(NodeId(id)),
                used: l.node(NodeId(id)),
                catalog: &c.catalog,
            };
            let fit = crate::fit::check(v, req).unwrap();
            Clustering.score(v, req, &fit, &mut rng).unwrap().score
        };
        // A 500 share (same affinity as 300): node a, free 1700: 75 + trunc(25·6300/8000) = 75 + 19.
        assert_eq!(score(0, &Request::share_milli(500, 0, 0)), 94.0);
        // Idle node b (free 8000): 25 + 0.
        assert_eq!(score(1, &Request::share_milli(500, 0, 0)), 25.0);
        // A whole GPU on node a (other affinity only): 0 + 19.
        assert_eq!(score(0, &Request::whole(1, 0, 0)), 19.0);
        // CPU-only: 0.
        assert_eq!(score(0, &Request::cpu_only(1, 0)), 0.0);
    }
}
