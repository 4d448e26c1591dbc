//! `tessera node-agent` (not yet implemented).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct NodeAgentArgs {}

pub fn run(_args: NodeAgentArgs) -> anyhow::Result<ExitCode> {
    eprintln!("tessera node-agent: not implemented yet");
    Ok(ExitCode::from(1))
}
