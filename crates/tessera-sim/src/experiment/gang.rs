//! The *gang* experiment: distributed jobs (gangs of 2–32 pods × 1–8 GPUs)
//! replayed beside single pods, placed two ways:
//!
//! - **gang** — Tessera's [`place_gang`]: a job starts when all its members fit
//!   at once, and until then holds nothing.
//! - **non-gang** — what a scheduler without gangs does (kube-scheduler with the
//!   stock plugins): each member is bound as soon as it fits. Members of
//!   waiting jobs are tried interleaved (round after round, each waiting job's
//!   next member, oldest job first in each round), as kube-scheduler retries
//!   unschedulable pods one by one after their back-off rather than job by job. Members bound
//!   before the last one holds GPUs that do no work (a distributed job cannot
//!   start without all its workers); they are counted as *wasted GPU-hours*.
//!   When several jobs each hold part of what the others need and nothing runs
//!   that could free it, no job ever starts again: a deadlock. This baseline
//!   has no timeout that gives the GPUs back (the stock scheduler has none), so
//!   it can deadlock (on the built-in cluster at 1.2 × load every seed does; on
//!   openb `default` none did); the run reports it and stops when nothing can change.
//!
//! **Jobs** (seeded, [`distributed_jobs`]): members per job from
//! {2, 4, 8, 16, 32} with weights {30, 25, 20, 15, 10} %; GPUs per member from
//! {1, 2, 4, 8} with weights {40, 25, 20, 15} %; every member asks 4 CPU cores and
//! 16 GiB per GPU (fits every openb node shape); run time uniform in
//! [`GangConfig::min_run_s`, `max_run_s`] once the whole job runs; arrivals a
//! Poisson process with mean gap [`GangConfig::mean_interarrival_s`]. Mean job:
//! 8.8 members × 2.9 GPUs ≈ 25.5 GPUs.
//!
//! **Single pods** (optional): a trace's pods (openb or the synthetic workload),
//! each a job of one pod, their arrivals compressed so the trace spans the jobs'
//! arrival window, their run times unchanged (deletion − scheduled, or − creation).
//!
//! **Queue**: FIFO with skipping — after every change the queue is scanned
//! oldest first and whatever can start does (kube-scheduler's active queue).
//! In gang mode, against starvation of large gangs, once the oldest waiting
//! job has waited [`GangConfig::head_block_after_s`] the jobs behind it wait
//! until it starts (the bounded wait a gang needs; the core has no clock). The
//! non-gang baseline has no such guard, as the stock scheduler has none. A job
//! that cannot fit even in the empty cluster is rejected on arrival.
//!
//! Time is integer seconds; events are ordered by (time, sequence); one seeded
//! RNG draws the jobs and is passed to the policy. Same inputs → same result.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tessera_core::frag::TargetWorkload;
use tessera_core::ledger::{AllocId, Ledger, LedgerError};
use tessera_core::model::{Cluster, ClusterError, NodeId};
use tessera_core::policy::UnknownPolicy;
use tessera_core::queue::GangId;
use tessera_core::queue::gang::{Gang, GangDecision, GangError, GangOptions, place_gang};
use tessera_core::request::Request;
use tessera_core::{Placement, Scheduler};

use super::learner::Learner;
use super::replay::default_start;
use crate::trace::TracePod;

/// The node label the experiment's racks are written to.
pub const RACK_LABEL: &str = "tessera.io/rack";

/// How the experiment is set up. [`Default`] is the documented mix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GangConfig {
    /// Distributed jobs to generate.
    pub jobs: usize,
    /// Mean gap between job arrivals, seconds.
    pub mean_interarrival_s: u64,
    pub min_run_s: u64,
    pub max_run_s: u64,
    /// Gang mode: once the oldest waiting job has waited this long, jobs behind it wait for it.
    pub head_block_after_s: u64,
    /// Nodes per rack (consecutive nodes share a [`RACK_LABEL`] value); gangs
    /// prefer one rack. 0: no racks.
    pub nodes_per_rack: usize,
}

