//! The *tenants* experiment: many teams share one fleet through queues.
//!
//! The replay's pods (same times, run times and shapes as [`super::replay`]) are
//! dealt to four queues with guaranteed quotas of 40 / 30 / 20 / 10 % of the
//! cluster's GPUs (GPU-equivalents with every model at 1.0, so a queue's GPU time
//! is its requested milli-GPU × seconds).
//!
//! - **Assignment** (deterministic, documented so anyone can redo it): pod *k*
//!   (in creation order) goes to queue `splitmix64(k ⊕ seed) mod 4`, so every
//!   queue offers about a quarter of the load, far from its quota: the small
//!   queues ask for much more than they are owed and the big one for less.
//! - **A team that returns**: queue `a` (the 40 % one) is away for the first
//!   `away_fraction` of the arrival window; its pods from that time arrive
//!   together when it returns (their run times unchanged). While it is away its
//!   guarantee is lent; when it returns, it is owed it back.
//! - **Load**: `time_scale` divides arrival offsets, as in the replay, and the
//!   arrivals repeat `cycles` times so that the window is long against run
//!   times; the defaults (see [`TenantOptions`]) offer more than the cluster
//!   holds, so every queue wants more than its quota once `a` is back.
//!
//! Four disciplines, same placement policy (`tessera`):
//! - `fifo`: no queues, the replay's FIFO with backfill (what a cluster without
//!   quotas does);
//! - `strict`: each queue capped at its guarantee (no borrowing), served furthest
//!   below its fair share first;
//! - `borrow`: guarantees, borrowing of unused quota and fair order, no reclaim;
//! - `tessera`: `borrow` plus *reclaim*: a pod within its queue's guarantee that
//!   does not fit evicts pods of queues above their guarantee (the preemption
//!   planner's fewest victims / least GPU time lost, none younger than
//!   `min_runtime_s`), taking only what is borrowed: a victim's queue stays at
//!   or above its guarantee without the victims. Evicted pods go back to their
//!   queue and start over.
//!
//! Measured:
//! - **Fairness**: each queue's GPU time divided by its entitlement (quota share
//!   × capacity × time), over the *contended window* (from `a`'s return to the
//!   last arrival, when every queue wants more than its quota), and Jain's index
//!   of those ratios: (Σx)² / (n·Σx²), 1 = perfectly proportional.
//! - **Utilisation**: requested milli-GPU in use / capacity, time-weighted over the
//!   whole arrival window.
//! - **Return delay**: from the away team's return until it holds 90 % of what it
//!   is owed (its guarantee, or its demand if less) — how fast lent capacity
//!   comes back to its owner.
//! - Evictions and the GPU time they threw away.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use serde::Serialize;
use tessera_core::ledger::{AllocId, Ledger, LedgerError};
use tessera_core::model::Cluster;
use tessera_core::queue::admit::{Admission, QueueUsage, admit};
use tessera_core::queue::fair::{FairShares, fair_shares, order_key};
use tessera_core::queue::preempt::Context;
use tessera_core::queue::reclaim::{Quotas, reclaim};
use tessera_core::queue::{
    Budgets, GpuEquivalents, PodMeta, QueueId, QueueSpec, QueueTree, Resources, Running,
};
use tessera_core::request::Request;
use tessera_core::{Placement, Scheduler};

use super::learner::Learner;
use super::replay::{ReplayError, ReplayInput, percentile};

/// Seconds before a reclaim that found no plan is tried again for the same
/// shape and queue (unless something is released sooner).
const RECLAIM_RETRY_S: u64 = 60;

/// How the queues are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Discipline {
    Fifo,
    Strict,
    Borrow,
    Tessera,
}

impl Discipline {
    pub const ALL: [Discipline; 4] = [
        Discipline::Fifo,
        Discipline::Strict,
        Discipline::Borrow,
        Discipline::Tessera,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Discipline::Fifo => "fifo",
            Discipline::Strict => "strict",
            Discipline::Borrow => "borrow",
            Discipline::Tessera => "tessera",
        }
    }
}

