//! `tessera simulate`: run the fill and/or replay experiment over workloads,
//! policies and seeds, and print a table (optionally JSON and an HTML report).
//!
//! With no arguments it runs the built-in synthetic workload (a scaled-down
//! openb-shaped cluster and trace, no files needed): the fill experiment with
//! the seven fill policies and the replay with `k8s-default` against `tessera`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tessera_core::policy;
use tessera_sim::experiment::fill::{Knowledge, seeds as seed_list};
use tessera_sim::experiment::replay::ReplayOptions;
use tessera_sim::grid::{self, ReplayPlan, Workload};
use tessera_sim::report::{self, Report};
use tessera_sim::trace::{TraceError, openb};
use tessera_sim::workload as synthetic;

use crate::cmd::progress::Progress;

mod dra;
mod federation;
mod isolation;
mod preempt;

const FILL_POLICIES: &str = "random,dotprod,clustering,packing,bestfit,fgd,tessera";
const REPLAY_POLICIES: &str = "k8s-default,tessera";
/// Time-scale at which `k8s-default` queues on openb `default` (single pass).
const TRACE_TIME_SCALE: f64 = 25_600.0;

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Directory with the openb CSVs (openb_node_list_gpu_node.csv and
    /// openb_pod_list_<name>.csv). Without it: the built-in synthetic workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Pod lists to run, comma separated (`default,gpushare40`), or `all` for every
    /// openb_pod_list_*.csv in the directory. Default: default.
    #[arg(long)]
    pub workload: Option<String>,
    /// fill, replay, both, tenants (queues sharing the replay), preempt
    /// (high-priority arrivals into a full cluster: Tessera's device-aware
    /// preemption against a kube-scheduler-like baseline), gang (distributed jobs:
    /// gangs vs member by member), defrag (moves per whole 8-GPU node freed) or
    /// isolation (hard and soft shares: static MIG, MPS only, dynamic MIG) or dra
    /// (kube-scheduler's first-fit DRA device allocation against Tessera's choice) or
    /// federation (member clusters chosen by Karmada's integer estimate or Tessera's).
    /// Default: fill with --trace, both without.
    #[arg(long)]
    pub experiment: Option<String>,
    /// Policies, comma separated. Default: random,dotprod,clustering,packing,bestfit,fgd,tessera
    /// for fill; k8s-default,tessera for replay (the first is the replay's baseline).
    #[arg(long)]
    pub policies: Option<String>,
    /// Seeds per (workload, policy): 42, 43, … Default: 10 with --trace, 3 without.
    #[arg(long)]
    pub seeds: Option<u32>,
    /// Parallel runs (default: the number of CPUs).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report with SVG charts here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Replay: divide arrival times by this (load factor). Default: 25600 on a
    /// trace (one pass), 1600 on the synthetic workload.
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Replay: replay the trace's arrivals this many times back to back.
    #[arg(long, default_value_t = 1)]
    pub cycles: u32,
    /// Replay: search the sustainable load (highest time-scale whose mean queueing
    /// delay stays at or under this many seconds). Default: off with --trace, 30 without.
    #[arg(long)]
    pub delay_bound: Option<f64>,
    /// Replay: cycles of the trace in each sustainable-load probe.
    #[arg(long, default_value_t = 5)]
    pub search_cycles: u32,
    /// Replay: highest time-scale the sustainable-load search tries.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub search_max: f64,
    /// Fill: policies that learn their workload (tessera) get no knowledge of the
    /// trace up front and learn from the pods that have arrived (FGD keeps the trace's
    /// typical pods, as published).
    #[arg(long)]
    pub online: bool,
    /// Seed of the built-in synthetic workload.
    #[arg(long, default_value_t = 42)]
    pub synthetic_seed: u64,
    #[command(flatten)]
    pub preempt: preempt::PreemptArgs,
    #[command(flatten)]
    pub federation: federation::FederationArgs,
    /// Isolation: per cent of one-GPU shares that ask for hard isolation (the rest soft).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub hard_pct: u32,
}

/// Errors the user can fix, with their exit codes.
enum Fail {
    /// A trace file is malformed (exit 2).
    Trace(TraceError),
    /// A bad option value (exit 64).
    Usage(String),
}

