//! Prometheus metrics: DCGM-compatible GPU series plus Tessera's per-pod series.
//!
//! GPU series keep dcgm-exporter's names and labels (protocols.md §5.2–5.3:
//! `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `hostname`, and `pod`,
//! `namespace`, `container` when one container holds the GPU) so existing
//! dashboards work. On shared GPUs one GPU serves several pods, so Tessera adds
//! per-pod series: each NVML process is mapped to its container through its
//! cgroup (pod UID), and the pod UID to a name and namespace through the pods on
//! this node; the kubelet PodResources API says which pods hold which devices.
//!
//! Leak detection: a process holding GPU memory whose cgroup names a pod that no
//! longer exists is reported as `tessera_gpu_leaked_memory_mib` and in one log
//! line naming the GPU, the process and the MiB.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tessera_core::allocation::{ANNOTATION, Allocation};
use tokio::sync::watch;

use crate::backend::{GpuBackend, GpuInfo, ProcReader, parse_cgroup};
use crate::deviceplugin::allocate::{PodInfo, PodSource};
use crate::deviceplugin::{NodeView, device_gpu};
use crate::health::xid_info;
use crate::proto::podresources as prpb;

/// One container's devices, from the kubelet PodResources API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDevices {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

/// Source of the kubelet's pod → device assignments.
pub trait PodResourcesSource: Send + Sync {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevices>, String>>;
}

/// The kubelet's PodResources API over its unix socket
/// (`/var/lib/kubelet/pod-resources/kubelet.sock`).
#[derive(Debug, Clone)]
pub struct KubeletPodResources {
    pub socket: PathBuf,
}

impl PodResourcesSource for KubeletPodResources {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodDevices>, String>> {
        Box::pin(async move {
            let path = self.socket.display().to_string();
            let channel = tonic::transport::Endpoint::from_shared(format!("unix://{path}"))
                .map_err(|e| e.to_string())?
                .connect_timeout(std::time::Duration::from_secs(2))
                .timeout(std::time::Duration::from_secs(5))
                .connect()
                .await
                .map_err(|e| format!("cannot reach the PodResources API at {path}: {e}"))?;
            let resp = prpb::pod_resources_lister_client::PodResourcesListerClient::new(channel)
                .list(prpb::ListPodResourcesRequest {})
                .await
                .map_err(|s| format!("PodResources List failed: {}", s.message()))?
                .into_inner();
            let mut out = Vec::new();
            for pod in resp.pod_resources {
                for c in &pod.containers {
                    for d in &c.devices {
                        out.push(PodDevices {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            container: c.name.clone(),
                            resource: d.resource_name.clone(),
                            device_ids: d.device_ids.clone(),
                        });
                    }
                }
            }
            Ok(out)
        })
    }
}

/// Last XID and count per GPU, written by the health loop.
#[derive(Debug, Clone, Default)]
pub struct XidStats(pub Arc<Mutex<BTreeMap<String, (u64, u64)>>>);

impl XidStats {
    pub fn record(&self, uuid: &str, xid: u64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(uuid.to_string()).or_insert((0, 0));
        e.0 = xid;
        e.1 += 1;
    }
    fn get(&self, uuid: &str) -> Option<(u64, u64)> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uuid)
            .copied()
    }
}

/// Claims the DRA driver released because their unprepare never came
/// ([`crate::dra::sweep`]), counted since the agent started
/// (`tessera_dra_claims_released_total`).
#[derive(Debug, Clone, Default)]
pub struct ReleasedClaims(pub Arc<AtomicU64>);

