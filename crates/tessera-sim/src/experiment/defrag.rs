//! The *defrag* experiment: how many moves free a whole 8-GPU node.
//!
//! Start from a fragmented state of the fill experiment ([`fill_until`]: the
//! same arrival order, node permutation and policy as the fill with that seed,
//! stopped when [`DefragConfig::fill_pct`] % of the GPU capacity has arrived).
//! Then an 8-GPU pod is pending, again and again:
//!
//! 1. while one fits as things are (a node already has 8 idle GPUs), it is placed
//!    without moves (counted as `direct`);
//! 2. after that, each round asks [`defrag::plan`] for moves that make it fit,
//!    executes the plan on the ledger (evicted pods re-created where the plan
//!    says, as new pods that later rounds may move again), and places the pod.
//!
//! Rounds stop when no allowed moves make the pod fit or after
//! [`DefragConfig::max_rounds`]. The figure is **N = moves per whole node freed**
//! (moves / rounds that placed the pod).
//!
//! Pods are disturbed as Kubernetes would let them (seeded, per pod, documented
//! here): [`DefragConfig::pinned_pct`] % carry the do-not-disturb annotation,
//! [`DefragConfig::fixed_pct`] % are not preemptible, and half of the rest count
//! against one of [`DefragConfig::budgets`] PodDisruptionBudgets that each allow
//! [`DefragConfig::disruptions_allowed`] disruptions per round (a budget's
//! allowance comes back once the re-created pods are ready, i.e. by the next
//! round). The experiment counts moves of pinned or non-preemptible pods and
//! budget overdraws independently of the planner; they must be zero.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use serde::Serialize;
use tessera_core::ledger::{AllocId, LedgerError};
use tessera_core::model::Cluster;
use tessera_core::queue::defrag::{self, Context, DefragError, Limits};
use tessera_core::queue::{BudgetId, Budgets, PodMeta, Running};
use tessera_core::request::Request;
use tessera_core::{Ledger, Scheduler};

use super::fill::{FillConfig, FillError, fill_policy};
use super::snapshot::fill_until;
use crate::trace::TracePod;

/// How the experiment is set up. [`Default`] is the documented one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DefragConfig {
    /// Share of the GPU capacity that has arrived when the fill stops (%).
    pub fill_pct: f64,
    /// GPUs of the pending pod (whole GPUs).
    pub pending_gpus: u32,
    pub max_rounds: usize,
    pub pinned_pct: u32,
    pub fixed_pct: u32,
    pub budgets: u32,
    pub disruptions_allowed: u32,
    /// Most evictions for one pending pod.
    pub max_moves_per_pod: usize,
}