/// How the experiment runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantOptions {
    /// Divides arrival offsets (as in the replay).
    pub time_scale: f64,
    /// Queues: name and guaranteed share of the GPUs in per cent. The first one is
    /// the team that is away at first.
    pub queues: Vec<(String, u32)>,
    /// Fraction of the arrival window the first queue is away.
    pub away_fraction: f64,
    /// Pods younger than this are never evicted by reclaim.
    pub min_runtime_s: u64,
    /// The trace's arrivals this many times back to back (as the replay's cycles),
    /// so that the window is long against the pods' run times.
    pub cycles: u32,
}

impl Default for TenantOptions {
    fn default() -> Self {
        TenantOptions {
            time_scale: 4_000.0,
            queues: vec![
                ("a".into(), 40),
                ("b".into(), 30),
                ("c".into(), 20),
                ("d".into(), 10),
            ],
            away_fraction: 0.4,
            min_runtime_s: 300,
            cycles: 8,
        }
    }
}

/// What one queue got.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueFigures {
    pub name: String,
    pub quota_pct: u32,
    pub pods: usize,
    pub placed: usize,
    /// GPU-hours used over the contended window.
    pub contended_gpu_hours: f64,
    /// Contended GPU time / entitlement (1 = exactly its quota).
    pub share_of_entitlement: f64,
    pub mean_delay_s: f64,
    pub p95_delay_s: u64,
    pub evicted: usize,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantResult {
    pub discipline: Discipline,
    pub seed: u64,
    pub time_scale: f64,
    pub capacity_gpus: usize,
    pub pods: usize,
    pub placed: usize,
    /// Pods that fit nowhere even in the empty cluster.
    pub rejected: usize,
    /// Start and end of the contended window, seconds.
    pub contended_from_s: u64,
    pub window_s: u64,
    /// Jain's index of [`QueueFigures::share_of_entitlement`] over the queues.
    pub jain: f64,
    /// Requested milli-GPU in use / capacity, time-weighted over the arrival window, %.
    pub util_mean_pct: f64,
    /// Seconds from the returning queue's return until it holds 90 % of what it
    /// is owed (its guarantee, or its demand if that is less); `None` if never.
    pub return_delay_s: Option<u64>,
    pub evictions: usize,
    /// GPU time the evicted pods had run (thrown away), GPU-hours.
    pub evicted_gpu_hours: f64,
    pub queues: Vec<QueueFigures>,
}

/// Why the tenants experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error("queues: {0}")]
    Queues(#[from] tessera_core::queue::TreeError),
    #[error("queues: the guarantees add up to {0} %, more than 100 %")]
    OverCommitted(u32),
    #[error("away fraction {0} must be in [0, 1)")]
    BadAwayFraction(f64),
    #[error("placement refused by the ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// The deterministic queue of pod `k` (splitmix64's finaliser).
pub fn queue_of(k: u64, seed: u64, queues: usize) -> usize {
    let mut z = (k ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % queues.max(1) as u64) as usize
}

/// Jain's fairness index of `x`: (Σx)² / (n·Σx²); 1 when all are equal.
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || s2 == 0.0 {
        return 1.0;
    }
    s * s / (x.len() as f64 * s2)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(u32),
    Depart(u64),
}

/// A pod of this run.
#[derive(Debug, Clone, Copy)]
struct Pod {
    arrival_s: u64,
    run_s: u64,
    shape: u32,
    queue: QueueId,
}

/// A running pod.
#[derive(Debug, Clone, Copy)]
struct Live {
    pod: u32,
    started_s: u64,
    ask: Resources,
}

