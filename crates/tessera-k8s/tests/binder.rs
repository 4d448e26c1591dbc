//! `bind` against kube-rs's mock API service (tower-test): the exact requests,
//! idempotency, rollback on failure and concurrent binds.

mod common;

use common::*;
use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_k8s::binder::Binder;
use tessera_k8s::extender::router;

const UID: &str = "5c821d97-cbf6-4af6-96e8-39693dca64a6";

fn ok_api(seen: &Seen) -> (u16, Value) {
    if seen.path.ends_with("/binding") {
        (201, status(201, "", ""))
    } else {
        (404, status(404, "NotFound", "unexpected request"))
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
async fn bind_is_one_binding_carrying_the_signed_annotation_with_preconditions() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    let (nodes, inv) = fixture_cluster();
    let mut p = pending_gpu_pod();
    p.metadata.resource_version = Some("4711".into());
    let m = mirror("tessera", nodes, inv, vec![p]);
    let (client, api) = mock_api(ok_api);
    let app = router(state(m.clone(), Some(client)));
    let (status, v) = call(app.clone(), "/scheduler/bind", body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v, json!({"Error": ""}));

    // A repeated bind of the same pod: no second allocation, no further API call.
    let (_, v) = call(app, "/scheduler/bind", body).await;
    assert_eq!(v, json!({"Error": ""}));
    assert_eq!(m.lock().ledger().allocation_count(), 1);
    drop(m);

    let seen = api.await.unwrap();
    // One write: the binding subresource sets nodeName and the annotation atomically.
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let bind = &seen[0];
    assert_eq!(bind.method, "POST");
    assert_eq!(
        bind.path,
        "/api/v1/namespaces/default/pods/gpu-pod-noext2/binding"
    );
    assert_eq!(bind.body["kind"], "Binding");
    assert_eq!(bind.body["metadata"]["name"], "gpu-pod-noext2");
    // Preconditions (fixture 04): the pod we decided for, unchanged since.
    assert_eq!(bind.body["metadata"]["uid"], UID);
    assert_eq!(bind.body["metadata"]["resourceVersion"], "4711");
    assert_eq!(
        bind.body["target"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "fake-gpu-node-1"})
    );
    let value = bind.body["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .unwrap();
    let alloc = Allocation::decode_verified(value, KEY, UID, "fake-gpu-node-1")
        .expect("signed for this pod and node");
    assert_eq!(alloc.gpus.len(), 2);
    assert_eq!(alloc.pod, "default/gpu-pod-noext2");
}

/// The pod as the API server holds it after a binding (annotation merged, nodeName set).
fn bound_pod(node: &str, annotation: Option<&str>) -> Value {
    let mut p = serde_json::to_value(pending_gpu_pod()).unwrap();
    p["apiVersion"] = "v1".into();
    p["kind"] = "Pod".into();
    p["spec"]["nodeName"] = node.into();
    if let Some(a) = annotation {
        p["metadata"]["annotations"] = json!({ ANNOTATION: a });
    }
    p
}

#[tokio::test]
async fn a_conflict_counts_as_bound_only_when_the_pod_is_already_here_with_our_grant() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    // Our first binding landed but its answer was lost; the retry gets 409 (fixture 01).
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let sent = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let seen_value = sent.clone();
    let (client, api) = mock_api(move |s| {
        if s.path.ends_with("/binding") {
            *seen_value.lock().unwrap() = s.body["metadata"]["annotations"][ANNOTATION]
                .as_str()
                .map(str::to_string);
            (
                409,
                status(
                    409,
                    "Conflict",
                    "Operation cannot be fulfilled on pods/binding \"gpu-pod-noext2\": pod gpu-pod-noext2 is already assigned to node \"fake-gpu-node-1\"",
                ),
            )
        } else {
            let a = seen_value.lock().unwrap().clone();
            (200, bound_pod("fake-gpu-node-1", a.as_deref()))
        }
    });
    let (_, v) = call(
        router(state(m.clone(), Some(client))),
        "/bind",
        body.clone(),
    )
    .await;
    assert_eq!(v, json!({"Error": ""}));
    assert_eq!(m.lock().ledger().allocation_count(), 1);
    drop(m);
    assert_eq!(api.await.unwrap().len(), 2);

    // Someone else bound it (elsewhere, or here without our grant): refused and released.
    for (node, with_grant) in [("fake-gpu-node-2", true), ("fake-gpu-node-1", false)] {
        let (nodes, inv) = fixture_cluster();
        let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
        let (client, api) = mock_api(move |s| {
            if s.path.ends_with("/binding") {
                (
                    409,
                    status(
                        409,
                        "Conflict",
                        "pod gpu-pod-noext2 is already assigned to node \"somewhere\"",
                    ),
                )
            } else {
                (200, bound_pod(node, with_grant.then_some("{}")))
            }
        });
        let (_, v) = call(
            router(state(m.clone(), Some(client))),
            "/bind",
            body.clone(),
        )
        .await;
        let err = v["Error"].as_str().unwrap();
        assert!(
            err.contains("refused by the API server") && err.contains("already assigned"),
            "{err}"
        );
        assert_eq!(m.lock().ledger().allocation_count(), 0, "{node}");
        drop(m);
        assert_eq!(api.await.unwrap().len(), 2);
    }
}

