//! The *replay* experiment: pods arrive at their trace creation time, run for
//! their trace run time and leave; pods that do not fit wait in a queue.
//!
//! - **Time.** Integer seconds. Events (arrivals, departures) sit in a
//!   `BinaryHeap` ordered by (time, sequence number), so equal times keep the
//!   order they were scheduled in. One seeded RNG is passed to the policy (only
//!   `random` uses it).
//! - **Start.** The replay starts at `start_s` (default: the creation time of the
//!   pod at the 0.5th percentile of creation times). On openb `default` that is
//!   9,974,338 s: 26 pods were created months before the other 8,126 (before
//!   9.9 M s); 30 pods created before the start are still alive then and arrive
//!   at time 0 with their remaining run time; 10 pods deleted before the start
//!   are dropped.
//! - **Run time** is deletion − scheduled. Pods that were never scheduled in the
//!   trace (openb's 897 `Pending` pods have no scheduled time) run for
//!   deletion − creation instead; [`ReplayInput::without_scheduled`] counts them.
//!   Run times are at least 1 s.
//! - **Load.** `time_scale` divides the arrival offsets (creation − start) and
//!   leaves run times alone: time-scale 100 offers 100 × the trace's load.
//! - **Queue.** FIFO *with skipping* (backfill): whenever something changes
//!   (a departure or an arrival) the queue is scanned oldest first and every pod
//!   that fits now is placed, so a large pod at the head does not block small
//!   ones behind it — what kube-scheduler's active queue does. A pod that cannot
//!   fit even in the empty cluster is rejected on arrival and counted.
//! - **Metrics.** Queueing delay (start − arrival) of every placed pod: mean, p50,
//!   p95, p99, max and a CDF. Useful GPU utilisation = requested milli-GPU in use /
//!   capacity, and allocated share = GPUs with any tenant / GPUs, both as
//!   time-weighted means over the *arrival window* (time 0 to the last arrival,
//!   when the offered load is on) and as a time series. Completed pods: in the
//!   window and in total (the run drains, so every placed pod completes).
//!
//! - **Policy knowledge.** A policy that learns its workload (`tessera`) starts
//!   from the generic cold-start prior and learns every pod as it arrives, and
//!   is rebuilt each time the learned target moves: what the Kubernetes
//!   scheduler knows on a new cluster. Policies that do not learn (FGD) get the
//!   trace's typical pods ([`ReplayInput::workload`]), as in the fill.
//!
//! Speed: a pod shape that did not fit is only retried on the nodes that changed
//! since (the ledger's change log), so a long queue costs little per event.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use serde::Serialize;
use tessera_core::Scheduler;
use tessera_core::fit::NodeView;
use tessera_core::frag::TargetWorkload;
use tessera_core::judge::judge;
use tessera_core::ledger::{AllocId, Ledger, LedgerError};
use tessera_core::model::{Cluster, NodeId};
use tessera_core::policy::{Policy, UnknownPolicy};
use tessera_core::request::Request;

use super::cost::{CostMeter, ReplayCost, occupancy};
use super::learner::Learner;
use crate::trace::TracePod;

/// A pod as the replay sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplayPod {
    /// Creation − start, unscaled (0 for pods created before the start).
    pub(crate) offset_s: u64,
    pub(crate) run_s: u64,
    pub(crate) shape: u32,
}

/// A trace made ready for replay (shared by every policy and time-scale).
#[derive(Debug, Clone)]
pub struct ReplayInput {
    pub(crate) pods: Vec<ReplayPod>,
    pub(crate) shapes: Vec<Request>,
    /// Trace time the replay starts at.
    pub start_s: u64,
    /// Pods that run for deletion − creation because the trace has no scheduled time.
    pub without_scheduled: usize,
    /// Pods deleted before the start (left out).
    pub dropped_before_start: usize,
    /// Pods created before the start (arrive at time 0).
    pub present_at_start: usize,
    /// The trace's typical pods (FGD's target workload), for policies that measure
    /// fragmentation and do not learn it.
    pub workload: Arc<TargetWorkload>,
}

