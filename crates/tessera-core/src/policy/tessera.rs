//! `tessera`: Tessera's default policy.
//!
//! It starts from FGD's insight — place each pod where the node's expected
//! fragmentation (over the target workload) grows least — and changes what the
//! artifact leaves to chance:
//! - the fragment change is used exactly (in milli-GPU), not squashed through a
//!   sigmoid and truncated to an integer, so nodes FGD sees as equal are told apart;
//! - a one-GPU share goes to the GPU whose use leaves the least fragment, and among
//!   equal ones to the fullest (best fit), keeping emptier GPUs whole;
//! - opening an idle node costs a little, so whole nodes stay idle for multi-GPU pods;
//! - multi-GPU pods take the best-connected GPUs (NVLink, one NUMA node).
//!
//! The terms are combined here and only here, all in milli-GPU:
//! `score = (F_before − F_after) + fill_weight · fill_after − open_penalty · [node was idle]
//!  + topology_weight · interconnect`, where `fill_after` is the node's allocated GPU
//! share after placement in [0, 1] and `interconnect` the normalised topology quality
//! in [0, 1]. The score is a pure function of the node's state and the request, so the
//! scheduler caches it per request shape.

use std::sync::Arc;

use rand::RngCore;
use smallvec::SmallVec;

use super::{Policy, first_gpus, gpu_capacity_milli, gpu_free_milli};
use crate::fit::{Fit, GpuSet, NodeView, best_connected};
use crate::model::{Cluster, ModelId};
use crate::frag::{FragNode, TargetWorkload, node_frag, node_frag_accessible};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

/// The weights of Tessera's terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TesseraParams {
    /// Milli-GPU of fragment a completely full node is worth over an empty one.
    pub fill_weight: f64,
    /// Milli-GPU of fragment it costs to start using a node none of whose GPUs is in use.
    pub open_penalty: f64,
    /// Milli-GPU of fragment the best interconnect is worth.
    pub topology_weight: f64,
    /// The fragment change is rounded down to a multiple of this (milli-GPU; 0: exact).
    pub quantum: f64,
    /// Count the typical pods the node's GPU model excludes (as FGD does).
    pub count_inaccessible: bool,
    /// Milli-GPU of fragment per milli-GPU placed on a GPU model whose constrained demand
    /// equals the average demand per GPU (see [`model_pressure`]).
    pub pressure_weight: f64,
    /// Milli-GPU of fragment per GPU left free on the chosen GPU(s) after placement (best fit).
    pub gpu_tight_weight: f64,
    /// Milli-GPU of fragment per GPU left free on the node after placement.
    pub node_tight_weight: f64,
}

impl Default for TesseraParams {
    fn default() -> Self {
        TesseraParams {
            fill_weight: 0.0,
            open_penalty: 0.0,
            topology_weight: 10.0,
            quantum: 0.0,
            count_inaccessible: true,
            pressure_weight: 0.0,
            gpu_tight_weight: 0.0,
            node_tight_weight: 0.0,
        }
    }
}

pub struct Tessera {
    workload: Arc<TargetWorkload>,
    params: TesseraParams,
    /// Pressure per model id (empty: unknown, no pressure term).
    pressure: Vec<f64>,
}

impl Tessera {
    pub fn new(workload: Arc<TargetWorkload>) -> Tessera {
        Tessera::with_params(workload, TesseraParams::default())
    }

    pub fn with_params(workload: Arc<TargetWorkload>, params: TesseraParams) -> Tessera {
        Tessera {
            workload,
            params,
            pressure: Vec::new(),
        }
    }

    /// Knows the cluster's GPU models, so it can steer pods that may use any model
    /// away from the models the model-constrained typical pods need most.
    pub fn for_cluster(
        workload: Arc<TargetWorkload>,
        params: TesseraParams,
        cluster: &Cluster,
    ) -> Tessera {
        let pressure = model_pressure(&workload, cluster);
        Tessera {
            workload,
            params,
            pressure,
        }
    }
}

/// Per model id: the GPU demand of the model-constrained typical pods that falls on the
/// model (each pod's demand spread over its allowed models in proportion to their GPUs),
/// per GPU of the model, over the whole workload's demand per GPU of the cluster. 1.0
/// means the constrained pods alone ask as much of this model as the average pod asks of
/// any GPU.
pub fn model_pressure(wl: &TargetWorkload, cluster: &Cluster) -> Vec<f64> {
    let n_models = cluster.catalog.specs().len();
    let mut supply = vec![0.0f64; n_models];
    for node in cluster.nodes() {
        for g in &node.gpus {
            supply[g.model.0 as usize] += 1.0;
        }
    }
    let total_supply: f64 = supply.iter().sum();
    let supply_ref = &supply;
    let present = move |set: crate::model::ModelSet| {
        (0..n_models).filter(move |&m| supply_ref[m] > 0.0 && set.contains(ModelId(m as u8)))
    };
    let mut load = vec![0.0f64; n_models];
    let mut demand = 0.0;
    for p in &wl.pods {
        let d = p.weight * f64::from(p.gpus) * f64::from(p.milli);
        demand += d;
        let allowed: f64 = present(p.models).map(|m| supply[m]).sum();
        let everywhere = present(p.models).count() == supply.iter().filter(|&&s| s > 0.0).count();
        if everywhere || allowed == 0.0 {
            continue;
        }
        for m in present(p.models) {
            load[m] += d * supply[m] / allowed;
        }
    }
    if demand == 0.0 || total_supply == 0.0 {
        return vec![0.0; n_models];
    }
    let avg = demand / total_supply;
    (0..n_models)
        .map(|m| if supply[m] > 0.0 { load[m] / supply[m] / avg } else { 0.0 })
        .collect()
}

