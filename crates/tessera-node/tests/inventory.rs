//! The inventory's requests, checked against a mock API server (tower-test).

mod common;

use std::collections::BTreeMap;

use http::{Request, Response};
use kube::client::Body;
use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::NodeView;
use tessera_node::health::GpuHealth;
use tessera_node::inventory::{Inventory, gpu_node_spec, gpu_node_status, node_labels};

const GPUS: &str = r#"
driverVersion: "550.54.15"
cudaVersion: "12.4"
gpus:
  - { uuid: GPU-a, product: NVIDIA H100 80GB HBM3, numaNode: 0, nvlinks: { GPU-b: 18 }, computeCapability: "9.0" }
  - uuid: GPU-b
    product: NVIDIA H100 80GB HBM3
    numaNode: 1
    mig: { enabled: true, instances: [ { uuid: MIG-1, profile: 3g.40gb, start: 4 } ] }
"#;

async fn body_json(req: Request<Body>) -> serde_json::Value {
    let bytes = req.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn publishes_gpunode_status_and_labels() {
    let fake = Fake::from_yaml(GPUS, "t").unwrap();
    let mut view = NodeView {
        settings: Default::default(),
        gpus: fake.discover().unwrap(),
        health: BTreeMap::new(),
    };
    view.health.insert("GPU-a".into(), GpuHealth::Healthy);
    view.health.insert(
        "GPU-b".into(),
        GpuHealth::Unhealthy {
            reason: "XID 79 (GPU has fallen off the bus)".into(),
            xid: Some(79),
        },
    );
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let inv = Inventory::new(client, "node-a".into());

    let server = tokio::spawn(async move {
        // 1. Server-side apply of the GpuNode spec.
        let (req, send) = handle.next_request().await.expect("spec request");
        assert_eq!(req.method(), http::Method::PATCH);
        let uri = req.uri().to_string();
        assert!(
            uri.starts_with("/apis/tessera.io/v1alpha1/gpunodes/node-a?"),
            "{uri}"
        );
        assert!(
            uri.contains("fieldManager=tessera-node-agent") && uri.contains("force=true"),
            "{uri}"
        );
        assert_eq!(
            req.headers()["content-type"],
            "application/apply-patch+yaml"
        );
        let body = body_json(req).await;
        assert_eq!(body["kind"], "GpuNode");
        assert_eq!(body["spec"]["nodeName"], "node-a");
        let gpus = &body["spec"]["gpus"];
        assert_eq!(gpus[0]["model"], "H100-80GB");
        assert_eq!(gpus[0]["memoryMiB"], 81_559);
        assert_eq!(gpus[0]["numa"], 0);
        assert_eq!(gpus[0]["links"][0]["peer"], 1);
        assert_eq!(gpus[0]["links"][0]["kind"], "NVLink");
        assert_eq!(gpus[0]["links"][0]["nvlinks"], 18);
        assert_eq!(gpus[1]["mig"]["enabled"], true);
        assert_eq!(gpus[1]["mig"]["instances"][0]["profile"], "3g.40gb");
        assert_eq!(gpus[1]["mig"]["instances"][0]["start"], 4);
        assert_eq!(gpus[1]["mig"]["instances"][0]["size"], 4);
        assert_eq!(gpus[1]["health"], "Unhealthy");
        let reply = serde_json::json!({"apiVersion": "tessera.io/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": "node-a"}, "spec": body["spec"]});
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&reply).unwrap(),
        )));

        // 2. The status subresource.
        let (req, send) = handle.next_request().await.expect("status request");
        assert_eq!(
            req.uri().path(),
            "/apis/tessera.io/v1alpha1/gpunodes/node-a/status"
        );
        let body = body_json(req).await;
        let st = &body["status"];
        assert_eq!(st["gpuCount"], 2);
        assert_eq!(st["healthyGpus"], 1);
        assert_eq!(st["health"], "Degraded");
        assert_eq!(
            st["gpus"][1]["reason"],
            "XID 79 (GPU has fallen off the bus)"
        );
        let reply = serde_json::json!({"apiVersion": "tessera.io/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": "node-a"}, "spec": {"nodeName": "node-a"}, "status": st});
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&reply).unwrap(),
        )));

        // 3. GFD-style labels merged into the Node.
        let (req, send) = handle.next_request().await.expect("labels request");
        assert_eq!(req.method(), http::Method::PATCH);
        assert_eq!(req.uri().path(), "/api/v1/nodes/node-a");
        assert_eq!(
            req.headers()["content-type"],
            "application/merge-patch+json"
        );
        let body = body_json(req).await;
        let labels = &body["metadata"]["labels"];
        assert_eq!(labels["nvidia.com/gpu.product"], "H100-80GB-HBM3");
        assert_eq!(labels["nvidia.com/gpu.count"], "2");
        assert_eq!(labels["nvidia.com/gpu.memory"], "81559");
        assert_eq!(labels["nvidia.com/gpu.family"], "hopper");
        assert_eq!(labels["nvidia.com/cuda.driver-version.major"], "550");
        let reply = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": labels}});
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&reply).unwrap(),
        )));
    });

    let spec = gpu_node_spec("node-a", &view);
    inv.publish_spec(&spec).await.unwrap();
    inv.publish_status(&gpu_node_status(&spec, &view, 1000))
        .await
        .unwrap();
    let labels = node_labels(
        &view.gpus,
        fake.driver_version().as_deref(),
        fake.cuda_version().as_deref(),
    );
    inv.publish_labels(&labels).await.unwrap();
    server.await.unwrap();
}

