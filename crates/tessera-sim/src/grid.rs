//! Many runs at once: every (workload, policy, seed) of an experiment, in
//! parallel with rayon, reduced to one summary per (workload, policy).
//!
//! Runs are independent and their results are collected in job order, so the
//! summaries (and the JSON written from them) do not depend on the number of
//! threads. The caller sets the thread count by running inside its own rayon pool.

use std::sync::Arc;

use rayon::prelude::*;
use serde::Serialize;
use tessera_core::model::Cluster;

use crate::experiment::cost::ReplayCost;
use crate::experiment::fill::{FillConfig, FillError, FillResult, Knowledge, run_fill};
use crate::experiment::replay::{
    ReplayError, ReplayInput, ReplayOptions, ReplayResult, SustainableLoad, prepare, run_replay,
    sustainable_load,
};
use crate::metrics::{mean_sd, median};
use crate::trace::TracePod;

/// One workload: its name, cluster and pods.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub cluster: Arc<Cluster>,
    pub pods: Arc<Vec<TracePod>>,
}

/// A failed run, naming the workload and policy.
#[derive(Debug, thiserror::Error)]
pub enum GridError {
    #[error("{workload} / {policy}: {source}")]
    Fill {
        workload: String,
        policy: String,
        #[source]
        source: FillError,
    },
    #[error("{workload} / {policy}: {source}")]
    Replay {
        workload: String,
        policy: String,
        #[source]
        source: ReplayError,
    },
}

/// One point of a summarised fill curve (over seeds), in per cent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurvePoint {
    pub arrived_pct: f64,
    pub unallocated_pct_median: f64,
    pub unallocated_pct_mean: f64,
    pub frag_rate_pct_median: f64,
    pub frag_amount_pct_median: f64,
}

/// The fill experiment for one (workload, policy) over all seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FillSummary {
    pub workload: String,
    pub policy: String,
    pub seeds: Vec<u64>,
    /// Unallocated GPU at arrived = 100 %: mean and sample sd over seeds.
    pub unallocated_pct_mean: f64,
    pub unallocated_pct_sd: f64,
    pub unallocated_pct_median: f64,
    /// Unallocated GPU in GPUs (mean × capacity).
    pub unallocated_gpus_mean: f64,
    pub capacity_gpus: f64,
    pub pods_failed_mean: f64,
    /// Integer arrived % columns present in every seed's curve.
    pub curve: Vec<CurvePoint>,
}

/// Reduces the runs of one (workload, policy) to its summary.
pub fn summarise_fill(runs: &[FillResult]) -> FillSummary {
    let at100: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.at_100.map(|p| p.unallocated_pct))
        .collect();
    let (mean, sd) = mean_sd(&at100);
    let capacity_gpus = runs
        .first()
        .map_or(0.0, |r| r.capacity_gpu_milli as f64 / 1000.0);
    let mut curve = Vec::new();
    if let Some(first) = runs.first() {
        for p in &first.curve {
            let at: Vec<_> = runs
                .iter()
                .filter_map(|r| r.curve.iter().find(|q| q.arrived_pct == p.arrived_pct))
                .collect();
            if at.len() != runs.len() {
                continue;
            }
            let col = |f: fn(&crate::metrics::FillPoint) -> f64| -> Vec<f64> {
                at.iter().map(|q| f(q)).collect()
            };
            let un = col(|q| q.unallocated_pct);
            curve.push(CurvePoint {
                arrived_pct: p.arrived_pct,
                unallocated_pct_median: median(&un),
                unallocated_pct_mean: mean_sd(&un).0,
                frag_rate_pct_median: median(&col(|q| q.frag_rate_pct)),
                frag_amount_pct_median: median(&col(|q| q.frag_amount_pct)),
            });
        }
    }
    FillSummary {
        workload: runs.first().map_or(String::new(), |r| r.workload.clone()),
        policy: runs.first().map_or(String::new(), |r| r.policy.clone()),
        seeds: runs.iter().map(|r| r.seed).collect(),
        unallocated_pct_mean: mean,
        unallocated_pct_sd: sd,
        unallocated_pct_median: median(&at100),
        unallocated_gpus_mean: mean / 100.0 * capacity_gpus,
        capacity_gpus,
        pods_failed_mean: runs.iter().map(|r| r.pods_failed as f64).sum::<f64>()
            / runs.len().max(1) as f64,
        curve,
    }
}

