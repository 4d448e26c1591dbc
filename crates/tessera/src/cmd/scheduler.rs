//! `tessera scheduler`: the Kubernetes scheduler, as a kube-scheduler extender
//! or standalone. Bad configuration exits 64 before any socket is bound.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;

use clap::ArgAction;
use tessera_k8s::client::connect_limited;
use tessera_k8s::client::ratelimit::RateLimit;
use tessera_k8s::run::{ConfigError, RawConfig, run as run_scheduler};

use super::EXIT_BAD_CONFIG;
use super::mirror_args::PolicyKeyArgs;

#[derive(Debug, clap::Args)]
pub struct SchedulerArgs {
    /// `extender` (kube-scheduler calls us) or `standalone` (we place pods with our schedulerName).
    #[arg(long, default_value = "extender")]
    pub mode: String,
    /// Address of the extender's verbs (filter, prioritize, bind, preempt); loopback,
    /// since kube-scheduler runs in the same pod. Extender mode only. Any other address
    /// needs --extender-cert, --extender-key and --extender-client-ca.
    #[arg(long, default_value = "127.0.0.1:8888")]
    pub listen: String,
    /// Serve the extender's verbs over TLS with this certificate (PEM).
    #[arg(long)]
    pub extender_cert: Option<PathBuf>,
    /// The private key of --extender-cert (PEM).
    #[arg(long)]
    pub extender_key: Option<PathBuf>,
    /// CA bundle (PEM) whose client certificates may call the extender: the CA of the
    /// certFile in kube-scheduler's extender tlsConfig. Clients without one are refused.
    #[arg(long)]
    pub extender_client_ca: Option<PathBuf>,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub metrics_listen: String,
    #[command(flatten)]
    pub keys: PolicyKeyArgs,
    /// The schedulerName this scheduler owns (standalone mode; webhook mutation).
    #[arg(long, default_value = "tessera")]
    pub scheduler_name: String,
    /// Standalone mode: allocate pods' DRA ResourceClaims (resource.k8s.io/v1) of
    /// driver gpu.tessera.io with Tessera's policy before binding them.
    #[arg(long)]
    pub dra: bool,
    /// Another schedulerName whose pods the extender judges and binds (repeatable; e.g.
    /// `default-scheduler` when Tessera is wired into the default profile on purpose).
    #[arg(long = "serve-scheduler-name")]
    pub serve_scheduler_names: Vec<String>,
    /// Take part in leader election on a Lease (off: this replica always leads).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub leader_elect: bool,
    #[arg(long, default_value = "tessera-system")]
    pub lease_namespace: String,
    #[arg(long, default_value = "tessera-scheduler")]
    pub lease_name: String,
    /// `elect`: compete for --lease-name; `follow`: lead while the kube-scheduler in this
    /// pod holds --lease-name (its own Lease). Default: follow in extender mode on a loopback
    /// --listen, elect otherwise (standalone, or a kube-scheduler outside the pod).
    #[arg(long)]
    pub lease_role: Option<String>,
    /// Where the other replicas reach this one's --metrics-listen port
    /// (`http://$(POD_IP):9090`): a follower that kube-scheduler calls through a
    /// Service forwards `bind` to the leader at the URL its Lease advertises.
    /// Extender mode with --lease-role=elect.
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// This replica's identity in the election (default: $POD_NAME, then $HOSTNAME).
    #[arg(long)]
    pub identity: Option<String>,
    /// Serve the admission webhook (HTTPS) on this address; needs --webhook-cert and --webhook-key.
    #[arg(long)]
    pub webhook_listen: Option<String>,
    #[arg(long)]
    pub webhook_cert: Option<PathBuf>,
    #[arg(long)]
    pub webhook_key: Option<PathBuf>,
    /// Let the webhook set schedulerName on pods that ask tessera.io/* resources (or stock GPU
    /// pods labelled tessera.io/schedule=true, or in a namespace so labelled) and use the default scheduler.
    #[arg(long)]
    pub webhook_set_scheduler_name: bool,
    /// A toleration the webhook adds to the pods it hands to Tessera, as
    /// `kubectl taint` writes the taint: KEY[=VALUE]:EFFECT, e.g.
    /// `tessera.io/managed=true:NoSchedule` (repeatable; needs --webhook-set-scheduler-name).
    #[arg(long = "pod-toleration")]
    pub pod_tolerations: Vec<String>,
    /// A user allowed to write tessera.io/allocation (repeatable; the scheduler's service account).
    #[arg(long = "allocation-writer")]
    pub allocation_writers: Vec<String>,
    /// How GPU models count against queue quotas (GpuQueue): MODEL=FACTOR, comma
    /// separated, e.g. `H100-80GB=1,A100-80GB=0.6,T4=0.1`; unnamed models count 1.
    #[arg(long)]
    pub gpu_equivalents: Option<String>,
    /// Fair order by recent use too: the half-life in seconds of each queue's
    /// time-decayed GPU usage (off by default); a team that used much recently yields first.
    #[arg(long)]
    pub queue_usage_half_life: Option<u64>,
    /// Weight of the decayed usage against current usage, 0..=1 (default 0.5).
    #[arg(long)]
    pub queue_usage_weight: Option<f64>,
    /// Seconds a GpuNode whose node agent heartbeats (every 60 s) may stay
    /// unchanged before its node takes no new pods (default 180: three
    /// heartbeats). Measured on the scheduler's clock from the last change it saw.
    #[arg(long)]
    pub gpunode_ttl: Option<u64>,
    /// Pods of workloads Kueue admitted (label kueue.x-k8s.io/podset) pass the
    /// GpuQueue quota gate, still counted in their queue's usage: Kueue's
    /// ClusterQueue holds their quota. Only where Kueue manages the namespaces
    /// (any pod can carry the label).
    #[arg(long)]
    pub trust_kueue_admission: bool,
    /// Requests a second to the API server, client-side (kube-scheduler's
    /// --kube-api-qps; its default is 50). 0, the default, leaves it to the API
    /// server's priority and fairness: a limit of 50 would cap binds at about 50 a second.
    #[arg(long, default_value_t = 0.0)]
    pub kube_api_qps: f64,
    /// Requests allowed in a burst above the qps (kube-scheduler's --kube-api-burst).
    #[arg(long, default_value_t = 100)]
    pub kube_api_burst: u32,
}

