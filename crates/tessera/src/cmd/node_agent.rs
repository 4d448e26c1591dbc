//! `tessera node-agent`: the per-node GPU agent (device plugin, inventory,
//! health, metrics). Parses and validates flags, picks the backend, sets up
//! logging and signals, then hands over to `tessera_node::run`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tessera_node::backend::fake::Fake;
use tessera_node::backend::nvml::Nvml;
use tessera_node::backend::{GpuBackend, HostProc, ProcReader};
use tessera_node::deviceplugin::allocate::{MpsConfig, NoPods, PodSource};
use tessera_node::deviceplugin::handover::DeviceList;
use tessera_node::deviceplugin::registration::PluginConfig;
use tessera_node::dra::DraConfig;
use tessera_node::dra::driver::{DriverConfig, run_driver};
use tessera_node::dra::slice::SliceOptions;
use tessera_node::health::XidPolicy;
use tessera_node::inventory::Inventory;
use tessera_node::metrics::{KubeletPodResources, PodResourcesSource};
use tessera_node::podresources::{KubeletPods, PodResourcesClient};
use tessera_node::pods::KubePods;
use tessera_node::run::{AgentConfig, AgentDeps};

use super::{EXIT_BAD_CONFIG, bad_input};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Real GPUs through NVML (libnvidia-ml.so.1, loaded at run time).
    Nvml,
    /// GPUs described in a YAML file (--fake-config).
    Fake,
}