impl Default for GangConfig {
    fn default() -> Self {
        GangConfig {
            jobs: 300,
            // The built-in 782-GPU cluster at 1.2 × its capacity: see [`GangConfig::for_load`].
            mean_interarrival_s: 245,
            min_run_s: 3_600,
            max_run_s: 14_400,
            head_block_after_s: 3_600,
            nodes_per_rack: 8,
        }
    }
}

impl GangConfig {
    /// The default mix with the arrival gap that offers `load` × the GPUs of a
    /// cluster with `gpus` GPUs while jobs arrive. A mean job holds
    /// 8.8 members × 2.9 GPUs × 9,000 s = 229,680 GPU-seconds, so the gap is
    /// 229,680 / (`gpus` × `load`): 245 s for 782 GPUs at 1.2, 31 s for openb's
    /// 6,212. The job count scales with the GPUs (300 per 782), so the arrival
    /// window (≈ 20 h) is the same on any cluster.
    pub fn for_load(gpus: usize, load: f64) -> GangConfig {
        let d = GangConfig::default();
        let mean_job_gpu_s = mean(&MEMBERS, |k| k as f64)
            * mean(&GPUS, f64::from)
            * (d.min_run_s + d.max_run_s) as f64
            / 2.0;
        let gap = mean_job_gpu_s / (gpus.max(1) as f64 * load.max(1e-3));
        GangConfig {
            mean_interarrival_s: (gap.round() as u64).max(1),
            jobs: (d.jobs * gpus / BUILTIN_GPUS).max(1),
            ..d
        }
    }
}

/// GPUs of the built-in synthetic cluster, for which the default is set.
const BUILTIN_GPUS: usize = 782;

fn mean<T: Copy>(table: &[(T, u32)], value: impl Fn(T) -> f64) -> f64 {
    let total: u32 = table.iter().map(|t| t.1).sum();
    table
        .iter()
        .map(|&(v, w)| value(v) * f64::from(w))
        .sum::<f64>()
        / f64::from(total.max(1))
}

/// A job: one or more pods that run together for `run_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub arrival_s: u64,
    pub run_s: u64,
    pub members: Vec<Request>,
    /// A distributed job (a gang); single pods are not.
    pub distributed: bool,
}

const MEMBERS: [(usize, u32); 5] = [(2, 30), (4, 25), (8, 20), (16, 15), (32, 10)];
const GPUS: [(u32, u32); 4] = [(1, 40), (2, 25), (4, 20), (8, 15)];

fn pick<T: Copy>(rng: &mut SmallRng, table: &[(T, u32)]) -> T {
    let total: u32 = table.iter().map(|t| t.1).sum();
    let mut x = rng.random_range(0..total);
    for &(v, w) in table {
        if x < w {
            return v;
        }
        x -= w;
    }
    table[table.len() - 1].0
}

/// The documented job mix, drawn from `rng`.
pub fn distributed_jobs(config: &GangConfig, rng: &mut SmallRng) -> Vec<Job> {
    let mut t = 0u64;
    (0..config.jobs)
        .map(|_| {
            // Exponential gaps by inverse transform; integer seconds.
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            t += (-(config.mean_interarrival_s as f64) * u.ln()).round() as u64;
            let k = pick(rng, &MEMBERS);
            let g = pick(rng, &GPUS);
            let run_s = rng.random_range(config.min_run_s..=config.max_run_s.max(config.min_run_s));
            let member = Request::whole(g, u64::from(g) * 4_000, u64::from(g) * 16_384);
            Job {
                arrival_s: t,
                run_s,
                members: vec![member; k],
                distributed: true,
            }
        })
        .collect()
}

/// Trace pods as single-pod jobs whose arrivals span `[0, window_s]`.
pub fn single_pods(pods: &[TracePod], window_s: u64) -> Vec<Job> {
    let Some(start) = default_start(pods) else {
        return Vec::new();
    };
    let last = pods
        .iter()
        .filter_map(|p| p.creation_s)
        .max()
        .unwrap_or(start);
    let span = last.saturating_sub(start).max(1);
    pods.iter()
        .filter_map(|p| {
            let (c, d) = (p.creation_s?, p.deletion_s?);
            if d <= start {
                return None;
            }
            let began = p.scheduled_s.unwrap_or(c).max(start);
            let arrival_s =
                ((c.saturating_sub(start)) as u128 * window_s as u128 / span as u128) as u64;
            Some(Job {
                arrival_s,
                run_s: d.saturating_sub(began).max(1),
                members: vec![p.request.clone()],
                distributed: false,
            })
        })
        .collect()
}

