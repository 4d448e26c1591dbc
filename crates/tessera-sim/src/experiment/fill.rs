//! The *fill* experiment: the FGD paper's protocol on a trace (see
//! `docs/fgd-protocol.md` in the shared reference material).
//!
//! 1. Sort the trace's pods by name and shuffle them with the seed.
//! 2. Inflate ("tune") the list to `tune_ratio` × the cluster's GPU capacity by
//!    appending pods drawn with replacement from the original list, or trim it by
//!    removing random pods when the trace already asks for more.
//! 3. Submit the pods one by one. Each is placed once or fails; nobody leaves and
//!    nothing is retried. CPU, memory and GPU model are hard constraints (the core's
//!    fit filter).
//! 4. After every arrival, sample the arrived workload (GPU demand submitted so
//!    far, placed or not), the GPU allocation ratio and FGD's fragmentation against
//!    the typical pods of the original trace; reduce the samples to the
//!    integer-percent curve of the artifact's merge script.
//!
//! One seeded RNG drives the shuffle, the inflation and the policy's own choices,
//! so the same inputs give the same [`FillResult`] (and byte-identical JSON).

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tessera_core::Scheduler;
use tessera_core::frag::TargetWorkload;
use tessera_core::ledger::{Ledger, LedgerError};
use tessera_core::model::{Cluster, ClusterError};
use tessera_core::policy::{self, Policy, PolicyArgs, PolicyInputs, UnknownPolicy};
use tessera_core::request::Request;
use tessera_core::workload::{LearnConfig, LearnedWorkload};

use crate::metrics::{FillPoint, FragTracker, discretize};
use crate::trace::TracePod;

/// The seeds of the published experiments start here (`-tuneseed 42…51`).
pub const FIRST_SEED: u64 = 42;

/// The seeds for `n` repetitions: 42, 43, … (`--seeds 10` → 42..=51).
pub fn seeds(n: u32) -> Vec<u64> {
    (0..u64::from(n)).map(|i| FIRST_SEED + i).collect()
}

/// How a fill run is set up. [`Default`] is the published protocol.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FillConfig {
    /// Name of the workload (the trace), copied into the result.
    pub workload: String,
    /// Inflate or trim the pod list to this multiple of the cluster's GPU capacity (1.3).
    pub tune_ratio: f64,
    /// Share of pods the typical-pod shapes must cover (0.95).
    pub typical_coverage: f64,
    /// Shuffle the pods (after sorting by name) with the seed (true).
    pub shuffle: bool,
    /// Last integer arrived-% column of the curve (130).
    pub max_pct: u32,
    /// Put the nodes in a seeded random order before scheduling (true). The artifact
    /// prefixes every node name with a random permutation index
    /// (`syncClusterResourceList`) and breaks score ties by name, so ties go to a
    /// random but fixed node order per seed; `false` keeps file order.
    pub permute_nodes: bool,
    /// What workload-aware policies know of the workload.
    pub knowledge: Knowledge,
    /// How policies that learn their workload learn it (the prior's mass is replaced by
    /// the trace's pod count under [`Knowledge::Typical`]).
    #[serde(skip)]
    pub learn: LearnConfig,
}

/// What a policy that learns its workload ([`Policy::learns_workload`]: `tessera`) knows
/// up front. Either way it then learns from the pods that have arrived
/// ([`LearnedWorkload`]) and is rebuilt each time the learned target moves. Policies that
/// do not learn (FGD) always get the trace's typical pods, as published.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub enum Knowledge {
    /// The trace's pod list, from which FGD's typical pods are computed: the prior is
    /// the histogram of all its shapes (FGD keeps the 95 % most frequent; rare shapes,
    /// such as every multi-GPU shape of `default`, are what protects 8-GPU nodes),
    /// holding as many pods as the trace has.
    #[default]
    Typical,
    /// Nothing: the generic cold-start prior ([`LearnedWorkload::cold_start`]).
    Online,
}

impl Knowledge {
    /// What a learning policy starts from on `pods` and learns with `learn`.
    pub fn learned(self, pods: &[TracePod], learn: LearnConfig) -> LearnedWorkload {
        match self {
            Knowledge::Typical => {
                let learn = LearnConfig {
                    prior_mass: pods.len() as f64,
                    ..learn
                };
                LearnedWorkload::new(&typical_pods(pods, 1.0), learn)
            }
            Knowledge::Online => LearnedWorkload::cold_start(learn),
        }
    }
}