#[derive(Debug, clap::Args)]
pub struct NodeAgentArgs {
    /// Where GPU facts come from.
    #[arg(long, value_enum, default_value = "nvml")]
    backend: BackendKind,
    /// YAML file describing the fake GPUs (with --backend fake).
    #[arg(long, value_name = "FILE")]
    fake_config: Option<PathBuf>,
    /// This node's name (defaults to $NODE_NAME, then the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// Discover, print the inventory and one metrics scrape as JSON/text, and exit
    /// (exit 1 when no GPU is found).
    #[arg(long)]
    once: bool,
    /// Print the discovered inventory (JSON) at start.
    #[arg(long)]
    print_inventory: bool,
    /// Create one MIG instance the way the agent does for a planned decision (a GPU
    /// instance of PROFILE at memory slice START and one compute instance filling
    /// it), print it as JSON and exit. GPU is a UUID or an index; the GPU must be in
    /// MIG mode. For checking a driver (scripts/gpu-smoke.sh); the running agent
    /// creates instances only for decisions.
    #[arg(long, value_name = "GPU:PROFILE@START", conflicts_with_all = ["once", "mig_destroy"])]
    mig_create: Option<String>,
    /// Destroy one MIG instance (compute, then GPU instance) and exit. Refused
    /// while a process runs on it.
    #[arg(long, value_name = "GPU:MIG-UUID", conflicts_with = "once")]
    mig_destroy: Option<String>,
    /// The kubelet's device-plugins directory.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/device-plugins",
        value_name = "DIR"
    )]
    device_plugin_dir: PathBuf,
    /// The kubelet's PodResources socket ("off" to not ask the kubelet which pods hold which GPUs).
    #[arg(
        long,
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock",
        value_name = "PATH"
    )]
    pod_resources_socket: PathBuf,
    /// Where /metrics listens ("off" to disable).
    #[arg(long, default_value = "0.0.0.0:9400", value_name = "ADDR")]
    metrics_addr: String,
    /// tessera.io/gpu tokens advertised per GPU (most pods sharing one GPU).
    #[arg(long, default_value_t = tessera_node::deviceplugin::DEFAULT_SLOTS, value_parser = clap::value_parser!(u32).range(1..=100))]
    slots: u32,
    /// How long a GPU stays withdrawn after its last fatal XID (e.g. 30s, 10m, 1h).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    quiet_period: Duration,
    /// How often the backend is asked about each GPU's health.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    health_interval: Duration,
    /// Extra XIDs that do not fail a GPU (comma-separated), besides 13,31,43,45,68,109.
    #[arg(long, value_name = "LIST", value_parser = parse_xids)]
    xid_ignore: Option<std::collections::BTreeSet<u64>>,
    /// XIDs that always fail a GPU, even application ones (comma-separated).
    #[arg(long, value_name = "LIST", value_parser = parse_xids)]
    xid_fatal: Option<std::collections::BTreeSet<u64>>,
    /// File holding the HMAC key shared with the scheduler (required unless --once).
    #[arg(long, value_name = "FILE")]
    allocation_key_file: Option<PathBuf>,
    /// Directory whose `verify*` files are more keys that verify the scheduler's
    /// decisions (a key rotation's previous or next key; the Secret mounted whole).
    #[arg(long, value_name = "DIR")]
    verify_key_dir: Option<PathBuf>,
    /// Host directory of the MPS control daemons (their pipe directories and shm/).
    #[arg(long, default_value = "/run/tessera/mps", value_name = "DIR")]
    mps_root: String,
    /// Who runs the MPS control daemons: `per-gpu` (the agent starts and supervises
    /// one per GPU set MPS shares use, and refuses an MPS share whose daemon does not
    /// start) or `external` (one daemon someone else runs at <mps-root>/pipe).
    #[arg(long, default_value = "external", value_name = "per-gpu|external", value_parser = ["per-gpu", "external"])]
    mps_daemons: String,
    /// The MPS control binary the agent starts with --mps-daemons=per-gpu.
    #[arg(long, default_value = "nvidia-cuda-mps-control", value_name = "PATH")]
    mps_control_binary: PathBuf,
    /// Where the agent records the MIG instances it made, so that they are still
    /// destroyed after the agent restarts ("off": not recorded). Keep it on a tmpfs
    /// of the host (/run): a reboot takes the instances and the record together.
    #[arg(
        long,
        default_value = "/run/tessera/state/mig.json",
        value_name = "FILE|off"
    )]
    mig_state: String,
    /// Where Allocate keeps the answers it gave, so that after an agent restart a
    /// pod it answered is not taken for the next one ("off": memory only). On the
    /// host's /run, like --mig-state: the kubelet re-admits everything after a reboot.
    #[arg(
        long,
        default_value = "/run/tessera/state/allocate.json",
        value_name = "FILE|off"
    )]
    allocate_state: String,
    /// Root of the host's /proc (to map GPU processes to pods).
    #[arg(long, default_value = "/proc", value_name = "DIR")]
    proc_root: PathBuf,
    /// Run without a Kubernetes API server (no inventory, no pod lookup: Allocate refuses).
    #[arg(long)]
    no_kube: bool,
    /// Do not write GFD-style nvidia.com/* labels on the Node.
    #[arg(long)]
    no_node_labels: bool,
    /// How containers are told their GPUs: volume-mounts, cdi-cri or envvar, or a
    /// comma-separated list (envvar can be overridden by the pod's own environment).
    #[arg(long, default_value = "volume-mounts", value_name = "LIST", value_parser = parse_device_list)]
    device_list_strategy: DeviceList,
    /// Do not serve nvidia.com/gpu nor nvidia.com/mig-<profile> (serve them only where
    /// NVIDIA's device plugin does not run).
    #[arg(long)]
    no_nvidia_gpu_resource: bool,
    /// Serve the GPUs through Dynamic Resource Allocation (driver gpu.tessera.io)
    /// instead of the device plugin: ResourceSlices, NodePrepareResources, CDI specs.
    /// Off by default; a node runs one or the other (docs/kubernetes.md, DRA).
    #[arg(long)]
    dra: bool,
    /// With --dra: the kubelet's plugin-watcher directory.
    #[arg(long, default_value = tessera_node::dra::REGISTRY_DIR, value_name = "DIR")]
    dra_registry_dir: PathBuf,
    /// With --dra: the driver's socket directory (holds dra.sock).
    #[arg(
        long,
        default_value = "/var/lib/kubelet/plugins/gpu.tessera.io",
        value_name = "DIR"
    )]
    dra_plugin_dir: PathBuf,
    /// With --dra: where the per-claim CDI specs are written.
    #[arg(long, default_value = "/var/run/cdi", value_name = "DIR")]
    cdi_dir: PathBuf,
    /// With --dra: API features the cluster has on, comma-separated:
    /// consumable-capacity (DRAConsumableCapacity), partitionable-mig
    /// (DRAPartitionableDevices), device-taints (DRADeviceTaints).
    #[arg(long, default_value = "", value_name = "LIST", value_parser = parse_dra_features)]
    dra_features: SliceOptions,
}