/// The node's fragment with `req` placed on `gpus` (none: as it is now).
fn frag(view: NodeView<'_>, req: Option<(&Request, &[u8])>, wl: &TargetWorkload, all: bool) -> f64 {
    let mut free: SmallVec<[u32; 8]> = view.used.gpus.iter().map(|g| g.free_cores_milli).collect();
    let mut cpu = view.used.free_cpu_milli;
    if let Some((req, gpus)) = req {
        let per = req.gpu.milli_per_gpu();
        for &g in gpus {
            free[g as usize] = free[g as usize].saturating_sub(per);
        }
        cpu = cpu.saturating_sub(req.cpu_milli);
    }
    let n = FragNode {
        free_milli: &free,
        free_cpu_milli: cpu,
        model: view.node.primary_model(),
    };
    if all { node_frag(&n, wl) } else { node_frag_accessible(&n, wl) }
}

/// The GPUs for `req` and the node's fragment after using them.
fn choose(
    view: NodeView<'_>,
    req: &Request,
    fit: &Fit,
    wl: &TargetWorkload,
    all: bool,
) -> (GpuSet, f64) {
    let frag_after = |view, req, gpus: &[u8], wl| frag(view, Some((req, gpus)), wl, all);
    match &req.gpu {
        GpuAsk::Shared { count: 1, .. } => {
            // Least fragment after; ties to the GPU with the least free share, then the lowest index.
            let mut best: Option<(u8, f64, u32)> = None;
            let mut tried: SmallVec<[u32; 8]> = SmallVec::new();
            for &g in &fit.usable {
                let free = view.used.gpus[g as usize].free_cores_milli;
                if tried.contains(&free) {
                    continue;
                }
                tried.push(free);
                let after = frag_after(view, req, &[g], wl);
                let better = match best {
                    None => true,
                    Some((_, a, f)) => after < a - 1e-9 || (after <= a + 1e-9 && free < f),
                };
                if better {
                    best = Some((g, after, free));
                }
            }
            match best {
                Some((g, after, _)) => ([g].into_iter().collect(), after),
                None => (GpuSet::new(), frag(view, None, wl, all)),
            }
        }
        GpuAsk::Whole { count } if *count > 1 => {
            let gpus = best_connected(view.node, &fit.usable, fit.need, req.constraints.nvlink);
            let after = frag_after(view, req, &gpus, wl);
            (gpus, after)
        }
        _ => {
            let gpus = first_gpus(fit);
            let after = frag_after(view, req, &gpus, wl);
            (gpus, after)
        }
    }
}

impl Policy for Tessera {
    fn name(&self) -> &'static str {
        "tessera"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let p = &self.params;
        let all = p.count_inaccessible;
        let before = frag(view, None, &self.workload, all);
        let (gpus, after) = choose(view, req, fit, &self.workload, all);
        let frag_removed = if p.quantum > 0.0 {
            ((before - after) / p.quantum).floor() * p.quantum
        } else {
            before - after
        };
        let cap = gpu_capacity_milli(view).max(1) as f64;
        let fill = 1.0 - gpu_free_milli(view).saturating_sub(req.gpu.total_milli()) as f64 / cap;
        let opens = req.gpu.gpu_count() > 0 && view.used.gpus.iter().all(|g| g.is_idle());
        let interconnect = super::topology::normalised_quality(view, &gpus);
        let pressure = view
            .node
            .primary_model()
            .and_then(|m| self.pressure.get(m.0 as usize))
            .copied()
            .unwrap_or(0.0);
        let per = req.gpu.milli_per_gpu();
        let gpu_left: f64 = gpus
            .iter()
            .map(|&g| f64::from(view.used.gpus[g as usize].free_cores_milli.saturating_sub(per)))
            .sum::<f64>()
            / 1000.0;
        let node_left = gpu_free_milli(view).saturating_sub(req.gpu.total_milli()) as f64 / 1000.0;
        let tight = p.gpu_tight_weight * gpu_left + p.node_tight_weight * node_left;
        let reserved = p.pressure_weight * pressure * req.gpu.total_milli() as f64;
        let score = frag_removed + p.fill_weight * fill - if opens { p.open_penalty } else { 0.0 }
            + p.topology_weight * interconnect
            - reserved
            - tight;
        Some(Scored {
            score,
            gpus,
            terms: [
                ScoreTerm {
                    name: "frag-removed-milli",
                    value: frag_removed,
                },
                ScoreTerm {
                    name: "fill-after",
                    value: fill,
                },
                ScoreTerm {
                    name: "opens-idle-node",
                    value: f64::from(u8::from(opens)),
                },
                ScoreTerm {
                    name: "model-pressure",
                    value: pressure,
                },
                ScoreTerm {
                    name: "interconnect",
                    value: interconnect,
                },
            ]
            .into_iter()
            .collect(),
        })
    }
}
