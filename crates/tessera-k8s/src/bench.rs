//! Extender latency benchmark: `filter` then `prioritize` for one pod against
//! N nodes with `nodeCacheCapable` (names only), through the real router
//! (JSON decode, decision, JSON encode), on a half-full synthetic cluster.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use serde::Serialize;
use serde_json::json;
use tower::ServiceExt;

use crate::extender::{ExtenderState, router};
use crate::metrics::Metrics;
use crate::mirror::{Mirror, Reservation, SharedMirror};

/// Latency figures in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub nodes: usize,
    pub gpus: usize,
    pub pods_placed: usize,
    pub iterations: usize,
    pub policy: String,
    /// filter + prioritize, per pod.
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub filter_p50_us: f64,
    pub filter_p99_us: f64,
    pub prioritize_p50_us: f64,
    pub prioritize_p99_us: f64,
    /// Of which: decoding one request body (JSON to `ExtenderArgs`).
    pub decode_p50_us: f64,
    /// Of which: the mirror's filter + prioritize on decoded input (no HTTP, no JSON).
    pub decide_p50_us: f64,
    /// GpuNode status updates applied per second of run time (the agents'
    /// minute-by-minute republishing), and how many were applied in all.
    pub status_updates_per_sec: f64,
    pub status_updates: usize,
    /// One tick of the web view's observer (every 2 s), median of five, in
    /// milliseconds, and how long it held the mirror's lock (the verbs wait for it).
    pub ui_tick_ms: f64,
    pub ui_lock_ms: f64,
    /// Pods waiting that kube-scheduler marked Unschedulable (none fit), and the
    /// extender-mode preemption rounds run over them while timing, one every
    /// `preemption_every_ms` as on the leader (0: back to back, the worst case
    /// for the verbs, which wait for the mirror's lock the rounds take).
    pub unschedulable: usize,
    pub preemption_every_ms: u64,
    pub preemption_rounds: usize,
    /// Median time of one round, and the longest it held the mirror's lock at once.
    pub preemption_round_ms: f64,
    pub preemption_lock_max_ms: f64,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A mirror of `policy` over the given nodes and inventories, no pods.
pub(crate) fn synthetic_mirror(
    policy: &str,
    nodes: Vec<k8s_openapi::api::core::v1::Node>,
    inventory: Vec<tessera_api::GpuNode>,
) -> Result<Mirror, String> {
    let policy =
        tessera_core::policy::by_name(policy, &Default::default()).map_err(|e| e.to_string())?;
    Ok(Mirror::from_objects(
        policy,
        b"bench-signing-key-0123".to_vec(),
        nodes,
        inventory,
        Vec::new(),
    ))
}

pub(crate) fn synthetic_objects(
    nodes: usize,
) -> (
    Vec<k8s_openapi::api::core::v1::Node>,
    Vec<tessera_api::GpuNode>,
) {
    use k8s_openapi::api::core::v1::{Node, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use tessera_api::{GpuDevice, GpuLink, GpuNode, GpuNodeSpec, LinkKind};
    let models = [
        ("H100-80GB", 81_559u64, 132u32),
        ("A100-80GB", 81_920, 108),
        ("L4", 23_034, 58),
        ("T4", 15_360, 40),
    ];
    let mut kn = Vec::with_capacity(nodes);
    let mut gn = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let name = format!("node-{i:05}");
        let (model, mem, sms) = models[i % models.len()];
        let nvlink = i % models.len() < 2;
        kn.push(Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu".to_string(), Quantity("128".into())),
                        ("memory".to_string(), Quantity("1024Gi".into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
        });
        gn.push(GpuNode::new(
            &name,
            GpuNodeSpec {
                node_name: name.clone(),
                gpus: (0..8u32)
                    .map(|g| GpuDevice {
                        index: g,
                        uuid: format!("GPU-{i:05}-{g}"),
                        model: model.into(),
                        memory_mib: mem,
                        sm_count: sms,
                        numa: Some((g / 4) as u8),
                        links: (0..8u32)
                            .filter(|p| *p != g)
                            .map(|p| GpuLink {
                                peer: p,
                                kind: if nvlink {
                                    LinkKind::NVLink
                                } else if p / 2 == g / 2 {
                                    LinkKind::PCIeSwitch
                                } else {
                                    LinkKind::SameSocket
                                },
                                nvlinks: if nvlink { 18 } else { 0 },
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
            },
        ));
    }
    (kn, gn)
}

fn pod(uid: &str, resources: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "bench", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"requests": resources}}]}
    }))
    .unwrap_or_default()
}

