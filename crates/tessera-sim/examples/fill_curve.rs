//! Mean unallocated GPU % of `fgd` and `tessera` at arrived = 80…100 %, to see where
//! the two part ways on one trace.
//!
//! `cargo run --release -p tessera-sim --example fill_curve -- [trace] [seeds]`

use std::path::PathBuf;

use rayon::prelude::*;
use tessera_sim::experiment::fill::{FillConfig, run_fill, seeds};
use tessera_sim::trace::openb::{load_nodes, load_pods};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let trace = args.first().map_or("default", String::as_str);
    let n: u32 = args.get(1).map_or(Ok(10), |s| s.parse())?;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb");
    let cluster = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    let pods = load_pods(
        &dir.join(format!("openb_pod_list_{trace}.csv")),
        &cluster.catalog,
    )?;
    let config = FillConfig::for_workload(trace);
    let cols: Vec<f64> = (80..=100).step_by(2).map(f64::from).collect();
    for policy in ["fgd", "tessera"] {
        let runs: Vec<_> = seeds(n)
            .par_iter()
            .map(|&s| run_fill(&cluster, &pods, policy, s, &config))
            .collect::<Result<_, _>>()?;
        let line: Vec<String> = cols
            .iter()
            .map(|&c| {
                let v: Vec<f64> = runs
                    .iter()
                    .filter_map(|r| r.curve.iter().find(|p| p.arrived_pct == c))
                    .map(|p| p.unallocated_pct - (100.0 - c))
                    .collect();
                format!("{c}:{:.2}", v.iter().sum::<f64>() / v.len().max(1) as f64)
            })
            .collect();
        println!(
            "{policy:8} failed % of capacity at arrived: {}",
            line.join(" ")
        );
    }
    Ok(())
}
