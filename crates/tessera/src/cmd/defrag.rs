//! `tessera defrag --dry-run`: plan the moves that make pending pods fit, on a
//! fill snapshot (the built-in synthetic cluster, or an openb trace with
//! `--trace DIR --workload NAME`, filled by `--policy` to `--fill-pct` % of its
//! GPU capacity), and print the plan with its expected gain.
//!
//! The snapshot's pods get disruption rules drawn from `--seed` as the defrag
//! experiment does (a share pinned, a share not preemptible, half the rest in
//! PodDisruptionBudgets). Executing a plan means evictions through the
//! Kubernetes API by the scheduler; this command only plans, so `--dry-run` is
//! required and saying so is explicit.

use std::path::PathBuf;
use std::process::ExitCode;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde_json::json;
use tessera_core::queue::defrag::{self, Context, Limits, Plan};
use tessera_core::request::Request;
use tessera_core::{Cluster, Placement};
use tessera_sim::experiment::defrag::{DefragConfig, World, prepare};

use super::place::request_from_pairs;
use super::simulate_gang::load;

#[derive(Debug, clap::Args)]
pub struct DefragArgs {
    /// Only plan and print (required: executing a plan is the scheduler's job,
    /// through the eviction API).
    #[arg(long)]
    pub dry_run: bool,
    /// Directory with the openb CSVs. Without it: the built-in synthetic workload.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The openb pod list to fill with (default: default).
    #[arg(long)]
    pub workload: Option<String>,
    /// Seed of the built-in synthetic workload.
    #[arg(long, default_value_t = 42)]
    pub synthetic_seed: u64,
    /// Policy of the fill that makes the snapshot (random scatters pods).
    #[arg(long, default_value = "random")]
    pub policy: String,
    /// Share of the GPU capacity that has arrived when the fill stops (%).
    #[arg(long, default_value_t = 70.0)]
    pub fill_pct: f64,
    /// Seed of the fill and of the pods' disruption rules.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// A pending pod, as for `tessera place --request` (repeatable).
    #[arg(long, default_values_t = ["gpu=8,cpu=8000,memory=32768".to_string()])]
    pub pending: Vec<String>,
    /// Copies of each pending pod.
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// Share of pods with the do-not-disturb annotation (%).
    #[arg(long, default_value_t = 5)]
    pub pinned_pct: u32,
    /// Share of pods that are not preemptible (%).
    #[arg(long, default_value_t = 5)]
    pub fixed_pct: u32,
    /// PodDisruptionBudgets half the other pods count against.
    #[arg(long, default_value_t = 20)]
    pub budgets: u32,
    /// Disruptions each budget allows.
    #[arg(long, default_value_t = 2)]
    pub disruptions_allowed: u32,
    /// Most evictions for one pending pod.
    #[arg(long, default_value_t = 16)]
    pub max_moves_per_pod: usize,
    /// Most evictions in the plan.
    #[arg(long, default_value_t = 64)]
    pub max_moves: usize,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

fn usage(message: impl std::fmt::Display) -> anyhow::Result<ExitCode> {
    eprintln!("tessera defrag: {message}");
    Ok(ExitCode::from(super::EXIT_BAD_CONFIG))
}

pub fn run(args: DefragArgs) -> anyhow::Result<ExitCode> {
    if !args.dry_run {
        return usage(
            "only --dry-run is available here: a plan is executed by the scheduler in the \
             cluster, through the eviction API",
        );
    }
    if !(args.fill_pct.is_finite() && args.fill_pct > 0.0) {
        return usage(format!(
            "--fill-pct {}: must be a positive number",
            args.fill_pct
        ));
    }
    if !tessera_core::policy::NAMES.contains(&args.policy.as_str()) {
        return usage(format!(
            "--policy: unknown policy {:?} (known: {})",
            args.policy,
            tessera_core::policy::NAMES.join(", ")
        ));
    }
    let loaded = match load(
        args.trace.as_deref(),
        args.workload.as_deref(),
        args.synthetic_seed,
    ) {
        Ok(l) => l,
        Err((m, code)) => {
            eprintln!("tessera defrag: {m}");
            return Ok(ExitCode::from(code));
        }
    };
    let mut pending: Vec<Request> = Vec::new();
    for spec in &args.pending {
        match request_from_pairs(spec, &loaded.cluster) {
            Ok(r) => pending.extend(std::iter::repeat_n(r, args.count)),
            Err(e) => return super::bad_input(format!("--pending {spec}: {e}")),
        }
    }
    let config = DefragConfig {
        fill_pct: args.fill_pct,
        pinned_pct: args.pinned_pct,
        fixed_pct: args.fixed_pct,
        budgets: args.budgets,
        disruptions_allowed: args.disruptions_allowed,
        max_moves_per_pod: args.max_moves_per_pod,
        ..DefragConfig::default()
    };
    let mut world = match prepare(
        &loaded.cluster,
        &loaded.pods,
        &loaded.name,
        &args.policy,
        &config,
        args.seed,
    ) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("tessera defrag: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let limits = Limits {
        max_moves_per_pod: args.max_moves_per_pod,
        max_moves: args.max_moves,
    };
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let ctx = Context {
        cluster: &world.cluster,
        ledger: &world.ledger,
        running: &world.running,
        requests: &world.requests,
        budgets: &world.budgets,
    };
    let plan = defrag::plan(&mut world.scheduler, &ctx, &pending, &limits, &mut rng)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan_json(&world, &pending, &plan))?
        );
    } else {
        print!("{}", render(&world, &loaded.name, &args, &pending, &plan));
    }
    Ok(ExitCode::SUCCESS)
}

