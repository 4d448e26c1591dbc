//! A `/metrics` scrape under the fake backend: DCGM-compatible series, per-pod
//! memory on a GPU shared by two pods (pod and namespace labels from the pods'
//! UIDs found in the processes' cgroups), allocated versus used, and a leak.
//! The kubelet's PodResources API is served for real on a unix socket.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_core::allocation::{ANNOTATION, AllocatedGpu, Allocation, VERSION};
use tessera_core::request::Isolation;
use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::NodeView;
use tessera_node::deviceplugin::allocate::{Container, ContainerKind, PodInfo, StaticPods};
use tessera_node::metrics::{Collector, KubeletPodResources, PodResourcesSource, XidStats};
use tessera_node::proto::podresources as pr;
use tessera_node::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use tower::ServiceExt;

const UID_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const UID_B: &str = "bbbbbbbb-0000-4000-8000-000000000002";
const UID_GONE: &str = "dddddddd-0000-4000-8000-000000000009";

const GPUS: &str = r#"
gpus:
  - uuid: GPU-shared
    product: NVIDIA A100-SXM4-80GB
    utilization: 70
    temperatureC: 55
    powerW: 312.5
    smClockMhz: 1410
    ecc: { sbeVolatile: 3, dbeVolatile: 0 }
    processes:
      - { pid: 101, memoryMib: 12000, smUtil: 40, podUid: aaaaaaaa-0000-4000-8000-000000000001, container: c1 }
      - { pid: 102, memoryMib: 3000, smUtil: 5, podUid: aaaaaaaa-0000-4000-8000-000000000001, container: c1 }
      - { pid: 201, memoryMib: 8000, smUtil: 25, podUid: bbbbbbbb-0000-4000-8000-000000000002, container: c2 }
  - uuid: GPU-other
    product: NVIDIA A100-SXM4-80GB
    processes:
      - { pid: 301, memoryMib: 5000, podUid: dddddddd-0000-4000-8000-000000000009, container: c3 }
      - { pid: 302, memoryMib: 100 }
"#;