fn parse_dra_features(s: &str) -> Result<SliceOptions, String> {
    let mut o = SliceOptions::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "consumable-capacity" => o.consumable_capacity = true,
            "partitionable-mig" => o.partitionable_mig = true,
            "device-taints" => o.device_taints = true,
            _ => {
                return Err(format!(
                    "{part:?} is not one of consumable-capacity, partitionable-mig, device-taints"
                ));
            }
        }
    }
    Ok(o)
}

fn parse_device_list(s: &str) -> Result<DeviceList, String> {
    s.parse()
        .map_err(|e: tessera_node::deviceplugin::handover::UnknownStrategy| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1),
        Some((i, _)) => (
            &s[..i],
            match &s[i..] {
                "s" => 1,
                "m" => 60,
                "h" => 3600,
                other => return Err(format!("unknown unit {other:?} (use s, m or h)")),
            },
        ),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s, 10m or 1h"))?;
    Ok(Duration::from_secs(n * mult))
}

fn parse_xids(s: &str) -> Result<std::collections::BTreeSet<u64>, String> {
    XidPolicy::parse_list(s)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MigAction {
    Create,
    Destroy,
}

/// `--mig-create GPU:PROFILE@START` / `--mig-destroy GPU:MIG-UUID`: one backend
/// call, its result on stdout (JSON), NVML's refusal on stderr with exit 1.
fn mig_action(backend: &dyn GpuBackend, spec: &str, action: MigAction) -> anyhow::Result<ExitCode> {
    let flag = match action {
        MigAction::Create => "--mig-create",
        MigAction::Destroy => "--mig-destroy",
    };
    let Some((gpu, rest)) = spec.split_once(':') else {
        return bad_input(format!(
            "{flag} {spec:?}: expected GPU:{}",
            match action {
                MigAction::Create => "PROFILE@START",
                MigAction::Destroy => "MIG-UUID",
            }
        ));
    };
    let gpus = match backend.discover() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: backend {}: {e}", backend.name());
            return Ok(ExitCode::from(1));
        }
    };
    let Some(uuid) = gpus
        .iter()
        .find(|g| g.uuid == gpu || g.index.to_string() == gpu)
        .map(|g| g.uuid.clone())
    else {
        return bad_input(format!(
            "{flag}: no GPU {gpu:?} on this node (a UUID or an index)"
        ));
    };
    let result = match action {
        MigAction::Create => {
            let Some((profile, start)) = rest.rsplit_once('@') else {
                return bad_input(format!(
                    "{flag} {spec:?}: expected GPU:PROFILE@START, e.g. 0:1g.10gb@6"
                ));
            };
            let Ok(start) = start.parse::<u8>() else {
                return bad_input(format!(
                    "{flag} {spec:?}: START {start:?} is not a memory slice number"
                ));
            };
            backend
                .create_mig_instance(&uuid, profile, start)
                .map(|m| serde_json::json!({ "gpu": uuid, "created": m }))
        }
        MigAction::Destroy => backend
            .destroy_mig_instance(&uuid, rest)
            .map(|()| serde_json::json!({ "gpu": uuid, "destroyed": rest })),
    };
    match result {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn default_node_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub fn run(args: NodeAgentArgs) -> anyhow::Result<ExitCode> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();

    // Validate everything before touching sockets.
    let metrics_addr: Option<SocketAddr> = match args.metrics_addr.as_str() {
        "off" | "" => None,
        a => match a.parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                return bad_input(format!(
                    "--metrics-addr {a:?}: not an address like 0.0.0.0:9400"
                ));
            }
        },
    };
    let (backend, procs): (Arc<dyn GpuBackend>, Arc<dyn ProcReader>) = match args.backend {
        BackendKind::Fake => {
            let Some(path) = &args.fake_config else {
                return bad_input("--backend fake needs --fake-config FILE");
            };
            match Fake::from_file(path) {
                Ok(f) => {
                    let procs = Arc::new(f.proc_reader());
                    (Arc::new(f), procs)
                }
                Err(e) => return bad_input(e),
            }
        }
        BackendKind::Nvml => {
            if args.fake_config.is_some() {
                return bad_input("--fake-config is only used with --backend fake");
            }
            let procs: Arc<dyn ProcReader> = Arc::new(HostProc {
                root: args.proc_root.clone(),
            });
            match Nvml::init() {
                Ok(n) => (Arc::new(n), procs),
                Err(e) => {
                    if args.once
                        || args.print_inventory
                        || args.mig_create.is_some()
                        || args.mig_destroy.is_some()
                    {
                        eprintln!("error: backend nvml: {e}");
                        return Ok(ExitCode::from(1));
                    }
                    // Not Ready, retried: an agent that stayed Ready serving no GPU
                    // hid a node without a driver (issue 27 item 10).
                    let waited = tokio::runtime::Builder::new_multi_thread()
                        .enable_all()
                        .build()?
                        .block_on(tessera_node::startup::wait_for_backend(
                            "nvml",
                            Nvml::init,
                            metrics_addr,
                            tessera_node::startup::Retry::default(),
                            signalled(),
                        ))?;
                    match waited {
                        Some(n) => (Arc::new(n), procs),
                        None => return Ok(ExitCode::SUCCESS),
                    }
                }
            }
        }
    };
    eprintln!(
        "tessera node-agent: using backend {}{}",
        backend.name(),
        backend
            .driver_version()
            .map(|v| format!(" (driver {v})"))
            .unwrap_or_default()
    );
    let node_name = args
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(default_node_name);

    if let Some(spec) = &args.mig_create {
        return mig_action(backend.as_ref(), spec, MigAction::Create);
    }
    if let Some(spec) = &args.mig_destroy {
        return mig_action(backend.as_ref(), spec, MigAction::Destroy);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;

    if args.once || args.print_inventory {
        let (report, scrape) = rt.block_on(tessera_node::run::once_report(
            backend.clone(),
            procs.clone(),
            &node_name,
        ))?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        if args.once {
            println!("{scrape}");
            let n = report["gpus"].as_array().map(Vec::len).unwrap_or(0);
            if n == 0 {
                eprintln!("error: backend {} found no GPU", backend.name());
                return Ok(ExitCode::from(1));
            }
            return Ok(ExitCode::SUCCESS);
        }
    }

    if args.dra {
        return rt.block_on(run_dra(args, backend, procs, node_name, metrics_addr));
    }

    let key_file = args.allocation_key_file.clone().or_else(|| {
        std::env::var_os("TESSERA_ALLOCATION_KEY_FILE")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    });
    let allocation_key = match &key_file {
        Some(path) => match std::fs::read(path) {
            Ok(k) if !k.trim_ascii().is_empty() => k.trim_ascii().to_vec(),
            Ok(_) => {
                eprintln!(
                    "error: --allocation-key-file {}: the file is empty",
                    path.display()
                );
                return Ok(ExitCode::from(EXIT_BAD_CONFIG));
            }
            Err(e) => {
                eprintln!("error: --allocation-key-file {}: {e}", path.display());
                return Ok(ExitCode::from(EXIT_BAD_CONFIG));
            }
        },
        None => {
            eprintln!(
                "error: --allocation-key-file (or TESSERA_ALLOCATION_KEY_FILE) is required: it is the key that proves a decision came from the scheduler"
            );
            return Ok(ExitCode::from(EXIT_BAD_CONFIG));
        }
    };

    let verify_keys = match &args.verify_key_dir {
        Some(dir) => match tessera_k8s::run::read_verify_keys(dir) {
            Ok(keys) => keys.into_iter().map(|(_, k)| k).collect(),
            Err(e) => {
                eprintln!("error: --verify-key-dir: {e}");
                return Ok(ExitCode::from(EXIT_BAD_CONFIG));
            }
        },
        None => Vec::new(),
    };
    let allocation_key =
        tessera_core::allocation::KeyRing::new(allocation_key).with_verify_only(verify_keys);

    let mut xid_policy = XidPolicy::default();
    if let Some(extra) = &args.xid_ignore {
        xid_policy.ignored.extend(extra);
    }
    if let Some(fatal) = &args.xid_fatal {
        xid_policy.always_fatal.extend(fatal);
    }
    let config = AgentConfig {
        node_name: node_name.clone(),
        plugin: PluginConfig {
            dir: args.device_plugin_dir.clone(),
            poll: Duration::from_secs(1),
        },
        slots: args.slots,
        metrics_addr,
        xid_policy,
        quiet_period: args.quiet_period,
        health_interval: args.health_interval,
        heartbeat_period: tessera_node::run::HEARTBEAT_PERIOD,
        allocation_key,
        mps: MpsConfig {
            host_root: args.mps_root.clone(),
            per_gpu_daemons: args.mps_daemons == "per-gpu",
            ..MpsConfig::default()
        },
        mps_binary: args.mps_control_binary.clone(),
        device_list: args.device_list_strategy.clone(),
        nvidia_gpu: !args.no_nvidia_gpu_resource,
        node_labels: !args.no_node_labels,
        mig_grace: tessera_node::migplan::DEFAULT_GRACE,
        mig_state: (args.mig_state != "off").then(|| PathBuf::from(&args.mig_state)),
        allocate_state: (args.allocate_state != "off").then(|| PathBuf::from(&args.allocate_state)),
    };

    rt.block_on(async move {
        type MigSetting = tokio::sync::watch::Receiver<tessera_node::nodesettings::NodeSettings>;
        type FromApi = (Arc<dyn PodSource>, Option<Inventory>, Option<MigSetting>);
        let (pods, inventory, node_settings): FromApi = if args.no_kube {
            eprintln!("tessera node-agent: --no-kube: no inventory; Allocate refuses every pod (no decisions can be read)");
            (
                Arc::new(NoPods("the agent runs with --no-kube: pods cannot be looked up".into())),
                None,
                None,
            )
        } else {
            match tessera_node::run::kube_client().await {
                Ok(c) => (
                    Arc::new(KubePods::watch(c.clone(), &node_name)),
                    Some(Inventory::new(c.clone(), node_name.clone())),
                    Some(tessera_node::nodesettings::watch_settings(c, &node_name)),
                ),
                Err(e) => {
                    eprintln!("error: cannot reach the Kubernetes API ({e}); use --no-kube to run without it");
                    return Ok(ExitCode::from(EXIT_BAD_CONFIG));
                }
            }
        };
        let pod_resources: Option<Arc<dyn PodResourcesSource>> =
            if args.pod_resources_socket.as_os_str() == "off" {
                None
            } else {
                Some(Arc::new(KubeletPodResources {
                    socket: args.pod_resources_socket.clone(),
                }))
            };
        // The same API tells Allocate which pods the kubelet knows and feeds the
        // GpuNode status's podResources.
        let kubelet: Option<Arc<dyn KubeletPods>> =
            (args.pod_resources_socket.as_os_str() != "off").then(|| {
                Arc::new(PodResourcesClient {
                    socket: args.pod_resources_socket.clone(),
                }) as Arc<dyn KubeletPods>
            });
        let deps = AgentDeps {
            backend,
            procs,
            pods,
            pod_resources,
            kubelet,
            inventory,
            node_settings,
        };
        let shutdown = async {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("shutting down");
        };
        match tessera_node::run::run(config, deps, shutdown).await {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("error: {e}");
                Ok(ExitCode::from(1))
            }
        }
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn signalled() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

/// `--dra`: the DRA driver instead of the device plugin.
async fn run_dra(
    args: NodeAgentArgs,
    backend: Arc<dyn GpuBackend>,
    procs: Arc<dyn ProcReader>,
    node_name: String,
    probe_addr: Option<SocketAddr>,
) -> anyhow::Result<ExitCode> {
    let client = if args.no_kube {
        eprintln!(
            "tessera node-agent --dra --no-kube: no ResourceSlices are published and no claim can be prepared"
        );
        None
    } else {
        match tessera_node::run::kube_client().await {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!(
                    "error: cannot reach the Kubernetes API ({e}); use --no-kube to run without it"
                );
                return Ok(ExitCode::from(EXIT_BAD_CONFIG));
            }
        }
    };
    let mut xid_policy = XidPolicy::default();
    if let Some(extra) = &args.xid_ignore {
        xid_policy.ignored.extend(extra);
    }
    if let Some(fatal) = &args.xid_fatal {
        xid_policy.always_fatal.extend(fatal);
    }
    let sockets = DraConfig {
        registry_dir: args.dra_registry_dir.clone(),
        plugin_dir: args.dra_plugin_dir.clone(),
    };
    let config = DriverConfig {
        node_name,
        sockets: sockets.clone(),
        cdi_dir: args.cdi_dir.clone(),
        options: args.dra_features,
        health_interval: args.health_interval,
        xid_policy,
        quiet_period: args.quiet_period,
        // /healthz, /readyz and /metrics.
        probe_addr,
        // Shares are MPS clients as on the device-plugin path: the same flags say
        // where the pipes are and whether the agent runs the daemons.
        mps: MpsConfig {
            host_root: args.mps_root.clone(),
            per_gpu_daemons: args.mps_daemons == "per-gpu",
            ..MpsConfig::default()
        },
        mps_binary: args.mps_control_binary.clone(),
        mps_grace: tessera_node::migplan::DEFAULT_GRACE,
        state_file: Some(DriverConfig::default_state_file(&sockets)),
        // No slice while device-plugin pods still hold the node's GPUs.
        pod_resources_socket: (args.pod_resources_socket.as_os_str() != "off")
            .then(|| args.pod_resources_socket.clone()),
    };
    match run_driver(config, backend, procs, client, signalled()).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dra_is_off_by_default_and_its_features_parse() {
        use clap::Parser;
        let cli = Cli::try_parse_from(["node-agent"]).unwrap();
        assert!(!cli.args.dra);
        assert_eq!(cli.args.dra_features, SliceOptions::default());
        assert_eq!(
            cli.args.dra_registry_dir,
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        let cli = Cli::try_parse_from([
            "node-agent",
            "--dra",
            "--dra-features",
            "device-taints,consumable-capacity",
        ])
        .unwrap();
        assert!(cli.args.dra);
        assert_eq!(
            cli.args.dra_features,
            SliceOptions {
                consumable_capacity: true,
                partitionable_mig: false,
                device_taints: true
            }
        );
        let e = Cli::try_parse_from(["node-agent", "--dra-features", "taints"]).unwrap_err();
        assert!(e.to_string().contains("\"taints\" is not one of"), "{e}");
    }

    #[test]
    fn durations_and_xid_lists() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_xids("79,x").is_err());
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: NodeAgentArgs,
    }

    fn code(args: &[&str]) -> String {
        use clap::Parser;
        let cli = Cli::try_parse_from(std::iter::once("node-agent").chain(args.iter().copied()))
            .expect("flags parse");
        format!("{:?}", run(cli.args).unwrap())
    }

    #[test]
    fn bad_input_exits_2_and_once_reports_gpus() {
        use clap::Parser;
        let two = format!("{:?}", ExitCode::from(2));
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.yaml");
        std::fs::write(
            &bad,
            "gpus: [ { uuid: GPU-1, product: T4, memoryMib: lots } ]\n",
        )
        .unwrap();
        assert_eq!(
            code(&[
                "--backend",
                "fake",
                "--fake-config",
                bad.to_str().unwrap(),
                "--once"
            ]),
            two
        );
        assert_eq!(
            code(&["--backend", "fake", "--once"]),
            two,
            "fake needs a file"
        );
        assert_eq!(
            code(&["--backend", "fake", "--fake-config", "/nonexistent.yaml"]),
            two
        );
        let good = dir.path().join("good.yaml");
        std::fs::write(&good, "gpus: [ { uuid: GPU-1, product: Tesla T4 } ]\n").unwrap();
        assert_eq!(
            code(&[
                "--backend",
                "fake",
                "--fake-config",
                good.to_str().unwrap(),
                "--metrics-addr",
                "nowhere"
            ]),
            two
        );
        assert_eq!(
            code(&[
                "--backend",
                "fake",
                "--fake-config",
                good.to_str().unwrap(),
                "--once",
                "--node-name",
                "n"
            ]),
            format!("{:?}", ExitCode::SUCCESS)
        );
        // Flag errors come from clap; main.rs turns them into exit code 2.
        for bad_flags in [
            &["--backend", "cuda"][..],
            &["--slots", "0"],
            &["--quiet-period", "soon"],
            &["--device-list-strategy", "volume-mount"],
            &["--bogus"],
        ] {
            let e =
                Cli::try_parse_from(std::iter::once("node-agent").chain(bad_flags.iter().copied()))
                    .unwrap_err();
            assert!(e.use_stderr(), "{bad_flags:?}");
        }
    }
}