struct Engine<'a> {
    cluster: &'a Cluster,
    shapes: &'a [Request],
    pods: Vec<Pod>,
    discipline: Discipline,
    tree: QueueTree,
    capacity: Resources,
    min_runtime_s: u64,
    ledger: Ledger,
    scheduler: Scheduler,
    /// What the policy has learned, and how to rebuild it.
    learner: Learner,
    rng: SmallRng,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    /// Pending pods per queue, oldest first (one queue in `fifo`).
    pending: Vec<VecDeque<u32>>,
    /// What each queue's pending pods ask for in total.
    pending_demand: Vec<Resources>,
    /// Bumped on every placement and release (keys the candidates cache).
    version: u64,
    /// Per (shape, queue): the release epoch and time a reclaim last found no plan.
    reclaim_failed: FxHashMap<(u32, QueueId), (u64, u64)>,
    /// Running pods as the preemption planner reads them, at `version`.
    candidates: Option<(u64, FxHashMap<AllocId, Running>)>,
    usage: QueueUsage,
    live: FxHashMap<AllocId, Live>,
    /// Per pod: how many times it started (more than once after an eviction).
    starts: Vec<u32>,
    /// Per shape: the release epoch it last failed to fit in (releases can make it fit).
    failed_epoch: Vec<u64>,
    epoch: u64,
    fits_empty: Vec<Option<bool>>,
    delays: Vec<Vec<u64>>,
    evicted: Vec<usize>,
    evicted_gpu_milli_s: u128,
    rejected: usize,
}

