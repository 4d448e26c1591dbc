//! Wires the agent together: discovery, health loop, device plugins, metrics
//! server and inventory. Takes a shutdown future; signals belong to the binary.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::backend::{BackendError, GpuBackend, ProcReader, XidEvent};
use crate::deviceplugin::allocate::{Allocator, Handover, MpsConfig, PodSource};
use crate::deviceplugin::handover::DeviceList;
use crate::deviceplugin::registration::{PluginConfig, PluginStatus, run_plugins};
use crate::deviceplugin::{NodeView, Resource};
use crate::health::{GpuHealth, HealthTracker, XidPolicy};
use crate::inventory::{
    Heartbeat, Inventory, gpu_node_spec, gpu_node_status, heartbeat_now, node_labels,
};
use crate::metrics::{Collector, PodResourcesSource, XidStats};
use crate::migplan::MigPlanner;
use crate::mps::{MpsDaemonConfig, MpsDaemons, held_sets};
use crate::nodesettings::NodeSettings;
use crate::podresources::{KubeletPods, report};

/// How often a running agent rewrites its `GpuNode` status when nothing in it
/// changed (the period the scheduler's staleness TTL is counted in).
pub use tessera_api::gpunode::HEARTBEAT_PERIOD;
/// How often the kubelet's PodResources API is read for the `GpuNode` status
/// (also shortly after each `Allocate`); the status is written when it changes.
const POD_RESOURCES_REFRESH: Duration = Duration::from_secs(10);
/// How long after an `Allocate` answer the kubelet is asked again: it records
/// the devices once it has the answer.
const AFTER_ALLOCATE: Duration = Duration::from_millis(300);
/// How often an agent that found its node served through DRA looks again.
pub const DRA_RECHECK: Duration = Duration::from_secs(10);

/// The agent's settings (validated by the binary).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    pub plugin: PluginConfig,
    /// `tessera.io/gpu` tokens per GPU.
    pub slots: u32,
    /// Where `/metrics` listens; `None` turns it off.
    pub metrics_addr: Option<SocketAddr>,
    pub xid_policy: XidPolicy,
    /// How long a GPU stays withdrawn after its last fatal XID.
    pub quiet_period: Duration,
    /// How often the backend is probed for health.
    pub health_interval: Duration,
    /// How often the `GpuNode` status is rewritten (with a fresh `heartbeatTime`)
    /// when nothing in it changed: the scheduler stops placing pods on a node
    /// whose GpuNode stays unchanged for a few periods. Normally
    /// [`tessera_api::gpunode::HEARTBEAT_PERIOD`]; shorter only in tests.
    pub heartbeat_period: Duration,
    /// HMAC key shared with the scheduler, and keys that verify only (a rotation's
    /// previous or next key).
    pub allocation_key: tessera_core::allocation::KeyRing,
    pub mps: MpsConfig,
    /// How devices are handed to containers (`--device-list-strategy`).
    pub device_list: DeviceList,
    /// Also serve `nvidia.com/gpu` (whole GPUs) and `nvidia.com/mig-<profile>` (MIG
    /// instances, the "mixed" strategy's names) for pods written for NVIDIA's plugin.
    pub nvidia_gpu: bool,
    /// Write GFD-style labels on the Node.
    pub node_labels: bool,
    /// How long a MIG instance or MPS daemon the agent made for a decision is kept
    /// after no decision holds it (for reuse) before it is destroyed or stopped.
    pub mig_grace: Duration,
    /// Where the MIG instances the agent made are recorded, so they are still reaped
    /// after an agent restart (`None`: not kept; they would outlive a restart).
    pub mig_state: Option<std::path::PathBuf>,
    /// The MPS control binary the agent starts per GPU set when
    /// [`MpsConfig::per_gpu_daemons`] is on.
    pub mps_binary: std::path::PathBuf,
    /// Where `Allocate` keeps the answers it gave, so an agent restart does not
    /// make an answered pod look unanswered (`None`: memory only).
    pub allocate_state: Option<std::path::PathBuf>,
}

