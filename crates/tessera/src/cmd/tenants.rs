//! `tessera simulate --experiment tenants`: queues sharing the replay (see
//! `tessera_sim::experiment::tenants` for the protocol), every discipline on
//! every seed, as a table and optionally JSON.

use std::path::Path;

use rayon::prelude::*;
use serde::Serialize;
use tessera_sim::experiment::replay;
use tessera_sim::experiment::tenants::{self, Discipline, TenantOptions, TenantResult};
use tessera_sim::grid::Workload;
use tessera_sim::metrics::mean_sd;

/// Time-scale of the tenants experiment on an openb trace (with the default 8
/// cycles): every queue wants more than its quota once the away team is back.
pub const TRACE_TIME_SCALE: f64 = 4_000.0;
/// The same on the built-in synthetic workload (its arrivals span a longer window).
pub const SYNTHETIC_TIME_SCALE: f64 = 20_000.0;

#[derive(Debug, Serialize)]
struct Output<'a> {
    experiment: &'static str,
    options: &'a TenantOptions,
    runs: &'a [TenantResult],
}

/// Runs the experiment and prints the table; writes JSON to `json` if given.
pub fn run(
    pool: &rayon::ThreadPool,
    workloads: &[Workload],
    seeds: &[u64],
    time_scale: f64,
    json: Option<&Path>,
) -> Result<(), String> {
    let opts = TenantOptions {
        time_scale,
        ..TenantOptions::default()
    };
    let mut all = Vec::new();
    for w in workloads {
        if !w
            .pods
            .iter()
            .all(|p| p.creation_s.is_some() && p.deletion_s.is_some())
        {
            eprintln!(
                "note: tenants skips {}: its pods have no creation/deletion times",
                w.name
            );
            continue;
        }
        let input = replay::prepare(&w.pods, None).map_err(|e| format!("{}: {e}", w.name))?;
        let jobs: Vec<(Discipline, u64)> = Discipline::ALL
            .iter()
            .flat_map(|&d| seeds.iter().map(move |&s| (d, s)))
            .collect();
        let runs: Result<Vec<TenantResult>, String> = pool.install(|| {
            jobs.par_iter()
                .map(|&(d, s)| {
                    tenants::run_tenants(&w.cluster, &input, d, s, &opts)
                        .map_err(|e| format!("{} {}: {e}", w.name, d.name()))
                })
                .collect()
        });
        let runs = runs?;
        print!("{}", table(&w.name, &opts, &runs));
        all.extend(runs);
    }
    if let Some(path) = json {
        let out = Output {
            experiment: "tenants",
            options: &opts,
            runs: &all,
        };
        let text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn table(workload: &str, opts: &TenantOptions, runs: &[TenantResult]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let quotas: Vec<String> = opts
        .queues
        .iter()
        .map(|(n, p)| format!("{n} {p} %"))
        .collect();
    let first = runs.first();
    let _ = writeln!(
        s,
        "tenants on {workload}: queues {} · time-scale {} · queue {} away for the first {:.0} % of the window · {} seeds",
        quotas.join(", "),
        opts.time_scale,
        opts.queues.first().map_or("-", |q| q.0.as_str()),
        opts.away_fraction * 100.0,
        runs.iter()
            .filter(|r| r.discipline == Discipline::Fifo)
            .count()
    );
    if let Some(r) = first {
        let _ = writeln!(
            s,
            "{} pods on {} GPUs; contended window {} s → {} s (every queue active)",
            r.pods, r.capacity_gpus, r.contended_from_s, r.window_s
        );
    }
    let _ = writeln!(
        s,
        "{:<8} {:>14} {:>12} {:>18} {:>10} {:>13}  share of entitlement per queue (contended)",
        "queues", "Jain", "util %", "return delay s", "evictions", "evicted GPU-h"
    );
    for d in Discipline::ALL {
        let rs: Vec<&TenantResult> = runs.iter().filter(|r| r.discipline == d).collect();
        if rs.is_empty() {
            continue;
        }
        let f = |g: &dyn Fn(&TenantResult) -> f64| {
            mean_sd(&rs.iter().map(|r| g(r)).collect::<Vec<_>>())
        };
        let (jm, js) = f(&|r| r.jain);
        let (um, us) = f(&|r| r.util_mean_pct);
        // A run whose returning queue never got 90 % of what it is owed counts as ∞.
        let never = rs.iter().filter(|r| r.return_delay_s.is_none()).count();
        let delays: Vec<f64> = rs
            .iter()
            .filter_map(|r| r.return_delay_s.map(|d| d as f64))
            .collect();
        let (dm, ds) = mean_sd(&delays);
        let delay = if never > 0 {
            format!("never in {never}")
        } else {
            format!("{dm:.0} ± {ds:.0}")
        };
        let (em, _) = f(&|r| r.evictions as f64);
        let (gm, _) = f(&|r| r.evicted_gpu_hours);
        let per_queue: Vec<String> = rs[0]
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let (m, _) = mean_sd(
                    &rs.iter()
                        .map(|r| r.queues[i].share_of_entitlement)
                        .collect::<Vec<_>>(),
                );
                format!("{} {:.2}", q.name, m)
            })
            .collect();
        let _ = writeln!(
            s,
            "{:<8} {:>7.3} ± {:.3} {:>6.1} ± {:>3.1} {:>18} {:>10.0} {:>13.1}  {}",
            d.name(),
            jm,
            js,
            um,
            us,
            delay,
            em,
            gm,
            per_queue.join("  ")
        );
    }
    s
}
