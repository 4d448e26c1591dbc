//! Writing a DRA allocation through `resourceclaims/status`, against kube-rs's
//! mock API service.
//!
//! The claim JSON is not recorded from a server: the recorded fixtures are of
//! kube-apiserver v1.28, which has no `resource.k8s.io/v1`. It is written from
//! the upstream types (`k8s.io/api/resource/v1/types.go`, protocols.md §3.5).
//! The 409 answer is the v1.28 recording's `Status` shape
//! (`07-put-stale-resourceversion.json`), with this object's name and kind.

use std::collections::BTreeMap;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};
use tessera_k8s::dra::allocate::{Chosen, NodeAllocation};
use tessera_k8s::dra::inventory::DeviceKey;
use tessera_k8s::dra::quantity::Quantity;
use tessera_k8s::dra::types::ResourceClaim;
use tessera_k8s::dra::write::{
    DELETE_PROTECTION, PodRef, WriteError, Written, allocation_result, protect, write_allocation,
};

fn served_claim(allocated: bool) -> Value {
    let mut c = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "train-gpu", "namespace": "ml", "uid": "c-uid", "resourceVersion": "42",
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                     "finalizers": [DELETE_PROTECTION]},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {
            "deviceClassName": "gpu.tessera.io",
            "capacity": {"requests": {"memory": "20Gi"}}}}]}}
    });
    if allocated {
        c["status"] = json!({"allocation": {"devices": {"results": [{"request": "g",
            "driver": "gpu.tessera.io", "pool": "n9", "device": "gpu-3"}]}}});
    }
    c
}

fn decision() -> NodeAllocation {
    NodeAllocation {
        node: "n1".into(),
        results: vec![Chosen {
            request: "g".into(),
            device: DeviceKey {
                driver: "gpu.tessera.io".into(),
                pool: "n1".into(),
                device: "gpu-1".into(),
            },
            admin_access: false,
            consumed: BTreeMap::from([
                ("memory".to_string(), Quantity::parse("20Gi").unwrap()),
                ("compute".to_string(), Quantity::parse("1000").unwrap()),
            ]),
        }],
        score: 1.0,
    }
}

fn pod() -> PodRef {
    PodRef {
        name: "train-0".into(),
        uid: "p-uid".into(),
    }
}

fn conflict() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"train-gpu\": the object has been modified; please apply your changes to the latest version and try again",
        "reason": "Conflict", "details": {"name": "train-gpu", "group": "resource.k8s.io", "kind": "resourceclaims"},
        "code": 409})
}

/// Runs `write_allocation` against a mock that answers `status`/`body` and
/// returns what it was sent (method, path, content type, body).
async fn write_with(
    claim: Value,
    status: u16,
    answer: impl Fn(&Value) -> Value + Send + 'static,
) -> (
    Result<Written, WriteError>,
    Vec<(Method, String, String, Value)>,
) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let ct = parts
                .headers
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            let out = answer(&body);
            seen.push((parts.method, parts.uri.to_string(), ct, body));
            send.send_response(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&out).unwrap()))
                    .unwrap(),
            );
        }
        seen
    });
    let client = kube::Client::new(service, "default");
    let c: ResourceClaim = serde_json::from_value(claim).unwrap();
    let alloc = allocation_result(&decision(), "c-uid");
    let r = write_allocation(&client, &c, &alloc, &pod()).await;
    drop(client);
    (r, server.await.unwrap())
}