impl Engine<'_> {
    /// Learns an arriving pod; rebuilds the policy when the learned target or the free
    /// GPU supply moved (and forgets which shapes failed to fit or to reclaim: the new
    /// policy has not judged them).
    fn learn(&mut self, shape: u32) -> Result<(), TenantError> {
        if self
            .learner
            .observe(&self.shapes[shape as usize], &self.ledger)
        {
            let policy = self.learner.policy().map_err(ReplayError::from)?;
            self.scheduler = Scheduler::new(policy);
            self.failed_epoch.fill(u64::MAX);
            self.reclaim_failed.clear();
        }
        Ok(())
    }

    fn push(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, e)));
    }

    fn ask(&self, shape: u32) -> Resources {
        let r = &self.shapes[shape as usize];
        // Every model counts 1.0, so a pod's GPU-equivalents are its requested milli-GPU.
        Resources::new(r.gpu.total_milli(), r.cpu_milli, r.memory_mib)
    }

    fn fits_empty(&mut self, shape: u32) -> bool {
        if let Some(b) = self.fits_empty[shape as usize] {
            return b;
        }
        let req = &self.shapes[shape as usize];
        let ok = super::replay::fits_when_empty(
            self.cluster,
            self.scheduler.policy(),
            &mut self.rng,
            req,
        );
        self.fits_empty[shape as usize] = Some(ok);
        ok
    }

    fn place(&mut self, k: u32, p: &Placement, t: u64) -> Result<(), TenantError> {
        let pod = self.pods[k as usize];
        let id = self.ledger.apply(self.cluster, p)?;
        let ask = self.ask(pod.shape);
        self.usage.add(&self.tree, pod.queue, ask);
        self.starts[k as usize] += 1;
        self.version += 1;
        self.live.insert(
            id,
            Live {
                pod: k,
                started_s: t,
                ask,
            },
        );
        self.delays[usize::from(pod.queue.0)].push(t - pod.arrival_s);
        self.push(t + pod.run_s, Event::Depart(id.0));
        Ok(())
    }

    fn release(&mut self, id: AllocId) -> Result<Live, TenantError> {
        let live = self
            .live
            .remove(&id)
            .ok_or(LedgerError::UnknownAllocation(id))?;
        self.ledger.release(id)?;
        let q = self.pods[live.pod as usize].queue;
        self.usage.remove(&self.tree, q, live.ask);
        self.epoch += 1;
        self.version += 1;
        Ok(live)
    }

    /// The shares everyone deserves now: demand = what each queue holds + what it waits for.
    fn shares(&self) -> FairShares {
        let demand: Vec<Resources> = self
            .usage
            .all()
            .iter()
            .zip(&self.pending_demand)
            .map(|(u, p)| *u + *p)
            .collect();
        fair_shares(&self.tree, self.capacity, &demand)
    }

    fn enqueue(&mut self, lane: usize, k: u32) {
        let ask = self.ask(self.pods[k as usize].shape);
        // In arrival order (an evicted pod goes back to where it arrived).
        let key = |j: u32| (self.pods[j as usize].arrival_s, j);
        let at = self.pending[lane].partition_point(|&j| key(j) < key(k));
        self.pending[lane].insert(at, k);
        self.pending_demand[lane] += ask;
    }

    fn dequeue(&mut self, lane: usize, i: usize) {
        if let Some(k) = self.pending[lane].remove(i) {
            let ask = self.ask(self.pods[k as usize].shape);
            self.pending_demand[lane] = self.pending_demand[lane].saturating_sub(&ask);
        }
    }

    /// Places whatever may go now; reclaims for pods within their guarantee.
    fn schedule(&mut self, t: u64) -> Result<(), TenantError> {
        if self.discipline == Discipline::Fifo {
            return self.schedule_fifo(t);
        }
        let shares = self.shares();
        // Within one call the cluster only fills up and usage only grows, unless a
        // reclaim releases something (the epoch moves): so a pod that could not go
        // stays unable to, and each queue's scan resumes where it stopped.
        let nq = self.pending.len();
        let mut epoch = self.epoch;
        let mut cursor = vec![0usize; nq];
        loop {
            if self.epoch != epoch {
                epoch = self.epoch;
                cursor.iter_mut().for_each(|c| *c = 0);
            }
            let mut order: Vec<(Vec<f64>, usize)> = (0..nq)
                .filter(|&q| cursor[q] < self.pending[q].len())
                .map(|q| {
                    let key = order_key(&self.tree, self.usage.all(), &shares, QueueId(q as u16));
                    (key, q)
                })
                .collect();
            order.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
            let mut progressed = false;
            'queues: for (_, q) in order {
                while cursor[q] < self.pending[q].len() {
                    let k = self.pending[q][cursor[q]];
                    if self.try_one(k, t)? {
                        self.dequeue(q, cursor[q]);
                        progressed = true;
                        break 'queues;
                    }
                    cursor[q] += 1;
                }
            }
            if !progressed {
                return Ok(());
            }
        }
    }

    /// Admission, placement and (in `tessera`) reclaim for pod `k`.
    fn try_one(&mut self, k: u32, t: u64) -> Result<bool, TenantError> {
        let pod = self.pods[k as usize];
        let ask = self.ask(pod.shape);
        let verdict = admit(&self.tree, &self.usage, &self.capacity, pod.queue, &ask);
        match verdict {
            Admission::Refused(_) => return Ok(false),
            Admission::Borrowing if self.discipline == Discipline::Strict => return Ok(false),
            Admission::Guaranteed | Admission::Borrowing => {}
        }
        let s = pod.shape as usize;
        if self.failed_epoch[s] == self.epoch {
            return self.reclaim(k, t, &verdict);
        }
        let req = &self.shapes[s];
        match self
            .scheduler
            .place(self.cluster, &self.ledger, req, &mut self.rng)
        {
            Some(p) => {
                self.place(k, &p, t)?;
                Ok(true)
            }
            None => {
                self.failed_epoch[s] = self.epoch;
                self.reclaim(k, t, &verdict)
            }
        }
    }

    /// Evicts borrowers' pods so that pod `k`, within its guarantee, runs.
    fn reclaim(&mut self, k: u32, t: u64, verdict: &Admission) -> Result<bool, TenantError> {
        if self.discipline != Discipline::Tessera || *verdict != Admission::Guaranteed {
            return Ok(false);
        }
        let pod = self.pods[k as usize];
        // A reclaim that found no plan is not retried for the same shape and queue
        // until something is released or `RECLAIM_RETRY_S` passes (new borrowers'
        // pods become candidates only once they have run `min_runtime_s`).
        let memo = (pod.shape, pod.queue);
        if let Some(&(epoch, at)) = self.reclaim_failed.get(&memo)
            && epoch == self.epoch
            && t < at + RECLAIM_RETRY_S
        {
            return Ok(false);
        }
        // The planner gives the owner precedence over borrowers (see queue::reclaim).
        let owner = PodMeta {
            queue: pod.queue,
            ..PodMeta::default()
        };
        if self.candidates.as_ref().is_none_or(|c| c.0 != self.version) {
            let running: FxHashMap<AllocId, Running> = self
                .live
                .iter()
                .map(|(&alloc, l)| {
                    let meta = PodMeta {
                        queue: self.pods[l.pod as usize].queue,
                        ..PodMeta::default()
                    };
                    let started_s = l.started_s;
                    (
                        alloc,
                        Running {
                            alloc,
                            meta,
                            started_s,
                        },
                    )
                })
                .collect();
            self.candidates = Some((self.version, running));
        }
        let Some((_, running)) = self.candidates.as_ref() else {
            return Ok(false);
        };
        let budgets = Budgets::new();
        let ctx = Context {
            cluster: self.cluster,
            ledger: &self.ledger,
            running,
            budgets: &budgets,
            now_s: t,
            min_runtime_s: self.min_runtime_s,
        };
        let live = &self.live;
        let held = |a: AllocId| live.get(&a).map(|l| l.ask);
        let quotas = Quotas {
            tree: &self.tree,
            usage: &self.usage,
            held: &held,
        };
        let req = &self.shapes[pod.shape as usize];
        let plan = reclaim(&mut self.scheduler, &ctx, req, &owner, &quotas, &|_| true);
        let Some(plan) = plan else {
            self.reclaim_failed.insert(memo, (self.epoch, t));
            return Ok(false);
        };
        for v in &plan.victims {
            let live = self.release(*v)?;
            let q = self.pods[live.pod as usize].queue;
            self.evicted[usize::from(q.0)] += 1;
            let held = u128::from(live.ask.gpu_eq_milli);
            self.evicted_gpu_milli_s += held * u128::from(t - live.started_s);
            // It starts over: back to its queue, in arrival order.
            self.enqueue(usize::from(q.0), live.pod);
        }
        self.place(k, &plan.placement, t)?;
        Ok(true)
    }

    fn schedule_fifo(&mut self, t: u64) -> Result<(), TenantError> {
        let queue = std::mem::take(&mut self.pending[0]);
        let mut keep = VecDeque::with_capacity(queue.len());
        for k in queue {
            let s = self.pods[k as usize].shape as usize;
            if self.failed_epoch[s] == self.epoch {
                keep.push_back(k);
                continue;
            }
            let req = &self.shapes[s];
            match self
                .scheduler
                .place(self.cluster, &self.ledger, req, &mut self.rng)
            {
                Some(p) => self.place(k, &p, t)?,
                None => {
                    self.failed_epoch[s] = self.epoch;
                    keep.push_back(k);
                }
            }
        }
        self.pending_demand[0] = keep.iter().fold(Resources::ZERO, |a, &k| {
            a + self.ask(self.pods[k as usize].shape)
        });
        self.pending[0] = keep;
        Ok(())
    }
}