/// Builds the cluster, fills it about half with a mix of shares and whole
/// GPUs, then times `iterations` filter + prioritize pairs for fresh pods,
/// binding each (untimed) where prioritize ranked it best.
///
/// Between pairs, GpuNode status updates arrive at `status_updates_per_sec`
/// of run time (each a new free-memory figure and timestamp for the next node
/// in turn, as the node agents send every minute: `nodes / 60` a second).
pub async fn extender_latency(
    nodes: usize,
    iterations: usize,
    policy: &str,
    status_updates_per_sec: f64,
    unschedulable: usize,
    preemption_every: std::time::Duration,
) -> Result<BenchReport, String> {
    let (kn, gn) = synthetic_objects(nodes);
    let inventory = gn.clone();
    let mut mirror = synthetic_mirror(policy, kn, gn)?;
    // Fill: walk the nodes, placing one pod of a rotating shape on each, four rounds.
    let shapes = [
        json!({"cpu": "4", "tessera.io/gpu": "1", "tessera.io/gpu-milli": "300"}),
        json!({"cpu": "8", "tessera.io/gpu": "1"}),
        json!({"cpu": "2", "tessera.io/gpu": "1", "tessera.io/gpu-milli": "500"}),
        json!({"cpu": "16", "tessera.io/gpu": "2"}),
    ];
    let mut placed = 0;
    for round in 0..4 {
        for i in 0..nodes {
            let p = pod(
                &format!("fill-{round}-{i}"),
                shapes[(i + round) % shapes.len()].clone(),
            );
            if let Ok(Reservation::Write { .. }) = mirror.reserve(&p, &format!("node-{i:05}")) {
                // As if the API accepted the bind: the fill must not expire mid-run.
                mirror.mark_accepted(crate::convert::pod_uid(&p));
                placed += 1;
            }
        }
    }
    // Pods kube-scheduler found no node for: whole 8-GPU asks on a cluster where
    // every node holds four pods, some of them pinned to a model.
    let stuck = [
        json!({"cpu": "8", "tessera.io/gpu": "8"}),
        json!({"cpu": "8", "tessera.io/gpu": "8", "tessera.io/gpu-model": "H100-80GB"}),
        json!({"cpu": "4", "tessera.io/gpu": "8", "tessera.io/gpu-milli": "900"}),
    ];
    for i in 0..unschedulable {
        mirror.upsert_pod(unschedulable_pod(
            &format!("stuck-{i}"),
            stuck[i % stuck.len()].clone(),
        ));
    }
    let gpus = mirror.cluster().gpu_count();
    let mirror = SharedMirror::new(mirror);
    let rounds = (unschedulable > 0).then(|| preemption_rounds(mirror.clone(), preemption_every));
    let observer = crate::ui::Observer::new(mirror.clone(), Arc::new(Metrics::new()));
    let (mut ticks, mut locks): (Vec<f64>, Vec<f64>) = (0..5u64)
        .map(|i| {
            let t = Instant::now();
            observer.observe(1_000_000 + i * 2_000);
            (
                t.elapsed().as_secs_f64() * 1e3,
                observer.last_lock_hold().as_secs_f64() * 1e3,
            )
        })
        .unzip();
    ticks.sort_by(f64::total_cmp);
    locks.sort_by(f64::total_cmp);
    let app = router(ExtenderState::judging_only(mirror.clone()));
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:05}")).collect();
    let ask = json!({"cpu": "2", "memory": "8Gi", "tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "40", "tessera.io/gpu-cores": "40"});
    let mut filter_us = Vec::with_capacity(iterations);
    let mut prio_us = Vec::with_capacity(iterations);
    let mut total_us = Vec::with_capacity(iterations);
    let mut decode_us = Vec::with_capacity(iterations);
    let mut decide_us = Vec::with_capacity(iterations);
    let post = |path: &'static str, body: Vec<u8>| {
        http::Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .map_err(|e| e.to_string())
    };
    let mut owed = 0.0f64;
    let mut updates = 0usize;
    let mut last = Instant::now();
    // A few warm-up pairs, not timed.
    for it in 0..(iterations + 5) {
        // Status updates that arrived meanwhile, in the watch's order.
        owed += status_updates_per_sec.max(0.0) * last.elapsed().as_secs_f64();
        last = Instant::now();
        while owed >= 1.0 && !inventory.is_empty() {
            owed -= 1.0;
            let mut gn = inventory[updates % inventory.len()].clone();
            gn.status = Some(tessera_api::GpuNodeStatus {
                free_memory_mib: 40_000 + (updates as u64 * 7919) % 40_000,
                last_update: Some(format!("2026-12-01T00:{:02}:00Z", updates % 60)),
                ..Default::default()
            });
            mirror.lock().upsert_inventory(gn);
            updates += 1;
        }
        let body = serde_json::to_vec(&json!({
            "Pod": pod(&format!("bench-{it}"), ask.clone()),
            "Nodes": null,
            "NodeNames": names,
        }))
        .map_err(|e| e.to_string())?;
        let body_copy = body.clone();
        let t0 = Instant::now();
        let r = app
            .clone()
            .oneshot(post("/filter", body.clone())?)
            .await
            .map_err(|e| e.to_string())?;
        let filtered = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .map_err(|e| e.to_string())?;
        let t1 = Instant::now();
        let r = app
            .clone()
            .oneshot(post("/prioritize", body)?)
            .await
            .map_err(|e| e.to_string())?;
        let scored = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .map_err(|e| e.to_string())?;
        let t2 = Instant::now();
        if filtered.len() < 10 || scored.len() < 10 {
            return Err("the extender answered with an empty body".into());
        }
        // Bind the pod where prioritize put it (untimed), as kube-scheduler would:
        // the next pod then sees one changed node, as in a live cluster.
        let scores: Vec<super::extender::wire::HostPriority<'_>> =
            serde_json::from_slice(&scored).map_err(|e| e.to_string())?;
        if let Some(best) = scores.iter().max_by_key(|h| h.score) {
            let p = pod(&format!("bench-{it}"), ask.clone());
            let mut m = mirror.lock();
            let _ = m.reserve(&p, &best.host);
            m.mark_accepted(crate::convert::pod_uid(&p));
            placed += 1;
        }
        // The parts, measured apart (same pod, after the bind, so one node changed).
        let t3 = Instant::now();
        let args: crate::extender::wire::ExtenderArgs<'_> =
            serde_json::from_slice(&body_copy).map_err(|e| e.to_string())?;
        let t4 = Instant::now();
        {
            let mut m = mirror.lock();
            let names = args.candidate_names();
            let _ = m.filter(&args.pod, &names);
            let _ = m.prioritize(&args.pod, &names);
        }
        let t5 = Instant::now();
        if it >= 5 {
            decode_us.push((t4 - t3).as_secs_f64() * 1e6);
            decide_us.push((t5 - t4).as_secs_f64() * 1e6);
            filter_us.push((t1 - t0).as_secs_f64() * 1e6);
            prio_us.push((t2 - t1).as_secs_f64() * 1e6);
            total_us.push((t2 - t0).as_secs_f64() * 1e6);
        }
    }
    let (rounds_run, mut round_ms, lock_max_ms) = match rounds {
        Some((stop, task)) => {
            let _ = stop.send(true);
            task.await.map_err(|e| e.to_string())?
        }
        None => (0, Vec::new(), 0.0),
    };
    round_ms.sort_by(f64::total_cmp);
    for v in [
        &mut filter_us,
        &mut prio_us,
        &mut total_us,
        &mut decode_us,
        &mut decide_us,
    ] {
        v.sort_by(f64::total_cmp);
    }
    Ok(BenchReport {
        nodes,
        gpus,
        pods_placed: placed,
        iterations,
        policy: policy.to_string(),
        p50_us: quantile(&total_us, 0.5),
        p99_us: quantile(&total_us, 0.99),
        max_us: total_us.last().copied().unwrap_or(0.0),
        filter_p50_us: quantile(&filter_us, 0.5),
        filter_p99_us: quantile(&filter_us, 0.99),
        prioritize_p50_us: quantile(&prio_us, 0.5),
        prioritize_p99_us: quantile(&prio_us, 0.99),
        decode_p50_us: quantile(&decode_us, 0.5),
        decide_p50_us: quantile(&decide_us, 0.5),
        status_updates_per_sec,
        status_updates: updates,
        ui_tick_ms: ticks[ticks.len() / 2],
        ui_lock_ms: locks[locks.len() / 2],
        unschedulable,
        preemption_every_ms: u64::try_from(preemption_every.as_millis()).unwrap_or(u64::MAX),
        preemption_rounds: rounds_run,
        preemption_round_ms: quantile(&round_ms, 0.5),
        preemption_lock_max_ms: lock_max_ms,
    })
}

