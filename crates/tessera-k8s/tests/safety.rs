//! Issue 9's findings at the extender's HTTP surface: each test here failed
//! before its fix (the finding's number is in the test's comment).

mod common;

use std::sync::Arc;

use common::*;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};
use tessera_k8s::extender::router;
use tessera_k8s::gate::{Kind, SyncGate};
use tower::ServiceExt;

fn filter_body(pod: &k8s_openapi::api::core::v1::Pod, nodes: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({"Pod": pod, "NodeNames": nodes})).unwrap()
}

async fn get(app: axum::Router, path: &str) -> (StatusCode, String) {
    let req = http::Request::builder()
        .uri(path)
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

const SHARE: [(&str, &str); 3] = [
    ("tessera.io/gpu", "1"),
    ("tessera.io/gpu-memory-percent", "60"),
    ("tessera.io/gpu-cores", "60"),
];

/// Finding 1: before the pod list is in, a restarted Tessera saw every GPU free
/// and passed a node whose only GPU a bound pod holds at 60 %.
#[tokio::test(start_paused = true)]
async fn nothing_is_judged_or_ready_before_the_initial_lists_are_in() {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    // Nodes and inventory listed; the pods (one holding 60 % of the GPU) not yet.
    let m = mirror("tessera", nodes, inv, vec![]);
    let mut st = state(m.clone(), None);
    st.gate = SyncGate::new();
    st.gate.mark(Kind::Nodes);
    st.gate.mark(Kind::Inventory);
    st.gate.mark(Kind::Queues);
    st.gate.mark(Kind::Namespaces);
    let app = router(st.clone());
    let newcomer = pod("ml", "b", "uid-b", &SHARE);
    let (status, v) = call(app.clone(), "/filter", filter_body(&newcomer, &["n1"])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v["NodeNames"],
        Value::Null,
        "no node may pass unsynced: {v}"
    );
    assert!(
        v["Error"]
            .as_str()
            .unwrap()
            .contains("has not finished listing pods"),
        "{v}"
    );
    let (status, text) = get(app.clone(), "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");

    // The pod list arrives (with the 60 % holder) and the gate opens.
    let mut holder = pod("ml", "a", "uid-a", &SHARE);
    holder.spec.as_mut().unwrap().node_name = Some("n1".into());
    let value = {
        let mut mm = m.lock();
        let p = pod("ml", "a", "uid-a", &SHARE);
        let r = mm.reserve(&p, "n1").unwrap();
        let tessera_k8s::mirror::Reservation::Write { annotation } = r else {
            panic!("reserved")
        };
        mm.unreserve("uid-a");
        annotation.unwrap()
    };
    holder.metadata.annotations =
        Some([(tessera_core::allocation::ANNOTATION.to_string(), value)].into());
    m.lock().replace_pods(vec![holder]);
    st.gate.mark(Kind::Pods);
    let (_, v) = call(app.clone(), "/filter", filter_body(&newcomer, &["n1"])).await;
    assert_eq!(v["NodeNames"], json!([]), "{v}");
    assert!(v["FailedNodes"]["n1"].is_string(), "{v}");
    let (status, _) = get(app, "/readyz").await;
    assert_eq!(status, StatusCode::OK);
}

/// Finding 4: with the extender on a profile shared with stock-plugin pods,
/// a `default-scheduler` pod asking `nvidia.com/gpu` was rejected on nodes
/// without a GpuNode and stayed Pending.
#[tokio::test]
async fn pods_of_other_schedulers_get_no_opinion() {
    let nodes = vec![
        kube_node("stock", "32", "64Gi"),
        kube_node("n1", "32", "64Gi"),
    ];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    let m = mirror("tessera", nodes, inv, vec![]);
    let mut st = state(m, None);
    st.scheduler_names = Arc::from(["tessera".to_string()]);
    let app = router(st);
    let mut plain = pod("default", "cuda", "uid-c", &[("nvidia.com/gpu", "1")]);
    plain.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let (_, v) = call(
        app.clone(),
        "/filter",
        filter_body(&plain, &["stock", "n1"]),
    )
    .await;
    assert_eq!(v["NodeNames"], json!(["stock", "n1"]), "{v}");
    assert_eq!(v["FailedAndUnresolvableNodes"], json!({}), "{v}");
    let (_, v) = call(
        app.clone(),
        "/prioritize",
        filter_body(&plain, &["stock", "n1"]),
    )
    .await;
    assert_eq!(
        v,
        json!([{"Host": "stock", "Score": 0}, {"Host": "n1", "Score": 0}])
    );
    // The same pod under Tessera's name is judged: the stock node has no inventory.
    plain.spec.as_mut().unwrap().scheduler_name = Some("tessera".into());
    let (_, v) = call(
        app.clone(),
        "/filter",
        filter_body(&plain, &["stock", "n1"]),
    )
    .await;
    assert_eq!(v["NodeNames"], json!(["n1"]), "{v}");
    // Issue 27 item 5: another profile's pod asking for Tessera's own resources
    // could never get them without a grant: no node, and the reason says why.
    let mut foreign = pod("default", "share", "uid-s", &[("tessera.io/gpu", "1")]);
    foreign.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let (_, v) = call(app, "/filter", filter_body(&foreign, &["stock", "n1"])).await;
    assert_eq!(v["NodeNames"], json!([]), "{v}");
    let why = v["FailedAndUnresolvableNodes"]["n1"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("asks for tessera.io/gpu"), "{v}");
}

/// e2e (issue 38, real kube-scheduler 1.36 sharing the extender): a
/// `default-scheduler` pod asking `nvidia.com/gpu` was bound to a node where
/// Tessera's agent serves that resource, and its Allocate refused the pod
/// (Failed, UnexpectedAdmissionError). Nodes whose agent says so are
/// unresolvable for such pods, with the reason; others stay "no opinion".
#[tokio::test]
async fn stock_gpu_pods_of_other_schedulers_avoid_nodes_tessera_serves() {
    let mut served = kube_node("agent", "32", "64Gi");
    served.metadata.labels = Some(
        [(
            tessera_api::gpunode::NVIDIA_GPU_LABEL.to_string(),
            tessera_api::gpunode::NVIDIA_GPU_SERVED.to_string(),
        )]
        .into(),
    );
    let nodes = vec![kube_node("stock", "32", "64Gi"), served];
    let inv = vec![gpu_node("agent", "A100-80GB", 81_920, 1)];
    let m = mirror("tessera", nodes, inv, vec![]);
    let mut st = state(m, None);
    st.scheduler_names = Arc::from(["tessera".to_string()]);
    let app = router(st);
    for resource in ["nvidia.com/gpu", "nvidia.com/mig-3g.40gb"] {
        let mut plain = pod("default", "cuda", "uid-c", &[(resource, "1")]);
        plain.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
        let (_, v) = call(
            app.clone(),
            "/filter",
            filter_body(&plain, &["stock", "agent"]),
        )
        .await;
        assert_eq!(v["NodeNames"], json!(["stock"]), "{v}");
        let why = v["FailedAndUnresolvableNodes"]["agent"]
            .as_str()
            .unwrap_or_default();
        assert!(
            why.contains(&format!(
                "{resource} on this node is served by Tessera's node agent"
            )),
            "{v}"
        );
    }
    // A plain pod asking no GPU is not judged.
    let mut cpu = pod("default", "web", "uid-w", &[]);
    cpu.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
    let (_, v) = call(app, "/filter", filter_body(&cpu, &["stock", "agent"])).await;
    assert_eq!(v["NodeNames"], json!(["stock", "agent"]), "{v}");
}

/// Finding 6: twenty 4 % shares each asking `tessera.io/gpu: 1` were bound to a
/// node advertising 16 slots; the kubelet refused the last four.
#[tokio::test]
async fn device_plugin_slots_are_respected() {
    let mut node = kube_node("n1", "64", "256Gi");
    node.status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert("tessera.io/gpu".into(), Quantity("16".into()));
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    let m = mirror("tessera", vec![node], inv, vec![]);
    let app = router(state(m.clone(), None));
    let ask = [
        ("tessera.io/gpu", "1"),
        ("tessera.io/gpu-memory-percent", "4"),
        ("tessera.io/gpu-cores", "4"),
    ];
    let mut placed = 0;
    for i in 0..20 {
        let p = pod("ml", &format!("p{i}"), &format!("uid-{i}"), &ask);
        let (_, v) = call(app.clone(), "/filter", filter_body(&p, &["n1"])).await;
        if v["NodeNames"] == json!(["n1"]) {
            let r = m.lock().reserve(&p, "n1");
            assert!(r.is_ok(), "{r:?}");
            m.lock().mark_accepted(&format!("uid-{i}"));
            placed += 1;
        } else {
            let why = v["FailedNodes"]["n1"].as_str().unwrap();
            assert_eq!(why, "too little tessera.io/gpu: asks 1, 0 of 16 free");
            // A bind straight to the node is refused the same way.
            let err = m.lock().reserve(&p, "n1").unwrap_err().to_string();
            assert!(err.contains("too little tessera.io/gpu"), "{err}");
        }
    }
    assert_eq!(placed, 16);
}

/// Finding 16: a `/filter` body carrying full Node objects inserted them into the mirror.
#[tokio::test]
async fn node_objects_in_a_filter_body_are_not_trusted() {
    let m = mirror("tessera", vec![], vec![], vec![]);
    let app = router(state(m.clone(), None));
    let forged = kube_node("forged", "1000", "1000Gi");
    let p = pod("ml", "a", "uid-a", &SHARE);
    let body = serde_json::to_vec(&json!({"Pod": p, "Nodes": {"items": [forged]}})).unwrap();
    let (_, v) = call(app, "/filter", body).await;
    assert_eq!(v["Nodes"]["items"], json!([]), "{v}");
    assert!(!m.lock().knows_node("forged"));
}

/// Finding 10: a follower answers filter from its own synced mirror and is
/// Ready, so a failover leaves no window of 503s that parks pods.
#[tokio::test]
async fn a_synced_follower_filters_and_is_ready() {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    let st = state(mirror("tessera", nodes, inv, vec![]), None);
    st.leader.set(false);
    let app = router(st);
    let p = pod("ml", "a", "uid-a", &SHARE);
    let (_, v) = call(app.clone(), "/filter", filter_body(&p, &["n1"])).await;
    assert_eq!(v["NodeNames"], json!(["n1"]), "{v}");
    let (status, text) = get(app.clone(), "/readyz").await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "follower\n"));
    // Finding 11: leadership and election errors are visible as metrics too.
    let (_, text) = get(app, "/metrics").await;
    for line in [
        "tessera_leader 0",
        "tessera_leader_election_errors 0",
        "tessera_cache_synced 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

/// Finding 5 (scheduler side): `nvidia.com/gpu: N` under Tessera's name is N
/// whole GPUs, judged and granted like `tessera.io/gpu: N`; the node agent
/// advertises the stock name on Tessera nodes so the kubelet admits it.
#[tokio::test]
async fn the_stock_resource_name_is_placed_as_whole_gpus() {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 2)];
    let m = mirror("tessera", nodes, inv, vec![]);
    let app = router(state(m.clone(), None));
    let p = pod("ml", "cuda", "uid-c", &[("nvidia.com/gpu", "2")]);
    let (_, v) = call(app.clone(), "/filter", filter_body(&p, &["n1"])).await;
    assert_eq!(v["NodeNames"], json!(["n1"]), "{v}");
    let r = m.lock().reserve(&p, "n1").unwrap();
    let tessera_k8s::mirror::Reservation::Write {
        annotation: Some(value),
    } = r
    else {
        panic!("{r:?}")
    };
    let a =
        tessera_core::allocation::Allocation::decode_verified(&value, KEY, "uid-c", "n1").unwrap();
    assert_eq!(a.gpus.len(), 2);
    assert!(a.gpus.iter().all(|g| g.cores_milli == 1000), "{a:?}");
    let third = pod("ml", "more", "uid-m", &[("nvidia.com/gpu", "1")]);
    let (_, v) = call(app, "/filter", filter_body(&third, &["n1"])).await;
    assert_eq!(v["NodeNames"], json!([]), "{v}");
}

