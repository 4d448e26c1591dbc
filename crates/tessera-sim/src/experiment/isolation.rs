//! The *isolation* experiment (issue 13): one request, any isolation.
//!
//! Pods ask for a GPU share with `hard` or `soft` isolation; four ways of running a
//! MIG-capable cluster are compared on the same pods in the same order:
//!
//! - **static `all-1g.10gb`**: an administrator puts part of the GPUs in MIG mode
//!   with seven `1g.10gb` instances each (mig-parted's `all-1g.10gb`);
//! - **static balanced**: the same GPUs with NVIDIA's balanced layout
//!   (mig-parted's `all-balanced`: `2g.20gb`, 2 × `1g.10gb`, `3g.40gb`);
//! - **MPS only**: no MIG at all, so a hard share needs a whole GPU;
//! - **Tessera dynamic**: no GPU starts in MIG mode; every node carries
//!   `tessera.io/mig-dynamic: mode`, so the scheduler chooses per request and GPU
//!   ([`tessera_core::fit::mig_layout::choose`]) and creates the smallest covering
//!   instance where it fragments least, switching idle GPUs into MIG mode.
//!
//! In the static arms the MIG pool is sized as an administrator would: the share of
//! the cluster's GPUs equal to the hard shares' share of all GPU demand (rounded),
//! spread over the nodes from the lowest GPU index up. A hard share there takes the
//! smallest free instance that covers it, or else a whole plain GPU; a soft share
//! uses MPS on a plain GPU. The same placement policy (`bestfit` by default) picks
//! nodes and GPUs in every arm.
//!
//! **Cluster** ([`builtin_cluster`]): 12 nodes of 8 × H100-80GB and 12 of
//! 8 × A100-80GB (192 GPUs), 512 cores and 4 TiB each, so that GPUs, not hosts,
//! bind.
//!
//! **Workload** ([`derive_workload`]): the GPU pods of an openb pod list (or of the
//! built-in synthetic one) in trace order. A one-GPU share of `m` per-mille becomes
//! a share of `m` per-mille of memory and of compute (`tessera.io/gpu-milli: m`);
//! it is `hard` with probability `hard_pct` % (seeded, per pod), `soft` otherwise.
//! Whole-GPU pods stay whole (exclusive); CPU-only pods are left out; model
//! constraints are dropped (openb's models are not in this cluster). On an H100 a
//! hard share of 320 ‰ needs 26,099 MiB and 32 % of the SMs: `3g.40gb`.
//!
//! **Measures.** *Fill* (FGD's protocol): pods drawn from the workload with
//! replacement in a seeded order until the arrived GPU demand equals the cluster's
//! GPUs; no pod leaves. Reported at that point: *unallocated GPUs* (capacity no
//! grant holds, in GPUs, as FGD counts it), *unserved GPUs* (capacity serving no
//! pod's request: unallocated plus what whole GPUs and instances hold beyond the
//! request), and rejected pods by kind, with where the capacity went: unallocated
//! on GPUs in MIG mode and on plain GPUs, and granted beyond requests (whole GPUs
//! and instances larger than the share they serve); capacity = requests served +
//! granted beyond them + unallocated. *Replay*: the first `replay_pods` pods of
//! the workload arrive at their trace times divided by a time-scale chosen so the
//! offered load is `replay_load` of the cluster, run for their trace run time and
//! leave; a pod that fits nowhere is rejected. Reported: rejections and MIG
//! re-partitions (an instance created, or a GPU switched into or out of MIG mode)
//! per hour of replayed time. The simulated node agent applies a planned instance
//! at once (destroying free instances in its way, never held ones) and resets a GPU
//! out of MIG mode as soon as no allocation holds an instance on it (no grace
//! period, which counts re-partitions high rather than low).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tessera_core::fit::mig_layout::{self, LABEL_MIG_DYNAMIC};
use tessera_core::frag::TargetWorkload;
use tessera_core::ledger::{AllocId, Ledger};
use tessera_core::model::file::mig_instances;
use tessera_core::model::{Catalog, Cluster, MigInstance, Node, NodeId};
use tessera_core::placement::Placement;
use tessera_core::policy::UnknownPolicy;
use tessera_core::request::{Constraints, GpuAsk, IsolationLevel, Request};
use tessera_core::scheduler::Scheduler;

