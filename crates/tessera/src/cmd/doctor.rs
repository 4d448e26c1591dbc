//! `tessera doctor` (not yet implemented).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {}

pub fn run(_args: DoctorArgs) -> anyhow::Result<ExitCode> {
    eprintln!("tessera doctor: not implemented yet");
    Ok(ExitCode::from(1))
}
