//! What the DRA driver's tests share: the fake node (one GPU in MIG mode with an
//! instance someone else made, one whole GPU), claims as the API server holds
//! them ([`FakeClaims`], read directly or through [`mock_api`], an API server on
//! kube-rs's mock service that answers claim reads as the real one does).
#![allow(dead_code)] // each test binary uses its own part

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tessera_node::dra::prepare::{ClaimError, ClaimSource, ResourceClaim};

pub const NODE: &str = "node-a";
/// `gpu-0` (GPU-m) is in MIG mode with `MIG-foreign` (1g.10gb at 0), made by
/// someone else; `gpu-1` (GPU-s) is a whole GPU.
pub const GPUS: &str = r#"
gpus:
  - uuid: GPU-m
    product: NVIDIA A100-SXM4-80GB
    mig:
      enabled: true
      instances: [ { uuid: MIG-foreign, profile: 1g.10gb, start: 0 } ]
  - { uuid: GPU-s, product: NVIDIA A100-SXM4-80GB }
"#;

/// Claims by name (namespace `ml`, UID `uid-<name>`), as the API server would
/// return them; reads of the names in `broken` fail as an API server error would.
#[derive(Default)]
pub struct FakeClaims {
    claims: Mutex<BTreeMap<String, Value>>,
    broken: Mutex<BTreeSet<String>>,
    /// Reads per name, answered or not.
    reads: Mutex<BTreeMap<String, usize>>,
}

/// What the API server answers for claim `name`.
enum Answer {
    Claim(Value),
    NotFound,
    Error,
}

impl FakeClaims {
    /// Claim `name` (UID `uid-<name>`) allocated `results`.
    pub fn put(&self, name: &str, results: Value) {
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
            "status": {"allocation": {"devices": {"results": results}}}
        });
        self.claims.lock().unwrap().insert(name.into(), claim);
    }

    /// Claim `name` deleted (force-deleted: no unprepare follows).
    pub fn delete(&self, name: &str) {
        self.claims.lock().unwrap().remove(name);
    }

    /// Reads of claim `name` fail (`true`) or work again (`false`).
    pub fn break_reads(&self, name: &str, broken: bool) {
        let mut b = self.broken.lock().unwrap();
        if broken {
            b.insert(name.into());
        } else {
            b.remove(name);
        }
    }

    /// How often claim `name` was read.
    pub fn reads(&self, name: &str) -> usize {
        self.reads.lock().unwrap().get(name).copied().unwrap_or(0)
    }

    fn answer(&self, name: &str) -> Answer {
        *self.reads.lock().unwrap().entry(name.into()).or_default() += 1;
        if self.broken.lock().unwrap().contains(name) {
            return Answer::Error;
        }
        match self.claims.lock().unwrap().get(name) {
            Some(c) => Answer::Claim(c.clone()),
            None => Answer::NotFound,
        }
    }
}

#[tonic::async_trait]
impl ClaimSource for FakeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        match self.answer(name) {
            Answer::Claim(v) => {
                serde_json::from_value(v).map_err(|e| ClaimError::Unreadable(e.to_string()))
            }
            Answer::NotFound => Err(ClaimError::NotFound {
                namespace: namespace.into(),
                name: name.into(),
            }),
            Answer::Error => Err(ClaimError::Unreadable(
                "etcdserver: request timed out".into(),
            )),
        }
    }
}

/// One allocated device of the claim's request `gpu`, in this node's pool.
pub fn device(name: &str) -> Value {
    json!({"request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": name})
}

fn reply(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

/// An API server serving `resource.k8s.io/v1` only, its claims from `claims`.
/// Its answers have the real server's shapes: a missing claim is a `NotFound`
/// `Status` naming it in `details`, an unserved version one naming nothing, a
/// failed read a 500 `InternalError`.
pub fn mock_api(claims: Arc<FakeClaims>) -> kube::Client {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_string();
            let parts: Vec<&str> = path.split('/').collect();
            // ["", "apis", "resource.k8s.io", version, "namespaces", ns, "resourceclaims", name]
            let answer = match parts.as_slice() {
                [
                    "",
                    "apis",
                    "resource.k8s.io",
                    "v1",
                    "namespaces",
                    _,
                    "resourceclaims",
                    name,
                ] if req.method() == http::Method::GET => match claims.answer(name) {
                    Answer::Claim(c) => reply(200, &c),
                    Answer::NotFound => reply(
                        404,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Failure",
                                "message": format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                                "reason": "NotFound",
                                "details": {"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"},
                                "code": 404}),
                    ),
                    Answer::Error => reply(
                        500,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Failure", "message": "etcdserver: request timed out",
                                "reason": "InternalError", "code": 500}),
                    ),
                },
                _ => reply(
                    404,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure",
                        "message": "the server could not find the requested resource",
                        "reason": "NotFound", "details": {}, "code": 404}),
                ),
            };
            send.send_response(answer);
        }
    });
    kube::Client::new(mock, "default")
}