use super::learner::Learner;
use crate::trace::TracePod;

/// The built-in cluster: `(nodes, GPUs per node, model)`.
pub const CLUSTER_MIX: [(u32, u32, &str); 2] = [(12, 8, "H100-80GB"), (12, 8, "A100-80GB")];

/// mig-parted's `all-1g.10gb` for the 80 GB parts.
pub const LAYOUT_ALL_1G: [&str; 7] = ["1g.10gb"; 7];
/// mig-parted's `all-balanced` for the 80 GB parts, in creation order.
pub const LAYOUT_BALANCED: [&str; 4] = ["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"];

/// The built-in MIG-capable cluster ([`CLUSTER_MIX`]).
pub fn builtin_cluster() -> Cluster {
    let catalog = Catalog::default();
    let mut nodes = Vec::new();
    for &(count, gpus, model) in &CLUSTER_MIX {
        let id = catalog
            .find(model)
            .expect("built-in GPU model names are in the default catalog");
        for _ in 0..count {
            let name = format!("mig-node-{:02}", nodes.len());
            let mut n = Node::uniform(name, 512_000, 4 << 20, id, gpus);
            for g in &mut n.gpus {
                g.uuid = format!("GPU-{}-{}", nodes.len(), g.index);
            }
            nodes.push(n);
        }
    }
    Cluster::new(catalog, nodes).expect("built-in cluster is valid")
}

/// How the cluster runs isolation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    StaticAll1g,
    StaticBalanced,
    MpsOnly,
    TesseraDynamic,
}

impl Arm {
    pub const ALL: [Arm; 4] = [
        Arm::StaticAll1g,
        Arm::StaticBalanced,
        Arm::MpsOnly,
        Arm::TesseraDynamic,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Arm::StaticAll1g => "static all-1g.10gb",
            Arm::StaticBalanced => "static balanced",
            Arm::MpsOnly => "MPS only",
            Arm::TesseraDynamic => "tessera dynamic",
        }
    }
}

/// One pod of the experiment's workload.
#[derive(Debug, Clone, PartialEq)]
pub struct IsoPod {
    pub request: Request,
    /// Seconds from the trace start.
    pub arrive_s: u64,
    /// Run time in seconds (at least 1).
    pub run_s: u64,
}

impl IsoPod {
    fn kind(&self) -> Kind {
        match (self.request.level, &self.request.gpu) {
            (Some(IsolationLevel::Hard), _) => Kind::Hard,
            (_, GpuAsk::Shared { .. }) => Kind::Soft,
            _ => Kind::Whole,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Hard,
    Soft,
    Whole,
}

/// Settings of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct IsolationConfig {
    /// Seeds the hard/soft draw, the fill order and the policy.
    pub seed: u64,
    /// Per cent of one-GPU shares that ask for hard isolation.
    pub hard_pct: u32,
    /// Placement policy of every arm.
    pub policy: String,
    /// Replay: offered GPU load as a fraction of the cluster.
    pub replay_load: f64,
    /// Replay: pods replayed (the first of the workload).
    pub replay_pods: usize,
    /// Fill: orders run (seeds `seed`, `seed + 1`, …); the measures are their means.
    pub fill_seeds: u32,
    /// Replay: seconds a GPU stays in MIG mode, its free instances kept for reuse,
    /// after the last allocation on it left.
    pub grace_s: u64,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            seed: 42,
            hard_pct: 50,
            policy: "bestfit".into(),
            replay_load: 0.9,
            replay_pods: 3_000,
            fill_seeds: 5,
            grace_s: 600,
        }
    }
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error("the workload has no GPU pods")]
    NoGpuPods,
    #[error("policy: {0}")]
    Policy(#[from] UnknownPolicy),
}

