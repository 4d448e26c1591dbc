//! The extender against the request bodies a real kube-scheduler v1.28 sent
//! (`../shared/fixtures/kube-scheduler-v1.28-extender/`), through `router(state)`.

mod common;

use common::*;
use http::StatusCode;
use serde_json::{Value, json};
use tessera_k8s::extender::router;

/// The fixture's pod with its resources replaced (the capture asked for `example.com/gpu`).
fn with_resources(mut body: Value, resources: Value) -> Vec<u8> {
    body["Pod"]["spec"]["containers"][0]["resources"] =
        json!({ "requests": resources, "limits": {} });
    serde_json::to_vec(&body).unwrap()
}

#[tokio::test]
async fn filter_accepts_captured_node_names_body_as_is() {
    let Some(body) = fixture("filter-request-ExtenderArgs-nodenames.json") else {
        return;
    };
    let (nodes, inv) = fixture_cluster();
    let app = router(state(mirror("tessera", nodes, inv, vec![]), None));
    let (status, v) = call(app, "/scheduler/filter", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // The captured pod asks only for `example.com/gpu` and CPU: not Tessera's to judge, all pass.
    assert_eq!(
        v["NodeNames"],
        json!(["fake-gpu-node-2", "fake-gpu-node-1"])
    );
    assert_eq!(v["Nodes"], Value::Null);
    assert_eq!(v["Error"], "");
    assert_eq!(v["FailedNodes"], json!({}));
}

#[tokio::test]
async fn filter_accepts_captured_full_nodes_body_as_is() {
    let Some(body) = fixture("filter-request-ExtenderArgs-nodes.json") else {
        return;
    };
    // An empty mirror: the nodes arrive in the body (nodeCacheCapable: false).
    let app = router(state(mirror("tessera", vec![], vec![], vec![]), None));
    let (status, v) = call(app, "/filter", body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let names: Vec<&str> = v["Nodes"]["items"]
        .as_array()
        .expect("answer carries Nodes when asked with Nodes")
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fake-gpu-node-1", "fake-gpu-node-2"]);
    assert_eq!(v["NodeNames"], Value::Null);
}

#[tokio::test]
async fn filter_judges_gpu_requests_both_ways() {
    let Some(raw) = fixture("filter-request-ExtenderArgs-nodenames.json") else {
        return;
    };
    let raw: Value = serde_json::from_slice(&raw).unwrap();
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![]);
    // Six whole GPUs: node-1 has 8, node-2 only 4 (never, preemption cannot help).
    let body = with_resources(raw.clone(), json!({"cpu": "100m", "tessera.io/gpu": "6"}));
    let (_, v) = call(router(state(m.clone(), None)), "/filter", body).await;
    assert_eq!(v["NodeNames"], json!(["fake-gpu-node-1"]));
    assert_eq!(
        v["FailedAndUnresolvableNodes"]["fake-gpu-node-2"],
        "fewer than 6 GPUs in total"
    );

    // Same with the full-node form: the answer comes back as Nodes.
    let Some(full) = fixture("filter-request-ExtenderArgs-nodes.json") else {
        return;
    };
    let full: Value = serde_json::from_slice(&full).unwrap();
    let body = with_resources(full, json!({"tessera.io/gpu": "6"}));
    let (_, v) = call(router(state(m.clone(), None)), "/filter", body).await;
    assert_eq!(v["Nodes"]["items"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["Nodes"]["items"][0]["metadata"]["name"],
        "fake-gpu-node-1"
    );

    // A malformed request: the parser's message, no crash.
    let body = with_resources(
        raw,
        json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory": "-4Gi"}),
    );
    let (status, v) = call(router(state(m, None)), "/filter", body).await;
    assert_eq!(status, StatusCode::OK);
    let err = v["Error"].as_str().unwrap();
    assert!(err.contains("tessera.io/gpu-memory"), "{err}");
    assert_eq!(v["NodeNames"], Value::Null);
}

#[tokio::test]
async fn prioritize_answers_a_bare_array_with_capitalised_keys() {
    let Some(raw) = fixture("prioritize-request-ExtenderArgs-nodes.json") else {
        return;
    };
    let raw: Value = serde_json::from_slice(&raw).unwrap();
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![]);
    // As captured (no Tessera resources): every node, score 0.
    let (status, v) = call(
        router(state(m.clone(), None)),
        "/scheduler/prioritize",
        serde_json::to_vec(&raw).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v,
        json!([{"Host": "fake-gpu-node-1", "Score": 0}, {"Host": "fake-gpu-node-2", "Score": 0}])
    );
    // A 30 % share: both nodes fit; scores lie in 0..=10 and the best is 10.
    let body = with_resources(
        raw,
        json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "30", "tessera.io/gpu-cores": "30"}),
    );
    let (_, v) = call(router(state(m, None)), "/prioritize", body).await;
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert!(
        list.iter()
            .all(|h| (0..=10).contains(&h["Score"].as_i64().unwrap()))
    );
    assert_eq!(
        list.iter().map(|h| h["Score"].as_i64().unwrap()).max(),
        Some(10)
    );
}

