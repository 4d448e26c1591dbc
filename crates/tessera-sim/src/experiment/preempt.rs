//! The *preempt* experiment: high-priority pods arrive into a full cluster of
//! shared GPUs; Tessera's device-aware planner ([`tessera_core::queue::preempt`])
//! against a baseline that preempts the way kube-scheduler does, blind to GPUs.
//!
//! **The full cluster.** The workload's GPU shares and CPU-only pods
//! ([`FillPods::Shares`], the default: every GPU ends shared by several pods; or
//! every pod with [`FillPods::All`]) are put in the fill experiment's seeded order
//! ([`fill::arrival_order`], inflated to 1.3 × the GPU capacity) and each is placed
//! once by the placement policy (`tessera`) or skipped, so the cluster ends as full
//! as that policy packs it. Every pod placed gets, from the seeded RNG, a low
//! priority (0, 1 or 2), a start time uniform in `[0, fill_span_s)`, and is
//! preemptible except with probability `non_preemptible_permille` / 1000. No
//! disruption budgets (the core's tests cover those).
//!
//! **The arrivals.** `arrivals` pods drawn with replacement (seeded) from the
//! workload's GPU pods (shares, whole and multi-GPU, in the trace's mix), priority
//! [`PREEMPTOR_PRIORITY`], arriving every `arrival_interval_s` after the fill span.
//! Each policy starts from the same full cluster and sees the same arrivals. A pod
//! that fits is placed without preemption; otherwise the policy preempts:
//!
//! - **tessera**: one plan from the core planner; its victims are evicted and the
//!   pod takes the plan's placement.
//! - **kube-like**: kube-scheduler's `selectVictimsOnNode` over resource *totals*:
//!   on each node, remove every lower-priority preemptible pod, check that the
//!   node's free totals (GPU compute summed over its GPUs, GPU memory summed, CPU,
//!   memory) cover the request, then reprieve pods most important first (higher
//!   priority, then earlier start) while the totals still cover it; the rest are
//!   victims. Nodes whose totals already cover the request are not candidates (the
//!   totals say it fits there: nothing to preempt). The node is chosen as
//!   `pickOneNodeForPreemption` does (`tessera_core::queue::victims::Rank`, the
//!   rule Tessera's own paths rank by): lowest highest-victim priority, then
//!   lowest priority sum, then fewest victims, then latest start, then node order. After the evictions the pod
//!   is tried on that node, then anywhere; if it still fits nowhere, kube-scheduler
//!   preempts again in its next cycle: up to `kube_rounds` rounds per arrival.
//!
//! **Useless evictions.** Once a policy is done with an arrival, each of its
//! victims is checked: the eviction was useless if the pod did not land on the
//! victim's node, or if the pod's placement would have been accepted with that
//! victim still there (its GPUs, CPU and memory were not needed).
//!
//! GPU time lost is each victim's GPU compute held (milli-GPU) × the time it had
//! run, in GPU-seconds.

use std::fmt::Write as _;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use serde::Serialize;
use tessera_core::Scheduler;
use tessera_core::fit::NodeView;
use tessera_core::judge::judge;
use tessera_core::ledger::{AllocId, Ledger, LedgerError};
use tessera_core::model::{Cluster, Health, NodeId};
use tessera_core::placement::Placement;
use tessera_core::policy::{Policy, UnknownPolicy};
use tessera_core::queue::preempt::{self, Context};
use tessera_core::queue::victims::{self, Rank, Standing};
use tessera_core::queue::{Budgets, PodMeta, Running};
use tessera_core::request::{GpuAsk, Request};

use super::fill::{self, FillConfig, typical_pods};
use super::learner::Learner;
use crate::trace::TracePod;

/// Priority of the arriving pods (the fill's pods have 0, 1 or 2).
pub const PREEMPTOR_PRIORITY: i32 = 100;

/// How a preempt run is set up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreemptConfig {
    pub workload: String,
    /// Placement policy of both sides (`tessera`).
    pub policy: String,
    /// High-priority arrivals.
    pub arrivals: usize,
    /// The fill's pod list, as a multiple of the GPU capacity (1.3).
    pub tune_ratio: f64,
    /// Fill pods start uniformly in `[0, fill_span_s)`; arrivals come after it.
    pub fill_span_s: u64,
    pub arrival_interval_s: u64,
    /// Pods younger than this are not evicted (both sides).
    pub min_runtime_s: u64,
    /// Fill pods that are not preemptible, per mille.
    pub non_preemptible_permille: u32,
    /// Preemption rounds the kube-like baseline may take per arrival.
    pub kube_rounds: u32,
    /// Which of the workload's pods fill the cluster.
    pub fill: FillPods,
}