/// Issue 27 item 5: `extenders` in a KubeSchedulerConfiguration apply to every
/// profile, so a shared kube-scheduler asks us to bind its `default-scheduler`
/// pods too. Such a pod was refused ("this Tessera serves only [tessera]")
/// forever; it is now bound through with the plain Binding kube-scheduler's
/// DefaultBinder posts: its UID as precondition (fixture 04), no grant, and
/// nothing taken in the ledger.
#[tokio::test]
async fn a_pod_of_another_scheduler_is_bound_through_without_a_grant() {
    let (nodes, inv) = fixture_cluster();
    let mut plain = pod(
        "default",
        "cuda",
        "uid-cuda",
        &[("cpu", "100m"), ("nvidia.com/gpu", "1")],
    );
    plain.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    plain.metadata.resource_version = Some("4711".into());
    let m = mirror("tessera", nodes, inv, vec![plain]);
    let (client, api) = mock_api(ok_api);
    let mut st = state(m.clone(), Some(client));
    st.binder = st
        .binder
        .map(|b| b.with_scheduler_names(vec!["tessera".into()]));
    let body = serde_json::to_vec(&json!({"PodName": "cuda", "PodNamespace": "default", "PodUID": "uid-cuda", "Node": "fake-gpu-node-1"})).unwrap();
    let (_, v) = call(router(st), "/bind", body).await;
    assert_eq!(v, json!({"Error": ""}));
    assert_eq!(m.lock().ledger().allocation_count(), 0, "no grant");
    assert!(m.lock().held("uid-cuda").is_none(), "nothing reserved");
    drop(m);
    let seen = api.await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let b = &seen[0];
    assert_eq!(b.path, "/api/v1/namespaces/default/pods/cuda/binding");
    assert_eq!(b.body["metadata"]["uid"], "uid-cuda");
    assert!(b.body["metadata"].get("annotations").is_none(), "{b:?}");
    assert_eq!(b.body["target"]["name"], "fake-gpu-node-1");
}

/// A pod of another profile that asks for Tessera's own resources is not bound
/// through: without a grant it could never get its devices, so bind says why
/// (and writes nothing) instead of handing the kubelet a pod that fails.
#[tokio::test]
async fn a_pod_of_another_scheduler_asking_tessera_resources_is_not_bound() {
    let (nodes, inv) = fixture_cluster();
    let mut p = pending_gpu_pod();
    p.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let m = mirror("tessera", nodes, inv, vec![p]);
    let (client, api) = mock_api(ok_api);
    let mut st = state(m.clone(), Some(client));
    st.binder = st
        .binder
        .map(|b| b.with_scheduler_names(vec!["tessera".into()]));
    let body = serde_json::to_vec(&json!({"PodName": "gpu-pod-noext2", "PodNamespace": "default", "PodUID": UID, "Node": "fake-gpu-node-1"})).unwrap();
    let (_, v) = call(router(st), "/bind", body).await;
    let err = v["Error"].as_str().unwrap();
    assert!(
        err.contains("asks for tessera.io/gpu") && err.contains("\"default-scheduler\""),
        "{err}"
    );
    drop(m);
    assert!(api.await.unwrap().is_empty());
}

