//! `tessera estimator` as it runs (`estimator::run`): its own watchers list
//! the cluster from the API-server double, and Karmada's generated client
//! over TCP sees `UNAVAILABLE` while the lists are still coming (the double
//! takes its time per listed item, as a big cluster's API server does), then
//! the answers of the placement engine for the listed cluster; `/readyz`
//! turns 200 with them. Shutdown ends the process cleanly.

mod apiserver;

use std::net::SocketAddr;
use std::time::Duration;

use apiserver::cluster::add_gpu_nodes;
use apiserver::process::free_addr;
use apiserver::{ApiServer, Config};
use tessera_estimator::{EstimatorClient, pb};
use tessera_k8s::estimator::{self, RawEstimatorConfig};

const LIMIT: Duration = Duration::from_secs(30);

fn request(resources: &[(&str, &str)]) -> pb::MaxAvailableReplicasRequest {
    let bytes = tessera_estimator::request_bytes(resources.iter().copied());
    pb::MaxAvailableReplicasRequest {
        cluster: "member-1".into(),
        replica_requirements: Some(pb::ReplicaRequirements {
            resource_request_bytes: bytes,
            namespace: "default".into(),
            ..Default::default()
        }),
        assumed_workloads: Vec::new(),
    }
}

async fn readyz(addr: SocketAddr) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    tcp.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_while_listing_then_answers_for_the_listed_cluster() {
    let api = ApiServer::new(Config {
        // Two nodes and two GpuNodes: each list takes about 3 s.
        list_latency_per_item: Duration::from_millis(1500),
        ..Config::default()
    });
    add_gpu_nodes(&api, 2, 8);
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("key");
    std::fs::write(&key, "estimator-run-test-signing-key").expect("key");
    let (listen, health) = (free_addr(), free_addr());
    let config = RawEstimatorConfig {
        listen: Some(listen.to_string()),
        health_listen: Some(health.to_string()),
        cluster_name: Some("member-1".into()),
        mirror: tessera_k8s::run::RawMirrorConfig {
            signing_key_file: Some(key),
            ..Default::default()
        },
        ..Default::default()
    }
    .resolve()
    .expect("valid configuration");
    let (client, _session) = api.client();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(estimator::run(config, client, async {
        let _ = stop_rx.await;
    }));

    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut grpc = loop {
        match EstimatorClient::connect(format!("http://{listen}")).await {
            Ok(c) => break c,
            Err(_) => {
                assert!(tokio::time::Instant::now() < deadline, "never listened");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let one_gpu = [("cpu", "1"), ("memory", "4Gi"), ("nvidia.com/gpu", "1")];
    let early = grpc
        .max_available_replicas(request(&one_gpu))
        .await
        .expect_err("answered before the nodes were listed");
    assert_eq!(early.code(), tonic::Code::Unavailable, "{early:?}");
    assert!(early.message().contains("nodes"), "{}", early.message());
    assert_eq!(readyz(health).await, Some(503));

    let answer = loop {
        match grpc.max_available_replicas(request(&one_gpu)).await {
            Ok(r) => break r.into_inner().max_replicas,
            Err(s) if s.code() == tonic::Code::Unavailable => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never synced: {s:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("{s:?}"),
        }
    };
    // Two empty nodes of eight A100s: sixteen 1-GPU replicas, two of eight.
    assert_eq!(answer, 16);
    let eight = grpc
        .max_available_replicas(request(&[("nvidia.com/gpu", "8")]))
        .await
        .expect("answered")
        .into_inner()
        .max_replicas;
    assert_eq!(eight, 2);
    assert_eq!(readyz(health).await, Some(200));

    stop_tx.send(()).expect("still running");
    tokio::time::timeout(LIMIT, running)
        .await
        .expect("stops on shutdown")
        .expect("task")
        .expect("clean stop");
}
