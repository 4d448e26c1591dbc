//! `tessera simulate` (not yet implemented).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {}

pub fn run(_args: SimulateArgs) -> anyhow::Result<ExitCode> {
    eprintln!("tessera simulate: not implemented yet");
    Ok(ExitCode::from(1))
}
