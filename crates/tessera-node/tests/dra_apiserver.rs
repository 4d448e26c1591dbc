//! Reading claims and publishing slices through kube-rs's mock service, with
//! the `resource.k8s.io` version fallback (v1 → v1beta2 → v1beta1). The 404
//! answer for a version the server does not serve is the API server's
//! `Status` shape (as in ../shared/fixtures/kube-apiserver-v1.28/02-bind-to-unknown-node.json:
//! kind Status, reason NotFound, code 404).

mod dra_common;

use std::collections::BTreeMap;
use std::sync::Arc;

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::NodeView;
use tessera_node::dra::apiserver::{KubeClaims, SlicePublisher};
use tessera_node::dra::prepare::{ClaimError, ClaimSource};
use tessera_node::dra::slice::{DriverVersions, SliceOptions, resource_slices};

fn not_found() -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server could not find the requested resource", "reason": "NotFound",
        "details": {}, "code": 404});
    Response::builder()
        .status(404)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn ok(v: Value) -> Response<Body> {
    Response::new(Body::from(serde_json::to_vec(&v).unwrap()))
}

/// A request as the mock saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: String,
    body: Value,
}

/// An API server that serves only `served` versions of resource.k8s.io,
/// holds `existing` slices, and records every request.
fn server(
    served: &'static [&'static str],
    existing: Vec<Value>,
) -> (kube::Client, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or("").to_string();
            let bytes = req.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let _ = tx.send(Seen {
                method: method.clone(),
                path: path.clone(),
                query,
                body: body.clone(),
            });
            let version = path.split('/').nth(3).unwrap_or("");
            if !served.contains(&version) {
                send.send_response(not_found());
                continue;
            }
            let reply = match method.as_str() {
                "PATCH" => {
                    let mut b = body;
                    b["metadata"]["uid"] = "u".into();
                    b["metadata"]["resourceVersion"] = "1".into();
                    ok(b)
                }
                "GET" if path.ends_with("/resourceslices") => ok(json!({
                    "apiVersion": format!("resource.k8s.io/{version}"), "kind": "ResourceSliceList",
                    "metadata": {"resourceVersion": "9"}, "items": existing.clone()})),
                "GET" => ok(json!({
                    "apiVersion": format!("resource.k8s.io/{version}"), "kind": "ResourceClaim",
                    "metadata": {"name": "train", "namespace": "ml", "uid": "uid-1"},
                    "status": {"allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": "gpu.tessera.io", "pool": "node-a", "device": "gpu-0"}]}}}})),
                "DELETE" => ok(
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}),
                ),
                _ => not_found(),
            };
            send.send_response(reply);
        }
    });
    (kube::Client::new(mock, "default"), rx)
}

fn slices() -> Vec<tessera_node::dra::slice::ResourceSlice> {
    let fake = Fake::from_yaml(
        "gpus:\n  - { uuid: GPU-0, product: NVIDIA A100-SXM4-80GB }\n",
        "t",
    )
    .unwrap();
    let view = NodeView {
        settings: Default::default(),
        gpus: fake.discover().unwrap(),
        health: BTreeMap::new(),
    };
    resource_slices(
        "node-a",
        &view,
        &DriverVersions::default(),
        3,
        SliceOptions::default(),
    )
}

fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
    let mut v = Vec::new();
    while let Ok(s) = rx.try_recv() {
        v.push(s);
    }
    v
}

#[tokio::test]
async fn slices_fall_back_to_v1beta2_and_stale_slices_are_deleted_with_preconditions() {
    let stale = json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.tessera.io-1", "uid": "old-uid", "resourceVersion": "41"},
        "spec": {"driver": "gpu.tessera.io", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 2, "resourceSliceCount": 2}}});
    let current = json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.tessera.io-0", "uid": "cur", "resourceVersion": "42"},
        "spec": {"driver": "gpu.tessera.io", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 2, "resourceSliceCount": 2}}});
    let (client, mut rx) = server(&["v1beta2", "v1beta1"], vec![current, stale]);
    let mut publisher = SlicePublisher::new(client, "node-a".into());
    publisher.publish(&slices()).await.unwrap();
    assert_eq!(publisher.version(), Some("v1beta2"));
    let seen = drain(&mut rx);
    let calls: Vec<(String, String)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (
                "PATCH".into(),
                "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu.tessera.io-0".into()
            ),
            (
                "PATCH".into(),
                "/apis/resource.k8s.io/v1beta2/resourceslices/node-a-gpu.tessera.io-0".into()
            ),
            (
                "GET".into(),
                "/apis/resource.k8s.io/v1beta2/resourceslices".into()
            ),
            (
                "DELETE".into(),
                "/apis/resource.k8s.io/v1beta2/resourceslices/node-a-gpu.tessera.io-1".into()
            ),
        ]
    );
    let apply = &seen[1];
    assert!(
        apply.query.contains("fieldManager=tessera-node-agent-dra"),
        "{}",
        apply.query
    );
    assert!(apply.query.contains("force=true"), "{}", apply.query);
    assert_eq!(apply.body["apiVersion"], "resource.k8s.io/v1beta2");
    assert_eq!(apply.body["spec"]["devices"][0]["name"], "gpu-0");
    assert!(
        apply.body["spec"]["devices"][0]["attributes"].is_object(),
        "v1 shape"
    );
    assert!(
        seen[2].query.contains("spec.nodeName%3Dnode-a"),
        "{}",
        seen[2].query
    );
    assert_eq!(
        seen[3].body["preconditions"],
        json!({"uid": "old-uid", "resourceVersion": "41"})
    );
    // The version is remembered: the next publish goes straight to v1beta2.
    publisher.publish(&slices()).await.unwrap();
    let seen = drain(&mut rx);
    assert!(seen[0].path.contains("/v1beta2/"), "{}", seen[0].path);
}