/// The agent's collaborators.
pub struct AgentDeps {
    pub backend: Arc<dyn GpuBackend>,
    pub procs: Arc<dyn ProcReader>,
    pub pods: Arc<dyn PodSource>,
    pub pod_resources: Option<Arc<dyn PodResourcesSource>>,
    /// The kubelet's PodResources API for `Allocate` and the `GpuNode` status's
    /// `podResources` (`None`: not asked; the status then has none).
    pub kubelet: Option<Arc<dyn KubeletPods>>,
    /// `None` when there is no API server (fake mode without a cluster).
    pub inventory: Option<Inventory>,
    /// The Node's MIG settings ([`crate::nodesettings::watch_settings`]);
    /// `None`: both off.
    pub node_settings: Option<watch::Receiver<NodeSettings>>,
}

/// Failures that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Plugin(#[from] crate::deviceplugin::registration::RegistrationError),
    #[error(transparent)]
    State(#[from] crate::deviceplugin::allocate::StateError),
    #[error("cannot listen for metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Runs until `shutdown` resolves.
pub async fn run(
    config: AgentConfig,
    deps: AgentDeps,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let backend = deps.backend.clone();
    let gpus = {
        let b = backend.clone();
        tokio::task::spawn_blocking(move || b.discover())
            .await
            .map_err(|e| BackendError::Nvml {
                call: "discover",
                gpu: "*".into(),
                message: e.to_string(),
            })??
    };
    tracing::info!(backend = backend.name(), gpus = gpus.len(), node = %config.node_name, "discovered GPUs");
    for g in &gpus {
        tracing::info!(index = g.index, uuid = %g.uuid, product = %g.product, memory_mib = g.memory_mib, mig = g.mig_enabled, "GPU");
    }
    let mut tracker = HealthTracker::new(
        gpus.iter().map(|g| g.uuid.clone()),
        config.xid_policy.clone(),
        config.quiet_period,
    );
    let (view_tx, view_rx) = watch::channel(NodeView {
        gpus: gpus.clone(),
        health: tracker.all(),
        settings: deps
            .node_settings
            .as_ref()
            .map_or_else(Default::default, |rx| *rx.borrow()),
    });
    // The Node's MIG settings, into the view: the device plugins follow them.
    let settings_task = deps.node_settings.clone().map(|mut rx| {
        let tx = view_tx.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let now = *rx.borrow_and_update();
                tx.send_if_modified(|v| std::mem::replace(&mut v.settings, now) != now);
            }
        })
    });
    let view_tx_mig = view_tx.clone();
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    // A node the DRA driver serves is not offered again through a GpuNode and
    // device plugins (a restarted agent after a handover, a DaemonSet not yet
    // rolled): wait until its slices are gone.
    let mut shutdown = Box::pin(shutdown);
    if let Some(inv) = &deps.inventory
        && !yield_to_dra(inv, &mut shutdown).await
    {
        if let Some(t) = &settings_task {
            t.abort();
        }
        return Ok(());
    }

    // Inventory: spec and labels once, status on every health change.
    if let Some(inv) = &deps.inventory {
        let view = view_rx.borrow().clone();
        let spec = gpu_node_spec(&config.node_name, &view);
        if let Err(e) = inv.publish_spec(&spec).await {
            tracing::warn!(error = %e, "inventory not published");
        }
        let mut status = gpu_node_status(&spec, &view, 0);
        status.heartbeat_time = Some(heartbeat_now());
        if let Err(e) = inv.publish_status(&status).await {
            tracing::warn!(error = %e, "inventory status not published");
        }
        // Whether this agent's plugin answers `nvidia.com/gpu` here: other
        // schedulers' pods asking it cannot run on this node.
        let served = config
            .nvidia_gpu
            .then_some(tessera_api::gpunode::NVIDIA_GPU_SERVED);
        if let Err(e) = inv
            .publish_label(tessera_api::gpunode::NVIDIA_GPU_LABEL, served)
            .await
        {
            tracing::warn!(error = %e, "nvidia.com/gpu label not published");
        }
        if config.node_labels {
            let labels = node_labels(
                &view.gpus,
                backend.driver_version().as_deref(),
                backend.cuda_version().as_deref(),
            );
            if let Err(e) = inv.publish_labels(&labels).await {
                tracing::warn!(error = %e, "node labels not published");
            }
        }
    }

    // XID events: a blocking thread waits on the backend.
    let xids = XidStats::default();
    let (xid_tx, mut xid_rx) = mpsc::unbounded_channel::<XidEvent>();
    let halt = Arc::new(AtomicBool::new(false));
    {
        let b = backend.clone();
        let halt = halt.clone();
        std::thread::Builder::new()
            .name("xid-events".into())
            .spawn(move || {
                while !halt.load(Ordering::Relaxed) {
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

    // MPS: the control daemon of an MPS share's GPUs is started at Allocate and
    // supervised here (restarted while held, stopped once nothing holds it).
    let mps_daemons = config.mps.per_gpu_daemons.then(|| {
        Arc::new(MpsDaemons::new(MpsDaemonConfig {
            binary: config.mps_binary.clone(),
            root: config.mps.host_root.clone().into(),
            grace: config.mig_grace,
            ..MpsDaemonConfig::default()
        }))
    });
    // What the kubelet says each pod holds, for the status: written by the
    // PodResources task below, published by the health loop when it changes.
    let (report_tx, mut report_rx) = watch::channel(None::<tessera_api::PodResourcesReport>);
    // Health loop.
    let health_task = {
        let backend = backend.clone();
        let inventory = deps.inventory.clone();
        let mps_daemons = mps_daemons.clone();
        let node = config.node_name.clone();
        let xids = xids.clone();
        let interval = config.health_interval;
        let mut heartbeat = Heartbeat::new(config.heartbeat_period, Instant::now());
        let stop = stopped();
        tokio::spawn(async move {
            let mut stop = std::pin::pin!(stop);
            let mut free_mib = 0u64;
            let mut last_mps: Vec<tessera_api::MpsDaemonState> = Vec::new();
            loop {
                let mut changes = Vec::new();
                let mut report_changed = false;
                tokio::select! {
                    _ = &mut stop => break,
                    // Its own wake-up: a health interval longer than the period
                    // (or none elapsing, under a stream of events) must not
                    // delay the heartbeat past the scheduler's TTL.
                    _ = tokio::time::sleep_until(heartbeat.deadline().into()) => {}
                    Ok(()) = report_rx.changed() => report_changed = true,
                    Some(ev) = xid_rx.recv() => {
                        let info = crate::health::xid_info(ev.xid);
                        tracing::warn!(gpu = %ev.uuid, xid = ev.xid, meaning = info.map(|i| i.name).unwrap_or("unlisted"), "XID event");
                        xids.record(&ev.uuid, ev.xid);
                        changes.extend(tracker.on_xid(&ev, Instant::now()));
                    }
                    _ = tokio::time::sleep(interval) => {
                        let uuids: Vec<String> = view_tx.borrow().gpus.iter().map(|g| g.uuid.clone()).collect();
                        let mut free = 0;
                        for uuid in uuids {
                            let b = backend.clone();
                            let u = uuid.clone();
                            let probe = tokio::task::spawn_blocking(move || b.read(&u)).await;
                            let probe = match probe {
                                Ok(Ok(r)) => {
                                    free += r.memory_free_mib.unwrap_or(0);
                                    r.probe
                                }
                                Ok(Err(e)) => crate::backend::Probe::Failing(e.to_string()),
                                Err(e) => crate::backend::Probe::Failing(e.to_string()),
                            };
                            changes.extend(tracker.on_probe(&uuid, &probe, Instant::now()));
                        }
                        changes.extend(tracker.tick(Instant::now()));
                        free_mib = free;
                    }
                }
                let status_due = heartbeat.due(Instant::now());
                if changes.is_empty() && !status_due && !report_changed {
                    continue;
                }
                for c in &changes {
                    match &c.health {
                        GpuHealth::Healthy => tracing::info!(gpu = %c.uuid, "GPU back in service"),
                        GpuHealth::Unhealthy { reason, .. } => {
                            tracing::warn!(gpu = %c.uuid, %reason, "GPU withdrawn")
                        }
                    }
                }
                if !changes.is_empty() {
                    view_tx.send_modify(|v| v.health = tracker.all());
                }
                // Also without an API server: the deadline must move on, or its
                // wake-up would fire at once, every turn.
                heartbeat.written(Instant::now());
                if let Some(inv) = &inventory {
                    let view = view_tx.borrow().clone();
                    let spec = gpu_node_spec(&node, &view);
                    let mut status = gpu_node_status(&spec, &view, free_mib);
                    // While a daemon is being started its state is not read (that
                    // waits); the last one read is published again.
                    if let Some(now) = mps_daemons.as_ref().and_then(|d| d.try_status()) {
                        last_mps = now
                            .into_iter()
                            .map(|s| tessera_api::MpsDaemonState {
                                gpus: s.gpus,
                                running: s.running,
                                restarts: s.restarts,
                                last_exit: s.last_exit,
                            })
                            .collect();
                    }
                    status.mps_daemons = last_mps.clone();
                    status.pod_resources = report_rx.borrow_and_update().clone();
                    status.heartbeat_time = Some(heartbeat_now());
                    if let Err(e) = inv.publish_status(&status).await {
                        tracing::warn!(error = %e, "inventory status not published");
                    }
                }
            }
        })
    };

    // Metrics.
    let collector = Collector::new(
        config.node_name.clone(),
        backend.clone(),
        deps.procs.clone(),
        deps.pods.clone(),
        deps.pod_resources.clone(),
        view_rx.clone(),
        xids.clone(),
    );
    let collector = Arc::new(match &mps_daemons {
        Some(d) => collector.with_mps(d.clone()),
        None => collector,
    });
    let metrics_task = match config.metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| RunError::Metrics { addr, source: e })?;
            tracing::info!(%addr, "serving /metrics");
            let app = collector.router();
            let stop = stopped();
            Some(tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await
                {
                    tracing::error!(error = %e, "metrics server failed");
                }
            }))
        }
        None => None,
    };

    // The GpuNode spec again whenever the GPUs' layout changes (dynamic MIG), so the
    // scheduler's inventory shows the instances the agent created or destroyed.
    let spec_task = deps.inventory.clone().map(|inv| {
        let mut rx = view_rx.clone();
        let node = config.node_name.clone();
        let stop = stopped();
        tokio::spawn(async move {
            let mut stop = std::pin::pin!(stop);
            let mut last = gpu_node_spec(&node, &rx.borrow_and_update());
            loop {
                tokio::select! {
                    _ = &mut stop => break,
                    changed = rx.changed() => if changed.is_err() { break },
                }
                let spec = gpu_node_spec(&node, &rx.borrow_and_update());
                if spec != last {
                    if let Err(e) = inv.publish_spec(&spec).await {
                        tracing::warn!(error = %e, "inventory not republished");
                    }
                    last = spec;
                }
            }
        })
    });

    // Dynamic MIG: planned instances are created at Allocate, reaped after the grace.
    let planner = MigPlanner::new(backend.clone(), view_tx_mig, config.mig_grace);
    let planner = Arc::new(match config.mig_state.clone() {
        Some(path) => planner.with_state(path),
        None => planner,
    });
    let reap_task = {
        let planner = planner.clone();
        let mps_daemons = mps_daemons.clone();
        let view_for_mps = view_rx.clone();
        let pods = deps.pods.clone();
        let node = config.node_name.clone();
        let key = config.allocation_key.clone();
        let interval = config.health_interval.max(Duration::from_millis(50));
        let stop = stopped();
        tokio::spawn(async move {
            let mut stop = std::pin::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(interval) => {}
                }
                // Without a pod list nothing is known to be unheld: keep everything.
                let Ok(list) = pods.pods_on_node(&node).await else {
                    continue;
                };
                let held = mps_daemons
                    .is_some()
                    .then(|| held_sets(&list, &key, &node, &view_for_mps.borrow()));
                let (p, k, n) = (planner.clone(), key.clone(), node.clone());
                let reaped =
                    tokio::task::spawn_blocking(move || p.reap(&list, &k, &n, Instant::now()))
                        .await;
                if let Ok(Err(e)) = reaped {
                    tracing::warn!(error = %e, "MIG instance not destroyed");
                }
                if let Some((daemons, held)) = mps_daemons.clone().zip(held) {
                    let _ = tokio::task::spawn_blocking(move || {
                        daemons.supervise(&held, Instant::now())
                    })
                    .await;
                }
            }
        })
    };

    // Device plugins.
    let allocator = Allocator::new(
        config.node_name.clone(),
        config.allocation_key.clone(),
        deps.pods.clone(),
        Handover {
            mps: config.mps.clone(),
            device_list: config.device_list.clone(),
        },
    )
    .with_mig(planner);
    let allocator = match &mps_daemons {
        Some(d) => allocator.with_mps(d.clone()),
        None => allocator,
    };
    let allocator = match &deps.kubelet {
        Some(k) => allocator.with_kubelet(k.clone()),
        None => allocator,
    };
    let allocator = Arc::new(match config.allocate_state.clone() {
        Some(path) => allocator.with_state(path)?,
        None => allocator,
    });
    let report_task = deps.kubelet.clone().map(|kubelet| {
        let mut answered = allocator.answered();
        let pods = deps.pods.clone();
        let view = view_rx.clone();
        let (node, key) = (config.node_name.clone(), config.allocation_key.clone());
        let stop = stopped();
        tokio::spawn(async move {
            let mut stop = std::pin::pin!(stop);
            loop {
                match kubelet.list().await {
                    Ok(devices) => {
                        // Tessera's own slots resolve through the decisions; without
                        // a pod list they resolve to "any GPU" (gpuUuids empty).
                        let pods = pods.pods_on_node(&node).await.unwrap_or_default();
                        let now = jiff::Timestamp::now().to_string();
                        let new = report(&devices, &pods, &view.borrow(), &key, &node, now);
                        // The time alone changing is published with the next
                        // periodic status, not as a write of its own.
                        report_tx.send_if_modified(|cur| {
                            let changed =
                                cur.as_ref().map(|c| &c.containers) != Some(&new.containers);
                            *cur = Some(new);
                            changed
                        });
                    }
                    // The last report stays, with its time: a reader can see its age.
                    Err(e) => tracing::warn!(error = %e, "podResources not refreshed"),
                }
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(POD_RESOURCES_REFRESH) => {}
                    changed = answered.changed() => {
                        if changed.is_err() { break }
                        // Shutdown does not wait out the pause.
                        tokio::select! {
                            _ = &mut stop => break,
                            _ = tokio::time::sleep(AFTER_ALLOCATE) => {}
                        }
                    }
                }
            }
        })
    });
    let (slots, nvidia_gpu) = (config.slots, config.nvidia_gpu);
    let resources = Resource::for_node(&view_rx.borrow(), slots, nvidia_gpu);
    tracing::info!(device_list = %config.device_list, "devices are handed over by");
    tracing::info!(resources = ?resources.iter().map(Resource::name).collect::<Vec<_>>(), dir = %config.plugin.dir.display(), "serving device plugins");
    let (status_tx, _status_rx) = watch::channel(PluginStatus::default());
    let plugin_result = run_plugins(
        config.plugin.clone(),
        move |v: &NodeView| Resource::for_node(v, slots, nvidia_gpu),
        view_rx.clone(),
        allocator,
        status_tx,
        shutdown,
    )
    .await;

    let _ = stop_tx.send(true);
    halt.store(true, Ordering::Relaxed);
    if let Some(t) = settings_task {
        t.abort();
    }
    let _ = health_task.await;
    let _ = reap_task.await;
    if let Some(t) = report_task {
        let _ = t.await;
    }
    if let Some(d) = mps_daemons {
        let _ = tokio::task::spawn_blocking(move || d.shutdown()).await;
    }
    if let Some(t) = spec_task {
        let _ = t.await;
    }
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    plugin_result?;
    Ok(())
}

