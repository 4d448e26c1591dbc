//! Tessera against FGD on the published openb traces and on generated variants: the
//! tuning and reporting tool of `docs/simulator.md` ("Tuning protocol").
//!
//! ```sh
//! cargo run --release -p tessera-sim --example fill_generalise -- \
//!     --set published[:cpu250,default]|variants:100-119 [--seeds 10] [--online] [--off TERM]... [--set-param k=v]...
//! ```
//!
//! Prints one line per workload (Tessera and FGD mean ± sd of unallocated GPU % at
//! arrived = 100 %, the ratio) and a summary: geometric mean of the ratios, workloads
//! where Tessera is behind, and behind by more than one (pooled) seed sd. FGD always gets
//! the trace's typical pods (the published protocol); `--online` gives Tessera only what
//! it learns from arrivals. FGD's results are cached under `$FGD_CACHE` (default: the
//! system temp folder). `--prior-mass`, `--half-life`, `--rebuild-distance` set how
//! Tessera learns. Terms for `--off`: bands, share-bands, pressure, models-ignored
//! (count only the shapes the node's model allows), accessible (count the others as
//! FGD does), cpu-counted, topology, multi-cap, generic (no generic shapes),
//! free-supply (pressure against the inventory).

use std::path::PathBuf;

use rayon::prelude::*;
use tessera_core::policy::tessera::{ShapeModels, Tessera, TesseraParams};
use tessera_core::policy::{PolicyArgs, gpus_per_model};
use tessera_sim::experiment::fill::{FillConfig, Knowledge, run_fill, run_fill_with, seeds};
use tessera_sim::metrics::mean_sd;
use tessera_sim::trace::TracePod;
use tessera_sim::trace::openb::{WORKLOADS, load_nodes, load_pods, read_pods};
use tessera_sim::variant::{Base, VariantMix};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn switch_off(p: &mut TesseraParams, term: &str) -> Result<(), Error> {
    match term {
        "bands" => p.quantum = 0.0,
        "share-bands" => p.share_quantum_scale = 0.0,
        "pressure" => p.pressure_weight = 0.0,
        "models-ignored" => p.shape_models = ShapeModels::Accessible,
        "accessible" => p.shape_models = ShapeModels::ExcludedAsIdle,
        "cpu-counted" => p.cpu_counted = false,
        "topology" => p.topology_weight = 0.0,
        "multi-cap" => p.multi_gpu_bands = 0.0,
        "generic" => p.generic_share = 0.0,
        other => return Err(format!("unknown term {other}").into()),
    }
    Ok(())
}

fn set_param(p: &mut TesseraParams, kv: &str) -> Result<(), Error> {
    let (k, v) = kv.split_once('=').ok_or("--set-param wants k=v")?;
    let v: f64 = v.parse()?;
    match k {
        "quantum" => p.quantum = v,
        "share_quantum_scale" => p.share_quantum_scale = v,
        "pressure_weight" => p.pressure_weight = v,
        "pressure_exponent" => p.pressure_exponent = v,
        "topology_weight" => p.topology_weight = v,
        "multi_gpu_bands" => p.multi_gpu_bands = v,
        "cpu_counted" => p.cpu_counted = v != 0.0,
        "generic_share" => p.generic_share = v,
        other => return Err(format!("unknown parameter {other}").into()),
    }
    Ok(())
}