pub fn run(a: SchedulerArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    if !(a.kube_api_qps.is_finite() && a.kube_api_qps >= 0.0) || a.kube_api_burst == 0 {
        eprintln!(
            "error: configuration: kube-api-qps must be a number ≥ 0 and kube-api-burst at least 1 (got {} and {})",
            a.kube_api_qps, a.kube_api_burst
        );
        return Ok(ExitCode::from(EXIT_BAD_CONFIG));
    }
    let limit = (a.kube_api_qps > 0.0).then_some(RateLimit {
        qps: a.kube_api_qps,
        burst: a.kube_api_burst,
    });
    let identity = a
        .identity
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok());
    let raw = RawConfig {
        mode: Some(a.mode),
        listen: Some(a.listen),
        extender_cert: a.extender_cert,
        extender_key: a.extender_key,
        extender_client_ca: a.extender_client_ca,
        metrics_listen: Some(a.metrics_listen),
        serve_scheduler_names: a.serve_scheduler_names,
        lease_role: a.lease_role,
        advertise_url: a.advertise_url,
        policy: Some(a.keys.policy),
        signing_key_file: a.keys.signing_key_file,
        verify_key_dir: a.keys.verify_key_dir,
        scheduler_name: Some(a.scheduler_name),
        leader_elect: Some(a.leader_elect),
        lease_namespace: Some(a.lease_namespace),
        lease_name: Some(a.lease_name),
        identity,
        webhook_listen: a.webhook_listen,
        webhook_cert: a.webhook_cert,
        webhook_key: a.webhook_key,
        webhook_set_scheduler_name: Some(a.webhook_set_scheduler_name),
        pod_tolerations: a.pod_tolerations,
        allocation_writers: a.allocation_writers,
        gpu_equivalents: a.gpu_equivalents,
        queue_usage_half_life: a.queue_usage_half_life.map(std::time::Duration::from_secs),
        queue_usage_weight: a.queue_usage_weight,
        dra: Some(a.dra),
        gpunode_ttl: a.gpunode_ttl.map(std::time::Duration::from_secs),
        trust_kueue_admission: Some(a.trust_kueue_admission),
        ..RawConfig::default()
    };
    serve_until_signal(
        raw.resolve(),
        async move { connect_limited(limit).await },
        run_scheduler,
    )
}

/// How every long-running command ends its start: exits 64 on a
/// configuration that did not resolve (before any socket is bound), then
/// builds the runtime, connects with `connect` and runs `serve(config,
/// client, shutdown)` until SIGINT or SIGTERM. Logging is the caller's to
/// start (the scheduler logs its own refusals first).
pub(crate) fn serve_until_signal<C, CF, CE, F, Fut, E>(
    config: Result<C, ConfigError>,
    connect: CF,
    serve: F,
) -> anyhow::Result<ExitCode>
where
    CF: Future<Output = Result<kube::Client, CE>>,
    CE: std::fmt::Display,
    F: FnOnce(C, kube::Client, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: configuration: {e}");
            return Ok(ExitCode::from(EXIT_BAD_CONFIG));
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = connect
            .await
            .map_err(|e| anyhow::anyhow!("connecting to the Kubernetes API: {e}"))?;
        serve(config, client, Box::pin(shutdown_signal())).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Logs to stdout at `info` unless `RUST_LOG` says otherwise (the scheduler's
/// and the estimator's).
pub(crate) fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
