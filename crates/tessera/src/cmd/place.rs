//! `tessera place`: place one request on a cluster (an openb node list, a YAML
//! cluster file or the built-in demo) and print the decision with its score
//! breakdown, or the sentence saying why nothing fits.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rand::SeedableRng;
use tessera_core::model::file::ClusterFile;
use tessera_core::model::{Cluster, demo};
use tessera_core::policy::{self, PolicyArgs};
use tessera_core::request::{self, Request, RequestError};
use tessera_core::scheduler::{Decision, Scheduler};
use tessera_core::{Ledger, Placement};

#[derive(Debug, clap::Args)]
pub struct PlaceArgs {
    /// The request: comma-separated key=value pairs. Keys: gpu (count), gpu-memory (MiB per GPU),
    /// gpu-cores (per cent of each GPU), gpu-milli (per-mille of each GPU), mig (profile, e.g. 1g.10gb),
    /// model (allow-list joined with |), cpu (milli), memory (MiB), isolation, topology, uuids.
    #[arg(long, short)]
    pub request: String,
    /// Cluster: an openb node list (.csv) or a YAML/JSON cluster file. Default: the built-in demo cluster.
    #[arg(long)]
    pub nodes: Option<PathBuf>,
    /// Placement policy.
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    /// Also list the best N nodes with their scores.
    #[arg(long, default_value_t = 3)]
    pub top: usize,
    /// Print the decision as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Turns `gpu=1,gpu-memory=20000` into resource and annotation pairs for the core parser.
pub fn request_from_pairs(spec: &str, cluster: &Cluster) -> Result<Request, RequestError> {
    let bad = |field: &str, value: &str, problem: &str| RequestError {
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.to_string(),
    };
    let mut resources: Vec<(String, String)> = Vec::new();
    let mut annotations: Vec<(String, String)> = Vec::new();
    for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(bad(pair, "", "expected key=value"));
        };
        let (key, value) = (key.trim(), value.trim());
        let number = |v: &str| -> Result<(), RequestError> {
            if v.starts_with('-') {
                return Err(bad(key, v, "must not be negative"));
            }
            v.parse::<u64>()
                .map(|_| ())
                .map_err(|_| bad(key, v, "not a whole number"))
        };
        match key {
            "gpu" => resources.push((request::RES_GPU.into(), value.into())),
            "gpu-memory" => resources.push((request::RES_GPU_MEMORY.into(), value.into())),
            "gpu-memory-percent" => {
                resources.push((request::RES_GPU_MEMORY_PERCENT.into(), value.into()))
            }
            "gpu-cores" => resources.push((request::RES_GPU_CORES.into(), value.into())),
            "gpu-milli" => resources.push((request::RES_GPU_MILLI.into(), value.into())),
            "mig" => resources.push((format!("{}{value}", request::RES_MIG_PREFIX), "1".into())),
            "cpu" => {
                number(value)?;
                resources.push(("cpu".into(), format!("{value}m")));
            }
            "memory" => {
                number(value)?;
                resources.push(("memory".into(), format!("{value}Mi")));
            }
            "model" => annotations.push((request::ANN_GPU_MODEL.into(), value.into())),
            "isolation" => annotations.push((request::ANN_ISOLATION.into(), value.into())),
            "topology" => annotations.push((request::ANN_TOPOLOGY.into(), value.into())),
            "uuids" => annotations.push((request::ANN_GPU_UUIDS.into(), value.replace('|', ","))),
            other => {
                return Err(bad(
                    other,
                    value,
                    "unknown key (expected gpu, gpu-memory, gpu-cores, gpu-milli, mig, model, cpu, memory, isolation, topology, uuids)",
                ));
            }
        }
    }
    request::parse(
        resources.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        &cluster.catalog,
    )
    .map_err(|mut e| {
        // Name the field as the user wrote it (`gpu-cores`, not `tessera.io/gpu-cores`).
        let short = e.field.strip_prefix("tessera.io/").unwrap_or(&e.field);
        e.field = match short {
            "gpu-model" => "model".to_string(),
            "gpu-uuids" => "uuids".to_string(),
            s if s.starts_with("mig-") => "mig".to_string(),
            s => s.to_string(),
        };
        e
    })
}