impl Default for FillConfig {
    fn default() -> Self {
        FillConfig {
            workload: String::new(),
            tune_ratio: 1.3,
            typical_coverage: 0.95,
            shuffle: true,
            max_pct: 130,
            permute_nodes: true,
            knowledge: Knowledge::Typical,
            learn: LearnConfig::default(),
        }
    }
}

impl FillConfig {
    /// The published protocol for the named workload.
    pub fn for_workload(name: impl Into<String>) -> FillConfig {
        FillConfig {
            workload: name.into(),
            ..FillConfig::default()
        }
    }
}

/// What one fill run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FillResult {
    pub workload: String,
    pub policy: String,
    pub seed: u64,
    pub tune_ratio: f64,
    /// Cluster GPU capacity in milli-GPU (the 100 % of every percentage).
    pub capacity_gpu_milli: u64,
    /// Pods submitted after inflation or trimming.
    pub pods_submitted: usize,
    pub pods_placed: usize,
    pub pods_failed: usize,
    /// Measures at integer arrived % 0..=`max_pct` (columns without samples are left out).
    pub curve: Vec<FillPoint>,
    /// The curve's point at arrived = 100 % (what the paper's bar charts show), if reached.
    pub at_100: Option<FillPoint>,
}

/// A fill run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
    #[error("the cluster has no GPUs")]
    NoGpus,
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("the trace has no pods")]
    NoPods,
    #[error("tune ratio {0} must be a positive number")]
    BadTuneRatio(f64),
    /// The scheduler proposed a placement the ledger refused: a bug, never a normal outcome.
    #[error("placement of pod {pod} refused by the ledger: {source}")]
    Ledger {
        pod: String,
        #[source]
        source: LedgerError,
    },
}

/// The typical pods of a trace (FGD's target workload): the most frequent shapes
/// of the original pods covering `coverage` of them.
pub fn typical_pods(pods: &[TracePod], coverage: f64) -> TargetWorkload {
    TargetWorkload::from_requests(pods.iter().map(|p| &p.request), coverage)
}

/// The submission order: sorted by name, shuffled with `rng`, then inflated with
/// copies drawn with replacement (or trimmed) to `tune_ratio` × `capacity_milli`.
/// Returns indices into `pods`.
pub fn arrival_order(
    pods: &[TracePod],
    capacity_milli: u64,
    config: &FillConfig,
    rng: &mut SmallRng,
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|&a, &b| pods[a].name.cmp(&pods[b].name));
    if config.shuffle {
        order.shuffle(rng);
    }
    let demand = |i: usize| pods[i].request.gpu.total_milli();
    let target = (config.tune_ratio * capacity_milli as f64) as u64;
    let mut total: u64 = order.iter().map(|&i| demand(i)).sum();
    if total < target {
        // Append draws until one would exceed the target. As in the artifact's
        // `tuneUpPods`, the check adds the draw's per-GPU milli, not its total.
        let originals = order.clone();
        loop {
            let pick = originals[rng.random_range(0..originals.len())];
            if total + u64::from(pods[pick].request.gpu.milli_per_gpu()) > target {
                break;
            }
            total += demand(pick);
            order.push(pick);
        }
    } else {
        // Remove random pods until the rest fits.
        while total > target && !order.is_empty() {
            let at = rng.random_range(0..order.len());
            total -= demand(order[at]);
            order.remove(at);
        }
    }
    order
}

/// The cluster with its nodes in a seeded random order (see [`FillConfig::permute_nodes`]).
pub fn permute_nodes(cluster: &Cluster, rng: &mut SmallRng) -> Result<Cluster, ClusterError> {
    let mut nodes = cluster.nodes().to_vec();
    nodes.shuffle(rng);
    Cluster::new(cluster.catalog.clone(), nodes)
}

/// Runs the fill experiment with the policy named `policy_name` (see
/// [`tessera_core::policy::NAMES`]), built by [`policy::by_name`] from the target
/// workload ([`FillConfig::knowledge`]) and the cluster's GPU supply by model.
pub fn run_fill(
    cluster: &Cluster,
    pods: &[TracePod],
    policy_name: &str,
    seed: u64,
    config: &FillConfig,
) -> Result<FillResult, FillError> {
    run_fill_with(
        cluster,
        pods,
        policy_name,
        |args| policy::by_name(policy_name, &args),
        seed,
        config,
    )
}

