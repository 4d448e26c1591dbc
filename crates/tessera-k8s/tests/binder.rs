//! `bind` against kube-rs's mock API service (tower-test): the exact requests,
//! idempotency, rollback on failure and concurrent binds.

mod common;

use common::*;
use http::StatusCode;
use serde_json::{Value, json};
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_k8s::binder::lock;
use tessera_k8s::extender::router;

const UID: &str = "5c821d97-cbf6-4af6-96e8-39693dca64a6";

fn ok_api(seen: &Seen) -> (u16, Value) {
    if seen.path.ends_with("/binding") {
        (201, status(201, "", ""))
    } else {
        // PATCH answers with the patched pod.
        let mut p = serde_json::to_value(pod("default", "gpu-pod-noext2", UID, &[])).unwrap();
        p["apiVersion"] = "v1".into();
        p["kind"] = "Pod".into();
        (200, p)
    }
}

fn pending_gpu_pod() -> k8s_openapi::api::core::v1::Pod {
    pod(
        "default",
        "gpu-pod-noext2",
        UID,
        &[("cpu", "100m"), ("tessera.io/gpu", "2")],
    )
}

#[tokio::test]
async fn bind_patches_the_signed_annotation_then_creates_the_binding() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let (client, api) = mock_api(ok_api);
    let app = router(state(m.clone(), Some(client)));
    let (status, v) = call(app.clone(), "/scheduler/bind", body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v, json!({"Error": ""}));

    // A repeated bind of the same pod: no second allocation, no further API call.
    let (_, v) = call(app, "/scheduler/bind", body).await;
    assert_eq!(v, json!({"Error": ""}));
    assert_eq!(lock(&m).ledger().allocation_count(), 1);
    drop(m);

    let seen = api.await.unwrap();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    let (patch, bind) = (&seen[0], &seen[1]);
    assert_eq!(patch.method, "PATCH");
    assert_eq!(patch.path, "/api/v1/namespaces/default/pods/gpu-pod-noext2");
    assert_eq!(patch.content_type, "application/merge-patch+json");
    assert_eq!(patch.body["metadata"]["uid"], UID);
    let value = patch.body["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .unwrap();
    let alloc = Allocation::decode_verified(value, KEY, UID, "fake-gpu-node-1")
        .expect("signed for this pod and node");
    assert_eq!(alloc.gpus.len(), 2);
    assert_eq!(alloc.pod, "default/gpu-pod-noext2");

    assert_eq!(bind.method, "POST");
    assert_eq!(
        bind.path,
        "/api/v1/namespaces/default/pods/gpu-pod-noext2/binding"
    );
    assert_eq!(bind.body["kind"], "Binding");
    assert_eq!(bind.body["metadata"]["name"], "gpu-pod-noext2");
    assert_eq!(
        bind.body["target"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "fake-gpu-node-1"})
    );
}

#[tokio::test]
async fn a_failed_binding_releases_the_reservation() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let (client, api) = mock_api(|s| {
        if s.path.ends_with("/binding") {
            (500, status(500, "InternalError", "etcd is unhappy"))
        } else {
            ok_api(s)
        }
    });
    let (_, v) = call(router(state(m.clone(), Some(client))), "/bind", body).await;
    let err = v["Error"].as_str().unwrap();
    assert!(
        err.contains("binding pod default/gpu-pod-noext2 to node fake-gpu-node-1"),
        "{err}"
    );
    assert_eq!(lock(&m).ledger().allocation_count(), 0);
    drop(m);
    assert_eq!(api.await.unwrap().len(), 2);
}

#[tokio::test]
async fn concurrent_binds_never_overcommit_a_gpu() {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    let ask = [
        ("tessera.io/gpu", "1"),
        ("tessera.io/gpu-memory-percent", "60"),
        ("tessera.io/gpu-cores", "60"),
    ];
    let pods = vec![pod("ml", "a", "uid-a", &ask), pod("ml", "b", "uid-b", &ask)];
    let m = mirror("tessera", nodes, inv, pods);
    let (client, api) = mock_api(|s| {
        if s.path.ends_with("/binding") {
            (201, status(201, "", ""))
        } else {
            let mut p = serde_json::to_value(pod("ml", "x", "uid-x", &[])).unwrap();
            p["apiVersion"] = "v1".into();
            p["kind"] = "Pod".into();
            (200, p)
        }
    });
    let app = router(state(m.clone(), Some(client)));
    let bind = |name: &str, uid: &str| {
        serde_json::to_vec(
            &json!({"PodName": name, "PodNamespace": "ml", "PodUID": uid, "Node": "n1"}),
        )
        .unwrap()
    };
    let (a, b) = tokio::join!(
        call(app.clone(), "/bind", bind("a", "uid-a")),
        call(app.clone(), "/bind", bind("b", "uid-b"))
    );
    drop(app);
    let errors: Vec<&str> = [&a.1, &b.1]
        .iter()
        .map(|v| v["Error"].as_str().unwrap())
        .collect();
    assert_eq!(
        errors.iter().filter(|e| e.is_empty()).count(),
        1,
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("does not fit on node n1")),
        "{errors:?}"
    );
    assert_eq!(lock(&m).ledger().allocation_count(), 1);
    drop(m);
    // Only the winner talked to the API: one PATCH, one binding.
    assert_eq!(api.await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_follower_does_not_bind() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let (client, api) = mock_api(ok_api);
    let st = state(m.clone(), Some(client));
    st.leader.set(false);
    let (_, v) = call(router(st), "/bind", body).await;
    assert!(v["Error"].as_str().unwrap().contains("not the leader"));
    drop(m);
    assert!(api.await.unwrap().is_empty());
}
