//! Placements (the decision as data) and the [`Scheduler`] that makes them.
//!
//! A decision is made on a snapshot: the scheduler reads the cluster and the
//! ledger and returns a [`Placement`] or an [`Explanation`]; the caller applies
//! it (ledger, Kubernetes binding or simulator event). Nothing here mutates the ledger.
//!
//! Speed: scores that depend only on a node's state and the request's shape are
//! cached per shape in an ordered index. A decision refreshes only the nodes the
//! ledger logged as changed since that shape was last asked, then walks the index
//! from the best node until one also passes the host-memory check (host memory is
//! a filter only, never scored, so it is left out of the shape). The cost of a
//! decision therefore grows with the number of nodes changed since the shape was
//! last seen (times log N), not with the cluster size; the first request of a new
//! shape pays one full scan.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use rand::RngCore;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::explain::Explanation;
use crate::fit::{self, NodeView};
use crate::ledger::Ledger;
use crate::model::{Cluster, NodeId};
use crate::policy::Policy;
use crate::request::Request;

/// A MIG placement on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigSlot {
    /// Index into the model's MIG profile table.
    pub profile: u8,
    /// First memory slice.
    pub start: u8,
    /// Memory slices.
    pub size: u8,
    /// Compute slices.
    pub compute: u8,
}

impl MigSlot {
    /// The memory slices as a bitmask.
    pub fn mask(&self) -> u8 {
        let ones: u16 = (1u16 << self.size) - 1;
        ((ones << self.start) & 0xff) as u8
    }
}

/// What one GPU gives to one placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuGrant {
    /// Position of the GPU in its node's GPU list.
    pub gpu: u8,
    pub memory_mib: u64,
    /// Compute in per-mille.
    pub cores_milli: u32,
    /// The whole GPU, nobody else.
    pub exclusive: bool,
    pub mig: Option<MigSlot>,
}

impl GpuGrant {
    pub fn whole(gpu: u8, memory_mib: u64) -> GpuGrant {
        GpuGrant {
            gpu,
            memory_mib,
            cores_milli: 1000,
            exclusive: true,
            mig: None,
        }
    }
    pub fn shared(gpu: u8, memory_mib: u64, cores_milli: u32) -> GpuGrant {
        GpuGrant {
            gpu,
            memory_mib,
            cores_milli,
            exclusive: false,
            mig: None,
        }
    }
}

/// One named part of a score, for explanations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScoreTerm {
    pub name: &'static str,
    pub value: f64,
}

/// A decision: the node, the exact GPUs and the score that chose them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    pub grants: SmallVec<[GpuGrant; 8]>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Request class (GPU count and per-GPU milli) for policies that group alike pods; 0 for CPU-only.
    pub class: u32,
    pub score: f64,
    #[serde(skip_deserializing)]
    pub terms: Vec<ScoreTerm>,
}

/// The class of a request: GPU count and per-GPU milli packed in one number (0 for CPU-only).
pub fn request_class(req: &Request) -> u32 {
    let n = req.gpu.gpu_count();
    if n == 0 {
        return 0;
    }
    (n << 16)
        | (req.gpu.milli_per_gpu() & 0xffff)
        | if matches!(req.gpu, crate::request::GpuAsk::Mig { .. }) {
            1 << 15
        } else {
            0
        }
}

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a placement is the common, hot case; boxing it costs an allocation per decision"
)]
pub enum Decision {
    Place(Placement),
    Unschedulable(Explanation),
}

/// A policy's verdict on one node: score (higher is better), GPUs and the score's parts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scored {
    pub score: f64,
    pub gpus: fit::GpuSet,
    pub terms: SmallVec<[ScoreTerm; 4]>,
}

/// Total order on scores: higher first, NaN last.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key(f64);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        // Descending: a higher score sorts first.
        other.0.total_cmp(&self.0)
    }
}

struct ShapeCache {
    cursor: u64,
    score: Vec<Option<f64>>,
    order: BTreeSet<(Key, NodeId)>,
    last_used: u64,
}

/// Makes decisions for one policy, caching scores per request shape.
pub struct Scheduler {
    policy: Box<dyn Policy>,
    caches: FxHashMap<Request, ShapeCache>,
    max_shapes: usize,
    clock: u64,
    stamp: Vec<u64>,
}

impl Scheduler {
    pub fn new(policy: Box<dyn Policy>) -> Scheduler {
        Scheduler {
            policy,
            caches: FxHashMap::default(),
            max_shapes: 256,
            clock: 0,
            stamp: Vec::new(),
        }
    }

    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// Forgets cached scores (after the cluster itself changed shape).
    pub fn clear_cache(&mut self) {
        self.caches.clear();
    }

