//! The agent's pods come from one watch per node, not a LIST per read (issue 28
//! item 8), checked against kube-rs's mock service with the API server's own
//! watch events (../shared/fixtures/kube-apiserver-v1.28/08-watch-pods.json).

use std::time::Duration;

use tessera_node::deviceplugin::allocate::PodSource;
use tessera_node::pods::KubePods;

mod mock_api;
use mock_api::line;

const WAIT: Duration = Duration::from_secs(20);

/// The recorded events of watch A for pod `p8` (created, annotated, bound to
/// n1, deleted), keyed by resourceVersion.
fn recorded_p8() -> Vec<serde_json::Value> {
    let path = "../../../shared/fixtures/kube-apiserver-v1.28/08-watch-pods.json";
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .expect("the shared fixtures (../shared from the workspace root)");
    let case: serde_json::Value = serde_json::from_str(&text).unwrap();
    case["steps"][1]["response"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] != "BOOKMARK")
        .map(|e| e["object"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_come_from_one_watch_not_a_list_per_read() {
    let p8 = recorded_p8();
    // resourceVersions 430 (created), 431 (annotated), 432 (bound to n1), 433, 434 (deleted).
    let bound = p8[2].clone();
    assert_eq!(bound["spec"]["nodeName"], "n1");
    // A LIST: nothing on n1 yet (the node's pods before p8 is bound).
    let mut api = mock_api::start(serde_json::json!({
        "kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "431"}, "items": []
    }));
    let events_tx = api.events.clone();
    let pods = KubePods::watch(api.client.clone(), "n1");
    assert!(pods.pods_on_node("n1").await.unwrap().is_empty());
    // The binding reaches the node's watch as an ADDED (the pod enters the
    // field selector), then later changes as MODIFIED.
    events_tx.send(line("ADDED", &bound)).unwrap();
    let until = |want: usize| {
        let pods = pods.clone();
        async move {
            tokio::time::timeout(WAIT, async {
                loop {
                    let now = pods.pods_on_node("n1").await.unwrap();
                    if now.len() == want {
                        return now;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("the watch event within the wait bound")
        }
    };
    let now = until(1).await;
    assert_eq!(
        (now[0].namespace.as_str(), now[0].name.as_str()),
        ("fx", "p8")
    );
    assert_eq!(now[0].uid, bound["metadata"]["uid"].as_str().unwrap());
    for _ in 0..50 {
        pods.pods_on_node("n1").await.unwrap();
    }
    events_tx.send(line("DELETED", &p8[4])).unwrap();
    until(0).await;

    // Every read above was served from the store: one LIST, one WATCH, both
    // scoped to the node and the LIST from the watch cache.
    let uris = api.uris();
    assert_eq!(uris.len(), 2, "{uris:?}");
    assert!(!uris[0].contains("watch="), "{uris:?}");
    assert!(uris[0].contains("resourceVersion=0"), "{uris:?}");
    assert!(uris[1].contains("watch=true"), "{uris:?}");
    for u in &uris {
        assert!(u.contains("fieldSelector=spec.nodeName%3Dn1"), "{u}");
    }
    // Another node's pods are not this source's to answer.
    assert!(pods.pods_on_node("n2").await.is_err());
    drop(pods);
    api.server.abort();
}
