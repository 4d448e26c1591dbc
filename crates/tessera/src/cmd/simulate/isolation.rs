//! `tessera simulate --experiment isolation`: hard and soft GPU shares on the
//! built-in MIG-capable cluster under static MIG layouts, MPS only and Tessera's
//! per-request choice with dynamic MIG (see `tessera_sim::experiment::isolation`).
//!
//! The workload is derived from `--trace DIR`'s `openb_pod_list_<--workload>.csv`
//! (default `default`), or from the built-in synthetic workload without `--trace`.
//! `--seeds` sets the fill orders averaged (default 5), `--policies` the one
//! placement policy of every arm (default bestfit), `--hard-pct` the share of
//! one-GPU shares asking hard isolation (default 50), `--json` writes the result.

use std::process::ExitCode;

use tessera_core::policy;
use tessera_sim::experiment::isolation::{
    IsolationConfig, builtin_cluster, derive_workload, run_isolation, table,
};
use tessera_sim::trace::openb;
use tessera_sim::workload as synthetic;

use super::{Fail, SimulateArgs, split};

pub(super) fn run(args: &SimulateArgs) -> Result<ExitCode, Fail> {
    let config_default = IsolationConfig::default();
    let policy = match args.policies.as_deref().map(split) {
        None => config_default.policy.clone(),
        Some(p) if p.len() == 1 && policy::NAMES.contains(&p[0].as_str()) => p[0].clone(),
        Some(p) => {
            return Err(Fail::Usage(format!(
                "--policies {}: the isolation experiment runs one known policy in every arm",
                p.join(",")
            )));
        }
    };
    let fill_seeds = args.seeds.unwrap_or(config_default.fill_seeds);
    if fill_seeds == 0 {
        return Err(Fail::Usage("--seeds must be at least 1".into()));
    }
    let (name, trace) = match &args.trace {
        Some(dir) => {
            let n = args.workload.clone().unwrap_or_else(|| "default".into());
            let path = dir.join(format!("openb_pod_list_{n}.csv"));
            if !path.exists() {
                return Err(Fail::Usage(format!(
                    "--workload {n}: {} does not exist",
                    path.display()
                )));
            }
            let catalog = tessera_core::model::Catalog::default();
            let pods = openb::load_pods(&path, &catalog).map_err(Fail::Trace)?;
            (format!("openb {n}"), pods)
        }
        None => (
            format!("{} (seed {})", synthetic::NAME, args.synthetic_seed),
            synthetic::generate(args.synthetic_seed).pods,
        ),
    };
    let config = IsolationConfig {
        policy,
        fill_seeds,
        hard_pct: args.hard_pct,
        ..config_default
    };
    let pods = derive_workload(&trace, config.seed, config.hard_pct);
    let result = run_isolation(&builtin_cluster(), &name, &pods, &config)
        .map_err(|e| Fail::Usage(e.to_string()))?;
    print!("{}", table(&result));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&result)
            .map_err(|e| Fail::Usage(format!("--json: {e}")))?;
        std::fs::write(path, text)
            .map_err(|e| Fail::Usage(format!("--json {}: {e}", path.display())))?;
    }
    Ok(ExitCode::SUCCESS)
}