/// The running agent marks a failed GPU in its GpuNode status and clears the mark on recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_agent_marks_failed_gpus_in_the_inventory() {
    use std::time::Duration;

    let fake = Fake::from_yaml(GPUS, "t").unwrap();
    let (client, mut seen) = echo_api();
    let dir = tempfile::tempdir().unwrap();
    let config = agent_config(dir.path(), tessera_api::gpunode::HEARTBEAT_PERIOD);
    let agent = RunningAgent::start(config, &fake, client, None);
    let wait = Duration::from_secs(20);
    // Waits for a status write satisfying `pred`.
    let mut status_where = async |pred: &dyn Fn(&serde_json::Value) -> bool| -> serde_json::Value {
        loop {
            let Seen { path, body, .. } = tokio::time::timeout(wait, seen.recv())
                .await
                .unwrap()
                .unwrap();
            if path.ends_with("/status") && pred(&body["status"]) {
                return body["status"].clone();
            }
        }
    };
    let st = status_where(&|s| s["health"] == "Healthy").await;
    assert_eq!(st["gpuCount"], 2);
    fake.inject_xid("GPU-b", 79);
    let st = status_where(&|s| s["health"] == "Degraded").await;
    assert_eq!(st["gpus"][1]["health"], "Unhealthy");
    assert_eq!(
        st["gpus"][1]["reason"],
        "XID 79 (GPU has fallen off the bus)"
    );
    assert_eq!(st["gpus"][0]["health"], "Healthy");
    fake.recover("GPU-b").unwrap();
    let st = status_where(&|s| s["health"] == "Healthy").await;
    assert_eq!(st["healthyGpus"], 2);
    agent.stop(wait).await;
}

/// The kubelet's PodResources API (a fake gRPC server on a real unix socket)
/// says which devices each container holds, whatever plugin served them; the
/// agent's GpuNode status carries them with the GPUs behind the device IDs, so
/// the scheduler counts GPUs held by pods it did not place (issue 27 item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_carries_pod_resources_from_the_kubelet() {
    use std::sync::Arc;
    use std::time::Duration;
    use tessera_node::podresources::PodResourcesClient;
    use tessera_node::proto::podresources as prpb;

    let fake = Fake::from_yaml(GPUS, "t").unwrap();
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<(String, serde_json::Value)>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_string();
            if let Some(r) = common::unserved_dra(&path) {
                send.send_response(r);
                continue;
            }
            let body = body_json(req).await;
            let mut reply = body.clone();
            reply["metadata"]["name"] = "node-a".into();
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&reply).unwrap(),
            )));
            let _ = seen_tx.send((path, body));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kubelet = common::FakePodResources::default();
    let device = |resource: &str, ids: &[&str]| prpb::ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: None,
    };
    let container = |name: &str, devices| prpb::ContainerResources {
        name: name.into(),
        devices,
        ..Default::default()
    };
    kubelet.set(vec![
        // A pod NVIDIA's plugin served before Tessera managed the node, with a
        // time-slicing replica; one on a MIG instance; one holding no GPU.
        prpb::PodResources {
            name: "legacy".into(),
            namespace: "ml".into(),
            containers: vec![
                container("main", vec![device("nvidia.com/gpu", &["GPU-a::3"])]),
                container("side", vec![device("example.com/nic", &["eth1"])]),
            ],
            ..Default::default()
        },
        prpb::PodResources {
            name: "mig".into(),
            namespace: "ml".into(),
            containers: vec![container(
                "main",
                vec![device("nvidia.com/mig-3g.40gb", &["MIG-1"])],
            )],
            ..Default::default()
        },
        prpb::PodResources {
            name: "web".into(),
            namespace: "ml".into(),
            containers: vec![container("main", vec![])],
            ..Default::default()
        },
    ]);
    let socket = common::start_pod_resources(dir.path(), kubelet.clone());
    let config = agent_config(dir.path(), tessera_api::gpunode::HEARTBEAT_PERIOD);
    let kubelet = Arc::new(PodResourcesClient { socket });
    let agent = RunningAgent::start(config, &fake, client, Some(kubelet));
    let wait = Duration::from_secs(20);
    let status = loop {
        let (path, body) = tokio::time::timeout(wait, seen.recv())
            .await
            .expect("a status with podResources within the wait bound")
            .unwrap();
        if path.ends_with("/status") && body["status"].get("podResources").is_some() {
            break body["status"]["podResources"].clone();
        }
    };
    assert!(
        status["observedAt"].as_str().unwrap().ends_with('Z'),
        "{status}"
    );
    assert_eq!(
        status["containers"],
        serde_json::json!([
            {"namespace": "ml", "pod": "legacy", "container": "main", "resource": "nvidia.com/gpu",
             "deviceIds": ["GPU-a::3"], "gpuUuids": ["GPU-a"]},
            {"namespace": "ml", "pod": "mig", "container": "main", "resource": "nvidia.com/mig-3g.40gb",
             "deviceIds": ["MIG-1"], "gpuUuids": ["GPU-b"]},
        ])
    );
    agent.stop(wait).await;
}

