//! The *dra* experiment: kube-scheduler's DRA allocation (first-fit devices, no
//! device scoring) against Tessera's device choice, on the fill protocol
//! ([`super::fill`]: seeded shuffle, inflation to 1.3 × capacity, pods never leave;
//! unallocated GPUs at arrived workload = 100 %).
//!
//! With Dynamic Resource Allocation (structured parameters GA in 1.34; consumable
//! capacity and partitionable devices beta in 1.36) kube-scheduler chooses the node
//! with its ordinary score plugins and its DRA allocator takes, on that node, the
//! first devices that fit in ResourceSlice order. Nothing scores devices, so the
//! fragmentation that GPU-aware scoring removed comes back. Three arms:
//!
//! - [`Arm::FirstFit`] — the stock scheduler ([`KubeDraFirstFit`]): node by
//!   `NodeResourcesFit` (LeastAllocated over CPU and memory) plus
//!   `NodeResourcesBalancedAllocation`, both integer scores of weight 1, among the
//!   nodes where the allocator finds devices; ties to a uniformly random node, drawn
//!   again at every decision; devices first-fit in GPU index order.
//! - [`Arm::Tessera`] — the `tessera` policy choosing node and devices, exactly as in
//!   the fill experiment.
//! - [`Arm::KubeNodeTesseraDevices`] — kube-scheduler's node choice, with Tessera
//!   choosing only the devices inside that node ([`KubeNodeDevicesBy`]): what a DRA
//!   allocator that scores devices could do without scoring nodes.
//!
//! The device model is the core's fit filter, which already matches DRA with
//! consumable capacity: a share takes compute and memory from one GPU that is not
//! held whole; a whole-GPU request needs GPUs nobody holds any part of (a device
//! with `allowMultipleAllocations` shares only with other shares); a k-GPU pod takes
//! k such GPUs. Every run is a [`run_fill_with`] run, so the metric, the arrival
//! order and the node permutation are the fill's for the same seed.

use rand::RngCore;
use serde::Serialize;
use tessera_core::fit::{Fit, GpuSet, NodeView};
use tessera_core::model::Cluster;
use tessera_core::placement::{ScoreTerm, Scored};
use tessera_core::policy::{self, Policy};
use tessera_core::request::Request;

use super::fill::{FillConfig, FillError, FillResult, Knowledge, run_fill_with};
use crate::grid::{FillSummary, GridError, Workload, summarise_fill};
use crate::trace::TracePod;

/// kube-scheduler's `MaxNodeScore`: every score plugin returns 0..=100.
pub const MAX_NODE_SCORE: u64 = 100;

/// One side of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    /// kube-scheduler with DRA: ordinary node scores, first-fit devices.
    FirstFit,
    /// Tessera choosing node and devices.
    Tessera,
    /// kube-scheduler's node, Tessera's devices inside it.
    KubeNodeTesseraDevices,
}

impl Arm {
    /// Every arm, the baseline first.
    pub const ALL: [Arm; 3] = [Arm::FirstFit, Arm::Tessera, Arm::KubeNodeTesseraDevices];

    /// The label in tables and in [`FillResult::policy`].
    pub fn label(self) -> &'static str {
        match self {
            Arm::FirstFit => "kube DRA first-fit",
            Arm::Tessera => "tessera",
            Arm::KubeNodeTesseraDevices => "kube node + tessera devices",
        }
    }
}

/// `NodeResourcesFit`'s LeastAllocated score of one resource (`leastRequestedScore`):
/// the free share after the pod, in whole points of [`MAX_NODE_SCORE`], rounded down;
/// 0 when the pod would overcommit it.
fn least_requested(requested: u64, capacity: u64) -> u64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