/// A pass-through bind that the API refuses (the pod was replaced: UID
/// precondition, fixture 04) is reported, not taken for bound.
#[tokio::test]
async fn a_refused_pass_through_bind_is_an_error() {
    let (nodes, inv) = fixture_cluster();
    let mut plain = pod("default", "cuda", "uid-cuda", &[("nvidia.com/gpu", "1")]);
    plain.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let m = mirror("tessera", nodes, inv, vec![plain]);
    let (client, api) = mock_api(|s: &Seen| {
        if s.path.ends_with("/binding") {
            (
                409,
                status(
                    409,
                    "Conflict",
                    "Operation cannot be fulfilled on pods/binding \"cuda\": the object has been modified",
                ),
            )
        } else {
            (404, status(404, "NotFound", "pods \"cuda\" not found"))
        }
    });
    let mut st = state(m.clone(), Some(client));
    st.binder = st
        .binder
        .map(|b| b.with_scheduler_names(vec!["tessera".into()]));
    let body = serde_json::to_vec(&json!({"PodName": "cuda", "PodNamespace": "default", "PodUID": "uid-cuda", "Node": "fake-gpu-node-1"})).unwrap();
    let (_, v) = call(router(st), "/bind", body).await;
    let err = v["Error"].as_str().unwrap();
    assert!(err.contains("refused by the API server"), "{err}");
    drop(m);
    assert_eq!(api.await.unwrap().len(), 2, "the binding, then a read-back");
}