/// Loads a cluster from a file: `.csv` is an openb node list, anything else a YAML/JSON cluster file.
pub fn load_cluster(path: &Path) -> Result<Cluster, String> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
    {
        return tessera_sim::trace::openb::load_nodes(path).map_err(|e| e.to_string());
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file: ClusterFile =
        serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    file.into_cluster()
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn describe(cluster: &Cluster, p: &Placement) -> String {
    let node = cluster.node(p.node);
    let mut out = format!("node {}", node.name);
    for g in &p.grants {
        let gpu = &node.gpus[g.gpu as usize];
        let spec = cluster.catalog.spec(gpu.model);
        out.push_str(&format!("\n  GPU {} ({}", gpu.index, spec.name));
        if !gpu.uuid.is_empty() {
            out.push_str(&format!(", {}", gpu.uuid));
        }
        out.push_str("): ");
        match &g.mig {
            Some(slot) => {
                let name = spec
                    .mig
                    .as_ref()
                    .and_then(|m| m.profiles.get(slot.profile as usize))
                    .map(|p| p.name.as_str())
                    .unwrap_or("?");
                out.push_str(&format!(
                    "MIG {name} at memory slices {}..{}",
                    slot.start,
                    slot.start + slot.size
                ));
            }
            None if g.exclusive => out.push_str(&format!("whole GPU, {} MiB", g.memory_mib)),
            None => out.push_str(&format!(
                "share: {} MiB of {} MiB memory, {}.{}% compute",
                g.memory_mib,
                spec.memory_mib,
                g.cores_milli / 10,
                g.cores_milli % 10
            )),
        }
    }
    out
}

pub fn run(args: PlaceArgs) -> anyhow::Result<ExitCode> {
    let cluster = match &args.nodes {
        Some(path) => match load_cluster(path) {
            Ok(c) => c,
            Err(e) => return super::bad_input(e),
        },
        None => demo::demo_cluster(),
    };
    let req = match request_from_pairs(&args.request, &cluster) {
        Ok(r) => r,
        Err(e) => return super::bad_input(format!("--request: {e}")),
    };
    let policy = match policy::by_name(&args.policy, &PolicyArgs::default()) {
        Ok(p) => p,
        Err(e) => return super::bad_input(format!("--policy: {e}")),
    };
    let ledger = Ledger::new(&cluster);
    let mut scheduler = Scheduler::new(policy);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
    let decision = scheduler.decide(&cluster, &ledger, &req, &mut rng);
    match decision {
        Decision::Place(p) => {
            if args.json {
                let json = serde_json::json!({
                    "request": req.to_string(),
                    "policy": args.policy,
                    "node": cluster.node(p.node).name,
                    "placement": p,
                });
                println!("{}", serde_json::to_string_pretty(&json)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!("request: {req}");
            println!(
                "placed by policy {} on {}",
                args.policy,
                describe(&cluster, &p)
            );
            let terms: Vec<String> = p
                .terms
                .iter()
                .map(|t| format!("{} = {:.4}", t.name, t.value))
                .collect();
            println!("score {:.4}: {}", p.score, terms.join(", "));
            let node = cluster.node(p.node);
            for g in &p.grants {
                let gpu = &node.gpus[g.gpu as usize];
                let spec = cluster.catalog.spec(gpu.model);
                if let Some(why) = tessera_core::fit::mig_layout::explain_grant(gpu, spec, &req, g)
                {
                    println!("GPU {}: {why}", gpu.index);
                }
            }
            let explanation = scheduler.explain(&cluster, &ledger, &req, &mut rng);
            println!("{explanation}");
            if args.top > 0 {
                println!("best nodes:");
                for (id, s) in scheduler
                    .rank(&cluster, &ledger, &req, &mut rng)
                    .into_iter()
                    .take(args.top)
                {
                    let gpus: Vec<String> = s.gpus.iter().map(|g| g.to_string()).collect();
                    println!(
                        "  {:<24} score {:>9.4}  GPUs [{}]",
                        cluster.node(id).name,
                        s.score,
                        gpus.join(", ")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Decision::Unschedulable(e) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "request": req.to_string(),
                        "policy": args.policy,
                        "unschedulable": e.to_string(),
                        "explanation": e,
                    }))?
                );
            } else {
                println!("request: {req}");
                println!("unschedulable: {e}");
            }
            Ok(ExitCode::from(1))
        }
    }
}