impl Default for DefragConfig {
    fn default() -> Self {
        DefragConfig {
            fill_pct: 70.0,
            pending_gpus: 8,
            max_rounds: 30,
            pinned_pct: 5,
            fixed_pct: 5,
            budgets: 20,
            disruptions_allowed: 2,
            max_moves_per_pod: 16,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DefragResult {
    pub policy: String,
    pub seed: u64,
    /// GPUs allocated / GPUs, when the fill stopped (%).
    pub allocated_pct: f64,
    /// Nodes with at least `pending_gpus` GPUs, and those with every GPU idle, at the start.
    pub big_nodes: usize,
    pub big_nodes_idle: usize,
    /// Pending pods placed without moves (on nodes idle already).
    pub direct: usize,
    /// Rounds whose plan placed the pod (each one a whole node freed by moves).
    pub nodes_freed: usize,
    pub moves: usize,
    /// Moves per node freed (N); `None` when no node was freed.
    pub moves_per_node: Option<f64>,
    /// Moves in each successful round.
    pub moves_by_round: Vec<usize>,
    /// Moves of pinned or non-preemptible pods, and budgets overdrawn in a round
    /// (must be 0; counted here, not by the planner).
    pub protected_moved: usize,
    pub budget_overdraws: usize,
    /// Why the rounds stopped.
    pub stopped: String,
}

/// Why a run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum DefragSimError {
    #[error(transparent)]
    Fill(#[from] FillError),
    #[error(transparent)]
    Plan(#[from] DefragError),
    /// A verified plan the ledger refused: a bug.
    #[error("plan refused by the ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// A fill snapshot made ready for planning: who may be disturbed, what each
/// pod asked for, the budgets, and a scheduler with the fill's policy.
pub struct World {
    pub cluster: Cluster,
    pub ledger: Ledger,
    pub running: FxHashMap<AllocId, Running>,
    pub requests: FxHashMap<AllocId, Request>,
    /// Each allocation's pod name (from the trace).
    pub names: FxHashMap<AllocId, String>,
    pub budgets: Budgets,
    pub scheduler: Scheduler,
}

/// Fills as the fill experiment does to `config.fill_pct` % and draws each
/// pod's disturbance rules (see the module docs) from `seed`.
pub fn prepare(
    cluster: &Cluster,
    pods: &[TracePod],
    workload: &str,
    policy_name: &str,
    config: &DefragConfig,
    seed: u64,
) -> Result<World, DefragSimError> {
    let fill = FillConfig::for_workload(workload);
    let snap = fill_until(cluster, pods, policy_name, seed, &fill, config.fill_pct)?;
    let by_name: FxHashMap<&str, &Request> =
        pods.iter().map(|p| (p.name.as_str(), &p.request)).collect();
    // Who may be disturbed: drawn per pod in allocation order from its own RNG.
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x00de_f7a6);
    let mut ids: Vec<AllocId> = snap.ledger.allocations().map(|(id, _)| id).collect();
    ids.sort_unstable();
    let mut running: FxHashMap<AllocId, Running> = FxHashMap::default();
    let mut requests: FxHashMap<AllocId, Request> = FxHashMap::default();
    let mut names: FxHashMap<AllocId, String> = FxHashMap::default();
    for id in ids {
        let x = rng.random_range(0..100u32);
        let meta = PodMeta {
            pinned: x < config.pinned_pct,
            preemptible: x >= config.pinned_pct + config.fixed_pct || x < config.pinned_pct,
            budget: (config.budgets > 0 && rng.random_bool(0.5))
                .then(|| BudgetId(rng.random_range(0..config.budgets))),
            ..PodMeta::default()
        };
        running.insert(
            id,
            Running {
                alloc: id,
                meta,
                started_s: 0,
            },
        );
        if let Some((_, name)) = snap.labels.get(&id) {
            if let Some(r) = by_name.get(name.as_str()) {
                requests.insert(id, (*r).clone());
            }
            names.insert(id, name.clone());
        }
    }
    let mut budgets = Budgets::new();
    for b in 0..config.budgets {
        budgets.set(BudgetId(b), config.disruptions_allowed);
    }
    // The fill's policy as it stood at the snapshot (for `tessera`, its learned target).
    let policy =
        fill_policy(&snap.ledger, policy_name, snap.target.clone()).map_err(FillError::from)?;
    Ok(World {
        cluster: snap.cluster,
        ledger: snap.ledger,
        running,
        requests,
        names,
        budgets,
        scheduler: Scheduler::new(policy),
    })
}

/// Runs the experiment once.
pub fn run(
    cluster: &Cluster,
    pods: &[TracePod],
    workload: &str,
    policy_name: &str,
    config: &DefragConfig,
    seed: u64,
) -> Result<DefragResult, DefragSimError> {
    let World {
        cluster,
        mut ledger,
        mut running,
        mut requests,
        budgets,
        mut scheduler,
        ..
    } = prepare(cluster, pods, workload, policy_name, config, seed)?;
    let mut place_rng = SmallRng::seed_from_u64(seed);
    let pending = Request::whole(config.pending_gpus, 8_000, 32_768);
    let big = |c: &Cluster, l: &Ledger, idle: bool| {
        c.ids()
            .filter(|id| c.node(*id).gpus.len() >= config.pending_gpus as usize)
            .filter(|id| !idle || l.node(*id).gpus.iter().all(|g| g.is_idle()))
            .count()
    };
    let gpus = cluster.gpu_count().max(1);
    let allocated: usize = ledger
        .nodes()
        .iter()
        .map(|n| n.gpus.iter().filter(|g| !g.is_idle()).count())
        .sum();
    let mut result = DefragResult {
        policy: policy_name.to_string(),
        seed,
        allocated_pct: 100.0 * allocated as f64 / gpus as f64,
        big_nodes: big(&cluster, &ledger, false),
        big_nodes_idle: big(&cluster, &ledger, true),
        direct: 0,
        nodes_freed: 0,
        moves: 0,
        moves_per_node: None,
        moves_by_round: Vec::new(),
        protected_moved: 0,
        budget_overdraws: 0,
        stopped: String::new(),
    };
    while let Some(p) = scheduler.place(&cluster, &ledger, &pending, &mut place_rng) {
        ledger.apply(&cluster, &p)?;
        result.direct += 1;
    }
    let limits = Limits {
        max_moves_per_pod: config.max_moves_per_pod,
        max_moves: config.max_moves_per_pod,
    };
    result.stopped = format!("{} rounds", config.max_rounds);
    for _ in 0..config.max_rounds {
        let ctx = Context {
            cluster: &cluster,
            ledger: &ledger,
            running: &running,
            requests: &requests,
            budgets: &budgets,
        };
        let plan = defrag::plan(
            &mut scheduler,
            &ctx,
            std::slice::from_ref(&pending),
            &limits,
            &mut place_rng,
        )?;
        let Some(step) = plan.steps.into_iter().next() else {
            result.stopped = "no allowed moves make the pod fit".into();
            break;
        };
        // Check the plan against the rules independently of the planner.
        let mut spent: BTreeMap<BudgetId, u32> = BTreeMap::new();
        for mv in &step.moves {
            let meta = running.get(&mv.pod).map(|r| r.meta).unwrap_or_default();
            if meta.pinned || !meta.preemptible {
                result.protected_moved += 1;
            }
            if let Some(b) = meta.budget {
                *spent.entry(b).or_default() += 1;
            }
        }
        result.budget_overdraws += spent
            .iter()
            .filter(|(b, n)| **n > budgets.allowed(**b))
            .count();
        // Execute: evict, re-create where planned (a new pod, with the old one's
        // metadata and request), then place the pending pod.
        for mv in &step.moves {
            ledger.release(mv.pod)?;
        }
        for mv in &step.moves {
            let id = ledger.apply(&cluster, &mv.to)?;
            if let Some(r) = running.remove(&mv.pod) {
                running.insert(id, Running { alloc: id, ..r });
            }
            if let Some(r) = requests.remove(&mv.pod) {
                requests.insert(id, r);
            }
        }
        ledger.apply(&cluster, &step.placement)?;
        result.nodes_freed += 1;
        result.moves += step.moves.len();
        result.moves_by_round.push(step.moves.len());
    }
    result.moves_per_node =
        (result.nodes_freed > 0).then(|| result.moves as f64 / result.nodes_freed as f64);
    Ok(result)
}

/// Every (policy, seed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DefragReport {
    pub config: DefragConfig,
    pub workload: String,
    pub results: Vec<DefragResult>,
}

/// Runs each policy with each seed.
pub fn run_grid(
    cluster: &Cluster,
    pods: &[TracePod],
    workload: &str,
    policies: &[String],
    config: &DefragConfig,
    seeds: &[u64],
) -> Result<DefragReport, DefragSimError> {
    let mut results = Vec::new();
    for p in policies {
        for &s in seeds {
            results.push(run(cluster, pods, workload, p, config, s)?);
        }
    }
    Ok(DefragReport {
        config: config.clone(),
        workload: workload.to_string(),
        results,
    })
}

impl DefragReport {
    /// A terminal table: one row per run, then N per policy over all its seeds.
    pub fn table(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "defrag experiment on {}: fill to {} % arrived, then {}-GPU pods pending; {} % pinned, {} % not preemptible, half the rest in {} PDBs allowing {} each\n",
            self.workload,
            c.fill_pct,
            c.pending_gpus,
            c.pinned_pct,
            c.fixed_pct,
            c.budgets,
            c.disruptions_allowed
        );
        out.push_str(&format!(
            "{:<12} {:>5} {:>7} {:>10} {:>7} {:>7} {:>6} {:>7} {:>10} {:>9}  {}\n",
            "policy",
            "seed",
            "alloc%",
            "idle/big",
            "direct",
            "freed",
            "moves",
            "N",
            "protected",
            "overdraw",
            "stopped"
        ));
        for r in &self.results {
            out.push_str(&format!(
                "{:<12} {:>5} {:>7.1} {:>5}/{:<4} {:>7} {:>7} {:>6} {:>7} {:>10} {:>9}  {}\n",
                r.policy,
                r.seed,
                r.allocated_pct,
                r.big_nodes_idle,
                r.big_nodes,
                r.direct,
                r.nodes_freed,
                r.moves,
                r.moves_per_node.map_or("-".into(), |n| format!("{n:.2}")),
                r.protected_moved,
                r.budget_overdraws,
                r.stopped,
            ));
        }
        let mut by_policy: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for r in &self.results {
            let e = by_policy.entry(r.policy.as_str()).or_default();
            e.0 += r.moves;
            e.1 += r.nodes_freed;
        }
        for (p, (moves, freed)) in by_policy {
            if freed > 0 {
                out.push_str(&format!(
                    "{p}: N = {:.2} moves per whole {}-GPU node freed ({moves} moves, {freed} nodes)\n",
                    moves as f64 / freed as f64,
                    c.pending_gpus
                ));
            } else {
                out.push_str(&format!("{p}: no node freed\n"));
            }
        }
        out
    }
}