/// kube-scheduler's node score for `req` on the node in `view` under DRA, 0..=200:
/// `NodeResourcesFit` (LeastAllocated, CPU and memory weighted 1 each, integer mean)
/// plus `NodeResourcesBalancedAllocation` (`(1 − |f_cpu − f_mem| / 2) · 100`, rounded
/// down, f = requested share after the pod, capped at 1). Both plugins have weight 1
/// in the default profile; a resource with no capacity is skipped, as in both plugins.
/// GPUs claimed through DRA are not node resources, so neither plugin sees them; the
/// DRA plugin itself does not score nodes (see docs/simulator.md for this assumption).
pub fn kube_node_score(view: NodeView<'_>, req: &Request) -> u64 {
    let node = view.node;
    let after =
        |capacity: u64, free: u64, ask: u64| (capacity.saturating_sub(free) + ask, capacity);
    let resources = [
        after(node.cpu_milli, view.used.free_cpu_milli, req.cpu_milli),
        after(node.memory_mib, view.used.free_memory_mib, req.memory_mib),
    ];
    let counted: Vec<(u64, u64)> = resources.into_iter().filter(|&(_, c)| c > 0).collect();
    if counted.is_empty() {
        return 0;
    }
    let least = counted
        .iter()
        .map(|&(r, c)| least_requested(r, c))
        .sum::<u64>()
        / counted.len() as u64;
    let fractions: Vec<f64> = counted
        .iter()
        .map(|&(r, c)| (r as f64 / c as f64).min(1.0))
        .collect();
    let sd = match fractions.as_slice() {
        [a, b] => ((a - b) / 2.0).abs(),
        _ => 0.0,
    };
    let balanced = ((1.0 - sd) * MAX_NODE_SCORE as f64) as u64;
    least + balanced
}

/// The DRA allocator's devices: the first `need` usable GPUs in index order (the
/// order the driver publishes them in its ResourceSlice).
pub fn first_fit_devices(fit: &Fit) -> GpuSet {
    fit.usable.iter().copied().take(fit.need as usize).collect()
}

/// A uniform draw in [0, 1) added to an integer node score: the highest sum is the
/// highest integer score, and among equal integer scores each node wins with equal
/// probability — kube-scheduler's `selectHost`, drawn again at every decision.
fn tie_break(rng: &mut dyn RngCore) -> f64 {
    f64::from(rng.next_u32()) / (f64::from(u32::MAX) + 1.0)
}

/// The scored node: kube-scheduler's node score with its random tie-break, and `gpus`.
fn kube_scored(view: NodeView<'_>, req: &Request, gpus: GpuSet, rng: &mut dyn RngCore) -> Scored {
    let node_score = kube_node_score(view, req) as f64;
    Scored {
        score: node_score + tie_break(rng),
        gpus,
        terms: [ScoreTerm {
            name: "kube-node-score",
            value: node_score,
        }]
        .into_iter()
        .collect(),
    }
}

/// kube-scheduler with DRA: [`kube_node_score`] with random ties, first-fit devices.
pub struct KubeDraFirstFit;

impl Policy for KubeDraFirstFit {
    fn name(&self) -> &'static str {
        "kube-dra-first-fit"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        Some(kube_scored(view, req, first_fit_devices(fit), rng))
    }

    /// The tie-break draws from the RNG at every decision.
    fn cacheable(&self) -> bool {
        false
    }
}

/// kube-scheduler's node choice ([`kube_node_score`], random ties) with the devices
/// inside each node chosen by another policy (`devices`), as a DRA allocator that
/// scores devices but not nodes would. Where `devices` declines a node that the
/// filter passed, the allocator's first fit stands.
pub struct KubeNodeDevicesBy {
    devices: Box<dyn Policy>,
}

impl KubeNodeDevicesBy {
    pub fn new(devices: Box<dyn Policy>) -> KubeNodeDevicesBy {
        KubeNodeDevicesBy { devices }
    }
}

impl Policy for KubeNodeDevicesBy {
    fn name(&self) -> &'static str {
        "kube-node-devices-by"
    }

    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &Fit,
        rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        // With no more usable GPUs than needed there is nothing to choose.
        let gpus = if fit.usable.len() > fit.need as usize {
            self.devices
                .score(view, req, fit, rng)
                .map(|s| s.gpus)
                .filter(|g| g.len() == fit.need as usize)
                .unwrap_or_else(|| first_fit_devices(fit))
        } else {
            first_fit_devices(fit)
        };
        Some(kube_scored(view, req, gpus, rng))
    }

    fn cacheable(&self) -> bool {
        false
    }

    fn learns_workload(&self) -> bool {
        self.devices.learns_workload()
    }

    fn follows_supply(&self) -> bool {
        self.devices.follows_supply()
    }
}

