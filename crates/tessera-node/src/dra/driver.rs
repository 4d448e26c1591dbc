//! The DRA driver as one task: discovery, a health probe, slice publishing
//! and the two gRPC sockets, until shutdown (what `tessera node-agent --dra`
//! runs).
//!
//! It runs *instead of* the device plugin on a node, never beside it: the two
//! paths would hand out the same GPUs. Health is the device plugin's rules
//! ([`HealthTracker`]: fatal XIDs hold a GPU down for the quiet period, the
//! backend's probe on every `health_interval`), turned into device taints (or
//! the device left out, see [`SliceOptions::device_taints`]) and refused at
//! prepare. Prepare creates allocated MIG placements' instances and starts
//! shares' MPS daemons ([`super::prepare`]); the daemons are supervised here on
//! the health tick, and what was set up for which claim is kept in
//! [`DriverConfig::state_file`]. Once the kubelet has registered the driver,
//! and then every [`super::sweep::SWEEP_PERIOD`], prepared claims the API
//! server says are gone are released ([`super::sweep`]). `/healthz` and
//! `/readyz` are served on `probe_addr` ([`super::probe`]); the metrics and
//! `GpuNode` inventory of the device-plugin agent ([`crate::run`]) are not part
//! of this mode yet.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::DraConfig;
use super::apiserver::{KubeClaims, SlicePublisher};
use super::handover;
use super::mig::MigCreator;
use super::prepare::{ClaimError, ClaimSource, Preparer, ResourceClaim};
use super::probe::SliceState;
use super::registration::RegistrationState;
use super::server::{DraServerError, serve};
use super::share::ShareMps;
use super::slice::{DriverVersions, SliceOptions, resource_slices};
use super::sweep::Sweeper;
use crate::backend::{BackendError, GpuBackend, Probe, ProcReader, XidEvent};
use crate::deviceplugin::NodeView;
use crate::deviceplugin::allocate::{MpsConfig, NoPods};
use crate::health::{HealthTracker, XidPolicy};
use crate::metrics::{Collector, ReleasedClaims, XidStats};
use crate::mps::{MpsDaemonConfig, MpsDaemons};
use crate::podresources::PodResourcesClient;

/// How long a failed publish waits before the next try.
const PUBLISH_RETRY: Duration = Duration::from_secs(10);

/// The driver's settings (validated by the binary).
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub node_name: String,
    pub sockets: DraConfig,
    /// Where the per-claim CDI specs are written (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    pub options: SliceOptions,
    pub health_interval: Duration,
    pub xid_policy: XidPolicy,
    /// How long a GPU stays withdrawn after its last fatal XID.
    pub quiet_period: Duration,
    /// Where `/healthz`, `/readyz` and `/metrics` are served (`None`: nowhere).
    pub probe_addr: Option<SocketAddr>,
    /// Where MPS daemons' pipes are and whether the driver runs them (per GPU set).
    pub mps: MpsConfig,
    /// The MPS control binary started with per-GPU daemons.
    pub mps_binary: PathBuf,
    /// How long an MPS daemon no prepared claim uses is kept before it is stopped.
    pub mps_grace: Duration,
    /// Where what prepare set up for which claim (MIG instances it created, MPS
    /// daemons in use) is kept across restarts (`None`: memory only, so an agent
    /// restart leaks the instances of claims prepared before it).
    pub state_file: Option<PathBuf>,
    /// The kubelet's PodResources socket: no slice is published while pods hold
    /// device-plugin GPUs on the node ([`super::handover`]). `None`: not checked.
    pub pod_resources_socket: Option<PathBuf>,
}

impl DriverConfig {
    /// The default state file: beside the DRA socket, in the directory the
    /// DaemonSet mounts from the host, so it outlives the agent's container.
    pub fn default_state_file(sockets: &DraConfig) -> PathBuf {
        sockets.plugin_dir.join("prepared.json")
    }
}

/// Failures that stop the driver.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Server(#[from] DraServerError),
    #[error("cannot listen for /healthz and /readyz on {addr}: {source}")]
    Probe {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Without an API server no claim can be read: every prepare says so.
struct NoApiServer;

#[tonic::async_trait]
impl ClaimSource for NoApiServer {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        Err(ClaimError::Unreadable(format!(
            "cannot read resourceclaim {namespace}/{name}: the agent runs without a Kubernetes API server"
        )))
    }
}