    fn view<'a>(cluster: &'a Cluster, ledger: &'a Ledger, id: NodeId) -> NodeView<'a> {
        NodeView {
            node: cluster.node(id),
            used: ledger.node(id),
            catalog: &cluster.catalog,
        }
    }

    /// Fit check without host memory, then the policy's score.
    fn score_shape(
        &self,
        view: NodeView<'_>,
        shape: &Request,
        rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        if shape.cpu_milli > view.used.free_cpu_milli || fit::cannot_fit(view.used, shape) {
            return None;
        }
        let fit = fit::check_gpus(view, shape).ok()?;
        self.score(view, shape, &fit, rng)
    }

    /// The policy's score, ranked first by how well the node can isolate a `hard`
    /// share ([`fit::mig_layout::hard_rank_penalty`]; 0 for every other request).
    fn score(
        &self,
        view: NodeView<'_>,
        req: &Request,
        fit: &fit::Fit,
        rng: &mut dyn RngCore,
    ) -> Option<Scored> {
        let penalty = fit::mig_layout::hard_rank_penalty(view, req, fit);
        self.policy.score(view, req, fit, rng).map(|mut s| {
            if penalty > 0.0 {
                s.score -= penalty;
                s.terms.push(ScoreTerm {
                    name: "isolation-tier",
                    value: -penalty,
                });
            }
            s
        })
    }

