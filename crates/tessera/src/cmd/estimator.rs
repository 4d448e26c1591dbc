//! `tessera estimator`: Karmada's scheduler-estimator for this cluster, answered
//! by Tessera's placement engine from a read-only mirror of the cluster (see
//! `tessera_k8s::estimator`). Bad configuration exits 64 before any socket is bound.

use std::path::PathBuf;
use std::process::ExitCode;

use tessera_k8s::estimator::{self, RawEstimatorConfig};
use tessera_k8s::view::Connect;

use super::EXIT_BAD_CONFIG;
use super::scheduler::{init_logging, shutdown_signal};

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
    /// Placement policy: the scheduler's (--policy of `tessera scheduler`).
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    /// File holding the HMAC key the scheduler signs allocation annotations with:
    /// the estimator verifies them to count what bound pods hold.
    #[arg(long)]
    pub signing_key_file: Option<PathBuf>,
    /// Directory whose `verify*` files are keys that also verify annotations (a key rotation).
    #[arg(long, value_name = "DIR")]
    pub verify_key_dir: Option<PathBuf>,
    /// How GPU models count against queue quotas: the scheduler's --gpu-equivalents.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
    /// Most replicas one answer counts (each costs one placement on a scratch ledger).
    #[arg(long, default_value_t = estimator::DEFAULT_REPLICA_LIMIT)]
    pub replica_limit: u32,
    /// Path to the kubeconfig of the cluster to answer for (default: $KUBECONFIG,
    /// ~/.kube/config, then the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
}

pub fn run(a: EstimatorArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let raw = RawEstimatorConfig {
        listen: Some(a.listen),
        health_listen: Some(a.health_listen),
        cluster_name: a.cluster_name,
        tls_cert: a.tls_cert,
        tls_key: a.tls_key,
        tls_client_ca: a.tls_client_ca,
        policy: Some(a.policy),
        signing_key_file: a.signing_key_file,
        verify_key_dir: a.verify_key_dir,
        gpu_equivalents: a.gpu_equivalents,
        replica_limit: Some(a.replica_limit),
    };
    let config = match raw.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: configuration: {e}");
            return Ok(ExitCode::from(EXIT_BAD_CONFIG));
        }
    };
    let connect = Connect {
        kubeconfig: a.kubeconfig,
        context: a.context,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (client, _) = connect
            .client()
            .await
            .map_err(|e| anyhow::anyhow!("connecting to the Kubernetes API: {e}"))?;
        estimator::run(config, client, shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}
