//! The *federation* experiment: one cluster split into member clusters, and a
//! federation layer (Karmada) that sends each job to a member by a replica estimate;
//! inside the member, Tessera places it (issue 39).
//!
//! **Members.** The cluster's nodes, in the seed's random order (as the fill permutes
//! them), are cut into `shares.len()` member clusters of uneven size (default 40 %,
//! 30 %, 20 %, 10 % of the nodes). Each member runs its own Tessera (`tessera` policy,
//! built and rebuilt as in the fill experiment from what that member has seen).
//!
//! **Jobs** arrive as in the fill experiment ([`super::fill::arrival_order`]: seeded
//! shuffle, inflation to 1.3 × the whole federation's GPU capacity, nobody leaves).
//!
//! **Dispatch.** For each job the federation asks every member how many replicas of it
//! fit now ([`Estimator`]), and ranks the members with a count of at least 1: most
//! replicas first (what karmada-scheduler does for one replica: it takes the cluster
//! with the most available replicas), ties to the member with the most free GPU
//! compute, then the lower index. The job goes to the first; Tessera places it there
//! or cannot. A job that cannot run where it was sent is **misplaced**: it waits until
//! karmada-descheduler evicts it (its `--unschedulable-threshold`, 5 min by default in
//! Karmada v1.18.2) and is sent to the next member of the ranking not yet tried,
//! which is kinder to the baseline than Karmada is (the rescheduled job may go back to
//! the same cluster there). **Queueing delay** is the time from submission to
//! placement: `bounces × redispatch_delay_s`; the model puts no other wait in (the fill
//! has no time), so it is a lower bound. Bounces are resolved before the next job
//! arrives. A job no member's estimate admits is **refused** (stays pending at the
//! federation); a job every tried member failed is **failed**.
//!
//! **Estimators** ([`Estimator`]):
//! - `karmada-general`: karmada-scheduler's default general estimator
//!   (`pkg/estimator/client/general.go` at v1.18.2), from the member's resource
//!   summary: per resource, available = allocatable − allocated summed over the
//!   cluster; replicas = min over the requested resources of ⌊available / request⌋, and
//!   at most the free pod slots (110 per node). GPUs are integers: a GPU is free
//!   when nobody holds any part of it (what Tessera holds, rounded up to whole GPUs),
//!   and a job asks its GPU count (a share or a MIG instance asks one whole GPU).
//!   GPU models are not seen.
//! - `karmada-node`: the same integer view per node, summed over nodes, on the nodes
//!   whose GPU model the job allows (karmada-scheduler-estimator's `noderesource`
//!   plugin with the model as a node selector): the stronger baseline.
//! - `tessera`: [`tessera_core::estimate::max_replicas`] with the member's own
//!   scheduler, at most `limit` replicas (the count costs one placement per replica;
//!   a member at the limit ranks by its free GPU compute, the tie rule above).
//!
//! **Staleness.** With `batch` > 1 the federation decides `batch` consecutive jobs on
//! the estimates of the state before the batch (jobs in flight are not seen), then
//! delivers them in order.
//!
//! **Measures**, over the jobs submitted until the arrived GPU demand reaches 100 % of
//! capacity: misplaced jobs, bounces, refused jobs (and how many of those a member
//! could have placed), mean queueing delay; and unallocated GPU share at arrived
//! 100 % (the fill's integer-percent column, [`discretize`]).

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;
use tessera_core::Scheduler;
use tessera_core::estimate::max_replicas;
use tessera_core::ledger::Ledger;
use tessera_core::model::{Cluster, Node};
use tessera_core::policy::{Policy, PolicyArgs, PolicyInputs, UnknownPolicy};
use tessera_core::request::Request;

use super::fill::{FillConfig, FillError, arrival_order, permute_nodes, typical_pods};
use crate::metrics::{FillPoint, discretize, mean_sd};
use crate::trace::TracePod;

/// Pod slots of a node (Kubernetes' default `maxPods`; Karmada's `maxPodsCountPerNode`).
pub const MAX_PODS_PER_NODE: u64 = 110;

/// karmada-descheduler's default `--unschedulable-threshold` (v1.18.2), seconds.
pub const DESCHEDULER_THRESHOLD_S: u64 = 300;