fn gpus(p: &Placement) -> String {
    let ids: Vec<String> = p.grants.iter().map(|g| g.gpu.to_string()).collect();
    match ids.len() {
        0 => "no GPU".into(),
        1 => format!("GPU {}", ids[0]),
        _ => format!("GPUs {}", ids.join(",")),
    }
}

fn node(c: &Cluster, p: &Placement) -> String {
    c.node(p.node).name.clone()
}

fn render(
    w: &World,
    workload: &str,
    args: &DefragArgs,
    pending: &[Request],
    plan: &Plan,
) -> String {
    let c = &w.cluster;
    let allocated: usize = w
        .ledger
        .nodes()
        .iter()
        .map(|n| n.gpus.iter().filter(|g| !g.is_idle()).count())
        .sum();
    let mut out = format!(
        "dry run on {workload}, filled with {} to {} % arrived (seed {}): {} of {} GPUs allocated, {} pods running\n",
        args.policy,
        args.fill_pct,
        args.seed,
        allocated,
        c.gpu_count(),
        w.ledger.allocation_count()
    );
    for step in &plan.steps {
        let req = &pending[step.pending];
        if step.moves.is_empty() {
            out.push_str(&format!(
                "pending {} ({req}): fits as is on {} {}\n",
                step.pending,
                node(c, &step.placement),
                gpus(&step.placement)
            ));
            continue;
        }
        out.push_str(&format!(
            "pending {} ({req}): {} move(s), then {} {}\n",
            step.pending,
            step.moves.len(),
            node(c, &step.placement),
            gpus(&step.placement)
        ));
        for mv in &step.moves {
            let name = w.names.get(&mv.pod).map_or("?", String::as_str);
            let what = w
                .requests
                .get(&mv.pod)
                .map_or_else(String::new, |r| format!(" ({r})"));
            out.push_str(&format!(
                "  evict {name}{what} from {} -> re-created on {} {}\n",
                c.node(mv.from).name,
                node(c, &mv.to),
                gpus(&mv.to)
            ));
        }
    }
    for &i in &plan.unplaced {
        out.push_str(&format!(
            "pending {i} ({}): no allowed moves make it fit\n",
            pending[i]
        ));
    }
    let g = &plan.gain;
    out.push_str(&format!(
        "expected gain: {}/{} pending pods fit (before: {}), {:.1} GPUs placed, {} node(s) emptied by {} move(s)\n",
        g.pending_fit_after,
        pending.len(),
        g.pending_fit_before,
        g.gpu_milli_placed as f64 / 1000.0,
        g.nodes_freed,
        g.moves
    ));
    out
}

fn plan_json(w: &World, pending: &[Request], plan: &Plan) -> serde_json::Value {
    let c = &w.cluster;
    let place = |p: &Placement| {
        json!({
            "node": node(c, p),
            "gpus": p.grants.iter().map(|g| g.gpu).collect::<Vec<_>>(),
        })
    };
    json!({
        "steps": plan.steps.iter().map(|s| json!({
            "pending": s.pending,
            "request": pending[s.pending].to_string(),
            "placement": place(&s.placement),
            "moves": s.moves.iter().map(|m| json!({
                "pod": w.names.get(&m.pod),
                "from": c.node(m.from).name,
                "to": place(&m.to),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "unplaced": plan.unplaced,
        "gain": {
            "pendingFitBefore": plan.gain.pending_fit_before,
            "pendingFitAfter": plan.gain.pending_fit_after,
            "gpuMilliPlaced": plan.gain.gpu_milli_placed,
            "nodesFreed": plan.gain.nodes_freed,
            "moves": plan.gain.moves,
        },
    })
}