/// Runs the fill experiment for every (workload, policy, seed) in parallel; one
/// summary per (workload, policy), workloads outer, policies in the given order.
/// `tick` is called once per finished run (for a progress bar).
pub fn fill_grid(
    workloads: &[Workload],
    policies: &[String],
    seeds: &[u64],
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<FillSummary>, GridError> {
    fill_grid_with(workloads, policies, seeds, Knowledge::Typical, tick)
}

/// [`fill_grid`] with what policies that learn their workload know up front.
pub fn fill_grid_with(
    workloads: &[Workload],
    policies: &[String],
    seeds: &[u64],
    knowledge: Knowledge,
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<FillSummary>, GridError> {
    let jobs: Vec<(usize, usize, u64)> = (0..workloads.len())
        .flat_map(|w| (0..policies.len()).flat_map(move |p| seeds.iter().map(move |&s| (w, p, s))))
        .collect();
    let results: Vec<FillResult> =
        jobs.par_iter()
            .map(|&(w, p, seed)| {
                let wl = &workloads[w];
                let config = FillConfig {
                    knowledge,
                    ..FillConfig::for_workload(wl.name.clone())
                };
                let r = run_fill(&wl.cluster, &wl.pods, &policies[p], seed, &config).map_err(
                    |source| GridError::Fill {
                        workload: wl.name.clone(),
                        policy: policies[p].clone(),
                        source,
                    },
                );
                tick();
                r
            })
            .collect::<Result<_, _>>()?;
    Ok(results
        .chunks(seeds.len().max(1))
        .map(summarise_fill)
        .collect())
}

/// The seeds a replay grid runs for `policy`: all of them for a policy that draws
/// from the RNG (`random`), else only the first (every seed would give the same run).
pub fn replay_seeds<'a>(policy: &str, seeds: &'a [u64]) -> &'a [u64] {
    let deterministic = tessera_core::policy::by_name(policy, &Default::default())
        .map(|pol| pol.cacheable())
        .unwrap_or(false);
    if deterministic && !seeds.is_empty() {
        &seeds[..1]
    } else {
        seeds
    }
}

/// Replay settings for a grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayPlan {
    pub options: ReplayOptions,
    /// Bound on mean queueing delay for the sustainable-load search, seconds;
    /// `None` skips the search.
    pub delay_bound_s: Option<f64>,
    /// Cycles of the trace used by the sustainable-load search.
    pub search_cycles: u32,
    /// Highest time-scale the search tries.
    pub search_max: f64,
}

/// Replay results of a grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayGrid {
    pub runs: Vec<ReplayResult>,
    pub sustainable: Vec<SustainableLoad>,
    pub comparisons: Vec<Comparison>,
}

/// A policy against the baseline on one workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub workload: String,
    pub baseline: String,
    pub policy: String,
    pub time_scale: f64,
    pub baseline_mean_delay_s: f64,
    pub policy_mean_delay_s: f64,
    /// policy / baseline mean queueing delay (`None` when the baseline did not queue).
    pub delay_ratio: Option<f64>,
    pub baseline_util_pct: f64,
    pub policy_util_pct: f64,
    pub baseline_alloc_share_pct: f64,
    pub policy_alloc_share_pct: f64,
    /// policy / baseline sustainable time-scale (`None` without a search).
    pub sustainable_ratio: Option<f64>,
    /// Mean cost of the runs (see [`crate::experiment::cost`]), GPU-hours.
    pub baseline_cost: ReplayCost,
    pub policy_cost: ReplayCost,
}

