//! `tessera estimator`: Karmada's scheduler-estimator for this cluster, answered
//! by Tessera's placement engine from a read-only mirror of the cluster (see
//! `tessera_k8s::estimator`). Bad configuration exits 64 before any socket is bound.

use std::path::PathBuf;
use std::process::ExitCode;

use tessera_k8s::estimator::{self, RawEstimatorConfig};

use super::mirror_args::{self, MirrorArgs};

#[derive(Debug, clap::Args)]
pub struct EstimatorArgs {
    /// The member cluster's name in Karmada (`kubectl get clusters` on the Karmada
    /// control plane): karmada-scheduler names it in every request, and a request
    /// for another cluster is refused.
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Address of the gRPC service (10352 is karmada-scheduler's
    /// --scheduler-estimator-port).
    #[arg(long, default_value = estimator::DEFAULT_LISTEN)]
    pub listen: String,
    /// Address of /healthz and /readyz (200 once the cluster is listed).
    #[arg(long, default_value = estimator::DEFAULT_HEALTH_LISTEN)]
    pub health_listen: String,
    /// Serve TLS with this certificate (PEM); needs --tls-key.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM) whose client certificates may call: the CA of
    /// karmada-scheduler's --scheduler-estimator-cert-file. Clients without one are refused.
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// Most replicas one answer counts (each costs one placement on a scratch ledger).
    #[arg(long, default_value_t = estimator::DEFAULT_REPLICA_LIMIT)]
    pub replica_limit: u32,
    // Policy, keys, GPU-equivalents and kubeconfig, as `tessera kueue-admission`'s.
    #[command(flatten)]
    pub mirror: MirrorArgs,
}

pub fn run(a: EstimatorArgs) -> anyhow::Result<ExitCode> {
    let (mirror, connect) = a.mirror.split();
    let config = RawEstimatorConfig {
        listen: Some(a.listen),
        health_listen: Some(a.health_listen),
        cluster_name: a.cluster_name,
        tls_cert: a.tls_cert,
        tls_key: a.tls_key,
        tls_client_ca: a.tls_client_ca,
        mirror,
        replica_limit: Some(a.replica_limit),
    }
    .resolve();
    mirror_args::run(config, connect, estimator::run)
}