    /// Decides where `req` goes.
    pub fn decide(
        &mut self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Decision {
        match self.place(cluster, ledger, req, rng) {
            Some(p) => Decision::Place(p),
            None => Decision::Unschedulable(self.explain(cluster, ledger, req, rng)),
        }
    }

    /// Like [`Scheduler::decide`], but `None` instead of an explanation when nothing
    /// fits: for callers that only count failures (the simulator), since explaining
    /// costs a scan of every node.
    pub fn place(
        &mut self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Option<Placement> {
        let cacheable = self.policy.cacheable() && req.constraints.pinned_uuids.is_empty();
        let best = if cacheable {
            self.decide_cached(cluster, ledger, req, rng)
        } else {
            self.decide_scan(cluster, ledger, req, rng)
        };
        best.map(|(id, scored)| Self::placement(cluster, ledger, req, id, scored))
    }

    /// Like [`Scheduler::place`], but only on `nodes` (a topology domain for a gang,
    /// the nodes a defragmentation move may go to). Scans them without the score cache.
    pub fn place_within(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        nodes: &[NodeId],
        rng: &mut dyn RngCore,
    ) -> Option<Placement> {
        let ids = nodes
            .iter()
            .copied()
            .filter(|id| (id.0 as usize) < cluster.len());
        self.scan(cluster, ledger, req, ids, rng)
            .map(|(id, scored)| Self::placement(cluster, ledger, req, id, scored))
    }

    fn placement(
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        id: NodeId,
        scored: Scored,
    ) -> Placement {
        let view = Self::view(cluster, ledger, id);
        Placement {
            node: id,
            grants: fit::grants(view, req, &scored.gpus),
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
            class: request_class(req),
            score: scored.score,
            terms: scored.terms.to_vec(),
        }
    }

    fn decide_scan(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Option<(NodeId, Scored)> {
        self.scan(cluster, ledger, req, cluster.ids(), rng)
    }

    fn scan(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        ids: impl Iterator<Item = NodeId>,
        rng: &mut dyn RngCore,
    ) -> Option<(NodeId, Scored)> {
        let mut best: Option<(NodeId, Scored)> = None;
        for id in ids {
            let view = Self::view(cluster, ledger, id);
            let Ok(fit) = fit::check(view, req) else {
                continue;
            };
            if let Some(s) = self.score(view, req, &fit, rng)
                && best.as_ref().is_none_or(|(_, b)| s.score > b.score)
            {
                best = Some((id, s));
            }
        }
        best
    }

    fn decide_cached(
        &mut self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Option<(NodeId, Scored)> {
        let mut shape = req.clone();
        shape.memory_mib = 0;
        self.clock += 1;
        if self.stamp.len() != cluster.len() {
            self.stamp = vec![0; cluster.len()];
        }
        let mut cache = match self.caches.remove(&shape) {
            Some(c) => c,
            None => {
                if self.caches.len() >= self.max_shapes
                    && let Some(old) = self
                        .caches
                        .iter()
                        .min_by_key(|(_, c)| c.last_used)
                        .map(|(k, _)| k.clone())
                {
                    self.caches.remove(&old);
                }
                ShapeCache {
                    cursor: u64::MAX,
                    score: Vec::new(),
                    order: BTreeSet::new(),
                    last_used: 0,
                }
            }
        };
        cache.last_used = self.clock;
        let changed = if cache.score.len() == cluster.len() {
            ledger.changes_since(cache.cursor)
        } else {
            None
        };
        match changed {
            Some(nodes) => {
                for &id in nodes {
                    // Score each changed node once, however often it changed.
                    if self.stamp[id.0 as usize] == self.clock {
                        continue;
                    }
                    self.stamp[id.0 as usize] = self.clock;
                    if let Some(old) = cache.score[id.0 as usize].take() {
                        cache.order.remove(&(Key(old), id));
                    }
                    let s = self
                        .score_shape(Self::view(cluster, ledger, id), &shape, rng)
                        .map(|s| s.score);
                    if let Some(s) = s {
                        cache.order.insert((Key(s), id));
                    }
                    cache.score[id.0 as usize] = s;
                }
            }
            None => {
                cache.order.clear();
                cache.score = cluster
                    .ids()
                    .map(|id| {
                        self.score_shape(Self::view(cluster, ledger, id), &shape, rng)
                            .map(|s| s.score)
                    })
                    .collect();
                for (i, s) in cache.score.iter().enumerate() {
                    if let Some(s) = s {
                        cache.order.insert((Key(*s), NodeId(i as u32)));
                    }
                }
            }
        }
        cache.cursor = ledger.change_cursor();
        let mut found = None;
        for &(_, id) in cache.order.iter() {
            let view = Self::view(cluster, ledger, id);
            if fit::check_host(view, req).is_err() {
                continue;
            }
            found = self.score_shape(view, &shape, rng).map(|s| (id, s));
            if found.is_some() {
                break;
            }
        }
        self.caches.insert(shape, cache);
        found
    }

    /// Why `req` fits nowhere (or how many nodes it fits): one reason per node from the
    /// shared filter. Costs one filter pass over every node, no scoring.
    pub fn explain(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        _rng: &mut dyn RngCore,
    ) -> Explanation {
        let mut e = Explanation::new(cluster.len());
        for id in cluster.ids() {
            match fit::check(Self::view(cluster, ledger, id), req) {
                Ok(_) => e.fit += 1,
                Err(r) => e.add(r),
            }
        }
        e
    }

    /// Every feasible node with its score, best first (for `tessera place` and the extender's prioritize).
    pub fn rank(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Vec<(NodeId, Scored)> {
        let mut v: Vec<(NodeId, Scored)> = cluster
            .ids()
            .filter_map(|id| {
                let view = Self::view(cluster, ledger, id);
                let fit = fit::check(view, req).ok()?;
                self.score(view, req, &fit, rng).map(|s| (id, s))
            })
            .collect();
        v.sort_by(|a, b| Key(a.1.score).cmp(&Key(b.1.score)).then(a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::demo::demo_cluster;
    use crate::policy;
    use rand::SeedableRng;

    /// The cached path and the plain scan agree decision by decision while the cluster fills.
    #[test]
    fn cached_decisions_equal_full_scans() {
        for name in ["binpack", "spread", "fgd", "tessera", "bestfit"] {
            let cluster = demo_cluster();
            let mut ledger = Ledger::new(&cluster);
            let mut cached =
                Scheduler::new(policy::by_name(name, &policy::PolicyArgs::default()).unwrap());
            let scan =
                Scheduler::new(policy::by_name(name, &policy::PolicyArgs::default()).unwrap());
            let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
            let shapes = [
                Request::share_milli(300, 2000, 4096),
                Request::share_milli(700, 4000, 8192),
                Request::whole(1, 8000, 16384),
                Request::whole(4, 16000, 65536),
                Request::share_milli(500, 1000, 2048),
            ];
            let mut placed = Vec::new();
            for i in 0..200 {
                let req = &shapes[i % shapes.len()];
                let a = cached.decide(&cluster, &ledger, req, &mut rng);
                let b = scan.decide_scan(&cluster, &ledger, req, &mut rng);
                match (&a, b) {
                    (Decision::Place(p), Some((id, s))) => {
                        assert_eq!(p.score, s.score, "{name} step {i}: same best score");
                        let _ = id;
                        placed.push(ledger.apply(&cluster, p).unwrap());
                    }
                    (Decision::Unschedulable(_), None) => {}
                    (a, b) => panic!("{name} step {i}: cached {a:?} vs scan {b:?}"),
                }
                if i % 7 == 6 && !placed.is_empty() {
                    ledger.release(placed.remove(i % placed.len())).unwrap();
                }
            }
        }
    }

    #[test]
    fn unschedulable_explains_per_node() {
        let cluster = demo_cluster();
        let ledger = Ledger::new(&cluster);
        let mut s =
            Scheduler::new(policy::by_name("tessera", &policy::PolicyArgs::default()).unwrap());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        match s.decide(&cluster, &ledger, &Request::whole(16, 0, 0), &mut rng) {
            Decision::Unschedulable(e) => assert_eq!(
                e.to_string(),
                "0/12 nodes fit: 12 fewer than 16 GPUs in total"
            ),
            d => panic!("expected no fit, got {d:?}"),
        }
    }
}
