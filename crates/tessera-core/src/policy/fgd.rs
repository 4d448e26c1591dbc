//! `fgd`: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23), as its
//! artifact runs it (`-FGD 1000 -gpusel FGD -dimext share -norm max`): place the
//! pod where the node's expected fragmentation (over the target workload) grows
//! least. The node score is `100 · sigmoid((F_before − F_after) / 1000)`, truncated
//! to an integer as the artifact does, so near-equal nodes tie and the earlier
//! node wins. For a one-GPU share every usable GPU is tried and the first with the
//! highest integer score kept;
//! whole and multi-GPU pods take the lowest-index free GPUs.

use std::sync::Arc;

use rand::RngCore;
use smallvec::SmallVec;

use super::{Policy, first_gpus};
use crate::fit::{Fit, GpuSet, NodeView};
use crate::frag::{FragNode, TargetWorkload, node_frag};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

pub struct Fgd {
    workload: Arc<TargetWorkload>,
}

impl Fgd {
    pub fn new(workload: Arc<TargetWorkload>) -> Fgd {
        Fgd { workload }
    }
}

/// Free milli per GPU of a node, as fragmentation sees it.
pub fn free_milli(view: NodeView<'_>) -> SmallVec<[u32; 8]> {
    view.used.gpus.iter().map(|g| g.free_cores_milli).collect()
}

/// The node's fragmentation now and after placing `req` on `gpus`, in milli-GPU.
pub fn frag_before_after(
    view: NodeView<'_>,
    req: &Request,
    gpus: &[u8],
    wl: &TargetWorkload,
) -> (f64, f64) {
    (frag_now(view, wl), frag_after(view, req, gpus, wl))
}

/// The node's fragmentation now, in milli-GPU.
pub fn frag_now(view: NodeView<'_>, wl: &TargetWorkload) -> f64 {
    let free = free_milli(view);
    node_frag(
        &FragNode {
            free_milli: &free,
            free_cpu_milli: view.used.free_cpu_milli,
            model: view.node.primary_model(),
        },
        wl,
    )
}

/// The node's fragmentation after placing `req` on `gpus`, in milli-GPU.
pub fn frag_after(view: NodeView<'_>, req: &Request, gpus: &[u8], wl: &TargetWorkload) -> f64 {
    let mut free = free_milli(view);
    let per = req.gpu.milli_per_gpu();
    for &g in gpus {
        free[g as usize] = free[g as usize].saturating_sub(per);
    }
    node_frag(
        &FragNode {
            free_milli: &free,
            free_cpu_milli: view.used.free_cpu_milli.saturating_sub(req.cpu_milli),
            model: view.node.primary_model(),
        },
        wl,
    )
}

/// For a one-GPU share: the usable GPU whose use leaves the least fragmentation
/// (ties to the lowest index), with its (before, after). Otherwise the first free GPUs.
pub fn least_frag_choice(
    view: NodeView<'_>,
    req: &Request,
    fit: &Fit,
    wl: &TargetWorkload,
) -> (GpuSet, f64, f64) {
    choose(view, req, fit, wl, |_, a| -a)
}

/// The artifact's choice (`calculateGpuShareFragExtendScore`): for a one-GPU share,
/// the first usable GPU with the highest *integer* score [`fgd_score`]; otherwise the
/// lowest-index idle GPUs. Returns the GPUs and the node's (before, after).
pub fn artifact_choice(
    view: NodeView<'_>,
    req: &Request,
    fit: &Fit,
    wl: &TargetWorkload,
) -> (GpuSet, f64, f64) {
    choose(view, req, fit, wl, fgd_score)
}

