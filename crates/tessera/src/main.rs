//! `tessera`: the command line. Owns signals, logging set-up and exit codes;
//! everything else lives in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use tessera::cmd;

/// Tessera: GPU scheduling for Kubernetes — whole GPUs, fractions and MIG,
/// fragmentation- and topology-aware, with every decision explained.
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a trace-driven experiment (no arguments: the built-in synthetic default).
    Simulate(cmd::simulate::SimulateArgs),
    /// Derive workload traces (openb-style variants of `default`).
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
    /// Place one request on a cluster and show the score breakdown or why nothing fits.
    Place(cmd::place::PlaceArgs),
    /// Plan moves that free GPUs for pods that do not fit (on a fill snapshot; --dry-run).
    Defrag(cmd::defrag::DefragArgs),
    /// Measure decision speed.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Run the Kubernetes scheduler (extender or standalone mode).
    Scheduler(cmd::scheduler::SchedulerArgs),
    /// Serve Karmada's scheduler-estimator for this cluster (replicas that fit, from the live cluster).
    Estimator(cmd::estimator::EstimatorArgs),
    /// Answer Kueue's admission check tessera.io/placement: Ready once every pod of a workload can be placed.
    KueueAdmission(cmd::kueue_admission::KueueAdmissionArgs),
    /// Run the node agent (kubelet device plugin, inventory, health, metrics).
    NodeAgent(cmd::node_agent::NodeAgentArgs),
    /// Explain where a pod went and why, or why it is pending.
    Explain(cmd::explain::ExplainArgs),
    /// Troubleshoot GPUs: explain error codes and log lines, diagnose a pod, snapshot a node.
    Doctor(cmd::doctor::DoctorArgs),
    /// Bill GPU time per namespace, model and mode for a time range (CSV or JSON).
    Chargeback(cmd::chargeback::ChargebackArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with success; usage errors exit 2.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Simulate(a) => cmd::simulate::run(a),
        Command::Trace(c) => cmd::trace::run(c),
        Command::Place(a) => cmd::place::run(a),
        Command::Defrag(a) => cmd::defrag::run(a),
        Command::Bench(c) => cmd::bench::run(c),
        Command::Scheduler(a) => cmd::scheduler::run(a),
        Command::Estimator(a) => cmd::estimator::run(a),
        Command::KueueAdmission(a) => cmd::kueue_admission::run(a),
        Command::NodeAgent(a) => cmd::node_agent::run(a),
        Command::Explain(a) => cmd::explain::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Chargeback(a) => cmd::chargeback::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