/// The pods the fill draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FillPods {
    /// Every pod of the workload, in its own mix.
    All,
    /// GPU shares and CPU-only pods: every GPU ends shared by several pods.
    Shares,
}

impl Default for PreemptConfig {
    fn default() -> Self {
        PreemptConfig {
            workload: String::new(),
            policy: "tessera".into(),
            arrivals: 100,
            tune_ratio: 1.3,
            fill_span_s: 86_400,
            arrival_interval_s: 60,
            min_runtime_s: 600,
            non_preemptible_permille: 100,
            kube_rounds: 10,
            fill: FillPods::Shares,
        }
    }
}

/// What one preemption policy did with the arrivals.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PolicyOutcome {
    pub policy: String,
    pub arrivals: usize,
    /// Fitted without evicting anybody.
    pub placed_directly: usize,
    /// Placed after evicting pods.
    pub placed_after_preemption: usize,
    /// Still pending at the end (with or without evictions made for them).
    pub unplaced: usize,
    /// Pods evicted.
    pub victims: usize,
    /// GPU-seconds the victims had run (lost if they restart).
    pub gpu_seconds_lost: f64,
    /// Evictions that did not let their preemptor run on that node or were not needed.
    pub useless_evictions: usize,
}

/// One preempt run: the fill and both policies on the same arrivals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreemptResult {
    pub workload: String,
    pub seed: u64,
    /// Fill pods placed, and the GPU allocation they reach (% of compute).
    pub fill_pods: usize,
    pub fill_alloc_pct: f64,
    pub tessera: PolicyOutcome,
    pub kube_like: PolicyOutcome,
}

/// A preempt run that could not start (or a bug the ledger caught).
#[derive(Debug, thiserror::Error)]
pub enum PreemptError {
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
    #[error("the cluster has no GPUs")]
    NoGpus,
    #[error("the workload has no GPU pods to draw arrivals from")]
    NoGpuPods,
    /// A placement or release the ledger refused: a bug, never a normal outcome.
    #[error("ledger refused a change during {during}: {source}")]
    Ledger {
        during: &'static str,
        #[source]
        source: LedgerError,
    },
}

fn ledger_err(during: &'static str) -> impl Fn(LedgerError) -> PreemptError {
    move |source| PreemptError::Ledger { during, source }
}

/// The cluster, its ledger and who runs on it.
#[derive(Clone)]
struct State {
    ledger: Ledger,
    running: FxHashMap<AllocId, Running>,
}

/// The full cluster and the arrivals of one seed, before either policy runs.
#[derive(Clone)]
pub struct Setup {
    pub ledger: Ledger,
    /// The fill's pods, by allocation.
    pub running: FxHashMap<AllocId, Running>,
    /// Arrival time and request of each high-priority pod, in order.
    pub arrivals: Vec<(u64, Request)>,
    /// GPU compute allocated after the fill, % of capacity.
    pub fill_alloc_pct: f64,
    /// The placement policy as the fill left it (what it learned of the workload).
    pub(crate) learner: Learner,
}

