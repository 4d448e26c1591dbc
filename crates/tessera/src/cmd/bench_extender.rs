//! `tessera bench extender` (not yet implemented).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct BenchExtenderArgs {
    /// Nodes in the synthetic cluster.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: BenchExtenderArgs) -> anyhow::Result<ExitCode> {
    eprintln!("tessera bench extender: not implemented yet");
    Ok(ExitCode::from(1))
}