/// The workload from trace pods (see the module docs for the mapping).
pub fn derive_workload(pods: &[TracePod], seed: u64, hard_pct: u32) -> Vec<IsoPod> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x150_1a7e);
    let mut out = Vec::new();
    for (k, pod) in pods.iter().enumerate() {
        let r = &pod.request;
        let request = match &r.gpu {
            GpuAsk::Shared {
                count: 1,
                cores_milli,
                ..
            } => {
                let level = if rng.random_range(0..100) < hard_pct {
                    IsolationLevel::Hard
                } else {
                    IsolationLevel::Soft
                };
                Request::share_level(*cores_milli, level, r.cpu_milli, r.memory_mib)
            }
            GpuAsk::Shared { .. } | GpuAsk::Whole { .. } => Request {
                constraints: Constraints::default(),
                ..r.clone()
            },
            GpuAsk::None | GpuAsk::Mig { .. } => continue,
        };
        let arrive_s = pod.creation_s.unwrap_or(k as u64);
        let run_s = match (pod.creation_s, pod.deletion_s) {
            (Some(c), Some(d)) if d > c => d - c,
            _ => 3_600,
        };
        out.push(IsoPod {
            request,
            arrive_s,
            run_s,
        });
    }
    out
}

/// What one arm did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmResult {
    pub arm: Arm,
    pub name: &'static str,
    /// GPUs an administrator put in MIG mode up front.
    pub static_mig_gpus: u32,
    pub fill: FillMeasures,
    pub replay: ReplayMeasures,
}

/// The fill phase at arrived GPU demand = 100 % of the cluster: means over the
/// fill seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct FillMeasures {
    pub pods_arrived: f64,
    /// Capacity no grant holds, in GPUs.
    pub unallocated_gpus: f64,
    /// Capacity serving no pod's request, in GPUs.
    pub unserved_gpus: f64,
    /// Of the unallocated capacity, what is on GPUs in MIG mode (free instances and
    /// free MIG space), in GPUs; the rest is on plain GPUs.
    pub unallocated_on_mig_gpus: f64,
    /// Capacity granted beyond the requests (a whole GPU for a share, an instance
    /// larger than the share), summed over the grants, in GPUs.
    pub granted_beyond_request_gpus: f64,
    /// Requests served, in GPUs.
    pub served_gpus: f64,
    pub hard_arrived: f64,
    pub hard_rejected: f64,
    pub soft_rejected: f64,
    pub whole_rejected: f64,
    pub repartitions: f64,
}

impl FillMeasures {
    fn add(&mut self, o: &FillMeasures, w: f64) {
        self.pods_arrived += o.pods_arrived * w;
        self.unallocated_gpus += o.unallocated_gpus * w;
        self.unserved_gpus += o.unserved_gpus * w;
        self.unallocated_on_mig_gpus += o.unallocated_on_mig_gpus * w;
        self.granted_beyond_request_gpus += o.granted_beyond_request_gpus * w;
        self.served_gpus += o.served_gpus * w;
        self.hard_arrived += o.hard_arrived * w;
        self.hard_rejected += o.hard_rejected * w;
        self.soft_rejected += o.soft_rejected * w;
        self.whole_rejected += o.whole_rejected * w;
        self.repartitions += o.repartitions * w;
    }
}

/// The replay phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayMeasures {
    pub pods: u32,
    pub hard_pods: u32,
    pub hard_rejected: u32,
    pub rejected: u32,
    /// Arrival times were divided by this.
    pub time_scale: f64,
    /// Replayed time from the first to the last arrival, in hours.
    pub hours: f64,
    pub repartitions: u32,
    pub mode_switches: u32,
    pub repartitions_per_hour: f64,
}