impl ReplayInput {
    pub fn len(&self) -> usize {
        self.pods.len()
    }
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("pod {pod}: the replay needs creation and deletion times (this trace format has none)")]
    NoTimes { pod: String },
    #[error("pod {pod}: deletion time {deletion_s} is before creation time {creation_s}")]
    DeletedBeforeCreated {
        pod: String,
        creation_s: u64,
        deletion_s: u64,
    },
    #[error("the trace has no pods to replay")]
    NoPods,
    #[error("time scale {0} must be a positive number")]
    BadTimeScale(f64),
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
    /// The scheduler proposed a placement the ledger refused: a bug, never a normal outcome.
    #[error("placement refused by the ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// The default start: creation time of the pod at the 0.5th percentile.
pub fn default_start(pods: &[TracePod]) -> Option<u64> {
    let mut c: Vec<u64> = pods.iter().filter_map(|p| p.creation_s).collect();
    if c.is_empty() {
        return None;
    }
    c.sort_unstable();
    Some(c[c.len() / 200])
}

/// Checks the times and turns the trace into replay pods, in creation order
/// (ties by position in the file).
pub fn prepare(pods: &[TracePod], start_s: Option<u64>) -> Result<ReplayInput, ReplayError> {
    if pods.is_empty() {
        return Err(ReplayError::NoPods);
    }
    for p in pods {
        let (Some(c), Some(d)) = (p.creation_s, p.deletion_s) else {
            return Err(ReplayError::NoTimes {
                pod: p.name.clone(),
            });
        };
        if d < c {
            return Err(ReplayError::DeletedBeforeCreated {
                pod: p.name.clone(),
                creation_s: c,
                deletion_s: d,
            });
        }
    }
    let start = start_s.or_else(|| default_start(pods)).unwrap_or(0);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by_key(|&i| (pods[i].creation_s, i));
    let mut shape_ids: FxHashMap<&Request, u32> = FxHashMap::default();
    let mut shapes = Vec::new();
    let mut out = Vec::with_capacity(pods.len());
    let (mut without_scheduled, mut dropped, mut present) = (0, 0, 0);
    for i in order {
        let p = &pods[i];
        let (c, d) = (p.creation_s.unwrap_or(0), p.deletion_s.unwrap_or(0));
        if d < start {
            dropped += 1;
            continue;
        }
        let began = match p.scheduled_s {
            Some(s) => s.clamp(c, d),
            None => {
                without_scheduled += 1;
                c
            }
        };
        let (offset_s, run_s) = if c < start {
            present += 1;
            (0, d - began.max(start))
        } else {
            (c - start, d - began)
        };
        let next = shapes.len() as u32;
        let shape = *shape_ids.entry(&p.request).or_insert(next);
        if shape == next {
            shapes.push(p.request.clone());
        }
        out.push(ReplayPod {
            offset_s,
            run_s: run_s.max(1),
            shape,
        });
    }
    if out.is_empty() {
        return Err(ReplayError::NoPods);
    }
    let workload = crate::experiment::fill::typical_pods(pods, 0.95);
    Ok(ReplayInput {
        pods: out,
        shapes,
        start_s: start,
        without_scheduled,
        dropped_before_start: dropped,
        present_at_start: present,
        workload: Arc::new(workload),
    })
}

/// How a replay runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayOptions {
    /// Divides arrival offsets (1 = the trace's own pace).
    pub time_scale: f64,
    /// Points in the utilisation time series (over the arrival window).
    pub series_points: usize,
    /// Points in the queueing-delay CDF.
    pub cdf_points: usize,
    /// Replays the trace's arrivals this many times back to back (1 = once). Each
    /// cycle starts one second after the previous cycle's last arrival, so the
    /// offered load can be held long enough for long-running pods to pile up.
    pub cycles: u32,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            time_scale: 1.0,
            series_points: 200,
            cdf_points: 101,
            cycles: 1,
        }
    }
}

/// Queueing delay statistics over placed pods, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct DelayStats {
    pub mean_s: f64,
    pub p50_s: u64,
    pub p95_s: u64,
    pub p99_s: u64,
    pub max_s: u64,
    /// Pods that waited at all.
    pub waited: usize,
}