/// Fills the cluster and draws the arrivals (see the module docs) from `seed`.
pub fn setup(
    cluster: &Cluster,
    pods: &[TracePod],
    seed: u64,
    config: &PreemptConfig,
) -> Result<Setup, PreemptError> {
    let capacity = cluster.gpu_count() as u64 * 1000;
    if capacity == 0 {
        return Err(PreemptError::NoGpus);
    }
    let gpu_pods: Vec<&Request> = pods
        .iter()
        .map(|p| &p.request)
        .filter(|r| r.gpu.gpu_count() > 0)
        .collect();
    if gpu_pods.is_empty() {
        return Err(PreemptError::NoGpuPods);
    }
    let workload = Arc::new(typical_pods(pods, 0.95));
    let mut rng = SmallRng::seed_from_u64(seed);
    let fill_config = FillConfig {
        tune_ratio: config.tune_ratio,
        ..FillConfig::default()
    };
    let fill_pods: Vec<TracePod> = pods
        .iter()
        .filter(|p| match config.fill {
            FillPods::All => true,
            FillPods::Shares => p.request.gpu.milli_per_gpu() < 1000,
        })
        .cloned()
        .collect();
    let order = fill::arrival_order(&fill_pods, capacity, &fill_config, &mut rng);
    let mut learner = Learner::start(cluster, &config.policy, workload)?;
    let mut scheduler = Scheduler::new(learner.policy()?);
    let mut ledger = Ledger::new(cluster);
    let mut running = FxHashMap::default();
    for &i in &order {
        if learner.observe(&fill_pods[i].request, &ledger) {
            scheduler = Scheduler::new(learner.policy()?);
        }
        let Some(p) = scheduler.place(cluster, &ledger, &fill_pods[i].request, &mut rng) else {
            continue;
        };
        let alloc = ledger.apply(cluster, &p).map_err(ledger_err("the fill"))?;
        let meta = PodMeta {
            priority: rng.random_range(0..3),
            preemptible: rng.random_range(0..1000) >= config.non_preemptible_permille,
            ..PodMeta::default()
        };
        let started_s = rng.random_range(0..config.fill_span_s.max(1));
        running.insert(
            alloc,
            Running {
                alloc,
                meta,
                started_s,
            },
        );
    }
    let fill_alloc_pct = ledger.used_milli() as f64 / capacity as f64 * 100.0;
    let arrivals: Vec<(u64, Request)> = (0..config.arrivals)
        .map(|k| {
            let t = config.fill_span_s + k as u64 * config.arrival_interval_s;
            (t, gpu_pods[rng.random_range(0..gpu_pods.len())].clone())
        })
        .collect();
    Ok(Setup {
        ledger,
        running,
        arrivals,
        fill_alloc_pct,
        learner,
    })
}