struct Kubelet;

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _r: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let pod = |name: &str, container: &str, ids: &[&str]| pr::PodResources {
            name: name.into(),
            namespace: if name == "train-a" { "ml" } else { "research" }.into(),
            containers: vec![pr::ContainerResources {
                name: container.into(),
                devices: vec![pr::ContainerDevices {
                    resource_name: "tessera.io/gpu".into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    topology: None,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: vec![
                pod("train-a", "trainer", &["GPU-shared::0"]),
                pod("infer-b", "server", &["GPU-shared::1"]),
            ],
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _r: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn get(
        &self,
        _r: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not needed"))
    }
}

fn pod(uid: &str, ns: &str, name: &str, container: &str, alloc: Option<Allocation>) -> PodInfo {
    PodInfo {
        uid: uid.into(),
        namespace: ns.into(),
        name: name.into(),
        phase: "Running".into(),
        created_unix: 0,
        annotations: alloc
            .map(|a| [(ANNOTATION.to_string(), a.encode_signed(b"k"))].into())
            .unwrap_or_default(),
        containers: vec![Container::new(container, ContainerKind::App, &[])],
    }
}

fn share(uid: &str, memory_mib: u64, cores_milli: u32) -> Allocation {
    Allocation {
        version: VERSION,
        pod_uid: uid.into(),
        pod: String::new(),
        node: "node-1".into(),
        policy: "tessera".into(),
        isolation: Isolation::Mps,
        gpus: vec![AllocatedGpu {
            index: 0,
            uuid: "GPU-shared".into(),
            memory_mib,
            cores_milli,
            mig: None,
        }],
        containers: Vec::new(),
        signature: String::new(),
    }
}

/// The value of the one series named `name` whose labels include every `want` pair.
fn value(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| l.starts_with(&format!("{name}{{"))) {
        let ok = want
            .iter()
            .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")));
        if ok {
            assert!(
                found.is_none(),
                "more than one {name} series matches {want:?}"
            );
            found = line.rsplit(' ').next().and_then(|v| v.parse().ok());
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_attributes_shared_gpu_memory_to_pods() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("pod-resources.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Kubelet))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let pod_resources = KubeletPodResources { socket: sock };
    assert_eq!(
        pod_resources.list().await.unwrap().len(),
        2,
        "PodResources over the socket"
    );

    let fake = Fake::from_yaml(GPUS, "test").unwrap();
    let pods = StaticPods::default();
    pods.set(vec![
        pod(
            UID_A,
            "ml",
            "train-a",
            "trainer",
            Some(share(UID_A, 20_000, 500)),
        ),
        pod(
            UID_B,
            "research",
            "infer-b",
            "server",
            Some(share(UID_B, 16_000, 300)),
        ),
    ]);
    let (_tx, view) = watch::channel(NodeView {
        settings: Default::default(),
        gpus: fake.discover().unwrap(),
        health: BTreeMap::new(),
    });
    let xids = XidStats::default();
    xids.record("GPU-other", 79);
    let collector = Arc::new(Collector::new(
        "node-1".into(),
        Arc::new(fake.clone()),
        Arc::new(fake.proc_reader()),
        Arc::new(pods),
        Some(Arc::new(pod_resources)),
        view,
        xids,
    ));
    let resp = collector
        .router()
        .oneshot(
            http::Request::get("/metrics")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();

    // Per-pod memory on the shared GPU: pod A's two processes add up, pod B separate.
    let mem = "tessera_pod_gpu_memory_used_mib";
    let a = [
        ("UUID", "GPU-shared"),
        ("pod", "train-a"),
        ("namespace", "ml"),
        ("container", "trainer"),
    ];
    let b = [
        ("UUID", "GPU-shared"),
        ("pod", "infer-b"),
        ("namespace", "research"),
        ("container", "server"),
    ];
    assert_eq!(value(&text, mem, &a), Some(15_000.0), "{text}");
    assert_eq!(value(&text, mem, &b), Some(8_000.0), "{text}");
    assert_eq!(
        value(&text, "tessera_pod_gpu_sm_util_percent", &a),
        Some(45.0)
    );
    // Allocated beside used.
    assert_eq!(
        value(&text, "tessera_pod_gpu_memory_allocated_mib", &a[..3]),
        Some(20_000.0)
    );
    assert_eq!(
        value(&text, "tessera_pod_gpu_cores_allocated_permille", &b[..3]),
        Some(300.0)
    );

    // DCGM-compatible GPU series; two pods hold the GPU, so no single pod label on it.
    let gpu0 = [
        ("gpu", "0"),
        ("UUID", "GPU-shared"),
        ("device", "nvidia0"),
        ("modelName", "NVIDIA A100-SXM4-80GB"),
        ("hostname", "node-1"),
    ];
    assert_eq!(value(&text, "DCGM_FI_DEV_FB_USED", &gpu0), Some(23_000.0));
    assert_eq!(
        value(&text, "DCGM_FI_DEV_FB_FREE", &gpu0),
        Some(81_920.0 - 23_000.0)
    );
    assert_eq!(value(&text, "DCGM_FI_DEV_GPU_UTIL", &gpu0), Some(70.0));
    assert_eq!(value(&text, "DCGM_FI_DEV_POWER_USAGE", &gpu0), Some(312.5));
    assert_eq!(
        value(&text, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", &gpu0),
        Some(3.0)
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("DCGM_FI_DEV_FB_USED") && l.contains("pod="))
    );
    assert_eq!(
        value(
            &text,
            "DCGM_FI_DEV_XID_ERRORS",
            &[
                ("UUID", "GPU-other"),
                ("err_code", "79"),
                ("err_msg", "GPU has fallen off the bus")
            ]
        ),
        Some(79.0)
    );

    // The process of a pod that is gone is a leak; a host process is only unattributed.
    assert_eq!(
        value(
            &text,
            "tessera_gpu_leaked_memory_mib",
            &[("UUID", "GPU-other"), ("pid", "301"), ("pod_uid", UID_GONE)]
        ),
        Some(5_000.0)
    );
    assert_eq!(
        value(
            &text,
            "tessera_gpu_unattributed_memory_mib",
            &[("pid", "302")]
        ),
        Some(100.0)
    );
    assert!(
        !text.contains(&format!("{mem}{{gpu=\"1\"")),
        "no pod series for the leaked process"
    );

    // Every metric the Grafana dashboard queries is one the agent exports.
    let dash = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/helm/tessera/dashboards/tessera-gpus.json"
    ))
    .expect("dashboard JSON");
    let names = metric_names(&dash);
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "dashboard uses {name}, not exported"
        );
    }
}

/// Identifiers in the dashboard that look like metric names.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for prefix in ["DCGM_FI_", "tessera_"] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            out.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out.retain(|n| n != "tessera_" && !n.ends_with('_') && n != "tessera_gpus");
    out
}

#[tokio::test]
async fn without_a_pod_list_nothing_is_called_a_leak() {
    let fake = Fake::from_yaml(GPUS, "test").unwrap();
    let (_tx, view) = watch::channel(NodeView {
        settings: Default::default(),
        gpus: fake.discover().unwrap(),
        health: BTreeMap::new(),
    });
    let collector = Collector::new(
        "node-1".into(),
        Arc::new(fake.clone()),
        Arc::new(fake.proc_reader()),
        Arc::new(tessera_node::deviceplugin::allocate::NoPods(
            "no API".into(),
        )),
        None,
        view,
        XidStats::default(),
    );
    let text = collector.scrape().await;
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("tessera_gpu_leaked_memory_mib{")),
        "{text}"
    );
    // Still attributed, by pod UID.
    assert_eq!(
        value(
            &text,
            "tessera_pod_gpu_memory_used_mib",
            &[("UUID", "GPU-other"), ("pod_uid", UID_GONE)]
        ),
        Some(5_000.0)
    );
}

