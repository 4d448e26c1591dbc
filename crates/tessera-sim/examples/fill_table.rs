//! Reproduces the FGD paper's Table E: unallocated GPU % at arrived = 100 %, mean
//! over seeds, for each trace and policy, beside the published mean.
//!
//! `cargo run --release -p tessera-sim --example fill_table -- [--seeds N] [--traces a,b] [--policies p,q]`
//! Reads `../shared/data/openb` relative to the workspace root (or `OPENB_DIR`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use tessera_sim::experiment::fill::{FillConfig, run_fill_seeds, seeds};
use tessera_sim::metrics::mean_sd;
use tessera_sim::trace::openb::{WORKLOADS, load_nodes, load_pods};

const POLICIES: [(&str, &str); 6] = [
    ("random", "01-Random"),
    ("dotprod", "02-DotProd"),
    ("clustering", "03-GpuClustering"),
    ("packing", "04-GpuPacking"),
    ("bestfit", "05-BestFit"),
    ("fgd", "06-FGD"),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut n_seeds = 10;
    let mut traces: Vec<String> = WORKLOADS.iter().map(|s| s.to_string()).collect();
    let mut policies: Vec<String> = POLICIES.iter().map(|p| p.0.to_string()).collect();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seeds" => n_seeds = v.parse()?,
            "--traces" => traces = v.split(',').map(str::to_string).collect(),
            "--policies" => policies = v.split(',').map(str::to_string).collect(),
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 2;
    }
    let dir = std::env::var("OPENB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb")
        });
    let published = published(&dir.join("fgd-expected-results/analysis_allo_discrete.csv"))?;
    let cluster = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    println!("trace\tpolicy\tours_mean\tours_sd\tpub_mean\tpub_sd\tdiff_pp\tsecs");
    for t in &traces {
        let pods = load_pods(
            &dir.join(format!("openb_pod_list_{t}.csv")),
            &cluster.catalog,
        )?;
        let config = FillConfig::for_workload(t.clone());
        for p in &policies {
            let start = std::time::Instant::now();
            let results = run_fill_seeds(&cluster, &pods, p, &seeds(n_seeds), &config)?;
            let secs = start.elapsed().as_secs_f64();
            let un: Vec<f64> = results
                .iter()
                .filter_map(|r| r.at_100.map(|a| a.unallocated_pct))
                .collect();
            let (m, sd) = mean_sd(&un);
            let key = POLICIES
                .iter()
                .find(|x| x.0 == p)
                .map(|x| x.1)
                .unwrap_or("");
            let (pm, psd) = published
                .get(&(t.clone(), key.to_string()))
                .map(|v| mean_sd(v))
                .unwrap_or((f64::NAN, f64::NAN));
            println!(
                "{t}\t{p}\t{m:.2}\t{sd:.2}\t{pm:.2}\t{psd:.2}\t{:+.2}\t{secs:.1}",
                m - pm
            );
        }
    }
    Ok(())
}

/// Unallocated % at arrived 100 for each seed, by (trace, policy label).
type Published = BTreeMap<(String, String), Vec<f64>>;

/// The authors' numbers from their merged table.
fn published(path: &std::path::Path) -> Result<Published, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty")?.split(',').collect();
    let col = header
        .iter()
        .position(|h| *h == "100")
        .ok_or("no 100 column")?;
    let mut out: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        let trace = f[0].trim_start_matches("openb_pod_list_").to_string();
        let v: f64 = f[col].parse()?;
        out.entry((trace, f[1].to_string()))
            .or_default()
            .push(100.0 - v);
    }
    Ok(out)
}
