//! Wall time of one fill run (single thread) on an openb trace.
//!
//! `cargo run --release -p tessera-sim --example fill_speed -- [trace] [policy] [seed] [repeats]`
//! (defaults: default fgd 42 3; `FILL_ONLINE=1`: the policy learns the workload online). Prints the best of the repeats and the run's result at 100 %.

use std::path::PathBuf;
use std::time::Instant;

use tessera_sim::experiment::fill::{FillConfig, run_fill};
use tessera_sim::trace::openb::{load_nodes, load_pods};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let trace = args.first().map_or("default", String::as_str);
    let policy = args.get(1).map_or("fgd", String::as_str);
    let seed: u64 = args.get(2).map_or(Ok(42), |s| s.parse())?;
    let repeats: u32 = args.get(3).map_or(Ok(3), |s| s.parse())?;
    let dir = std::env::var("OPENB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb")
        });
    let cluster = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    let pods = load_pods(
        &dir.join(format!("openb_pod_list_{trace}.csv")),
        &cluster.catalog,
    )?;
    let mut config = FillConfig::for_workload(trace);
    if std::env::var("FILL_ONLINE").is_ok_and(|v| v == "1") {
        config.knowledge = tessera_sim::experiment::fill::Knowledge::Online;
    }
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..repeats {
        let t = Instant::now();
        let r = run_fill(&cluster, &pods, policy, seed, &config)?;
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(r);
    }
    let r = last.ok_or("no run")?;
    println!(
        "{trace} {policy} seed {seed}: {} pods ({} placed, {} failed), best of {repeats}: {:.3} s; unallocated at 100%: {:.2} %",
        r.pods_submitted,
        r.pods_placed,
        r.pods_failed,
        best,
        r.at_100.map_or(f64::NAN, |p| p.unallocated_pct)
    );
    println!("arrived%  alloc%  frag_rate%  frag_amount%");
    for p in r.curve.iter().filter(|p| {
        [0.0, 25.0, 50.0, 70.0, 80.0, 90.0, 95.0, 100.0, 120.0].contains(&p.arrived_pct)
    }) {
        println!(
            "{:>8.0} {:>7.2} {:>11.2} {:>13.2}",
            p.arrived_pct, p.alloc_pct, p.frag_rate_pct, p.frag_amount_pct
        );
    }
    Ok(())
}