/// Why the agent does not serve this node yet, if the DRA driver does (or
/// that cannot be told); `None` when it may.
async fn dra_serves(inv: &Inventory) -> Option<String> {
    match inv.dra_slices().await {
        Ok(names) if names.is_empty() => None,
        Ok(names) => Some(format!(
            "not publishing this node's GpuNode nor serving device plugins: the DRA driver serves its GPUs (ResourceSlices {}); stop the device-plugin agent on this node, or stop the DRA driver and delete its slices to hand the node back",
            names.join(", ")
        )),
        Err(e) => Some(format!(
            "not publishing this node's GpuNode nor serving device plugins: cannot tell whether the DRA driver serves its GPUs (listing gpu.tessera.io ResourceSlices: {e})"
        )),
    }
}

/// Waits while the DRA driver serves this node ([`dra_serves`]), saying why
/// once per change in the log and in a Warning event on the Node, and looking
/// again every [`DRA_RECHECK`]. `false` when `shutdown` came first.
async fn yield_to_dra(
    inv: &Inventory,
    shutdown: &mut std::pin::Pin<Box<impl Future<Output = ()>>>,
) -> bool {
    let mut said: Option<String> = None;
    loop {
        let Some(why) = dra_serves(inv).await else {
            if said.is_some() {
                tracing::info!("no DRA slice serves this node any more: serving it");
            }
            return true;
        };
        if said.as_deref() != Some(why.as_str()) {
            tracing::warn!("{why}");
            if let Err(e) = inv.warn_on_node("GpusServedThroughDRA", &why).await {
                tracing::warn!(error = %e, "event not written");
            }
            said = Some(why);
        }
        tokio::select! {
            _ = shutdown.as_mut() => return false,
            _ = tokio::time::sleep(DRA_RECHECK) => {}
        }
    }
}