/// All arms of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IsolationResult {
    pub workload: String,
    pub gpus: u32,
    pub seed: u64,
    pub hard_pct: u32,
    pub policy: String,
    pub fill_seeds: u32,
    pub arms: Vec<ArmResult>,
}

impl IsolationResult {
    pub fn arm(&self, arm: Arm) -> Option<&ArmResult> {
        self.arms.iter().find(|a| a.arm == arm)
    }
}

/// GPUs an administrator would put in MIG mode: the hard shares' share of demand.
fn static_mig_gpus(cluster: &Cluster, pods: &[IsoPod]) -> u32 {
    let total: u64 = pods.iter().map(|p| p.request.gpu.total_milli()).sum();
    let hard: u64 = pods
        .iter()
        .filter(|p| p.kind() == Kind::Hard)
        .map(|p| p.request.gpu.total_milli())
        .sum();
    if total == 0 {
        return 0;
    }
    ((cluster.gpu_count() as u64 * hard + total / 2) / total) as u32
}

/// The cluster as one arm starts it.
fn arm_cluster(base: &Cluster, arm: Arm, mig_gpus: u32) -> Cluster {
    let mut nodes: Vec<Node> = base.nodes().to_vec();
    let layout: &[&str] = match arm {
        Arm::StaticAll1g => &LAYOUT_ALL_1G,
        Arm::StaticBalanced => &LAYOUT_BALANCED,
        Arm::MpsOnly => &[],
        Arm::TesseraDynamic => {
            for n in &mut nodes {
                n.labels.insert(LABEL_MIG_DYNAMIC.into(), "mode".into());
            }
            &[]
        }
    };
    if !layout.is_empty() {
        // Lowest GPU index first, round robin over nodes.
        let mut left = mig_gpus;
        let width = nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0);
        'fill: for slot in 0..width {
            for n in &mut nodes {
                if left == 0 {
                    break 'fill;
                }
                if let Some(g) = n.gpus.get_mut(slot)
                    && let Ok(instances) = mig_instances(&base.catalog, g.model, &g.uuid, layout)
                {
                    g.mig_enabled = true;
                    g.mig_instances = instances;
                    left -= 1;
                }
            }
        }
    }
    Cluster::new(base.catalog.clone(), nodes).expect("a valid cluster with valid layouts")
}

/// One arm's cluster, ledger and scheduler, with the simulated node agent.
struct Engine {
    arm: Arm,
    cluster: Cluster,
    ledger: Ledger,
    sched: Scheduler,
    /// What the policy has learned, and how to rebuild it.
    learner: Learner,
    rng: SmallRng,
    repartitions: u32,
    mode_switches: u32,
    next_uuid: u64,
    /// Σ over placements of granted minus requested milli-GPU.
    beyond_milli: u64,
}

impl Engine {
    /// An arm's cluster, empty, with the policy as `learner` starts it.
    fn new(
        base: &Cluster,
        arm: Arm,
        mig_gpus: u32,
        learner: &Learner,
        config: &IsolationConfig,
    ) -> Result<Engine, IsolationError> {
        let cluster = arm_cluster(base, arm, mig_gpus);
        let mut learner = learner.clone();
        let policy = learner.policy()?;
        Ok(Engine {
            arm,
            ledger: Ledger::new(&cluster),
            cluster,
            sched: Scheduler::new(policy),
            learner,
            rng: SmallRng::seed_from_u64(config.seed),
            repartitions: 0,
            mode_switches: 0,
            next_uuid: 0,
            beyond_milli: 0,
        })
    }

