//! `tessera`: Tessera's default policy.
//!
//! FGD's rule — place each pod where the node's expected fragmentation over the target
//! workload grows least — with these changes, each for a reason (the measurements and
//! what was tried and dropped are in `docs/tuning.md`; the ablation in
//! `docs/simulator.md`):
//! - **Bands, then first fit.** The fragment change is rounded down to bands and nodes
//!   in one band tie, ties going to the earlier node: chasing tiny differences spreads
//!   pods over the cluster, first fit keeps used GPUs together and whole nodes idle.
//!   Bands are `quantum` wide, and for a share `share_quantum_scale` × its milli-GPU, so
//!   each share is judged on changes comparable to its own size.
//! - **Model scarcity is the pressure's alone.** The fragment reads the shapes' sizes
//!   and ignores which models they may use ([`ShapeModels::Ignored`]), so nodes of
//!   every model are judged against one workload and their fragment changes compare
//!   (counting only the shapes a node's model allows weighs each model's nodes on a
//!   different part of the workload). Between models the pressure decides: a pod
//!   pays `pressure_weight · pressure(model)^pressure_exponent · its milli-GPU` for
//!   using a model that model-constrained shapes need ([`model_pressure`]:
//!   about the share of the model's GPUs they need), so unconstrained pods leave the
//!   scarce models to the pods that can run nowhere else. The cost is convex (cube):
//!   where constrained pods need a small part of a model it only breaks ties, where
//!   they need all of it (pressure ≥ 1) it rules. The pressure is measured against the
//!   GPUs still free (callers build the policy from [`crate::ledger::Ledger::free_milli_by_model`] and
//!   again when [`super::SupplyWatch`] says the supply moved): a model that other pods
//!   use up faster than the rest grows scarcer for the pods that need it, which a
//!   pressure fixed by the inventory cannot see.
//! - **Fragment counts the CPU the node has left for each shape** (`cpu_counted`): FGD
//!   calls a node's fitting GPUs usable by a shape as soon as the node has CPU for one
//!   pod of it, so a node with three free GPUs and CPU for one more 1-GPU pod counts
//!   none of them as fragment, though two will stay idle. Here a shape with CPU for `n`
//!   more pods of `k` GPUs can use only the `n · k` fitting GPUs with the most free,
//!   the rest is fragment. That makes every pod — CPU-only ones included, which now
//!   need no rule of their own — pay for the GPUs its CPU strands.
//! - **The fragment's target keeps a share of generic shapes** (`generic_share`, 0.4;
//!   [`generic_shapes`]: mostly quarter shares, some whole GPUs and CPU-only pods)
//!   beside the learned mix. The learned mix says what the cluster runs now; measured
//!   against it alone the fragment chases its exact sizes and counts every piece no
//!   learned shape fits as lost, while small round shares keep a piece of a quarter
//!   GPU or more worth something: the fragment then tells the slivers and the GPUs the
//!   CPU strands, which nothing will use, from pieces the next share may well fill.
//!   The pressure reads the learned target alone.
//! - **Multi-GPU shapes are capped so that keeping an idle node whole is worth at most
//!   half a band** (`multi_gpu_bands`): the expectation counts a k-GPU node's whole idle GPU
//!   as fragment for k-GPU shapes once one GPU is taken, and with frequent multi-GPU
//!   shapes that outweighs how well small pods fit; capped, it decides only between
//!   nodes that are otherwise about equal.
//!
//! Inside the node a one-GPU share takes the GPU that leaves the least fragment, then
//! the fullest; multi-GPU pods take the best-connected GPUs (`topology_weight`: the
//! fill experiment cannot measure it, as the openb nodes carry no interconnect, but it
//! decides between equal nodes for multi-GPU pods on NVLink machines).
//!
//! The terms are combined here and only here, all in milli-GPU of fragment:
//!
//! ```text
//! score = band(F_before − F_after) − pressure_weight · pressure³ · milli
//!         + topology_weight · interconnect
//! band(x) = ⌊x / q⌋ · q,  q = share_quantum_scale · milli for shares, quantum otherwise
//! ```
//!
//! F is measured against the caller's target (the trace's typical pods, or the
//! workload learned online, [`crate::workload::LearnedWorkload`]) with the generic
//! shapes beside it ([`with_generic`]), the pressure against the caller's target.
//! The score is a pure function of the node's state and the request, so the
//! scheduler caches it per shape; a caller whose target changes builds a new policy.
//! The policy itself keeps each fragment value by node state (`FragMemo`), which
//! nodes in one state share.

use std::sync::{Arc, Mutex, PoisonError};

use rand::RngCore;
use smallvec::SmallVec;

use super::{Policy, first_gpus};
use crate::fit::{Fit, GpuSet, NodeView, best_connected};
use crate::frag::{CompiledWorkload, FragNode, TargetWorkload};
use crate::model::{ModelId, ModelSet};
use crate::placement::{ScoreTerm, Scored};
use crate::request::{GpuAsk, Request};

