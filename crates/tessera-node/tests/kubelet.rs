//! The device plugin against an in-process, kubelet-shaped peer over real unix
//! sockets: registration, ListAndWatch through a failure and a recovery, and
//! re-registration after the kubelet socket is recreated. Allocate is in
//! `allocate.rs`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use tessera_node::proto::deviceplugin as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_and_streams_health_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    let regs = registered(&mut kubelet, 4).await;
    let names: Vec<&str> = regs.iter().map(|r| r.resource_name.as_str()).collect();
    // The stock names (nvidia.com/gpu, and nvidia.com/mig-<profile> for the
    // instances) beside Tessera's own.
    assert_eq!(
        names,
        [
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.10gb",
            "tessera.io/gpu",
            "tessera.io/mig-1g.10gb"
        ]
    );
    assert_eq!(regs[2].endpoint, "tessera-gpu.sock");
    assert_eq!(regs[0].endpoint, "tessera-nvidia-gpu.sock");
    assert_eq!(regs[1].endpoint, "tessera-nvidia-mig-1g.10gb.sock");
    assert_eq!(regs[2].version, "v1beta1");
    assert!(dir.path().join("tessera-gpu.sock").exists());

    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut stream = gpu.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let health_of = |resp: &pb::ListAndWatchResponse| -> BTreeMap<String, String> {
        resp.devices
            .iter()
            .map(|d| (d.id.clone(), d.health.clone()))
            .collect()
    };
    let first = stream.message().await.unwrap().unwrap();
    let h = health_of(&first);
    // 2 non-MIG GPUs × 4 slots; the MIG GPU is not a tessera.io/gpu.
    assert_eq!(h.len(), 8);
    assert!(h.values().all(|v| v == "Healthy"));
    assert_eq!(
        h.get(&format!("{GPU0}::3")).map(String::as_str),
        Some("Healthy")
    );
    assert_eq!(first.devices[0].topology.as_ref().unwrap().nodes[0].id, 0);

    // A fatal XID on GPU1: its tokens turn Unhealthy, GPU0's stay Healthy.
    agent.fake.inject_xid(GPU1, 79);
    let second = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let h = health_of(&second);
    assert_eq!(h.len(), 8, "every message is the complete list");
    for k in 0..4 {
        assert_eq!(h[&format!("{GPU1}::{k}")], "Unhealthy");
        assert_eq!(h[&format!("{GPU0}::{k}")], "Healthy");
    }
    // The GPU is repaired: it comes back without restarting anything.
    agent.fake.recover(GPU1).unwrap();
    let third = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(health_of(&third).values().all(|v| v == "Healthy"));

    // The MIG resource follows its parent GPU.
    let mut mig = dial(&dir.path().join("tessera-mig-1g.10gb.sock"))
        .await
        .unwrap();
    let mut mstream = mig.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let m = mstream.message().await.unwrap().unwrap();
    assert_eq!(m.devices.len(), 2);
    agent.fake.inject_xid(GPU2, 48);
    let m = tokio::time::timeout(WAIT, mstream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(m.devices.iter().all(|d| d.health == "Unhealthy"));

    drop(stream);
    drop(mstream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
    let _ = kubelet.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_period_brings_a_gpu_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    // A short quiet period: the GPU returns on its own after it.
    let agent = start_agent(dir.path(), Duration::from_secs(2));
    registered(&mut kubelet, 4).await;
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut stream = gpu.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    stream.message().await.unwrap().unwrap();
    agent.fake.inject_xid(GPU0, 95);
    let down = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        down.devices
            .iter()
            .filter(|d| d.health == "Unhealthy")
            .count(),
        4
    );
    let up = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(up.devices.iter().all(|d| d.health == "Healthy"));
    drop(stream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_registers_when_the_kubelet_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;

    // Kubelet restart: it goes away, cleans the directory of sockets, comes back.
    let _ = kubelet.stop.send(());
    let _ = kubelet.task.await;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let _ = std::fs::remove_file(entry.unwrap().path());
    }
    assert!(!dir.path().join("tessera-gpu.sock").exists());
    let mut kubelet = start_kubelet(dir.path());
    let regs = registered(&mut kubelet, 4).await;
    assert_eq!(regs[2].resource_name, "tessera.io/gpu");
    assert_eq!(regs[3].resource_name, "tessera.io/mig-1g.10gb");
    // The plugin serves again on a fresh socket.
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut stream = gpu.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().devices.len(), 8);

    // Only the kubelet socket recreated (plugin sockets intact): also re-registers.
    let _ = kubelet.stop.send(());
    let _ = kubelet.task.await;
    let mut kubelet = start_kubelet(dir.path());
    let regs = registered(&mut kubelet, 4).await;
    assert_eq!(regs.len(), 4);

    drop(stream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}
