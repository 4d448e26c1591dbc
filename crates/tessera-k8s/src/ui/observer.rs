//! The observer: every [`TICK`] it reads the mirror once and turns what it saw
//! into the page's frames (a full mosaic, and a delta of the tiles that
//! changed), the last hour of utilisation and fragmentation, and the
//! chargeback meter's next interval (and its Prometheus counters).
//!
//! One reader for every browser tab: the mirror is locked once per tick, not
//! once per client, and a client that falls behind gets the full frame again.
//! The sampling task holds only a weak reference, so it ends when the router
//! that owns the observer is dropped (the server shut down).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use tessera_core::chargeback::{Holding, Meter};
use tessera_core::request::GpuAsk;
use tokio::sync::broadcast;

use super::mosaic::{self, Names, Tile};
use crate::convert;
use crate::metrics::Metrics;
use crate::mirror::{Mirror, SharedMirror, WorkloadReport};

/// How often the mirror is read.
pub const TICK: Duration = Duration::from_secs(2);
/// One point of the utilisation history every this many milliseconds…
const SERIES_STEP_MS: u64 = 10_000;
/// …for the last hour.
const SERIES_POINTS: usize = 360;
/// Chargeback buckets: 5 minutes, kept 7 days (Prometheus keeps the counters longer).
pub const BUCKET_MS: u64 = 300_000;
pub const BUCKETS_KEPT: usize = 7 * 24 * 12;
/// Pending pods listed on the page (the total is always sent).
const PENDING_SHOWN: usize = 200;
/// Problems listed on the page (the total is always sent).
const PROBLEMS_SHOWN: usize = 100;
/// Pending pods without a scheduler's message whose reason is computed per
/// tick (each is a pass over every node); the rest wait for the next ticks.
const REASONS_PER_TICK: usize = 20;

/// A pending pod: `ns/name`, why, and how long it has waited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingPod {
    #[serde(rename = "p")]
    pub pod: String,
    #[serde(rename = "r")]
    pub reason: String,
    /// Seconds since creation (unknown without a creation time).
    #[serde(rename = "a", skip_serializing_if = "Option::is_none")]
    pub age_s: Option<u64>,
}

/// Cluster-wide figures at one tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub nodes: usize,
    pub gpus: usize,
    pub unhealthy_gpus: usize,
    pub allocated_milli: u64,
    /// Healthy GPUs × 1000.
    pub capacity_milli: u64,
    pub frag_milli: u64,
    pub pending: usize,
    /// Everything the mirror found wrong ([`Mirror::problems`]): nodes blocked
    /// (agent silent, inventory unreadable), grants that do not replay, queue
    /// trees that do not read.
    pub problems: usize,
}

/// One GPU queue's standing (issue 11's `GpuQueue` tree), in milli GPU-equivalents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueRow {
    #[serde(rename = "q")]
    pub name: String,
    /// The parent's name (`None` at the top of the tree).
    #[serde(rename = "up", skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Guaranteed, held, deserved (fair share of what is demanded) and borrowed.
    #[serde(rename = "g")]
    pub guaranteed: u64,
    #[serde(rename = "h")]
    pub allocated: u64,
    #[serde(rename = "d")]
    pub deserved: u64,
    #[serde(rename = "b")]
    pub borrowed: u64,
    /// Pods waiting in it.
    #[serde(rename = "w")]
    pub pending: usize,
}

impl QueueRow {
    fn from_figures(f: crate::mirror::QueueFigures) -> QueueRow {
        QueueRow {
            name: f.name,
            parent: f.parent,
            guaranteed: f.guaranteed.gpu_eq_milli,
            allocated: f.allocated.gpu_eq_milli,
            deserved: f.deserved.gpu_eq_milli,
            borrowed: f.borrowed.gpu_eq_milli,
            pending: f.pending_pods,
        }
    }
}

/// One point of the history: `[unix s, utilisation ‰ of healthy capacity, fragmentation milli-GPU, pending pods]`.
pub type Point = [u64; 4];

/// What the page receives: the whole mosaic (`full`) or what changed (`delta`).
#[derive(Debug, Clone, Serialize)]
pub struct Frame<'a> {
    pub v: u64,
    /// Unix milliseconds.
    pub t: u64,
    /// Namespace table (in a delta only when it grew).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<&'a [String]>,
    /// Every tile (full) or the changed and new ones (delta).
    pub nodes: Vec<&'a Tile>,
    /// Names of tiles gone (delta only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gone: Vec<&'a str>,
    pub pending: &'a [PendingPod],
    /// The first [`PROBLEMS_SHOWN`] of the mirror's problems (the count is in `sum`).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub problems: &'a [String],
    /// The GPU queues, parents before children (empty: no `GpuQueue` exists).
    #[serde(skip_serializing_if = "<[QueueRow]>::is_empty")]
    pub queues: &'a [QueueRow],
    /// The workload the policy scores against (the fragment shown is measured
    /// against it); none in the offline page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<&'a WorkloadReport>,
    pub sum: Summary,
    /// The whole history (full) or its newest points (delta).
    pub series: Vec<Point>,
}

