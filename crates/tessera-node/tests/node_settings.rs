//! The agent reads its Node's `tessera.io/mig-dynamic` label from one watch of
//! that Node (field selector on its name, the LIST from the watch cache), and
//! follows the label as the operator changes it — checked against kube-rs's
//! mock service answering as the API server does (a NodeList, then a held-open
//! watch of MODIFIED events).

use std::time::Duration;

use tessera_core::fit::mig_layout::MigDynamic;
use tessera_core::model::single::MigStrategy;
use tessera_node::nodesettings::{NodeSettings, watch_settings};

mod mock_api;
use mock_api::line;

const WAIT: Duration = Duration::from_secs(20);

fn node(rv: u32, mig_dynamic: Option<&str>) -> serde_json::Value {
    let mut labels = serde_json::json!({"kubernetes.io/hostname": "n1"});
    if let Some(v) = mig_dynamic {
        labels["tessera.io/mig-dynamic"] = v.into();
    }
    serde_json::json!({
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": "n1", "uid": "node-uid-1", "resourceVersion": rv.to_string(), "labels": labels},
        "spec": {}, "status": {}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mig_setting_follows_the_nodes_label_from_one_watch() {
    // The LIST: the node as it is, labelled `instances`.
    let mut api = mock_api::start(serde_json::json!({
        "kind": "NodeList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "100"}, "items": [node(100, Some("instances"))]
    }));
    let events_tx = api.events.clone();
    let mut setting = watch_settings(api.client.clone(), "n1");
    let until = |rx: &mut tokio::sync::watch::Receiver<NodeSettings>, want: MigDynamic| {
        let mut rx = rx.clone();
        async move {
            tokio::time::timeout(WAIT, rx.wait_for(|v| v.mig_dynamic == want))
                .await
                .unwrap_or_else(|_| panic!("the setting never became {want:?}"))
                .map(|_| ())
                .expect("the watch task is alive");
        }
    };
    // Off until the Node is read, then what its label says.
    until(&mut setting, MigDynamic::Instances).await;
    // The operator switches to `mode`, then takes the label off.
    events_tx
        .send(line("MODIFIED", &node(101, Some("mode"))))
        .unwrap();
    until(&mut setting, MigDynamic::Mode).await;
    // Status churn that leaves the label alone changes nothing.
    events_tx
        .send(line("MODIFIED", &node(102, Some("mode"))))
        .unwrap();
    events_tx.send(line("MODIFIED", &node(103, None))).unwrap();
    until(&mut setting, MigDynamic::Off).await;
    // A typo allows nothing, as on the scheduler's side.
    events_tx
        .send(line("MODIFIED", &node(104, Some("Instances"))))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(setting.borrow().mig_dynamic, MigDynamic::Off);
    assert_eq!(setting.borrow().mig_strategy, MigStrategy::Mixed);
    // GFD labels the node for the GPU Operator's single MIG strategy.
    let mut single = node(105, None);
    single["metadata"]["labels"]["nvidia.com/mig.strategy"] = "single".into();
    events_tx.send(line("MODIFIED", &single)).unwrap();
    tokio::time::timeout(
        WAIT,
        setting.wait_for(|v| v.mig_strategy == MigStrategy::Single),
    )
    .await
    .expect("the strategy follows the label")
    .expect("the watch task is alive");

    // One LIST from the watch cache and one WATCH, both on this Node only.
    let uris = api.uris();
    assert_eq!(uris.len(), 2, "{uris:?}");
    assert!(uris[0].starts_with("/api/v1/nodes?"), "{uris:?}");
    assert!(uris[0].contains("resourceVersion=0"), "{uris:?}");
    assert!(uris[1].contains("watch=true"), "{uris:?}");
    for u in &uris {
        assert!(u.contains("fieldSelector=metadata.name%3Dn1"), "{u}");
    }
    drop(setting);
    api.server.abort();
}
