//! Issue 27 item 6: extender-mode preemption on the real sequence, against the
//! stateful API double with a whole scheduler process (`run::run`, leader
//! election on, its 60 s minimum run time, its 5 s preemption round).
//!
//! One node with one GPU. A low-priority pod is bound through the extender's
//! `bind` verb and Running since 5 minutes (status as the kubelet writes it);
//! a high-priority pod asking `tessera.io/gpu: 1` fails `filter`, and
//! kube-scheduler v1.28 marks it unschedulable: its dry run sees no victims
//! for a resource it ignores, so it writes `PodScheduled=False`, reason
//! `Unschedulable`, with the message below, and calls no `preempt`. Tessera's
//! leader must evict the low pod (eviction API, its UID as precondition).

mod apiserver;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use apiserver::cluster::{Shape, add_gpu_nodes, pod};
use apiserver::process::Process;
use apiserver::{ApiServer, Config, Resource};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tessera_k8s::run::RawConfig;

const KEY: &[u8] = b"extender-preemption-signing-key";

fn scheduler(key_file: &std::path::Path, role: &str) -> tessera_k8s::run::Config {
    RawConfig {
        mode: Some("extender".into()),
        listen: Some("127.0.0.1:0".into()),
        metrics_listen: Some("127.0.0.1:0".into()),
        lease_role: Some(role.into()),
        lease_duration: Some(Duration::from_secs(2)),
        renew_deadline: Some(Duration::from_millis(1400)),
        retry_period: Some(Duration::from_millis(400)),
        signing_key_file: Some(key_file.to_path_buf()),
        scheduler_name: Some("tessera".into()),
        leader_elect: Some(true),
        identity: Some("tessera-0".into()),
        lease_namespace: Some("tessera-system".into()),
        lease_name: Some("tessera-scheduler".into()),
        ..RawConfig::default()
    }
    .resolve()
    .expect("valid config")
}

async fn post(addr: std::net::SocketAddr, path: &str, body: Value) -> Value {
    use axum::body::Body;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    // The process may not listen yet: retry connecting for a while.
    let mut tries = 0;
    let resp = loop {
        let mut r = http::Request::post(req.uri().clone())
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        *r.headers_mut() = req.headers().clone();
        match client.request(r).await {
            Ok(resp) => break resp,
            Err(e) if tries < 100 => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("extender answers: {e}"),
        }
    };
    let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// kube-scheduler in Tessera's pod (the chart): it holds its Lease as
/// `<pod>_<uuid>` and renews it; Tessera follows it.
fn kube_scheduler_leads(server: &ApiServer) -> tokio::task::JoinHandle<()> {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let (client, _) = server.client();
    tokio::spawn(async move {
        let leases: Api<Lease> = Api::namespaced(client, "tessera-system");
        let spec = || LeaseSpec {
            holder_identity: Some("tessera-0_6f1c2d3e-aaaa".into()),
            lease_duration_seconds: Some(2),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        };
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some("tessera-scheduler".into()),
                ..Default::default()
            },
            spec: Some(spec()),
        };
        leases
            .create(&Default::default(), &lease)
            .await
            .expect("lease");
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let patch = json!({"spec": {"renewTime": spec().renew_time}});
            let _ = leases
                .patch(
                    "tessera-scheduler",
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elected_leader_evicts_for_a_pod_kube_scheduler_marked_unschedulable() {
    preempts_for_unschedulable("elect").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_leader_evicts_for_a_pod_kube_scheduler_marked_unschedulable() {
    preempts_for_unschedulable("follow").await;
}

/// Everything the processes of this test binary log, at info and above.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .try_init();
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn preempts_for_unschedulable(role: &str) {
    let logs = logs();
    let ns = if role == "follow" {
        "ml-follow"
    } else {
        "ml-elect"
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, KEY).expect("key file");
    let server = ApiServer::new(Config::default());
    add_gpu_nodes(&server, 1, 1);
    let low = server
        .create(
            Resource::Pods,
            &pod(ns, "low", "tessera", Shape::Whole(1), 100, 256, 0),
        )
        .expect("low");
    let renewer = (role == "follow").then(|| kube_scheduler_leads(&server));
    let tessera = Process::start(&server, scheduler(&key_file, role), &[]);
    let (client, _session) = server.client();
    let pods: Api<Pod> = Api::namespaced(client, ns);

    // kube-scheduler binds the low pod through Tessera.
    let bind = json!({"PodName": "low", "PodNamespace": ns, "PodUID": low["metadata"]["uid"], "Node": "gpu-node-0"});
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = post(tessera.addr, "/bind", bind.clone()).await;
        if v["Error"] == "" {
            break;
        }
        assert!(Instant::now() < deadline, "low never bound: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The kubelet: Running since 5 minutes.
    let started =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_mins(5);
    pods.patch_status(
        "low",
        &PatchParams::default(),
        &Patch::Strategic(
            json!({"status": {"phase": "Running", "startTime": started.to_string()}}),
        ),
    )
    .await
    .expect("low running");

    let high = server
        .create(
            Resource::Pods,
            &pod(ns, "high", "tessera", Shape::Whole(1), 100, 256, 1000),
        )
        .expect("high");
    let mut high_pod: Pod = serde_json::from_value(high.clone()).unwrap();
    high_pod.metadata.managed_fields = None;
    let filter = json!({"Pod": high_pod, "NodeNames": ["gpu-node-0"]});
    let v = post(tessera.addr, "/filter", filter).await;
    assert_eq!(v["NodeNames"], json!([]), "the node is full: {v}");
    let why = v["FailedNodes"]["gpu-node-0"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // What kube-scheduler v1.28 writes (schedule_one.go handleSchedulingFailure;
    // the "preemption:" part is DefaultPreemption's PostFilter message).
    let message = format!(
        "0/1 nodes are available: 1 {why}. preemption: expected at least one victim pod on node \"gpu-node-0\"."
    );
    pods.patch_status(
        "high",
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastProbeTime": null,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]}})),
    )
    .await
    .expect("high unschedulable");

    let evicted = || {
        server
            .writes()
            .iter()
            .any(|w| w.subresource == "eviction" && w.name == "low" && w.status < 300)
    };
    // Two preemption rounds (5 s apart) and some slack.
    let waited = tokio::time::timeout(Duration::from_secs(15), async {
        while !evicted() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let writes: Vec<String> = server
        .writes()
        .iter()
        .map(|w| {
            format!(
                "{} {}/{} {} {}",
                w.method, w.resource, w.subresource, w.name, w.status
            )
        })
        .collect();
    drop(tessera);
    if let Some(r) = renewer {
        r.abort();
    }
    assert!(waited.is_ok(), "low was not evicted; writes: {writes:#?}");
    // The log says that rounds run, and what each one did for this pod.
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).to_string();
    assert!(
        text.contains("extender preemption rounds running"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.contains(&format!("pod={ns}/high")) && l.contains("extender preemption"))
        .unwrap_or_else(|| panic!("no preemption line for {ns}/high in:\n{text}"));
    assert!(line.contains(&format!("evicted {ns}/low")), "{line}");
}