/// What `--once --print-inventory` prints: the discovered GPUs, the GpuNode spec,
/// the node labels and one metrics scrape.
pub async fn once_report(
    backend: Arc<dyn GpuBackend>,
    procs: Arc<dyn ProcReader>,
    node: &str,
) -> Result<(serde_json::Value, String), BackendError> {
    let b = backend.clone();
    let gpus = tokio::task::spawn_blocking(move || b.discover())
        .await
        .map_err(|e| BackendError::Nvml {
            call: "discover",
            gpu: "*".into(),
            message: e.to_string(),
        })??;
    let view = NodeView {
        gpus: gpus.clone(),
        ..Default::default()
    };
    let labels = node_labels(
        &gpus,
        backend.driver_version().as_deref(),
        backend.cuda_version().as_deref(),
    );
    let spec = gpu_node_spec(node, &view);
    let report = serde_json::json!({
        "backend": backend.name(),
        "driverVersion": backend.driver_version(),
        "cudaVersion": backend.cuda_version(),
        "node": node,
        "gpus": gpus,
        "resources": Resource::for_node(&view, crate::deviceplugin::DEFAULT_SLOTS, true).iter().map(Resource::name).collect::<Vec<_>>(),
        "gpuNodeSpec": spec,
        "nodeLabels": labels,
    });
    let (_tx, rx) = watch::channel(view);
    let collector = Collector::new(
        node.to_string(),
        backend,
        procs,
        Arc::new(crate::deviceplugin::allocate::NoPods(
            "--once: pods are not looked up".into(),
        )),
        None,
        rx,
        XidStats::default(),
    );
    Ok((report, collector.scrape().await))
}

/// A Kubernetes client from the in-cluster or kubeconfig environment.
pub async fn kube_client() -> Result<kube::Client, kube::Error> {
    kube::Client::try_default().await
}
