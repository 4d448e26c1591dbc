//! What `tessera estimator` and `tessera kueue-admission` share: both keep a
//! read-only mirror of their cluster, fed by the scheduler's watches, so they
//! take the scheduler's policy, keys and GPU-equivalents, and a kubeconfig;
//! both refuse bad configuration with exit 64 before anything is bound and
//! then run until SIGINT or SIGTERM.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;

use tessera_k8s::run::{ConfigError, RawMirrorConfig};
use tessera_k8s::view::Connect;

use super::scheduler::{init_logging, serve_until_signal};

/// The placement policy and the allocation keys: the scheduler signs with the
/// key, the commands that mirror its cluster verify with it, and all of them
/// must place by the same policy to agree on what fits.
#[derive(Debug, clap::Args)]
pub struct PolicyKeyArgs {
    /// Placement policy (the same in the scheduler and in whatever estimates for it).
    #[arg(long, default_value = "tessera")]
    pub policy: String,
    /// File holding the HMAC key of allocation annotations (the Secret shared with
    /// the node agents): the scheduler signs with it, the others verify.
    #[arg(long)]
    pub signing_key_file: Option<PathBuf>,
    /// Directory whose `verify*` files are keys that verify allocation annotations but
    /// never sign (a key rotation's previous or next key; the Secret mounted whole).
    #[arg(long, value_name = "DIR")]
    pub verify_key_dir: Option<PathBuf>,
}

/// The flags of a command that keeps a read-only mirror of the cluster.
#[derive(Debug, clap::Args)]
pub struct MirrorArgs {
    #[command(flatten)]
    pub keys: PolicyKeyArgs,
    /// How GPU models count against queue quotas: the scheduler's --gpu-equivalents.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
    /// Path to the kubeconfig of the cluster to answer for (default: $KUBECONFIG,
    /// ~/.kube/config, then the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
}

impl MirrorArgs {
    /// The mirror's flags, and how to reach the cluster.
    pub fn split(self) -> (RawMirrorConfig, Connect) {
        let raw = RawMirrorConfig {
            policy: Some(self.keys.policy),
            signing_key_file: self.keys.signing_key_file,
            verify_key_dir: self.keys.verify_key_dir,
            gpu_equivalents: self.gpu_equivalents,
        };
        let connect = Connect {
            kubeconfig: self.kubeconfig,
            context: self.context,
        };
        (raw, connect)
    }
}

/// Logs, exits 64 on a configuration that did not resolve, then connects and
/// runs `serve(config, client, shutdown)` until SIGINT or SIGTERM.
pub fn run<C, F, Fut, E>(
    config: Result<C, ConfigError>,
    connect: Connect,
    serve: F,
) -> anyhow::Result<ExitCode>
where
    F: FnOnce(C, kube::Client, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    init_logging();
    let connect = async move { connect.client().await.map(|(client, _)| client) };
    serve_until_signal(config, connect, serve)
}