/// How the federation counts the replicas of a job that fit in a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Estimator {
    /// Karmada's general estimator: the cluster's integer resource summary.
    KarmadaGeneral,
    /// Karmada's scheduler-estimator node view with integer GPUs.
    KarmadaNode,
    /// Tessera's estimate: the member's placement engine, replica by replica.
    Tessera,
}

impl Estimator {
    /// Every estimator, the baseline first.
    pub const ALL: [Estimator; 3] = [
        Estimator::KarmadaGeneral,
        Estimator::KarmadaNode,
        Estimator::Tessera,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Estimator::KarmadaGeneral => "karmada-general",
            Estimator::KarmadaNode => "karmada-node",
            Estimator::Tessera => "tessera",
        }
    }
}

/// How a federation run is set up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FederationConfig {
    /// The fill protocol the arrivals follow (tune ratio, typical pods, knowledge).
    pub fill: FillConfig,
    /// Share of the nodes in each member (normalised); uneven by default.
    pub shares: Vec<f64>,
    /// Most replicas Tessera's estimate counts.
    pub limit: u32,
    /// What one bounce costs, seconds.
    pub redispatch_delay_s: u64,
    /// Jobs decided on one set of estimates.
    pub batch: usize,
}

impl Default for FederationConfig {
    fn default() -> Self {
        FederationConfig {
            fill: FillConfig::default(),
            shares: vec![0.4, 0.3, 0.2, 0.1],
            limit: 64,
            redispatch_delay_s: DESCHEDULER_THRESHOLD_S,
            batch: 1,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FederationResult {
    pub workload: String,
    pub estimator: Estimator,
    pub seed: u64,
    /// Nodes and GPUs of each member.
    pub members: Vec<(usize, usize)>,
    /// Jobs submitted until arrived demand reached 100 % (the counts below are of these).
    pub jobs: usize,
    pub placed: usize,
    /// Sent to a member that could not run them (at least once).
    pub misplaced: usize,
    /// Sends that failed, in all.
    pub bounces: usize,
    /// No member's estimate admitted them.
    pub refused: usize,
    /// Refused although some member's Tessera could have placed them.
    pub refused_but_fit: usize,
    /// Sent everywhere the estimates allowed, placed nowhere.
    pub failed: usize,
    /// Mean queueing delay of the placed jobs, seconds.
    pub mean_delay_s: f64,
    /// Largest queueing delay of a placed job, seconds.
    pub max_delay_s: u64,
    /// Unallocated GPU share at arrived 100 %, per cent of the federation's GPUs.
    pub unallocated_pct_at_100: Option<f64>,
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum FederationError {
    #[error(transparent)]
    Fill(#[from] FillError),
    #[error("shares {0:?}: need at least one positive share, no negative or non-finite one")]
    BadShares(Vec<f64>),
    #[error("member {0} has no nodes: use fewer members or a bigger cluster")]
    EmptyMember(usize),
    #[error("batch must be at least 1")]
    BadBatch,
}

/// One member cluster with its own Tessera.
struct Member {
    cluster: Cluster,
    ledger: Ledger,
    inputs: PolicyInputs,
    scheduler: Scheduler,
}

/// What a request asks in the integer view: CPU, memory, whole GPUs (a share or a MIG
/// instance rounded up to one GPU).
fn integer_ask(req: &Request) -> [u64; 3] {
    [
        req.cpu_milli,
        req.memory_mib,
        u64::from(req.gpu.gpu_count()),
    ]
}

/// min over the requested resources of ⌊free / request⌋, capped by `pods` free slots;
/// 0 when a requested resource has nothing free (Karmada's short path).
fn replicas_of(free: [u64; 3], ask: [u64; 3], pods_free: u64) -> u64 {
    let mut n = pods_free;
    for (f, a) in free.into_iter().zip(ask) {
        if a == 0 {
            continue;
        }
        if f == 0 {
            return 0;
        }
        n = n.min(f / a);
    }
    n
}

impl Member {
    fn new(
        cluster: Cluster,
        make: &mut impl FnMut(PolicyArgs) -> Result<Box<dyn Policy>, UnknownPolicy>,
        typical: Arc<tessera_core::frag::TargetWorkload>,
        pods: &[TracePod],
        config: &FillConfig,
    ) -> Result<Member, FederationError> {
        let ledger = Ledger::new(&cluster);
        let (inputs, policy) = PolicyInputs::start(
            &mut *make,
            typical,
            || config.knowledge.learned(pods, config.learn),
            &cluster,
            &ledger,
        )
        .map_err(FillError::from)?;
        Ok(Member {
            cluster,
            ledger,
            inputs,
            scheduler: Scheduler::new(policy),
        })
    }

    fn free_gpu_milli(&self) -> u64 {
        self.cluster.gpu_count() as u64 * 1000 - self.ledger.used_milli()
    }

    /// Karmada's general estimator on this member's resource summary: free CPU,
    /// memory, idle GPUs and pod slots summed over the nodes.
    fn karmada_general(&self, req: &Request) -> u64 {
        let mut free = [0u64; 3];
        let mut pods = 0u64;
        for u in self.ledger.nodes() {
            free[0] += u.free_cpu_milli;
            free[1] += u.free_memory_mib;
            free[2] += u.idle_gpus() as u64;
            pods += MAX_PODS_PER_NODE.saturating_sub(u64::from(u.allocations));
        }
        replicas_of(free, integer_ask(req), pods)
    }

    /// The integer view per node, on the nodes with a GPU model the job allows.
    fn karmada_node(&self, req: &Request) -> u64 {
        let set = req.constraints.model_set;
        self.cluster
            .nodes()
            .iter()
            .zip(self.ledger.nodes())
            .filter(|(n, _)| {
                req.gpu.gpu_count() == 0 || n.gpus.iter().any(|g| set.contains(g.model))
            })
            .map(|(_, u)| {
                replicas_of(
                    [u.free_cpu_milli, u.free_memory_mib, u.idle_gpus() as u64],
                    integer_ask(req),
                    MAX_PODS_PER_NODE.saturating_sub(u64::from(u.allocations)),
                )
            })
            .sum()
    }

    fn estimate(
        &mut self,
        estimator: Estimator,
        req: &Request,
        limit: u32,
        rng: &mut SmallRng,
    ) -> Result<u64, FillError> {
        Ok(match estimator {
            Estimator::KarmadaGeneral => self.karmada_general(req),
            Estimator::KarmadaNode => self.karmada_node(req),
            Estimator::Tessera => u64::from(
                max_replicas(
                    &mut self.scheduler,
                    &self.cluster,
                    &mut self.ledger,
                    req,
                    limit,
                    rng,
                )
                .map_err(|source| FillError::Ledger {
                    pod: "(estimate)".into(),
                    source,
                })?
                .replicas,
            ),
        })
    }

    /// The pod arrives here: Tessera learns it and places it, or cannot.
    fn arrive(
        &mut self,
        pod: &TracePod,
        make: &mut impl FnMut(PolicyArgs) -> Result<Box<dyn Policy>, UnknownPolicy>,
        rng: &mut SmallRng,
    ) -> Result<bool, FillError> {
        let req = &pod.request;
        if self.inputs.observe(req, &self.ledger) {
            self.scheduler = Scheduler::new(self.inputs.build(&mut *make)?);
        }
        let Some(p) = self.scheduler.place(&self.cluster, &self.ledger, req, rng) else {
            return Ok(false);
        };
        self.ledger
            .apply(&self.cluster, &p)
            .map_err(|source| FillError::Ledger {
                pod: pod.name.clone(),
                source,
            })?;
        Ok(true)
    }

    /// Whether Tessera here could place `req` now (for refused jobs; changes nothing).
    fn could_place(&mut self, req: &Request, rng: &mut SmallRng) -> bool {
        self.scheduler
            .place(&self.cluster, &self.ledger, req, rng)
            .is_some()
    }
}

/// Cuts `cluster`'s nodes (in their order) into members of `shares` of the nodes.
fn split(cluster: &Cluster, shares: &[f64]) -> Result<Vec<Cluster>, FederationError> {
    let total: f64 = shares.iter().sum();
    if shares.is_empty() || shares.iter().any(|s| !s.is_finite() || *s < 0.0) || total <= 0.0 {
        return Err(FederationError::BadShares(shares.to_vec()));
    }
    let nodes = cluster.nodes();
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut acc = 0.0;
    for (i, s) in shares.iter().enumerate() {
        acc += s;
        let end = if i + 1 == shares.len() {
            nodes.len()
        } else {
            ((acc / total) * nodes.len() as f64).round() as usize
        };
        let part: Vec<Node> = nodes[start..end.max(start)].to_vec();
        if part.is_empty() {
            return Err(FederationError::EmptyMember(i));
        }
        start = end.max(start);
        out.push(Cluster::new(cluster.catalog.clone(), part).map_err(FillError::from)?);
    }
    Ok(out)
}

/// Runs the federation experiment for one estimator and seed.
pub fn run_federation(
    cluster: &Cluster,
    pods: &[TracePod],
    estimator: Estimator,
    seed: u64,
    config: &FederationConfig,
) -> Result<FederationResult, FederationError> {
    let fill = &config.fill;
    let capacity = cluster.gpu_count() as u64 * 1000;
    if capacity == 0 {
        return Err(FillError::NoGpus.into());
    }
    if pods.is_empty() {
        return Err(FillError::NoPods.into());
    }
    if !(fill.tune_ratio.is_finite() && fill.tune_ratio > 0.0) {
        return Err(FillError::BadTuneRatio(fill.tune_ratio).into());
    }
    if config.batch == 0 {
        return Err(FederationError::BadBatch);
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    let order = arrival_order(pods, capacity, fill, &mut rng);
    let permuted = permute_nodes(cluster, &mut rng).map_err(FillError::from)?;
    let typical = Arc::new(typical_pods(pods, fill.typical_coverage));
    // Each member builds `tessera` as the fill experiment's `run_fill` does.
    let mut make = |args: PolicyArgs| -> Result<Box<dyn Policy>, UnknownPolicy> {
        tessera_core::policy::by_name("tessera", &args)
    };
    let mut members = split(&permuted, &config.shares)?
        .into_iter()
        .map(|c| Member::new(c, &mut make, typical.clone(), pods, fill))
        .collect::<Result<Vec<_>, _>>()?;

    let cap = capacity as f64;
    let stop = capacity; // the measures count jobs until arrived demand reaches 100 %
    let mut samples = Vec::new();
    let mut r = FederationResult {
        workload: fill.workload.clone(),
        estimator,
        seed,
        members: members
            .iter()
            .map(|m| (m.cluster.len(), m.cluster.gpu_count()))
            .collect(),
        jobs: 0,
        placed: 0,
        misplaced: 0,
        bounces: 0,
        refused: 0,
        refused_but_fit: 0,
        failed: 0,
        mean_delay_s: 0.0,
        max_delay_s: 0,
        unallocated_pct_at_100: None,
    };
    let mut delay_sum = 0u64;
    let mut arrived = 0u64;
    for batch in order.chunks(config.batch) {
        // Rankings on the state before the batch.
        let mut rankings = Vec::with_capacity(batch.len());
        for &i in batch {
            let req = &pods[i].request;
            let mut ranked: Vec<(u64, u64, usize)> = Vec::new();
            for (m, member) in members.iter_mut().enumerate() {
                let n = member.estimate(estimator, req, config.limit, &mut rng)?;
                if n > 0 {
                    ranked.push((n, member.free_gpu_milli(), m));
                }
            }
            ranked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
            rankings.push(ranked.into_iter().map(|(_, _, m)| m).collect::<Vec<_>>());
        }
        for (&i, ranked) in batch.iter().zip(rankings) {
            let pod = &pods[i];
            arrived += pod.request.gpu.total_milli();
            let counted = arrived <= stop;
            let mut bounces = 0usize;
            let mut placed = false;
            for &m in &ranked {
                if members[m].arrive(pod, &mut make, &mut rng)? {
                    placed = true;
                    break;
                }
                bounces += 1;
            }
            if counted {
                r.jobs += 1;
                r.bounces += bounces;
                if bounces > 0 {
                    r.misplaced += 1;
                }
                if ranked.is_empty() {
                    r.refused += 1;
                    if members
                        .iter_mut()
                        .any(|m| m.could_place(&pod.request, &mut rng))
                    {
                        r.refused_but_fit += 1;
                    }
                } else if placed {
                    r.placed += 1;
                    let delay = bounces as u64 * config.redispatch_delay_s;
                    delay_sum += delay;
                    r.max_delay_s = r.max_delay_s.max(delay);
                } else {
                    r.failed += 1;
                }
            }
            let used: u64 = members.iter().map(|m| m.ledger.used_milli()).sum();
            let alloc = used as f64 / cap * 100.0;
            // Only the arrived and unallocated columns are read; FGD's fragmentation
            // is not measured here.
            samples.push(FillPoint {
                arrived_pct: arrived as f64 / cap * 100.0,
                alloc_pct: alloc,
                unallocated_pct: 100.0 - alloc,
                frag_rate_pct: 0.0,
                frag_amount_pct: 0.0,
            });
        }
    }
    if r.placed > 0 {
        r.mean_delay_s = delay_sum as f64 / r.placed as f64;
    }
    r.unallocated_pct_at_100 = discretize(&samples, 100)
        .iter()
        .find(|p| p.arrived_pct == 100.0)
        .map(|p| p.unallocated_pct);
    Ok(r)
}

/// One estimator over seeds, reduced to means.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimatorSummary {
    pub estimator: Estimator,
    pub jobs: f64,
    pub misplaced: (f64, f64),
    pub bounces: f64,
    pub refused: f64,
    pub refused_but_fit: f64,
    pub failed: f64,
    pub mean_delay_s: f64,
    pub unallocated_pct: (f64, f64),
    pub runs: Vec<FederationResult>,
}

/// Every estimator on one workload, over seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FederationReport {
    pub workload: String,
    pub seeds: Vec<u64>,
    pub estimators: Vec<EstimatorSummary>,
}

/// Runs every estimator over `seeds` (in parallel with rayon) on one workload.
pub fn run_federation_seeds(
    workload: &str,
    cluster: &Cluster,
    pods: &[TracePod],
    seeds: &[u64],
    config: &FederationConfig,
    tick: &(dyn Fn() + Sync),
) -> Result<FederationReport, FederationError> {
    use rayon::prelude::*;
    let config = FederationConfig {
        fill: FillConfig {
            workload: workload.to_string(),
            ..config.fill.clone()
        },
        ..config.clone()
    };
    let jobs: Vec<(Estimator, u64)> = Estimator::ALL
        .iter()
        .flat_map(|&e| seeds.iter().map(move |&s| (e, s)))
        .collect();
    let runs = jobs
        .par_iter()
        .map(|&(e, s)| {
            let r = run_federation(cluster, pods, e, s, &config);
            tick();
            r
        })
        .collect::<Result<Vec<_>, _>>()?;
    let estimators = Estimator::ALL
        .iter()
        .map(|&e| {
            let runs: Vec<FederationResult> =
                runs.iter().filter(|r| r.estimator == e).cloned().collect();
            let mean = |f: &dyn Fn(&FederationResult) -> f64| {
                mean_sd(&runs.iter().map(f).collect::<Vec<_>>())
            };
            EstimatorSummary {
                estimator: e,
                jobs: mean(&|r| r.jobs as f64).0,
                misplaced: mean(&|r| r.misplaced as f64),
                bounces: mean(&|r| r.bounces as f64).0,
                refused: mean(&|r| r.refused as f64).0,
                refused_but_fit: mean(&|r| r.refused_but_fit as f64).0,
                failed: mean(&|r| r.failed as f64).0,
                mean_delay_s: mean(&|r| r.mean_delay_s).0,
                unallocated_pct: mean(&|r| r.unallocated_pct_at_100.unwrap_or(f64::NAN)),
                runs,
            }
        })
        .collect();
    Ok(FederationReport {
        workload: workload.to_string(),
        seeds: seeds.to_vec(),
        estimators,
    })
}

/// The terminal table: one row per (workload, estimator), Tessera's change against
/// Karmada's general estimator on its row.
pub fn render_table(reports: &[FederationReport]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<28} {:<16} {:>7} {:>16} {:>8} {:>8} {:>9} {:>7} {:>10} {:>14}",
        "workload",
        "estimator",
        "jobs",
        "misplaced",
        "bounces",
        "refused",
        "ref.+fit",
        "failed",
        "delay s",
        "unalloc %"
    );
    for rep in reports {
        let base = rep
            .estimators
            .iter()
            .find(|e| e.estimator == Estimator::KarmadaGeneral);
        for e in &rep.estimators {
            let vs = |ours: f64, theirs: Option<f64>| match theirs {
                Some(t) if e.estimator != Estimator::KarmadaGeneral && t > 0.0 => {
                    format!(" ({:+.0} %)", (ours - t) / t * 100.0)
                }
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "{:<28} {:<16} {:>7.0} {:>16} {:>8.1} {:>8.1} {:>9.1} {:>7.1} {:>10.1} {:>14}",
                rep.workload,
                e.estimator.label(),
                e.jobs,
                format!(
                    "{:.1}{}",
                    e.misplaced.0,
                    vs(e.misplaced.0, base.map(|b| b.misplaced.0))
                ),
                e.bounces,
                e.refused,
                e.refused_but_fit,
                e.failed,
                e.mean_delay_s,
                format!(
                    "{:.2}{}",
                    e.unallocated_pct.0,
                    vs(e.unallocated_pct.0, base.map(|b| b.unallocated_pct.0))
                ),
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::model::Catalog;

    /// 8-GPU and 2-GPU nodes of two models: enough room for fragmentation to matter.
    fn cluster() -> Cluster {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let g2 = cat.find("G2").unwrap();
        let mut nodes = Vec::new();
        for i in 0..16 {
            nodes.push(Node::uniform(format!("t4-{i}"), 32_000, 128_000, t4, 2));
            nodes.push(Node::uniform(format!("g2-{i}"), 96_000, 384_000, g2, 8));
        }
        Cluster::new(cat, nodes).unwrap()
    }

    /// openb-like: mostly shares, some whole and multi-GPU pods, a few CPU-only.
    fn pods() -> Vec<TracePod> {
        let shapes = [
            Request::share_milli(500, 4000, 8000),
            Request::share_milli(250, 2000, 8000),
            Request::share_milli(810, 3000, 8000),
            Request::whole(1, 8000, 16000),
            Request::whole(8, 32000, 64000),
            Request::share_milli(300, 2000, 8000),
            Request::whole(2, 16000, 32000),
            Request::whole(4, 16000, 32000),
            Request::cpu_only(6000, 8000),
        ];
        (0..120)
            .map(|i| TracePod {
                name: format!("pod-{i:03}"),
                request: shapes[i % shapes.len()].clone(),
                creation_s: None,
                deletion_s: None,
                scheduled_s: None,
            })
            .collect()
    }

    /// Tessera's estimate sends no job where it cannot run (every job it admits is
    /// placed where it was sent: same path as placement), misplaces no more than either
    /// Karmada view, refuses only jobs no member can place, and the counts add up.
    #[test]
    fn tessera_estimate_misplaces_nothing_and_refuses_only_what_fits_nowhere() {
        let (c, p) = (cluster(), pods());
        let config = FederationConfig::default();
        let mut general_misplaced = 0;
        for seed in [42, 43, 44] {
            let t = run_federation(&c, &p, Estimator::Tessera, seed, &config).unwrap();
            assert_eq!(t.misplaced, 0, "seed {seed}: {t:?}");
            assert_eq!(t.bounces, 0);
            assert_eq!(t.failed, 0);
            assert_eq!(t.refused_but_fit, 0, "seed {seed}: {t:?}");
            assert_eq!(t.placed + t.refused, t.jobs);
            for e in [Estimator::KarmadaGeneral, Estimator::KarmadaNode] {
                let k = run_federation(&c, &p, e, seed, &config).unwrap();
                assert_eq!(k.placed + k.refused + k.failed, k.jobs, "{k:?}");
                assert!(t.misplaced <= k.misplaced);
                if e == Estimator::KarmadaGeneral {
                    general_misplaced += k.misplaced;
                }
                assert_eq!(k.jobs, t.jobs, "same arrivals");
                assert_eq!(k.members, t.members, "same members");
            }
        }
        // The cluster and jobs do make the integer view send jobs where they cannot
        // run (8-GPU jobs on members whose idle GPUs are scattered), so the
        // comparison above is not empty.
        assert!(general_misplaced > 0);
    }

    /// Same inputs, same JSON; members are uneven and cover every node once.
    #[test]
    fn deterministic_and_members_cover_the_cluster() {
        let (c, p) = (cluster(), pods());
        let config = FederationConfig::default();
        let a = run_federation(&c, &p, Estimator::KarmadaGeneral, 7, &config).unwrap();
        let b = run_federation(&c, &p, Estimator::KarmadaGeneral, 7, &config).unwrap();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        assert_eq!(a.members.iter().map(|m| m.0).sum::<usize>(), c.len());
        assert_eq!(a.members.iter().map(|m| m.1).sum::<usize>(), c.gpu_count());
        assert!(a.members[0].0 > a.members[3].0);
        assert!(a.unallocated_pct_at_100.is_some());
    }

    /// The general estimator's arithmetic: integer GPUs, cluster-wide, pods capped.
    #[test]
    fn integer_views_count_as_karmada_does() {
        // free 10 CPU, 100 MiB, 3 GPUs; ask 2 CPU, 10 MiB, 1 GPU: min(5, 10, 3) = 3.
        assert_eq!(replicas_of([10, 100, 3], [2, 10, 1], 110), 3);
        // Nothing free of a requested resource: 0 (Karmada's short path).
        assert_eq!(replicas_of([10, 100, 0], [2, 10, 1], 110), 0);
        // A resource not asked for does not bound; pod slots do.
        assert_eq!(replicas_of([10, 100, 0], [2, 10, 0], 4), 4);
        // A one-GPU member holding one 0.25 share: the integer view sees no GPU free
        // (the share is rounded up to the whole GPU), Tessera three more shares.
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let c = Cluster::new(cat, vec![Node::uniform("n", 32_000, 128_000, t4, 1)]).unwrap();
        let config = FillConfig::default();
        let mut make = |args: PolicyArgs| tessera_core::policy::by_name("tessera", &args);
        let typical = Arc::new(typical_pods(&pods(), 0.95));
        let mut m = Member::new(c, &mut make, typical, &pods(), &config).unwrap();
        let share = Request::share_milli(250, 1000, 1000);
        assert_eq!(m.karmada_general(&share), 1);
        assert_eq!(m.karmada_node(&share), 1);
        let pod = TracePod {
            name: "s".into(),
            request: share.clone(),
            creation_s: None,
            deletion_s: None,
            scheduled_s: None,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        assert!(m.arrive(&pod, &mut make, &mut rng).unwrap());
        assert_eq!(m.karmada_general(&share), 0);
        assert_eq!(m.karmada_node(&share), 0);
        let t = m
            .estimate(Estimator::Tessera, &share, u32::MAX, &mut rng)
            .unwrap();
        assert_eq!(t, 3);
        // CPU bounds the integer view too: 32 cores / 31 per pod = 1 on an idle GPU.
        let m2 = Member::new(
            Cluster::new(
                Catalog::default(),
                vec![Node::uniform("n", 32_000, 128_000, t4, 2)],
            )
            .unwrap(),
            &mut make,
            Arc::new(typical_pods(&pods(), 0.95)),
            &pods(),
            &config,
        )
        .unwrap();
        assert_eq!(m2.karmada_general(&Request::whole(1, 31_000, 1000)), 1);
        assert_eq!(m2.karmada_general(&Request::whole(1, 1000, 1000)), 2);
        assert_eq!(m2.karmada_general(&Request::cpu_only(1000, 1000)), 32);
    }

    #[test]
    fn bad_configs_are_errors() {
        let (c, p) = (cluster(), pods());
        let bad = FederationConfig {
            shares: vec![],
            ..FederationConfig::default()
        };
        assert!(matches!(
            run_federation(&c, &p, Estimator::Tessera, 1, &bad),
            Err(FederationError::BadShares(_))
        ));
        let many = FederationConfig {
            shares: vec![1.0; 40],
            ..FederationConfig::default()
        };
        assert!(matches!(
            run_federation(&c, &p, Estimator::Tessera, 1, &many),
            Err(FederationError::EmptyMember(_))
        ));
        let batch = FederationConfig {
            batch: 0,
            ..FederationConfig::default()
        };
        assert!(matches!(
            run_federation(&c, &p, Estimator::Tessera, 1, &batch),
            Err(FederationError::BadBatch)
        ));
    }
}
