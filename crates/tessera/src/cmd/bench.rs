//! `tessera bench`: decision-speed benchmarks that print figures.

use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Placement decisions per second on a synthetic cluster.
    Placement(PlacementArgs),
    /// Extender filter + prioritize latency against N nodes.
    Extender(super::bench_extender::BenchExtenderArgs),
}

#[derive(Debug, clap::Args)]
pub struct PlacementArgs {
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Placement(_a) => {
            eprintln!("tessera bench placement: not implemented yet");
            Ok(ExitCode::from(1))
        }
        BenchCommand::Extender(a) => super::bench_extender::run(a),
    }
}