struct Inner {
    namespaces: Names,
    models: Names,
    tiles: Vec<Tile>,
    uuids: Vec<Vec<String>>,
    pending: Vec<PendingPod>,
    sum: Summary,
    series: VecDeque<Point>,
    meter: Meter,
    /// Computed reasons: uid → (mirror state they were computed at, reason).
    reasons: HashMap<String, ((u64, u64), String)>,
    /// The holds' grants as of the last tick.
    copies: crate::accounting::GrantCopies,
}

/// Reads the mirror each tick and keeps what the page and chargeback serve.
pub struct Observer {
    mirror: SharedMirror,
    metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
    full: RwLock<(u64, Arc<str>)>,
    deltas: broadcast::Sender<(u64, Arc<str>)>,
    /// How long the last tick held the mirror's lock in one piece, in µs.
    lock_held_us: std::sync::atomic::AtomicU64,
}

/// Locks `m`, taking the data of a poisoned lock (a panicked tick leaves it consistent).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unix milliseconds now.
pub fn unix_ms() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

impl Observer {
    pub fn new(mirror: SharedMirror, metrics: Arc<Metrics>) -> Arc<Observer> {
        let (deltas, _) = broadcast::channel(16);
        Arc::new(Observer {
            mirror,
            metrics,
            inner: Mutex::new(Inner {
                namespaces: Names::default(),
                models: Names::default(),
                tiles: Vec::new(),
                uuids: Vec::new(),
                pending: Vec::new(),
                sum: Summary::default(),
                series: VecDeque::new(),
                meter: Meter::new(BUCKET_MS, BUCKETS_KEPT),
                reasons: HashMap::new(),
                copies: Default::default(),
            }),
            full: RwLock::new((0, Arc::from("{}"))),
            deltas,
            lock_held_us: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Samples now, then every [`TICK`] on the current tokio runtime (if any)
    /// for as long as the observer is alive.
    pub fn start(self: &Arc<Self>) {
        self.observe(unix_ms());
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Observer> = Arc::downgrade(self);
        rt.spawn(async move {
            let mut every = tokio::time::interval(TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                every.tick().await;
                let Some(o) = weak.upgrade() else { return };
                // Milliseconds of work under the mirror's lock at 1,000 nodes:
                // off the async workers that answer the extender's calls.
                let _ = tokio::task::spawn_blocking(move || o.observe(unix_ms())).await;
            }
        });
    }

    /// One tick at `now_ms` (tests call it to move on without waiting).
    pub fn observe(&self, now_ms: u64) {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        // Under the mirror's lock only copies (O(nodes + holds + pending
        // pods)); the tiles, fragmentation and charges are computed after it.
        let (parts, waiting, state, catalog, workload) = {
            let held_since = std::time::Instant::now();
            let mut m = self.mirror.lock();
            let _timer = HoldTimer(&self.lock_held_us, held_since);
            let parts = mosaic::Parts::take(&mut m, &mut inner.copies);
            let state = (m.generation(), m.ledger().change_cursor());
            let catalog = m.cluster().catalog.clone();
            // The fragment shown is the one the policy minimises.
            let workload = m.target_workload();
            let report = m.workload_report();
            let waiting: Vec<Pod> = m.waiting_pods().cloned().collect();
            let queues: Vec<QueueRow> = m
                .queue_report()
                .into_iter()
                .map(QueueRow::from_figures)
                .collect();
            let problems = m.problems();
            (
                parts,
                (waiting, queues, report, problems),
                state,
                catalog,
                workload,
            )
        };
        let (waiting, queues, report, mut problems) = waiting;
        let n_problems = problems.len();
        problems.truncate(PROBLEMS_SHOWN);
        self.metrics.set_problems(n_problems);
        let (tiles, uuids) =
            mosaic::from_parts(&parts, &mut inner.namespaces, &mut inner.models, &workload);
        let holding = crate::accounting::holding(&parts.cluster, &parts.held);
        let (pending, n_pending) = pending_pods(
            &self.mirror,
            waiting,
            &catalog,
            state,
            &mut inner.reasons,
            now_ms,
        );
        let sum = summarise(&tiles, &holding, n_pending, n_problems);
        let before = inner
            .meter
            .last()
            .map(|(t, h)| (now_ms.saturating_sub(t), h.capacity_milli.clone()));
        let charged = inner.meter.observe(now_ms, holding.clone());
        if let Some((interval_ms, capacity)) = before {
            self.metrics.add_gpu_time(&charged, &capacity, interval_ms);
        }
        let new_point = inner
            .series
            .back()
            .is_none_or(|p| now_ms / 1000 >= p[0] + SERIES_STEP_MS / 1000);
        if new_point {
            inner.series.push_back([
                now_ms / 1000,
                (sum.allocated_milli * 1000)
                    .checked_div(sum.capacity_milli)
                    .unwrap_or(0),
                sum.frag_milli,
                sum.pending as u64,
            ]);
            while inner.series.len() > SERIES_POINTS {
                inner.series.pop_front();
            }
        }

        // The delta against what the clients hold.
        let old: HashMap<&str, &Tile> = inner.tiles.iter().map(|t| (t.name.as_str(), t)).collect();
        let changed: Vec<&Tile> = tiles
            .iter()
            .filter(|t| old.get(t.name.as_str()) != Some(t))
            .collect();
        let now: std::collections::HashSet<&str> = tiles.iter().map(|t| t.name.as_str()).collect();
        let gone: Vec<&str> = inner
            .tiles
            .iter()
            .map(|t| t.name.as_str())
            .filter(|n| !now.contains(n))
            .collect();
        let (seq, _) = *self.full.read().unwrap_or_else(|e| e.into_inner());
        let seq = seq + 1;
        let delta = Frame {
            v: seq,
            t: now_ms,
            ns: Some(&inner.namespaces.table),
            models: Some(&inner.models.table),
            nodes: changed,
            gone,
            pending: &pending,
            problems: &problems,
            queues: &queues,
            workload: Some(&report),
            sum,
            series: if new_point {
                inner.series.back().copied().into_iter().collect()
            } else {
                Vec::new()
            },
        };
        let delta_json: Arc<str> = Arc::from(serde_json::to_string(&delta).unwrap_or_default());
        let full = Frame {
            v: seq,
            t: now_ms,
            ns: Some(&inner.namespaces.table),
            models: Some(&inner.models.table),
            nodes: tiles.iter().collect(),
            gone: Vec::new(),
            pending: &pending,
            problems: &problems,
            queues: &queues,
            workload: Some(&report),
            sum,
            series: inner.series.iter().copied().collect(),
        };
        let full_json: Arc<str> = Arc::from(serde_json::to_string(&full).unwrap_or_default());
        *self.full.write().unwrap_or_else(|e| e.into_inner()) = (seq, full_json);
        // Nobody listening is not an error.
        let _ = self.deltas.send((seq, delta_json));
        inner.tiles = tiles;
        inner.uuids = uuids;
        inner.pending = pending;
        inner.sum = sum;
    }

    /// How long the last tick held the mirror's lock in one piece (the verbs
    /// wait that long at worst); explanations take it again, one pod at a time.
    pub fn last_lock_hold(&self) -> std::time::Duration {
        std::time::Duration::from_micros(
            self.lock_held_us.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The latest full frame and its sequence number.
    pub fn full(&self) -> (u64, Arc<str>) {
        self.full.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<(u64, Arc<str>)> {
        self.deltas.subscribe()
    }

    /// Runs `f` on the chargeback meter.
    pub fn with_meter<T>(&self, f: impl FnOnce(&Meter) -> T) -> T {
        f(&lock(&self.inner).meter)
    }

    /// Nodes, pods and GPU UUIDs containing `query` (case-insensitive), at most `limit`.
    pub fn find(&self, query: &str, limit: usize) -> Vec<Found> {
        let q = query.trim().to_lowercase();
        if q.is_empty() {
            return Vec::new();
        }
        let inner = lock(&self.inner);
        let ns = &inner.namespaces.table;
        let mut out = Vec::new();
        for (tile, uuids) in inner.tiles.iter().zip(&inner.uuids) {
            if tile.name.to_lowercase().contains(&q) {
                out.push(Found {
                    node: tile.name.clone(),
                    gpu: None,
                    what: format!("node {}", tile.name),
                });
            }
            for (i, cell) in tile.gpus.iter().enumerate() {
                if let Some(u) = uuids.get(i).filter(|u| u.to_lowercase().contains(&q)) {
                    out.push(Found {
                        node: tile.name.clone(),
                        gpu: Some(i),
                        what: format!("GPU {u} on {} (#{i})", tile.name),
                    });
                }
                for s in &cell.shares {
                    let namespace = ns.get(s.0 as usize).map_or("", String::as_str);
                    let key = format!("{namespace}/{}", s.2);
                    if key.to_lowercase().contains(&q) {
                        out.push(Found {
                            node: tile.name.clone(),
                            gpu: Some(i),
                            what: format!("pod {key} on {} GPU #{i}", tile.name),
                        });
                    }
                }
            }
            if out.len() >= limit {
                break;
            }
        }
        for p in &inner.pending {
            if p.pod.to_lowercase().contains(&q) {
                out.push(Found {
                    node: String::new(),
                    gpu: None,
                    what: format!("pending pod {}: {}", p.pod, p.reason),
                });
            }
        }
        out.truncate(limit);
        out
    }
}

/// Records the time since its start when dropped (with the lock guard).
struct HoldTimer<'a>(&'a std::sync::atomic::AtomicU64, std::time::Instant);

impl Drop for HoldTimer<'_> {
    fn drop(&mut self) {
        let us = u64::try_from(self.1.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.0.store(us, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A search hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    /// Empty for a pending pod.
    pub node: String,
    pub gpu: Option<usize>,
    pub what: String,
}

fn summarise(tiles: &[Tile], holding: &Holding, pending: usize, problems: usize) -> Summary {
    let gpus: usize = tiles.iter().map(|t| t.gpus.len()).sum();
    Summary {
        nodes: tiles.len(),
        gpus,
        unhealthy_gpus: tiles
            .iter()
            .flat_map(|t| &t.gpus)
            .filter(|c| c.flags & mosaic::UNHEALTHY != 0)
            .count(),
        allocated_milli: holding.milli.values().sum(),
        capacity_milli: holding.capacity_milli.values().sum(),
        frag_milli: tiles.iter().map(|t| u64::from(t.frag_milli)).sum(),
        pending,
        problems,
    }
}

/// GPU pods waiting for a node, oldest first, with why; and how many there are.
///
/// The reason is the scheduler's own word when it wrote one (the pod's
/// `PodScheduled=False` condition, from kube-scheduler or the standalone
/// loop); otherwise Tessera's explanation against the mirror, computed for a
/// few pods per tick (each under its own short hold of the mirror's lock, as
/// one filter call is) and kept until the mirror changes.
fn pending_pods(
    mirror: &SharedMirror,
    waiting: Vec<Pod>,
    catalog: &tessera_core::model::Catalog,
    state: (u64, u64),
    cache: &mut HashMap<String, ((u64, u64), String)>,
    now_ms: u64,
) -> (Vec<PendingPod>, usize) {
    let mut waiting: Vec<(Option<i64>, String, Pod)> = waiting
        .into_iter()
        .filter(|p| match convert::pod_request(p, catalog) {
            Ok(r) => r.gpu != GpuAsk::None,
            Err(_) => convert::wants_gpu(p),
        })
        .map(|p| {
            let created = p
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond());
            (created, convert::pod_key(&p), p)
        })
        .collect();
    waiting.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let total = waiting.len();
    let live: std::collections::HashSet<&str> = waiting
        .iter()
        .map(|(_, _, p)| convert::pod_uid(p))
        .collect();
    cache.retain(|uid, _| live.contains(uid.as_str()));
    let mut budget = REASONS_PER_TICK;
    let mut out = Vec::with_capacity(total.min(PENDING_SHOWN));
    for (created, key, pod) in waiting.iter().take(PENDING_SHOWN) {
        let uid = convert::pod_uid(pod).to_string();
        let reason = match scheduler_message(pod) {
            Some(msg) => msg,
            None => match cache.get(&uid) {
                Some((at, r)) if *at == state || budget == 0 => r.clone(),
                _ if budget == 0 => "not judged yet".to_string(),
                _ => {
                    budget -= 1;
                    let r = explain_reason(&mut mirror.lock(), pod);
                    cache.insert(uid, (state, r.clone()));
                    r
                }
            },
        };
        out.push(PendingPod {
            pod: key.clone(),
            reason,
            age_s: created.map(|c| u64::try_from(now_ms as i64 - c).unwrap_or(0) / 1000),
        });
    }
    (out, total)
}

/// The `PodScheduled=False` condition's message, if a scheduler wrote one.
fn scheduler_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.clone())
        .filter(|m| !m.is_empty())
}

fn explain_reason(m: &mut Mirror, pod: &Pod) -> String {
    use crate::explain::Report;
    match crate::explain::report(m, pod) {
        Report::Pending { sentence, .. } => sentence,
        Report::Invalid { message, .. } => format!("invalid GPU request: {message}"),
        Report::WaitsForQueue { message, .. } => format!("waits for its queue: {message}"),
        Report::WaitsForGang { gang, message, .. } => {
            format!("waits for its gang {gang}: {message}")
        }
        Report::WouldFit { nodes_that_fit, .. } => {
            format!("fits on {nodes_that_fit} node(s) now; waiting for the scheduler's next pass")
        }
        Report::Placed { node, .. } => format!("placed on {node}"),
    }
}