fn at_100(r: &tessera_sim::experiment::fill::FillResult) -> f64 {
    r.at_100.map_or(f64::NAN, |p| p.unallocated_pct)
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut set = "published".to_string();
    let mut n_seeds = 10;
    let mut online = false;
    // `--off free-supply`: model pressure against the inventory, as before it followed the free GPUs.
    let mut inventory_supply = false;
    let mut params = TesseraParams::default();
    let mut learn = tessera_core::workload::LearnConfig::default();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--set" => set = v,
            "--seeds" => n_seeds = v.parse()?,
            "--off" if v == "free-supply" => inventory_supply = true,
            "--off" => switch_off(&mut params, &v)?,
            "--set-param" => set_param(&mut params, &v)?,
            "--prior-mass" => learn.prior_mass = v.parse()?,
            "--half-life" => learn.half_life_arrivals = v.parse()?,
            "--rebuild-distance" => learn.rebuild_distance = v.parse()?,
            "--online" => {
                online = true;
                i += 1;
                continue;
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 2;
    }
    let dir = std::env::var("OPENB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb")
        });
    let cache = std::env::var("FGD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let cluster = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    let mut workloads: Vec<(String, Vec<TracePod>)> = Vec::new();
    if let Some(names) = set
        .strip_prefix("published")
        .map(|r| r.trim_start_matches(':'))
    {
        let wanted: Vec<&str> = names.split(',').filter(|n| !n.is_empty()).collect();
        if let Some(bad) = wanted.iter().find(|n| !WORKLOADS.contains(n)) {
            return Err(format!("unknown published trace {bad}").into());
        }
        for t in WORKLOADS
            .iter()
            .filter(|t| wanted.is_empty() || wanted.contains(t))
        {
            let path = dir.join(format!("openb_pod_list_{t}.csv"));
            workloads.push((t.to_string(), load_pods(&path, &cluster.catalog)?));
        }
    } else if let Some(range) = set.strip_prefix("variants:") {
        let (a, b) = range.split_once('-').ok_or("variants:FIRST-LAST")?;
        let (a, b): (u64, u64) = (a.parse()?, b.parse()?);
        let path = dir.join("openb_pod_list_default.csv");
        let base = Base::read(
            std::io::BufReader::new(std::fs::File::open(&path)?),
            &path.display().to_string(),
        )?;
        for s in a..=b {
            let mix = VariantMix::for_seed(s);
            let csv = base.variant_csv(&mix, s);
            let name = format!("v{s}:{}", mix.label());
            let pods = read_pods(csv.as_slice(), &name, &cluster.catalog)?;
            workloads.push((name, pods));
        }
    } else {
        return Err(format!("unknown set {set}").into());
    }
    let gpus = gpus_per_model(&cluster);
    let seeds = seeds(n_seeds);
    let jobs: Vec<(usize, u64)> = (0..workloads.len())
        .flat_map(|w| seeds.iter().map(move |&s| (w, s)))
        .collect();
    let ours: Vec<f64> = jobs
        .par_iter()
        .map(|&(w, s)| -> Result<f64, Error> {
            let (name, pods) = &workloads[w];
            let mut config = FillConfig::for_workload(name.clone());
            config.learn = learn;
            if online {
                config.knowledge = Knowledge::Online;
            }
            let r = run_fill_with(
                &cluster,
                pods,
                "tessera",
                |a: PolicyArgs| {
                    let supply = if inventory_supply {
                        &gpus
                    } else {
                        &a.model_supply
                    };
                    Ok(Box::new(Tessera::new(a.workload(), supply, params)))
                },
                s,
                &config,
            )?;
            Ok(at_100(&r))
        })
        .collect::<Result<_, _>>()?;
    let fgd: Vec<f64> = jobs
        .par_iter()
        .map(|&(w, s)| -> Result<f64, Error> {
            let (name, pods) = &workloads[w];
            let key: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let path = cache.join(format!("fill_generalise_fgd_{key}_{s}.txt"));
            if let Ok(t) = std::fs::read_to_string(&path)
                && let Ok(v) = t.trim().parse()
            {
                return Ok(v);
            }
            let r = run_fill(
                &cluster,
                pods,
                "fgd",
                s,
                &FillConfig::for_workload(name.clone()),
            )?;
            let v = at_100(&r);
            std::fs::write(&path, format!("{v}"))?;
            Ok(v)
        })
        .collect::<Result<_, _>>()?;
    let n = seeds.len();
    let (mut log_sum, mut behind, mut behind_sd, mut worst) = (0.0, 0, 0, f64::NEG_INFINITY);
    for (w, (name, _)) in workloads.iter().enumerate() {
        let (mt, st) = mean_sd(&ours[w * n..(w + 1) * n]);
        let (mf, sf) = mean_sd(&fgd[w * n..(w + 1) * n]);
        let ratio = mt / mf;
        log_sum += ratio.ln();
        worst = worst.max(ratio);
        let pooled = ((st * st + sf * sf) / 2.0).sqrt();
        behind += usize::from(mt >= mf);
        behind_sd += usize::from(mt - mf > pooled);
        println!("{name}\ttessera {mt:.2} ± {st:.2}\tfgd {mf:.2} ± {sf:.2}\tratio {ratio:.3}");
    }
    println!(
        "geomean {:.3}  worst {worst:.3}  not ahead on {behind}/{}  behind by > 1 sd on {behind_sd}",
        (log_sum / workloads.len() as f64).exp(),
        workloads.len()
    );
    Ok(())
}
