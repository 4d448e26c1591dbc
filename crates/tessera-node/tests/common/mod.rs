//! The kubelet-shaped peer and the agent under test, shared by the
//! integration tests: a fake kubelet's registration service over real unix
//! sockets, an agent on fake GPUs, and pod and decision builders.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tessera_core::allocation::{ANNOTATION, AllocatedGpu, Allocation, VERSION};
use tessera_core::request::Isolation;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::allocate::{
    Container, ContainerKind, MpsConfig, PodInfo, StaticPods,
};
use tessera_node::deviceplugin::registration::PluginConfig;
use tessera_node::health::XidPolicy;
use tessera_node::nodesettings::NodeSettings;
use tessera_node::podresources::PodResourcesClient;
use tessera_node::proto::deviceplugin as pb;
use tessera_node::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use tessera_node::proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use tessera_node::proto::podresources as prpb;
use tessera_node::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tessera_node::run::{AgentConfig, AgentDeps};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};
pub const KEY: &[u8] = b"test-allocation-key";
pub const NODE: &str = "gpu-node-1";
/// Generous bound for things that happen "within seconds"; never a speed assertion.
pub const WAIT: Duration = Duration::from_secs(20);

pub const GPUS: &str = r#"
driverVersion: "550.54.15"
gpus:
  - uuid: GPU-00000000-0000-0000-0000-000000000000
    product: NVIDIA A100-SXM4-80GB
    numaNode: 0
    nvlinks: { GPU-00000000-0000-0000-0000-000000000001: 12 }
  - uuid: GPU-00000000-0000-0000-0000-000000000001
    product: NVIDIA A100-SXM4-80GB
    numaNode: 0
  - uuid: GPU-00000000-0000-0000-0000-000000000002
    product: NVIDIA A100-SXM4-80GB
    numaNode: 1
    mig:
      enabled: true
      instances:
        - { uuid: MIG-11111111-1111-1111-1111-111111111111, profile: 1g.10gb, start: 0 }
        - { uuid: MIG-22222222-2222-2222-2222-222222222222, profile: 1g.10gb, start: 1 }
"#;
pub const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
pub const GPU1: &str = "GPU-00000000-0000-0000-0000-000000000001";
pub const GPU2: &str = "GPU-00000000-0000-0000-0000-000000000002";
pub const MIG2: &str = "MIG-22222222-2222-2222-2222-222222222222";

/// The kubelet's half of registration: validates the request, dials the plugin
/// back and asks its options (as the kubelet does, synchronously), then reports.
struct FakeKubelet {
    dir: PathBuf,
    seen: mpsc::UnboundedSender<pb::RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let req = request.into_inner();
        if req.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        let mut client = dial(&self.dir.join(&req.endpoint))
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let opts = client
            .get_device_plugin_options(pb::Empty {})
            .await?
            .into_inner();
        if !opts.get_preferred_allocation_available {
            return Err(Status::invalid_argument("expected GetPreferredAllocation"));
        }
        let _ = self.seen.send(req);
        Ok(Response::new(pb::Empty {}))
    }
}

pub struct Kubelet {
    pub seen: mpsc::UnboundedReceiver<pb::RegisterRequest>,
    pub stop: oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<()>,
}