/// Runs the experiment for one seed: both policies from the same [`setup`].
pub fn run_preempt(
    cluster: &Cluster,
    pods: &[TracePod],
    seed: u64,
    config: &PreemptConfig,
) -> Result<PreemptResult, PreemptError> {
    let s = setup(cluster, pods, seed, config)?;
    let state = State {
        ledger: s.ledger,
        running: s.running,
    };
    let fill_pods = state.running.len();
    let tessera = run_policy(
        cluster,
        state.clone(),
        &s.arrivals,
        s.learner.clone(),
        config,
        Side::Tessera,
        seed,
    )?;
    let kube_like = run_policy(
        cluster,
        state,
        &s.arrivals,
        s.learner,
        config,
        Side::KubeLike,
        seed,
    )?;
    Ok(PreemptResult {
        workload: config.workload.clone(),
        seed,
        fill_pods,
        fill_alloc_pct: s.fill_alloc_pct,
        tessera,
        kube_like,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Tessera,
    KubeLike,
}

/// One arrival's evictions: each victim's placement and what it had run.
struct Evicted {
    placement: Placement,
    gpu_milli_seconds: u64,
}

fn run_policy(
    cluster: &Cluster,
    mut state: State,
    arrivals: &[(u64, Request)],
    mut learner: Learner,
    config: &PreemptConfig,
    side: Side,
    seed: u64,
) -> Result<PolicyOutcome, PreemptError> {
    let mut scheduler = Scheduler::new(learner.policy()?);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let budgets = Budgets::new();
    let mut out = PolicyOutcome {
        policy: match side {
            Side::Tessera => "tessera",
            Side::KubeLike => "kube-like",
        }
        .into(),
        arrivals: arrivals.len(),
        ..PolicyOutcome::default()
    };
    let preemptor = PodMeta {
        priority: PREEMPTOR_PRIORITY,
        preemptible: false,
        ..PodMeta::default()
    };
    let mut lost_milli_s = 0u64;
    for (now_s, req) in arrivals {
        if learner.observe(req, &state.ledger) {
            scheduler = Scheduler::new(learner.policy()?);
        }
        if let Some(p) = scheduler.place(cluster, &state.ledger, req, &mut rng) {
            start(cluster, &mut state, &p, preemptor, *now_s)?;
            out.placed_directly += 1;
            continue;
        }
        let mut evicted: Vec<Evicted> = Vec::new();
        let placed: Option<Placement> = match side {
            Side::Tessera => {
                let ctx = Context {
                    cluster,
                    ledger: &state.ledger,
                    running: &state.running,
                    budgets: &budgets,
                    now_s: *now_s,
                    min_runtime_s: config.min_runtime_s,
                };
                match preempt::plan(&mut scheduler, &ctx, req, &preemptor, &|_| true) {
                    Some(plan) => {
                        for v in &plan.victims {
                            evicted.push(evict(&mut state, *v, *now_s)?);
                        }
                        Some(plan.placement)
                    }
                    None => None,
                }
            }
            Side::KubeLike => {
                let mut placed = None;
                for _ in 0..config.kube_rounds {
                    let Some((node, victims)) =
                        kube_like_victims(cluster, &state, req, *now_s, config.min_runtime_s)
                    else {
                        break;
                    };
                    for v in victims {
                        evicted.push(evict(&mut state, v, *now_s)?);
                    }
                    // The nominated node first, then anywhere.
                    placed = place_on(
                        cluster,
                        &state.ledger,
                        scheduler.policy(),
                        req,
                        node,
                        &mut rng,
                    )
                    .or_else(|| scheduler.place(cluster, &state.ledger, req, &mut rng));
                    if placed.is_some() {
                        break;
                    }
                }
                placed
            }
        };
        out.victims += evicted.len();
        lost_milli_s += evicted.iter().map(|e| e.gpu_milli_seconds).sum::<u64>();
        out.useless_evictions += useless(cluster, &state.ledger, &evicted, placed.as_ref());
        match placed {
            Some(p) => {
                start(cluster, &mut state, &p, preemptor, *now_s)?;
                if evicted.is_empty() {
                    out.placed_directly += 1;
                } else {
                    out.placed_after_preemption += 1;
                }
            }
            None => out.unplaced += 1,
        }
    }
    out.gpu_seconds_lost = lost_milli_s as f64 / 1000.0;
    Ok(out)
}

fn start(
    cluster: &Cluster,
    state: &mut State,
    p: &Placement,
    meta: PodMeta,
    now_s: u64,
) -> Result<(), PreemptError> {
    let alloc = state
        .ledger
        .apply(cluster, p)
        .map_err(ledger_err("a preemptor's start"))?;
    state.running.insert(
        alloc,
        Running {
            alloc,
            meta,
            started_s: now_s,
        },
    );
    Ok(())
}

fn evict(state: &mut State, victim: AllocId, now_s: u64) -> Result<Evicted, PreemptError> {
    let placement = state
        .ledger
        .release(victim)
        .map_err(ledger_err("an eviction"))?;
    let started_s = state.running.remove(&victim).map_or(now_s, |r| r.started_s);
    let held: u64 = placement
        .grants
        .iter()
        .map(|g| u64::from(g.cores_milli))
        .sum();
    Ok(Evicted {
        placement,
        gpu_milli_seconds: held * now_s.saturating_sub(started_s),
    })
}

/// Evictions that did not help: the preemptor is not on the victim's node, or its
/// placement is accepted with the victim back in place. `ledger` is the state after
/// the evictions, before the preemptor starts.
fn useless(
    cluster: &Cluster,
    ledger: &Ledger,
    evicted: &[Evicted],
    placed: Option<&Placement>,
) -> usize {
    let Some(p) = placed else {
        return evicted.len();
    };
    let mut trial = ledger.clone();
    evicted
        .iter()
        .filter(|e| {
            if e.placement.node != p.node {
                return true;
            }
            let cp = trial.checkpoint();
            let not_needed =
                trial.apply(cluster, &e.placement).is_ok() && trial.apply(cluster, p).is_ok();
            let _ = trial.rollback(cluster, cp);
            not_needed
        })
        .count()
}

/// The policy's placement of `req` on one node, if it fits there.
fn place_on(
    cluster: &Cluster,
    ledger: &Ledger,
    policy: &dyn Policy,
    req: &Request,
    node: NodeId,
    rng: &mut SmallRng,
) -> Option<Placement> {
    let view = NodeView::of(cluster, ledger, node);
    let scored = judge(policy, view, req, rng).ok()?;
    Some(Placement::of(view, req, node, scored))
}

/// A node's free resources as kube-scheduler sees them: sums, not devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Totals {
    gpu_milli: u64,
    gpu_memory_mib: u64,
    cpu_milli: u64,
    memory_mib: u64,
}

impl Totals {
    fn covers(&self, need: &Totals) -> bool {
        self.gpu_milli >= need.gpu_milli
            && self.gpu_memory_mib >= need.gpu_memory_mib
            && self.cpu_milli >= need.cpu_milli
            && self.memory_mib >= need.memory_mib
    }
    fn add(&mut self, p: &Placement) {
        self.gpu_milli += p
            .grants
            .iter()
            .map(|g| u64::from(g.cores_milli))
            .sum::<u64>();
        self.gpu_memory_mib += p.grants.iter().map(|g| g.memory_mib).sum::<u64>();
        self.cpu_milli += p.cpu_milli;
        self.memory_mib += p.memory_mib;
    }
}

/// kube-scheduler's preemption over totals (see the module docs): the node and its
/// victims, or `None` when no node's totals can be made to cover the request.
fn kube_like_victims(
    cluster: &Cluster,
    state: &State,
    req: &Request,
    now_s: u64,
    min_runtime_s: u64,
) -> Option<(NodeId, Vec<AllocId>)> {
    let mut by_node: FxHashMap<NodeId, Vec<(&Running, &Placement)>> = FxHashMap::default();
    for r in state.running.values() {
        if !victims::may_go(
            standing(r),
            r.meta.preemptible,
            PREEMPTOR_PRIORITY,
            now_s,
            min_runtime_s,
        ) {
            continue;
        }
        if let Some(p) = state.ledger.allocation(r.alloc) {
            by_node.entry(p.node).or_default().push((r, p));
        }
    }
    // `pickOneNodeForPreemption` by the core's one rule ([`victims::pick_node`]).
    let mut plans = Vec::new();
    for (node, mut pods) in by_node {
        let n = cluster.node(node);
        let used = state.ledger.node(node);
        let mut free = Totals {
            cpu_milli: used.free_cpu_milli,
            memory_mib: used.free_memory_mib,
            ..Totals::default()
        };
        let mut gpu_mib = 0;
        for (g, gu) in n.gpus.iter().zip(&used.gpus) {
            if g.health == Health::Healthy && !g.mig_enabled {
                free.gpu_milli += u64::from(gu.free_cores_milli);
                free.gpu_memory_mib += gu.free_memory_mib;
                gpu_mib = gpu_mib.max(cluster.catalog.spec(g.model).memory_mib);
            }
        }
        let count = u64::from(req.gpu.gpu_count());
        let need = Totals {
            gpu_milli: count * u64::from(req.gpu.milli_per_gpu()),
            gpu_memory_mib: count
                * match &req.gpu {
                    GpuAsk::Shared { memory, .. } => memory.resolve(gpu_mib),
                    _ => gpu_mib,
                },
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
        };
        // kube-scheduler's SelectVictimsOnNode over the totals, by the core's
        // one rule (no budgets here). A node whose totals already cover the
        // pod is no candidate: nothing to preempt there.
        pods.sort_by_key(|(r, _)| r.alloc);
        let candidates: Vec<victims::OnNode<()>> = pods
            .iter()
            .map(|(r, _)| victims::OnNode {
                standing: standing(r),
                budget: None,
            })
            .collect();
        let mut covers = |set: &[usize]| {
            let mut left = free;
            for &i in set {
                left.add(pods[i].1);
            }
            left.covers(&need)
        };
        let kept = match victims::select_on_node(&candidates, &|_| 0, &mut covers) {
            Some(kept) if !kept.is_empty() => kept,
            _ => continue,
        };
        let rank = Rank::of(kept.iter().map(|&i| standing(pods[i].0)));
        let mut ids: Vec<AllocId> = kept.iter().map(|&i| pods[i].0.alloc).collect();
        ids.sort_unstable();
        plans.push((node, rank, ids));
    }
    victims::pick_node(plans)
}

/// How a running pod ranks as a victim.
fn standing(r: &Running) -> Standing {
    Standing {
        priority: r.meta.priority,
        started_s: r.started_s,
    }
}

/// Runs seeds in parallel (rayon); results in seed order.
pub fn run_preempt_seeds(
    cluster: &Cluster,
    pods: &[TracePod],
    seeds: &[u64],
    config: &PreemptConfig,
) -> Result<Vec<PreemptResult>, PreemptError> {
    use rayon::prelude::*;
    seeds
        .par_iter()
        .map(|&s| run_preempt(cluster, pods, s, config))
        .collect()
}

/// Both policies summed over runs, with Tessera / baseline ratios.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreemptSummary {
    pub runs: usize,
    pub tessera: PolicyOutcome,
    pub kube_like: PolicyOutcome,
    /// Tessera's victims ÷ the baseline's (`None` when the baseline evicted nobody).
    pub victims_ratio: Option<f64>,
    pub gpu_seconds_ratio: Option<f64>,
}