    /// Places an arriving pod; `None` when it fits nowhere.
    fn place(&mut self, req: &Request) -> Result<Option<AllocId>, IsolationError> {
        if self.learner.observe(req, &self.ledger) {
            self.sched = Scheduler::new(self.learner.policy()?);
        }
        let Some(p) = self
            .sched
            .place(&self.cluster, &self.ledger, req, &mut self.rng)
        else {
            return Ok(None);
        };
        let Ok(id) = self.ledger.apply(&self.cluster, &p) else {
            return Ok(None);
        };
        let granted: u64 = p.grants.iter().map(|g| u64::from(g.cores_milli)).sum();
        self.beyond_milli += granted.saturating_sub(req.gpu.total_milli());
        self.agent_create(&p);
        Ok(Some(id))
    }

    /// The node agent creates planned instances (destroying free ones in the way).
    fn agent_create(&mut self, p: &Placement) {
        for g in &p.grants {
            let Some(slot) = g.mig else { continue };
            let gpu = &self.cluster.node(p.node).gpus[g.gpu as usize];
            let (create, switch) = mig_layout::mig_intent(gpu, &slot);
            if !create {
                continue;
            }
            let mut instances: Vec<MigInstance> = gpu
                .mig_instances
                .iter()
                .filter(|m| {
                    let size = self
                        .cluster
                        .catalog
                        .spec(gpu.model)
                        .mig
                        .as_ref()
                        .and_then(|geo| geo.profiles.get(m.profile as usize))
                        .map_or(0, |pr| pr.memory_slices);
                    let mask = ((1u16 << size) - 1) << m.start;
                    mask & u16::from(slot.mask()) == 0
                })
                .cloned()
                .collect();
            self.next_uuid += 1;
            instances.push(MigInstance {
                profile: slot.profile,
                start: slot.start,
                uuid: format!("MIG-sim-{}", self.next_uuid),
            });
            if self
                .cluster
                .set_mig_layout(p.node, g.gpu as usize, true, instances)
                .is_ok()
            {
                self.repartitions += 1;
                self.mode_switches += u32::from(switch);
                self.ledger.touch(p.node);
            }
        }
    }

    /// Releases an allocation; returns the GPUs it left without a held MIG
    /// instance, which the agent resets after the grace period.
    fn release(&mut self, id: AllocId) -> Vec<(NodeId, u8)> {
        let Ok(p) = self.ledger.release(id) else {
            return Vec::new();
        };
        if self.arm != Arm::TesseraDynamic {
            return Vec::new();
        }
        p.grants
            .iter()
            .filter(|g| {
                g.mig.is_some()
                    && self.ledger.node(p.node).gpus[g.gpu as usize].mig_memory_slices == 0
            })
            .map(|g| (p.node, g.gpu))
            .collect()
    }

    /// After the grace period: a GPU on which still nobody holds an instance leaves
    /// MIG mode (its free instances destroyed), so shares may use it again.
    fn reset_if_unused(&mut self, node: NodeId, gpu: u8) {
        let g = gpu as usize;
        if self.ledger.node(node).gpus[g].mig_memory_slices == 0
            && self.cluster.node(node).gpus[g].mig_enabled
            && self
                .cluster
                .set_mig_layout(node, g, false, Vec::new())
                .is_ok()
        {
            self.repartitions += 1;
            self.mode_switches += 1;
            self.ledger.touch(node);
        }
    }

    /// Free milli-GPU: `(on GPUs in MIG mode, on plain GPUs)`.
    fn unallocated_milli(&self) -> (u64, u64) {
        let mut out = (0, 0);
        for (node, used) in self.cluster.nodes().iter().zip(self.ledger.nodes()) {
            for (gpu, gu) in node.gpus.iter().zip(&used.gpus) {
                let free = u64::from(gu.free_cores_milli);
                if mig_layout::in_mig_mode(gpu, gu) {
                    out.0 += free;
                } else {
                    out.1 += free;
                }
            }
        }
        out
    }
}

