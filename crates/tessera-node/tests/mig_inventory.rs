//! Dynamic MIG and the GpuNode: once the agent creates a planned instance at
//! Allocate, it publishes the GpuNode spec again with the GPU in MIG mode and the
//! instance listed, and again without it once the instance was destroyed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use http::{Request, Response};
use kube::client::Body;
use tessera_core::allocation::MigGrant;
use tessera_core::request::Isolation;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::allocate::{MpsConfig, StaticPods};
use tessera_node::deviceplugin::registration::PluginConfig;
use tessera_node::health::XidPolicy;
use tessera_node::inventory::Inventory;
use tessera_node::run::{AgentConfig, AgentDeps};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpunode_shows_the_layout_the_agent_made() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    // The API server: answers every request and reports the GpuNode specs written.
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_string();
            if let Some(r) = common::unserved_dra(&path) {
                send.send_response(r);
                continue;
            }
            let bytes = req.into_body().collect_bytes().await.unwrap();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let mut reply = body.clone();
            reply["metadata"]["name"] = NODE.into();
            if reply.get("spec").is_none() {
                reply["spec"] = serde_json::json!({"nodeName": NODE});
            }
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&reply).unwrap(),
            )));
            if !path.ends_with("/status") && body.get("spec").is_some() {
                let _ = seen_tx.send(body["spec"].clone());
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let fake = Fake::from_yaml(GPUS, "test").unwrap();
    let pods = StaticPods::default();
    let config = AgentConfig {
        node_name: NODE.into(),
        plugin: PluginConfig {
            dir: dir.path().to_path_buf(),
            poll: Duration::from_millis(100),
        },
        slots: 4,
        metrics_addr: None,
        xid_policy: XidPolicy::default(),
        quiet_period: Duration::from_secs(3600),
        health_interval: Duration::from_millis(50),
        heartbeat_period: tessera_api::gpunode::HEARTBEAT_PERIOD,
        allocation_key: KEY.to_vec().into(),
        mps: MpsConfig::default(),
        device_list: "volume-mounts".parse().unwrap(),
        nvidia_gpu: true,
        node_labels: false,
        mig_grace: Duration::from_millis(200),
        mig_state: None,
        mps_binary: "nvidia-cuda-mps-control".into(),
        allocate_state: None,
    };
    let deps = AgentDeps {
        backend: Arc::new(fake.clone()),
        procs: Arc::new(fake.proc_reader()),
        pods: Arc::new(pods.clone()),
        pod_resources: None,
        kubelet: None,
        inventory: Some(Inventory::new(client, NODE.into())),
        node_settings: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(tessera_node::run::run(config, deps, async {
        let _ = stopped.await;
    }));
    registered(&mut kubelet, 4).await;
    // GPU 1's entry in a published spec.
    let gpu1 = |spec: &serde_json::Value| spec["gpus"][1].clone();
    let mut spec_where = async |pred: &dyn Fn(&serde_json::Value) -> bool| {
        loop {
            let spec = tokio::time::timeout(WAIT, seen.recv())
                .await
                .unwrap()
                .unwrap();
            if pred(&spec) {
                return spec;
            }
        }
    };
    let first = spec_where(&|_| true).await;
    assert_ne!(gpu1(&first)["mig"]["enabled"], true, "{first}");

    let mut m = grant(1, GPU1, 40_192, 428);
    m.mig = Some(MigGrant {
        profile: "3g.40gb".into(),
        start: 4,
        size: 4,
        uuid: String::new(),
        create: true,
        enable_mig_mode: true,
    });
    let hard = decision("uid-hard", NODE, Isolation::Mig, vec![m]);
    let p = pod(
        "uid-hard",
        "hard",
        1,
        "tessera.io/gpu",
        1,
        Some(hard.encode_signed(KEY)),
    );
    pods.set(vec![p.clone()]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    allocate(&mut gpu, &[&format!("{GPU0}::0")]).await.unwrap();
    let spec = spec_where(&|s| gpu1(s)["mig"]["enabled"] == true).await;
    let instances = gpu1(&spec)["mig"]["instances"].clone();
    assert_eq!(instances[0]["profile"], "3g.40gb", "{spec}");
    assert_eq!(instances[0]["start"], 4, "{spec}");

    // The pod is gone: after the grace the instance is destroyed and the spec says so.
    pods.set(Vec::new());
    let spec = spec_where(&|s| gpu1(s)["mig"]["enabled"] != true).await;
    assert!(
        gpu1(&spec)["mig"]["instances"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "{spec}"
    );
    let _ = stop.send(());
    tokio::time::timeout(WAIT, agent)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let _ = kubelet.stop.send(());
}
