//! Where the unallocated GPU goes: failed GPU demand up to arrived = 100 %, by pod kind,
//! and the state of the GPUs at that point (idle GPUs, partly used GPUs' leftovers).
//!
//! `cargo run --release -p tessera-sim --example fill_debug -- [trace|vSEED] [policy] [seeds]`

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use tessera_core::Scheduler;
use tessera_core::ledger::Ledger;
use tessera_core::policy::tessera::{Tessera, TesseraParams};
use tessera_core::policy::{self, PolicyArgs, PolicyInputs};
use tessera_sim::experiment::fill::{
    FillConfig, arrival_order, permute_nodes, seeds, typical_pods,
};
use tessera_sim::trace::openb::{load_nodes, load_pods, read_pods};
use tessera_sim::variant::{Base, VariantMix};

/// Tessera's weights: the defaults, with `TP="multi_gpu_bands=0,quantum=80"` overrides.
fn params_from_env() -> Result<TesseraParams, Box<dyn std::error::Error>> {
    let mut p = TesseraParams::default();
    let Ok(spec) = std::env::var("TP") else {
        return Ok(p);
    };
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or("TP: expected name=value")?;
        let v: f64 = v.parse()?;
        match k {
            "quantum" => p.quantum = v,
            "multi_gpu_bands" => p.multi_gpu_bands = v,
            "pressure_weight" => p.pressure_weight = v,
            "cpu_counted" => p.cpu_counted = v != 0.0,
            other => return Err(format!("TP: unknown weight {other}").into()),
        }
    }
    Ok(p)
}

