//! `tessera kueue-admission`: Kueue's admission-check controller
//! `tessera.io/placement` for this cluster (a MultiKueue worker, or any Kueue
//! cluster): a workload's check turns Ready only when Tessera's placement
//! engine can place all its pods now (see `tessera_k8s::kueue`). Bad
//! configuration exits 64 before any socket is bound.

use std::path::PathBuf;
use std::process::ExitCode;

use tessera_k8s::kueue::controller::{self, RawKueueConfig};
use tessera_k8s::view::Connect;

use super::EXIT_BAD_CONFIG;
use super::scheduler::{init_logging, shutdown_signal};

#[derive(Debug, clap::Args)]
pub struct KueueAdmissionArgs {
    /// Address of /healthz and /readyz (200 once the cluster is listed).
    #[arg(long, default_value = controller::DEFAULT_HEALTH_LISTEN)]
    pub health_listen: String,
    /// Placement policy: the scheduler's (--policy of `tessera scheduler`).
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    /// File holding the HMAC key the scheduler signs allocation annotations with:
    /// verified to count what bound pods hold.
    #[arg(long)]
    pub signing_key_file: Option<PathBuf>,
    /// Directory whose `verify*` files are keys that also verify annotations (a key rotation).
    #[arg(long, value_name = "DIR")]
    pub verify_key_dir: Option<PathBuf>,
    /// How GPU models count against queue quotas: the scheduler's --gpu-equivalents.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
    /// Seconds between passes when nothing changes (every change starts one too).
    #[arg(long)]
    pub interval: Option<u64>,
    /// Path to the kubeconfig of the cluster to answer for (default: $KUBECONFIG,
    /// ~/.kube/config, then the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
}

pub fn run(a: KueueAdmissionArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let raw = RawKueueConfig {
        health_listen: Some(a.health_listen),
        policy: Some(a.policy),
        signing_key_file: a.signing_key_file,
        verify_key_dir: a.verify_key_dir,
        gpu_equivalents: a.gpu_equivalents,
        interval_s: a.interval,
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
        controller::run(config, client, shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}
