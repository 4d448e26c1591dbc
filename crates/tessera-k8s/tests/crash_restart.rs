//! Crash and restart: Tessera (in-process, `run::run`) places pods against the
//! API-server double while it is killed after a seeded number of its own API
//! writes (before or after the write lands), then restarted with fresh process
//! state, until every pod is bound. Half the processes also get one write
//! committed but answered `504 Timeout`, and every process one write answered
//! `500` without committing it (a client cannot tell the two apart). Afterwards the double's stored objects
//! alone must show no GPU over-committed and a valid grant on every bound GPU
//! pod ([`apiserver::check`]).
//!
//! Both modes: standalone (Tessera binds pods of its own `schedulerName`) and
//! extender, driven by a small kube-scheduler stand-in that keeps running
//! across Tessera's restarts (filter → prioritize → bind over loopback HTTP,
//! concurrent binds, retry with a short backoff when Tessera is down or says no).
//!
//! Knobs (environment): `TESSERA_CRASH_RUNS` (seeds per mode, default 20),
//! `TESSERA_CRASH_PODS` (default 200; 1000 for the full run),
//! `TESSERA_CRASH_NODES` (default 20, 8 GPUs each), `TESSERA_CRASH_SEED`
//! (first seed, default 1), `TESSERA_CRASH_LATENCY_MS` (`lo-hi`, default `0-2`),
//! `TESSERA_CRASH_MAX` (crashes per run at most, default 8; 0 gives a run without crashes),
//! `TESSERA_CRASH_JOBS` (seeds run at once, default 1),
//! `TESSERA_CRASH_UNCOMMITTED` (default `1`: every process also gets one
//! write answered `500` without committing it; `0` leaves it out),
//! `TESSERA_CRASH_LIST_US` (LIST time per item returned, default 100 µs: a
//! restarted scheduler's lists of 1,000 pods take 100 ms, as big lists do).
//! A failure names the seed; rerun it with `TESSERA_CRASH_SEED=<seed> TESSERA_CRASH_RUNS=1`.

mod apiserver;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiserver::check::{Audit, audit};
use apiserver::cluster::{Shape, add_gpu_nodes, bound, node_of, pod};
use apiserver::crash::{Look, Plan, env, fail_on, latency, over_seeds, restarts};
use apiserver::{ApiServer, Config, Fault, Resource};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tessera_k8s::run::RawConfig;
use tokio::sync::watch;

const KEY: &[u8] = b"crash-restart-signing-key";
const NAMESPACE: &str = "work";
/// A run that binds nothing for this long has stalled.
const QUIET: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Standalone,
    Extender,
}

fn config(mode: Mode, key_file: &std::path::Path) -> tessera_k8s::run::Config {
    RawConfig {
        mode: Some(match mode {
            Mode::Standalone => "standalone".into(),
            Mode::Extender => "extender".into(),
        }),
        listen: Some("127.0.0.1:0".into()),
        // Port 0: the harness picks a free one (the default 0.0.0.0:9090 is
        // taken as soon as two schedulers run at once).
        metrics_listen: Some("127.0.0.1:0".into()),
        signing_key_file: Some(key_file.to_path_buf()),
        scheduler_name: Some("tessera".into()),
        leader_elect: Some(false),
        ..RawConfig::default()
    }
    .resolve()
    .expect("valid config")
}

/// 1,000 pods on 20 × 8 GPUs: 6 % whole GPUs (a fifth of them two), 44 % GPU
/// shares of 5–15 % compute and 2–8 GiB, 50 % CPU only. About 70 % of the
/// GPUs' compute is asked for, so every pod fits however they are packed.
fn workload(rng: &mut SmallRng, count: usize, mode: Mode) -> Vec<Value> {
    // Both modes: pods of Tessera's profile (the chart's kube-scheduler has one, `tessera`).
    let scheduler = match mode {
        Mode::Standalone | Mode::Extender => "tessera",
    };
    let mut pods = Vec::with_capacity(count);
    for i in 0..count {
        let roll: f64 = rng.random();
        let (shape, priority) = if roll < 0.06 {
            (Shape::Whole(if rng.random_bool(0.2) { 2 } else { 1 }), 10)
        } else if roll < 0.50 {
            (
                Shape::Share {
                    memory_gib: rng.random_range(2..=8),
                    cores_pct: rng.random_range(5..=15),
                },
                0,
            )
        } else {
            (Shape::CpuOnly, 0)
        };
        let p = pod(
            NAMESPACE,
            &format!("pod-{i:04}"),
            scheduler,
            shape,
            rng.random_range(1..=20) * 50,
            rng.random_range(1..=16) * 256,
            priority,
        );
        pods.push(p);
    }
    pods
}

/// Creates half the pods now and the rest in small batches over the next
/// second or so, so that restarts also meet pods that arrive right then.
fn arrive(server: &ApiServer, mut pods: Vec<Value>) -> tokio::task::JoinHandle<()> {
    let later = pods.split_off(pods.len() / 2);
    for p in &pods {
        server.create(Resource::Pods, p).expect("pod");
    }
    let server = server.clone();
    tokio::spawn(async move {
        for batch in later.chunks(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            for p in batch {
                server.create(Resource::Pods, p).expect("pod");
            }
        }
    })
}