/// With `SHOW_IDLE` set: GPUs with at least this much free are listed by node state.
const HOLE: u32 = 300;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let trace = args.first().map_or("default", String::as_str);
    let policy_name = args.get(1).map_or("fgd", String::as_str);
    let n: u32 = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb");
    let cluster0 = load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    // `vN`: the generated variant of seed N (`tessera_sim::variant`), else a published trace.
    let pods = match trace.strip_prefix('v').and_then(|n| n.parse::<u64>().ok()) {
        Some(seed) => {
            let path = dir.join("openb_pod_list_default.csv");
            let base = Base::read(
                std::io::BufReader::new(std::fs::File::open(&path)?),
                &path.display().to_string(),
            )?;
            let csv = base.variant_csv(&VariantMix::for_seed(seed), seed);
            read_pods(csv.as_slice(), trace, &cluster0.catalog)?
        }
        None => load_pods(
            &dir.join(format!("openb_pod_list_{trace}.csv")),
            &cluster0.catalog,
        )?,
    };
    let config = FillConfig::for_workload(trace);
    let cap = cluster0.gpu_count() as u64 * 1000;
    let mut failed_by_kind: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let (mut idle_total, mut sliver_total, mut cpu_stranded) = (0u64, 0u64, 0u64);
    let mut hist: BTreeMap<u32, u64> = BTreeMap::new();
    // Leftovers in used GPUs by the node's GPU model.
    let mut by_model: BTreeMap<String, u64> = BTreeMap::new();
    let mut idle_nodes: BTreeMap<String, u32> = BTreeMap::new();
    // Share placements by ask (bucket of 100): on an idle GPU, leaving < 100 free, other.
    let mut share_landing: BTreeMap<u32, [u64; 3]> = BTreeMap::new();
    // Free GPU at the end by why it is left: no pod shape's per-GPU ask fits it, a shape
    // fits the GPU but not the node's free CPU, or it could still be used.
    let (mut no_shape, mut no_cpu, mut usable) = (0u64, 0u64, 0u64);
    let shapes: Vec<(u32, u64)> = pods
        .iter()
        .filter(|p| p.request.gpu.gpu_count() == 1)
        .map(|p| (p.request.gpu.milli_per_gpu(), p.request.cpu_milli))
        .collect();
    {
        // The model pressure Tessera derives from the typical pods, per model.
        let wl = typical_pods(&pods, config.typical_coverage);
        let gpm = policy::gpus_per_model(&cluster0);
        let pressure = tessera_core::policy::tessera::model_pressure(&wl, &gpm);
        print!("{trace}: model pressure (GPUs):");
        for (m, (&pr, &n)) in pressure.iter().zip(&gpm).enumerate() {
            if n > 0 {
                let name = &cluster0
                    .catalog
                    .spec(tessera_core::model::ModelId(m as u8))
                    .name;
                print!(" {name} {pr:.2} ({n})");
            }
        }
        println!();
    }
    for seed in seeds(n) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let order = arrival_order(&pods, cap, &config, &mut rng);
        let cluster = permute_nodes(&cluster0, &mut rng)?;
        let mut ledger = Ledger::new(&cluster);
        // Built, learned and rebuilt as the fill's driver does (`PolicyInputs`), Tessera
        // with the weights from the environment.
        let make = |a: PolicyArgs| -> Result<Box<dyn policy::Policy>, Box<dyn std::error::Error>> {
            Ok(if policy_name == "tessera" {
                Box::new(Tessera::new(
                    a.workload(),
                    &a.model_supply,
                    params_from_env()?,
                ))
            } else {
                policy::by_name(policy_name, &a)?
            })
        };
        let (mut inputs, policy) = PolicyInputs::start(
            make,
            Arc::new(typical_pods(&pods, config.typical_coverage)),
            || config.knowledge.learned(&pods, config.learn),
            &cluster,
            &ledger,
        )?;
        let mut sched = Scheduler::new(policy);
        let mut arrived = 0u64;
        for &i in &order {
            let req = &pods[i].request;
            arrived += req.gpu.total_milli();
            if arrived > cap {
                break;
            }
            if inputs.observe(req, &ledger) {
                sched = Scheduler::new(inputs.build(make)?);
            }
            match sched.place(&cluster, &ledger, req, &mut rng) {
                Some(p) => {
                    let per = req.gpu.milli_per_gpu();
                    if req.gpu.gpu_count() == 1 && per < 1000 {
                        let g = p.grants[0].gpu as usize;
                        let before = ledger.node(p.node).gpus[g].free_cores_milli;
                        let e = share_landing.entry(per / 100 * 100).or_default();
                        e[if before == 1000 {
                            0
                        } else if before - per < 100 {
                            1
                        } else {
                            2
                        }] += 1;
                    }
                    ledger.apply(&cluster, &p)?;
                }
                None => {
                    let kind = match req.gpu.gpu_count() {
                        0 => "cpu".to_string(),
                        1 if req.gpu.milli_per_gpu() < 1000 => {
                            format!("share{:04}", req.gpu.milli_per_gpu() / 100 * 100)
                        }
                        k => format!("whole{k}"),
                    };
                    let kind = match req.constraints.models.first() {
                        Some(m) => format!("{kind}@{m}"),
                        None => kind,
                    };
                    let e = failed_by_kind.entry(kind).or_default();
                    e.0 += 1;
                    e.1 += req.gpu.total_milli();
                }
            }
        }
        for (id, u) in cluster.ids().zip(ledger.nodes()) {
            let idle = u.gpus.iter().filter(|g| g.free_cores_milli >= HOLE).count();
            if idle > 0 && std::env::var_os("SHOW_IDLE").is_some() {
                let node = cluster.node(id);
                let model = node.primary_model().map_or("-".to_string(), |m| {
                    format!("{:?}", cluster.catalog.spec(m).name)
                });
                *idle_nodes
                    .entry(format!(
                        "{model} {}gpu free>={HOLE} {idle} cpu {:>3} mem {:>4}G",
                        node.gpus.len(),
                        u.free_cpu_milli / 1000,
                        u.free_memory_mib / 1024
                    ))
                    .or_default() += 1;
            }
            for g in &u.gpus {
                let f = g.free_cores_milli;
                if f > 0 {
                    let fits = shapes.iter().filter(|s| s.0 <= f);
                    let mut any = false;
                    let mut cpu_ok = false;
                    for s in fits {
                        any = true;
                        cpu_ok |= s.1 <= u.free_cpu_milli;
                    }
                    let slot = if !any {
                        &mut no_shape
                    } else if !cpu_ok {
                        &mut no_cpu
                    } else {
                        &mut usable
                    };
                    *slot += u64::from(f);
                }
                if g.free_cores_milli == 1000 {
                    idle_total += 1000;
                    if u.free_cpu_milli < 4000 {
                        cpu_stranded += 1000;
                    }
                } else {
                    let node = cluster.node(id);
                    let model = node
                        .primary_model()
                        .map_or("-".to_string(), |m| cluster.catalog.spec(m).name.clone());
                    *by_model.entry(model).or_default() += u64::from(g.free_cores_milli);
                    sliver_total += u64::from(g.free_cores_milli);
                    *hist.entry(g.free_cores_milli / 50 * 50).or_default() +=
                        u64::from(g.free_cores_milli);
                }
            }
        }
    }
    let nf = f64::from(n);
    println!("{trace} {policy_name}: per seed at arrived 100 %");
    for (k, (c, m)) in &failed_by_kind {
        println!(
            "  failed {k:>10}: {:7.1} pods {:7.1} GPUs",
            *c as f64 / nf,
            *m as f64 / 1000.0 / nf
        );
    }
    println!(
        "  idle GPUs {:.1} (of which on nodes with < 4 free CPUs: {:.1}), leftovers in used GPUs {:.1} GPUs",
        idle_total as f64 / 1000.0 / nf,
        cpu_stranded as f64 / 1000.0 / nf,
        sliver_total as f64 / 1000.0 / nf
    );
    println!(
        "  free GPU by cause: no shape fits the GPU {:.1}, shapes fit but not the CPU {:.1}, usable {:.1} GPUs",
        no_shape as f64 / 1000.0 / nf,
        no_cpu as f64 / 1000.0 / nf,
        usable as f64 / 1000.0 / nf
    );
    for (k, [idle, tight, other]) in &share_landing {
        println!(
            "  shares {k:04}: on idle GPU {:.1}, leaving < 100 free {:.1}, other {:.1}",
            *idle as f64 / nf,
            *tight as f64 / nf,
            *other as f64 / nf
        );
    }
    for (k, v) in &idle_nodes {
        println!("  idle on {k}: {v}");
    }
    let line: Vec<String> = hist
        .iter()
        .map(|(k, v)| format!("{k}:{:.1}", *v as f64 / 1000.0 / nf))
        .collect();
    println!(
        "  leftover GPUs by free milli (bucket of 50: GPUs of leftover): {}",
        line.join(" ")
    );
    print!("  leftovers in used GPUs by model (GPUs):");
    for (m, v) in &by_model {
        print!(" {m} {:.1}", *v as f64 / 1000.0 / nf);
    }
    println!();
    Ok(())
}