#[tokio::test]
async fn bind_refuses_unknown_nodes_and_nodes_the_pod_may_not_use() {
    let (mut nodes, inv) = fixture_cluster();
    nodes[1].spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        taints: Some(vec![k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            value: Some("infra".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let cpu_only = pod("default", "web", "uid-web", &[("cpu", "100m")]);
    let m = mirror("tessera", nodes, inv, vec![cpu_only]);
    let (client, api) = mock_api(ok_api);
    let app = router(state(m.clone(), Some(client)));
    let bind = |node: &str| {
        serde_json::to_vec(&json!({"PodName": "web", "PodNamespace": "default", "PodUID": "uid-web", "Node": node})).unwrap()
    };
    let (_, v) = call(app.clone(), "/bind", bind("no-such-node")).await;
    assert!(
        v["Error"]
            .as_str()
            .unwrap()
            .contains("node no-such-node is not known"),
        "{v}"
    );
    let (_, v) = call(app.clone(), "/bind", bind("fake-gpu-node-2")).await;
    assert!(
        v["Error"]
            .as_str()
            .unwrap()
            .contains("had a taint the pod didn't tolerate"),
        "{v}"
    );
    let (_, v) = call(app, "/bind", bind("fake-gpu-node-1")).await;
    assert_eq!(v, json!({"Error": ""}));
    drop(m);
    assert_eq!(
        api.await.unwrap().len(),
        1,
        "only the allowed bind was written"
    );
}

#[tokio::test]
async fn a_refused_binding_releases_the_reservation() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let (client, api) = mock_api(|s| {
        if s.path.ends_with("/binding") {
            (
                422,
                status(422, "Invalid", "Binding \"gpu-pod-noext2\" is invalid"),
            )
        } else {
            ok_api(s)
        }
    });
    let (_, v) = call(router(state(m.clone(), Some(client))), "/bind", body).await;
    let err = v["Error"].as_str().unwrap();
    assert!(
        err.contains("binding pod default/gpu-pod-noext2 to node fake-gpu-node-1")
            && err.contains("is invalid"),
        "{err}"
    );
    assert_eq!(m.lock().ledger().allocation_count(), 0);
    drop(m);
    assert_eq!(api.await.unwrap().len(), 1);
}

/// Found by the crash-restart run (standalone, concurrent binds): a 504 that
/// the API server sends after committing the Binding freed the pod's GPUs, and
/// the next decisions handed them out again. A 5xx leaves the outcome unknown.
#[tokio::test]
async fn a_server_error_keeps_the_reservation_since_the_write_may_have_landed() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    for (code, reason, message) in [
        (
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        ),
        (500, "InternalError", "etcd is unhappy"),
    ] {
        let (nodes, inv) = fixture_cluster();
        let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
        let (client, api) = mock_api(move |s| {
            if s.path.ends_with("/binding") {
                (code, status(code, reason, message))
            } else {
                ok_api(s)
            }
        });
        let (_, v) = call(
            router(state(m.clone(), Some(client))),
            "/bind",
            body.clone(),
        )
        .await;
        let err = v["Error"].as_str().unwrap();
        assert!(
            err.contains(message) && err.contains("stay reserved"),
            "{code}: {err}"
        );
        {
            let mut mm = m.lock();
            assert_eq!(mm.ledger().allocation_count(), 1, "{code}: GPUs kept");
            assert!(mm.held(UID).is_some_and(|h| !h.bound));
        }
        drop(m);
        // The Binding and its two retries, each answered with the error.
        let seen = api.await.unwrap();
        assert_eq!(seen.len(), 3, "{code}");
        assert!(seen.iter().all(|s| s.path.ends_with("/binding")));
    }
}

/// A Binding answered with a 5xx is sent again, unchanged (same
/// preconditions): when the first did not land, the retry binds the pod at
/// once instead of leaving it unbound with its GPUs reserved until the
/// reservation's deadline (30 s, seen in the crash-restart run with writes
/// answered 500 without committing); when the first did land (a 504 after
/// committing), the retry's 409 is settled by reading the pod back.
#[tokio::test]
async fn a_binding_answered_with_a_server_error_is_sent_again() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    for first_landed in [false, true] {
        let (nodes, inv) = fixture_cluster();
        let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
        let bindings = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
        let sent = bindings.clone();
        let (client, api) = mock_api(move |s| {
            if s.path.ends_with("/binding") {
                let mut b = sent.lock().unwrap();
                b.push(s.body.clone());
                match (b.len(), first_landed) {
                    (1, false) => (500, status(500, "InternalError", "etcd is unhappy")),
                    (1, true) => (504, status(504, "Timeout", "request did not complete")),
                    (_, false) => (201, status(201, "", "")),
                    (_, true) => (
                        409,
                        status(409, "Conflict", "pod gpu-pod-noext2 is already assigned"),
                    ),
                }
            } else {
                let b = sent.lock().unwrap();
                let a = b[0]["metadata"]["annotations"][ANNOTATION].as_str();
                (200, bound_pod("fake-gpu-node-1", a))
            }
        });
        let (_, v) = call(
            router(state(m.clone(), Some(client))),
            "/bind",
            body.clone(),
        )
        .await;
        assert_eq!(v, json!({"Error": ""}), "first landed: {first_landed}");
        {
            let mut mm = m.lock();
            assert_eq!(mm.ledger().allocation_count(), 1);
            assert!(
                mm.held(UID).is_some_and(|h| h.expires.is_none()),
                "accepted"
            );
        }
        drop(m);
        let seen = api.await.unwrap();
        let b = bindings.lock().unwrap();
        assert_eq!(b.len(), 2, "one retry");
        assert_eq!(b[0], b[1], "the same Binding, preconditions included");
        assert_eq!(b[1]["metadata"]["uid"], UID);
        // A read back only to settle the 409.
        assert_eq!(seen.len(), if first_landed { 3 } else { 2 });
    }
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
    assert_eq!(m.lock().ledger().allocation_count(), 1);
    drop(m);
    // Only the winner talked to the API: one binding.
    assert_eq!(api.await.unwrap().len(), 1);
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

#[tokio::test(start_paused = true)]
async fn an_unanswered_bind_keeps_its_reservation_until_the_pod_is_read_back_unbound() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    // The API connection breaks mid-call: the binding may or may not have landed.
    let (service, mut handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    // Bindings get no answer; a read of the pod finds it still pending.
    let pending = serde_json::to_vec(&pending_gpu_pod()).unwrap();
    let server = tokio::spawn(async move {
        let mut n = 0;
        while let Some((req, send)) = handle.next_request().await {
            n += 1;
            if req.method() == http::Method::GET {
                send.send_response(
                    http::Response::builder()
                        .status(200)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(pending.clone()))
                        .unwrap(),
                );
            } else {
                drop(send);
            }
        }
        n
    });
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let client = kube::Client::new(service, "default");
    let app = router(state(m.clone(), Some(client.clone())));
    let (_, v) = call(app, "/bind", body).await;
    assert!(!v["Error"].as_str().unwrap().is_empty(), "{v}");
    // Unknown outcome: the GPUs stay reserved (a second pod must not get them) …
    assert_eq!(m.lock().ledger().allocation_count(), 1);
    tokio::time::advance(tessera_k8s::mirror::RESERVATION_TTL - Duration::from_secs(1)).await;
    m.lock().expire_reservations();
    assert_eq!(m.lock().ledger().allocation_count(), 1);
    // … past the deadline too: the Binding may have landed while the watch lags …
    tokio::time::advance(Duration::from_secs(2)).await;
    m.lock().expire_reservations();
    assert_eq!(m.lock().ledger().allocation_count(), 1);
    // … until the pod is read back: still unbound, the Binding did not land.
    let binder = Binder::new(
        client.clone(),
        m.clone(),
        tessera_k8s::leader::Leadership::always(),
    );
    binder.settle_expired().await;
    assert_eq!(m.lock().ledger().allocation_count(), 0);
    assert!(m.lock().held(UID).is_none());
    drop((m, binder, client));
    assert_eq!(server.await.unwrap(), 2, "the Binding, then one read");
}