fn split(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

fn workload_names(dir: &Path, spec: &str) -> Result<Vec<String>, Fail> {
    if spec.trim() == "all" {
        let rd = std::fs::read_dir(dir)
            .map_err(|e| Fail::Usage(format!("--trace {}: {e}", dir.display())))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.strip_prefix("openb_pod_list_")
                    .and_then(|r| r.strip_suffix(".csv"))
                    .map(str::to_string)
            })
            .collect();
        names.sort();
        if names.is_empty() {
            return Err(Fail::Usage(format!(
                "--workload all: no openb_pod_list_*.csv in {}",
                dir.display()
            )));
        }
        return Ok(names);
    }
    let names = split(spec);
    if names.is_empty() {
        return Err(Fail::Usage("--workload: no names given".into()));
    }
    Ok(names)
}

fn load_trace_workloads(dir: &Path, names: &[String]) -> Result<Vec<Workload>, Fail> {
    let cluster = Arc::new(
        openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).map_err(Fail::Trace)?,
    );
    let mut out = Vec::new();
    for n in names {
        let path = dir.join(format!("openb_pod_list_{n}.csv"));
        if !path.exists() {
            return Err(Fail::Usage(format!(
                "--workload {n}: {} does not exist",
                path.display()
            )));
        }
        let pods = openb::load_pods(&path, &cluster.catalog).map_err(Fail::Trace)?;
        out.push(Workload {
            name: n.clone(),
            cluster: cluster.clone(),
            pods: Arc::new(pods),
        });
    }
    Ok(out)
}

/// The openb pod lists `--workload` names in `--trace DIR` (default `default`), or
/// without `--trace` the built-in synthetic workload of `--synthetic-seed`.
fn selected_workloads(args: &SimulateArgs) -> Result<Vec<Workload>, Fail> {
    match &args.trace {
        Some(dir) => {
            let names = workload_names(dir, args.workload.as_deref().unwrap_or("default"))?;
            load_trace_workloads(dir, &names)
        }
        None => {
            if args.workload.is_some() {
                return Err(Fail::Usage(
                    "--workload needs --trace DIR (without it the built-in synthetic workload runs)"
                        .into(),
                ));
            }
            let s = synthetic::generate(args.synthetic_seed);
            Ok(vec![Workload {
                name: synthetic::NAME.to_string(),
                cluster: Arc::new(s.cluster),
                pods: Arc::new(s.pods),
            }])
        }
    }
}

fn check_policies(names: &[String]) -> Result<(), Fail> {
    for n in names {
        if !policy::NAMES.contains(&n.as_str()) {
            return Err(Fail::Usage(format!(
                "--policies: unknown policy {n:?} (known: {})",
                policy::NAMES.join(", ")
            )));
        }
    }
    if names.is_empty() {
        return Err(Fail::Usage("--policies: no names given".into()));
    }
    Ok(())
}

pub fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    match run_inner(args) {
        Ok(code) => Ok(code),
        Err(Fail::Trace(e)) => {
            eprintln!("{e}");
            Ok(ExitCode::from(2))
        }
        Err(Fail::Usage(m)) => {
            eprintln!("tessera simulate: {m}");
            Ok(ExitCode::from(64))
        }
    }
}

