//! The device plugin against an in-process, kubelet-shaped peer over real unix
//! sockets: registration, ListAndWatch through a failure and a recovery,
//! Allocate for whole, shared and MIG decisions, refusal of forged and foreign
//! decisions, and re-registration after the kubelet socket is recreated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tessera_core::allocation::{ANNOTATION, AllocatedGpu, Allocation, MigGrant, VERSION};
use tessera_core::request::Isolation;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::allocate::{ContainerInfo, MpsConfig, PodInfo, StaticPods};
use tessera_node::deviceplugin::registration::PluginConfig;
use tessera_node::health::XidPolicy;
use tessera_node::proto::deviceplugin as pb;
use tessera_node::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use tessera_node::proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use tessera_node::run::{AgentConfig, AgentDeps};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

const KEY: &[u8] = b"test-allocation-key";
const NODE: &str = "gpu-node-1";
/// Generous bound for things that happen "within seconds"; never a speed assertion.
const WAIT: Duration = Duration::from_secs(20);

const GPUS: &str = r#"
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
const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-00000000-0000-0000-0000-000000000001";
const GPU2: &str = "GPU-00000000-0000-0000-0000-000000000002";
const MIG2: &str = "MIG-22222222-2222-2222-2222-222222222222";

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

struct Kubelet {
    seen: mpsc::UnboundedReceiver<pb::RegisterRequest>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start_kubelet(dir: &Path) -> Kubelet {
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

async fn dial(path: &Path) -> Result<DevicePluginClient<Channel>, tonic::transport::Error> {
    let ch = Endpoint::from_shared(format!("unix://{}", path.display()))?
        .connect()
        .await?;
    Ok(DevicePluginClient::new(ch))
}

async fn next_register(k: &mut Kubelet) -> pb::RegisterRequest {
    tokio::time::timeout(WAIT, k.seen.recv())
        .await
        .expect("no Register within the wait bound")
        .expect("kubelet channel closed")
}

struct Agent {
    fake: Fake,
    pods: StaticPods,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start_agent(dir: &Path, quiet: Duration) -> Agent {
    let fake = Fake::from_yaml(GPUS, "test").unwrap();
    let pods = StaticPods::default();
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
        allocation_key: KEY.to_vec(),
        mps: MpsConfig::default(),
        node_labels: false,
    };
    let deps = AgentDeps {
        backend: Arc::new(fake.clone()),
        procs: Arc::new(fake.proc_reader()),
        pods: Arc::new(pods.clone()),
        pod_resources: None,
        inventory: None,
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
        stop,
        task,
    }
}

async fn stop_agent(agent: Agent) {
    let _ = agent.stop.send(());
    tokio::time::timeout(WAIT, agent.task)
        .await
        .unwrap()
        .unwrap();
}

/// Registers all resources; returns their names, sorted.
async fn registered(k: &mut Kubelet, n: usize) -> Vec<pb::RegisterRequest> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(next_register(k).await);
    }
    out.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_and_streams_health_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    let regs = registered(&mut kubelet, 2).await;
    assert_eq!(regs[0].resource_name, "tessera.io/gpu");
    assert_eq!(regs[0].endpoint, "tessera-gpu.sock");
    assert_eq!(regs[0].version, "v1beta1");
    assert_eq!(regs[1].resource_name, "tessera.io/mig-1g.10gb");
    assert!(dir.path().join("tessera-gpu.sock").exists());

    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut stream = gpu.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let health_of = |resp: &pb::ListAndWatchResponse| -> BTreeMap<String, String> {
        resp.devices
            .iter()
            .map(|d| (d.id.clone(), d.health.clone()))
            .collect()
    };
    let first = stream.message().await.unwrap().unwrap();
    let h = health_of(&first);
    // 2 non-MIG GPUs × 4 slots; the MIG GPU is not a tessera.io/gpu.
    assert_eq!(h.len(), 8);
    assert!(h.values().all(|v| v == "Healthy"));
    assert_eq!(
        h.get(&format!("{GPU0}::3")).map(String::as_str),
        Some("Healthy")
    );
    assert_eq!(first.devices[0].topology.as_ref().unwrap().nodes[0].id, 0);