/// Runs the tenants experiment with one discipline.
pub fn run_tenants(
    cluster: &Cluster,
    input: &ReplayInput,
    discipline: Discipline,
    seed: u64,
    opts: &TenantOptions,
) -> Result<TenantResult, TenantError> {
    if !(opts.time_scale.is_finite() && opts.time_scale > 0.0) {
        return Err(ReplayError::BadTimeScale(opts.time_scale).into());
    }
    if !(0.0..1.0).contains(&opts.away_fraction) {
        return Err(TenantError::BadAwayFraction(opts.away_fraction));
    }
    if input.pods.is_empty() {
        return Err(ReplayError::NoPods.into());
    }
    let total_pct: u32 = opts.queues.iter().map(|q| q.1).sum();
    if total_pct > 100 {
        return Err(TenantError::OverCommitted(total_pct));
    }
    let ge = GpuEquivalents::uniform();
    let capacity = ge.capacity(cluster);
    let tree = QueueTree::new(
        opts.queues
            .iter()
            .map(|(name, pct)| {
                let g = capacity.gpu_eq_milli * u64::from(*pct) / 100;
                let c = capacity.cpu_milli * u64::from(*pct) / 100;
                let m = capacity.memory_mib * u64::from(*pct) / 100;
                QueueSpec::new(name.clone(), Resources::new(g, c, m))
            })
            .collect(),
    )?;
    let nq = tree.len();

    // Arrivals: the replay's offsets scaled; queue by the documented hash; the
    // first queue's pods before its return arrive at its return.
    let once: Vec<u64> = input
        .pods
        .iter()
        .map(|p| (p.offset_s as f64 / opts.time_scale).floor() as u64)
        .collect();
    let cycle_s = once.iter().copied().max().unwrap_or(0) + 1;
    let cycles = u64::from(opts.cycles.max(1));
    let offsets: Vec<(u64, &super::replay::ReplayPod)> = (0..cycles)
        .flat_map(|c| {
            once.iter()
                .zip(&input.pods)
                .map(move |(&o, p)| (c * cycle_s + o, p))
        })
        .collect();
    let window_s = offsets.iter().map(|o| o.0).max().unwrap_or(0);
    let return_s = (window_s as f64 * opts.away_fraction).floor() as u64;
    let pods: Vec<Pod> = offsets
        .iter()
        .enumerate()
        .map(|(k, &(off, p))| {
            let q = queue_of(k as u64, seed, nq);
            let arrival_s = if q == 0 { off.max(return_s) } else { off };
            Pod {
                arrival_s,
                run_s: p.run_s,
                shape: p.shape,
                queue: tree.id(&opts.queues[q].0).unwrap_or(QueueId(0)),
            }
        })
        .collect();

    let mut learner =
        Learner::start(cluster, "tessera", input.workload.clone()).map_err(ReplayError::from)?;
    let scheduler = Scheduler::new(learner.policy().map_err(ReplayError::from)?);
    let n = pods.len();
    let lanes = if discipline == Discipline::Fifo {
        1
    } else {
        nq
    };
    let mut e = Engine {
        cluster,
        shapes: &input.shapes,
        pods,
        discipline,
        tree,
        capacity,
        min_runtime_s: opts.min_runtime_s,
        ledger: Ledger::new(cluster),
        scheduler,
        learner,
        rng: SmallRng::seed_from_u64(seed),
        heap: BinaryHeap::new(),
        seq: 0,
        pending: vec![VecDeque::new(); lanes],
        pending_demand: vec![Resources::ZERO; lanes],
        version: 0,
        candidates: None,
        reclaim_failed: FxHashMap::default(),
        usage: QueueUsage::new(&QueueTree::new(Vec::new())?),
        live: FxHashMap::default(),
        starts: vec![0; n],
        failed_epoch: vec![u64::MAX; input.shapes.len()],
        epoch: 0,
        fits_empty: vec![None; input.shapes.len()],
        delays: vec![Vec::new(); nq],
        evicted: vec![0; nq],
        evicted_gpu_milli_s: 0,
        rejected: 0,
    };
    e.usage = QueueUsage::new(&e.tree);
    // Arrivals in time order, ties by pod index (so pending queues stay sorted by index
    // within a time, and by time across times).
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&k| (e.pods[k as usize].arrival_s, k));
    for k in order {
        let t = e.pods[k as usize].arrival_s;
        e.push(t, Event::Arrive(k));
    }

    let cap_milli = capacity.gpu_eq_milli.max(1) as f64;
    let mut util_int = 0f64;
    let mut queue_int = vec![0u128; nq];
    let mut last_t = 0u64;
    let returner = e.tree.id(&opts.queues[0].0).unwrap_or(QueueId(0));
    let mut returned_at: Option<u64> = None;
    while let Some(&Reverse((t, _, _))) = e.heap.peek() {
        // Integrate the state that held on [last_t, t).
        let lo = last_t.min(window_s);
        let hi = t.min(window_s);
        util_int += e.ledger.used_milli() as f64 * (hi - lo) as f64;
        let (clo, chi) = (
            last_t.clamp(return_s, window_s),
            t.clamp(return_s, window_s),
        );
        for (q, acc) in queue_int.iter_mut().enumerate() {
            let used = e.usage.of(QueueId(q as u16)).gpu_eq_milli;
            *acc += u128::from(used) * u128::from(chi - clo);
        }
        last_t = t;
        while let Some(&Reverse((tt, _, ev))) = e.heap.peek() {
            if tt != t {
                break;
            }
            e.heap.pop();
            match ev {
                Event::Arrive(k) => {
                    let pod = e.pods[k as usize];
                    e.learn(pod.shape)?;
                    if e.fits_empty(pod.shape) {
                        let lane = if lanes == 1 {
                            0
                        } else {
                            usize::from(pod.queue.0)
                        };
                        e.enqueue(lane, k);
                    } else {
                        e.rejected += 1;
                    }
                }
                Event::Depart(id) => {
                    // The departure of a run that was evicted is stale (allocation
                    // ids are never reused, so a restarted pod has a new one).
                    if e.live.contains_key(&AllocId(id)) {
                        e.release(AllocId(id))?;
                    }
                }
            }
        }
        e.schedule(t)?;
        if returned_at.is_none() && t >= return_s {
            // What the returning queue waits for (FIFO keeps one lane for everyone).
            let waiting: u64 = if lanes > 1 {
                e.pending_demand[usize::from(returner.0)].gpu_eq_milli
            } else {
                e.pending[0]
                    .iter()
                    .filter(|&&k| e.pods[k as usize].queue == returner)
                    .map(|&k| e.ask(e.pods[k as usize].shape).gpu_eq_milli)
                    .sum()
            };
            let owed = e
                .tree
                .spec(returner)
                .guaranteed
                .gpu_eq_milli
                .min(e.usage.of(returner).gpu_eq_milli + waiting);
            if e.usage.of(returner).gpu_eq_milli * 10 >= owed * 9 {
                returned_at = Some(t);
            }
        }
    }

    let contended = window_s.saturating_sub(return_s).max(1) as f64;
    let mut queues = Vec::with_capacity(nq);
    let mut ratios = Vec::with_capacity(nq);
    for (i, (name, pct)) in opts.queues.iter().enumerate() {
        let q = e.tree.id(name).unwrap_or(QueueId(i as u16));
        let qi = usize::from(q.0);
        let entitled = cap_milli * f64::from(*pct) / 100.0 * contended;
        let used = queue_int[qi] as f64;
        let ratio = if entitled > 0.0 { used / entitled } else { 0.0 };
        ratios.push(ratio);
        let mut d = std::mem::take(&mut e.delays[qi]);
        d.sort_unstable();
        queues.push(QueueFigures {
            name: name.clone(),
            quota_pct: *pct,
            pods: e.pods.iter().filter(|p| p.queue == q).count(),
            placed: e
                .starts
                .iter()
                .zip(&e.pods)
                .filter(|(s, p)| **s > 0 && p.queue == q)
                .count(),
            contended_gpu_hours: used / 1000.0 / 3600.0,
            share_of_entitlement: ratio,
            mean_delay_s: if d.is_empty() {
                0.0
            } else {
                d.iter().sum::<u64>() as f64 / d.len() as f64
            },
            p95_delay_s: percentile(&d, 0.95),
            evicted: e.evicted[qi],
        });
    }
    let placed = e.starts.iter().filter(|&&s| s > 0).count();
    Ok(TenantResult {
        discipline,
        seed,
        time_scale: opts.time_scale,
        capacity_gpus: cluster.gpu_count(),
        pods: n,
        placed,
        rejected: e.rejected,
        contended_from_s: return_s,
        window_s,
        jain: jain(&ratios),
        util_mean_pct: if window_s > 0 {
            util_int / window_s as f64 / cap_milli * 100.0
        } else {
            0.0
        },
        return_delay_s: returned_at.map(|at| at.saturating_sub(return_s)),
        evictions: e.evicted.iter().sum(),
        evicted_gpu_hours: e.evicted_gpu_milli_s as f64 / 1000.0 / 3600.0,
        queues,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_for_equal_and_one_over_n_for_one_winner() {
        assert!((jain(&[2.0, 2.0, 2.0, 2.0]) - 1.0).abs() < 1e-12);
        // One of four gets everything: 1² / (4 · 1) = 0.25.
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        // (1 + 3)² / (2 · (1 + 9)) = 16 / 20 = 0.8.
        assert!((jain(&[1.0, 3.0]) - 0.8).abs() < 1e-12);
    }

    #[test]
    fn assignment_is_deterministic_and_about_even() {
        let mut n = [0usize; 4];
        for k in 0..40_000 {
            n[queue_of(k, 7, 4)] += 1;
        }
        assert!(n.iter().all(|&c| (9_000..11_000).contains(&c)), "{n:?}");
        assert_eq!(queue_of(123, 7, 4), queue_of(123, 7, 4));
        let differs = (0..100).any(|k| queue_of(k, 7, 4) != queue_of(k, 8, 4));
        assert!(differs, "the seed changes the assignment");
    }
}
