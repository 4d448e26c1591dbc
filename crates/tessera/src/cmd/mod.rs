//! One module per subcommand. Each exposes a clap `Args` type and `run`, which
//! returns the process exit code: 0 success, 1 runtime failure, 2 bad input
//! (request strings, flags, trace or fixture files), 64 bad configuration.

pub mod bench;
pub mod bench_extender;
pub mod chargeback;
pub mod defrag;
pub mod doctor;
pub mod estimator;
pub mod explain;
pub mod kubectl;
pub mod kueue_admission;
mod mirror_args;
pub mod node_agent;
pub mod place;
mod progress;
pub mod scheduler;
pub mod simulate;
pub mod simulate_gang;
pub mod tenants;
#[cfg(test)]
pub mod testkit;
pub mod trace;

use std::process::ExitCode;

/// Exit code for input that could not be understood.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code for bad configuration (before any socket is bound).
pub const EXIT_BAD_CONFIG: u8 = 64;

/// Prints `message` to stderr and returns exit code 2.
pub fn bad_input(message: impl std::fmt::Display) -> anyhow::Result<ExitCode> {
    eprintln!("error: {message}");
    Ok(ExitCode::from(EXIT_BAD_INPUT))
}