/// A pending pod of the `tessera` profile that kube-scheduler marked
/// Unschedulable (the condition v1.28 writes), ten seconds old, priority 1000.
pub(crate) fn unschedulable_pod(
    uid: &str,
    resources: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "bench", "uid": uid},
        "spec": {
            "schedulerName": "tessera",
            "priority": 1000,
            "containers": [{"name": "c", "resources": {"requests": resources}}]
        },
        "status": {
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/5000 nodes are available: 5000 Insufficient tessera.io/gpu.",
                "lastTransitionTime": "2026-12-01T00:00:00Z"
            }]
        }
    }))
    .unwrap_or_default()
}

/// Extender-mode preemption rounds on their own task, one every `every` (as the
/// leader runs them; zero: back to back), until told to stop: (rounds run,
/// each round's milliseconds, the longest lock hold).
/// Evictions go to an address where nothing listens (refused at once): the
/// bench times the rounds' planning, as the leader's rounds would hold the lock.
#[allow(clippy::type_complexity)]
fn preemption_rounds(
    mirror: SharedMirror,
    every: std::time::Duration,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<(usize, Vec<f64>, f64)>,
) {
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let config = kube::Config::new(http::Uri::from_static("http://127.0.0.1:9"));
        let Ok(client) = kube::Client::try_from(config) else {
            return (0, Vec::new(), 0.0);
        };
        let mut p = crate::preemptor::Preemptor::new(mirror.clone(), client, None);
        let names = vec!["tessera".to_string()];
        let mut times = Vec::new();
        let mut lock_max = 0.0f64;
        while !*stop_rx.borrow() {
            let t = Instant::now();
            crate::preemptor::extender_round(&mut p, &names).await;
            times.push(t.elapsed().as_secs_f64() * 1e3);
            lock_max = lock_max.max(p.longest_lock_hold().as_secs_f64() * 1e3);
            if every.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::select! {
                    _ = stop_rx.changed() => {}
                    _ = tokio::time::sleep(every) => {}
                }
            }
        }
        (times.len(), times, lock_max)
    });
    (stop_tx, task)
}