/// One fill run of `arm` with `seed` (Tessera's policies know what `config.knowledge` says).
pub fn run_arm(
    cluster: &Cluster,
    pods: &[TracePod],
    arm: Arm,
    seed: u64,
    config: &FillConfig,
) -> Result<FillResult, FillError> {
    let label = arm.label();
    match arm {
        Arm::FirstFit => run_fill_with(
            cluster,
            pods,
            label,
            |_| Ok(Box::new(KubeDraFirstFit)),
            seed,
            config,
        ),
        Arm::Tessera => run_fill_with(
            cluster,
            pods,
            label,
            |args| policy::by_name("tessera", &args),
            seed,
            config,
        ),
        Arm::KubeNodeTesseraDevices => run_fill_with(
            cluster,
            pods,
            label,
            |args| {
                Ok(Box::new(KubeNodeDevicesBy::new(policy::by_name(
                    "tessera", &args,
                )?)))
            },
            seed,
            config,
        ),
    }
}

/// One arm over all seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmSummary {
    pub arm: Arm,
    pub label: &'static str,
    /// Unallocated GPU at arrived = 100 % over seeds (and the curve), as in the fill.
    pub summary: FillSummary,
    /// Unallocated GPU at arrived = 100 % per seed, in seed order.
    pub unallocated_pct_by_seed: Vec<f64>,
    /// `(first-fit − this arm) / first-fit × 100` on the mean unallocated GPUs.
    pub reduction_vs_first_fit_pct: f64,
    /// Seeds on which this arm left fewer GPUs unallocated than first-fit did.
    pub seeds_better_than_first_fit: usize,
}

/// The experiment on one workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DraReport {
    pub workload: String,
    pub seeds: Vec<u64>,
    pub capacity_gpus: f64,
    pub knowledge: Knowledge,
    /// In [`Arm::ALL`] order, first-fit first.
    pub arms: Vec<ArmSummary>,
}

/// Runs every arm of [`Arm::ALL`] on `workload` for `seeds` (in parallel with rayon,
/// collected in order, so the report does not depend on the thread count). `tick` is
/// called once per finished run.
pub fn run_dra(
    workload: &Workload,
    seeds: &[u64],
    knowledge: Knowledge,
    tick: &(dyn Fn() + Sync),
) -> Result<DraReport, GridError> {
    use rayon::prelude::*;
    let config = FillConfig {
        knowledge,
        ..FillConfig::for_workload(workload.name.clone())
    };
    let jobs: Vec<(Arm, u64)> = Arm::ALL
        .iter()
        .flat_map(|&a| seeds.iter().map(move |&s| (a, s)))
        .collect();
    let runs: Vec<FillResult> =
        jobs.par_iter()
            .map(|&(arm, seed)| {
                let r = run_arm(&workload.cluster, &workload.pods, arm, seed, &config).map_err(
                    |source| GridError::Fill {
                        workload: workload.name.clone(),
                        policy: arm.label().to_string(),
                        source,
                    },
                );
                tick();
                r
            })
            .collect::<Result<_, _>>()?;
    let per_seed = |runs: &[FillResult]| -> Vec<f64> {
        runs.iter()
            .map(|r| r.at_100.map_or(f64::NAN, |p| p.unallocated_pct))
            .collect()
    };
    let chunks: Vec<&[FillResult]> = runs.chunks(seeds.len().max(1)).collect();
    let baseline = chunks.first().map(|c| per_seed(c)).unwrap_or_default();
    let baseline_mean = chunks
        .first()
        .map_or(f64::NAN, |c| summarise_fill(c).unallocated_pct_mean);
    let arms = Arm::ALL
        .iter()
        .zip(&chunks)
        .map(|(&arm, c)| {
            let summary = summarise_fill(c);
            let by_seed = per_seed(c);
            ArmSummary {
                arm,
                label: arm.label(),
                reduction_vs_first_fit_pct: (baseline_mean - summary.unallocated_pct_mean)
                    / baseline_mean
                    * 100.0,
                seeds_better_than_first_fit: by_seed
                    .iter()
                    .zip(&baseline)
                    .filter(|(a, b)| a < b)
                    .count(),
                unallocated_pct_by_seed: by_seed,
                summary,
            }
        })
        .collect();
    Ok(DraReport {
        workload: workload.name.clone(),
        seeds: seeds.to_vec(),
        capacity_gpus: workload.cluster.gpu_count() as f64,
        knowledge,
        arms,
    })
}