impl ReleasedClaims {
    pub fn inc(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Resource names whose devices count as GPUs for pod attribution.
fn is_gpu_resource(name: &str) -> bool {
    name == tessera_core::request::RES_GPU
        || name.starts_with(tessera_core::request::RES_MIG_PREFIX)
        || name == tessera_core::request::RES_NVIDIA_GPU
        || name.starts_with(tessera_core::request::RES_NVIDIA_MIG_PREFIX)
}

type Labels = Vec<(String, String)>;
type GaugeF = Gauge<f64, AtomicU64>;

/// Gathers readings and renders them on each scrape.
pub struct Collector {
    pub node: String,
    backend: Arc<dyn GpuBackend>,
    procs: Arc<dyn ProcReader>,
    pods: Arc<dyn PodSource>,
    pod_resources: Option<Arc<dyn PodResourcesSource>>,
    view: watch::Receiver<NodeView>,
    xids: XidStats,
    /// (gpu uuid, pid) pairs already logged as leaks.
    logged_leaks: Mutex<BTreeSet<(String, u32)>>,
    /// The agent's MPS control daemons (`--mps-daemons per-gpu`).
    mps: Option<Arc<crate::mps::MpsDaemons>>,
    /// Claims the DRA driver released by its sweep (DRA mode only).
    released_claims: Option<ReleasedClaims>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Where a process's memory goes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    Pod {
        namespace: String,
        pod: String,
        uid: String,
        container: String,
    },
    /// The cgroup names a pod that is not on the node any more.
    Orphan { uid: String },
    /// Not in a pod's cgroup (a host process), or the process is gone.
    Host,
}

impl Collector {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: String,
        backend: Arc<dyn GpuBackend>,
        procs: Arc<dyn ProcReader>,
        pods: Arc<dyn PodSource>,
        pod_resources: Option<Arc<dyn PodResourcesSource>>,
        view: watch::Receiver<NodeView>,
        xids: XidStats,
    ) -> Self {
        Collector {
            node,
            backend,
            procs,
            pods,
            pod_resources,
            view,
            xids,
            logged_leaks: Mutex::new(BTreeSet::new()),
            mps: None,
            released_claims: None,
        }
    }

    /// Also reports the agent's MPS control daemons.
    pub fn with_mps(mut self, daemons: Arc<crate::mps::MpsDaemons>) -> Self {
        self.mps = Some(daemons);
        self
    }

    /// Also reports the DRA driver's count of claims released by its sweep.
    pub fn with_released_claims(mut self, released: ReleasedClaims) -> Self {
        self.released_claims = Some(released);
        self
    }

    fn gpu_labels(&self, gpu: &GpuInfo) -> Labels {
        vec![
            ("gpu".into(), gpu.index.to_string()),
            ("UUID".into(), gpu.uuid.clone()),
            ("pci_bus_id".into(), gpu.pci_bus_id.clone()),
            ("device".into(), format!("nvidia{}", gpu.index)),
            ("modelName".into(), gpu.product.clone()),
            ("hostname".into(), self.node.clone()),
        ]
    }