/// The node's GPUs and their health, kept current: XID events (a blocking
/// thread waits on the backend) and the backend's probe every `interval` go
/// through a [`HealthTracker`], as on the device-plugin path. The task ends when
/// every receiver is gone; dropping the returned guard stops the XID thread.
pub async fn watch_health(
    backend: Arc<dyn GpuBackend>,
    policy: XidPolicy,
    quiet_period: Duration,
    interval: Duration,
    xids: XidStats,
) -> Result<(watch::Receiver<NodeView>, HealthGuard), BackendError> {
    let b = backend.clone();
    let gpus = tokio::task::spawn_blocking(move || b.discover())
        .await
        .map_err(|e| BackendError::Nvml {
            call: "discover",
            gpu: "*".into(),
            message: e.to_string(),
        })??;
    let mut tracker = HealthTracker::new(gpus.iter().map(|g| g.uuid.clone()), policy, quiet_period);
    let (view_tx, view) = watch::channel(NodeView {
        settings: Default::default(),
        gpus,
        health: tracker.all(),
    });
    let sender = view_tx.clone();
    let halt = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (xid_tx, mut xid_rx) = tokio::sync::mpsc::unbounded_channel::<XidEvent>();
    {
        let b = backend.clone();
        let halt = halt.clone();
        std::thread::Builder::new()
            .name("dra-xid-events".into())
            .spawn(move || {
                while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                    match b.wait_xid_events(Duration::from_millis(500)) {
                        Ok(events) => {
                            for e in events {
                                if xid_tx.send(e).is_err() {
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "XID event wait failed");
                            std::thread::sleep(Duration::from_secs(1));
                        }
                    }
                }
            })
            .map_err(|e| BackendError::Nvml {
                call: "spawn xid thread",
                gpu: "*".into(),
                message: e.to_string(),
            })?;
    }
    let task = tokio::spawn(async move {
        loop {
            let mut changes = Vec::new();
            tokio::select! {
                _ = view_tx.closed() => return,
                Some(ev) = xid_rx.recv() => {
                    tracing::warn!(gpu = %ev.uuid, xid = ev.xid, "XID event");
                    xids.record(&ev.uuid, ev.xid);
                    changes.extend(tracker.on_xid(&ev, Instant::now()));
                }
                _ = tokio::time::sleep(interval) => {
                    let uuids: Vec<String> =
                        view_tx.borrow().gpus.iter().map(|g| g.uuid.clone()).collect();
                    for uuid in uuids {
                        let b = backend.clone();
                        let u = uuid.clone();
                        let probe = match tokio::task::spawn_blocking(move || b.read(&u)).await {
                            Ok(Ok(r)) => r.probe,
                            Ok(Err(e)) => Probe::Failing(e.to_string()),
                            Err(e) => Probe::Failing(e.to_string()),
                        };
                        changes.extend(tracker.on_probe(&uuid, &probe, Instant::now()));
                    }
                    changes.extend(tracker.tick(Instant::now()));
                }
            }
            if !changes.is_empty() {
                view_tx.send_modify(|v| v.health = tracker.all());
            }
        }
    });
    Ok((
        view,
        HealthGuard {
            halt,
            task,
            view: sender,
        },
    ))
}

/// Stops [`watch_health`]'s thread and task when dropped.
#[derive(Debug)]
pub struct HealthGuard {
    halt: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    view: watch::Sender<NodeView>,
}

impl HealthGuard {
    /// The view's sender, for a change of the GPUs' layout made by the driver
    /// itself (a MIG instance created at prepare): health stays the task's.
    pub fn view_sender(&self) -> watch::Sender<NodeView> {
        self.view.clone()
    }
}

impl Drop for HealthGuard {
    fn drop(&mut self) {
        self.halt.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.abort();
    }
}

