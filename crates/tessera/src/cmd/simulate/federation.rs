//! `tessera simulate --experiment federation`: the cluster split into member clusters,
//! each job sent to a member by Karmada's integer estimate (its general estimator, or
//! the per-node view of its scheduler-estimator) or by Tessera's own estimate, then
//! placed inside the member by Tessera (see `tessera_sim::experiment::federation`). On
//! the openb traces with `--trace DIR` (`--workload` names the pod lists, default
//! `default`; `all` for every list in the folder, e.g. generated variants), else on
//! the built-in synthetic workload. `--seeds` (default 10 with a trace, 3 without),
//! `--json` writes the reports.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use tessera_sim::experiment::federation::{
    Estimator, FederationConfig, render_table, run_federation_seeds,
};
use tessera_sim::experiment::fill::{FillConfig, Knowledge, seeds as seed_list};

use super::{Fail, SimulateArgs, selected_workloads, split};
use crate::cmd::progress::Progress;

/// Options of `--experiment federation` only.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FederationArgs {
    /// Federation: share of the nodes in each member cluster, comma separated
    /// (default 0.4,0.3,0.2,0.1: four uneven members).
    #[arg(long)]
    pub member_shares: Option<String>,
    /// Federation: most replicas Tessera's estimate counts per member (default 64).
    #[arg(long)]
    pub estimate_limit: Option<u32>,
    /// Federation: seconds one bounce costs (default 300, karmada-descheduler's
    /// unschedulable threshold).
    #[arg(long)]
    pub redispatch_delay: Option<u64>,
    /// Federation: jobs decided on one set of estimates (default 1: fresh estimates).
    #[arg(long)]
    pub batch: Option<usize>,
}

fn config(args: &SimulateArgs) -> Result<FederationConfig, Fail> {
    let f = &args.federation;
    let mut c = FederationConfig::default();
    if let Some(s) = &f.member_shares {
        c.shares = split(s)
            .iter()
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| {
                        Fail::Usage(format!("--member-shares: {v:?} is not a positive number"))
                    })
            })
            .collect::<Result<_, _>>()?;
        if c.shares.is_empty() {
            return Err(Fail::Usage("--member-shares: no shares given".into()));
        }
    }
    if let Some(l) = f.estimate_limit {
        if l == 0 {
            return Err(Fail::Usage("--estimate-limit must be at least 1".into()));
        }
        c.limit = l;
    }
    if let Some(d) = f.redispatch_delay {
        c.redispatch_delay_s = d;
    }
    if let Some(b) = f.batch {
        if b == 0 {
            return Err(Fail::Usage("--batch must be at least 1".into()));
        }
        c.batch = b;
    }
    c.fill = FillConfig {
        knowledge: if args.online {
            Knowledge::Online
        } else {
            Knowledge::Typical
        },
        ..FillConfig::default()
    };
    Ok(c)
}

pub(super) fn run(args: &SimulateArgs) -> Result<ExitCode, Fail> {
    if args.policies.is_some() {
        return Err(Fail::Usage(
            "--policies: members always place with tessera; the federation experiment compares estimators"
                .into(),
        ));
    }
    let config = config(args)?;
    let workloads = selected_workloads(args)?;
    let n_seeds = args
        .seeds
        .unwrap_or(if args.trace.is_some() { 10 } else { 3 });
    if n_seeds == 0 {
        return Err(Fail::Usage("--seeds must be at least 1".into()));
    }
    let seeds = seed_list(n_seeds);
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| Fail::Usage(format!("--jobs {jobs}: {e}")))?;
    println!(
        "federation: member shares {:?}, estimate limit {}, bounce {} s, batch {}, seeds {seeds:?}; counts over jobs until arrived = 100 %",
        config.shares, config.limit, config.redispatch_delay_s, config.batch
    );
    let started = Instant::now();
    let progress = Progress::new(
        (workloads.len() * Estimator::ALL.len() * seeds.len()) as u64,
        "federation",
    );
    let reports = pool
        .install(|| {
            workloads
                .iter()
                .map(|w| {
                    run_federation_seeds(&w.name, &w.cluster, &w.pods, &seeds, &config, &|| {
                        progress.tick()
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| Fail::Usage(e.to_string()))?;
    progress.finish();
    print!("{}", render_table(&reports));
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        let body = serde_json::to_string_pretty(&reports)
            .map_err(|e| Fail::Usage(format!("--json: {e}")))?;
        std::fs::write(path, body + "\n")
            .with_context(|| format!("writing {}", path.display()))
            .map_err(|e| Fail::Usage(format!("{e:#}")))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::super::tests::args;
    use super::*;

    /// A small trace runs every estimator and writes one report; bad options are usage
    /// errors.
    #[test]
    fn runs_every_estimator_and_checks_options() {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
        for i in 0..8 {
            nodes.push_str(&format!("n{i},96000,393216,8,G2\nt{i},32000,131072,2,T4\n"));
        }
        std::fs::write(dir.path().join("openb_node_list_gpu_node.csv"), nodes).unwrap();
        std::fs::write(
            dir.path().join("openb_pod_list_tiny.csv"),
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,4000,1024,1,1000\np2,2000,1024,8,1000\np3,1000,1024,1,300\np4,8000,1024,0,0\n",
        )
        .unwrap();
        let d = dir.path().to_str().unwrap();
        let json = dir.path().join("fed.json");
        let j = json.to_str().unwrap();
        let code = super::run(&args(&[
            "--experiment",
            "federation",
            "--trace",
            d,
            "--workload",
            "tiny",
            "--seeds",
            "2",
            "--json",
            j,
        ]))
        .ok()
        .unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let est = v[0]["estimators"].as_array().unwrap();
        assert_eq!(est.len(), 3);
        assert_eq!(est[0]["estimator"], "karmada-general");
        assert_eq!(est[2]["estimator"], "tessera");
        assert_eq!(v[0]["seeds"], serde_json::json!([42, 43]));
        for bad in [
            &["--experiment", "federation", "--policies", "tessera"][..],
            &["--experiment", "federation", "--member-shares", "0.5,x"],
            &["--experiment", "federation", "--estimate-limit", "0"],
            &["--experiment", "federation", "--batch", "0"],
        ] {
            assert!(
                matches!(super::run(&args(bad)), Err(Fail::Usage(_))),
                "{bad:?}"
            );
        }
    }
}