fn mean_cost(runs: &[&ReplayResult]) -> ReplayCost {
    let m = |f: fn(&ReplayCost) -> f64| mean(runs.iter().map(|r| f(&r.cost)));
    ReplayCost {
        billed_gpu_hours: m(|c| c.billed_gpu_hours),
        billed_dynamic: m(|c| c.billed_dynamic),
        occupied_gpu_hours: m(|c| c.occupied_gpu_hours),
        powered_gpu_hours: m(|c| c.powered_gpu_hours),
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// Runs the replay for every (workload, policy, seed) — once for policies that do
/// not use the RNG, whose replays are the same for every seed — and, with a bound, the
/// sustainable-load search for every (workload, policy) with the first seed.
/// Each policy after the first is compared with the first (the baseline).
pub fn replay_grid(
    workloads: &[Workload],
    policies: &[String],
    seeds: &[u64],
    plan: &ReplayPlan,
    tick: &(dyn Fn() + Sync),
) -> Result<ReplayGrid, GridError> {
    let inputs: Vec<ReplayInput> = workloads
        .iter()
        .map(|w| {
            prepare(&w.pods, None).map_err(|source| GridError::Replay {
                workload: w.name.clone(),
                policy: String::new(),
                source,
            })
        })
        .collect::<Result<_, _>>()?;
    // A policy that never draws from the RNG gives the same replay for every seed:
    // run it once (first seed).
    let seeds_of: Vec<&[u64]> = policies.iter().map(|p| replay_seeds(p, seeds)).collect();
    let jobs: Vec<(usize, usize, u64)> = (0..workloads.len())
        .flat_map(|w| {
            let seeds_of = &seeds_of;
            (0..policies.len()).flat_map(move |p| seeds_of[p].iter().map(move |&s| (w, p, s)))
        })
        .collect();
    let err = |w: usize, p: usize| {
        let (w, p) = (workloads[w].name.clone(), policies[p].clone());
        move |source| GridError::Replay {
            workload: w,
            policy: p,
            source,
        }
    };
    let runs: Vec<ReplayResult> = jobs
        .par_iter()
        .map(|&(w, p, seed)| {
            let r = run_replay(
                &workloads[w].cluster,
                &inputs[w],
                &workloads[w].name,
                &policies[p],
                seed,
                &plan.options,
            )
            .map_err(err(w, p));
            tick();
            r
        })
        .collect::<Result<_, _>>()?;
    let sustainable: Vec<SustainableLoad> = match plan.delay_bound_s {
        None => Vec::new(),
        Some(bound) => {
            let pairs: Vec<(usize, usize)> = (0..workloads.len())
                .flat_map(|w| (0..policies.len()).map(move |p| (w, p)))
                .collect();
            pairs
                .par_iter()
                .map(|&(w, p)| {
                    let r = sustainable_load(
                        &workloads[w].cluster,
                        &inputs[w],
                        &workloads[w].name,
                        &policies[p],
                        seeds.first().copied().unwrap_or(0),
                        bound,
                        1.0,
                        plan.search_max,
                        6,
                        plan.search_cycles,
                    )
                    .map_err(err(w, p));
                    tick();
                    r
                })
                .collect::<Result<_, _>>()?
        }
    };
    let mut comparisons = Vec::new();
    for (w, wl) in workloads.iter().enumerate() {
        let of = |p: usize| -> Vec<&ReplayResult> {
            runs.iter()
                .filter(|r| r.workload == wl.name && r.policy == policies[p])
                .collect()
        };
        let sus = |p: usize| {
            sustainable
                .get(w * policies.len() + p)
                .map(|s| s.time_scale)
        };
        let base = of(0);
        let b_delay = mean(base.iter().map(|r| r.delay.mean_s));
        for p in 1..policies.len() {
            let runs_p = of(p);
            let p_delay = mean(runs_p.iter().map(|r| r.delay.mean_s));
            comparisons.push(Comparison {
                workload: wl.name.clone(),
                baseline: policies[0].clone(),
                policy: policies[p].clone(),
                time_scale: plan.options.time_scale,
                baseline_mean_delay_s: b_delay,
                policy_mean_delay_s: p_delay,
                delay_ratio: (b_delay > 0.0).then(|| p_delay / b_delay),
                baseline_util_pct: mean(base.iter().map(|r| r.util_mean_pct)),
                policy_util_pct: mean(runs_p.iter().map(|r| r.util_mean_pct)),
                baseline_alloc_share_pct: mean(base.iter().map(|r| r.alloc_share_mean_pct)),
                policy_alloc_share_pct: mean(runs_p.iter().map(|r| r.alloc_share_mean_pct)),
                baseline_cost: mean_cost(&base),
                policy_cost: mean_cost(&runs_p),
                sustainable_ratio: match (sus(0), sus(p)) {
                    (Some(b), Some(q)) if b > 0.0 => Some(q / b),
                    _ => None,
                },
            });
        }
    }
    Ok(ReplayGrid {
        runs,
        sustainable,
        comparisons,
    })
}