    /// Collects everything and returns the OpenMetrics text.
    pub async fn scrape(&self) -> String {
        let view = self.view.borrow().clone();
        // Without the pod list nothing can be called a leak: processes are then
        // attributed by pod UID only.
        let (pods, pods_known) = match self.pods.pods_on_node(&self.node).await {
            Ok(p) => (p, true),
            Err(e) => {
                tracing::debug!(error = %e, "metrics: pods unknown; no names, no leak detection");
                (Vec::new(), false)
            }
        };
        let by_uid: BTreeMap<&str, &PodInfo> = pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let assignments = match &self.pod_resources {
            Some(src) => src.list().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "metrics: PodResources unavailable");
                Vec::new()
            }),
            None => Vec::new(),
        };
        // GPU uuid → containers holding one of its devices (kubelet's view).
        let mut holders: BTreeMap<String, BTreeSet<(String, String, String)>> = BTreeMap::new();
        for a in assignments.iter().filter(|a| is_gpu_resource(&a.resource)) {
            for id in &a.device_ids {
                let uuid = device_gpu(id);
                let gpu_uuid = view
                    .gpus
                    .iter()
                    .find(|g| g.uuid == uuid || g.mig_instances.iter().any(|m| m.uuid == uuid))
                    .map(|g| g.uuid.clone())
                    .unwrap_or_else(|| uuid.to_string());
                holders.entry(gpu_uuid).or_default().insert((
                    a.namespace.clone(),
                    a.pod.clone(),
                    a.container.clone(),
                ));
            }
        }
        let mut reg = Registry::default();
        let fam = |reg: &mut Registry, name: &str, help: &str| {
            let f = Family::<Labels, GaugeF>::default();
            reg.register(name, help, f.clone());
            f
        };
        let util = fam(&mut reg, "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).");
        let fb_used = fam(
            &mut reg,
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB).",
        );
        let fb_free = fam(
            &mut reg,
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB).",
        );
        let temp = fam(&mut reg, "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).");
        let power = fam(&mut reg, "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).");
        let sm_clock = fam(
            &mut reg,
            "DCGM_FI_DEV_SM_CLOCK",
            "SM clock frequency (in MHz).",
        );
        let mem_clock = fam(
            &mut reg,
            "DCGM_FI_DEV_MEM_CLOCK",
            "Memory clock frequency (in MHz).",
        );
        let xid_last = fam(
            &mut reg,
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
        );
        let sbe_vol = fam(
            &mut reg,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Total number of single-bit volatile ECC errors.",
        );
        let dbe_vol = fam(
            &mut reg,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit volatile ECC errors.",
        );
        let sbe_agg = fam(
            &mut reg,
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "Total number of single-bit persistent ECC errors.",
        );
        let dbe_agg = fam(
            &mut reg,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "Total number of double-bit persistent ECC errors.",
        );
        let healthy = fam(
            &mut reg,
            "tessera_gpu_healthy",
            "1 if the GPU is in service, 0 if withdrawn.",
        );
        let xid_count = fam(
            &mut reg,
            "tessera_gpu_xid_events",
            "XID events seen since the agent started.",
        );
        let pod_mem = fam(
            &mut reg,
            "tessera_pod_gpu_memory_used_mib",
            "GPU memory used by the container's processes (MiB).",
        );
        let pod_sm = fam(
            &mut reg,
            "tessera_pod_gpu_sm_util_percent",
            "SM utilization of the container's processes (%).",
        );
        let alloc_mem = fam(
            &mut reg,
            "tessera_pod_gpu_memory_allocated_mib",
            "GPU memory granted to the pod by the scheduler (MiB).",
        );
        let alloc_cores = fam(
            &mut reg,
            "tessera_pod_gpu_cores_allocated_permille",
            "Compute granted to the pod by the scheduler (per-mille of the GPU).",
        );
        let leaked = fam(
            &mut reg,
            "tessera_gpu_leaked_memory_mib",
            "GPU memory held by a process whose pod no longer exists (MiB).",
        );
        let unattributed = fam(
            &mut reg,
            "tessera_gpu_unattributed_memory_mib",
            "GPU memory held by processes outside any pod (MiB).",
        );

        let set = |f: &Family<Labels, GaugeF>, l: &Labels, v: f64| {
            f.get_or_create(l).set(v);
        };
        for gpu in &view.gpus {
            let mut labels = self.gpu_labels(gpu);
            if let Some(hs) = holders.get(&gpu.uuid)
                && hs.len() == 1
                && let Some((ns, pod, container)) = hs.iter().next()
            {
                labels.push(("pod".into(), pod.clone()));
                labels.push(("namespace".into(), ns.clone()));
                labels.push(("container".into(), container.clone()));
            }
            set(
                &healthy,
                &self.gpu_labels(gpu),
                if view.is_healthy(&gpu.uuid) { 1.0 } else { 0.0 },
            );
            if let Some((last, count)) = self.xids.get(&gpu.uuid) {
                let mut l = labels.clone();
                l.push(("err_code".into(), last.to_string()));
                l.push((
                    "err_msg".into(),
                    xid_info(last)
                        .map(|i| i.name)
                        .unwrap_or("unknown")
                        .to_string(),
                ));
                set(&xid_last, &l, last as f64);
                set(&xid_count, &self.gpu_labels(gpu), count as f64);
            }
            let r = match self.backend.read(&gpu.uuid) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(gpu = %gpu.uuid, error = %e, "metrics: cannot read GPU");
                    continue;
                }
            };
            let opt = |f: &Family<Labels, GaugeF>, v: Option<f64>| {
                if let Some(v) = v {
                    set(f, &labels, v);
                }
            };
            opt(&util, r.utilization_pct.map(f64::from));
            opt(&fb_used, r.memory_used_mib.map(|v| v as f64));
            opt(&fb_free, r.memory_free_mib.map(|v| v as f64));
            opt(&temp, r.temperature_c.map(f64::from));
            opt(&power, r.power_w);
            opt(&sm_clock, r.sm_clock_mhz.map(f64::from));
            opt(&mem_clock, r.mem_clock_mhz.map(f64::from));
            opt(&sbe_vol, r.ecc.sbe_volatile.map(|v| v as f64));
            opt(&dbe_vol, r.ecc.dbe_volatile.map(|v| v as f64));
            opt(&sbe_agg, r.ecc.sbe_aggregate.map(|v| v as f64));
            opt(&dbe_agg, r.ecc.dbe_aggregate.map(|v| v as f64));

            // Per-pod attribution through process cgroups.
            let mut per_owner: BTreeMap<Owner, (u64, u32)> = BTreeMap::new();
            for p in &r.processes {
                let owner = match self.procs.cgroup(p.pid).as_deref().and_then(parse_cgroup) {
                    Some(o) => match by_uid.get(o.pod_uid.as_str()) {
                        Some(pod) if !matches!(pod.phase.as_str(), "Succeeded" | "Failed") => {
                            let container = o.container_id.clone().unwrap_or_default();
                            Owner::Pod {
                                namespace: pod.namespace.clone(),
                                pod: pod.name.clone(),
                                uid: pod.uid.clone(),
                                container: container_name(pod, &container, &holders, &gpu.uuid),
                            }
                        }
                        _ if pods_known => Owner::Orphan { uid: o.pod_uid },
                        _ => Owner::Pod {
                            namespace: String::new(),
                            pod: String::new(),
                            uid: o.pod_uid,
                            container: o.container_id.unwrap_or_default(),
                        },
                    },
                    None => Owner::Host,
                };
                match &owner {
                    Owner::Orphan { uid } => {
                        let mut l = self.gpu_labels(gpu);
                        l.push(("pid".into(), p.pid.to_string()));
                        l.push(("pod_uid".into(), uid.clone()));
                        set(&leaked, &l, p.used_memory_mib as f64);
                        let first = self
                            .logged_leaks
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert((gpu.uuid.clone(), p.pid));
                        if first {
                            tracing::warn!(
                                gpu = gpu.index, uuid = %gpu.uuid, pid = p.pid, mib = p.used_memory_mib, pod_uid = %uid,
                                "GPU memory leak: GPU {} ({}) process {} holds {} MiB but its pod {} no longer exists",
                                gpu.index, gpu.uuid, p.pid, p.used_memory_mib, uid
                            );
                        }
                    }
                    Owner::Host => {
                        let mut l = self.gpu_labels(gpu);
                        l.push(("pid".into(), p.pid.to_string()));
                        set(&unattributed, &l, p.used_memory_mib as f64);
                    }
                    Owner::Pod { .. } => {}
                }
                let e = per_owner.entry(owner).or_default();
                e.0 += p.used_memory_mib;
                e.1 += p.sm_util_pct.unwrap_or(0);
            }
            for (owner, (mib, sm)) in per_owner {
                if let Owner::Pod {
                    namespace,
                    pod,
                    uid,
                    container,
                } = owner
                {
                    let mut l = self.gpu_labels(gpu);
                    l.push(("pod".into(), pod));
                    l.push(("namespace".into(), namespace));
                    l.push(("container".into(), container));
                    l.push(("pod_uid".into(), uid));
                    set(&pod_mem, &l, mib as f64);
                    set(&pod_sm, &l, f64::from(sm.min(100)));
                }
            }
        }
        // Allocated (from the decisions) beside used: shows over-requesting.
        for pod in pods
            .iter()
            .filter(|p| !matches!(p.phase.as_str(), "Succeeded" | "Failed"))
        {
            let Some(value) = pod.annotations.get(ANNOTATION) else {
                continue;
            };
            let Ok(alloc) = Allocation::decode_unverified(value) else {
                continue;
            };
            if alloc.node != self.node {
                continue;
            }
            for g in &alloc.gpus {
                let Some(gpu) = view.grant_gpu(g) else {
                    continue;
                };
                let mut l = self.gpu_labels(gpu);
                l.push(("pod".into(), pod.name.clone()));
                l.push(("namespace".into(), pod.namespace.clone()));
                l.push(("pod_uid".into(), pod.uid.clone()));
                l.push(("isolation".into(), alloc.isolation.name().into()));
                set(&alloc_mem, &l, g.memory_mib as f64);
                set(&alloc_cores, &l, f64::from(g.cores_milli));
            }
        }
        // The MPS daemons, unless one is being started right now (its lock is then
        // held for up to the start timeout; the next scrape reports it).
        if let Some(statuses) = self.mps.as_ref().and_then(|d| d.try_status()) {
            let up = fam(
                &mut reg,
                "tessera_mps_daemon_up",
                "1 if the MPS control daemon for these GPUs is running, 0 if it exited (restarted with backoff while pods hold it).",
            );
            let restarts = fam(
                &mut reg,
                "tessera_mps_daemon_restarts",
                "Starts of the MPS control daemon after its first (exits and failed starts) since the agent started.",
            );
            for st in statuses {
                let l: Labels = vec![
                    ("daemon".into(), st.key.clone()),
                    ("gpus".into(), st.gpus.join(",")),
                    ("hostname".into(), self.node.clone()),
                ];
                set(&up, &l, if st.running { 1.0 } else { 0.0 });
                set(&restarts, &l, f64::from(st.restarts));
            }
        }
        if let Some(released) = &self.released_claims {
            let f = Family::<Labels, prometheus_client::metrics::counter::Counter>::default();
            reg.register(
                "tessera_dra_claims_released",
                "Prepared claims the DRA driver released because their NodeUnprepareResources never came (the claim gone from the API server).",
                f.clone(),
            );
            f.get_or_create(&vec![("hostname".into(), self.node.clone())])
                .inc_by(released.get());
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &reg) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }

    /// `GET /metrics` alone (the DRA driver serves its own probes beside it).
    pub fn metrics_router(self: Arc<Self>) -> axum::Router {
        use axum::routing::get;
        axum::Router::new()
            .route(
                "/metrics",
                get(
                    |axum::extract::State(c): axum::extract::State<Arc<Collector>>| async move {
                        (
                            [(
                                "content-type",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            c.scrape().await,
                        )
                    },
                ),
            )
            .with_state(self)
    }

    /// `GET /metrics`, `/healthz` (alive) and `/readyz`: 503 while the agent
    /// serves no GPU (the backend found none), so an agent with nothing to
    /// serve is not Ready.
    pub fn router(self: Arc<Self>) -> axum::Router {
        use axum::routing::get;
        let ready = axum::Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route(
                "/readyz",
                get(
                    |axum::extract::State(c): axum::extract::State<Arc<Collector>>| async move {
                        let gpus = c.view.borrow().gpus.len();
                        if gpus == 0 {
                            (
                                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                                format!(
                                    "backend {} found no GPU on {}: nothing to serve\n",
                                    c.backend.name(),
                                    c.node
                                ),
                            )
                        } else {
                            (axum::http::StatusCode::OK, format!("ok: {gpus} GPUs\n"))
                        }
                    },
                ),
            )
            .with_state(self.clone());
        self.metrics_router().merge(ready)
    }
}

/// The container's name: from the kubelet's assignments when only one container
/// of the pod holds this GPU, otherwise the container ID from the cgroup.
fn container_name(
    pod: &PodInfo,
    container_id: &str,
    holders: &BTreeMap<String, BTreeSet<(String, String, String)>>,
    gpu_uuid: &str,
) -> String {
    let names: Vec<&String> = holders
        .get(gpu_uuid)
        .map(|hs| {
            hs.iter()
                .filter(|(ns, p, _)| ns == &pod.namespace && p == &pod.name)
                .map(|(_, _, c)| c)
                .collect()
        })
        .unwrap_or_default();
    let running: Vec<_> = pod
        .containers
        .iter()
        .filter(|c| c.kind != crate::deviceplugin::allocate::ContainerKind::Init)
        .collect();
    match names.as_slice() {
        [one] => (*one).clone(),
        // Init containers have finished by the time a process shows up for long.
        _ if running.len() == 1 => running[0].name.clone(),
        _ => container_id.to_string(),
    }
}