/// The signed annotation Tessera would write for `p` on `node` of a fresh mirror.
fn grant_for(p: &k8s_openapi::api::core::v1::Pod, node: &str) -> String {
    let nodes = vec![kube_node(node, "32", "64Gi")];
    let inv = vec![gpu_node(node, "A100-80GB", 81_920, 1)];
    let m = mirror("tessera", nodes, inv, vec![]);
    let r = m.lock().reserve(p, node).unwrap();
    match r {
        tessera_k8s::mirror::Reservation::Write {
            annotation: Some(a),
        } => a,
        other => panic!("{other:?}"),
    }
}

/// Found by the crash-restart run (helper report): when bound pods' grants
/// over-commit a GPU (two schedulers raced before the sync gate existed), the
/// one that did not fit was left out of the ledger and the GPU looked free, so
/// more pods piled onto it. Now the node takes nothing until they leave.
#[tokio::test]
async fn a_node_whose_bound_grants_overcommit_takes_nothing_more() {
    let mut bound = Vec::new();
    for (name, uid) in [("a", "uid-a"), ("b", "uid-b")] {
        let mut p = pod("ml", name, uid, &SHARE);
        let a = grant_for(&p, "n1");
        p.spec.as_mut().unwrap().node_name = Some("n1".into());
        p.metadata.annotations =
            Some([(tessera_core::allocation::ANNOTATION.to_string(), a)].into());
        bound.push(p);
    }
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    // 60 % + 60 % of one GPU, both validly signed.
    let m = mirror("tessera", nodes, inv, bound);
    assert!(
        m.lock().problems().iter().any(|p| p.contains("ml/")),
        "{:?}",
        m.lock().problems()
    );
    let app = router(state(m.clone(), None));
    let small = pod(
        "ml",
        "c",
        "uid-c",
        &[
            ("tessera.io/gpu", "1"),
            ("tessera.io/gpu-memory-percent", "10"),
            ("tessera.io/gpu-cores", "10"),
        ],
    );
    let (_, v) = call(app.clone(), "/filter", filter_body(&small, &["n1"])).await;
    assert_eq!(v["NodeNames"], json!([]), "{v}");
    let why = v["FailedAndUnresolvableNodes"]["n1"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("hold more than its GPUs have"), "{v}");
    assert!(m.lock().reserve(&small, "n1").is_err());
    // One of them leaves: the node is consistent again and takes the small pod.
    m.lock().remove_pod("uid-b");
    let (_, v) = call(app, "/filter", filter_body(&small, &["n1"])).await;
    assert_eq!(v["NodeNames"], json!(["n1"]), "{v}");
}