/// Runs the driver until `shutdown` resolves.
/// `procs` reads the GPU processes' cgroups for `/metrics` (their memory by pod).
pub async fn run_driver(
    config: DriverConfig,
    backend: Arc<dyn GpuBackend>,
    procs: Arc<dyn ProcReader>,
    client: Option<kube::Client>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DriverError> {
    let source: Arc<dyn ClaimSource> = match &client {
        Some(c) => Arc::new(KubeClaims::new(c.clone())),
        None => Arc::new(NoApiServer),
    };
    run_driver_with_claims(config, backend, procs, client, source, shutdown).await
}

/// [`run_driver`] reading claims from `source` (a test's fake API).
pub async fn run_driver_with_claims(
    config: DriverConfig,
    backend: Arc<dyn GpuBackend>,
    procs: Arc<dyn ProcReader>,
    client: Option<kube::Client>,
    source: Arc<dyn ClaimSource>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DriverError> {
    let xids = XidStats::default();
    let (view, health) = watch_health(
        backend.clone(),
        config.xid_policy.clone(),
        config.quiet_period,
        config.health_interval,
        xids.clone(),
    )
    .await?;
    // The device-plugin agent's readings of every GPU. Pods are not read in this
    // mode (claims, not annotations, say what a pod holds): GPU processes are
    // attributed by the pod UID in their cgroup.
    let released = ReleasedClaims::default();
    let collector = Arc::new(
        Collector::new(
            config.node_name.clone(),
            backend.clone(),
            procs,
            Arc::new(NoPods(
                "the DRA driver does not read pods; GPU processes are attributed by pod UID".into(),
            )),
            None,
            view.clone(),
            xids,
        )
        .with_released_claims(released.clone()),
    );
    tracing::info!(gpus = view.borrow().gpus.len(), "DRA driver: GPUs found");
    let versions = DriverVersions {
        driver: backend.driver_version(),
        cuda: backend.cuda_version(),
    };

    // Bound before anything is served: a taken port is a configuration error.
    let probe_listener = match config.probe_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DriverError::Probe { addr, source })?,
        ),
        None => None,
    };
    let (slice_state, slice_state_rx) = watch::channel(SliceState {
        no_api_server: client.is_none(),
        ..Default::default()
    });

    // The node's GpuNode, if the device-plugin agent left one or writes one
    // later (an agent started before the slices were published): Tessera's
    // scheduler must not place pods here by it (it would count GPUs the DRA
    // allocator hands out). Deleted whenever the watch of that one object
    // shows it, retried until it is gone.
    let retire = client.clone().map(|c| {
        let node = config.node_name.clone();
        tokio::spawn(keep_retired(c, node))
    });

    // Slices: published at start and on every change of the view.
    let publisher = client.clone().map(|c| {
        let mut view = view.clone();
        let node = config.node_name.clone();
        let options = config.options;
        let kubelet = config
            .pod_resources_socket
            .clone()
            .map(|socket| PodResourcesClient { socket });
        tokio::spawn(async move {
            let mut publisher = SlicePublisher::new(c.clone(), node.clone());
            // Nothing is published while device-plugin pods hold the node's GPUs.
            let mut held: Option<String> = None;
            // Generations must grow across restarts of the agent: start from the clock.
            let mut generation = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| i64::try_from(d.as_secs()).unwrap_or(1));
            loop {
                if let Some(k) = &kubelet {
                    let verdict = handover::check(k).await;
                    slice_state.send_modify(|s| s.blocked = verdict.clone().err());
                    if let Err(why) = verdict {
                        if held.as_deref() != Some(why.as_str()) {
                            tracing::warn!(reason = %why, "ResourceSlices held back");
                            if let Err(e) = handover::report(&c, &node, &why).await {
                                tracing::warn!(error = %e, "cannot record the event");
                            }
                            held = Some(why);
                        }
                        tokio::time::sleep(PUBLISH_RETRY).await;
                        continue;
                    }
                    held = None;
                }
                let slices = resource_slices(
                    &node,
                    &view.borrow_and_update(),
                    &versions,
                    generation,
                    options,
                );
                let published = publisher.publish(&slices).await;
                // Every attempt gets a new generation: a half-applied pool is never
                // completed with other contents under the same number.
                generation += 1;
                slice_state.send_modify(|s| match &published {
                    Ok(()) => {
                        s.published = Some(slices.len());
                        s.last_error = None;
                    }
                    Err(e) => s.last_error = Some(e.to_string()),
                });
                match published {
                    Ok(()) => {
                        tracing::info!(slices = slices.len(), generation = generation - 1, version = ?publisher.version(), "ResourceSlices published");
                        if view.changed().await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot publish ResourceSlices; retrying");
                        tokio::time::sleep(PUBLISH_RETRY).await;
                    }
                }
            }
        })
    });

    // MPS daemons of shares: started at prepare, supervised here (restarted
    // while a prepared claim uses them, stopped once none has for the grace).
    let daemons = config.mps.per_gpu_daemons.then(|| {
        Arc::new(MpsDaemons::new(MpsDaemonConfig {
            binary: config.mps_binary.clone(),
            root: config.mps.host_root.clone().into(),
            grace: config.mps_grace,
            ..MpsDaemonConfig::default()
        }))
    });
    let mut preparer = Preparer::new(
        source,
        view.clone(),
        config.node_name.clone(),
        config.cdi_dir.clone(),
    )
    .with_options(config.options)
    .with_mig(MigCreator::new(backend.clone(), health.view_sender()))
    .with_mps(ShareMps {
        config: config.mps.clone(),
        daemons: daemons.clone(),
    });
    if let Some(path) = &config.state_file {
        preparer = preparer.with_state(path.clone());
    }
    let preparer = Arc::new(preparer);
    let supervisor = daemons.is_some().then(|| {
        let preparer = preparer.clone();
        // On the health tick, as on the device-plugin path (its reap tick).
        let every = config.health_interval.max(Duration::from_millis(50));
        tokio::spawn(async move {
            loop {
                // First at once: claims prepared before a restart get their daemons back.
                preparer.supervise_mps().await;
                tokio::time::sleep(every).await;
            }
        })
    });
    let (state, registration) = watch::channel(RegistrationState::Pending);
    // Claims whose unprepare never comes: swept once the kubelet has registered
    // the driver (it has then had its chance to unprepare), then periodically.
    let sweeper = {
        let mut registered = state.subscribe();
        let sweeper = Sweeper::new(preparer.clone(), released);
        tokio::spawn(async move {
            if registered
                .wait_for(|s| *s == RegistrationState::Registered)
                .await
                .is_ok()
            {
                super::sweep::run(sweeper).await;
            }
        })
    };
    let (probe_stop, probe_stopped) = tokio::sync::oneshot::channel::<()>();
    let probes = probe_listener.map(|listener| {
        let app = super::probe::router(registration, slice_state_rx, view)
            .merge(collector.metrics_router());
        tokio::spawn(async move {
            let stopped = async {
                let _ = probe_stopped.await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stopped)
                .await
            {
                tracing::error!(error = %e, "the DRA driver's probe server failed");
            }
        })
    });
    let result = serve(&config.sockets, preparer, state, shutdown).await;
    sweeper.abort();
    let _ = sweeper.await;
    if let Some(s) = supervisor {
        s.abort();
        let _ = s.await;
    }
    if let Some(d) = daemons {
        // Stopped with the driver; their clients lose them, as on the device-plugin path.
        tokio::task::spawn_blocking(move || d.shutdown()).await.ok();
    }
    if let Some(p) = publisher {
        p.abort();
    }
    if let Some(r) = retire {
        r.abort();
    }
    let _ = probe_stop.send(());
    if let Some(p) = probes {
        let _ = p.await;
    }
    Ok(result?)
}

/// Keeps `node` free of a `GpuNode` while the driver runs: a watch of that
/// one object (field selector on its name), and each time it shows one, the
/// delete of [`crate::inventory::Inventory::retire`] (on the object read,
/// with its UID and resourceVersion as preconditions), retried with a growing
/// pause until it is gone.
async fn keep_retired(client: kube::Client, node: String) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let inventory = crate::inventory::Inventory::new(client.clone(), node.clone());
    let api: kube::Api<tessera_api::GpuNode> = kube::Api::all(client);
    let config = crate::pods::watch_cache_config(&format!("metadata.name={node}"));
    let stream = watcher(api, config).default_backoff().applied_objects();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        if let Err(e) = event {
            tracing::warn!(error = %e, "GpuNode watch failed; retrying");
            continue;
        }
        let mut pause = Duration::from_secs(1);
        loop {
            match inventory.retire().await {
                Ok(true) => {
                    tracing::info!("GpuNode deleted: this node is served through DRA");
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "GpuNode of this node not deleted; retrying")
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(60));
        }
    }
}