#[tokio::test]
async fn bad_bodies_get_a_clear_400() {
    let (nodes, inv) = fixture_cluster();
    let m = mirror("tessera", nodes, inv, vec![]);
    for verb in ["/filter", "/prioritize", "/bind", "/preempt"] {
        let (status, v) = call(router(state(m.clone(), None)), verb, b"{not json".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{verb}");
        assert!(
            v.as_str().unwrap().contains("not a valid extender message"),
            "{verb}: {v}"
        );
    }
}

#[tokio::test]
async fn preempt_answers_with_the_victims_that_free_the_right_gpu() {
    // What the mirror knows of v2, the one victim that helps: nothing beyond its hold,
    // its pod with `tessera.io/preemptible: "false"`, its pod with a priority as high as
    // the preemptor's (1). The last two leave no subset that makes room: n1 is dropped.
    for (case, v2_pod, want) in [
        (
            "hold only",
            None,
            json!({"n1": {"Pods": [{"UID": "v2"}], "NumPDBViolations": 1}}),
        ),
        ("not preemptible", Some((Some("false"), None)), json!({})),
        ("equal priority", Some((None, Some(1))), json!({})),
    ] {
        let nodes = vec![kube_node("n1", "32", "64Gi")];
        let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 2)];
        let m = mirror("binpack", nodes, inv, vec![]);
        // v1 takes 70 % of one GPU, v2 60 % of the other (70 + 60 > 100), and v3's 30 %
        // goes beside one of them: free 0 + 40 or 30 + 10, 40 % in total either way.
        for (uid, cores) in [("v1", "70"), ("v2", "60"), ("v3", "30")] {
            let mut p = pod(
                "ml",
                uid,
                uid,
                &[("tessera.io/gpu", "1"), ("tessera.io/gpu-cores", cores)],
            );
            m.lock().reserve(&p, "n1").unwrap();
            if let (true, Some((annotation, priority))) = (uid == "v2", v2_pod) {
                if let Some(a) = annotation {
                    p.metadata.annotations =
                        Some([("tessera.io/preemptible".to_string(), a.to_string())].into());
                }
                p.spec.as_mut().unwrap().priority = priority;
                m.lock().upsert_pod(p);
            }
        }
        // A 50 % share at priority 1 (v1..v3 have none: 0); kube-scheduler, counting
        // totals, proposes v3 and v2. Without v3 its GPU has 0 + 30 or 10 + 30 = 40 %
        // free, short of 50; without v2 its GPU has 40 + 60 or 10 + 60 % free.
        let mut preemptor = pod(
            "ml",
            "big",
            "uid-big",
            &[("tessera.io/gpu", "1"), ("tessera.io/gpu-cores", "50")],
        );
        preemptor.spec.as_mut().unwrap().priority = Some(1);
        let body = json!({
            "Pod": preemptor,
            "NodeNameToVictims": null,
            "NodeNameToMetaVictims": {
                "n1": {"Pods": [{"UID": "v3"}, {"UID": "v2"}], "NumPDBViolations": 1}
            }
        });
        let (status, v) = call(
            router(state(m.clone(), None)),
            "/preempt",
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{case}: {v}");
        assert_eq!(v, json!({ "NodeNameToMetaVictims": want }), "{case}");
        assert_eq!(m.lock().ledger().allocation_count(), 3);
    }
}

#[tokio::test]
async fn preempt_keeps_nodes_where_the_victims_make_room() {
    let nodes = vec![kube_node("n1", "32", "64Gi"), kube_node("n2", "32", "64Gi")];
    let inv = vec![
        gpu_node("n1", "A100-80GB", 81_920, 1),
        gpu_node("n2", "A100-80GB", 81_920, 1),
    ];
    let m = mirror("tessera", nodes, inv, vec![]);
    // A victim holds n1's only GPU, another holds n2's.
    for (uid, node) in [("victim-1", "n1"), ("victim-2", "n2")] {
        let p = pod("ml", uid, uid, &[("tessera.io/gpu", "1")]);
        let r = m.lock().reserve(&p, node).unwrap();
        assert!(matches!(
            r,
            tessera_k8s::mirror::Reservation::Write {
                annotation: Some(_)
            }
        ));
    }
    let preemptor = pod("ml", "big", "uid-big", &[("tessera.io/gpu", "1")]);
    let body = json!({
        "Pod": preemptor,
        "NodeNameToVictims": null,
        "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "victim-1"}], "NumPDBViolations": 0},
            // Evicting a pod that holds nothing on n2 frees nothing.
            "n2": {"Pods": [{"UID": "someone-else"}], "NumPDBViolations": 0}
        }
    });
    let (status, v) = call(
        router(state(m.clone(), None)),
        "/preempt",
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "victim-1"}], "NumPDBViolations": 0}}})
    );
    // The check left the ledger as it was.
    assert_eq!(m.lock().ledger().allocation_count(), 2);
}
