//! Shared test helpers: Kubernetes objects, the captured fixtures, the kube-rs mock API.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body as AxumBody;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeStatus, Pod, PodSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use kube::client::Body as KubeBody;
use tessera_api::{GpuDevice, GpuNode, GpuNodeSpec};
use tessera_core::policy::{PolicyArgs, by_name};
use tessera_k8s::binder::Binder;
use tessera_k8s::extender::ExtenderState;
use tessera_k8s::leader::Leadership;
use tessera_k8s::metrics::Metrics;
use tessera_k8s::mirror::{Mirror, SharedMirror};
use tower::ServiceExt;

pub const KEY: &[u8] = b"test-signing-key";

/// A captured request body from `../shared/fixtures/kube-scheduler-v1.28-extender/`.
/// Missing: skipped locally, a failure under `CI=true`.
pub fn fixture(name: &str) -> Option<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/kube-scheduler-v1.28-extender")
        .join(name);
    match std::fs::read(&path) {
        Ok(b) => Some(b),
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("fixture {} is missing under CI: {e}", path.display());
            }
            eprintln!("skipping: fixture {} not found ({e})", path.display());
            None
        }
    }
}

pub fn kube_node(name: &str, cpu: &str, memory: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("kubernetes.io/hostname".to_string(), name.to_string())].into()),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            allocatable: Some(
                [
                    ("cpu".to_string(), Quantity(cpu.into())),
                    ("memory".to_string(), Quantity(memory.into())),
                    ("pods".to_string(), Quantity("110".into())),
                ]
                .into(),
            ),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

pub fn gpu_node(name: &str, model: &str, memory_mib: u64, count: u32) -> GpuNode {
    GpuNode::new(
        name,
        GpuNodeSpec {
            node_name: name.into(),
            gpus: (0..count)
                .map(|index| GpuDevice {
                    index,
                    uuid: format!("GPU-{name}-{index}"),
                    model: model.into(),
                    memory_mib,
                    sm_count: 108,
                    ..Default::default()
                })
                .collect(),
        },
    )
}

pub fn pod(namespace: &str, name: &str, uid: &str, resources: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(
                        resources
                            .iter()
                            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                            .collect(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// A GpuQueue `name` under `parent`, guaranteed `gpus` GPU-equivalents (lends and
/// borrows by default).
pub fn gpu_queue(name: &str, parent: Option<&str>, gpus: &str) -> tessera_api::GpuQueue {
    tessera_api::GpuQueue::new(
        name,
        tessera_api::GpuQueueSpec {
            parent: parent.map(str::to_string),
            guaranteed: tessera_api::QueueResources {
                gpus: Some(gpus.into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

/// A namespace whose pods go to `queue` (the `tessera.io/queue` label).
pub fn queue_namespace(name: &str, queue: &str) -> k8s_openapi::api::core::v1::Namespace {
    k8s_openapi::api::core::v1::Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("tessera.io/queue".to_string(), queue.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Two A100-80GB nodes named as in the captured fixtures: 8 and 4 GPUs.
pub fn fixture_cluster() -> (Vec<Node>, Vec<GpuNode>) {
    (
        vec![
            kube_node("fake-gpu-node-1", "32", "256Gi"),
            kube_node("fake-gpu-node-2", "32", "256Gi"),
        ],
        vec![
            gpu_node("fake-gpu-node-1", "A100-80GB", 81_920, 8),
            gpu_node("fake-gpu-node-2", "A100-80GB", 81_920, 4),
        ],
    )
}

pub fn mirror(
    policy: &str,
    nodes: Vec<Node>,
    inventory: Vec<GpuNode>,
    pods: Vec<Pod>,
) -> SharedMirror {
    let policy = by_name(policy, &PolicyArgs::default()).expect("known policy");
    SharedMirror::new(Mirror::from_objects(
        policy,
        KEY.to_vec(),
        nodes,
        inventory,
        pods,
    ))
}

pub fn state(mirror: SharedMirror, client: Option<kube::Client>) -> ExtenderState {
    let judging = ExtenderState::judging_only(mirror.clone());
    ExtenderState {
        binder: client.map(|c| Binder::new(c, mirror, judging.leader.clone())),
        ..judging
    }
}

/// POSTs `body` to the router without a socket; returns status and JSON (or text as a JSON string).
pub async fn call(
    router: axum::Router,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(AxumBody::from(body))
        .expect("request");
    let resp = router.oneshot(req).await.expect("router is infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
    });
    (status, value)
}

/// One request the mock API server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: serde_json::Value,
}

/// A kube client on tower-test's mock service; `respond` answers each request
/// (status, JSON body). The returned handle yields everything seen once the client is dropped.
pub fn mock_api(
    respond: impl Fn(&Seen) -> (u16, serde_json::Value) + Send + 'static,
) -> (kube::Client, tokio::task::JoinHandle<Vec<Seen>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<KubeBody>, Response<KubeBody>>();
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let s = Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
            };
            let (status, json) = respond(&s);
            seen.push(s);
            let resp = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(KubeBody::from(
                    serde_json::to_vec(&json).unwrap_or_default(),
                ))
                .expect("response");
            send.send_response(resp);
        }
        seen
    });
    (kube::Client::new(service, "default"), task)
}

/// A `Status` body as the API server sends it.
pub fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" },
        "message": message, "reason": reason, "code": code
    })
}

/// The API's answer to a standalone scheduler's writes: Bindings and evictions
/// accepted (201 `Status`), Events echoed back with a name.
pub fn accept_writes(s: &Seen) -> (u16, serde_json::Value) {
    if s.path.ends_with("/binding") || s.path.ends_with("/eviction") {
        (201, status(201, "", ""))
    } else {
        let mut ev = s.body.clone();
        ev["metadata"]["name"] = "ev".into();
        (201, ev)
    }
}

/// A leading standalone scheduler (`schedulerName: tessera`) over `m`, writing
/// through `client`; its events are published when `events`.
pub fn standalone(
    m: &SharedMirror,
    client: kube::Client,
    events: bool,
) -> tessera_k8s::standalone::Standalone {
    let leader = Leadership::always();
    let recorder = events.then(|| {
        tessera_k8s::events::Publisher::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "tessera".into(),
                instance: None,
            },
        )
    });
    tessera_k8s::standalone::Standalone::new(
        "tessera".into(),
        m.clone(),
        Binder::new(client, m.clone(), leader.clone()),
        leader,
        Arc::new(Metrics::new()),
        recorder,
        Default::default(),
    )
}
