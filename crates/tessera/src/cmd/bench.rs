//! `tessera bench`: decision-speed benchmarks that print figures.

use std::process::ExitCode;
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tessera_core::model::file::{nvswitch_links, pcie_links};
use tessera_core::model::{Catalog, Cluster, Node};
use tessera_core::policy::{self, PolicyArgs};
use tessera_core::request::{GpuAsk, GpuMemory, Isolation, Request};
use tessera_core::scheduler::Scheduler;
use tessera_core::{AllocId, Ledger};

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Placement decisions per second on a synthetic cluster.
    Placement(PlacementArgs),
    /// Extender filter + prioritize latency against N nodes.
    Extender(super::bench_extender::BenchExtenderArgs),
}

#[derive(Debug, clap::Args)]
pub struct PlacementArgs {
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    #[arg(long)]
    pub json: bool,
    /// Decisions to time after the cluster is 90 % full (each after releasing a random pod).
    #[arg(long, default_value_t = 100_000)]
    pub decisions: usize,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Placement(a) => placement(a),
        BenchCommand::Extender(a) => super::bench_extender::run(a),
    }
}

/// A synthetic cluster: `nodes` nodes of `gpus` GPUs, models in rotation
/// (H100 and A100 boxes on NVSwitch, L4 and T4 boxes on PCIe).
pub fn synthetic_cluster(nodes: usize, gpus: u32) -> anyhow::Result<Cluster> {
    let catalog = Catalog::default();
    let models = ["H100-80GB", "A100-80GB", "L4", "T4"];
    let ids: Vec<_> = models
        .iter()
        .map(|m| catalog.find(m))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| anyhow::anyhow!("built-in model missing"))?;
    let list = (0..nodes)
        .map(|i| {
            let kind = i % models.len();
            let mut n = Node::uniform(
                format!("node-{i:05}"),
                16_000 * u64::from(gpus),
                128 * 1024 * u64::from(gpus),
                ids[kind],
                gpus,
            );
            n.links = if kind < 2 {
                nvswitch_links(gpus as usize, 12)
            } else {
                pcie_links(gpus as usize)
            };
            n
        })
        .collect();
    Ok(Cluster::new(catalog, list)?)
}

/// The next request of the mixed stream: shares of one GPU, whole GPUs (1, 2, 4, 8),
/// memory-sized shares and CPU-only pods. CPU is proportional to the GPUs asked (as
/// in production traces); host memory varies freely (it is a filter, not a score input).
fn next_request(rng: &mut SmallRng) -> Request {
    let mem = [4096, 16_384, 32_768, 65_536][rng.random_range(0..4)];
    let roll = rng.random_range(0..100);
    let whole =
        |count: u32| Request::whole(count, 8_000 * u64::from(count), mem * u64::from(count));
    match roll {
        0..35 => Request::share_milli(
            [100, 200, 250, 300, 400, 500, 600, 700, 800][rng.random_range(0..9)],
            4_000,
            mem,
        ),
        35..65 => whole(1),
        65..75 => whole(2),
        75..80 => whole(4),
        80..83 => whole(8),
        83..90 => Request {
            gpu: GpuAsk::Shared {
                count: 1,
                memory: GpuMemory::Mib([8_000, 16_000][rng.random_range(0..2)]),
                cores_milli: [200, 300][rng.random_range(0..2)],
            },
            isolation: Isolation::Mps,
            ..Request::cpu_only(4_000, mem)
        },
        _ => Request::cpu_only(2_000, mem),
    }
}