/// Issue 29: the DRA driver deletes the `GpuNode` the device-plugin agent left
/// on its node (read first, deleted with that object's UID and resourceVersion
/// as preconditions), and a node that has none is left alone (the 404 worded as
/// the API server words it, ../shared/fixtures/kube-apiserver-v1.28/16-delete-semantics.json). Before, the `GpuNode` stayed and Tessera's
/// scheduler could place pods on a DRA node by it.
#[tokio::test]
async fn the_dra_driver_retires_the_nodes_gpunode_on_the_object_it_read() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let inv = Inventory::new(client, "node-a".into());
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("the read");
        assert_eq!(req.method(), http::Method::GET);
        assert_eq!(
            req.uri().path(),
            "/apis/tessera.io/v1alpha1/gpunodes/node-a"
        );
        let obj = serde_json::json!({"apiVersion": "tessera.io/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": "node-a", "uid": "uid-gn-1", "resourceVersion": "4711"},
            "spec": {"nodeName": "node-a", "gpus": []}});
        send.send_response(Response::new(Body::from(serde_json::to_vec(&obj).unwrap())));
        let (req, send) = handle.next_request().await.expect("the delete");
        assert_eq!(req.method(), http::Method::DELETE);
        assert_eq!(
            req.uri().path(),
            "/apis/tessera.io/v1alpha1/gpunodes/node-a"
        );
        let body = body_json(req).await;
        assert_eq!(body["preconditions"]["uid"], "uid-gn-1", "{body}");
        assert_eq!(body["preconditions"]["resourceVersion"], "4711", "{body}");
        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Success",
            "details": {"name": "node-a", "group": "tessera.io", "kind": "gpunodes", "uid": "uid-gn-1"}});
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&status).unwrap(),
        )));
        // A second call finds none: nothing to delete.
        let (req, send) = handle.next_request().await.expect("the second read");
        assert_eq!(req.method(), http::Method::GET);
        let missing = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "gpunodes.tessera.io \"node-a\" not found",
            "reason": "NotFound", "details": {"name": "node-a", "group": "tessera.io", "kind": "gpunodes"},
            "code": 404});
        send.send_response(
            Response::builder()
                .status(404)
                .body(Body::from(serde_json::to_vec(&missing).unwrap()))
                .unwrap(),
        );
    });
    assert!(inv.retire().await.unwrap(), "the GpuNode is deleted");
    assert!(!inv.retire().await.unwrap(), "none left: nothing deleted");
    server.await.unwrap();
}