/// The weights of Tessera's terms (milli-GPU of fragment).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TesseraParams {
    /// Width of the fragment-change bands (milli-GPU; 0: exact).
    pub quantum: f64,
    /// How the fragment counts the target's model-constrained shapes.
    pub shape_models: ShapeModels,
    /// Cost per milli-GPU placed on a model of pressure 1 ([`model_pressure`]).
    pub pressure_weight: f64,
    /// The cost grows as pressure to this power.
    pub pressure_exponent: f64,
    /// Worth of the best interconnect for multi-GPU pods.
    pub topology_weight: f64,
    /// Most fragment, in bands of `quantum`, that the shapes of one GPU count k > 1 may
    /// add when one GPU of an idle k-GPU node is taken: their weight together is capped
    /// at `multi_gpu_bands · quantum / ((k − 1) · 1000)` before the weights are
    /// renormalised (0: no cap).
    pub multi_gpu_bands: f64,
    /// For shares: band width as this fraction of the share's milli-GPU instead of
    /// `quantum` (0: `quantum`).
    pub share_quantum_scale: f64,
    /// A shape's usable GPUs are limited by the CPU left for its pods
    /// ([`CompiledWorkload::node_frag_cpu_counted`]); off, FGD's measure.
    pub cpu_counted: bool,
    /// Share of the fragment's target given to the generic shapes
    /// ([`generic_shapes`]), the rest to the caller's target
    /// (0: the caller's alone). The model pressure reads the caller's target only.
    pub generic_share: f64,
}

impl Default for TesseraParams {
    /// The weights chosen on the openb traces.
    fn default() -> Self {
        TesseraParams {
            quantum: 100.0,
            shape_models: ShapeModels::Ignored,
            pressure_weight: 2.0,
            pressure_exponent: 3.0,
            topology_weight: 10.0,
            multi_gpu_bands: 0.5,
            share_quantum_scale: 0.285,
            cpu_counted: true,
            generic_share: 0.4,
        }
    }
}

/// How Tessera's fragment counts the shapes of the target that may use only some
/// GPU models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeModels {
    /// As shapes any model may take: the fragment measures sizes only, and the
    /// model pressure alone keeps other pods off the models constrained pods need.
    Ignored,
    /// Only the shapes the node's model allows count.
    Accessible,
    /// The shapes the node's model excludes count all its free GPU as fragment
    /// (FGD's measure).
    ExcludedAsIdle,
}

pub struct Tessera {
    workload: CompiledWorkload,
    params: TesseraParams,
    /// Pressure per model id (empty: unknown, no pressure term).
    pressure: Vec<f64>,
    memo: FragMemo,
}

impl Tessera {
    /// The one constructor. `model_supply` is the GPU supply by model id that the
    /// constrained demand is weighed against ([`super::PolicyArgs::model_supply`]: the
    /// compute still free, or the inventory); empty means unknown, and then there is
    /// no model-pressure term.
    pub fn new(
        workload: Arc<TargetWorkload>,
        model_supply: &[u32],
        params: TesseraParams,
    ) -> Tessera {
        let mut target = cap_multi_gpu(&with_generic(&workload, params.generic_share), |k| {
            params.multi_gpu_bands * params.quantum / (f64::from(k.max(2) - 1) * 1000.0)
        });
        if params.shape_models == ShapeModels::Ignored {
            for p in &mut target.pods {
                p.models = ModelSet::ALL;
            }
        }
        Tessera {
            workload: CompiledWorkload::new(&target),
            params,
            pressure: model_pressure(&workload, model_supply),
            memo: FragMemo::default(),
        }
    }
}

/// A node's fragment by its state: the GPUs' free milli (sorted), its free CPU and its
/// model, which are all the measure reads for a fixed workload. A cluster holds many
/// nodes in one state (every idle node of a type, every full one), and the scheduler
/// scores each shape on each of them, so most evaluations repeat. Direct-mapped: a
/// slot is overwritten on a collision; a hit compares the whole state, so it is exact.
#[derive(Default)]
struct FragMemo {
    slots: Mutex<Vec<MemoSlot>>,
}

#[derive(Clone, Default)]
struct MemoSlot {
    state: Option<(SmallVec<[u32; 8]>, u64, Option<ModelId>)>,
    value: f64,
}

const MEMO_SLOTS: usize = 1 << 12;