pub fn start_kubelet(dir: &Path) -> Kubelet {
    let sock = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).unwrap();
    let (tx, seen) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = FakeKubelet {
        dir: dir.to_path_buf(),
        seen: tx,
    };
    let task = tokio::spawn(async move {
        Server::builder()
            .add_service(RegistrationServer::new(svc))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Kubelet { seen, stop, task }
}

pub async fn dial(path: &Path) -> Result<DevicePluginClient<Channel>, tonic::transport::Error> {
    let ch = Endpoint::from_shared(format!("unix://{}", path.display()))?
        .connect()
        .await?;
    Ok(DevicePluginClient::new(ch))
}

pub async fn next_register(k: &mut Kubelet) -> pb::RegisterRequest {
    tokio::time::timeout(WAIT, k.seen.recv())
        .await
        .expect("no Register within the wait bound")
        .expect("kubelet channel closed")
}

pub struct Agent {
    pub fake: Fake,
    pub pods: StaticPods,
    /// The kubelet's PodResources API the agent reads (`Unavailable` until set).
    pub kubelet: FakePodResources,
    /// The Node's `tessera.io/mig-dynamic` setting as the agent's Node watch
    /// would report it (off at start).
    pub settings: tokio::sync::watch::Sender<NodeSettings>,
    pub stop: oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<()>,
}

pub fn start_agent(dir: &Path, quiet: Duration) -> Agent {
    start_agent_with(dir, quiet, "volume-mounts")
}

pub fn start_agent_with(dir: &Path, quiet: Duration, device_list: &str) -> Agent {
    start_agent_tweaked(dir, quiet, device_list, |_| {})
}

/// [`start_agent_with`], with `tweak` changing the configuration first.
pub fn start_agent_tweaked(
    dir: &Path,
    quiet: Duration,
    device_list: &str,
    tweak: impl FnOnce(&mut AgentConfig),
) -> Agent {
    let fake = Fake::from_yaml(GPUS, "test").unwrap();
    let pods = StaticPods::default();
    let kubelet = FakePodResources::default();
    let socket = start_pod_resources(dir, kubelet.clone());
    let config = AgentConfig {
        node_name: NODE.into(),
        plugin: PluginConfig {
            dir: dir.to_path_buf(),
            poll: Duration::from_millis(100),
        },
        slots: 4,
        metrics_addr: None,
        xid_policy: XidPolicy::default(),
        quiet_period: quiet,
        health_interval: Duration::from_millis(50),
        heartbeat_period: tessera_api::gpunode::HEARTBEAT_PERIOD,
        allocation_key: KEY.to_vec().into(),
        mps: MpsConfig::default(),
        device_list: device_list.parse().unwrap(),
        nvidia_gpu: true,
        node_labels: false,
        mig_grace: Duration::from_millis(300),
        mig_state: None,
        mps_binary: "nvidia-cuda-mps-control".into(),
        allocate_state: None,
    };
    let mut config = config;
    tweak(&mut config);
    let (settings, settings_rx) = tokio::sync::watch::channel(NodeSettings::default());
    let deps = AgentDeps {
        backend: Arc::new(fake.clone()),
        procs: Arc::new(fake.proc_reader()),
        pods: Arc::new(pods.clone()),
        pod_resources: None,
        kubelet: Some(Arc::new(PodResourcesClient { socket })),
        inventory: None,
        node_settings: Some(settings_rx),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tessera_node::run::run(config, deps, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Agent {
        fake,
        pods,
        kubelet,
        settings,
        stop,
        task,
    }
}

pub async fn stop_agent(agent: Agent) {
    let _ = agent.stop.send(());
    tokio::time::timeout(WAIT, agent.task)
        .await
        .unwrap()
        .unwrap();
}

/// Registers all resources; returns their names, sorted.
pub async fn registered(k: &mut Kubelet, n: usize) -> Vec<pb::RegisterRequest> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(next_register(k).await);
    }
    out.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
    out
}

pub fn pod(
    uid: &str,
    name: &str,
    created: i64,
    resource: &str,
    n: u64,
    annotation: Option<String>,
) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        namespace: "ml".into(),
        name: name.into(),
        phase: "Pending".into(),
        created_unix: created,
        annotations: annotation
            .map(|a| [(ANNOTATION.to_string(), a)].into())
            .unwrap_or_default(),
        containers: vec![Container::new(
            "main",
            ContainerKind::App,
            &[(resource, &n.to_string())],
        )],
    }
}

pub fn decision(
    uid: &str,
    node: &str,
    isolation: Isolation,
    gpus: Vec<AllocatedGpu>,
) -> Allocation {
    Allocation {
        version: VERSION,
        pod_uid: uid.into(),
        pod: format!("ml/{uid}"),
        node: node.into(),
        policy: "tessera".into(),
        isolation,
        gpus,
        containers: Vec::new(),
        signature: String::new(),
    }
}

pub fn grant(index: u32, uuid: &str, memory_mib: u64, cores_milli: u32) -> AllocatedGpu {
    AllocatedGpu {
        index,
        uuid: uuid.into(),
        memory_mib,
        cores_milli,
        mig: None,
    }
}

pub async fn allocate(
    client: &mut DevicePluginClient<Channel>,
    ids: &[&str],
) -> Result<pb::ContainerAllocateResponse, Status> {
    let resp = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        })
        .await?
        .into_inner();
    assert_eq!(
        resp.container_responses.len(),
        1,
        "answers match requests by index"
    );
    Ok(resp.container_responses.into_iter().next().unwrap())
}

/// The device IDs handed over as volume mounts, in order.
pub fn mounted_devices(r: &pb::ContainerAllocateResponse) -> Vec<&str> {
    r.mounts
        .iter()
        .filter(|m| m.host_path == "/dev/null")
        .filter_map(|m| {
            m.container_path
                .strip_prefix("/var/run/nvidia-container-devices/")
        })
        .collect()
}