/// Where the server-side time of one `filter` and one `prioritize` goes
/// (issue 30): medians in microseconds of each part of a verb, timed apart on
/// the same bodies, and of the whole verb through the router (no socket: what
/// a round trip adds beyond it is HTTP and the client).
#[derive(Debug, Clone, Serialize)]
pub struct VerbParts {
    pub nodes: usize,
    /// Cycles timed: parts on even ones, whole verbs on odd ones (through the
    /// router and over a socket in turn), each after the previous pod was
    /// bound (one node changed, as in a live cycle).
    pub iterations: usize,
    pub filter_body_bytes: usize,
    pub filter_answer_bytes: usize,
    /// The verbs' decode of a filter body (UTF-8 check, `ExtenderArgs`).
    pub decode_us: f64,
    /// The same body with the Pod decoded whole by k8s-openapi (managed fields
    /// included), as the verbs did before issue 30.
    pub decode_whole_pod_us: f64,
    /// The same body with the Pod skipped: the node names alone.
    pub decode_names_us: f64,
    /// The candidate list (`ExtenderArgs::candidate_names`).
    pub names_us: f64,
    /// Taking and releasing the mirror's lock, uncontended.
    pub lock_us: f64,
    /// The decision under the lock (`ExtenderState::judge_filter`).
    pub filter_judge_us: f64,
    /// Building and encoding the answer.
    pub filter_encode_us: f64,
    pub prioritize_decode_us: f64,
    pub prioritize_judge_us: f64,
    pub prioritize_encode_us: f64,
    /// Whole verbs through the router: body in, answer bytes out.
    pub filter_us: f64,
    pub prioritize_us: f64,
    /// Whole verbs over loopback HTTP/1.1 with keep-alive (hyper's client,
    /// the body encoded beforehand, the answer read as bytes), nothing else
    /// running; and an empty `GET /healthz` on the same connection.
    pub filter_http_us: f64,
    pub prioritize_http_us: f64,
    pub http_floor_us: f64,
}