/// Finding 14: a leader whose Lease is about to lapse (no renewal lately) must
/// not start a write that could land after another replica took over.
#[tokio::test(start_paused = true)]
async fn a_leader_near_its_deadline_does_not_start_a_write() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let (client, api) = mock_api(ok_api);
    let st = state(m.clone(), Some(client));
    let now = tokio::time::Instant::now();
    st.leader
        .set_until(true, Some(now + Duration::from_millis(200)));
    let (_, v) = call(router(st.clone()), "/bind", body.clone()).await;
    assert!(
        v["Error"].as_str().unwrap().contains("not the leader"),
        "{v}"
    );
    assert_eq!(m.lock().ledger().allocation_count(), 0, "released at once");
    // With a fresh renewal the same bind goes through.
    st.leader
        .set_until(true, Some(now + Duration::from_secs(10)));
    let (_, v) = call(router(st), "/bind", body).await;
    assert_eq!(v, json!({"Error": ""}));
    drop(m);
    assert_eq!(api.await.unwrap().len(), 1);
}

/// Issue 31: `/peer/bind` (a follower's forwarded bind, on the ops port that
/// every replica reaches) binds only when signed with the replicas' key and
/// only on the leader: unsigned or wrongly signed calls are refused (401)
/// before anything is written, and a replica that does not lead answers 503 so
/// that the follower asks the next leader.
#[tokio::test]
async fn forwarded_binds_need_the_replicas_signature_and_the_leader() {
    use tessera_k8s::extender::forward::{PEER_BIND_PATH, Peers};
    use tower::ServiceExt;
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let (client, api) = mock_api(ok_api);
    let mut st = state(m.clone(), Some(client));
    st.peers = Some(Peers::new(KEY));
    let body = serde_json::to_vec(&json!({"PodName": "gpu-pod-noext2", "PodNamespace": "default", "PodUID": UID, "Node": "fake-gpu-node-1"})).unwrap();
    let send = |st: tessera_k8s::extender::ExtenderState, signer: Option<Peers>| {
        let body = body.clone();
        async move {
            let mut req =
                http::Request::post(PEER_BIND_PATH).header("content-type", "application/json");
            if let Some(p) = signer {
                for (h, v) in p.sign(PEER_BIND_PATH, &body) {
                    req = req.header(h, v);
                }
            }
            let resp = router(st)
                .oneshot(req.body(axum::body::Body::from(body)).unwrap())
                .await
                .unwrap();
            resp.status()
        }
    };
    assert_eq!(send(st.clone(), None).await, StatusCode::UNAUTHORIZED);
    let stranger = Peers::new(b"not-the-replicas-signing-key");
    assert_eq!(
        send(st.clone(), Some(stranger)).await,
        StatusCode::UNAUTHORIZED
    );
    let mut follower = st.clone();
    follower.leader = tessera_k8s::leader::Leadership::default();
    assert_eq!(
        send(follower, Some(Peers::new(KEY))).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(m.lock().ledger().allocation_count(), 0, "nothing bound yet");
    assert_eq!(send(st, Some(Peers::new(KEY))).await, StatusCode::OK);
    assert_eq!(m.lock().ledger().allocation_count(), 1);
    drop(m);
    let seen = api.await.unwrap();
    assert_eq!(
        seen.len(),
        1,
        "only the signed call on the leader wrote: {seen:#?}"
    );
}

/// Issue 41, defect 12 (real 1.28 and 1.36, two extender replicas behind a
/// Service, the leader killed): kube-scheduler gives up on a bind after its
/// `httpTimeout` and closes the connection, and the HTTP server drops the
/// handler, here while the Binding is on its way. The write was cut off with
/// its outcome unknown, so its reservation held the pod's room for the
/// reservation's deadline and a read-back (30 s and more) although the API
/// server refused it: the new leader refused other pods "does not fit" with a
/// slot free. Once reserved, a bind now runs to its outcome whoever waits for
/// it: refused, the room is free at once.
#[tokio::test]
async fn a_bind_whose_caller_goes_away_still_settles_its_reservation() {
    let Some(body) = fixture("bind-request-ExtenderBindingArgs.json") else {
        return;
    };
    let (service, mut handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    let (arrived_tx, arrived) = tokio::sync::oneshot::channel::<()>();
    let (answer_tx, answer) = tokio::sync::oneshot::channel::<()>();
    let pending = serde_json::to_vec(&pending_gpu_pod()).unwrap();
    let server = tokio::spawn(async move {
        let (mut arrived_tx, mut answer) = (Some(arrived_tx), Some(answer));
        let mut seen = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            seen.push(format!("{} {}", req.method(), req.uri().path()));
            let (code, body) = if req.method() == http::Method::GET {
                (200, pending.clone())
            } else {
                // The Binding: answered only after its caller went away, with
                // the conflict of a pod changed since (kube-scheduler records
                // its failed try on the pod).
                if let Some(tx) = arrived_tx.take() {
                    let _ = tx.send(());
                }
                if let Some(rx) = answer.take() {
                    let _ = rx.await;
                }
                let s = status(
                    409,
                    "Conflict",
                    "Operation cannot be fulfilled on pods/binding \"gpu-pod-noext2\": the object has been modified",
                );
                (409, serde_json::to_vec(&s).unwrap())
            };
            send.send_response(
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body))
                    .unwrap(),
            );
        }
        seen
    });
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![pending_gpu_pod()]);
    let client = kube::Client::new(service, "default");
    let app = router(state(m.clone(), Some(client)));
    let caller = tokio::spawn(call(app, "/bind", body));
    arrived.await.unwrap();
    assert_eq!(m.lock().ledger().allocation_count(), 1, "reserved");
    // kube-scheduler's timeout: the handler is dropped mid-write.
    caller.abort();
    let _ = caller.await;
    answer_tx.send(()).unwrap();
    let t = tokio::time::Instant::now();
    while m.lock().ledger().allocation_count() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the refused bind's room is still held after its caller went away"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(m.lock().held(UID).is_none());
    drop(m);
    let seen = server.await.unwrap();
    assert_eq!(
        seen,
        [
            "POST /api/v1/namespaces/default/pods/gpu-pod-noext2/binding",
            "GET /api/v1/namespaces/default/pods/gpu-pod-noext2"
        ],
        "the Binding, then the read that settles its conflict"
    );
}
