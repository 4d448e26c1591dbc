//! `tessera scheduler` (not yet implemented).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct SchedulerArgs {}

pub fn run(_args: SchedulerArgs) -> anyhow::Result<ExitCode> {
    eprintln!("tessera scheduler: not implemented yet");
    Ok(ExitCode::from(1))
}