fn fill(
    base: &Cluster,
    arm: Arm,
    mig_gpus: u32,
    pods: &[IsoPod],
    learner: &Learner,
    config: &IsolationConfig,
) -> Result<FillMeasures, IsolationError> {
    let runs = config.fill_seeds.max(1);
    let mut mean = FillMeasures::default();
    for k in 0..runs {
        let seed = config.seed.wrapping_add(u64::from(k));
        let one = fill_once(base, arm, mig_gpus, pods, learner, config, seed)?;
        mean.add(&one, 1.0 / f64::from(runs));
    }
    Ok(mean)
}

fn fill_once(
    base: &Cluster,
    arm: Arm,
    mig_gpus: u32,
    pods: &[IsoPod],
    learner: &Learner,
    config: &IsolationConfig,
    seed: u64,
) -> Result<FillMeasures, IsolationError> {
    let mut e = Engine::new(base, arm, mig_gpus, learner, config)?;
    // The same order in every arm: the order's RNG is separate from the policy's.
    let mut order = SmallRng::seed_from_u64(seed ^ 0xf111);
    let capacity = base.gpu_count() as u64 * 1000;
    let mut m = FillMeasures::default();
    let (mut arrived, mut served) = (0u64, 0u64);
    while arrived < capacity {
        let pod = &pods[order.random_range(0..pods.len())];
        let milli = pod.request.gpu.total_milli();
        arrived += milli;
        m.pods_arrived += 1.0;
        let kind = pod.kind();
        if kind == Kind::Hard {
            m.hard_arrived += 1.0;
        }
        if e.place(&pod.request)?.is_some() {
            served += milli;
        } else {
            match kind {
                Kind::Hard => m.hard_rejected += 1.0,
                Kind::Soft => m.soft_rejected += 1.0,
                Kind::Whole => m.whole_rejected += 1.0,
            }
        }
    }
    let (on_mig, on_plain) = e.unallocated_milli();
    m.unallocated_gpus = (on_mig + on_plain) as f64 / 1000.0;
    m.unallocated_on_mig_gpus = on_mig as f64 / 1000.0;
    m.granted_beyond_request_gpus = e.beyond_milli as f64 / 1000.0;
    m.served_gpus = served as f64 / 1000.0;
    m.unserved_gpus = capacity.saturating_sub(served) as f64 / 1000.0;
    m.repartitions = f64::from(e.repartitions);
    Ok(m)
}

fn replay(
    base: &Cluster,
    arm: Arm,
    mig_gpus: u32,
    pods: &[IsoPod],
    learner: &Learner,
    config: &IsolationConfig,
) -> Result<ReplayMeasures, IsolationError> {
    let mut e = Engine::new(base, arm, mig_gpus, learner, config)?;
    let mut chosen: Vec<&IsoPod> = pods.iter().take(config.replay_pods).collect();
    chosen.sort_by_key(|p| p.arrive_s);
    let first = chosen.first().map_or(0, |p| p.arrive_s);
    let span = chosen.last().map_or(0, |p| p.arrive_s) - first;
    let offered: f64 = chosen
        .iter()
        .map(|p| p.request.gpu.total_milli() as f64 * p.run_s as f64)
        .sum();
    let capacity = base.gpu_count() as f64 * 1000.0;
    // Load = offered GPU-seconds over capacity × replayed span.
    let time_scale = if span == 0 || config.replay_load <= 0.0 {
        1.0
    } else {
        (config.replay_load * capacity * span as f64 / offered).max(f64::MIN_POSITIVE)
    };
    // Events in milliseconds: (time, kind, pod or GPU), departures (0) and resets
    // (1) before arrivals (2) at the same time.
    let mut heap: BinaryHeap<Reverse<(u64, u8, usize)>> = BinaryHeap::new();
    let width = base.nodes().iter().map(|n| n.gpus.len()).max().unwrap_or(1);
    for (k, p) in chosen.iter().enumerate() {
        let t = ((p.arrive_s - first) as f64 / time_scale * 1000.0).round() as u64;
        heap.push(Reverse((t, 2, k)));
    }
    let mut live: BTreeMap<usize, AllocId> = BTreeMap::new();
    let mut m = ReplayMeasures {
        pods: chosen.len() as u32,
        hard_pods: 0,
        hard_rejected: 0,
        rejected: 0,
        time_scale,
        hours: 0.0,
        repartitions: 0,
        mode_switches: 0,
        repartitions_per_hour: 0.0,
    };
    let mut last_arrival = 0u64;
    while let Some(Reverse((t, what, k))) = heap.pop() {
        if what == 0 {
            if let Some(id) = live.remove(&k) {
                for (node, gpu) in e.release(id) {
                    let key = node.0 as usize * width + gpu as usize;
                    heap.push(Reverse((t + config.grace_s * 1000, 1, key)));
                }
            }
            continue;
        }
        if what == 1 {
            e.reset_if_unused(NodeId((k / width) as u32), (k % width) as u8);
            continue;
        }
        last_arrival = t;
        let pod = chosen[k];
        let hard = pod.kind() == Kind::Hard;
        m.hard_pods += u32::from(hard);
        match e.place(&pod.request)? {
            Some(id) => {
                live.insert(k, id);
                heap.push(Reverse((t + pod.run_s.max(1) * 1000, 0, k)));
            }
            None => {
                m.rejected += 1;
                m.hard_rejected += u32::from(hard);
            }
        }
    }
    m.hours = last_arrival as f64 / 3_600_000.0;
    m.repartitions = e.repartitions;
    m.mode_switches = e.mode_switches;
    m.repartitions_per_hour = if m.hours > 0.0 {
        f64::from(m.repartitions) / m.hours
    } else {
        0.0
    };
    Ok(m)
}