/// The policy [`run_fill`] uses for `policy_name` on `ledger`'s state: [`policy::by_name`]
/// with the target workload and the GPU compute the ledger leaves free per model.
pub fn fill_policy(
    ledger: &Ledger,
    policy_name: &str,
    workload: Arc<TargetWorkload>,
) -> Result<Box<dyn Policy>, UnknownPolicy> {
    policy::by_name(policy_name, &PolicyArgs::for_ledger(workload, ledger))
}

/// [`run_fill`] with a policy built by `make_policy` from the target workload and the
/// GPU supply (for policies with arguments beyond [`PolicyArgs`]); `policy_name`
/// labels the result. For a policy that learns, `make_policy` is called again each
/// time the learned target or the free GPU supply moves.
pub fn run_fill_with(
    cluster: &Cluster,
    pods: &[TracePod],
    policy_name: &str,
    make_policy: impl FnMut(PolicyArgs) -> Result<Box<dyn Policy>, UnknownPolicy>,
    seed: u64,
    config: &FillConfig,
) -> Result<FillResult, FillError> {
    let capacity = cluster.gpu_count() as u64 * 1000;
    let cap = capacity as f64;
    let sample = |arrived: u64, ledger: &Ledger, frag: &FragTracker| {
        let alloc = ledger.used_milli() as f64 / cap * 100.0;
        FillPoint {
            arrived_pct: arrived as f64 / cap * 100.0,
            alloc_pct: alloc,
            unallocated_pct: 100.0 - alloc,
            frag_rate_pct: frag.frag_rate_pct(),
            frag_amount_pct: frag.frag_milli() / cap * 100.0,
        }
    };
    let mut samples = Vec::new();
    let mut tracker: Option<FragTracker> = None;
    let run = drive(
        cluster,
        pods,
        make_policy,
        seed,
        config,
        None,
        |event| match event {
            Event::Start {
                cluster,
                ledger,
                typical,
            } => {
                let t = FragTracker::new(cluster, ledger, typical.clone());
                samples.push(sample(0, ledger, &t));
                tracker = Some(t);
            }
            Event::Arrived {
                cluster,
                ledger,
                arrived,
                placed,
                ..
            } => {
                if let Some(t) = &mut tracker {
                    if let Some((node, _)) = placed {
                        t.update(cluster, ledger, node);
                    }
                    samples.push(sample(arrived, ledger, t));
                }
            }
        },
    )?;
    let curve = discretize(&samples, config.max_pct);
    let at_100 = curve.iter().find(|p| p.arrived_pct == 100.0).copied();
    Ok(FillResult {
        workload: config.workload.clone(),
        policy: policy_name.to_string(),
        seed,
        tune_ratio: config.tune_ratio,
        capacity_gpu_milli: capacity,
        pods_submitted: run.submitted,
        pods_placed: run.placed,
        pods_failed: run.failed,
        curve,
        at_100,
    })
}

/// What [`drive`] tells its caller as the fill goes.
pub(crate) enum Event<'a> {
    /// Before the first arrival: the cluster as permuted, the empty ledger and the
    /// trace's typical pods (FGD's fragmentation measure).
    Start {
        cluster: &'a Cluster,
        ledger: &'a Ledger,
        typical: &'a TargetWorkload,
    },
    /// After each arrival: GPU demand arrived so far, and where the pod went.
    Arrived {
        cluster: &'a Cluster,
        ledger: &'a Ledger,
        arrived: u64,
        pod: &'a TracePod,
        placed: Option<(tessera_core::model::NodeId, tessera_core::AllocId)>,
    },
}

/// How a fill run ended.
pub(crate) struct Driven {
    /// The cluster as permuted for the seed.
    pub cluster: Cluster,
    pub ledger: Ledger,
    /// The workload the policy measured fragment against at the end: the learned
    /// target for a policy that learns, the trace's typical pods otherwise.
    pub target: Arc<TargetWorkload>,
    pub submitted: usize,
    pub placed: usize,
    pub failed: usize,
}