/// The cluster with consecutive nodes grouped into racks of `per_rack`.
pub fn with_racks(cluster: &Cluster, per_rack: usize) -> Result<Cluster, ClusterError> {
    let mut nodes = cluster.nodes().to_vec();
    for (i, n) in nodes.iter_mut().enumerate() {
        if let Some(rack) = i.checked_div(per_rack) {
            n.labels
                .insert(RACK_LABEL.into(), format!("rack-{rack:03}"));
        }
    }
    Cluster::new(cluster.catalog.clone(), nodes)
}

/// How members are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Gang,
    NonGang,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Gang => "gang",
            Mode::NonGang => "non-gang",
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GangResult {
    pub mode: Mode,
    pub seed: u64,
    pub jobs: usize,
    pub jobs_completed: usize,
    /// Jobs that could not fit even in the empty cluster.
    pub jobs_rejected: usize,
    pub single_pods: usize,
    pub single_pods_completed: usize,
    /// The run ended with jobs waiting, nothing running that could free GPUs,
    /// and no arrivals left: no progress is possible.
    pub deadlock: bool,
    /// Jobs waiting at the end, and how many of them hold some members.
    pub jobs_stuck: usize,
    pub jobs_partly_bound_at_end: usize,
    /// GPUs held by partly bound jobs at the end (held forever when deadlocked).
    pub gpus_held_at_end: f64,
    /// GPU-hours held by bound members of jobs that had not started: up to the
    /// job's start, or for jobs that never start up to the last time anything
    /// happened to a distributed job (after which they hold `gpus_held_at_end`
    /// for as long as the cluster runs).
    pub wasted_gpu_hours: f64,
    /// GPU-hours of jobs running (all members bound).
    pub useful_gpu_hours: f64,
    /// Arrival → start of completed distributed jobs.
    pub mean_wait_s: f64,
    pub max_wait_s: u64,
    /// Distributed jobs placed within one rack (all members' nodes share a rack).
    pub jobs_in_one_rack: usize,
    /// Time of the last event.
    pub end_s: u64,
    /// When the last distributed job completed.
    pub last_job_end_s: u64,
    /// The comparison's horizon: when the gang run completed its last job.
    pub cutoff_s: Option<u64>,
    /// Distributed jobs completed by the cutoff.
    pub jobs_completed_by_cutoff: usize,
    /// [`GangResult::wasted_gpu_hours`] counted only up to the cutoff.
    pub wasted_gpu_hours_by_cutoff: f64,
}

