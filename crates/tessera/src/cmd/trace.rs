//! `tessera trace variant`: openb-style workload variants derived from the `default`
//! pod list with a seed ([`tessera_sim::variant`]), for testing placement on workloads
//! nobody tuned on. Files go only to the folder the user names.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use tessera_sim::variant::{Base, VariantMix};

use super::bad_input;

#[derive(Debug, clap::Subcommand)]
pub enum TraceCommand {
    /// Write openb-style pod lists derived from `default` (one per seed) into a folder.
    Variant(VariantArgs),
}

#[derive(Debug, clap::Args)]
pub struct VariantArgs {
    /// First seed; it picks the mix (unless given below) and drives every draw.
    #[arg(long)]
    pub seed: u64,
    /// Number of variants, seeds `seed`, `seed`+1, …
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    /// Folder to write `openb_pod_list_variant-<seed>.csv` (and a `variants.tsv` index) into.
    #[arg(long)]
    pub out: PathBuf,
    /// Folder with `openb_pod_list_default.csv` (and `openb_node_list_gpu_node.csv`, copied along).
    #[arg(long, default_value = "../shared/data/openb")]
    pub trace: PathBuf,
    /// Share of the GPU demand in sharing pods (0–1).
    #[arg(long)]
    pub gpushare: Option<f64>,
    /// Share of GPU pods with a GPU-model constraint (0–1).
    #[arg(long)]
    pub gpuspec: Option<f64>,
    /// Share of the GPU demand in multi-GPU pods (0–1).
    #[arg(long)]
    pub multigpu: Option<f64>,
    /// CPU-only pods as a multiple of `default`'s count.
    #[arg(long)]
    pub cpu_factor: Option<f64>,
}

pub fn run(cmd: TraceCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TraceCommand::Variant(a) => variant(a),
    }
}

fn check_share(name: &str, v: Option<f64>) -> Result<(), String> {
    match v {
        Some(x) if !(0.0..=1.0).contains(&x) => Err(format!("--{name} {x}: expected 0 to 1")),
        _ => Ok(()),
    }
}

fn variant(a: VariantArgs) -> anyhow::Result<ExitCode> {
    for (name, v) in [
        ("gpushare", a.gpushare),
        ("gpuspec", a.gpuspec),
        ("multigpu", a.multigpu),
    ] {
        if let Err(m) = check_share(name, v) {
            return bad_input(m);
        }
    }
    if let Some(f) = a.cpu_factor
        && !(f.is_finite() && f >= 0.0)
    {
        return bad_input(format!("--cpu-factor {f}: expected a number ≥ 0"));
    }
    if a.count == 0 {
        return bad_input("--count 0: nothing to write");
    }
    let default = a.trace.join("openb_pod_list_default.csv");
    let file = match File::open(&default) {
        Ok(f) => f,
        Err(e) => return bad_input(format!("{}: {e}", default.display())),
    };
    let base = match Base::read(BufReader::new(file), &default.display().to_string()) {
        Ok(b) => b,
        Err(e) => return bad_input(e),
    };
    std::fs::create_dir_all(&a.out)?;
    let nodes = a.trace.join("openb_node_list_gpu_node.csv");
    if nodes.exists() {
        std::fs::copy(&nodes, a.out.join("openb_node_list_gpu_node.csv"))?;
    }
    let mut index = BufWriter::new(File::create(a.out.join("variants.tsv"))?);
    writeln!(
        index,
        "workload\tseed\tgpushare\tgpuspec\tmultigpu\tcpu_factor"
    )?;
    for seed in a.seed..a.seed.saturating_add(a.count) {
        let drawn = VariantMix::for_seed(seed);
        let mix = VariantMix {
            gpushare: a.gpushare.or(drawn.gpushare),
            gpuspec: a.gpuspec.unwrap_or(drawn.gpuspec),
            multigpu: a.multigpu.or(drawn.multigpu),
            cpu_only_factor: a.cpu_factor.unwrap_or(drawn.cpu_only_factor),
        };
        let name = format!("variant-{seed}");
        let mut out = BufWriter::new(File::create(
            a.out.join(format!("openb_pod_list_{name}.csv")),
        )?);
        base.write_variant(&mix, seed, &mut out)?;
        out.flush()?;
        let opt = |v: Option<f64>| v.map_or("default".to_string(), |v| format!("{v:.4}"));
        writeln!(
            index,
            "{name}\t{seed}\t{}\t{:.4}\t{}\t{:.4}",
            opt(mix.gpushare),
            mix.gpuspec,
            opt(mix.multigpu),
            mix.cpu_only_factor
        )?;
        eprintln!("{name}: {}", mix.label());
    }
    index.flush()?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::model::Catalog;
    use tessera_sim::trace::openb::load_pods;

    fn trace_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb")
    }

    fn args(out: PathBuf, seed: u64) -> VariantArgs {
        VariantArgs {
            seed,
            count: 2,
            out,
            trace: trace_dir(),
            gpushare: None,
            gpuspec: Some(0.2),
            multigpu: None,
            cpu_factor: None,
        }
    }

    #[test]
    fn writes_readable_variants_into_the_named_folder_only() {
        if !trace_dir().join("openb_pod_list_default.csv").exists() {
            eprintln!("openb trace not found; skipped");
            return;
        }
        let tmp = std::env::temp_dir().join(format!("tessera-variant-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        assert_eq!(variant(args(tmp.clone(), 5)).unwrap(), ExitCode::SUCCESS);
        let pods = load_pods(
            &tmp.join("openb_pod_list_variant-5.csv"),
            &Catalog::default(),
        )
        .unwrap();
        let gpu = pods
            .iter()
            .filter(|p| p.request.gpu.gpu_count() > 0)
            .count();
        let constrained = pods
            .iter()
            .filter(|p| p.request.constraints.model_set != tessera_core::model::ModelSet::ALL)
            .count();
        // --gpuspec 0.2: about a fifth of the GPU pods carry a model constraint.
        let share = constrained as f64 / gpu as f64;
        assert!((share - 0.2).abs() < 0.03, "{share}");
        assert!(tmp.join("openb_pod_list_variant-6.csv").exists());
        let index = std::fs::read_to_string(tmp.join("variants.tsv")).unwrap();
        assert_eq!(index.lines().count(), 3);
        // Same seed, same bytes.
        let again = tmp.join("again");
        variant(args(again.clone(), 5)).unwrap();
        assert_eq!(
            std::fs::read(tmp.join("openb_pod_list_variant-5.csv")).unwrap(),
            std::fs::read(again.join("openb_pod_list_variant-5.csv")).unwrap()
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn bad_knobs_are_input_errors() {
        let mut a = args(std::env::temp_dir().join("tessera-variant-never"), 1);
        a.gpushare = Some(1.5);
        assert_eq!(
            variant(a).unwrap(),
            ExitCode::from(super::super::EXIT_BAD_INPUT)
        );
    }
}
