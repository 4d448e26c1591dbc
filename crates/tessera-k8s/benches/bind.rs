//! Bind throughput against the API-server double over TCP (issue 10).
//!
//! `cargo bench -p tessera-k8s --bench bind` runs Tessera (`run::run`, as the
//! binary runs it) against the double served on loopback over TLS (HTTP/2 and
//! HTTP/1.1 offered by ALPN, as kube-apiserver does) with a per-request
//! latency, and reports per client, mode and pod count: binds per second, the
//! most Binding POSTs in flight at once, TCP connections Tessera opened, and
//! API requests by kind.
//!
//! Clients (`TESSERA_BENCH_CLIENTS`, default `tessera,kube`): `tessera` is
//! what the binary uses ([`tessera_k8s::client`], HTTP/2); `kube` is kube-rs's
//! own (`kube::Client::try_from`, HTTP/1.1 only), what Tessera used before.
//!
//! - `standalone`: Tessera places pods of its own schedulerName.
//! - `extender`: a kube-scheduler stand-in runs one scheduling cycle at a time
//!   (filter → prioritize → best score, over HTTP to Tessera's verbs, node
//!   names only as with `nodeCacheCapable`) and binds in the background, as
//!   kube-scheduler's binding cycle does; a refused bind goes back in its queue.
//!   Each pod is sent as kube-scheduler v1.28 sends it: the Pod of the captured
//!   request `../shared/fixtures/kube-scheduler-v1.28-extender/` (its managed
//!   fields, last-applied annotation, defaulted spec and status) with the
//!   workload's name, UID, schedulerName and resources. The run prints the time
//!   per phase (issue 30): the cycle (filter + prioritize, which kube-scheduler
//!   waits for), each verb's round trip, the client's JSON encode, and the bind
//!   (in the background). Before the runs, the same pods are sent once through
//!   the router in process (`tessera_k8s::bench::verb_parts`, no socket) to
//!   time each verb's server side apart: decode, candidate list, lock, judge,
//!   answer (`TESSERA_BENCH_PARTS`, default 2,000 pods; 0 skips it).
//! - `backlog`: every pod exists before Tessera starts; the clock runs from the
//!   first bind to the last. `stream`: pods are created at `TESSERA_BENCH_RATE`
//!   a second (default 1,000) while Tessera runs; the clock runs from the
//!   first create to the last bind.
//!
//! Knobs: `TESSERA_BENCH_PODS` (default `500,5000`), `TESSERA_BENCH_NODES`
//! (300, 8 GPUs each), `TESSERA_BENCH_LATENCY_MS` (`2-5`),
//! `TESSERA_BENCH_MODES` (`standalone,extender`), `TESSERA_BENCH_ARRIVALS`
//! (`backlog,stream`). Compare builds by running this file on each (see
//! `scripts/bench-bind-compare.sh`).

#[path = "../tests/apiserver/mod.rs"]
#[allow(unused_imports)]
mod apiserver;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apiserver::cluster::{Shape, add_gpu_nodes, bound, pod};
use apiserver::{ApiServer, Config, Resource};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tessera_k8s::run::RawConfig;
use tokio::sync::{Mutex, mpsc};