/// Runs every arm on `cluster` (use [`builtin_cluster`]) with `pods` from
/// [`derive_workload`]. Deterministic: the same inputs give the same result.
pub fn run_isolation(
    cluster: &Cluster,
    workload: &str,
    pods: &[IsoPod],
    config: &IsolationConfig,
) -> Result<IsolationResult, IsolationError> {
    if pods.is_empty() {
        return Err(IsolationError::NoGpuPods);
    }
    let mig_gpus = static_mig_gpus(cluster, pods);
    // Every arm starts from the same policy: one that does not learn its workload
    // measures against the typical pods of `pods` (the arms' GPUs differ only in
    // MIG mode, so the base cluster's inventory serves them all).
    let typical = TargetWorkload::from_requests(pods.iter().map(|p| &p.request), 0.95);
    let learner = Learner::start(cluster, &config.policy, Arc::new(typical))?;
    let mut arms = Vec::new();
    for arm in Arm::ALL {
        let pool = match arm {
            Arm::StaticAll1g | Arm::StaticBalanced => mig_gpus,
            Arm::MpsOnly | Arm::TesseraDynamic => 0,
        };
        arms.push(ArmResult {
            arm,
            name: arm.name(),
            static_mig_gpus: pool,
            fill: fill(cluster, arm, pool, pods, &learner, config)?,
            replay: replay(cluster, arm, pool, pods, &learner, config)?,
        });
    }
    Ok(IsolationResult {
        workload: workload.to_string(),
        gpus: cluster.gpu_count() as u32,
        seed: config.seed,
        hard_pct: config.hard_pct,
        policy: config.policy.clone(),
        fill_seeds: config.fill_seeds.max(1),
        arms,
    })
}