/// The kubelet's PodResources API (`v1`) over a real unix socket. Until a list
/// is set it answers `Unavailable`, as a kubelet whose API cannot be read:
/// the agent then treats every pending pod as a candidate.
#[derive(Debug, Clone, Default)]
pub struct FakePodResources {
    pub pods: Arc<std::sync::Mutex<Option<Vec<prpb::PodResources>>>>,
}

#[tonic::async_trait]
impl PodResourcesLister for FakePodResources {
    async fn list(
        &self,
        _request: Request<prpb::ListPodResourcesRequest>,
    ) -> Result<Response<prpb::ListPodResourcesResponse>, Status> {
        match self.pods.lock().unwrap().clone() {
            Some(pod_resources) => Ok(Response::new(prpb::ListPodResourcesResponse {
                pod_resources,
            })),
            None => Err(Status::unavailable("pod resources not served")),
        }
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<prpb::AllocatableResourcesRequest>,
    ) -> Result<Response<prpb::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(prpb::AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        request: Request<prpb::GetPodResourcesRequest>,
    ) -> Result<Response<prpb::GetPodResourcesResponse>, Status> {
        let req = request.into_inner();
        let found = self
            .pods
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .find(|p| p.name == req.pod_name && p.namespace == req.pod_namespace)
            .cloned();
        // The kubelet's answer for a pod it does not know.
        found
            .map(|p| {
                Response::new(prpb::GetPodResourcesResponse {
                    pod_resources: Some(p),
                })
            })
            .ok_or_else(|| {
                Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    req.pod_name, req.pod_namespace
                ))
            })
    }
}

impl FakePodResources {
    pub fn set(&self, pods: Vec<prpb::PodResources>) {
        *self.pods.lock().unwrap() = Some(pods);
    }

    /// The kubelet reaches `pod`: the pods it reached before now hold a device
    /// in each container that asks a GPU resource, and `pod` is listed with none.
    pub fn admitting(&self, pod: &PodInfo, before: &[PodInfo]) {
        let mut list: Vec<prpb::PodResources> = before.iter().map(admitted).collect();
        list.push(prpb::PodResources {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            containers: pod
                .containers
                .iter()
                .map(|c| prpb::ContainerResources {
                    name: c.name.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        self.set(list);
    }
}

/// `pod` as the kubelet lists it once admitted: one device per GPU resource
/// each container asks.
pub fn admitted(pod: &PodInfo) -> prpb::PodResources {
    prpb::PodResources {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        containers: pod
            .containers
            .iter()
            .map(|c| prpb::ContainerResources {
                name: c.name.clone(),
                devices: c
                    .resources
                    .keys()
                    .filter(|r| r.starts_with("tessera.io/") || r.starts_with("nvidia.com/"))
                    .map(|r| prpb::ContainerDevices {
                        resource_name: r.clone(),
                        device_ids: vec![format!("{}-{}", pod.name, c.name)],
                        topology: None,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Serves `fake` on `<dir>/pod-resources/kubelet.sock`; returns the socket.
pub fn start_pod_resources(dir: &Path, fake: FakePodResources) -> PathBuf {
    let sub = dir.join("pod-resources");
    std::fs::create_dir_all(&sub).unwrap();
    let sock = sub.join("kubelet.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move {
        let _ = Server::builder()
            .add_service(PodResourcesListerServer::new(fake))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    });
    sock
}

impl Agent {
    /// The kubelet reaches the pod named `name` (in `self.pods`), having
    /// admitted those named in `before`.
    pub fn admitting(&self, name: &str, before: &[&str]) {
        let pods = self.pods.0.lock().unwrap().clone();
        let find = |n: &str| {
            pods.iter()
                .find(|p| p.name == n)
                .cloned()
                .unwrap_or_else(|| panic!("no pod {n} in the test's pods"))
        };
        let before: Vec<PodInfo> = before.iter().map(|n| find(n)).collect();
        self.kubelet.admitting(&find(name), &before);
    }
}

/// What an API server that serves no `resource.k8s.io` version (1.28 with
/// DRA off) answers for its paths: a plain-text 404 (kube reads it as an API
/// error with code 404). `None` for any other path.
pub fn unserved_dra(path: &str) -> Option<http::Response<kube::client::Body>> {
    path.starts_with("/apis/resource.k8s.io/").then(|| {
        let mut r = http::Response::new(kube::client::Body::from(b"404 page not found\n".to_vec()));
        *r.status_mut() = http::StatusCode::NOT_FOUND;
        r
    })
}
