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
use crate::leader::Leadership;
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
    let policy_box =
        tessera_core::policy::by_name(policy, &Default::default()).map_err(|e| e.to_string())?;
    let (kn, gn) = synthetic_objects(nodes);
    let inventory = gn.clone();
    let mut mirror = Mirror::from_objects(
        policy_box,
        b"bench-signing-key-0123".to_vec(),
        kn,
        gn,
        Vec::new(),
    );
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
    let state = ExtenderState {
        mirror: mirror.clone(),
        binder: None,
        metrics: Arc::new(Metrics::new()),
        leader: Leadership::always(),
        gate: crate::gate::SyncGate::synced(),
        scheduler_names: Arc::from([]),
        peers: None,
    };
    let app = router(state);
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