/// A kube-scheduler stand-in for extender mode: one scheduling cycle at a
/// time (filter, prioritize, pick the best), binds in the background.
struct FakeKubeScheduler {
    target: watch::Sender<Option<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> Result<Value, String> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    let call = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let req = http::Request::post(path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(axum::body::Bytes::from(
                serde_json::to_vec(body).unwrap_or_default(),
            )))
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&bytes)));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("decode: {e}"))
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .map_err(|_| "timed out".to_string())?
}

impl FakeKubeScheduler {
    fn spawn(server: ApiServer, nodes: Vec<String>, seed: u64) -> FakeKubeScheduler {
        let (target, rx) = watch::channel(None::<SocketAddr>);
        let task = tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed);
            let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
            let mut backoff: HashMap<String, Instant> = HashMap::new();
            loop {
                if rx.borrow().is_none() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let now = Instant::now();
                let mut pending: Vec<Value> = server
                    .objects::<Value>(Resource::Pods)
                    .into_iter()
                    .filter(|p| node_of(p).is_none())
                    .filter(|p| {
                        let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
                        !in_flight.lock().unwrap().contains(uid)
                            && backoff.get(uid).is_none_or(|t| *t <= now)
                    })
                    .collect();
                if pending.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                pending.sort_by_key(|p| {
                    (
                        -p["spec"]["priority"].as_i64().unwrap_or(0),
                        p["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    )
                });
                for p in pending {
                    // Tessera may have restarted elsewhere meanwhile.
                    let Some(addr) = *rx.borrow() else { break };
                    let uid = p["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    let retry = |backoff: &mut HashMap<String, Instant>, rng: &mut SmallRng| {
                        backoff.insert(
                            uid.clone(),
                            Instant::now() + Duration::from_millis(rng.random_range(20..100)),
                        );
                    };
                    let args = json!({"Pod": p, "Nodes": null, "NodeNames": nodes});
                    let passed = match post(addr, "/scheduler/filter", &args).await {
                        Ok(r) if r["Error"].as_str().unwrap_or_default().is_empty() => {
                            r["NodeNames"]
                                .as_array()
                                .map(|a| {
                                    a.iter()
                                        .filter_map(|n| n.as_str().map(str::to_string))
                                        .collect::<Vec<_>>()
                                })
                                .unwrap_or_default()
                        }
                        _ => Vec::new(),
                    };
                    if passed.is_empty() {
                        retry(&mut backoff, &mut rng);
                        continue;
                    }
                    let args = json!({"Pod": p, "Nodes": null, "NodeNames": passed});
                    let scores: HashMap<String, i64> =
                        match post(addr, "/scheduler/prioritize", &args).await {
                            Ok(Value::Array(a)) => a
                                .iter()
                                .filter_map(|h| {
                                    Some((h["Host"].as_str()?.to_string(), h["Score"].as_i64()?))
                                })
                                .collect(),
                            _ => HashMap::new(),
                        };
                    let best = passed
                        .iter()
                        .map(|n| scores.get(n).copied().unwrap_or(0))
                        .max()
                        .unwrap_or(0);
                    let top: Vec<&String> = passed
                        .iter()
                        .filter(|n| scores.get(*n).copied().unwrap_or(0) == best)
                        .collect();
                    let node = top[rng.random_range(0..top.len())].clone();
                    in_flight.lock().unwrap().insert(uid.clone());
                    let binding = json!({
                        "PodName": p["metadata"]["name"], "PodNamespace": p["metadata"]["namespace"],
                        "PodUID": uid, "Node": node,
                    });
                    let in_flight = in_flight.clone();
                    tokio::spawn(async move {
                        let _ = post(addr, "/scheduler/bind", &binding).await;
                        in_flight.lock().unwrap().remove(&uid);
                    });
                    // Failed binds come back as pending pods after the retry delay.
                    backoff.insert(
                        p["metadata"]["uid"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        Instant::now() + Duration::from_millis(rng.random_range(20..100)),
                    );
                }
            }
        });
        FakeKubeScheduler { target, task }
    }
}

impl Drop for FakeKubeScheduler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What happened in one seeded run.
struct Run {
    seed: u64,
    crashes: Vec<(u64, Fault, u64)>,
    stalled: bool,
    /// `run` ending by itself, which it must not.
    exits: Vec<String>,
    audit: Audit,
    /// How the over-committing binds came about.
    evidence: Vec<String>,
    elapsed: Duration,
}