/// One point of the time series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeriesPoint {
    pub t_s: u64,
    /// Requested milli-GPU in use / capacity, %.
    pub util_pct: f64,
    /// GPUs with any tenant / GPUs, %.
    pub alloc_share_pct: f64,
    /// Pods waiting.
    pub queued: usize,
}

/// What one replay measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayResult {
    pub workload: String,
    pub policy: String,
    pub seed: u64,
    pub time_scale: f64,
    pub cycles: u32,
    /// Trace time the replay started at.
    pub start_s: u64,
    pub capacity_gpus: usize,
    pub pods: usize,
    pub placed: usize,
    /// Pods that fit nowhere even in the empty cluster.
    pub rejected: usize,
    /// Pods still waiting when nothing was left to free capacity (0 unless rejected ones).
    pub never_placed: usize,
    /// Pods that finished by the end of the arrival window.
    pub completed_in_window: usize,
    /// Pods that finished in total (the run drains).
    pub completed: usize,
    /// Last arrival (end of the arrival window), seconds from the start.
    pub window_s: u64,
    /// Time the last pod left.
    pub makespan_s: u64,
    pub delay: DelayStats,
    /// Time-weighted mean over the arrival window, %.
    pub util_mean_pct: f64,
    pub alloc_share_mean_pct: f64,
    pub util_peak_pct: f64,
    pub alloc_share_peak_pct: f64,
    pub queue_peak: usize,
    pub series: Vec<SeriesPoint>,
    /// GPU-hours billed, occupied and powered over the whole run (see [`super::cost`]).
    pub cost: ReplayCost,
    /// `[delay_s, fraction of placed pods with delay ≤ delay_s]`.
    pub delay_cdf: Vec<(u64, f64)>,
    /// Times a policy that learns its workload was rebuilt because the learned target
    /// moved (0 for a policy that does not learn).
    pub policy_rebuilds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(u32),
    Depart(u64),
}

struct Engine<'a> {
    cluster: &'a Cluster,
    input: &'a ReplayInput,
    ledger: Ledger,
    scheduler: Scheduler,
    /// What a learning policy has learned, and how to rebuild it.
    learner: Learner,
    rebuilds: u64,
    rng: SmallRng,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    queue: Vec<u32>,
    arrival: Vec<u64>,
    /// Per shape: the ledger's change cursor when it last failed to fit.
    failed_at: Vec<Option<u64>>,
    /// Per shape: the pass it last failed in.
    failed_pass: Vec<u64>,
    /// Per shape: fits in the empty cluster at all (`None`: not asked yet).
    fits_empty: Vec<Option<bool>>,
    pass: u64,
    held_gpus: u64,
    delays: Vec<u64>,
    rejected: usize,
    completed: usize,
    completed_in_window: usize,
    cost: CostMeter,
}

