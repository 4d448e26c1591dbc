//! Test support: a small cluster served by the kube-rs mock service
//! (tower-test), answering the LISTs the views make, shaped like the real
//! v1.28 API server's responses (`../shared/fixtures/kube-apiserver-v1.28/`):
//! `kind: XList`, `metadata.resourceVersion`, `items`, and a `Status` 404.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tessera_core::allocation::{ANNOTATION, AllocatedGpu, Allocation, MigGrant};
use tessera_core::request::Isolation;

/// The requests the mock saw: `path?query`.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// Objects of a mock cluster, as JSON.
#[derive(Debug, Clone, Default)]
pub struct MockCluster {
    pub nodes: Vec<Value>,
    pub gpunodes: Vec<Value>,
    pub pods: Vec<Value>,
    pub events: Vec<Value>,
    pub gpuqueues: Vec<Value>,
    pub namespaces: Vec<Value>,
    pub podgroups: Vec<Value>,
    /// Answer 404 for GpuNodes, GpuQueues and PodGroups, as a cluster without the CRDs does.
    pub no_crd: bool,
}

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Value {
    json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": "4242"}, "items": items})
}

fn not_found(path: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("the server could not find the requested resource ({path})"),
           "reason": "NotFound", "details": {}, "code": 404})
}

fn in_namespace(items: &[Value], ns: &str) -> Vec<Value> {
    items
        .iter()
        .filter(|o| o["metadata"]["namespace"] == ns)
        .cloned()
        .collect()
}

impl MockCluster {
    fn answer(&self, path: &str, query: &str) -> (u16, Value) {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match parts.as_slice() {
            ["api", "v1", "nodes"] => (200, list("NodeList", "v1", self.nodes.clone())),
            ["api", "v1", "pods"] => (200, list("PodList", "v1", self.pods.clone())),
            ["api", "v1", "namespaces", ns, "pods"] => {
                (200, list("PodList", "v1", in_namespace(&self.pods, ns)))
            }
            ["api", "v1", "namespaces", ns, "events"] => {
                let mut items = in_namespace(&self.events, ns);
                // The one field selector the views use: involvedObject.name=NAME.
                let sel = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("fieldSelector="))
                    .map(|v| v.replace("%3D", "="));
                if let Some(name) = sel
                    .as_deref()
                    .and_then(|s| s.strip_prefix("involvedObject.name="))
                {
                    items.retain(|e| e["involvedObject"]["name"] == name);
                }
                (200, list("EventList", "v1", items))
            }
            ["api", "v1", "namespaces"] => {
                (200, list("NamespaceList", "v1", self.namespaces.clone()))
            }
            ["apis", "tessera.io", "v1alpha1", "gpuqueues"] if !self.no_crd => (
                200,
                list(
                    "GpuQueueList",
                    "tessera.io/v1alpha1",
                    self.gpuqueues.clone(),
                ),
            ),
            ["apis", "scheduling.x-k8s.io", "v1alpha1", "podgroups"] if !self.no_crd => (
                200,
                list(
                    "PodGroupList",
                    "scheduling.x-k8s.io/v1alpha1",
                    self.podgroups.clone(),
                ),
            ),
            ["apis", "tessera.io", "v1alpha1", "gpunodes"] if !self.no_crd => (
                200,
                list("GpuNodeList", "tessera.io/v1alpha1", self.gpunodes.clone()),
            ),
            _ => (404, not_found(path)),
        }
    }

    /// A client whose every request this cluster answers, and the log of requests.
    pub fn client(self) -> (kube::Client, Seen) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let seen: Seen = Arc::default();
        let log = seen.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let path = req.uri().path().to_string();
                let query = req.uri().query().unwrap_or("").to_string();
                log.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{path}?{query}"));
                let (status, body) = self.answer(&path, &query);
                let resp = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                    .expect("a response from constant parts");
                send.send_response(resp);
            }
        });
        (kube::Client::new(service, "default"), seen)
    }
}