/// A quiet node (steady GPUs, no kubelet report) rewrites its GpuNode status
/// through the status subresource once per heartbeat period with a fresh
/// `heartbeatTime`, so the scheduler can tell a live agent from a gone one;
/// and not more often, although its health is probed every 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_agent_heartbeats_once_per_period() {
    use std::time::Duration;
    use tokio::time::Instant;

    let period = Duration::from_millis(400);
    let fake = Fake::from_yaml(GPUS, "t").unwrap();
    let (client, mut seen) = echo_api();
    let dir = tempfile::tempdir().unwrap();
    let config = agent_config(dir.path(), period);
    let agent = RunningAgent::start(config, &fake, client, None);
    let wait = Duration::from_secs(20);
    // The start-up write and four heartbeats after it.
    let mut writes: Vec<(Instant, String)> = Vec::new();
    while writes.len() < 5 {
        let Seen {
            at,
            path,
            method,
            body,
        } = tokio::time::timeout(wait, seen.recv())
            .await
            .expect("a status write within the wait bound")
            .unwrap();
        if !path.ends_with("/status") {
            continue;
        }
        assert_eq!(path, "/apis/tessera.io/v1alpha1/gpunodes/node-a/status");
        assert_eq!(method, http::Method::PATCH);
        assert_eq!(body["status"]["health"], "Healthy", "{body}");
        let beat = body["status"]["heartbeatTime"]
            .as_str()
            .unwrap_or_else(|| panic!("every status write carries heartbeatTime: {body}"));
        assert!(beat.parse::<jiff::Timestamp>().is_ok(), "RFC 3339: {beat}");
        writes.push((at, beat.to_string()));
    }
    agent.stop(wait).await;
    for pair in writes.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        // Not more often: each write is due one period after the last; the
        // quarter's slack is for when the mock server saw each request.
        assert!(
            gap >= period * 3 / 4,
            "status written {gap:?} after the last, period {period:?}"
        );
        // Each write is a change the scheduler sees (a new resourceVersion).
        assert_ne!(pair[0].1, pair[1].1, "heartbeatTime moves on");
    }
}

/// Issue 41: a device-plugin agent started on a node the DRA driver already
/// serves (restarted after the handover, or a DaemonSet not yet rolled) would
/// publish the node's `GpuNode` again, and the same GPUs would be offered
/// twice: through the `GpuNode` to Tessera's extender and through the slices
/// to kube-scheduler's DRA plugin, neither seeing the other's grants. So
/// while `gpu.tessera.io` slices serve the node the agent writes no `GpuNode`
/// (nor anything else), says why in a Warning event on the Node, and looks
/// again; once the slices are gone it serves the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_writes_no_gpunode_while_the_dra_driver_serves_its_node() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    let fake = Fake::from_yaml(GPUS, "t").unwrap();
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let serving = Arc::new(AtomicBool::new(true));
    let (seen_tx, mut seen) =
        tokio::sync::mpsc::unbounded_channel::<(String, String, serde_json::Value)>();
    let dra = serving.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or_default().to_string();
            // A list has no body.
            let bytes = req.into_body().collect_bytes().await.unwrap();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let reply = if path == "/apis/resource.k8s.io/v1/resourceslices" {
                // A 1.34+ server's list, with the driver's slice while it serves.
                let items = if dra.load(Ordering::SeqCst) {
                    serde_json::json!([{
                        "metadata": {"name": "node-a-gpu.tessera.io-0", "uid": "u-1", "resourceVersion": "7"},
                        "spec": {"driver": "gpu.tessera.io", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}, "devices": []}
                    }])
                } else {
                    serde_json::json!([])
                };
                serde_json::json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": "9"}, "items": items})
            } else {
                let mut reply = body.clone();
                reply["metadata"]["name"] = "node-a".into();
                reply
            };
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&reply).unwrap(),
            )));
            let _ = seen_tx.send((path, query, body));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = agent_config(dir.path(), tessera_api::gpunode::HEARTBEAT_PERIOD);
    let agent = RunningAgent::start(config, &fake, client, None);
    let wait = Duration::from_secs(20);
    let mut next = async || {
        tokio::time::timeout(wait, seen.recv())
            .await
            .unwrap()
            .unwrap()
    };
    // First it asks which slices serve its node, by field selector.
    let (path, query, _) = next().await;
    assert_eq!(path, "/apis/resource.k8s.io/v1/resourceslices");
    assert!(
        query.contains("fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpu.tessera.io"),
        "{query}"
    );
    // Then it says why it waits, on the Node.
    let (path, _, event) = next().await;
    assert_eq!(path, "/api/v1/namespaces/default/events", "{event}");
    assert_eq!(event["reason"], "GpusServedThroughDRA");
    assert_eq!(event["involvedObject"]["kind"], "Node");
    assert_eq!(event["involvedObject"]["name"], "node-a");
    let message = event["message"].as_str().unwrap();
    assert!(
        message.contains("ResourceSlices node-a-gpu.tessera.io-0"),
        "{message}"
    );
    // The driver stops and its slices go: the agent's next request is its
    // next look (it wrote no GpuNode while they were there), then it serves.
    serving.store(false, Ordering::SeqCst);
    let mut after: Vec<String> = Vec::new();
    let spec = loop {
        let (path, _, body) = next().await;
        if path.starts_with("/apis/tessera.io/") && !path.ends_with("/status") {
            break body;
        }
        after.push(path);
    };
    // The slices gone, the GpuNode is published at the next look.
    assert_eq!(
        after,
        vec!["/apis/resource.k8s.io/v1/resourceslices".to_string()]
    );
    assert_eq!(
        spec["spec"]["gpus"].as_array().map(Vec::len),
        Some(2),
        "{spec}"
    );
    agent.stop(wait).await;
}