impl Engine<'_> {
    /// Learns an arriving pod; rebuilds the policy when the learned target or the free
    /// GPU supply moved (and forgets which shapes failed: the new policy has not
    /// judged them).
    fn learn(&mut self, shape: u32) -> Result<(), ReplayError> {
        if self
            .learner
            .observe(&self.input.shapes[shape as usize], &self.ledger)
        {
            self.scheduler = Scheduler::new(self.learner.policy()?);
            self.failed_at.fill(None);
            self.rebuilds += 1;
        }
        Ok(())
    }

    fn push(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, e)));
    }

    fn held_on(&self, node: NodeId) -> u64 {
        let n = self.ledger.node(node);
        (n.gpus.len() - n.idle_gpus()) as u64
    }

    fn fits_empty(&mut self, shape: u32) -> bool {
        if let Some(b) = self.fits_empty[shape as usize] {
            return b;
        }
        let input = self.input;
        let req = &input.shapes[shape as usize];
        let ok = fits_when_empty(self.cluster, self.scheduler.policy(), &mut self.rng, req);
        self.fits_empty[shape as usize] = Some(ok);
        ok
    }

    /// Tries to place pod `i` now.
    fn try_place(&mut self, i: u32, t: u64) -> Result<bool, ReplayError> {
        let pod = self.input.pods[i as usize % self.input.pods.len()];
        let s = pod.shape as usize;
        if self.failed_pass[s] == self.pass {
            return Ok(false);
        }
        let input = self.input;
        let req = &input.shapes[s];
        if let Some(cursor) = self.failed_at[s]
            && let Some(changed) = self.ledger.changes_since(cursor)
        {
            let any = changed.iter().any(|&n| {
                accepts(
                    self.cluster,
                    &self.ledger,
                    self.scheduler.policy(),
                    &mut self.rng,
                    n,
                    req,
                )
            });
            if !any {
                self.failed_at[s] = Some(self.ledger.change_cursor());
                self.failed_pass[s] = self.pass;
                return Ok(false);
            }
        }
        match self
            .scheduler
            .place(self.cluster, &self.ledger, req, &mut self.rng)
        {
            Some(p) => {
                let before = self.held_on(p.node);
                let occupied = occupancy(&self.ledger, p.node);
                let id = self.ledger.apply(self.cluster, &p)?;
                self.held_gpus = self.held_gpus + self.held_on(p.node) - before;
                let now = occupancy(&self.ledger, p.node);
                self.cost.change(self.cluster, &p, 1, occupied, now);
                self.failed_at[s] = None;
                self.delays.push(t - self.arrival[i as usize]);
                self.push(t + pod.run_s, Event::Depart(id.0));
                Ok(true)
            }
            None => {
                self.failed_at[s] = Some(self.ledger.change_cursor());
                self.failed_pass[s] = self.pass;
                Ok(false)
            }
        }
    }

    fn schedule_pass(&mut self, t: u64) -> Result<(), ReplayError> {
        self.pass += 1;
        let queue = std::mem::take(&mut self.queue);
        let mut keep = Vec::with_capacity(queue.len());
        for i in queue {
            if !self.try_place(i, t)? {
                keep.push(i);
            }
        }
        self.queue = keep;
        Ok(())
    }
}

/// Whether some node of the empty cluster takes `req` (a pod that fits nowhere
/// even then is rejected on arrival).
pub(crate) fn fits_when_empty(
    cluster: &Cluster,
    policy: &dyn Policy,
    rng: &mut SmallRng,
    req: &Request,
) -> bool {
    let empty = Ledger::new(cluster);
    cluster
        .ids()
        .any(|id| accepts(cluster, &empty, policy, rng, id, req))
}