pub fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// A GpuNode of `count` A100-80GB GPUs; `unhealthy` = (index, reason) in its status.
pub fn gpunode(name: &str, count: u32, unhealthy: Option<(u32, &str)>) -> Value {
    let gpus: Vec<Value> = (0..count)
        .map(|i| {
            json!({"index": i, "uuid": format!("GPU-{name}-{i}"), "model": "A100-80GB",
                        "memoryMiB": 81920, "smCount": 108})
        })
        .collect();
    let mut v = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"nodeName": name, "gpus": gpus}});
    if let Some((index, reason)) = unhealthy {
        v["status"] = json!({"model": "A100-80GB", "gpuCount": count, "healthyGpus": count - 1,
            "health": "Degraded",
            "gpus": [{"index": index, "health": "Unhealthy", "reason": reason}]});
    }
    v
}

/// One granted GPU: (index, milli, memory MiB, MIG profile and start).
pub type Grant<'a> = (u32, u32, u64, Option<(&'a str, u8)>);

pub fn allocation(
    ns: &str,
    name: &str,
    node: &str,
    isolation: Isolation,
    gpus: &[Grant<'_>],
) -> String {
    let a = Allocation {
        version: tessera_core::allocation::VERSION,
        pod_uid: format!("uid-{name}"),
        pod: format!("{ns}/{name}"),
        node: node.to_string(),
        policy: "tessera".to_string(),
        isolation,
        gpus: gpus
            .iter()
            .map(|&(index, cores_milli, memory_mib, mig)| AllocatedGpu {
                index,
                uuid: format!("GPU-{node}-{index}"),
                memory_mib,
                cores_milli,
                mig: mig.map(|(profile, start)| MigGrant {
                    profile: profile.to_string(),
                    start,
                    size: 4,
                    uuid: String::new(),
                    create: false,
                    enable_mig_mode: false,
                }),
            })
            .collect(),
        containers: Vec::new(),
        signature: String::new(),
    };
    serde_json::to_string(&a).unwrap_or_default()
}

/// A pod asking `resources`; bound to `node` with `annotation` when given.
pub fn pod(
    ns: &str,
    name: &str,
    resources: &[(&str, &str)],
    node: Option<&str>,
    annotation: Option<String>,
) -> Value {
    let requests: serde_json::Map<String, Value> = resources
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "resourceVersion": "7"},
        "spec": {"schedulerName": "tessera",
                 "containers": [{"name": "main", "image": "img", "resources": {"requests": requests.clone(), "limits": requests}}]},
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    if let Some(a) = annotation {
        p["metadata"]["annotations"] = json!({ ANNOTATION: a });
    }
    p
}

/// Two nodes: gpu-a (2 GPUs, GPU 1 withdrawn for XID 79) and gpu-b (1 GPU);
/// ml/train holds gpu-a's GPU 0, ml/infer and team/chat share gpu-b's GPU 0
/// (500m and 300m), ml/waiting asks 4 GPUs, ml/web asks none.
pub fn cluster() -> MockCluster {
    use Isolation::{Exclusive, Mps};
    MockCluster {
        nodes: vec![node("gpu-a"), node("gpu-b")],
        gpunodes: vec![
            gpunode("gpu-a", 2, Some((1, "XID 79: GPU has fallen off the bus"))),
            gpunode("gpu-b", 1, None),
        ],
        pods: vec![
            pod(
                "ml",
                "train",
                &[("tessera.io/gpu", "1")],
                Some("gpu-a"),
                Some(allocation(
                    "ml",
                    "train",
                    "gpu-a",
                    Exclusive,
                    &[(0, 1000, 81920, None)],
                )),
            ),
            pod(
                "ml",
                "infer",
                &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "500")],
                Some("gpu-b"),
                Some(allocation(
                    "ml",
                    "infer",
                    "gpu-b",
                    Mps,
                    &[(0, 500, 40960, None)],
                )),
            ),
            pod(
                "team",
                "chat",
                &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "300")],
                Some("gpu-b"),
                Some(allocation(
                    "team",
                    "chat",
                    "gpu-b",
                    Mps,
                    &[(0, 300, 24576, None)],
                )),
            ),
            pod("ml", "waiting", &[("tessera.io/gpu", "4")], None, None),
            pod("ml", "web", &[("cpu", "1")], Some("gpu-b"), None),
        ],
        events: Vec::new(),
        no_crd: false,
        gpuqueues: Vec::new(),
        namespaces: Vec::new(),
        podgroups: Vec::new(),
    }
}