/// Why a run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum GangSimError {
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Gang(#[from] GangError),
    /// The scheduler proposed a placement the ledger refused: a bug.
    #[error("placement refused by the ledger: {0}")]
    Ledger(#[from] LedgerError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Job index arrives.
    Arrive(usize),
    /// Job index completes.
    Finish(usize),
}

/// One member bound to a node.
struct Bound {
    member: usize,
    alloc: AllocId,
    bound_s: u64,
    milli: u64,
    node: NodeId,
}

#[derive(Default)]
struct JobState {
    bound: Vec<Bound>,
    started_s: Option<u64>,
    done: bool,
    rejected: bool,
}

/// Runs `jobs` on `cluster` in `mode` with the named policy and `seed`.
pub fn run(
    cluster: &Cluster,
    jobs: &[Job],
    mode: Mode,
    policy_name: &str,
    config: &GangConfig,
    seed: u64,
    cutoff_s: Option<u64>,
) -> Result<GangResult, GangSimError> {
    let workload = TargetWorkload::from_requests(jobs.iter().flat_map(|j| j.members.iter()), 0.95);
    let mut learner = Learner::start(cluster, policy_name, Arc::new(workload))?;
    let mut scheduler = Scheduler::new(learner.policy()?);
    // A second scheduler for the "fits the empty cluster" check: a scheduler's
    // score cache follows one ledger's change log.
    let mut probe = Scheduler::new(learner.policy()?);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut ledger = Ledger::new(cluster);
    let empty = Ledger::new(cluster);
    let topology_key = (config.nodes_per_rack > 0).then_some(RACK_LABEL);

    let mut events: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    for (i, j) in jobs.iter().enumerate() {
        events.push(Reverse((j.arrival_s, seq, Event::Arrive(i))));
        seq += 1;
    }
    let mut state: Vec<JobState> = jobs.iter().map(|_| JobState::default()).collect();
    // Waiting jobs in arrival order.
    let mut queue: Vec<usize> = Vec::new();
    let mut wasted_milli_s: u128 = 0;
    // The same, counted only up to the cutoff.
    let mut wasted_cut_milli_s: u128 = 0;
    let clip = |t: u64| cutoff_s.map_or(t, |c| t.min(c));
    let mut useful_milli_s: u128 = 0;
    let mut now = 0u64;
    // The last time anything happened to a distributed job (arrival, a member
    // bound, start, end): members of jobs that never start are counted as held
    // up to here (and reported as held at the end, forever in a deadlock).
    let mut last_job_event_s = 0u64;
    while let Some(Reverse((t, _, ev))) = events.pop() {
        now = t;
        if let Event::Arrive(i) | Event::Finish(i) = ev
            && jobs[i].distributed
        {
            last_job_event_s = now;
        }
        match ev {
            Event::Arrive(i) => {
                let mut moved = false;
                for m in &jobs[i].members {
                    moved |= learner.observe(m, &ledger);
                }
                if moved {
                    scheduler = Scheduler::new(learner.policy()?);
                    probe = Scheduler::new(learner.policy()?);
                }
                if fits_empty(&mut probe, cluster, &empty, &jobs[i], &mut rng)? {
                    queue.push(i);
                } else {
                    state[i].rejected = true;
                }
            }
            Event::Finish(i) => {
                let st = &mut state[i];
                for b in &st.bound {
                    ledger.release(b.alloc)?;
                }
                st.done = true;
            }
        }
        // Everything at this instant first, then one scan of the queue.
        if events.peek().is_some_and(|Reverse((t2, _, _))| *t2 == now) {
            continue;
        }
        if mode == Mode::NonGang {
            // Round after round, each waiting job binds its next member if it fits,
            // until a round binds nothing.
            let mut progress = true;
            while progress {
                progress = false;
                for &i in &queue {
                    let st = &mut state[i];
                    let Some(m) = (0..jobs[i].members.len())
                        .find(|m| !st.bound.iter().any(|b| b.member == *m))
                    else {
                        continue;
                    };
                    if let Some(p) =
                        scheduler.place(cluster, &ledger, &jobs[i].members[m], &mut rng)
                    {
                        let alloc = ledger.apply(cluster, &p)?;
                        st.bound.push(Bound {
                            member: m,
                            alloc,
                            bound_s: now,
                            milli: milli_of(&p),
                            node: p.node,
                        });
                        progress = true;
                        if jobs[i].distributed {
                            last_job_event_s = now;
                        }
                    }
                }
            }
        }
        let mut still = Vec::with_capacity(queue.len());
        let mut blocked = false;
        for (pos, &i) in queue.iter().enumerate() {
            let job = &jobs[i];
            if blocked {
                still.push(i);
                continue;
            }
            let started = match (mode, job.distributed) {
                (Mode::Gang, true) => {
                    let g = Gang {
                        id: GangId(i as u32),
                        members: &job.members,
                        min_member: job.members.len(),
                    };
                    let opts = GangOptions {
                        topology_key,
                        explain: false,
                    };
                    match place_gang(&mut scheduler, cluster, &mut ledger, &g, &opts, &mut rng)? {
                        GangDecision::Placed(p) => {
                            for m in p.members {
                                state[i].bound.push(Bound {
                                    member: m.member,
                                    alloc: m.alloc,
                                    bound_s: now,
                                    milli: milli_of(&m.placement),
                                    node: m.placement.node,
                                });
                            }
                            true
                        }
                        GangDecision::Unschedulable(_) => false,
                    }
                }
                (Mode::Gang, false) => {
                    match scheduler.place(cluster, &ledger, &job.members[0], &mut rng) {
                        Some(p) => {
                            let alloc = ledger.apply(cluster, &p)?;
                            state[i].bound.push(Bound {
                                member: 0,
                                alloc,
                                bound_s: now,
                                milli: milli_of(&p),
                                node: p.node,
                            });
                            true
                        }
                        None => false,
                    }
                }
                // Bound above, member by member.
                (Mode::NonGang, _) => state[i].bound.len() == job.members.len(),
            };
            if started {
                if job.distributed {
                    last_job_event_s = now;
                }
                let st = &mut state[i];
                st.started_s = Some(now);
                for b in &st.bound {
                    wasted_milli_s += u128::from(b.milli) * u128::from(now - b.bound_s);
                    wasted_cut_milli_s +=
                        u128::from(b.milli) * u128::from(clip(now) - clip(b.bound_s));
                    useful_milli_s += u128::from(b.milli) * u128::from(job.run_s);
                }
                events.push(Reverse((now + job.run_s, seq, Event::Finish(i))));
                seq += 1;
            } else {
                still.push(i);
                // The oldest waiting job has waited long enough: the rest wait for it.
                if mode == Mode::Gang
                    && pos == 0
                    && now.saturating_sub(job.arrival_s) >= config.head_block_after_s
                {
                    blocked = true;
                }
            }
        }
        queue = still;
    }
    // Jobs still waiting hold their bound members to the end of the run.
    let mut held_milli = 0u64;
    let mut partly = 0usize;
    for &i in &queue {
        let st = &state[i];
        if !st.bound.is_empty() {
            partly += 1;
        }
        for b in &st.bound {
            held_milli += b.milli;
            wasted_milli_s +=
                u128::from(b.milli) * u128::from(last_job_event_s.saturating_sub(b.bound_s));
            wasted_cut_milli_s += u128::from(b.milli)
                * u128::from(clip(last_job_event_s).saturating_sub(clip(b.bound_s)));
        }
    }
    let waits: Vec<u64> = jobs
        .iter()
        .zip(&state)
        .filter(|(j, s)| j.distributed && s.done)
        .filter_map(|(j, s)| s.started_s.map(|t| t - j.arrival_s))
        .collect();
    let in_one_rack = match topology_key {
        Some(key) => jobs
            .iter()
            .zip(&state)
            .filter(|(j, s)| j.distributed && s.started_s.is_some())
            .filter(|(_, s)| one_rack(cluster, &s.bound, key))
            .count(),
        None => 0,
    };
    let count = |distributed: bool, f: &dyn Fn(&JobState) -> bool| {
        jobs.iter()
            .zip(&state)
            .filter(|(j, s)| j.distributed == distributed && f(s))
            .count()
    };
    Ok(GangResult {
        mode,
        seed,
        jobs: count(true, &|_| true),
        jobs_completed: count(true, &|s| s.done),
        last_job_end_s: jobs
            .iter()
            .zip(&state)
            .filter(|(j, s)| j.distributed && s.done)
            .filter_map(|(j, s)| s.started_s.map(|t| t + j.run_s))
            .max()
            .unwrap_or(0),
        cutoff_s,
        jobs_completed_by_cutoff: jobs
            .iter()
            .zip(&state)
            .filter(|(j, s)| j.distributed && s.done)
            .filter(|(j, s)| {
                s.started_s
                    .is_some_and(|t| cutoff_s.is_none_or(|c| t + j.run_s <= c))
            })
            .count(),
        wasted_gpu_hours_by_cutoff: wasted_cut_milli_s as f64 / 1000.0 / 3600.0,
        jobs_rejected: count(true, &|s| s.rejected),
        single_pods: count(false, &|_| true),
        single_pods_completed: count(false, &|s| s.done),
        deadlock: !queue.is_empty() && partly > 0,
        jobs_stuck: queue.len(),
        jobs_partly_bound_at_end: partly,
        gpus_held_at_end: held_milli as f64 / 1000.0,
        wasted_gpu_hours: wasted_milli_s as f64 / 1000.0 / 3600.0,
        useful_gpu_hours: useful_milli_s as f64 / 1000.0 / 3600.0,
        mean_wait_s: if waits.is_empty() {
            0.0
        } else {
            waits.iter().sum::<u64>() as f64 / waits.len() as f64
        },
        max_wait_s: waits.iter().copied().max().unwrap_or(0),
        jobs_in_one_rack: in_one_rack,
        end_s: now,
    })
}

fn milli_of(p: &Placement) -> u64 {
    p.grants.iter().map(|g| u64::from(g.cores_milli)).sum()
}

/// Whether every member's node carries the same value of `key`.
fn one_rack(cluster: &Cluster, bound: &[Bound], key: &str) -> bool {
    let mut racks = bound.iter().map(|b| cluster.node(b.node).labels.get(key));
    match racks.next() {
        Some(Some(first)) => racks.all(|r| r == Some(first)),
        _ => false,
    }
}

/// Whether `job` fits the empty cluster (all members at once).
fn fits_empty(
    probe: &mut Scheduler,
    cluster: &Cluster,
    empty: &Ledger,
    job: &Job,
    rng: &mut SmallRng,
) -> Result<bool, GangSimError> {
    if let [one] = job.members.as_slice() {
        return Ok(probe.place(cluster, empty, one, rng).is_some());
    }
    let mut scratch = empty.clone();
    let g = Gang {
        id: GangId(0),
        members: &job.members,
        min_member: job.members.len(),
    };
    let d = place_gang(
        probe,
        cluster,
        &mut scratch,
        &g,
        &GangOptions::default(),
        rng,
    )?;
    // The scratch ledger is dropped; the probe's cache must not follow it.
    probe.clear_cache();
    Ok(matches!(d, GangDecision::Placed(_)))
}

/// Both modes over the same jobs for each seed (jobs drawn from the seed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GangReport {
    pub config: GangConfig,
    pub workload: String,
    pub policy: String,
    pub results: Vec<GangResult>,
}