impl FragMemo {
    fn get_or(&self, n: &FragNode<'_>, compute: impl FnOnce() -> f64) -> f64 {
        let mut h: u64 = n.free_cpu_milli ^ n.model.map_or(0xff, |m| u64::from(m.0));
        for &l in n.free_milli {
            h = (h.rotate_left(5) ^ u64::from(l)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        let slot = ((h ^ (h >> 29)) as usize) & (MEMO_SLOTS - 1);
        let same = |s: &MemoSlot| {
            s.state.as_ref().is_some_and(|(free, cpu, model)| {
                free.as_slice() == n.free_milli && *cpu == n.free_cpu_milli && *model == n.model
            })
        };
        {
            let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(s) = slots.get(slot)
                && same(s)
            {
                return s.value;
            }
        }
        let value = compute();
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if slots.is_empty() {
            slots.resize(MEMO_SLOTS, MemoSlot::default());
        }
        slots[slot] = MemoSlot {
            state: Some((n.free_milli.into(), n.free_cpu_milli, n.model)),
            value,
        };
        value
    }
}

/// The generic shapes the fragment's target keeps beside the caller's
/// ([`TesseraParams::generic_share`]): quarter-GPU shares 0.7, whole GPUs 0.1,
/// CPU-only pods 0.2, each with 4 cores. Not a guess at the workload (that is the
/// learned target's job, and the cold-start prior's before anything arrived,
/// [`crate::workload::cold_start_prior`]): small shares make a piece of a quarter GPU or
/// more count as usable, so what the fragment adds on top of the learned mix is the
/// worth of keeping leftovers in pieces of that size.
pub fn generic_shapes() -> TargetWorkload {
    crate::workload::round_shapes(&[(1, 250, 0.7), (1, 1000, 0.1), (0, 0, 0.2)])
}

/// `share` of the generic shapes ([`generic_shapes`]) beside `1 − share` of `wl` (a
/// share outside (0, 1) leaves `wl` as it is).
pub fn with_generic(wl: &TargetWorkload, share: f64) -> TargetWorkload {
    let mut out = wl.clone();
    if !(share > 0.0 && share < 1.0) || wl.pods.is_empty() {
        return out;
    }
    for p in &mut out.pods {
        p.weight *= 1.0 - share;
    }
    for mut p in generic_shapes().pods {
        p.weight *= share;
        out.pods.push(p);
    }
    out
}

/// The workload with the shapes of each GPU count k above 1 scaled down, where they
/// weigh more than `cap(k)` together, to weigh `cap(k)`, before all weights are
/// renormalised to sum to 1. A cap of 0 (or less) leaves that count alone.
pub fn cap_multi_gpu(wl: &TargetWorkload, cap: impl Fn(u32) -> f64) -> TargetWorkload {
    let mut out = wl.clone();
    let mut changed = false;
    let mut by_count: SmallVec<[(u32, f64); 4]> = SmallVec::new();
    for p in wl.pods.iter().filter(|p| p.gpus > 1) {
        match by_count.iter_mut().find(|(k, _)| *k == p.gpus) {
            Some((_, w)) => *w += p.weight,
            None => by_count.push((p.gpus, p.weight)),
        }
    }
    for p in out.pods.iter_mut().filter(|p| p.gpus > 1) {
        let total = by_count
            .iter()
            .find(|(k, _)| *k == p.gpus)
            .map_or(0.0, |(_, w)| *w);
        let cap = cap(p.gpus);
        if cap > 0.0 && total > cap {
            p.weight *= cap / total;
            changed = true;
        }
    }
    let sum: f64 = out.pods.iter().map(|p| p.weight).sum();
    if changed && sum > 0.0 {
        for p in &mut out.pods {
            p.weight /= sum;
        }
    }
    out
}

/// Per model id: the GPU demand of the model-constrained typical pods that falls on the
/// model (each pod's demand spread over its allowed models in proportion to their
/// supply), per unit of the model's supply, over the whole workload's demand per unit of
/// the cluster's supply. 1.0 means the constrained pods alone ask as much of this model
/// as the average pod asks of any GPU. With the free compute as the supply
/// ([`crate::ledger::Ledger::free_milli_by_model`]) the pressure on a model grows as other pods use it
/// up faster than the rest, and falls back when it is freed.
pub fn model_pressure(wl: &TargetWorkload, model_supply: &[u32]) -> Vec<f64> {
    let n_models = model_supply.len();
    let supply: Vec<f64> = model_supply.iter().map(|&n| f64::from(n)).collect();
    let total_supply: f64 = supply.iter().sum();
    let supply_ref = &supply;
    let present = move |set: ModelSet| {
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
        .map(|m| {
            if supply[m] > 0.0 {
                load[m] / supply[m] / avg
            } else {
                0.0
            }
        })
        .collect()
}

impl Tessera {
    /// The node's fragment with `req` placed on `gpus` (none: as it is now).
    fn frag(&self, view: NodeView<'_>, req: Option<(&Request, &[u8])>) -> f64 {
        let mut free: SmallVec<[u32; 8]> =
            view.used.gpus.iter().map(|g| g.free_cores_milli).collect();
        let mut cpu = view.used.free_cpu_milli;
        if let Some((req, gpus)) = req {
            let per = req.gpu.milli_per_gpu();
            for &g in gpus {
                free[g as usize] = free[g as usize].saturating_sub(per);
            }
            cpu = cpu.saturating_sub(req.cpu_milli);
        }
        // The measure reads the free values as a multiset: sorted, equal states share a slot.
        free.sort_unstable();
        let n = FragNode {
            free_milli: &free,
            free_cpu_milli: cpu,
            // With the shapes' models ignored nodes of any model in one state share a
            // memo slot.
            model: match self.params.shape_models {
                ShapeModels::Ignored => None,
                _ => view.node.primary_model(),
            },
        };
        let accessible_only = self.params.shape_models != ShapeModels::ExcludedAsIdle;
        self.memo.get_or(&n, || {
            if self.params.cpu_counted {
                self.workload.node_frag_cpu_counted(&n, accessible_only)
            } else {
                self.workload.node_frag(&n, accessible_only)
            }
        })
    }

    /// The GPUs for `req` and the node's fragment after using them.
    fn choose(&self, view: NodeView<'_>, req: &Request, fit: &Fit) -> (GpuSet, f64) {
        let frag_after = |gpus: &[u8]| self.frag(view, Some((req, gpus)));
        match &req.gpu {
            GpuAsk::Shared { count: 1, .. } => {
                // Least fragment after; ties to the GPU with the least free share, then the
                // lowest index.
                let mut best: Option<(u8, f64, u32)> = None;
                let mut tried: SmallVec<[u32; 8]> = SmallVec::new();
                for &g in &fit.usable {
                    let free = view.used.gpus[g as usize].free_cores_milli;
                    if tried.contains(&free) {
                        continue;
                    }
                    tried.push(free);
                    let after = frag_after(&[g]);
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
                    None => (GpuSet::new(), self.frag(view, None)),
                }
            }
            GpuAsk::Whole { count } if *count > 1 => {
                let gpus = best_connected(view.node, &fit.usable, fit.need, req.constraints.nvlink);
                let after = frag_after(&gpus);
                (gpus, after)
            }
            _ => {
                let gpus = first_gpus(fit);
                let after = frag_after(&gpus);
                (gpus, after)
            }
        }
    }
}

impl Policy for Tessera {
    fn name(&self) -> &'static str {
        "tessera"
    }

    fn learns_workload(&self) -> bool {
        true
    }

    /// Only the model pressure reads the supply: with no model-constrained shape in
    /// the target there is nothing to follow.
    fn follows_supply(&self) -> bool {
        self.pressure.iter().any(|&p| p > 0.0)
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        _rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let p = &self.params;
        let before = self.frag(view, None);
        let (gpus, after) = self.choose(view, req, fit);
        let quantum = match req.gpu {
            GpuAsk::Shared { cores_milli, .. } if p.share_quantum_scale > 0.0 => {
                p.share_quantum_scale * f64::from(cores_milli)
            }
            _ => p.quantum,
        };
        let frag_removed = if quantum > 0.0 {
            ((before - after) / quantum).floor() * quantum
        } else {
            before - after
        };
        let pressure = view
            .node
            .primary_model()
            .and_then(|m| self.pressure.get(m.0 as usize))
            .copied()
            .unwrap_or(0.0);
        let reserved =
            p.pressure_weight * pressure.powf(p.pressure_exponent) * req.gpu.total_milli() as f64;
        let interconnect = super::topology::normalised_quality(view, &gpus);
        let score = frag_removed - reserved + p.topology_weight * interconnect;
        Some(Scored {
            score,
            gpus,
            terms: [
                ScoreTerm {
                    name: "frag-removed-milli",
                    value: frag_removed,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frag::TypicalPod;
    use crate::ledger::Ledger;
    use crate::model::{Catalog, Cluster, ModelSet, Node, NodeId};
    use crate::placement::{GpuGrant, Placement};
    use crate::scheduler::{Decision, Scheduler};
    use rand::SeedableRng;

    fn pod(gpus: u32, milli: u32, models: ModelSet, weight: f64) -> TypicalPod {
        TypicalPod {
            cpu_milli: 1000,
            gpus,
            milli,
            models,
            weight,
        }
    }

    /// Two T4 nodes (4 GPUs) and six G2 nodes (48 GPUs). Half the pods (by weight) are
    /// whole-GPU pods that must run on T4.
    fn setup() -> (Cluster, TargetWorkload, ModelId, ModelId) {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let g2 = cat.find("G2").unwrap();
        let mut nodes = vec![
            Node::uniform("t4-a", 32_000, 1 << 20, t4, 2),
            Node::uniform("t4-b", 32_000, 1 << 20, t4, 2),
        ];
        for i in 0..6 {
            nodes.push(Node::uniform(format!("g2-{i}"), 96_000, 1 << 20, g2, 8));
        }
        let mut only_t4 = ModelSet(0);
        only_t4.insert(t4);
        let wl = TargetWorkload {
            pods: vec![pod(1, 1000, only_t4, 0.5), pod(1, 1000, ModelSet::ALL, 0.5)],
        };
        (Cluster::new(cat, nodes).unwrap(), wl, t4, g2)
    }

    /// `t`'s score for `req` on `node` as `l` leaves it (the policy reads no
    /// randomness).
    fn scored(t: &Tessera, c: &Cluster, l: &Ledger, node: u32, req: &Request) -> Scored {
        let v = NodeView {
            node: c.node(NodeId(node)),
            used: l.node(NodeId(node)),
            catalog: &c.catalog,
        };
        let fit = crate::fit::check(v, req).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        t.score(v, req, &fit, &mut rng).unwrap()
    }

    /// The fragment term of `t`'s score for `req` on `node` as `l` leaves it.
    fn frag_removed(t: &Tessera, c: &Cluster, l: &Ledger, node: u32, req: &Request) -> f64 {
        scored(t, c, l, node, req).terms[0].value
    }

    #[test]
    fn multi_gpu_shapes_are_capped_per_count() {
        let wl = TargetWorkload {
            pods: vec![
                pod(1, 1000, ModelSet::ALL, 0.8),
                pod(8, 1000, ModelSet::ALL, 0.06),
                pod(8, 1000, ModelSet::ALL, 0.04),
                pod(2, 1000, ModelSet::ALL, 0.004),
                pod(0, 0, ModelSet::ALL, 0.096),
            ],
        };
        let c = cap_multi_gpu(&wl, |_| 0.01);
        // The 8-GPU shapes (0.1 together) scale to 0.01, keeping their ratio; the 2-GPU
        // shape is under the cap. Then everything is renormalised (sum 0.91).
        let sum = 0.8 + 0.01 + 0.004 + 0.096;
        let w: Vec<f64> = c.pods.iter().map(|p| p.weight).collect();
        let want = [
            0.8 / sum,
            0.006 / sum,
            0.004 / sum,
            0.004 / sum,
            0.096 / sum,
        ];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{w:?}");
        }
        assert_eq!(cap_multi_gpu(&wl, |_| 0.0), wl);
    }

    /// The cap follows from the band: one GPU taken from an idle 8-GPU node adds
    /// 7000 · w8 of fragment for the 8-GPU shapes, so w8 ≤ 100 / 7000 keeps it within
    /// one band of 100 (before renormalising, which inflates it where multi-GPU shapes
    /// are much of the workload, as here).
    #[test]
    fn multi_gpu_cap_keeps_an_idle_node_worth_one_band() {
        let (c, _, _, _) = setup();
        let l = Ledger::new(&c);
        let wl = TargetWorkload {
            pods: vec![
                pod(1, 1000, ModelSet::ALL, 0.5),
                pod(8, 1000, ModelSet::ALL, 0.5),
            ],
        };
        let req = Request::whole(1, 1000, 0);
        let removed = |bands: f64| {
            let params = TesseraParams {
                multi_gpu_bands: bands,
                quantum: 100.0,
                generic_share: 0.0,
                ..TesseraParams::default()
            };
            let t = Tessera::new(Arc::new(wl.clone()), &[], params);
            frag_removed(&t, &c, &l, 2, &req)
        };
        // Uncapped: 0.5 · 7000 = 3500 of new fragment, 35 bands.
        assert_eq!(removed(0.0), -3500.0);
        // Capped: w8 = 1/70, then (1/70) / (0.5 + 1/70) ≈ 0.0278 after renormalising:
        // 7000 · 0.0278 ≈ 194.4, rounded down to two bands.
        assert_eq!(removed(1.0), -200.0);
        // Half a band: w8 = 1/140 → (1/140) / (0.5 + 1/140) ≈ 0.0141, 7000 · w8 ≈ 98.6.
        assert_eq!(removed(0.5), -100.0);
    }

    #[test]
    fn pressure_arithmetic() {
        let (c, wl, t4, g2) = setup();
        let p = model_pressure(&wl, &super::super::gpus_per_model(&c));
        // Demand per GPU of the cluster: (0.5·1000 + 0.5·1000) / 52 GPUs.
        // T4 carries the constrained 0.5·1000 over its 4 GPUs: (500/4) / (1000/52) = 6.5.
        assert!((p[t4.0 as usize] - 6.5).abs() < 1e-9);
        assert_eq!(p[g2.0 as usize], 0.0);
    }

    /// The pressure measured against the GPUs still free: others using up three of
    /// the four T4 GPUs make T4 scarce for the pods that need it, where the inventory
    /// still says it is plentiful; the supply watch asks for a rebuild once the free
    /// supply has moved by 1 % of the cluster's compute and unevenly, not before.
    #[test]
    fn pressure_follows_the_free_supply() {
        let (c, _, t4, g2) = setup();
        let mut only_t4 = ModelSet(0);
        only_t4.insert(t4);
        let wl = TargetWorkload {
            pods: vec![
                pod(1, 1000, only_t4, 0.02),
                pod(1, 1000, ModelSet::ALL, 0.98),
            ],
        };
        let mut l = Ledger::new(&c);
        let fresh = l.free_milli_by_model();
        assert_eq!(fresh[t4.0 as usize], 4_000);
        assert_eq!(fresh[g2.0 as usize], 48_000);
        // Nothing placed: the free supply is the inventory (in milli), same pressure.
        let inventory = model_pressure(&wl, &super::super::gpus_per_model(&c));
        // (0.02·1000 / 4) / (1000 / 52) = 0.26.
        assert!((inventory[t4.0 as usize] - 0.26).abs() < 1e-9);
        assert!((model_pressure(&wl, &fresh)[t4.0 as usize] - 0.26).abs() < 1e-9);
        let mut watch = super::super::SupplyWatch::new(&c, &l);
        let whole = |node: u32, gpu: u8| Placement {
            node: NodeId(node),
            grants: [GpuGrant::whole(gpu, 1000)].into_iter().collect(),
            ..Placement::default()
        };
        // A 100-milli share moves the supply by 0.2 % of 52 GPUs: no rebuild yet.
        l.apply(
            &c,
            &Placement {
                node: NodeId(0),
                grants: [GpuGrant::shared(0, 1000, 100)].into_iter().collect(),
                ..Placement::default()
            },
        )
        .unwrap();
        assert!(!watch.moved(&l));
        l.apply(&c, &whole(0, 1)).unwrap();
        l.apply(&c, &whole(1, 0)).unwrap();
        assert!(watch.moved(&l), "2.1 GPUs of 52 used");
        assert_eq!(watch.built()[t4.0 as usize], 1_900);
        // T4: 0.02·1000 over 1.9 free GPUs; the cluster: 1000 over 49.9 free.
        let free = model_pressure(&wl, watch.built())[t4.0 as usize];
        assert!((free - 20.0 / 1.9 / (1000.0 / 49.9)).abs() < 1e-9, "{free}");
        assert!(free > 2.0 * inventory[t4.0 as usize]);
        assert!(!watch.moved(&l), "nothing moved since");
        // Supply used up evenly (a quarter of what is free on each model) leaves the
        // shares, and so the pressure, where they were: no rebuild, though 13 GPUs moved.
        let mut even = Ledger::new(&c);
        let mut watch = super::super::SupplyWatch::new(&c, &even);
        even.apply(&c, &whole(0, 0)).unwrap();
        for node in 2..8 {
            for gpu in 0..2 {
                even.apply(&c, &whole(node, gpu)).unwrap();
            }
        }
        assert!(!watch.moved(&even));
        even.apply(&c, &whole(1, 0)).unwrap();
        assert!(watch.moved(&even), "T4 now half used, G2 a quarter");
    }

    /// The generic shapes take their share of the fragment's target: a half share on
    /// the idle GPU of a one-GPU node, against a target of whole-GPU pods only, leaves
    /// 500 milli no whole pod fits (500 of fragment); with 0.4 of generic shapes the
    /// whole-GPU shapes weigh 0.64, the quarter shares 0.28 and the CPU-only ones 0.08,
    /// and the quarters fit what is left: before 0.08 · 1000, after 0.64 · 500 +
    /// 0.08 · 500.
    #[test]
    fn the_target_keeps_a_share_of_generic_shapes() {
        let cat = Catalog::default();
        let g2 = cat.find("G2").unwrap();
        let c = Cluster::new(cat, vec![Node::uniform("one", 64_000, 1 << 20, g2, 1)]).unwrap();
        let l = Ledger::new(&c);
        let wl = Arc::new(TargetWorkload {
            pods: vec![pod(1, 1000, ModelSet::ALL, 1.0)],
        });
        let req = Request::share_milli(500, 1000, 0);
        let removed = |share: f64| {
            let params = TesseraParams {
                generic_share: share,
                share_quantum_scale: 0.0,
                quantum: 0.0,
                ..TesseraParams::default()
            };
            frag_removed(&Tessera::new(wl.clone(), &[], params), &c, &l, 0, &req)
        };
        assert!((removed(0.0) + 500.0).abs() < 1e-9);
        let want = 0.08 * 1000.0 - (0.64 * 500.0 + 0.08 * 500.0);
        let got = removed(0.4);
        assert!((got - want).abs() < 1e-9, "{got} against {want}");
        // The generic shapes sum to the share, the caller's to the rest.
        let mixed = with_generic(&wl, 0.4);
        let sum: f64 = mixed.pods.iter().map(|p| p.weight).sum();
        assert!((sum - 1.0).abs() < 1e-12);
        assert_eq!(with_generic(&wl, 0.0), *wl);
    }

    /// With the shapes' models ignored, a node's fragment change does not depend on
    /// its model: a half share on an idle T4 GPU and on an idle G2 GPU of otherwise
    /// equal nodes removes the same fragment (the T4-only whole-GPU shape loses the
    /// GPU's other half on both). Counting only the shapes a model allows, the G2
    /// node sees no change (the T4-only shape does not count there).
    #[test]
    fn fragment_ignores_the_shapes_models() {
        let cat = Catalog::default();
        let (t4, g2) = (cat.find("T4").unwrap(), cat.find("G2").unwrap());
        let c = Cluster::new(
            cat,
            vec![
                Node::uniform("t4", 64_000, 1 << 20, t4, 8),
                Node::uniform("g2", 64_000, 1 << 20, g2, 8),
            ],
        )
        .unwrap();
        let mut only_t4 = ModelSet(0);
        only_t4.insert(t4);
        let wl = Arc::new(TargetWorkload {
            pods: vec![pod(1, 1000, only_t4, 0.5), pod(1, 500, ModelSet::ALL, 0.5)],
        });
        let l = Ledger::new(&c);
        let req = Request::share_milli(500, 1000, 0);
        let removed = |models: ShapeModels, node: u32| {
            let params = TesseraParams {
                shape_models: models,
                generic_share: 0.0,
                ..TesseraParams::default()
            };
            // No supply: no pressure, the fragment alone.
            frag_removed(&Tessera::new(wl.clone(), &[], params), &c, &l, node, &req)
        };
        // 500 milli left for the whole-GPU shape of weight 0.5: 250 of fragment,
        // in bands of 0.285 · 500.
        let band = 0.285 * 500.0;
        let ignored = (
            removed(ShapeModels::Ignored, 0),
            removed(ShapeModels::Ignored, 1),
        );
        assert_eq!(ignored, (-2.0 * band, -2.0 * band));
        let accessible = (
            removed(ShapeModels::Accessible, 0),
            removed(ShapeModels::Accessible, 1),
        );
        assert_eq!(accessible, (-2.0 * band, 0.0));
        assert_eq!(g2, c.node(NodeId(1)).primary_model().unwrap());
    }

    #[test]
    fn unconstrained_pods_avoid_the_scarce_model() {
        let (c, wl, _, _) = setup();
        let l = Ledger::new(&c);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let req = Request::whole(1, 1000, 0);
        // Without the inventory the first node (a T4) wins the tie.
        let mut plain = Scheduler::new(Box::new(Tessera::new(
            Arc::new(wl.clone()),
            &[],
            TesseraParams::default(),
        )));
        match plain.decide(&c, &l, &req, &mut rng) {
            Decision::Place(p) => assert_eq!(c.node(p.node).name, "t4-a"),
            d => panic!("{d:?}"),
        }
        // With it, the pod goes to the first G2 node.
        let mut aware = Scheduler::new(Box::new(Tessera::new(
            Arc::new(wl),
            &super::super::gpus_per_model(&c),
            TesseraParams::default(),
        )));
        match aware.decide(&c, &l, &req, &mut rng) {
            Decision::Place(p) => assert_eq!(c.node(p.node).name, "g2-0"),
            d => panic!("{d:?}"),
        }
    }

    /// A CPU-only pod that would leave t4-a (32 cores, two idle GPUs) CPU for one more
    /// 1-core pod strands one of its GPUs: the counted measure sends it to t4-b, whose
    /// GPUs are used up; FGD's measure (CPU for one pod is enough) to t4-a, the first.
    #[test]
    fn cpu_only_pods_do_not_strand_gpus() {
        let (c, wl, _, _) = setup();
        let mut l = Ledger::new(&c);
        // Fill both GPUs of t4-b.
        l.apply(
            &c,
            &Placement {
                node: NodeId(1),
                grants: [GpuGrant::whole(0, 0), GpuGrant::whole(1, 0)]
                    .into_iter()
                    .collect(),
                ..Default::default()
            },
        )
        .unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for (cpu_counted, want) in [(true, "t4-b"), (false, "t4-a")] {
            let mut s = Scheduler::new(Box::new(Tessera::new(
                Arc::new(wl.clone()),
                &[],
                TesseraParams {
                    cpu_counted,
                    generic_share: 0.0,
                    ..TesseraParams::default()
                },
            )));
            match s.decide(&c, &l, &Request::cpu_only(31_000, 0), &mut rng) {
                Decision::Place(p) => assert_eq!(c.node(p.node).name, want, "{cpu_counted}"),
                d => panic!("{d:?}"),
            }
        }
    }

    /// The memo only saves work: one policy scoring many node states (equal ones, ones
    /// that differ only in CPU or GPU order) gives what a fresh policy gives each time.
    #[test]
    fn the_memo_never_changes_a_score() {
        let (c, wl, _, _) = setup();
        let mut l = Ledger::new(&c);
        // g2-0: a 700 share on GPU 0 and a whole GPU 3; g2-1: the same on GPUs 5 and 1,
        // g2-2: the same as g2-1 but 93 cores taken (CPU for three more pods); the rest idle.
        let place = |l: &mut Ledger, node: u32, share_gpu: u8, whole_gpu: u8, cpu: u64| {
            l.apply(
                &c,
                &Placement {
                    node: NodeId(node),
                    grants: [
                        GpuGrant::shared(share_gpu, 0, 700),
                        GpuGrant::whole(whole_gpu, 0),
                    ]
                    .into_iter()
                    .collect(),
                    cpu_milli: cpu,
                    ..Default::default()
                },
            )
            .unwrap();
        };
        place(&mut l, 2, 0, 3, 1000);
        place(&mut l, 3, 5, 1, 1000);
        place(&mut l, 4, 5, 1, 93_000);
        let wl = Arc::new(wl);
        let shared = Tessera::new(wl.clone(), &[], TesseraParams::default());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let reqs = [
            Request::share_milli(300, 1000, 0),
            Request::whole(1, 1000, 0),
            Request::whole(2, 1000, 0),
            Request::cpu_only(31_000, 0),
        ];
        for _ in 0..2 {
            for req in &reqs {
                for id in 0..c.nodes().len() {
                    let view = NodeView::of(&c, &l, NodeId(id as u32));
                    let Ok(fit) = crate::fit::check(view, req) else {
                        continue;
                    };
                    let fresh = Tessera::new(wl.clone(), &[], TesseraParams::default());
                    let a = shared.score(view, req, &fit, &mut rng).unwrap();
                    let b = fresh.score(view, req, &fit, &mut rng).unwrap();
                    assert_eq!(a.score, b.score, "node {id} {req:?}");
                    assert_eq!(a.gpus, b.gpus, "node {id} {req:?}");
                }
            }
        }
    }

    /// Fragment changes within one band tie, and the tie goes to the earlier node.
    #[test]
    fn bands_then_first_fit() {
        let (c, _, _, _) = setup();
        let mut l = Ledger::new(&c);
        // g2-1 has a 700-milli share on GPU 0; a 300 share there fills that GPU exactly.
        l.apply(
            &c,
            &Placement {
                node: NodeId(3),
                grants: [GpuGrant::shared(0, 0, 700)].into_iter().collect(),
                ..Default::default()
            },
        )
        .unwrap();
        let wl = TargetWorkload {
            pods: vec![pod(1, 500, ModelSet::ALL, 1.0)],
        };
        // The rule alone, without the generic shapes.
        let alone = TesseraParams {
            generic_share: 0.0,
            ..TesseraParams::default()
        };
        let t = Tessera::new(Arc::new(wl), &[], alone);
        let req = Request::share_milli(300, 0, 0);
        // g2-1: GPU 0 has 300 free (fragment for 500-pods: 300) → 0 after: +300 removed,
        // in bands of 0.285 · 300 = 85.5 for this share: 3 bands, 256.5. Idle g2-0:
        // 1000 → 700 fits a 500: 0 → 0, band 0.
        let s1 = scored(&t, &c, &l, 3, &req);
        assert_eq!(s1.gpus.as_slice(), &[0]);
        assert!((s1.score - 256.5).abs() < 1e-9, "{}", s1.score);
        assert_eq!(scored(&t, &c, &l, 2, &req).score, 0.0);
        // With fixed bands for shares (scale 0) the 300 removed is exactly 3 bands of 100.
        let fixed = Tessera::new(
            Arc::new(TargetWorkload {
                pods: vec![pod(1, 500, ModelSet::ALL, 1.0)],
            }),
            &[],
            TesseraParams {
                share_quantum_scale: 0.0,
                ..alone
            },
        );
        assert_eq!(scored(&fixed, &c, &l, 3, &req).score, 300.0);
    }

    /// What the Kubernetes scheduler does with the learned workload: after pods of a new
    /// shape arrive, a policy rebuilt from the target scores differently; a workload
    /// rebuilt from the same pods (after a restart) gives the same scores.
    #[test]
    fn learned_workload_moves_the_scores() {
        use crate::workload::{LearnConfig, LearnedWorkload, cold_start_prior};
        let (c, _, _, _) = setup();
        let l = Ledger::new(&c);
        // A 500-milli share on an idle G2 node leaves 500 on its GPU: fragment for every
        // shape asking more than 500 of one GPU.
        let req = Request::share_milli(500, 1000, 0);
        let supply = super::super::gpus_per_model(&c);
        let score = |wl: Arc<TargetWorkload>| {
            let t = Tessera::new(wl, &supply, TesseraParams::default());
            scored(&t, &c, &l, 2, &req).score
        };
        let config = LearnConfig::default();
        let mut learned = LearnedWorkload::cold_start(config);
        let before = score(learned.target());
        let new_shape = Request::share_milli(700, 1000, 0);
        let mut seen = Vec::new();
        let mut rebuilt = false;
        for _ in 0..500 {
            rebuilt |= learned.observe(&new_shape);
            seen.push(new_shape.clone());
        }
        assert!(rebuilt);
        // Now 700-milli shares are most of the workload (500 pods against a prior of
        // 256, of which 0.4 asked 1000): the 500 left behind is fragment for most pods.
        let after = score(learned.target());
        assert!(after < before - 100.0, "{before} → {after}");
        let restarted = LearnedWorkload::rebuild(&cold_start_prior(), config, &seen);
        assert_eq!(
            score(restarted.target()),
            score(Arc::new(learned.current()))
        );
    }
}
