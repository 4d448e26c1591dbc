//! `tessera simulate --experiment dra`: kube-scheduler's DRA allocation (node by
//! its ordinary scores, devices first-fit) against Tessera's device choice on the
//! fill protocol (see `tessera_sim::experiment::dra`). On the openb traces with
//! `--trace DIR` (`--workload` names the pod lists, default `default`), else on the
//! built-in synthetic workload. `--seeds` (default 10 with a trace, 3 without),
//! `--online` (Tessera learns the workload as pods arrive), `--json` writes the
//! reports.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use tessera_sim::experiment::dra::{Arm, render_table, run_dra};
use tessera_sim::experiment::fill::{Knowledge, seeds as seed_list};

use super::{Fail, SimulateArgs, selected_workloads};
use crate::cmd::progress::Progress;

pub(super) fn run(args: &SimulateArgs) -> Result<ExitCode, Fail> {
    if args.policies.is_some() {
        return Err(Fail::Usage(
            "--policies: the dra experiment's arms are fixed (kube DRA first-fit, tessera, kube node + tessera devices)"
                .into(),
        ));
    }
    let workloads = selected_workloads(args)?;
    let n_seeds = args
        .seeds
        .unwrap_or(if args.trace.is_some() { 10 } else { 3 });
    if n_seeds == 0 {
        return Err(Fail::Usage("--seeds must be at least 1".into()));
    }
    let seeds = seed_list(n_seeds);
    let knowledge = if args.online {
        Knowledge::Online
    } else {
        Knowledge::Typical
    };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| Fail::Usage(format!("--jobs {jobs}: {e}")))?;
    println!(
        "dra: unallocated GPUs at arrived = 100 % (fill protocol), seeds {seeds:?}, Tessera knows {knowledge:?}"
    );
    let started = Instant::now();
    let progress = Progress::new(
        (workloads.len() * Arm::ALL.len() * seeds.len()) as u64,
        "dra",
    );
    let reports = pool
        .install(|| {
            workloads
                .iter()
                .map(|w| run_dra(w, &seeds, knowledge, &|| progress.tick()))
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

    /// A two-node trace runs every arm and writes one report per workload; fixed arms
    /// refuse `--policies`.
    #[test]
    fn runs_the_three_arms_and_refuses_policies() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("openb_node_list_gpu_node.csv"),
            "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,8,G2\nn1,32000,131072,2,T4\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("openb_pod_list_tiny.csv"),
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,4000,1024,1,1000\np2,2000,1024,2,1000\np3,1000,1024,1,300\np4,8000,1024,0,0\n",
        )
        .unwrap();
        let d = dir.path().to_str().unwrap();
        let json = dir.path().join("dra.json");
        let j = json.to_str().unwrap();
        let code = super::run(&args(&[
            "--experiment",
            "dra",
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
        let arms = v[0]["arms"].as_array().unwrap();
        assert_eq!(arms.len(), 3);
        assert_eq!(arms[0]["arm"], "first-fit");
        assert_eq!(v[0]["seeds"], serde_json::json!([42, 43]));
        assert!(matches!(
            super::run(&args(&["--experiment", "dra", "--policies", "tessera"])),
            Err(Fail::Usage(m)) if m.contains("--policies")
        ));
    }
}