const NAMESPACE: &str = "bench";
const LIMIT: Duration = Duration::from_secs(600);

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn list<T: std::str::FromStr>(name: &str, default: &str) -> Vec<T> {
    env(name, default)
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn latency() -> (Duration, Duration) {
    let spec = env("TESSERA_BENCH_LATENCY_MS", "2-5");
    let (lo, hi) = spec.split_once('-').unwrap_or((&spec, &spec));
    let ms =
        |s: &str| Duration::from_micros((s.trim().parse::<f64>().unwrap_or(0.0) * 1000.0) as u64);
    (ms(lo), ms(hi))
}

/// The pods: GPU shares of 5–10 % compute and 2–4 GiB (one in ten a whole GPU).
fn workload(n: usize, scheduler: &str) -> Vec<Value> {
    let mut rng = SmallRng::seed_from_u64(7);
    (0..n)
        .map(|i| {
            let shape = if i % 10 == 9 {
                Shape::Whole(1)
            } else {
                Shape::Share {
                    memory_gib: rng.random_range(2..=4),
                    cores_pct: rng.random_range(5..=10),
                }
            };
            pod(
                NAMESPACE,
                &format!("p-{i:05}"),
                scheduler,
                shape,
                100,
                256,
                0,
            )
        })
        .collect()
}

type Http = HttpClient<HttpConnector, Full<axum::body::Bytes>>;

async fn post(http: &Http, addr: SocketAddr, path: &str, body: &Value) -> Result<Value, String> {
    post_bytes(http, addr, path, body.to_string().into_bytes()).await
}

async fn post_bytes(
    http: &Http,
    addr: SocketAddr,
    path: &str,
    body: Vec<u8>,
) -> Result<Value, String> {
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(axum::body::Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), http.request(req))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// Where the extender cycle's time goes (microseconds per call).
#[derive(Default)]
struct Phases {
    cycle: Vec<f64>,
    filter: Vec<f64>,
    prioritize: Vec<f64>,
    encode: Vec<f64>,
    bind: Vec<f64>,
    body_bytes: Vec<f64>,
    /// From the end of one cycle to the start of the next (queue, spawning the
    /// bind, and waiting for a core while the rest of the process runs).
    gap: Vec<f64>,
}

impl Phases {
    fn line(&mut self) -> String {
        fn p50(v: &mut [f64]) -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        }
        fn p99(v: &mut [f64]) -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            v.sort_by(f64::total_cmp);
            v[((v.len() - 1) as f64 * 0.99).round() as usize]
        }
        format!(
            "cycle p50 {:.0} µs p99 {:.0} µs ({} cycles, {:.2} s in all; {:.2} s between cycles): filter {:.0} µs, prioritize {:.0} µs, of which client JSON encode {:.0} µs per request (filter body {:.0} bytes); bind {:.0} µs p99 {:.0} µs (background)",
            p50(&mut self.cycle),
            p99(&mut self.cycle),
            self.cycle.len(),
            self.cycle.iter().sum::<f64>() / 1e6,
            self.gap.iter().sum::<f64>() / 1e6,
            p50(&mut self.filter),
            p50(&mut self.prioritize),
            p50(&mut self.encode),
            p50(&mut self.body_bytes),
            p50(&mut self.bind),
            p99(&mut self.bind),
        )
    }
}

/// `ExtenderArgs` as kube-scheduler marshals it: encoded straight from what it
/// holds, not through an intermediate JSON tree.
#[derive(serde::Serialize)]
struct Args<'a, N: serde::Serialize> {
    #[serde(rename = "Pod")]
    pod: &'a Value,
    #[serde(rename = "Nodes")]
    nodes: Option<()>,
    #[serde(rename = "NodeNames")]
    node_names: &'a [N],
}

/// Encodes `args` (the client's JSON encode, timed apart).
fn encode<N: serde::Serialize>(args: &Args<'_, N>) -> Vec<u8> {
    serde_json::to_vec(args).unwrap_or_default()
}

/// The Pod kube-scheduler v1.28 sent in the captured filter request, if the
/// fixture is at hand (a bench: without it, the workload's own pods are sent).
fn captured_pod() -> Option<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/kube-scheduler-v1.28-extender/filter-request-ExtenderArgs-nodenames.json");
    let text = std::fs::read_to_string(&path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(v["Pod"].clone())
}

/// `p` as kube-scheduler would send it: the captured Pod with `p`'s identity,
/// schedulerName and container resources.
fn as_sent(template: Option<&Value>, p: &Value) -> Value {
    let Some(t) = template else {
        return p.clone();
    };
    let mut out = t.clone();
    for k in ["name", "namespace", "uid", "resourceVersion"] {
        out["metadata"][k] = p["metadata"][k].clone();
    }
    out["spec"]["schedulerName"] = p["spec"]["schedulerName"].clone();
    out["spec"]["containers"][0]["resources"] = p["spec"]["containers"][0]["resources"].clone();
    out
}

