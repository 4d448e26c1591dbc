//! `tessera simulate --experiment preempt`: high-priority arrivals into a full
//! cluster, Tessera's device-aware preemption against a kube-scheduler-like
//! baseline (see `tessera_sim::experiment::preempt`). On the openb trace with
//! `--trace DIR` (`--workload` names one pod list, default `default`), else on
//! the built-in synthetic workload.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use tessera_sim::experiment::fill::seeds as seed_list;
use tessera_sim::experiment::preempt::{
    FillPods, PreemptConfig, render_table, run_preempt_seeds, summarise,
};

use super::{Fail, SimulateArgs, selected_workloads, split};

/// Options of `--experiment preempt` only.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PreemptArgs {
    /// Preempt: high-priority arrivals per seed (default 100).
    #[arg(long)]
    pub arrivals: Option<usize>,
    /// Preempt: rounds of preemption the kube-like baseline may take per arrival
    /// while the pod stays unschedulable (default 10).
    #[arg(long)]
    pub kube_rounds: Option<u32>,
    /// Preempt: fill the cluster with the workload's GPU shares and CPU-only pods
    /// (`shares`, default) or with all its pods (`all`).
    #[arg(long)]
    pub preempt_fill: Option<String>,
}

pub(super) fn run(args: &SimulateArgs) -> Result<ExitCode, Fail> {
    let mut workloads = selected_workloads(args)?;
    if workloads.len() != 1 {
        return Err(Fail::Usage(
            "--experiment preempt runs one workload at a time".into(),
        ));
    }
    let w = workloads.remove(0);
    let (name, cluster, pods) = (w.name, w.cluster, w.pods);
    let mut config = PreemptConfig {
        workload: name.clone(),
        ..PreemptConfig::default()
    };
    let p = &args.preempt;
    if let Some(n) = p.arrivals {
        config.arrivals = n;
    }
    if let Some(n) = p.kube_rounds {
        if n == 0 {
            return Err(Fail::Usage("--kube-rounds must be at least 1".into()));
        }
        config.kube_rounds = n;
    }
    if let Some(f) = &p.preempt_fill {
        config.fill = match f.as_str() {
            "shares" => FillPods::Shares,
            "all" => FillPods::All,
            other => {
                return Err(Fail::Usage(format!(
                    "--preempt-fill: {other:?} is not shares or all"
                )));
            }
        };
    }
    if let Some(p) = &args.policies {
        let p = split(p);
        let [one] = p.as_slice() else {
            return Err(Fail::Usage(
                "--policies: preempt takes one placement policy (both sides place with it)".into(),
            ));
        };
        super::check_policies(&p)?;
        config.policy = one.clone();
    }
    let seeds = seed_list(args.seeds.unwrap_or(3));
    if seeds.is_empty() {
        return Err(Fail::Usage("--seeds must be at least 1".into()));
    }
    println!(
        "preempt: {name} on {} nodes / {} GPUs; {} high-priority arrivals per seed, seeds {:?}, placement policy {}",
        cluster.len(),
        cluster.gpu_count(),
        config.arrivals,
        seeds,
        config.policy
    );
    let started = Instant::now();
    let results = run_preempt_seeds(&cluster, &pods, &seeds, &config)
        .map_err(|e| Fail::Usage(e.to_string()))?;
    let summary = summarise(&results);
    for r in &results {
        println!(
            "seed {}: fill placed {} pods ({:.1} % of GPU compute allocated)",
            r.seed, r.fill_pods, r.fill_alloc_pct
        );
    }
    print!("{}", render_table(&summary));
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        let body = serde_json::json!({ "config": config, "summary": summary, "runs": results });
        std::fs::write(path, format!("{body:#}\n"))
            .with_context(|| format!("writing {}", path.display()))
            .map_err(|e| Fail::Usage(format!("{e:#}")))?;
    }
    Ok(ExitCode::SUCCESS)
}