#[tokio::test]
async fn the_allocation_and_the_pod_go_to_the_status_subresource_with_a_precondition() {
    let (r, seen) = write_with(served_claim(false), 200, |patch| {
        // The server applies the merge patch and bumps the version.
        let mut c = served_claim(false);
        c["status"] = patch["status"].clone();
        c["metadata"]["resourceVersion"] = json!("43");
        c
    })
    .await;
    let Written::Allocated(c) = r.unwrap() else {
        panic!("expected the claim back");
    };
    assert_eq!(c.metadata.resource_version.as_deref(), Some("43"));
    let st = c.status.unwrap();
    assert_eq!(st.reserved_for[0].uid, "p-uid");
    assert_eq!(seen.len(), 1);
    let (method, path, ct, body) = &seen[0];
    assert_eq!(*method, Method::PATCH);
    assert!(
        path.starts_with("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train-gpu/status"),
        "{path}"
    );
    assert_eq!(ct, "application/merge-patch+json");
    // Only the precondition and the two status fields are sent: nothing else
    // of the claim (its spec, annotations) can be overwritten.
    assert_eq!(body["metadata"], json!({"resourceVersion": "42"}), "{body}");
    assert_eq!(
        body.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["metadata", "status"]
    );
    let res = &body["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(res["device"], "gpu-1");
    assert_eq!(res["pool"], "n1");
    assert_eq!(
        res["consumedCapacity"],
        json!({"compute": "1000", "memory": "20Gi"})
    );
    assert!(res["shareID"].is_string());
    assert_eq!(
        body["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["n1"])
    );
    assert_eq!(
        body["status"]["reservedFor"],
        json!([{"resource": "pods", "name": "train-0", "uid": "p-uid"}])
    );
}

#[tokio::test]
async fn a_conflict_is_reported_for_a_fresh_decision_never_retried_blindly() {
    let (r, seen) = write_with(served_claim(false), 409, |_| conflict()).await;
    assert_eq!(r.unwrap(), Written::Conflict);
    assert_eq!(
        seen.len(),
        1,
        "one attempt; the caller re-reads and decides again"
    );
}

#[tokio::test]
async fn an_allocation_by_someone_else_is_never_rewritten() {
    let (r, seen) = write_with(served_claim(true), 200, |_| json!({})).await;
    assert!(
        matches!(r, Err(WriteError::AlreadyAllocated { ref claim }) if claim == "train-gpu"),
        "{r:?}"
    );
    assert!(seen.is_empty(), "nothing is sent");
}

#[tokio::test]
async fn other_api_errors_are_errors_naming_the_claim() {
    let (r, _) = write_with(served_claim(false), 403, |_| {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "forbidden", "reason": "Forbidden", "code": 403})
    })
    .await;
    let e = r.unwrap_err();
    assert!(e.to_string().contains("train-gpu"), "{e}");
}

/// Issue 41, defect 3: kube-scheduler adds `resource.kubernetes.io/delete-protection`
/// before it writes an allocation; Tessera did not, so a reserved claim could
/// be deleted under its pod and the resourceclaim controller (which clears an
/// allocation only on a claim carrying it) never freed its GPU. `protect`
/// adds it with the claim's resourceVersion as precondition, keeping the
/// other finalizers; an allocation is never written to a claim without it,
/// nor to a claim being deleted.
#[tokio::test]
async fn a_claim_is_delete_protected_before_its_allocation() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let mut c = served_claim(false);
            c["metadata"]["finalizers"] = body["metadata"]["finalizers"].clone();
            c["metadata"]["resourceVersion"] = json!("43");
            seen.push((parts.method, parts.uri.path().to_string(), body));
            send.send_response(
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&c).unwrap()))
                    .unwrap(),
            );
        }
        seen
    });
    let client = kube::Client::new(service, "default");
    let mut bare = served_claim(false);
    bare["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let bare: ResourceClaim = serde_json::from_value(bare).unwrap();
    let alloc = allocation_result(&decision(), "c-uid");
    // Not protected: no allocation is written.
    let r = write_allocation(&client, &bare, &alloc, &pod()).await;
    assert!(matches!(r, Err(WriteError::Incomplete { .. })), "{r:?}");
    let Written::Allocated(protected) = protect(&client, &bare).await.unwrap() else {
        panic!("expected the claim back");
    };
    assert_eq!(protected.metadata.resource_version.as_deref(), Some("43"));
    // Protected already: nothing is sent.
    let again = protect(&client, &protected).await.unwrap();
    assert_eq!(again, Written::Allocated(protected.clone()));
    // Being deleted: never allocated.
    let mut deleting = served_claim(false);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-06T20:00:00Z");
    deleting["metadata"]["finalizers"] = json!([]);
    let deleting: ResourceClaim = serde_json::from_value(deleting).unwrap();
    let r = protect(&client, &deleting).await;
    assert!(matches!(r, Err(WriteError::Deleting { .. })), "{r:?}");
    drop(client);
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (method, path, body) = &seen[0];
    assert_eq!(*method, Method::PATCH);
    assert_eq!(
        path,
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train-gpu"
    );
    assert_eq!(
        body,
        &json!({"metadata": {"resourceVersion": "42",
            "finalizers": ["example.com/keep", DELETE_PROTECTION]}})
    );
}