fn run_inner(args: SimulateArgs) -> Result<ExitCode, Fail> {
    if args.experiment.as_deref() == Some("isolation") {
        return isolation::run(&args);
    }
    let synthetic_run = args.trace.is_none();
    let experiment = args
        .experiment
        .clone()
        .unwrap_or_else(|| if synthetic_run { "both" } else { "fill" }.into());
    let (do_fill, do_replay) = match experiment.as_str() {
        "fill" => (true, false),
        "replay" => (false, true),
        "both" | "fill+replay" => (true, true),
        "tenants" => (false, false),
        "preempt" => return preempt::run(&args),
        "gang" | "defrag" => return Ok(super::simulate_gang::run(&experiment, &args)),
        "dra" => return dra::run(&args),
        "federation" => return federation::run(&args),
        other => {
            return Err(Fail::Usage(format!(
                "--experiment: {other:?} is not fill, replay, both, tenants, preempt, gang, defrag, isolation, dra or federation"
            )));
        }
    };
    let mut notes = Vec::new();
    let workloads = selected_workloads(&args)?;
    let source = match &args.trace {
        Some(dir) => format!("openb trace in {}", dir.display()),
        None => {
            let w = &workloads[0];
            notes.push(format!(
                "built-in synthetic workload (seed {}): {} pods on {} nodes / {} GPUs, calibrated to openb default",
                args.synthetic_seed,
                w.pods.len(),
                w.cluster.len(),
                w.cluster.gpu_count()
            ));
            "built-in synthetic".to_string()
        }
    };
    let n_seeds = args.seeds.unwrap_or(if synthetic_run { 3 } else { 10 });
    if n_seeds == 0 {
        return Err(Fail::Usage("--seeds must be at least 1".into()));
    }
    let seeds = seed_list(n_seeds);
    let fill_policies = split(args.policies.as_deref().unwrap_or(FILL_POLICIES));
    let replay_policies = split(args.policies.as_deref().unwrap_or(REPLAY_POLICIES));
    if do_fill {
        check_policies(&fill_policies)?;
    }
    if do_replay {
        check_policies(&replay_policies)?;
    }
    let time_scale = args
        .time_scale
        .unwrap_or(match (experiment.as_str(), synthetic_run) {
            ("tenants", true) => super::tenants::SYNTHETIC_TIME_SCALE,
            ("tenants", false) => super::tenants::TRACE_TIME_SCALE,
            (_, true) => 1_600.0,
            (_, false) => TRACE_TIME_SCALE,
        });
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err(Fail::Usage(format!(
            "--time-scale {time_scale}: must be a positive number"
        )));
    }
    let delay_bound = args
        .delay_bound
        .or(if synthetic_run { Some(30.0) } else { None });
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| Fail::Usage(format!("--jobs {jobs}: {e}")))?;

    if experiment == "tenants" {
        super::tenants::run(&pool, &workloads, &seeds, time_scale, args.json.as_deref())
            .map_err(Fail::Usage)?;
        return Ok(ExitCode::SUCCESS);
    }

    let mut report = Report {
        experiment: match (do_fill, do_replay) {
            (true, true) => "fill+replay",
            (true, false) => "fill",
            _ => "replay",
        }
        .to_string(),
        workloads: workloads.iter().map(|w| w.name.clone()).collect(),
        source,
        seeds: seeds.clone(),
        fill_policies: if do_fill {
            fill_policies.clone()
        } else {
            Vec::new()
        },
        fill: Vec::new(),
        replay_policies: if do_replay {
            replay_policies.clone()
        } else {
            Vec::new()
        },
        replay_plan: None,
        replay: None,
        notes,
        mosaic: None,
    };

    if do_fill {
        let total = (workloads.len() * fill_policies.len() * seeds.len()) as u64;
        let progress = Progress::new(total, "fill");
        let knowledge = if args.online {
            Knowledge::Online
        } else {
            Knowledge::Typical
        };
        let result = pool.install(|| {
            grid::fill_grid_with(&workloads, &fill_policies, &seeds, knowledge, &|| {
                progress.tick()
            })
        });
        progress.finish();
        report.fill = result.map_err(|e| Fail::Usage(e.to_string()))?;
    }
    if do_replay {
        let with_times: Vec<Workload> = workloads
            .iter()
            .filter(|w| {
                w.pods
                    .iter()
                    .all(|p| p.creation_s.is_some() && p.deletion_s.is_some())
            })
            .cloned()
            .collect();
        for w in &workloads {
            if !with_times.iter().any(|x| x.name == w.name) {
                let m = format!(
                    "replay skips {}: its pods have no creation/deletion times",
                    w.name
                );
                eprintln!("note: {m}");
                report.notes.push(m);
            }
        }
        let plan = ReplayPlan {
            options: ReplayOptions {
                time_scale,
                cycles: args.cycles.max(1),
                ..ReplayOptions::default()
            },
            delay_bound_s: delay_bound,
            search_cycles: args.search_cycles.max(1),
            search_max: args.search_max,
        };
        let searches = if delay_bound.is_some() {
            with_times.len() * replay_policies.len()
        } else {
            0
        };
        let runs: usize = replay_policies
            .iter()
            .map(|p| grid::replay_seeds(p, &seeds).len())
            .sum();
        let total = (with_times.len() * runs + searches) as u64;
        let progress = Progress::new(total, "replay");
        let result = pool.install(|| {
            grid::replay_grid(&with_times, &replay_policies, &seeds, &plan, &|| {
                progress.tick()
            })
        });
        progress.finish();
        report.replay = Some(result.map_err(|e| Fail::Usage(e.to_string()))?);
        report.notes.push(
            "replay: arrivals compressed by the time-scale, run times (deletion − scheduled; deletion − creation for pods never scheduled) unchanged; FIFO queue with skipping; start at the 0.5th percentile of creation times".into(),
        );
        report.replay_plan = Some(plan);
    }

    print!("{}", report::table::render(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, report::json::render(&report))
            .with_context(|| format!("writing {}", path.display()))
            .map_err(|e| Fail::Usage(format!("{e:#}")))?;
    }
    if let Some(path) = &args.report {
        if do_fill {
            report.mosaic = Some(write_mosaic(path, &workloads[0], &fill_policies, seeds[0])?);
        }
        std::fs::write(path, report::html::render(&report))
            .with_context(|| format!("writing {}", path.display()))
            .map_err(|e| Fail::Usage(format!("{e:#}")))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the mosaic of the fill at 100 % next to the report (`NAME-mosaic.html`)
/// for `workload`, with `tessera` if it ran (else the last fill policy), and
/// returns its name for the report's link.
fn write_mosaic(
    report: &Path,
    workload: &Workload,
    policies: &[String],
    seed: u64,
) -> Result<String, Fail> {
    let policy = policies
        .iter()
        .find(|p| *p == "tessera")
        .or(policies.last())
        .cloned()
        .unwrap_or_else(|| "tessera".into());
    let config = tessera_sim::experiment::fill::FillConfig::for_workload(workload.name.clone());
    let snap = tessera_sim::experiment::snapshot::fill_until(
        &workload.cluster,
        &workload.pods,
        &policy,
        seed,
        &config,
        100.0,
    )
    .map_err(|e| Fail::Usage(format!("mosaic of the fill: {e}")))?;
    let page = tessera_k8s::ui::ledger_page(
        &snap.cluster,
        &snap.ledger,
        |id| snap.labels.get(&id).cloned().unwrap_or_default(),
        &snap.target,
        &format!(
            "Tessera · fill at 100 % · {} · {policy} · seed {seed}",
            workload.name
        ),
    );
    let stem = report
        .file_stem()
        .map_or("report".into(), |s| s.to_string_lossy().to_string());
    let name = format!("{stem}-mosaic.html");
    let path = report.with_file_name(&name);
    std::fs::write(&path, page)
        .with_context(|| format!("writing {}", path.display()))
        .map_err(|e| Fail::Usage(format!("{e:#}")))?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    /// `SimulateArgs` from a command line (also for the experiments' own tests).
    pub(super) fn args(list: &[&str]) -> SimulateArgs {
        Cli::try_parse_from(std::iter::once("simulate").chain(list.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn malformed_trace_line_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("openb_node_list_gpu_node.csv"),
            "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,8,G2\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("openb_pod_list_bad.csv"),
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,lots,1024,1,500\n",
        )
        .unwrap();
        let d = dir.path().to_str().unwrap();
        match run_inner(args(&["--trace", d, "--workload", "bad", "--seeds", "1"])) {
            Err(Fail::Trace(e)) => {
                let m = e.to_string();
                assert!(m.contains("openb_pod_list_bad.csv:3:"), "{m}");
                assert!(m.contains("cpu_milli"), "{m}");
            }
            _ => panic!("expected a trace error"),
        }
        // The exit code is 2.
        let code = run(args(&["--trace", d, "--workload", "bad"])).unwrap();
        assert_eq!(code, ExitCode::from(2));
    }

    #[test]
    fn unknown_policy_and_workload_are_usage_errors() {
        assert!(matches!(
            run_inner(args(&["--policies", "nope"])),
            Err(Fail::Usage(m)) if m.contains("unknown policy \"nope\"")
        ));
        assert!(matches!(
            run_inner(args(&["--workload", "default"])),
            Err(Fail::Usage(m)) if m.contains("needs --trace")
        ));
        assert!(matches!(
            run_inner(args(&["--experiment", "both", "--time-scale=-1"])),
            Err(Fail::Usage(m)) if m.contains("--time-scale")
        ));
    }
}