impl VerbParts {
    /// A line per verb and one for HTTP, for the benches' output.
    pub fn lines(&self) -> String {
        format!(
            "filter {:.1} µs through the router ({} B body, {} B answer): decode {:.1} µs (Pod whole with managed fields {:.1} µs; node names alone {:.1} µs), candidate list {:.2} µs, lock {:.2} µs, judge {:.1} µs, answer {:.1} µs\n\
             prioritize {:.1} µs through the router: decode {:.1} µs, judge {:.1} µs, answer {:.1} µs ({} nodes, {} cycles)\n\
             over loopback HTTP/1.1 keep-alive, nothing else running: filter {:.1} µs, prioritize {:.1} µs; an empty GET {:.1} µs",
            self.filter_us,
            self.filter_body_bytes,
            self.filter_answer_bytes,
            self.decode_us,
            self.decode_whole_pod_us,
            self.decode_names_us,
            self.names_us,
            self.lock_us,
            self.filter_judge_us,
            self.filter_encode_us,
            self.prioritize_us,
            self.prioritize_decode_us,
            self.prioritize_judge_us,
            self.prioritize_encode_us,
            self.nodes,
            self.iterations,
            self.filter_http_us,
            self.prioritize_http_us,
            self.http_floor_us,
        )
    }
}

/// `ExtenderArgs` as the verbs decoded it before issue 30: the Pod whole.
#[derive(serde::Deserialize)]
struct WholePodArgs<'a> {
    #[serde(rename = "Pod")]
    _pod: k8s_openapi::api::core::v1::Pod,
    #[serde(rename = "NodeNames", borrow)]
    _node_names: Option<Vec<crate::extender::wire::Text<'a>>>,
}

/// A filter body's node names alone.
#[derive(serde::Deserialize)]
struct NamesOnly<'a> {
    #[serde(rename = "Pod")]
    _pod: serde::de::IgnoredAny,
    #[serde(rename = "NodeNames", borrow)]
    _node_names: Option<Vec<crate::extender::wire::Text<'a>>>,
}

/// Each part's samples in microseconds (`p_`: prioritize's).
#[derive(Default)]
struct Samples {
    decode: Vec<f64>,
    whole: Vec<f64>,
    names_only: Vec<f64>,
    names: Vec<f64>,
    lock: Vec<f64>,
    judge: Vec<f64>,
    encode: Vec<f64>,
    p_decode: Vec<f64>,
    p_judge: Vec<f64>,
    p_encode: Vec<f64>,
    filter: Vec<f64>,
    prioritize: Vec<f64>,
    filter_http: Vec<f64>,
    prioritize_http: Vec<f64>,
    http_floor: Vec<f64>,
}

