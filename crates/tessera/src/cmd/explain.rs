//! `tessera explain` (not yet implemented).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {}

pub fn run(_args: ExplainArgs) -> anyhow::Result<ExitCode> {
    eprintln!("tessera explain: not implemented yet");
    Ok(ExitCode::from(1))
}