/// Generates the jobs for each seed (plus `singles`, the same every seed) and
/// runs both modes.
pub fn run_seeds(
    cluster: &Cluster,
    singles: &[TracePod],
    workload: &str,
    policy_name: &str,
    config: &GangConfig,
    seeds: &[u64],
) -> Result<GangReport, GangSimError> {
    let racked = with_racks(cluster, config.nodes_per_rack)?;
    let mut results = Vec::new();
    for &seed in seeds {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x6a09_e667);
        let mut jobs = distributed_jobs(config, &mut rng);
        let window_s = jobs.last().map_or(0, |j| j.arrival_s);
        jobs.extend(single_pods(singles, window_s));
        // Arrival order; ties keep jobs before single pods (a stable sort).
        jobs.sort_by_key(|j| j.arrival_s);
        // Gang first: the time it takes to complete every job is the horizon
        // both runs are compared over.
        let gang = run(&racked, &jobs, Mode::Gang, policy_name, config, seed, None)?;
        let cutoff = Some(gang.last_job_end_s);
        let gang = GangResult {
            cutoff_s: cutoff,
            ..gang
        };
        let non_gang = run(
            &racked,
            &jobs,
            Mode::NonGang,
            policy_name,
            config,
            seed,
            cutoff,
        )?;
        results.push(gang);
        results.push(non_gang);
    }
    Ok(GangReport {
        config: config.clone(),
        workload: workload.to_string(),
        policy: policy_name.to_string(),
        results,
    })
}