fn sum(outcomes: impl Iterator<Item = PolicyOutcome>) -> PolicyOutcome {
    outcomes.fold(PolicyOutcome::default(), |mut a, o| {
        a.policy = o.policy;
        a.arrivals += o.arrivals;
        a.placed_directly += o.placed_directly;
        a.placed_after_preemption += o.placed_after_preemption;
        a.unplaced += o.unplaced;
        a.victims += o.victims;
        a.gpu_seconds_lost += o.gpu_seconds_lost;
        a.useless_evictions += o.useless_evictions;
        a
    })
}

pub fn summarise(results: &[PreemptResult]) -> PreemptSummary {
    let tessera = sum(results.iter().map(|r| r.tessera.clone()));
    let kube_like = sum(results.iter().map(|r| r.kube_like.clone()));
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    PreemptSummary {
        runs: results.len(),
        victims_ratio: ratio(tessera.victims as f64, kube_like.victims as f64),
        gpu_seconds_ratio: ratio(tessera.gpu_seconds_lost, kube_like.gpu_seconds_lost),
        tessera,
        kube_like,
    }
}

/// The summary as a terminal table.
pub fn render_table(s: &PreemptSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10} {:>14} {:>8}",
        "policy",
        "arrivals",
        "direct",
        "preempted",
        "pending",
        "victims",
        "per placed",
        "GPU-s lost",
        "useless"
    );
    for o in [&s.tessera, &s.kube_like] {
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10} {:>14.0} {:>8}",
            o.policy,
            o.arrivals,
            o.placed_directly,
            o.placed_after_preemption,
            o.unplaced,
            o.victims,
            // Victims per pod placed after preempting.
            if o.placed_after_preemption == 0 {
                "n/a".to_string()
            } else {
                format!("{:.2}", o.victims as f64 / o.placed_after_preemption as f64)
            },
            o.gpu_seconds_lost,
            o.useless_evictions
        );
    }
    let show = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.3}"));
    let _ = writeln!(
        out,
        "tessera / kube-like: victims {}, GPU-seconds lost {} ({} run(s))",
        show(s.victims_ratio),
        show(s.gpu_seconds_ratio),
        s.runs
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload;

    fn small() -> (Cluster, Vec<TracePod>) {
        let s = workload::generate(7);
        (s.cluster, s.pods)
    }

    #[test]
    fn same_seed_same_result_and_counts_add_up() {
        let (c, p) = small();
        let config = PreemptConfig {
            arrivals: 20,
            ..PreemptConfig::default()
        };
        let a = run_preempt(&c, &p, 42, &config).unwrap();
        let b = run_preempt(&c, &p, 42, &config).unwrap();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        for o in [&a.tessera, &a.kube_like] {
            assert_eq!(
                o.placed_directly + o.placed_after_preemption + o.unplaced,
                o.arrivals,
                "{}",
                o.policy
            );
            assert!(o.useless_evictions <= o.victims);
        }
        assert!(
            a.fill_alloc_pct > 50.0,
            "the fill fills: {}",
            a.fill_alloc_pct
        );
    }

    #[test]
    fn no_gpu_pods_is_an_error() {
        let (c, _) = small();
        let cpu = vec![TracePod {
            name: "cpu".into(),
            request: Request::cpu_only(1000, 1000),
            creation_s: None,
            deletion_s: None,
            scheduled_s: None,
        }];
        assert!(matches!(
            run_preempt(&c, &cpu, 1, &PreemptConfig::default()),
            Err(PreemptError::NoGpuPods)
        ));
    }
}
