//! `tessera kueue-admission`: Kueue's admission-check controller
//! `tessera.io/placement` for this cluster (a MultiKueue worker, or any Kueue
//! cluster): a workload's check turns Ready only when Tessera's placement
//! engine can place all its pods now (see `tessera_k8s::kueue`). Bad
//! configuration exits 64 before any socket is bound.

use std::process::ExitCode;

use tessera_k8s::kueue::controller::{self, RawKueueConfig};

use super::mirror_args::{self, MirrorArgs};

#[derive(Debug, clap::Args)]
pub struct KueueAdmissionArgs {
    /// Address of /healthz and /readyz (200 once the cluster is listed).
    #[arg(long, default_value = controller::DEFAULT_HEALTH_LISTEN)]
    pub health_listen: String,
    /// Seconds between passes when nothing changes (every change starts one too).
    #[arg(long)]
    pub interval: Option<u64>,
    /// Elect one writer among replicas on the Lease `tessera-kueue-admission`
    /// (this replica's identity: `$HOSTNAME`, the pod name).
    #[arg(long)]
    pub leader_elect: bool,
    /// Namespace of that Lease.
    #[arg(long, default_value = "tessera-system")]
    pub lease_namespace: String,
    // Policy, keys, GPU-equivalents and kubeconfig, as `tessera estimator`'s.
    #[command(flatten)]
    pub mirror: MirrorArgs,
}

pub fn run(a: KueueAdmissionArgs) -> anyhow::Result<ExitCode> {
    let (mirror, connect) = a.mirror.split();
    let config = RawKueueConfig {
        health_listen: Some(a.health_listen),
        mirror,
        interval_s: a.interval,
        leader_elect: a.leader_elect,
        identity: std::env::var("HOSTNAME").ok(),
        lease_namespace: Some(a.lease_namespace),
        lease_timings: None,
    }
    .resolve();
    mirror_args::run(config, connect, controller::run)
}