/// Tries each usable GPU of a one-GPU share and keeps the first with the highest
/// `key(before, after)`; otherwise the first free GPUs.
fn choose(
    view: NodeView<'_>,
    req: &Request,
    fit: &Fit,
    wl: &TargetWorkload,
    key: impl Fn(f64, f64) -> f64,
) -> (GpuSet, f64, f64) {
    let b = frag_now(view, wl);
    match &req.gpu {
        GpuAsk::Shared { count: 1, .. } => {
            let mut best: Option<(GpuSet, f64, f64, f64)> = None;
            let mut tried: SmallVec<[u32; 8]> = SmallVec::new();
            for &g in &fit.usable {
                // GPUs with the same free share give the same result: try each value once
                // (the first such GPU is the one a tie would keep anyway).
                let f = view.used.gpus[g as usize].free_cores_milli;
                if tried.contains(&f) {
                    continue;
                }
                tried.push(f);
                let a = frag_after(view, req, &[g], wl);
                let k = key(b, a);
                if best.as_ref().is_none_or(|(_, _, _, bk)| k > *bk) {
                    best = Some(([g].into_iter().collect(), b, a, k));
                }
            }
            best.map(|(g, b, a, _)| (g, b, a)).unwrap_or_default()
        }
        _ => {
            let gpus = first_gpus(fit);
            let a = frag_after(view, req, &gpus, wl);
            (gpus, b, a)
        }
    }
}

/// FGD's node score: `trunc(100 · sigmoid((F_before − F_after) / 1000))`.
pub fn fgd_score(before: f64, after: f64) -> f64 {
    (100.0 * sigmoid((before - after) / 1000.0)).trunc()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

impl Policy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let (gpus, before, after) = artifact_choice(view, req, fit, &self.workload);
        let score = fgd_score(before, after);
        Some(Scored {
            score,
            gpus,
            terms: [
                ScoreTerm {
                    name: "frag-before",
                    value: before,
                },
                ScoreTerm {
                    name: "frag-after",
                    value: after,
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
    use crate::frag::TypicalPod;
    use crate::ledger::Ledger;
    use crate::model::{Catalog, Cluster, ModelSet, Node, NodeId};
    use crate::placement::{GpuGrant, Placement};

    /// With a workload of 500-milli pods, a 500 share should go to the GPU that is
    /// already half used (fragment 0 after) rather than split a free GPU (500 left, usable).
    #[test]
    fn share_goes_where_fragmentation_falls() {
        let cat = Catalog::default();
        let g2 = cat.find("G2").unwrap();
        let c = Cluster::new(cat, vec![Node::uniform("n", 96_000, 1 << 20, g2, 2)]).unwrap();
        let mut l = Ledger::new(&c);
        l.apply(
            &c,
            &Placement {
                node: NodeId(0),
                grants: [GpuGrant::shared(1, 0, 700)].into_iter().collect(),
                ..Default::default()
            },
        )
        .unwrap();
        // GPU 0 free 1000, GPU 1 free 300.
        let wl = TargetWorkload {
            pods: vec![TypicalPod {
                cpu_milli: 0,
                gpus: 1,
                milli: 300,
                models: ModelSet::ALL,
                weight: 1.0,
            }],
        };
        let v = NodeView {
            node: c.node(NodeId(0)),
            used: l.node(NodeId(0)),
            catalog: &c.catalog,
        };
        let req = Request::share_milli(300, 0, 0);
        let fit = crate::fit::check(v, &req).unwrap();
        let (gpus, before, after) = least_frag_choice(v, &req, &fit, &wl);
        // Before: both GPUs fit a 300 pod, no fragment. Using GPU 1 leaves 0 there and
        // 1000 on GPU 0: fragment 0. Using GPU 0 leaves 700 and 300: fragment 0 too,
        // so the tie goes to the lower index... unless GPU 1 is strictly better:
        assert_eq!(before, 0.0);
        assert_eq!(after, 0.0);
        assert_eq!(gpus.as_slice(), &[0]);
        // With 400-milli typical pods, GPU 1 (300 free) is already a fragment; filling it
        // removes it, while using GPU 0 leaves 700 (fits) and keeps GPU 1's 300 as fragment.
        let wl = TargetWorkload {
            pods: vec![TypicalPod {
                cpu_milli: 0,
                gpus: 1,
                milli: 400,
                models: ModelSet::ALL,
                weight: 1.0,
            }],
        };
        let (gpus, before, after) = least_frag_choice(v, &req, &fit, &wl);
        assert_eq!((gpus.as_slice(), before, after), (&[1u8][..], 300.0, 0.0));
    }
}
