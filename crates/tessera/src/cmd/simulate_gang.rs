//! `tessera simulate --experiment gang` and `--experiment defrag`: the
//! distributed-job replay (gang placement against member-by-member binding) and
//! the defragmentation experiment (moves per whole 8-GPU node freed), on the
//! built-in synthetic workload or an openb trace (`--trace DIR --workload NAME`).
//! Kept apart from `simulate.rs`, which holds the fill and replay grid.

use std::path::Path;
use std::process::ExitCode;

use tessera_core::model::Cluster;
use tessera_sim::experiment::defrag::{self, DefragConfig};
use tessera_sim::experiment::fill::seeds as seed_list;
use tessera_sim::experiment::gang::{self, GangConfig};
use tessera_sim::trace::{TracePod, openb};
use tessera_sim::workload as synthetic;

use super::simulate::SimulateArgs;

/// A cluster and its pods, with the workload's name.
pub struct Loaded {
    pub name: String,
    pub cluster: Cluster,
    pub pods: Vec<TracePod>,
}

/// The openb trace in `dir` (node list and `openb_pod_list_<workload>.csv`), or
/// the built-in synthetic workload from `synthetic_seed`. `Err` is the message
/// and exit code (2: a malformed file, 64: a bad option).
pub fn load(
    trace: Option<&Path>,
    workload: Option<&str>,
    synthetic_seed: u64,
) -> Result<Loaded, (String, u8)> {
    match trace {
        Some(dir) => {
            let name = workload.unwrap_or("default").trim().to_string();
            if name.contains(',') || name == "all" {
                return Err((format!("--workload {name}: give one pod list"), 64));
            }
            let cluster = openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv"))
                .map_err(|e| (e.to_string(), 2))?;
            let path = dir.join(format!("openb_pod_list_{name}.csv"));
            if !path.exists() {
                return Err((
                    format!("--workload {name}: {} does not exist", path.display()),
                    64,
                ));
            }
            let pods = openb::load_pods(&path, &cluster.catalog).map_err(|e| (e.to_string(), 2))?;
            Ok(Loaded {
                name,
                cluster,
                pods,
            })
        }
        None => {
            if workload.is_some() {
                return Err((
                    "--workload needs --trace DIR (without it the built-in synthetic workload runs)"
                        .into(),
                    64,
                ));
            }
            let s = synthetic::generate(synthetic_seed);
            Ok(Loaded {
                name: synthetic::NAME.to_string(),
                cluster: s.cluster,
                pods: s.pods,
            })
        }
    }
}

fn policies(args: &SimulateArgs, default: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = args
        .policies
        .as_deref()
        .unwrap_or(default)
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    if names.is_empty() {
        return Err("--policies: no names given".into());
    }
    for n in &names {
        if !tessera_core::policy::NAMES.contains(&n.as_str()) {
            return Err(format!(
                "--policies: unknown policy {n:?} (known: {})",
                tessera_core::policy::NAMES.join(", ")
            ));
        }
    }
    Ok(names)
}

fn fail(context: &str, message: impl std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("tessera simulate --experiment {context}: {message}");
    ExitCode::from(code)
}

/// Runs `--experiment gang` or `--experiment defrag`.
pub fn run(experiment: &str, args: &SimulateArgs) -> ExitCode {
    let loaded = match load(
        args.trace.as_deref(),
        args.workload.as_deref(),
        args.synthetic_seed,
    ) {
        Ok(l) => l,
        Err((m, code)) => return fail(experiment, m, code),
    };
    let n_seeds = args.seeds.unwrap_or(3);
    if n_seeds == 0 {
        return fail(experiment, "--seeds must be at least 1", 64);
    }
    let seeds = seed_list(n_seeds);
    let (table, json) = match experiment {
        "gang" => {
            // The gang decision uses one policy: the first given (default tessera).
            let policy = match policies(args, "tessera") {
                Ok(p) => p[0].clone(),
                Err(m) => return fail(experiment, m, 64),
            };
            // Offered load 1.2 × the cluster's GPUs while jobs arrive, whatever its size.
            let config = GangConfig::for_load(loaded.cluster.gpu_count(), 1.2);
            match gang::run_seeds(
                &loaded.cluster,
                &loaded.pods,
                &loaded.name,
                &policy,
                &config,
                &seeds,
            ) {
                Ok(r) => (r.table(), serde_json::to_string_pretty(&r)),
                Err(e) => return fail(experiment, e, 1),
            }
        }
        _ => {
            let names = match policies(args, "random,tessera") {
                Ok(p) => p,
                Err(m) => return fail(experiment, m, 64),
            };
            let config = DefragConfig::default();
            match defrag::run_grid(
                &loaded.cluster,
                &loaded.pods,
                &loaded.name,
                &names,
                &config,
                &seeds,
            ) {
                Ok(r) => (r.table(), serde_json::to_string_pretty(&r)),
                Err(e) => return fail(experiment, e, 1),
            }
        }
    };
    print!("{table}");
    if let Some(path) = &args.json {
        let written = json
            .map_err(|e| e.to_string())
            .and_then(|j| std::fs::write(path, j).map_err(|e| e.to_string()));
        if let Err(e) = written {
            return fail(experiment, format!("writing {}: {e}", path.display()), 1);
        }
    }
    ExitCode::SUCCESS
}