/// The fill itself, shared by [`run_fill_with`] and the snapshots
/// ([`super::snapshot::fill_until`]) so that both run the same policy on the same
/// information: the arrival order and node permutation of `seed`, the policy built
/// by `make_policy` from what [`FillConfig::knowledge`] allows and rebuilt as the
/// learned target moves. Stops before the pod that would take the arrived GPU
/// demand past `stop_milli` (none: the whole order).
pub(crate) fn drive(
    cluster: &Cluster,
    pods: &[TracePod],
    mut make_policy: impl FnMut(PolicyArgs) -> Result<Box<dyn Policy>, UnknownPolicy>,
    seed: u64,
    config: &FillConfig,
    stop_milli: Option<u64>,
    mut on: impl FnMut(Event<'_>),
) -> Result<Driven, FillError> {
    let capacity = cluster.gpu_count() as u64 * 1000;
    if capacity == 0 {
        return Err(FillError::NoGpus);
    }
    if pods.is_empty() {
        return Err(FillError::NoPods);
    }
    if !(config.tune_ratio.is_finite() && config.tune_ratio > 0.0) {
        return Err(FillError::BadTuneRatio(config.tune_ratio));
    }
    let workload = typical_pods(pods, config.typical_coverage);
    let mut rng = SmallRng::seed_from_u64(seed);
    let order = arrival_order(pods, capacity, config, &mut rng);
    let cluster = if config.permute_nodes {
        permute_nodes(cluster, &mut rng)?
    } else {
        cluster.clone()
    };
    let mut ledger = Ledger::new(&cluster);
    // A policy that learns follows its learned target and the free GPU supply.
    let (mut inputs, policy) = PolicyInputs::start(
        &mut make_policy,
        Arc::new(workload.clone()),
        || config.knowledge.learned(pods, config.learn),
        &cluster,
        &ledger,
    )?;
    let mut scheduler = Scheduler::new(policy);
    on(Event::Start {
        cluster: &cluster,
        ledger: &ledger,
        typical: &workload,
    });
    let (mut arrived, mut submitted, mut placed, mut failed) = (0u64, 0usize, 0usize, 0usize);
    for &i in &order {
        let pod = &pods[i];
        let req: &Request = &pod.request;
        if stop_milli.is_some_and(|stop| arrived + req.gpu.total_milli() > stop) {
            break;
        }
        arrived += req.gpu.total_milli();
        submitted += 1;
        if inputs.observe(req, &ledger) {
            scheduler = Scheduler::new(inputs.build(&mut make_policy)?);
        }
        let at = match scheduler.place(&cluster, &ledger, req, &mut rng) {
            Some(p) => {
                let node = p.node;
                let id = ledger
                    .apply(&cluster, &p)
                    .map_err(|source| FillError::Ledger {
                        pod: pod.name.clone(),
                        source,
                    })?;
                placed += 1;
                Some((node, id))
            }
            None => {
                failed += 1;
                None
            }
        };
        on(Event::Arrived {
            cluster: &cluster,
            ledger: &ledger,
            arrived,
            pod,
            placed: at,
        });
    }
    Ok(Driven {
        target: inputs.target(),
        cluster,
        ledger,
        submitted,
        placed,
        failed,
    })
}

/// [`run_fill`] for several seeds in parallel (rayon); results in seed order.
pub fn run_fill_seeds(
    cluster: &Cluster,
    pods: &[TracePod],
    policy_name: &str,
    seeds: &[u64],
    config: &FillConfig,
) -> Result<Vec<FillResult>, FillError> {
    use rayon::prelude::*;
    seeds
        .par_iter()
        .map(|&s| run_fill(cluster, pods, policy_name, s, config))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::model::{Catalog, Node};

    fn cluster() -> Cluster {
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let g2 = cat.find("G2").unwrap();
        let mut nodes = Vec::new();
        for i in 0..12 {
            nodes.push(Node::uniform(format!("t4-{i}"), 32_000, 128_000, t4, 2));
            nodes.push(Node::uniform(format!("g2-{i}"), 96_000, 384_000, g2, 8));
        }
        Cluster::new(cat, nodes).unwrap()
    }

    fn pods() -> Vec<TracePod> {
        let shapes = [
            Request::share_milli(500, 4000, 8000),
            Request::share_milli(810, 3000, 8000),
            Request::whole(1, 8000, 16000),
            Request::whole(2, 32000, 64000),
            Request::cpu_only(6000, 8000),
        ];
        (0..40)
            .map(|i| TracePod {
                name: format!("pod-{i:03}"),
                request: shapes[i % shapes.len()].clone(),
                creation_s: None,
                deletion_s: None,
                scheduled_s: None,
            })
            .collect()
    }

    #[test]
    fn inflation_stops_before_the_target_and_trimming_gets_under_it() {
        let pods = pods();
        let demand: u64 = pods.iter().map(|p| p.request.gpu.total_milli()).sum();
        let total = |order: &[usize]| -> u64 {
            order
                .iter()
                .map(|&i| pods[i].request.gpu.total_milli())
                .sum()
        };
        let config = FillConfig::default();
        // Capacity such that the trace is half of 1.3 × capacity: inflation doubles it.
        let capacity = (demand as f64 * 2.0 / 1.3) as u64;
        let mut rng = SmallRng::seed_from_u64(1);
        let order = arrival_order(&pods, capacity, &config, &mut rng);
        let target = (1.3 * capacity as f64) as u64;
        assert!(order.len() > pods.len());
        assert!(
            total(&order) <= target + 4000,
            "{} vs {target}",
            total(&order)
        );
        assert!(total(&order) > target - 4000);
        // The original pods come first, each once.
        let mut first: Vec<usize> = order[..pods.len()].to_vec();
        first.sort_unstable();
        assert_eq!(first, (0..pods.len()).collect::<Vec<_>>());
        // Capacity such that the trace asks for twice 1.3 ×: pods are removed.
        let capacity = (demand as f64 / 2.0 / 1.3) as u64;
        let order = arrival_order(&pods, capacity, &config, &mut rng);
        assert!(order.len() < pods.len());
        assert!(total(&order) <= (1.3 * capacity as f64) as u64);
    }

    #[test]
    fn same_inputs_same_json_and_sane_curve() {
        let (c, p) = (cluster(), pods());
        let config = FillConfig::for_workload("synthetic");
        let a = run_fill(&c, &p, "fgd", 42, &config).unwrap();
        let b = run_fill(&c, &p, "fgd", 42, &config).unwrap();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        assert_eq!(a.pods_placed + a.pods_failed, a.pods_submitted);
        assert_eq!(a.curve.first().map(|p| p.arrived_pct), Some(0.0));
        assert_eq!(a.curve.first().map(|p| p.alloc_pct), Some(0.0));
        for w in a.curve.windows(2) {
            assert!(w[0].arrived_pct < w[1].arrived_pct);
            // A column may average samples up to 1 point above its label (the ±1 fallback).
            assert!(w[1].alloc_pct <= w[1].arrived_pct + 1.0 + 1e-9);
        }
        let at = a.at_100.unwrap();
        assert!((at.alloc_pct + at.unallocated_pct - 100.0).abs() < 1e-9);
        assert!(at.frag_rate_pct >= 0.0 && at.frag_rate_pct <= 100.0 + 1e-9);
        // Random depends on the seed.
        let r1 = run_fill(&c, &p, "random", 1, &config).unwrap();
        let r2 = run_fill(&c, &p, "random", 2, &config).unwrap();
        assert_ne!(
            serde_json::to_string(&r1.curve).unwrap(),
            serde_json::to_string(&r2.curve).unwrap()
        );
    }

    #[test]
    fn online_knowledge_is_deterministic_and_leaves_fgd_alone() {
        let (c, p) = (cluster(), pods());
        let typical = FillConfig::for_workload("synthetic");
        let online = FillConfig {
            knowledge: Knowledge::Online,
            ..typical.clone()
        };
        let json = |r: FillResult| serde_json::to_string(&r).unwrap();
        let a = run_fill(&c, &p, "tessera", 42, &online).unwrap();
        let b = run_fill(&c, &p, "tessera", 42, &online).unwrap();
        assert_eq!(json(a.clone()), json(b));
        assert_eq!(a.pods_placed + a.pods_failed, a.pods_submitted);
        // FGD does not learn its workload: what learners know up front does not change it.
        let f_online = run_fill(&c, &p, "fgd", 42, &online).unwrap();
        let f_typical = run_fill(&c, &p, "fgd", 42, &typical).unwrap();
        assert_eq!(json(f_online), json(f_typical));
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (c, p) = (cluster(), pods());
        let config = FillConfig::default();
        assert!(matches!(
            run_fill(&c, &p, "nope", 1, &config),
            Err(FillError::UnknownPolicy(_))
        ));
        assert!(matches!(
            run_fill(&c, &[], "fgd", 1, &config),
            Err(FillError::NoPods)
        ));
        let bad = FillConfig {
            tune_ratio: f64::NAN,
            ..FillConfig::default()
        };
        assert!(matches!(
            run_fill(&c, &p, "fgd", 1, &bad),
            Err(FillError::BadTuneRatio(_))
        ));
        let empty = Cluster::new(Catalog::default(), Vec::new()).unwrap();
        assert!(matches!(
            run_fill(&empty, &p, "fgd", 1, &config),
            Err(FillError::NoGpus)
        ));
    }
}