/// The result as a plain-text table.
pub fn table(r: &IsolationResult) -> String {
    let mut s = format!(
        "isolation experiment: {} on {} GPUs (12 × 8 H100-80GB, 12 × 8 A100-80GB), {} % of shares hard, policy {}, seed {}\n",
        r.workload, r.gpus, r.hard_pct, r.policy, r.seed
    );
    s.push_str(&format!(
        "fill (arrived GPU demand = 100 %, means over {} orders): unallocated and unserved GPUs, rejected pods; replay: rejected pods, MIG re-partitions per replayed hour\n",
        r.fill_seeds
    ));
    s.push_str(&format!(
        "{:<20} {:>8} | {:>11} {:>9} {:>10} {:>10} | {:>9} {:>10} {:>12}\n",
        "arm",
        "MIG GPUs",
        "unallocated",
        "unserved",
        "hard rej.",
        "other rej.",
        "replay rej",
        "hard rej.",
        "reparts/hour"
    ));
    for a in &r.arms {
        s.push_str(&format!(
            "{:<20} {:>8} | {:>11.1} {:>9.1} {:>4.1}/{:<5.1} {:>10.1} | {:>9} {:>10} {:>12.2}\n",
            a.name,
            a.static_mig_gpus,
            a.fill.unallocated_gpus,
            a.fill.unserved_gpus,
            a.fill.hard_rejected,
            a.fill.hard_arrived,
            a.fill.soft_rejected + a.fill.whole_rejected,
            a.replay.rejected,
            a.replay.hard_rejected,
            a.replay.repartitions_per_hour,
        ));
    }
    s.push_str(&format!(
        "fill, where the capacity went (GPUs; served + beyond requests + unallocated = {}):\n{:<20} {:>8} {:>15} {:>16} {:>16}\n",
        r.gpus, "arm", "served", "beyond requests", "unalloc. on MIG", "unalloc. plain"
    ));
    for a in &r.arms {
        let f = &a.fill;
        s.push_str(&format!(
            "{:<20} {:>8.1} {:>15.1} {:>16.1} {:>16.1}\n",
            a.name,
            f.served_gpus,
            f.granted_beyond_request_gpus,
            f.unallocated_on_mig_gpus,
            f.unallocated_gpus - f.unallocated_on_mig_gpus,
        ));
    }
    if let Some(d) = r.arm(Arm::TesseraDynamic) {
        s.push_str(&format!(
            "replay: {} pods over {:.1} h of replayed time (arrivals ÷ {:.1}); tessera dynamic re-partitioned {} times ({} mode switches)\n",
            d.replay.pods, d.replay.hours, d.replay.time_scale, d.replay.repartitions, d.replay.mode_switches
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_workload_maps_shares_to_levels_and_keeps_whole_pods() {
        let syn = crate::workload::generate(7);
        let pods = derive_workload(&syn.pods, 1, 50);
        let gpu_pods = syn
            .pods
            .iter()
            .filter(|p| p.request.gpu.gpu_count() > 0)
            .count();
        assert_eq!(pods.len(), gpu_pods);
        let hard = pods.iter().filter(|p| p.kind() == Kind::Hard).count();
        let soft = pods.iter().filter(|p| p.kind() == Kind::Soft).count();
        // About half of the shares are hard.
        assert!(hard > 0 && soft > 0);
        assert!((hard as f64 / (hard + soft) as f64 - 0.5).abs() < 0.1);
        assert_eq!(
            derive_workload(&syn.pods, 1, 0)
                .iter()
                .filter(|p| p.kind() == Kind::Hard)
                .count(),
            0
        );
    }

    #[test]
    fn static_layouts_are_valid_and_sized_to_hard_demand() {
        let base = builtin_cluster();
        assert_eq!(base.gpu_count(), 192);
        for arm in [Arm::StaticAll1g, Arm::StaticBalanced] {
            let c = arm_cluster(&base, arm, 50);
            let mig: Vec<_> = c
                .nodes()
                .iter()
                .flat_map(|n| n.gpus.iter())
                .filter(|g| g.mig_enabled)
                .collect();
            assert_eq!(mig.len(), 50);
            for g in mig {
                let geo = c.catalog.spec(g.model).mig.as_ref().unwrap();
                let layout: Vec<(u8, u8)> = g
                    .mig_instances
                    .iter()
                    .map(|m| (m.profile, m.start))
                    .collect();
                assert!(mig_layout::validate(geo, &layout).is_ok());
            }
        }
    }
}