/// The agent's MPS daemons are on `/metrics`: up while running, down (and counted
/// as a restart when started again) after an exit. A shell script stands in for
/// `nvidia-cuda-mps-control`: with `-f` it opens the control pipe and exits on
/// the first command; without, it sends its stdin there.
#[tokio::test]
async fn mps_daemons_are_reported_up_and_down() {
    use std::os::unix::fs::PermissionsExt;
    use tessera_node::mps::{MpsDaemonConfig, MpsDaemons};
    let root = tempfile::tempdir().unwrap();
    let binary = root.path().join("control");
    std::fs::write(
        &binary,
        "#!/bin/sh\nP=\"$CUDA_MPS_PIPE_DIRECTORY/control\"\n[ \"$1\" = -f ] || exec cat > \"$P\"\nmkfifo \"$P\"\nread cmd < \"$P\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemons = Arc::new(MpsDaemons::new(MpsDaemonConfig {
        binary,
        root: root.path().join("mps"),
        ..MpsDaemonConfig::default()
    }));
    daemons.ensure(&["GPU-other".to_string()]).unwrap();
    let fake = Fake::from_yaml(GPUS, "test").unwrap();
    let (_tx, view) = watch::channel(NodeView {
        settings: Default::default(),
        gpus: fake.discover().unwrap(),
        health: BTreeMap::new(),
    });
    let collector = Collector::new(
        "node-1".into(),
        Arc::new(fake.clone()),
        Arc::new(fake.proc_reader()),
        Arc::new(StaticPods::default()),
        None,
        view,
        XidStats::default(),
    )
    .with_mps(daemons.clone());
    let labels = [
        ("daemon", "GPU-other"),
        ("gpus", "GPU-other"),
        ("hostname", "node-1"),
    ];
    let text = collector.scrape().await;
    assert_eq!(
        value(&text, "tessera_mps_daemon_up", &labels),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "tessera_mps_daemon_restarts", &labels),
        Some(0.0)
    );
    // The daemon dies.
    let pid = daemons.status()[0].pid.unwrap();
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = collector.scrape().await;
        if value(&text, "tessera_mps_daemon_up", &labels) == Some(0.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Started again for the next pod: up, one restart.
    daemons.ensure(&["GPU-other".to_string()]).unwrap();
    let text = collector.scrape().await;
    assert_eq!(value(&text, "tessera_mps_daemon_up", &labels), Some(1.0));
    assert_eq!(
        value(&text, "tessera_mps_daemon_restarts", &labels),
        Some(1.0)
    );
    daemons.shutdown();
}
