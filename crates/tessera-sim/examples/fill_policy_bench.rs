//! A quick check of a policy's decision speed on a large synthetic cluster (the same
//! shape as `tessera bench placement`: 10,000 nodes × 8 GPUs, filled to 90 %, then churn:
//! release a random pod, place a new one). Prints decisions/s and latency percentiles.
//!
//! `cargo run --release -p tessera-sim --example fill_policy_bench -- [policy] [decisions]`

use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tessera_core::model::{Catalog, Cluster, Node};
use tessera_core::policy::{self, PolicyArgs};
use tessera_core::request::Request;
use tessera_core::scheduler::Scheduler;
use tessera_core::{AllocId, Ledger};

fn next_request(rng: &mut SmallRng) -> Request {
    let mem = [4096, 16_384, 32_768, 65_536][rng.random_range(0..4)];
    let whole =
        |count: u32| Request::whole(count, 8_000 * u64::from(count), mem * u64::from(count));
    match rng.random_range(0..100) {
        0..42 => Request::share_milli(
            [100, 200, 250, 300, 400, 500, 600, 700, 800][rng.random_range(0..9)],
            4_000,
            mem,
        ),
        42..72 => whole(1),
        72..82 => whole(2),
        82..87 => whole(4),
        87..90 => whole(8),
        _ => Request::cpu_only(2_000, mem),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map_or("tessera", String::as_str);
    let churn: usize = args.get(1).map_or(Ok(20_000), |s| s.parse())?;
    let catalog = Catalog::default();
    let models: Vec<_> = ["H100-80GB", "A100-80GB", "L4", "T4"]
        .iter()
        .map(|m| catalog.find(m).ok_or("model"))
        .collect::<Result<_, _>>()?;
    let nodes = (0..10_000)
        .map(|i| Node::uniform(format!("node-{i:05}"), 128_000, 1 << 20, models[i % 4], 8))
        .collect();
    let cluster = Cluster::new(catalog, nodes)?;
    let mut ledger = Ledger::new(&cluster);
    let mut scheduler = Scheduler::new(policy::by_name(name, &PolicyArgs::default())?);
    let mut rng = SmallRng::seed_from_u64(42);
    let capacity = cluster.gpu_count() as u64 * 1000;
    let mut live: Vec<AllocId> = Vec::new();
    let mut lat_ns: Vec<u64> = Vec::new();
    let (mut churned, mut fails) = (0usize, 0usize);
    while churned < churn {
        let filling = ledger.used_milli() * 10 < capacity * 9 && fails < 50;
        if !filling && !live.is_empty() {
            let i = rng.random_range(0..live.len());
            ledger.release(live.swap_remove(i))?;
        }
        let req = next_request(&mut rng);
        let t = Instant::now();
        let p = scheduler.place(&cluster, &ledger, &req, &mut rng);
        let ns = t.elapsed().as_nanos() as u64;
        match p {
            Some(p) => {
                live.push(ledger.apply(&cluster, &p)?);
                fails = 0;
            }
            None => fails += 1,
        }
        if !filling {
            lat_ns.push(ns);
            churned += 1;
        }
    }
    let total: u64 = lat_ns.iter().sum();
    lat_ns.sort_unstable();
    let pct = |p: f64| lat_ns[((lat_ns.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0;
    println!(
        "{name}: {} churn decisions at ~90 % full: {:.0} decisions/s, p50 {:.1} us, p99 {:.1} us, max {:.0} us",
        lat_ns.len(),
        lat_ns.len() as f64 / (total as f64 / 1e9),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    Ok(())
}