#[tokio::test]
async fn v1beta1_slices_nest_device_fields_under_basic() {
    let (client, mut rx) = server(&["v1beta1"], Vec::new());
    let mut publisher = SlicePublisher::new(client, "node-a".into());
    publisher.publish(&slices()).await.unwrap();
    assert_eq!(publisher.version(), Some("v1beta1"));
    let seen = drain(&mut rx);
    let apply = seen.iter().find(|s| s.path.contains("/v1beta1/")).unwrap();
    let d = &apply.body["spec"]["devices"][0];
    assert_eq!(d["name"], "gpu-0");
    assert_eq!(d["basic"]["attributes"]["uuid"], json!({"string": "GPU-0"}));
    assert_eq!(d["basic"]["capacity"]["memory"]["value"], "81920Mi");
    assert!(d.get("attributes").is_none());
}

#[tokio::test]
async fn nothing_served_is_an_error_naming_the_versions() {
    let (client, _rx) = server(&[], Vec::new());
    let mut publisher = SlicePublisher::new(client, "node-a".into());
    let err = publisher.publish(&slices()).await.unwrap_err();
    assert!(err.to_string().contains("v1, v1beta2, v1beta1"), "{err}");
}

#[tokio::test]
async fn claims_are_read_from_the_first_served_version() {
    let (client, mut rx) = server(&["v1beta1"], Vec::new());
    let claims = KubeClaims::new(client);
    let c = claims.get("ml", "train").await.unwrap();
    assert_eq!(c.metadata.uid, "uid-1");
    assert_eq!(
        c.status.allocation.unwrap().devices.results[0].device,
        "gpu-0"
    );
    let paths: Vec<String> = drain(&mut rx).into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        [
            "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train",
            "/apis/resource.k8s.io/v1beta2/namespaces/ml/resourceclaims/train",
            "/apis/resource.k8s.io/v1beta1/namespaces/ml/resourceclaims/train",
        ]
    );
    // Remembered.
    claims.get("ml", "train").await.unwrap();
    let paths: Vec<String> = drain(&mut rx).into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        ["/apis/resource.k8s.io/v1beta1/namespaces/ml/resourceclaims/train"]
    );
}

/// A claim is "not found" only on a 404 naming it (the object is not there);
/// a 404 for versions the server does not serve, or any other error, says
/// nothing about the claim. The sweep releases claims on the first answer only.
#[tokio::test]
async fn only_a_404_naming_the_claim_is_not_found() {
    let claims = Arc::new(dra_common::FakeClaims::default());
    let kube = KubeClaims::new(dra_common::mock_api(claims.clone()));
    assert_eq!(
        kube.get("ml", "train").await.unwrap_err(),
        ClaimError::NotFound {
            namespace: "ml".into(),
            name: "train".into()
        }
    );
    claims.put("train", json!([dra_common::device("gpu-0")]));
    assert_eq!(
        kube.get("ml", "train").await.unwrap().metadata.uid,
        "uid-train"
    );
    claims.break_reads("train", true);
    assert!(matches!(
        kube.get("ml", "train").await.unwrap_err(),
        ClaimError::Unreadable(e) if e.contains("etcdserver")
    ));
    // No version served: every answer is a 404 that names nothing.
    let (client, _rx) = server(&[], Vec::new());
    assert!(matches!(
        KubeClaims::new(client)
            .get("ml", "train")
            .await
            .unwrap_err(),
        ClaimError::Unreadable(_)
    ));
}