    // A fatal XID on GPU1: its tokens turn Unhealthy, GPU0's stay Healthy.
    agent.fake.inject_xid(GPU1, 79);
    let second = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let h = health_of(&second);
    assert_eq!(h.len(), 8, "every message is the complete list");
    for k in 0..4 {
        assert_eq!(h[&format!("{GPU1}::{k}")], "Unhealthy");
        assert_eq!(h[&format!("{GPU0}::{k}")], "Healthy");
    }
    // The GPU is repaired: it comes back without restarting anything.
    agent.fake.recover(GPU1).unwrap();
    let third = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(health_of(&third).values().all(|v| v == "Healthy"));

    // The MIG resource follows its parent GPU.
    let mut mig = dial(&dir.path().join("tessera-mig-1g.10gb.sock"))
        .await
        .unwrap();
    let mut mstream = mig.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let m = mstream.message().await.unwrap().unwrap();
    assert_eq!(m.devices.len(), 2);
    agent.fake.inject_xid(GPU2, 48);
    let m = tokio::time::timeout(WAIT, mstream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(m.devices.iter().all(|d| d.health == "Unhealthy"));

    drop(stream);
    drop(mstream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
    let _ = kubelet.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_period_brings_a_gpu_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    // A short quiet period: the GPU returns on its own after it.
    let agent = start_agent(dir.path(), Duration::from_secs(2));
    registered(&mut kubelet, 2).await;
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut stream = gpu.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    stream.message().await.unwrap().unwrap();
    agent.fake.inject_xid(GPU0, 95);
    let down = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        down.devices
            .iter()
            .filter(|d| d.health == "Unhealthy")
            .count(),
        4
    );
    let up = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(up.devices.iter().all(|d| d.health == "Healthy"));
    drop(stream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

fn pod(
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
        containers: vec![ContainerInfo {
            name: "main".into(),
            resources: [(resource.to_string(), n)].into(),
        }],
    }
}

fn decision(uid: &str, node: &str, isolation: Isolation, gpus: Vec<AllocatedGpu>) -> Allocation {
    Allocation {
        version: VERSION,
        pod_uid: uid.into(),
        pod: format!("ml/{uid}"),
        node: node.into(),
        policy: "tessera".into(),
        isolation,
        gpus,
        signature: String::new(),
    }
}

fn grant(index: u32, uuid: &str, memory_mib: u64, cores_milli: u32) -> AllocatedGpu {
    AllocatedGpu {
        index,
        uuid: uuid.into(),
        memory_mib,
        cores_milli,
        mig: None,
    }
}

async fn allocate(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_answers_from_the_scheduler_decision() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 2).await;

    let gpu_res = "tessera.io/gpu";
    let mig_res = "tessera.io/mig-1g.10gb";
    let whole = decision(
        "uid-whole",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000), grant(1, GPU1, 81_920, 1000)],
    );
    let shared = decision(
        "uid-shared",
        NODE,
        Isolation::Mps,
        vec![grant(1, GPU1, 20_000, 250)],
    );
    let mut m = grant(2, GPU2, 9_728, 142);
    m.mig = Some(MigGrant {
        profile: "1g.10gb".into(),
        start: 1,
        size: 1,
        uuid: String::new(),
    });
    let mig = decision("uid-mig", NODE, Isolation::Mig, vec![m]);
    let forged = decision(
        "uid-forged",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000)],
    );
    let foreign = decision(
        "uid-foreign",
        "gpu-node-9",
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000)],
    );
    agent.pods.set(vec![
        pod(
            "uid-whole",
            "whole",
            1,
            gpu_res,
            2,
            Some(whole.encode_signed(KEY)),
        ),
        pod(
            "uid-shared",
            "shared",
            2,
            gpu_res,
            1,
            Some(shared.encode_signed(KEY)),
        ),
        pod(
            "uid-mig",
            "mig",
            3,
            mig_res,
            1,
            Some(mig.encode_signed(KEY)),
        ),
        pod(
            "uid-forged",
            "forged",
            4,
            gpu_res,
            1,
            Some(forged.encode_signed(b"a-guess")),
        ),
        pod(
            "uid-foreign",
            "foreign",
            5,
            gpu_res,
            1,
            Some(foreign.encode_signed(KEY)),
        ),
        // A decision copied from the shared pod onto another pod.
        pod(
            "uid-copy",
            "copy",
            6,
            gpu_res,
            1,
            Some(shared.encode_signed(KEY)),
        ),
        pod("uid-none", "none", 7, gpu_res, 1, None),
    ]);

    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut migc = dial(&dir.path().join("tessera-mig-1g.10gb.sock"))
        .await
        .unwrap();

    // Whole GPUs: the kubelet's token choice does not matter, the decision does.
    let r = allocate(&mut gpu, &[&format!("{GPU1}::0"), &format!("{GPU1}::1")])
        .await
        .unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], format!("{GPU0},{GPU1}"));
    assert!(!r.envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));

    // An MPS share.
    let r = allocate(&mut gpu, &[&format!("{GPU0}::2")]).await.unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], GPU1);
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20000M");
    assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tessera/mps/pipe");
    let mounts: Vec<(&str, &str)> = r
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/run/tessera/mps/pipe", "/tessera/mps/pipe"),
            ("/run/tessera/mps/shm", "/dev/shm")
        ]
    );

    // A MIG instance, found by profile and placement.
    let r = allocate(&mut migc, &["MIG-11111111-1111-1111-1111-111111111111"])
        .await
        .unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], MIG2);

    // Refusals, each naming its reason.
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().contains("ml/forged") && e.message().contains("not written by the scheduler"),
        "{}",
        e.message()
    );
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert!(
        e.message().contains("ml/foreign")
            && e.message()
                .contains("for node gpu-node-9, this is node gpu-node-1"),
        "{}",
        e.message()
    );
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert!(
        e.message().contains("ml/copy") && e.message().contains("another pod"),
        "{}",
        e.message()
    );
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("ml/none") && e.message().contains("no scheduling decision"),
        "{}",
        e.message()
    );
    // Nobody left asking.
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert!(
        e.message().contains("no pending pod on node gpu-node-1"),
        "{}",
        e.message()
    );

    // GetPreferredAllocation: two GPUs joined by NVLink, one token each.
    let avail: Vec<String> = (0..4)
        .flat_map(|k| [format!("{GPU0}::{k}"), format!("{GPU1}::{k}")])
        .collect();
    let pref = gpu
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: avail,
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        [format!("{GPU0}::0"), format!("{GPU1}::0")]
    );

    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_registers_when_the_kubelet_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 2).await;

    // Kubelet restart: it goes away, cleans the directory of sockets, comes back.
    let _ = kubelet.stop.send(());
    let _ = kubelet.task.await;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let _ = std::fs::remove_file(entry.unwrap().path());
    }
    assert!(!dir.path().join("tessera-gpu.sock").exists());
    let mut kubelet = start_kubelet(dir.path());
    let regs = registered(&mut kubelet, 2).await;
    assert_eq!(regs[0].resource_name, "tessera.io/gpu");
    assert_eq!(regs[1].resource_name, "tessera.io/mig-1g.10gb");
    // The plugin serves again on a fresh socket.
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut stream = gpu.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().devices.len(), 8);

    // Only the kubelet socket recreated (plugin sockets intact): also re-registers.
    let _ = kubelet.stop.send(());
    let _ = kubelet.task.await;
    let mut kubelet = start_kubelet(dir.path());
    let regs = registered(&mut kubelet, 2).await;
    assert_eq!(regs.len(), 2);

    drop(stream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}