/// The reports as a plain-text table: per workload and arm, unallocated GPU at
/// arrived = 100 % (mean ± sd over seeds, in % and in GPUs), failed pods, the
/// reduction against first-fit and on how many seeds the arm did better.
pub fn render_table(reports: &[DraReport]) -> String {
    let mut out = String::from(
        "workload      arm                           unalloc % (mean ± sd)   GPUs    failed   vs first-fit   seeds better\n",
    );
    for r in reports {
        for a in &r.arms {
            let s = &a.summary;
            let versus = if a.arm == Arm::FirstFit {
                "—".to_string()
            } else {
                format!("{:+.1} %", -a.reduction_vs_first_fit_pct)
            };
            let better = if a.arm == Arm::FirstFit {
                "—".to_string()
            } else {
                format!("{}/{}", a.seeds_better_than_first_fit, r.seeds.len())
            };
            out.push_str(&format!(
                "{:<13} {:<29} {:>6.2} ± {:<4.2}           {:>7.1} {:>8.1}   {:>12}   {:>12}\n",
                r.workload,
                a.label,
                s.unallocated_pct_mean,
                s.unallocated_pct_sd,
                s.unallocated_gpus_mean,
                s.pods_failed_mean,
                versus,
                better
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;
    use tessera_core::ledger::Ledger;
    use tessera_core::model::{Catalog, Node, NodeId};
    use tessera_core::scheduler::Scheduler;

    fn view<'a>(c: &'a Cluster, l: &'a Ledger, i: u32) -> NodeView<'a> {
        NodeView::of(c, l, NodeId(i))
    }

    fn one_node(cpu_milli: u64, memory_mib: u64, gpus: u32) -> Cluster {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        Cluster::new(
            cat,
            vec![Node::uniform("a", cpu_milli, memory_mib, t4, gpus)],
        )
        .unwrap()
    }

    /// Table test of the node score on an empty node of 10 CPUs and 1000 MiB.
    #[test]
    fn node_score_arithmetic() {
        let c = one_node(10_000, 1000, 2);
        let l = Ledger::new(&c);
        let cases = [
            // cpu 2/10 -> (10-2)·100/10 = 80; mem 500/1000 -> 50; least (80+50)/2 = 65;
            // balanced 1 − |0.2 − 0.5|/2 = 0.85 -> 85; total 150.
            (Request::whole(1, 2000, 500), 150),
            // cpu 3/10 -> 70; mem 333/1000 -> 66.7 -> 66; least 136/2 = 68;
            // balanced 1 − |0.3 − 0.333|/2 = 0.9835 -> 98; total 166.
            (Request::share_milli(500, 3000, 333), 166),
            // Nothing asked: 100 + 100 and perfectly balanced.
            (Request::cpu_only(0, 0), 200),
            // Over the CPU: LeastAllocated gives CPU 0 (mem 90 -> least 45); the share
            // is capped at 1: balanced 1 − |1 − 0.1|/2 = 0.55 -> 55; total 100.
            (Request::cpu_only(12_000, 100), 100),
        ];
        for (req, want) in cases {
            assert_eq!(kube_node_score(view(&c, &l, 0), &req), want, "{req:?}");
        }
    }

    /// The allocator's first fit puts a share on the lowest-index GPU with room, even
    /// when a fuller GPU would fit it exactly; a whole GPU skips every touched one.
    #[test]
    fn devices_are_first_fit_in_index_order() {
        let c = one_node(32_000, 64_000, 4);
        let mut l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(KubeDraFirstFit));
        let mut rng = SmallRng::seed_from_u64(1);
        let mut place = |l: &mut Ledger, req: Request| {
            let p = s.place(&c, l, &req, &mut rng).expect("fits");
            let gpus: Vec<u8> = p.grants.iter().map(|g| g.gpu).collect();
            l.apply(&c, &p).unwrap();
            gpus
        };
        // 0.5 -> GPU 0; 0.7 does not fit GPU 0 (0.5 left) -> GPU 1 (0.3 left).
        assert_eq!(place(&mut l, Request::share_milli(500, 1000, 1000)), [0]);
        assert_eq!(place(&mut l, Request::share_milli(700, 1000, 1000)), [1]);
        // 0.3 fits GPU 1 exactly, but GPU 0 comes first.
        assert_eq!(place(&mut l, Request::share_milli(300, 1000, 1000)), [0]);
        // Two whole GPUs: GPUs 0 and 1 are touched, 2 and 3 are not.
        assert_eq!(place(&mut l, Request::whole(2, 1000, 1000)), [2, 3]);
    }

    /// Equal nodes tie; the tie goes to a random node at every decision, so over 200
    /// decisions on 4 empty identical nodes each is chosen (a fixed tie-break, such
    /// as the scheduler's "earlier node", would pick node 0 every time).
    #[test]
    fn ties_go_to_a_random_node_each_decision() {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let nodes = (0..4)
            .map(|i| Node::uniform(format!("n{i}"), 8000, 8000, t4, 2))
            .collect();
        let c = Cluster::new(cat, nodes).unwrap();
        let l = Ledger::new(&c);
        let mut s = Scheduler::new(Box::new(KubeDraFirstFit));
        let mut rng = SmallRng::seed_from_u64(7);
        let mut seen = [0u32; 4];
        for _ in 0..200 {
            let p = s
                .place(&c, &l, &Request::share_milli(100, 100, 100), &mut rng)
                .unwrap();
            seen[p.node.0 as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
        // A strictly better node is never lost to the tie-break: use node 2 so that
        // LeastAllocated ranks the others higher.
        let mut l = l;
        let p = s
            .place_within(
                &c,
                &l,
                &Request::cpu_only(4000, 4000),
                &[NodeId(2)],
                &mut rng,
            )
            .unwrap();
        l.apply(&c, &p).unwrap();
        for _ in 0..50 {
            let p = s
                .place(&c, &l, &Request::share_milli(100, 100, 100), &mut rng)
                .unwrap();
            assert_ne!(p.node, NodeId(2));
        }
    }

    /// The devices-only arm keeps kube's node but takes Tessera's devices: on one node
    /// the same 0.3 share goes to GPU 1 (0.3 left, fits exactly) and not GPU 0.
    #[test]
    fn devices_by_another_policy_inside_the_kube_node() {
        let c = one_node(32_000, 64_000, 2);
        let mut l = Ledger::new(&c);
        let mut ff = Scheduler::new(Box::new(KubeDraFirstFit));
        let mut rng = SmallRng::seed_from_u64(1);
        for m in [500, 700] {
            let p = ff
                .place(&c, &l, &Request::share_milli(m, 1000, 1000), &mut rng)
                .unwrap();
            l.apply(&c, &p).unwrap();
        }
        let args = tessera_core::policy::PolicyArgs::for_ledger(
            std::sync::Arc::new(tessera_core::frag::TargetWorkload::builtin()),
            &l,
        );
        let tessera = policy::by_name("tessera", &args).unwrap();
        let mut s = Scheduler::new(Box::new(KubeNodeDevicesBy::new(tessera)));
        let p = s
            .place(&c, &l, &Request::share_milli(300, 1000, 1000), &mut rng)
            .unwrap();
        assert_eq!(p.grants[0].gpu, 1);
    }
}