async fn run_seed(
    seed: u64,
    mode: Mode,
    pods: usize,
    nodes: usize,
    key_file: &std::path::Path,
) -> Run {
    // Crashes per run at most; the run after the last one goes on to the end.
    let max_crashes: usize = env("TESSERA_CRASH_MAX", 8);
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let server = ApiServer::new(Config {
        latency: latency("TESSERA_CRASH_LATENCY_MS", "0-2"),
        seed,
        watch_window: 20_000,
        // Watches end every few seconds, so restarts of watches happen too.
        watch_timeout_cap: Some(Duration::from_millis(rng.random_range(1_000..5_000))),
        list_latency_per_item: Duration::from_micros(env("TESSERA_CRASH_LIST_US", 100)),
    });
    let names = add_gpu_nodes(&server, nodes, 8);
    let arrivals = arrive(&server, workload(&mut rng, pods, mode));
    let base = config(mode, key_file);
    let fake =
        (mode == Mode::Extender).then(|| FakeKubeScheduler::spawn(server.clone(), names, seed));
    // Standalone writes about three times per pod (annotation, binding, event), extender twice.
    let plan = Plan {
        max_crashes,
        span: (pods as u64 * 3 / 4).max(5),
        quiet: QUIET,
        uncommitted: env("TESSERA_CRASH_UNCOMMITTED", 1u8) == 1,
    };
    let run = restarts(
        &server,
        &base,
        &mut rng,
        &plan,
        |process| {
            if let Some(f) = &fake {
                let _ = f.target.send(Some(process.addr));
            }
        },
        || {
            let now = bound(&server);
            Look {
                progress: now as u64,
                done: now == pods,
            }
        },
    )
    .await;
    drop(fake);
    arrivals.abort();
    let audit = audit(&server, KEY);
    let evidence = explain(&server, &audit);
    Run {
        seed,
        crashes: run.crashes,
        stalled: run.stalled,
        exits: run.exits,
        audit,
        evidence,
        elapsed: started.elapsed(),
    }
}

/// For each pod on an over-committed GPU: which process bound it, how long
/// after that process started, and when that process had listed all pods.
fn explain(server: &ApiServer, audit: &Audit) -> Vec<String> {
    let writes = server.writes();
    let ms = |d: Duration| format!("{} ms", d.as_millis());
    let mut lines = Vec::new();
    for (gpu, holders) in &audit.overcommitted {
        for holder in holders {
            let (ns, name) = holder.split_once('/').unwrap_or(("", holder));
            let Some(w) = writes.iter().find(|w| {
                w.namespace == ns && w.name == name && w.subresource == "binding" && w.status == 201
            }) else {
                continue;
            };
            let Some((started, listed)) = server.session_times(w.session) else {
                continue;
            };
            let since = |t: Instant| format!("+{}", ms(t.saturating_duration_since(started)));
            let pods_listed = listed
                .get("pods")
                .map_or_else(|| "never".into(), |t| since(*t));
            // Its first write for the pod (the grant) follows the decision.
            let first = writes
                .iter()
                .find(|x| x.session == w.session && x.namespace == ns && x.name == name)
                .map_or(w.at, |x| x.at);
            lines.push(format!(
                "{gpu}: {holder} granted by process {} at {}, bound at {}; its LIST of all pods was answered at {pods_listed}",
                w.session,
                since(first),
                since(w.at)
            ));
        }
    }
    lines
}

async fn crash_and_restart(mode: Mode) {
    let runs: u64 = env("TESSERA_CRASH_RUNS", 20);
    let pods: usize = env("TESSERA_CRASH_PODS", 200);
    let nodes: usize = env("TESSERA_CRASH_NODES", 20);
    let first: u64 = env("TESSERA_CRASH_SEED", 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, KEY).expect("key file");
    let jobs: usize = env("TESSERA_CRASH_JOBS", 1);
    let started = Instant::now();
    let mut total_crashes = 0;
    let key_file = &key_file;
    let failures = over_seeds(
        first..first + runs,
        jobs,
        |seed| run_seed(seed, mode, pods, nodes, key_file),
        |run: Run| {
            let seed = run.seed;
            total_crashes += run.crashes.len();
            let mut problems = run.audit.violations.clone();
            problems.extend(run.exits.iter().cloned());
            if run.stalled {
                problems.push(format!(
                    "stalled: {} of {} pods bound, nothing bound for {QUIET:?}",
                    run.audit.bound, run.audit.pods
                ));
            }
            eprintln!(
                "{mode:?} seed {seed}: {} crashes (write k, kind, pods bound then) {:?}; {} of {} bound ({} GPU); {} problems; {:.1?}",
                run.crashes.len(),
                run.crashes,
                run.audit.bound,
                run.audit.pods,
                run.audit.bound_gpu,
                problems.len(),
                run.elapsed
            );
            for line in &run.evidence {
                eprintln!("  {line}");
            }
            (seed, problems)
        },
    )
    .await;
    eprintln!(
        "{mode:?}: {runs} runs of {pods} pods on {nodes} nodes, {total_crashes} crashes, {} failed, {:.1?}",
        failures.len(),
        started.elapsed()
    );
    fail_on(
        &format!("{mode:?}"),
        runs,
        &failures,
        "TESSERA_CRASH_SEED=<seed> TESSERA_CRASH_RUNS=1",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_survives_crashes_at_random_writes() {
    crash_and_restart(Mode::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_survives_crashes_at_random_writes() {
    crash_and_restart(Mode::Extender).await;
}