/// The agent of these tests: node `node-a`, plugin sockets in `dir`, fast health
/// checks, heartbeats every `heartbeat_period`.
fn agent_config(
    dir: &std::path::Path,
    heartbeat_period: std::time::Duration,
) -> tessera_node::run::AgentConfig {
    use tessera_node::deviceplugin::allocate::MpsConfig;
    use tessera_node::deviceplugin::registration::PluginConfig;
    use tessera_node::health::XidPolicy;
    tessera_node::run::AgentConfig {
        node_name: "node-a".into(),
        plugin: PluginConfig {
            dir: dir.to_path_buf(),
            poll: std::time::Duration::from_millis(100),
        },
        slots: 2,
        metrics_addr: None,
        xid_policy: XidPolicy::default(),
        quiet_period: std::time::Duration::from_secs(3600),
        health_interval: std::time::Duration::from_millis(50),
        heartbeat_period,
        allocation_key: b"k".to_vec().into(),
        mps: MpsConfig::default(),
        device_list: Default::default(),
        nvidia_gpu: true,
        node_labels: false,
        mig_grace: std::time::Duration::from_millis(300),
        mig_state: None,
        mps_binary: "nvidia-cuda-mps-control".into(),
        allocate_state: None,
    }
}

/// A request [`echo_api`] answered, when it arrived.
struct Seen {
    at: tokio::time::Instant,
    path: String,
    method: http::Method,
    body: serde_json::Value,
}

/// A client whose API server answers every request with its own body (named
/// `node-a`, with a spec where it had none) and reports each request.
fn echo_api() -> (kube::Client, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let at = tokio::time::Instant::now();
            let (path, method) = (req.uri().path().to_string(), req.method().clone());
            if let Some(r) = common::unserved_dra(&path) {
                send.send_response(r);
                continue;
            }
            let body = body_json(req).await;
            let mut reply = body.clone();
            reply["metadata"]["name"] = "node-a".into();
            if reply.get("spec").is_none() {
                reply["spec"] = serde_json::json!({"nodeName": "node-a"});
            }
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&reply).unwrap(),
            )));
            let _ = seen_tx.send(Seen {
                at,
                path,
                method,
                body,
            });
        }
    });
    (kube::Client::new(mock, "default"), seen)
}

/// The whole agent of these tests on `fake`'s GPUs, writing its `GpuNode`
/// through `client`, with the kubelet's PodResources API if given.
struct RunningAgent {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tessera_node::run::RunError>>,
}

impl RunningAgent {
    fn start(
        config: tessera_node::run::AgentConfig,
        fake: &Fake,
        client: kube::Client,
        kubelet: Option<std::sync::Arc<dyn tessera_node::podresources::KubeletPods>>,
    ) -> RunningAgent {
        use std::sync::Arc;
        let deps = tessera_node::run::AgentDeps {
            backend: Arc::new(fake.clone()),
            procs: Arc::new(fake.proc_reader()),
            pods: Arc::new(tessera_node::deviceplugin::allocate::NoPods("test".into())),
            pod_resources: None,
            kubelet,
            inventory: Some(Inventory::new(client, "node-a".into())),
            node_settings: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tessera_node::run::run(config, deps, async {
            let _ = stopped.await;
        }));
        RunningAgent { stop, task }
    }

    /// Stops it and waits (up to `wait`) for a clean exit.
    async fn stop(self, wait: std::time::Duration) {
        let _ = self.stop.send(());
        tokio::time::timeout(wait, self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
