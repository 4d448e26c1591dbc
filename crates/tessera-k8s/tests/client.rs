//! Tessera's API client multiplexes over HTTP/2 (issue 10: kube-rs's own
//! client held one TLS connection per request in flight). Against the
//! API-server double served over TLS with ALPN, as kube-apiserver is: after
//! one warm-up request, 50 concurrent requests ride the one connection;
//! kube-rs's client opens one per request in flight.

mod apiserver;

use std::time::Duration;

use apiserver::cluster::add_gpu_nodes;
use apiserver::{ApiServer, Config};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

async fn burst(client: kube::Client) -> usize {
    let api: Api<Node> = Api::all(client);
    api.get("gpu-node-0").await.expect("warm-up GET");
    let calls = (0..50).map(|i| {
        let api = api.clone();
        async move { api.get(&format!("gpu-node-{}", i % 4)).await }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .filter(Result::is_ok)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_one_http2_connection() {
    let server = ApiServer::new(Config {
        // Long enough that the 50 requests overlap.
        latency: (Duration::from_millis(40), Duration::from_millis(60)),
        ..Config::default()
    });
    add_gpu_nodes(&server, 4, 1);

    let ours = server.listen_tls().await;
    let client = tessera_k8s::client::from_config(ours.kube_config()).expect("client");
    assert_eq!(burst(client).await, 50, "every request answered");
    assert_eq!(ours.connections(), 1, "one multiplexed connection");

    let theirs = server.listen_tls().await;
    assert_eq!(burst(theirs.client()).await, 50);
    assert!(
        theirs.connections() >= 10,
        "kube-rs's HTTP/1.1 client opened {} connections (one per request in flight)",
        theirs.connections()
    );
}