/// Whether `node` passes the filter and the policy for `req` (the core's judge;
/// a policy that draws from the RNG draws once, as a decision would).
pub(crate) fn accepts(
    cluster: &Cluster,
    ledger: &Ledger,
    policy: &dyn Policy,
    rng: &mut SmallRng,
    node: NodeId,
    req: &Request,
) -> bool {
    judge(policy, NodeView::of(cluster, ledger, node), req, rng).is_ok()
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    // Nearest rank.
    let rank = (p * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Replays `input` on `cluster` with the policy named `policy_name`.
pub fn run_replay(
    cluster: &Cluster,
    input: &ReplayInput,
    workload_name: &str,
    policy_name: &str,
    seed: u64,
    opts: &ReplayOptions,
) -> Result<ReplayResult, ReplayError> {
    if !(opts.time_scale.is_finite() && opts.time_scale > 0.0) {
        return Err(ReplayError::BadTimeScale(opts.time_scale));
    }
    if input.pods.is_empty() {
        return Err(ReplayError::NoPods);
    }
    let mut learner = Learner::start(cluster, policy_name, input.workload.clone())?;
    let scheduler = Scheduler::new(learner.policy()?);
    let once: Vec<u64> = input
        .pods
        .iter()
        .map(|p| (p.offset_s as f64 / opts.time_scale).floor() as u64)
        .collect();
    let cycle_s = once.iter().copied().max().unwrap_or(0) + 1;
    let arrival: Vec<u64> = (0..u64::from(opts.cycles.max(1)))
        .flat_map(|k| once.iter().map(move |&a| k * cycle_s + a))
        .collect();
    let window_s = arrival.iter().copied().max().unwrap_or(0);
    let arrival_len = arrival.len();
    let n_shapes = input.shapes.len();
    let mut e = Engine {
        cluster,
        input,
        ledger: Ledger::new(cluster),
        scheduler,
        learner,
        rebuilds: 0,
        rng: SmallRng::seed_from_u64(seed),
        heap: BinaryHeap::new(),
        seq: 0,
        queue: Vec::new(),
        arrival,
        failed_at: vec![None; n_shapes],
        failed_pass: vec![0; n_shapes],
        fits_empty: vec![None; n_shapes],
        pass: 0,
        held_gpus: 0,
        delays: Vec::with_capacity(arrival_len),
        rejected: 0,
        completed: 0,
        completed_in_window: 0,
        cost: CostMeter::new(cluster),
    };
    for i in 0..arrival_len {
        let t = e.arrival[i];
        e.push(t, Event::Arrive(i as u32));
    }

    let cap_milli = (cluster.gpu_count() as f64 * 1000.0).max(1.0);
    let cap_gpus = (cluster.gpu_count() as f64).max(1.0);
    let step = (window_s / opts.series_points.max(1) as u64).max(1);
    let mut series = Vec::new();
    let mut next_sample = 0u64;
    let (mut util_int, mut held_int) = (0f64, 0f64);
    let (mut util_peak, mut held_peak, mut queue_peak) = (0f64, 0f64, 0usize);
    let mut last_t = 0u64;
    let mut makespan = 0u64;

    while let Some(&Reverse((t, _, _))) = e.heap.peek() {
        // The state is constant on [last_t, t): integrate and sample it.
        let util = e.ledger.used_milli() as f64 / cap_milli * 100.0;
        let held = e.held_gpus as f64 / cap_gpus * 100.0;
        let lo = last_t.min(window_s);
        let hi = t.min(window_s);
        util_int += util * (hi - lo) as f64;
        held_int += held * (hi - lo) as f64;
        while next_sample < t && next_sample <= window_s {
            series.push(SeriesPoint {
                t_s: next_sample,
                util_pct: util,
                alloc_share_pct: held,
                queued: e.queue.len(),
            });
            next_sample += step;
        }
        last_t = t;
        e.cost.advance(t);
        while let Some(&Reverse((tt, _, ev))) = e.heap.peek() {
            if tt != t {
                break;
            }
            e.heap.pop();
            match ev {
                Event::Arrive(i) => {
                    let shape = e.input.pods[i as usize % e.input.pods.len()].shape;
                    e.learn(shape)?;
                    if e.fits_empty(shape) {
                        e.queue.push(i);
                    } else {
                        e.rejected += 1;
                    }
                }
                Event::Depart(id) => {
                    let node = e
                        .ledger
                        .allocation(AllocId(id))
                        .map(|p| p.node)
                        .ok_or(LedgerError::UnknownAllocation(AllocId(id)))?;
                    let before = e.held_on(node);
                    let occupied = occupancy(&e.ledger, node);
                    let p = e.ledger.release(AllocId(id))?;
                    e.held_gpus = e.held_gpus + e.held_on(node) - before;
                    let now = occupancy(&e.ledger, node);
                    e.cost.change(cluster, &p, -1, occupied, now);
                    e.completed += 1;
                    if t <= window_s {
                        e.completed_in_window += 1;
                    }
                    makespan = makespan.max(t);
                }
            }
        }
        e.schedule_pass(t)?;
        util_peak = util_peak.max(e.ledger.used_milli() as f64 / cap_milli * 100.0);
        held_peak = held_peak.max(e.held_gpus as f64 / cap_gpus * 100.0);
        queue_peak = queue_peak.max(e.queue.len());
    }
    // The window's tail when the last arrival coincides with the last event.
    while next_sample <= window_s {
        series.push(SeriesPoint {
            t_s: next_sample,
            util_pct: 0.0,
            alloc_share_pct: 0.0,
            queued: e.queue.len(),
        });
        next_sample += step;
    }

    let mut delays = std::mem::take(&mut e.delays);
    delays.sort_unstable();
    let placed = delays.len();
    let mean_s = if placed == 0 {
        0.0
    } else {
        delays.iter().sum::<u64>() as f64 / placed as f64
    };
    let delay = DelayStats {
        mean_s,
        p50_s: percentile(&delays, 0.50),
        p95_s: percentile(&delays, 0.95),
        p99_s: percentile(&delays, 0.99),
        max_s: delays.last().copied().unwrap_or(0),
        waited: delays.iter().filter(|&&d| d > 0).count(),
    };
    let cdf_n = opts.cdf_points.max(2);
    let delay_cdf = if placed == 0 {
        Vec::new()
    } else {
        (0..cdf_n)
            .map(|k| {
                let f = k as f64 / (cdf_n - 1) as f64;
                (percentile(&delays, f), f)
            })
            .collect()
    };
    let (util_mean, held_mean) = if window_s > 0 {
        (util_int / window_s as f64, held_int / window_s as f64)
    } else {
        (util_peak, held_peak)
    };
    let cost = std::mem::replace(&mut e.cost, CostMeter::new(cluster)).finish(last_t);
    Ok(ReplayResult {
        cost,
        workload: workload_name.to_string(),
        policy: policy_name.to_string(),
        seed,
        time_scale: opts.time_scale,
        start_s: input.start_s,
        capacity_gpus: cluster.gpu_count(),
        pods: arrival_len,
        cycles: opts.cycles.max(1),
        placed,
        rejected: e.rejected,
        never_placed: e.queue.len(),
        completed_in_window: e.completed_in_window,
        completed: e.completed,
        window_s,
        makespan_s: makespan,
        delay,
        util_mean_pct: util_mean,
        alloc_share_mean_pct: held_mean,
        util_peak_pct: util_peak,
        alloc_share_peak_pct: held_peak,
        queue_peak,
        series,
        delay_cdf,
        policy_rebuilds: e.rebuilds,
    })
}

/// The result of a sustainable-load search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SustainableLoad {
    pub workload: String,
    pub policy: String,
    /// The bound on mean queueing delay, seconds.
    pub bound_s: f64,
    /// Highest time-scale found with mean delay ≤ bound (0 if even the lowest probe failed).
    pub time_scale: f64,
    /// Mean delay at that time-scale.
    pub mean_delay_s: f64,
    pub cycles: u32,
    /// Every probe `(time_scale, mean delay s)`, in the order run.
    pub probes: Vec<(f64, f64)>,
}

/// Searches the highest time-scale at which the mean queueing delay stays ≤ `bound_s`:
/// doubles from `from` until the bound breaks (or `max` is reached), then bisects in
/// log space `refine` times (each halving the ratio between the bracket's ends).
#[allow(clippy::too_many_arguments)]
pub fn sustainable_load(
    cluster: &Cluster,
    input: &ReplayInput,
    workload_name: &str,
    policy_name: &str,
    seed: u64,
    bound_s: f64,
    from: f64,
    max: f64,
    refine: u32,
    cycles: u32,
) -> Result<SustainableLoad, ReplayError> {
    let mut probes = Vec::new();
    let mut probe = |scale: f64| -> Result<f64, ReplayError> {
        let opts = ReplayOptions {
            time_scale: scale,
            series_points: 1,
            cdf_points: 2,
            cycles,
        };
        let r = run_replay(cluster, input, workload_name, policy_name, seed, &opts)?;
        probes.push((scale, r.delay.mean_s));
        Ok(r.delay.mean_s)
    };
    let (mut good, mut good_delay) = (0.0, f64::NAN);
    let mut bad = None;
    let mut s = from;
    loop {
        let d = probe(s)?;
        if d <= bound_s {
            (good, good_delay) = (s, d);
            if s >= max {
                break;
            }
            s = (s * 2.0).min(max);
        } else {
            bad = Some(s);
            break;
        }
    }
    if let Some(mut hi) = bad
        && good > 0.0
    {
        for _ in 0..refine {
            let mid = (good * hi).sqrt();
            let d = probe(mid)?;
            if d <= bound_s {
                (good, good_delay) = (mid, d);
            } else {
                hi = mid;
            }
        }
    }
    Ok(SustainableLoad {
        workload: workload_name.to_string(),
        policy: policy_name.to_string(),
        bound_s,
        time_scale: good,
        mean_delay_s: good_delay,
        cycles,
        probes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::model::{Catalog, Node};

    fn pod(name: &str, req: Request, c: u64, d: u64) -> TracePod {
        TracePod {
            name: name.to_string(),
            request: req,
            creation_s: Some(c),
            deletion_s: Some(d),
            scheduled_s: Some(c),
        }
    }

    /// `n` shares of `milli` (CPU milli and memory MiB `cpu_mem`), pod `i` created
    /// at `i` and deleted `run_s` later.
    fn shares(n: u64, milli: u32, cpu_mem: u64, run_s: u64) -> Vec<TracePod> {
        (0..n)
            .map(|i| {
                let req = Request::share_milli(milli, cpu_mem, cpu_mem);
                pod(&format!("s{i}"), req, i, i + run_s)
            })
            .collect()
    }

    fn one_t4_node() -> Cluster {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        Cluster::new(cat, vec![Node::uniform("n", 16_000, 64_000, t4, 2)]).unwrap()
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        assert_eq!(percentile(&v, 0.5), 5);
        assert_eq!(percentile(&v, 0.95), 10);
        assert_eq!(percentile(&v, 0.0), 1);
    }

    #[test]
    fn start_rule_and_early_pods() {
        // 400 pods from t=1000, plus one created at 0 that lives to 1500 and one gone by 500.
        let mut pods = vec![
            pod("early", Request::whole(1, 1000, 1000), 0, 1500),
            pod("gone", Request::whole(1, 1000, 1000), 0, 500),
        ];
        for i in 0..400 {
            pods.push(pod(
                &format!("p{i}"),
                Request::whole(1, 1000, 1000),
                1000 + i,
                2000 + i,
            ));
        }
        let input = prepare(&pods, None).unwrap();
        // 402 creation times sorted; index 402/200 = 2 is the first pod at 1000.
        assert_eq!(input.start_s, 1000);
        assert_eq!(input.dropped_before_start, 1);
        assert_eq!(input.present_at_start, 1);
        assert_eq!(input.len(), 401);
        // The early pod arrives at 0 and runs its remaining 500 s.
        assert_eq!(
            input.pods[0],
            ReplayPod {
                offset_s: 0,
                run_s: 500,
                shape: 0
            }
        );
    }

    /// Tessera starts from the cold-start prior and learns the arrivals (a shape the
    /// prior does not hold moves the target, and the policy is rebuilt); FGD keeps
    /// the trace's typical pods.
    #[test]
    fn tessera_learns_the_arrivals_and_fgd_does_not() {
        let c = one_t4_node();
        let pods = shares(600, 300, 500, 1);
        let input = prepare(&pods, Some(0)).unwrap();
        let o = ReplayOptions::default();
        let t = run_replay(&c, &input, "t", "tessera", 1, &o).unwrap();
        let f = run_replay(&c, &input, "t", "fgd", 1, &o).unwrap();
        assert!(t.policy_rebuilds > 0, "tessera never rebuilt");
        assert_eq!(f.policy_rebuilds, 0);
        assert_eq!((t.placed, f.placed), (600, 600));
    }

    #[test]
    fn missing_times_are_an_error() {
        let mut p = pod("x", Request::whole(1, 0, 0), 0, 10);
        p.deletion_s = None;
        assert!(matches!(
            prepare(&[p], None),
            Err(ReplayError::NoTimes { .. })
        ));
    }

    /// Two whole-GPU pods of 100 s on a 2-GPU node, then a third: it waits until
    /// the first leaves (100 s after it arrived at 0, it arrived at 10: delay 90).
    #[test]
    fn fifo_queue_waits_for_capacity() {
        let c = one_t4_node();
        let pods = vec![
            pod("a", Request::whole(1, 1000, 1000), 0, 100),
            pod("b", Request::whole(1, 1000, 1000), 5, 205),
            pod("c", Request::whole(1, 1000, 1000), 10, 20),
        ];
        let input = prepare(&pods, Some(0)).unwrap();
        let r = run_replay(&c, &input, "t", "tessera", 1, &ReplayOptions::default()).unwrap();
        assert_eq!(r.placed, 3);
        // Delays 0, 0, 90: mean 30.
        assert_eq!(r.delay.max_s, 90);
        assert_eq!(r.delay.mean_s, 30.0);
        assert_eq!(r.delay.waited, 1);
        // c runs 100..110; everything is gone at 205.
        assert_eq!(r.makespan_s, 205);
        assert_eq!(r.completed, 3);
    }

    /// Skipping: an 2-GPU pod at the head waits; a 1-GPU pod behind it goes first.
    #[test]
    fn small_pods_pass_a_blocked_head() {
        let c = one_t4_node();
        let pods = vec![
            pod("a", Request::whole(1, 1000, 1000), 0, 100),
            pod("big", Request::whole(2, 1000, 1000), 1, 51),
            pod("small", Request::whole(1, 1000, 1000), 2, 12),
        ];
        let input = prepare(&pods, Some(0)).unwrap();
        let r = run_replay(&c, &input, "t", "binpack", 1, &ReplayOptions::default()).unwrap();
        // small: delay 0 (runs 2..12); big waits for a (t=100): delay 99.
        assert_eq!(r.delay.max_s, 99);
        assert_eq!(r.delay.waited, 1);
    }

    /// Shares: k8s-default holds a whole GPU per share, tessera packs them.
    #[test]
    fn shares_queue_under_k8s_default_only() {
        let c = one_t4_node();
        let pods = shares(4, 400, 1000, 100);
        let input = prepare(&pods, Some(0)).unwrap();
        let o = ReplayOptions::default();
        let k = run_replay(&c, &input, "t", "k8s-default", 1, &o).unwrap();
        let t = run_replay(&c, &input, "t", "tessera", 1, &o).unwrap();
        // k8s-default: s2 waits for s0 (arrived 2, starts 100: 98), s3 for s1 (3 → 101: 98).
        assert_eq!(k.delay.max_s, 98);
        assert_eq!(k.delay.waited, 2);
        // tessera: 2 × 400 per GPU, all four fit at once.
        assert_eq!(t.delay.waited, 0);
        assert!(t.alloc_share_peak_pct <= 100.0);
        assert_eq!(t.util_peak_pct, 80.0);
    }

    #[test]
    fn a_pod_that_never_fits_is_rejected() {
        let c = one_t4_node();
        let pods = vec![
            pod("huge", Request::whole(4, 1000, 1000), 0, 10),
            pod("ok", Request::whole(1, 1000, 1000), 1, 10),
        ];
        let input = prepare(&pods, Some(0)).unwrap();
        let r = run_replay(&c, &input, "t", "tessera", 1, &ReplayOptions::default()).unwrap();
        assert_eq!((r.rejected, r.placed, r.never_placed), (1, 1, 0));
    }

    #[test]
    fn time_scale_compresses_arrivals() {
        let c = one_t4_node();
        let pods: Vec<TracePod> = (0..4)
            .map(|i| {
                pod(
                    &format!("w{i}"),
                    Request::whole(1, 1000, 1000),
                    i * 100,
                    i * 100 + 90,
                )
            })
            .collect();
        let input = prepare(&pods, Some(0)).unwrap();
        let slow = run_replay(&c, &input, "t", "tessera", 1, &ReplayOptions::default()).unwrap();
        assert_eq!(slow.delay.waited, 0);
        let fast = ReplayOptions {
            time_scale: 100.0,
            ..ReplayOptions::default()
        };
        // Arrivals at 0,1,2,3 and 90 s runs on 2 GPUs: two wait.
        let r = run_replay(&c, &input, "t", "tessera", 1, &fast).unwrap();
        assert_eq!(r.window_s, 3);
        assert_eq!(r.delay.waited, 2);
    }
}
