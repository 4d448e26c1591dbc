//! The federation experiment's table without the CLI (same library call as
//! `tessera simulate --experiment federation`), for release-mode runs that need only
//! the core and the simulator built.
//!
//! `cargo run --release -p tessera-sim --example federation_table -- [--dir DIR] [--workloads a,b|synthetic|variant-N] [--seeds N] [--limit L] [--batch B] [--json FILE]`
//! `--dir` defaults to `../shared/data/openb` from the workspace root (or `OPENB_DIR`).

use std::path::PathBuf;

use tessera_sim::experiment::federation::{FederationConfig, render_table, run_federation_seeds};
use tessera_sim::experiment::fill::seeds;
use tessera_sim::trace::openb::{load_nodes, load_pods, read_pods};
use tessera_sim::variant::{Base, VariantMix};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut n_seeds = 10;
    let mut workloads = vec!["default".to_string()];
    let mut dir = std::env::var("OPENB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb")
        });
    let mut config = FederationConfig::default();
    let mut json = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seeds" => n_seeds = v.parse()?,
            "--workloads" => workloads = v.split(',').map(str::to_string).collect(),
            "--dir" => dir = PathBuf::from(v),
            "--limit" => config.limit = v.parse()?,
            "--batch" => config.batch = v.parse()?,
            "--json" => json = Some(PathBuf::from(v)),
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 2;
    }
    let seeds = seeds(n_seeds);
    let mut reports = Vec::new();
    for w in &workloads {
        let start = std::time::Instant::now();
        let (cluster, pods) = if w == "synthetic" {
            let s = tessera_sim::workload::generate(42);
            (s.cluster, s.pods)
        } else if let Some(seed) = w.strip_prefix("variant-") {
            // A generated variant, as `tessera trace variant --seed N` writes it.
            let seed: u64 = seed.parse()?;
            let cluster = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
            let default = dir.join("openb_pod_list_default.csv");
            let base = Base::read(
                std::io::BufReader::new(std::fs::File::open(&default)?),
                "default",
            )?;
            let mut csv = Vec::new();
            base.write_variant(&VariantMix::for_seed(seed), seed, &mut csv)?;
            let pods = read_pods(&csv[..], w, &cluster.catalog)?;
            (cluster, pods)
        } else {
            let cluster = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
            let pods = load_pods(
                &dir.join(format!("openb_pod_list_{w}.csv")),
                &cluster.catalog,
            )?;
            (cluster, pods)
        };
        let r = run_federation_seeds(w, &cluster, &pods, &seeds, &config, &|| {})?;
        print!("{}", render_table(std::slice::from_ref(&r)));
        eprintln!("({w}: {:.1} s)", start.elapsed().as_secs_f64());
        reports.push(r);
    }
    println!("---");
    print!("{}", render_table(&reports));
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)? + "\n")?;
    }
    Ok(())
}
