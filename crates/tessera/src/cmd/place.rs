//! `tessera place` (being written).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct PlaceArgs {}

pub fn run(_args: PlaceArgs) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::from(1))
}
