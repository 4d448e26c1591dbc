//! Issue 27 item 10: an agent whose NVML fails must not stay Ready serving
//! nothing. Before, the binary fell back to a backend with no GPUs for the
//! life of the process and its readiness probe (`/healthz`) answered "ok":
//! the pod was Ready, the node advertised nothing, and nobody was told.
//! Now the backend is retried while `/readyz` answers 503 with the reason,
//! and the running agent's `/readyz` is 503 while it has no GPU to serve.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tessera_node::backend::fake::Fake;
use tessera_node::backend::{BackendError, GpuBackend};
use tessera_node::deviceplugin::NodeView;
use tessera_node::deviceplugin::allocate::StaticPods;
use tessera_node::metrics::{Collector, XidStats};
use tessera_node::startup::{Retry, wait_for_backend};
use tokio::sync::watch;
use tower::ServiceExt;

mod http_get;
use http_get::get;

const ONE_GPU: &str = r#"
gpus:
  - uuid: GPU-one
    product: NVIDIA A100-SXM4-80GB
"#;

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_fails_is_retried_and_the_agent_is_not_ready_meanwhile() {
    let addr = free_addr();
    let tries = Arc::new(AtomicU32::new(0));
    let t = tries.clone();
    let init = move || {
        let n = t.fetch_add(1, Ordering::SeqCst) + 1;
        if n < 4 {
            Err(BackendError::NvmlUnavailable(
                "libnvidia-ml.so.1: cannot open shared object file".into(),
            ))
        } else {
            Ok(n)
        }
    };
    let retry = Retry {
        first: Duration::from_millis(150),
        max: Duration::from_millis(300),
    };
    let waiting = tokio::spawn(wait_for_backend(
        "nvml",
        init,
        Some(addr),
        retry,
        std::future::pending(),
    ));

    // While it waits: alive, not Ready, and the reason is in the probe's answer.
    let mut seen = None;
    for _ in 0..100 {
        if let Ok(r) = get(addr, "/readyz").await {
            seen = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = seen.expect("/readyz is served while the backend is retried");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("libnvidia-ml.so.1") && body.contains("not Ready"),
        "{body}"
    );
    let (status, _) = get(addr, "/healthz").await.expect("/healthz");
    assert_eq!(status, 200, "alive while waiting (no restart loop)");
    // Scrapes succeed with no GPU series, so TesseraAgentWithoutGpus fires.
    let (status, body) = get(addr, "/metrics").await.expect("/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("tessera_agent_backend_up 0"), "{body}");
    assert!(!body.contains("tessera_gpu_healthy"), "{body}");

    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the backend started within 10 s")
        .expect("task")
        .expect("no startup error");
    assert_eq!(got, Some(4), "three failures, then the fourth try");
    assert_eq!(tries.load(Ordering::SeqCst), 4);
    // The probe server is gone: the agent's own server can take the port.
    std::net::TcpListener::bind(addr).expect("the port is free again");
}

#[tokio::test]
async fn a_backend_that_starts_at_once_serves_no_probe_and_shutdown_ends_the_wait() {
    let addr = free_addr();
    let got = wait_for_backend(
        "fake",
        || Ok::<_, BackendError>("up"),
        Some(addr),
        Retry::default(),
        std::future::pending(),
    )
    .await
    .expect("no error");
    assert_eq!(got, Some("up"));
    std::net::TcpListener::bind(addr).expect("nothing was bound");

    let never = wait_for_backend(
        "nvml",
        || Err::<(), _>(BackendError::NvmlUnavailable("no driver".into())),
        None,
        Retry::default(),
        tokio::time::sleep(Duration::from_millis(50)),
    );
    let got = tokio::time::timeout(Duration::from_secs(5), never)
        .await
        .expect("shutdown ends the wait")
        .expect("no error");
    assert_eq!(got, None);
}

async fn readyz(fake: Fake) -> (u16, String) {
    let (_tx, view) = watch::channel(NodeView {
        settings: Default::default(),
        gpus: fake.discover().expect("discover"),
        health: BTreeMap::new(),
    });
    let collector = Arc::new(Collector::new(
        "node-1".into(),
        Arc::new(fake.clone()),
        Arc::new(fake.proc_reader()),
        Arc::new(StaticPods::default()),
        None,
        view,
        XidStats::default(),
    ));
    let resp = collector
        .router()
        .oneshot(
            http::Request::get("/readyz")
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await
        .expect("answer");
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn the_running_agent_is_ready_only_with_a_gpu_to_serve() {
    let (status, body) = readyz(Fake::from_yaml("gpus: []\n", "test").expect("fake")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("found no GPU on node-1"), "{body}");
    let (status, body) = readyz(Fake::from_yaml(ONE_GPU, "test").expect("fake")).await;
    assert_eq!(status, 200, "{body}");
}