type Client =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// One verb's answer and its time in microseconds: through the router alone
/// (`socket` `None`), or posted over the socket.
async fn verb(
    app: &axum::Router,
    socket: Option<(&Client, std::net::SocketAddr)>,
    path: &str,
    body: Vec<u8>,
) -> Result<(axum::body::Bytes, f64), String> {
    let c = Instant::now();
    let uri = match socket {
        Some((_, addr)) => format!("http://{addr}{path}"),
        None => path.to_string(),
    };
    let req = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .map_err(|e| e.to_string())?;
    let answer = match socket {
        Some((client, _)) => {
            let r = client.request(req).await.map_err(|e| e.to_string())?;
            axum::body::to_bytes(Body::new(r.into_body()), usize::MAX).await
        }
        None => {
            let r = app.clone().oneshot(req).await.map_err(|e| e.to_string())?;
            axum::body::to_bytes(r.into_body(), usize::MAX).await
        }
    }
    .map_err(|e| e.to_string())?;
    Ok((answer, c.elapsed().as_secs_f64() * 1e6))
}

/// Times the parts of `filter` and `prioritize` for `pods` (as kube-scheduler
/// sends them; a pod without a UID gets one) on `nodes` synthetic nodes of 8
/// GPUs, names only (`nodeCacheCapable`). Each pod is bound (untimed) where
/// prioritize ranked it best before the next.
pub async fn verb_parts(pods: &[serde_json::Value], nodes: usize) -> Result<VerbParts, String> {
    use crate::extender::routes::{decode, filter_answer, prioritize_answer};
    use crate::extender::wire::{ExtenderArgs, HostPriority};
    fn us(t: Instant) -> f64 {
        t.elapsed().as_secs_f64() * 1e6
    }
    fn median(v: &mut [f64]) -> f64 {
        v.sort_by(f64::total_cmp);
        quantile(v, 0.5)
    }
    let (kn, gn) = synthetic_objects(nodes);
    let mirror = SharedMirror::new(synthetic_mirror("tessera", kn, gn)?);
    let state = ExtenderState::judging_only(mirror.clone());
    let app = router(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(std::future::IntoFuture::into_future(axum::serve(
        listener,
        app.clone(),
    )));
    let client: Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:05}")).collect();
    let mut t = Samples::default();
    let (mut body_bytes, mut answer_bytes) = (0, 0);
    // The first few cycles warm up, untimed.
    const WARM: usize = 10;
    for (i, sent) in pods.iter().enumerate() {
        let mut sent = sent.clone();
        if sent["metadata"]["uid"].is_null() {
            sent["metadata"]["uid"] = json!(format!("parts-{i}"));
        }
        let body = serde_json::to_vec(&json!({"Pod": sent, "Nodes": null, "NodeNames": names}))
            .map_err(|e| e.to_string())?;
        body_bytes = body.len();
        let timed = i >= WARM;
        let (passed, scores): (Vec<String>, Vec<u8>) = if i % 2 == 0 {
            // The parts, one after the other as the handler runs them.
            let c = Instant::now();
            let args: ExtenderArgs<'_> = decode("filter", &body).map_err(|(_, e)| e)?;
            let d = us(c);
            let c = Instant::now();
            let list = args.candidate_names();
            let l = us(c);
            let c = Instant::now();
            drop(state.mirror.lock());
            let k = us(c);
            let c = Instant::now();
            let outcome = state
                .judge_filter(&args.pod, &list)
                .map_err(|e| e.to_string())?;
            let j = us(c);
            let c = Instant::now();
            let answer = filter_answer(&args, &outcome);
            let e = us(c);
            let answer = axum::body::to_bytes(answer.into_body(), usize::MAX)
                .await
                .map_err(|e| e.to_string())?;
            answer_bytes = answer.len();
            // The two other decodes, for comparison.
            let c = Instant::now();
            let whole: Result<WholePodArgs<'_>, _> = serde_json::from_slice(&body);
            let w = us(c);
            whole.map_err(|e| e.to_string())?;
            let c = Instant::now();
            let only: Result<NamesOnly<'_>, _> = serde_json::from_slice(&body);
            let n = us(c);
            only.map_err(|e| e.to_string())?;
            let passed: Vec<String> = outcome.passed.iter().map(|n| n.to_string()).collect();
            let p_body =
                serde_json::to_vec(&json!({"Pod": sent, "Nodes": null, "NodeNames": passed}))
                    .map_err(|e| e.to_string())?;
            let c = Instant::now();
            let args: ExtenderArgs<'_> = decode("prioritize", &p_body).map_err(|(_, e)| e)?;
            let pd = us(c);
            let list = args.candidate_names();
            let c = Instant::now();
            let scores = state
                .judge_prioritize(&args.pod, &list)
                .map_err(|e| e.to_string())?;
            let pj = us(c);
            let c = Instant::now();
            let answer = prioritize_answer(&scores);
            let pe = us(c);
            let answer = axum::body::to_bytes(answer.into_body(), usize::MAX)
                .await
                .map_err(|e| e.to_string())?;
            if timed {
                for (v, x) in [
                    (&mut t.decode, d),
                    (&mut t.names, l),
                    (&mut t.lock, k),
                    (&mut t.judge, j),
                    (&mut t.encode, e),
                    (&mut t.whole, w),
                    (&mut t.names_only, n),
                    (&mut t.p_decode, pd),
                    (&mut t.p_judge, pj),
                    (&mut t.p_encode, pe),
                ] {
                    v.push(x);
                }
            }
            (passed, answer.to_vec())
        } else {
            // The whole verbs: through the router alone, or over loopback
            // HTTP/1.1 with keep-alive as kube-scheduler calls them.
            let socket = (i % 4 == 3).then_some((&client, addr));
            let (answer, f) = verb(&app, socket, "/filter", body).await?;
            let result: crate::extender::wire::ExtenderFilterResult<'_> =
                serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
            let passed: Vec<String> = result
                .node_names
                .unwrap_or_default()
                .iter()
                .map(|n| n.to_string())
                .collect();
            let p_body =
                serde_json::to_vec(&json!({"Pod": sent, "Nodes": null, "NodeNames": passed}))
                    .map_err(|e| e.to_string())?;
            let (answer, p) = verb(&app, socket, "/prioritize", p_body).await?;
            if timed && socket.is_some() {
                t.filter_http.push(f);
                t.prioritize_http.push(p);
                // The floor: an empty GET on the same connection.
                let c = Instant::now();
                let r = client
                    .get(
                        format!("http://{addr}/healthz")
                            .parse()
                            .map_err(|e| format!("{e}"))?,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                axum::body::to_bytes(Body::new(r.into_body()), usize::MAX)
                    .await
                    .map_err(|e| e.to_string())?;
                t.http_floor.push(us(c));
            } else if timed {
                t.filter.push(f);
                t.prioritize.push(p);
            }
            (passed, answer.to_vec())
        };
        if passed.is_empty() {
            return Err(format!("pod {i}: no node passed filter"));
        }
        // Bind where prioritize ranked best (untimed), as kube-scheduler would.
        let scores: Vec<HostPriority<'_>> =
            serde_json::from_slice(&scores).map_err(|e| e.to_string())?;
        if let Some(best) = scores.iter().max_by_key(|h| h.score) {
            let p: k8s_openapi::api::core::v1::Pod =
                serde_json::from_value(sent).map_err(|e| e.to_string())?;
            let mut m = mirror.lock();
            let _ = m.reserve(&p, &best.host);
            m.mark_accepted(crate::convert::pod_uid(&p));
        }
    }
    server.abort();
    Ok(VerbParts {
        nodes,
        iterations: pods.len().saturating_sub(WARM),
        filter_body_bytes: body_bytes,
        filter_answer_bytes: answer_bytes,
        decode_us: median(&mut t.decode),
        decode_whole_pod_us: median(&mut t.whole),
        decode_names_us: median(&mut t.names_only),
        names_us: median(&mut t.names),
        lock_us: median(&mut t.lock),
        filter_judge_us: median(&mut t.judge),
        filter_encode_us: median(&mut t.encode),
        prioritize_decode_us: median(&mut t.p_decode),
        prioritize_judge_us: median(&mut t.p_judge),
        prioritize_encode_us: median(&mut t.p_encode),
        filter_us: median(&mut t.filter),
        prioritize_us: median(&mut t.prioritize),
        filter_http_us: median(&mut t.filter_http),
        prioritize_http_us: median(&mut t.prioritize_http),
        http_floor_us: median(&mut t.http_floor),
    })
}