impl GangReport {
    /// A terminal table: one row per (mode, seed), then the means per mode.
    pub fn table(&self) -> String {
        let mut out = format!(
            "gang experiment: {} distributed jobs per seed (2-32 pods x 1-8 GPUs), mean gap {} s, + single pods of {}; policy {}\n\
             horizon = when the gang run completed its last job; wasted = GPU-hours held by members of jobs not yet started\n",
            self.config.jobs, self.config.mean_interarrival_s, self.workload, self.policy
        );
        out.push_str(&format!(
            "{:<9} {:>5} {:>9} {:>9} {:>9} {:>6} {:>8} {:>9} {:>13} {:>11} {:>11} {:>10} {:>9}\n",
            "mode",
            "seed",
            "jobs done",
            "by horiz.",
            "singles",
            "stuck",
            "deadlock",
            "GPUs held",
            "wasted@horiz.",
            "wasted all",
            "useful GPUh",
            "mean wait",
            "one rack"
        ));
        for r in &self.results {
            out.push_str(&format!(
                "{:<9} {:>5} {:>5}/{:<3} {:>9} {:>4}/{:<4} {:>6} {:>8} {:>9.0} {:>13.1} {:>11.1} {:>11.1} {:>9.0}s {:>9}\n",
                r.mode.name(),
                r.seed,
                r.jobs_completed,
                r.jobs,
                r.jobs_completed_by_cutoff,
                r.single_pods_completed,
                r.single_pods,
                r.jobs_stuck,
                if r.deadlock { "yes" } else { "no" },
                r.gpus_held_at_end,
                r.wasted_gpu_hours_by_cutoff,
                r.wasted_gpu_hours,
                r.useful_gpu_hours,
                r.mean_wait_s,
                r.jobs_in_one_rack,
            ));
        }
        let mut by_mode: BTreeMap<&str, Vec<&GangResult>> = BTreeMap::new();
        for r in &self.results {
            by_mode.entry(r.mode.name()).or_default().push(r);
        }
        for (mode, rs) in by_mode {
            let n = rs.len() as f64;
            let mean = |f: &dyn Fn(&GangResult) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / n;
            out.push_str(&format!(
                "mean {mode}: jobs completed {:.1} ({:.1} by the horizon), deadlocked runs {}/{}, wasted {:.1} GPU-hours by the horizon, GPUs held forever {:.1}\n",
                mean(&|r| r.jobs_completed as f64),
                mean(&|r| r.jobs_completed_by_cutoff as f64),
                rs.iter().filter(|r| r.deadlock).count(),
                rs.len(),
                mean(&|r| r.wasted_gpu_hours_by_cutoff),
                mean(&|r| if r.deadlock { r.gpus_held_at_end } else { 0.0 }),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_offers_the_asked_load() {
        // 8.8 × 2.9 × 9,000 = 229,680 GPU-s per job; / (782 × 1.2) = 244.75 → 245.
        assert_eq!(GangConfig::for_load(782, 1.2).mean_interarrival_s, 245);
        assert_eq!(GangConfig::default().mean_interarrival_s, 245);
        // / (6,212 × 1.2) = 30.8 → 31.
        assert_eq!(GangConfig::for_load(6_212, 1.2).mean_interarrival_s, 31);
        // 300 × 6,212 / 782 = 2,383 jobs.
        assert_eq!(GangConfig::for_load(6_212, 1.2).jobs, 2_383);
        assert_eq!(GangConfig::for_load(782, 1.2).jobs, 300);
    }

    #[test]
    fn jobs_follow_the_documented_mix() {
        let mut rng = SmallRng::seed_from_u64(1);
        let jobs = distributed_jobs(
            &GangConfig {
                jobs: 4_000,
                ..GangConfig::default()
            },
            &mut rng,
        );
        let members = jobs.iter().map(|j| j.members.len()).sum::<usize>() as f64 / 4_000.0;
        let gpus = jobs
            .iter()
            .map(|j| j.members[0].gpu.gpu_count())
            .sum::<u32>() as f64
            / 4_000.0;
        // Means 8.8 and 2.9, within sampling noise.
        assert!((members - 8.8).abs() < 0.5, "{members}");
        assert!((gpus - 2.9).abs() < 0.15, "{gpus}");
        assert!(jobs.iter().all(|j| (2..=32).contains(&j.members.len())));
        assert!(jobs.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
    }
}
