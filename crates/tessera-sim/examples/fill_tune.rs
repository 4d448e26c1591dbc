//! Tries weights of the `tessera` policy against FGD on a few traces (mean unallocated
//! GPU % at arrived = 100 %).
//!
//! `cargo run --release -p tessera-sim --example fill_tune -- --seeds 3 --traces default,gpuspec33 --quantum 100 --pressure 1 --multi-cap 0.006 --share-q-scale 0.285 --fgd`
//! (weights default to [`TesseraParams::default`]; the workload to every pod shape, `--coverage 1.0`).
//! `--traces all` runs the 17 openb traces. With `--fgd`, FGD's mean per trace and seed
//! count is computed once and cached in the system temp folder (`fill_tune_fgd_*.txt`);
//! the last line sums up: mean relative difference, worst trace, traces not better.

use std::path::PathBuf;

use rayon::prelude::*;
use tessera_core::policy::tessera::{Tessera, TesseraParams};
use tessera_sim::experiment::fill::{FillConfig, run_fill, run_fill_with, seeds, typical_pods};
use tessera_sim::metrics::mean_sd;
use tessera_sim::trace::openb::{WORKLOADS, load_nodes, load_pods};

/// FGD's mean for a trace, cached under the system temp folder (FGD does not change).
fn fgd_mean(
    t: &str,
    n_seeds: u32,
    run: impl FnOnce() -> Result<f64, Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("fill_tune_fgd_{t}_{n_seeds}.txt"));
    if let Ok(s) = std::fs::read_to_string(&path)
        && let Ok(v) = s.trim().parse()
    {
        return Ok(v);
    }
    let v = run()?;
    std::fs::write(&path, format!("{v}"))?;
    Ok(v)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut n_seeds = 3;
    let mut traces: Vec<String> = vec!["default".into()];
    let mut params = TesseraParams::default();
    let mut with_fgd = false;
    let mut coverage = 1.0;
    let mut gpu_weight = 0.0;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seeds" => n_seeds = v.parse()?,
            "--traces" => traces = v.split(',').map(str::to_string).collect(),
            "--quantum" => params.quantum = v.parse()?,
            "--pressure" => params.pressure_weight = v.parse()?,
            "--coverage" => coverage = v.parse()?,
            "--gpu-weight" => gpu_weight = v.parse()?,
            "--gtight" => params.gpu_tight_weight = v.parse()?,
            "--cpupod" => params.cpu_pod_weight = v.parse()?,
            "--topo" => params.topology_weight = v.parse()?,
            "--multi-cap" => params.multi_gpu_cap = v.parse()?,
            "--share-q-scale" => params.share_quantum_scale = v.parse()?,
            "--count-inaccessible" => {
                params.count_inaccessible = true;
                i += 1;
                continue;
            }
            "--fgd" => {
                with_fgd = true;
                i += 1;
                continue;
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 2;
    }
    if traces == ["all"] {
        traces = WORKLOADS.iter().map(|s| s.to_string()).collect();
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb");
    let cluster = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    let mut total = (0.0, 0.0);
    let mut rels: Vec<f64> = Vec::new();
    for t in &traces {
        let pods = load_pods(
            &dir.join(format!("openb_pod_list_{t}.csv")),
            &cluster.catalog,
        )?;
        let config = FillConfig::for_workload(t.clone());
        let ours: Vec<f64> = seeds(n_seeds)
            .par_iter()
            .map(|&s| {
                run_fill_with(
                    &cluster,
                    &pods,
                    "tessera",
                    |_| {
                        let mut wl = typical_pods(&pods, coverage);
                        for p in &mut wl.pods {
                            p.weight *=
                                1.0 + f64::from(p.gpus) * f64::from(p.milli) / 1000.0 * gpu_weight;
                        }
                        let sum: f64 = wl.pods.iter().map(|p| p.weight).sum();
                        for p in &mut wl.pods {
                            p.weight /= sum;
                        }
                        Ok(Box::new(Tessera::for_cluster(
                            std::sync::Arc::new(wl),
                            params,
                            &cluster,
                        )))
                    },
                    s,
                    &config,
                )
                .map(|r| r.at_100.map_or(f64::NAN, |p| p.unallocated_pct))
            })
            .collect::<Result<_, _>>()?;
        let (m, sd) = mean_sd(&ours);
        total.0 += m;
        if with_fgd {
            let fm = fgd_mean(t, n_seeds, || {
                let fgd: Vec<f64> = seeds(n_seeds)
                    .par_iter()
                    .map(|&s| {
                        run_fill(&cluster, &pods, "fgd", s, &config)
                            .map(|r| r.at_100.map_or(f64::NAN, |p| p.unallocated_pct))
                    })
                    .collect::<Result<_, _>>()?;
                Ok(mean_sd(&fgd).0)
            })?;
            total.1 += fm;
            let rel = (m - fm) / fm * 100.0;
            rels.push(rel);
            println!("{t}\ttessera {m:.2} ± {sd:.2}\tfgd {fm:.2}\t{rel:+.1} %");
        } else {
            println!("{t}\ttessera {m:.2} ± {sd:.2}");
        }
    }
    if !rels.is_empty() {
        let worse = rels.iter().filter(|&&r| r >= 0.0).count();
        let worst = rels.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!(
            "mean rel {:+.2} %  worst {worst:+.2} %  not better on {worse}/{}",
            rels.iter().sum::<f64>() / rels.len() as f64,
            rels.len()
        );
    }
    println!("sum\t{:.2}\t{:.2}\t{params:?}", total.0, total.1);
    Ok(())
}