/// Peak resident memory of this process in MiB (Linux), if known.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn placement(a: PlacementArgs) -> anyhow::Result<ExitCode> {
    if a.nodes == 0 || a.gpus_per_node == 0 || a.gpus_per_node > 64 {
        return super::bad_input("--nodes must be at least 1 and --gpus-per-node between 1 and 64");
    }
    let policy = match policy::by_name(&a.policy, &PolicyArgs::default()) {
        Ok(p) => p,
        Err(e) => return super::bad_input(format!("--policy: {e}")),
    };
    let cluster = synthetic_cluster(a.nodes, a.gpus_per_node)?;
    let mut ledger = Ledger::new(&cluster);
    let mut scheduler = Scheduler::new(policy);
    let mut rng = SmallRng::seed_from_u64(42);
    let mut live: Vec<AllocId> = Vec::new();
    let mut latencies_ns: Vec<u64> = Vec::new();
    let (mut placed, mut failed) = (0u64, 0u64);
    let mut explain_ns = 0u64;
    let capacity = cluster.gpu_count() as u64 * 1000;
    // Fill to 90 % of GPU capacity, then churn: release a random pod, place a new one.
    let churn = a.decisions.max(1);
    let mut churned = 0usize;
    let mut consecutive_failures = 0;
    while churned < churn {
        let filling = ledger.used_milli() * 10 < capacity * 9 && consecutive_failures < 50;
        if !filling && !live.is_empty() {
            let i = rng.random_range(0..live.len());
            ledger.release(live.swap_remove(i))?;
        }
        let req = next_request(&mut rng);
        // A decision is the placement; when nothing fits, the explanation (one filter
        // pass over every node) is timed on its own and reported beside it.
        let start = Instant::now();
        let decision = scheduler.place(&cluster, &ledger, &req, &mut rng);
        latencies_ns.push(start.elapsed().as_nanos() as u64);
        match decision {
            Some(p) => {
                live.push(ledger.apply(&cluster, &p)?);
                placed += 1;
                consecutive_failures = 0;
            }
            None => {
                let start = Instant::now();
                let e = scheduler.explain(&cluster, &ledger, &req, &mut rng);
                explain_ns += start.elapsed().as_nanos() as u64;
                std::hint::black_box(e);
                failed += 1;
                consecutive_failures += 1;
            }
        }
        if !filling {
            churned += 1;
        }
    }
    let total_ns: u64 = latencies_ns.iter().sum();
    let decisions = latencies_ns.len();
    latencies_ns.sort_unstable();
    let pct =
        |p: f64| latencies_ns[((decisions as f64 - 1.0) * p).round() as usize] as f64 / 1000.0;
    let report = serde_json::json!({
        "policy": a.policy,
        "nodes": a.nodes,
        "gpus": cluster.gpu_count(),
        "decisions": decisions,
        "placed": placed,
        "failed": failed,
        "gpu_allocated_pct": ledger.used_milli() as f64 * 100.0 / capacity as f64,
        "decisions_per_sec": decisions as f64 / (total_ns as f64 / 1e9),
        "mean_us": total_ns as f64 / decisions as f64 / 1000.0,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "max_us": pct(1.0),
        "unschedulable_explain_mean_us": if failed > 0 { explain_ns as f64 / failed as f64 / 1000.0 } else { 0.0 },
        "peak_rss_mib": peak_rss_mib(),
    });
    if a.json {
        println!("{report}");
    } else {
        println!(
            "policy {} on {} nodes / {} GPUs: {} decisions ({} placed, {} unschedulable), GPU allocated {:.1} %",
            a.policy,
            a.nodes,
            report["gpus"],
            decisions,
            placed,
            failed,
            report["gpu_allocated_pct"].as_f64().unwrap_or(0.0)
        );
        println!(
            "{:.0} decisions/s on one core; latency p50 {:.1} us, p99 {:.1} us, max {:.0} us; peak RSS {} MiB",
            report["decisions_per_sec"].as_f64().unwrap_or(0.0),
            report["p50_us"].as_f64().unwrap_or(0.0),
            report["p99_us"].as_f64().unwrap_or(0.0),
            report["max_us"].as_f64().unwrap_or(0.0),
            peak_rss_mib()
                .map(|m| format!("{m:.0}"))
                .unwrap_or_else(|| "?".into()),
        );
    }
    Ok(ExitCode::SUCCESS)
}