/// kube-scheduler's shape: scheduling cycles one at a time, binds in the background.
async fn fake_kube_scheduler(
    addr: SocketAddr,
    nodes: Vec<String>,
    mut arrivals: mpsc::UnboundedReceiver<Value>,
    phases: Arc<std::sync::Mutex<Phases>>,
) {
    let template = captured_pod();
    let mut last_end: Option<Instant> = None;
    let http: Http = HttpClient::builder(TokioExecutor::new()).build_http();
    let queue: Arc<Mutex<VecDeque<Value>>> = Arc::default();
    let binds_left = Arc::new(AtomicUsize::new(0));
    loop {
        while let Ok(p) = arrivals.try_recv() {
            queue.lock().await.push_back(p);
        }
        let next = queue.lock().await.pop_front();
        let Some(p) = next else {
            tokio::select! {
                got = arrivals.recv() => match got {
                    Some(p) => queue.lock().await.push_back(p),
                    None if binds_left.load(Ordering::Relaxed) == 0 && queue.lock().await.is_empty() => return,
                    None => tokio::time::sleep(Duration::from_millis(1)).await,
                },
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            continue;
        };
        let sent = as_sent(template.as_ref(), &p);
        let cycle_start = Instant::now();
        if let Some(end) = last_end {
            phases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .gap
                .push((cycle_start - end).as_secs_f64() * 1e6);
        }
        // Each verb's time includes the client's encode of its body, as
        // kube-scheduler's extender client marshals within the call.
        let t = Instant::now();
        let body = encode(&Args {
            pod: &sent,
            nodes: None,
            node_names: &nodes,
        });
        let encode_us = t.elapsed().as_secs_f64() * 1e6;
        let body_bytes = body.len() as f64;
        let filtered = post_bytes(&http, addr, "/scheduler/filter", body).await;
        let filter_us = t.elapsed().as_secs_f64() * 1e6;
        let passed: Vec<String> = match filtered {
            Ok(r) if r["Error"].as_str().unwrap_or_default().is_empty() => r["NodeNames"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|n| n.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if passed.is_empty() {
            queue.lock().await.push_back(p);
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let t = Instant::now();
        let body = encode(&Args {
            pod: &sent,
            nodes: None,
            node_names: &passed,
        });
        let scored = post_bytes(&http, addr, "/scheduler/prioritize", body).await;
        let prioritize_us = t.elapsed().as_secs_f64() * 1e6;
        last_end = Some(Instant::now());
        {
            let mut ph = phases.lock().unwrap_or_else(|e| e.into_inner());
            ph.cycle.push(cycle_start.elapsed().as_secs_f64() * 1e6);
            ph.filter.push(filter_us);
            ph.prioritize.push(prioritize_us);
            ph.encode.push(encode_us);
            ph.body_bytes.push(body_bytes);
        }
        let best = match scored {
            Ok(Value::Array(a)) => a
                .iter()
                .filter_map(|h| Some((h["Score"].as_i64()?, h["Host"].as_str()?.to_string())))
                .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
                .map(|(_, host)| host),
            _ => None,
        };
        let Some(node) = best else {
            queue.lock().await.push_back(p);
            continue;
        };
        binds_left.fetch_add(1, Ordering::Relaxed);
        let (http, queue, binds_left) = (http.clone(), queue.clone(), binds_left.clone());
        let phases = phases.clone();
        tokio::spawn(async move {
            let args = json!({
                "PodName": p["metadata"]["name"],
                "PodNamespace": p["metadata"]["namespace"],
                "PodUID": p["metadata"]["uid"],
                "Node": node,
            });
            let t = Instant::now();
            let ok = matches!(
                post(&http, addr, "/scheduler/bind", &args).await,
                Ok(r) if r["Error"].as_str().unwrap_or_default().is_empty()
            );
            phases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .bind
                .push(t.elapsed().as_secs_f64() * 1e6);
            if !ok {
                queue.lock().await.push_back(p);
            }
            binds_left.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

struct Outcome {
    bound: usize,
    elapsed: Duration,
    max_binds: i64,
    connections: u64,
    requests: String,
    phases: Option<String>,
}

async fn one_run(
    client_kind: &str,
    mode: &str,
    arrival: &str,
    pods: usize,
    nodes: usize,
    key: &Path,
) -> Outcome {
    let server = ApiServer::new(Config {
        latency: latency(),
        seed: 1,
        watch_window: pods * 4 + 10_000,
        watch_timeout_cap: None,
        list_latency_per_item: Duration::ZERO,
    });
    let names = add_gpu_nodes(&server, nodes, 8);
    let work = workload(pods, "tessera");
    let (arrive_tx, arrive_rx) = mpsc::unbounded_channel::<Value>();
    let mut start = Instant::now();
    if arrival == "backlog" {
        for p in &work {
            let stored = server.create(Resource::Pods, p).expect("pod");
            let _ = arrive_tx.send(stored);
        }
    }
    let listening = server.listen_tls().await;
    let client = match client_kind {
        "kube" => listening.client(),
        _ => tessera_k8s::client::from_config(listening.kube_config()).expect("a client"),
    };
    let config = RawConfig {
        mode: Some(mode.into()),
        listen: Some(format!("127.0.0.1:{}", free_port())),
        metrics_listen: Some(format!("127.0.0.1:{}", free_port())),
        signing_key_file: Some(key.to_path_buf()),
        scheduler_name: Some("tessera".into()),
        leader_elect: Some(false),
        ..RawConfig::default()
    }
    .resolve()
    .expect("valid config");
    let verbs = config.listen;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let tessera = tokio::spawn(tessera_k8s::run::run(config, client, async move {
        let _ = stop_rx.await;
    }));
    let phases = Arc::new(std::sync::Mutex::new(Phases::default()));
    let fake = (mode == "extender").then(|| {
        tokio::spawn(fake_kube_scheduler(
            verbs,
            names.clone(),
            arrive_rx,
            phases.clone(),
        ))
    });
    if arrival == "stream" {
        let rate: f64 = env("TESSERA_BENCH_RATE", "1000").parse().unwrap_or(1000.0);
        start = Instant::now();
        for (i, p) in work.iter().enumerate() {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            let stored = server.create(Resource::Pods, p).expect("pod");
            let _ = arrive_tx.send(stored);
        }
    }
    drop(arrive_tx);
    // Backlog: the clock starts at the first bind.
    let deadline = Instant::now() + LIMIT;
    let mut first_bind = None;
    loop {
        // Binding POSTs so far (cheap); the pods are scanned only once there are
        // enough: scanning 5,000 stored pods every 2 ms took most of a core from
        // the processes measured and held the double's lock meanwhile.
        let posted = server
            .counters()
            .by_request
            .get("create pods/binding")
            .copied()
            .unwrap_or(0);
        if posted > 0 && first_bind.is_none() {
            first_bind = Some(Instant::now());
        }
        if (posted as usize >= pods && bound(&server) == pods) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let end = Instant::now();
    let began = if arrival == "backlog" {
        first_bind.unwrap_or(end)
    } else {
        start
    };
    let counters = server.counters();
    let requests = counters
        .by_request
        .iter()
        .filter(|(k, _)| !k.starts_with("list ") && !k.starts_with("watch "))
        .map(|(k, n)| format!("{}={n}", k.replace(' ', ":")))
        .collect::<Vec<_>>()
        .join(" ");
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(15), tessera).await;
    if let Some(f) = fake {
        f.abort();
    }
    Outcome {
        bound: bound(&server),
        elapsed: end - began,
        max_binds: counters.max_binds_in_flight,
        connections: listening.connections(),
        requests,
        phases: (mode == "extender")
            .then(|| phases.lock().unwrap_or_else(|e| e.into_inner()).line()),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing we use.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("tessera-bench-bind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let key = dir.join("signing.key");
    std::fs::write(&key, "bench-bind-signing-key-0123456789").expect("key");
    let nodes: usize = env("TESSERA_BENCH_NODES", "300").parse().unwrap_or(300);
    let (lo, hi) = latency();
    println!(
        "bind bench: {nodes} nodes x 8 GPUs, API latency {:.1}-{:.1} ms per request, double over TLS (ALPN h2, http/1.1)",
        lo.as_secs_f64() * 1e3,
        hi.as_secs_f64() * 1e3
    );
    let parts: usize = env("TESSERA_BENCH_PARTS", "2000").parse().unwrap_or(2000);
    if parts > 0
        && list::<String>("TESSERA_BENCH_MODES", "standalone,extender")
            .iter()
            .any(|m| m == "extender")
    {
        let template = captured_pod();
        let sent: Vec<Value> = workload(parts, "tessera")
            .iter()
            .map(|p| as_sent(template.as_ref(), p))
            .collect();
        match rt.block_on(tessera_k8s::bench::verb_parts(&sent, nodes)) {
            Ok(r) => println!(
                "extender verbs, server side in process (medians):\n  {}",
                r.lines().replace('\n', "\n  ")
            ),
            Err(e) => println!("extender verbs, server side: failed: {e}"),
        }
    }
    println!(
        "{:<8} {:<11} {:<8} {:>6} {:>7} {:>9} {:>10} {:>13} {:>6}  requests",
        "client", "mode", "arrival", "pods", "bound", "secs", "binds/s", "max in flight", "conns"
    );
    for pods in list::<usize>("TESSERA_BENCH_PODS", "500,5000") {
        for mode in list::<String>("TESSERA_BENCH_MODES", "standalone,extender") {
            for arrival in list::<String>("TESSERA_BENCH_ARRIVALS", "backlog,stream") {
                for client in list::<String>("TESSERA_BENCH_CLIENTS", "tessera,kube") {
                    let o = rt.block_on(one_run(&client, &mode, &arrival, pods, nodes, &key));
                    let secs = o.elapsed.as_secs_f64();
                    println!(
                        "{client:<8} {mode:<11} {arrival:<8} {pods:>6} {:>7} {secs:>9.2} {:>10.0} {:>13} {:>6}  {}",
                        o.bound,
                        o.bound as f64 / secs.max(1e-9),
                        o.max_binds,
                        o.connections,
                        o.requests
                    );
                    if let Some(line) = &o.phases {
                        println!("         {line}");
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
