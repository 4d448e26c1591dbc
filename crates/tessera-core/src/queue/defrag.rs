//! Defragmentation: a plan of moves that frees the GPUs or nodes that pending
//! pods need.
//!
//! A cluster can have enough idle GPUs in total for an 8-GPU pod and still not
//! one node with eight idle, because small pods are scattered across every
//! node. Restartable pods (a Deployment's replicas, a preemptible job's
//! workers) can be evicted so that their controller re-creates them elsewhere;
//! [`plan`] finds which ones, fewest moves first, so the pending pods fit.
//!
//! The plan is data; the caller executes it (the Kubernetes adapter through the
//! eviction API, honouring the same budgets again at that moment, and holding
//! the freed node for the pending pod so the re-created pods do not land back
//! on it; the simulator on its ledger). Every step is verified on a working copy of the ledger with
//! the real fit filter: the evicted pods are released, the pending pod's
//! placement is applied, and each evicted pod must find a destination (a
//! [`Placement`] the ledger accepts) before the step counts. A pod is never moved
//! when it is pinned ("do not disturb"), not preemptible, unknown to the caller
//! or without a known request, or when its disruption budget has no disruption
//! left; a pod is moved at most once per plan.
//!
//! For each pending pod the planner looks at every node the pod could use if its
//! movable pods left, finds there the fewest evictions that make room
//! (smallest pods released first until the pod fits, then each released pod
//! taken back if the pod still fits without its leaving), and keeps the node
//! whose evictions are fewest (then lightest) and all find a home elsewhere.
//! Greedy per pod, not a global optimum: the search space of joint moves is
//! exponential and a plan must be quick enough to recompute when the cluster moves.

use rand::RngCore;
use rustc_hash::FxHashMap;

use super::{Budgets, Running};
use crate::fit::{self, NodeView};
use crate::ledger::{AllocId, Ledger, LedgerError};
use crate::model::{Cluster, NodeId};
use crate::placement::Placement;
use crate::request::Request;
use crate::scheduler::Scheduler;

/// What a defragmentation plan reads.
pub struct Context<'a> {
    pub cluster: &'a Cluster,
    pub ledger: &'a Ledger,
    /// Every running pod the caller knows, by allocation. Allocations not here are
    /// never moved.
    pub running: &'a FxHashMap<AllocId, Running>,
    /// What each running pod asked for, to find it a new home. Pods without one
    /// are never moved.
    pub requests: &'a FxHashMap<AllocId, Request>,
    pub budgets: &'a Budgets,
}

/// Bounds on a plan.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most evictions for one pending pod (a node's worth of small pods, by default).
    pub max_moves_per_pod: usize,
    /// Most evictions in the whole plan.
    pub max_moves: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_moves_per_pod: 16,
            max_moves: 64,
        }
    }
}

/// Evict `pod` from `from`; its controller re-creates it and it fits at `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub pod: AllocId,
    pub from: NodeId,
    pub to: Placement,
}

/// One pending pod made to fit: the moves that make room, then where it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Index into the pending requests.
    pub pending: usize,
    /// Evictions (in order) that make room for it; empty when it fitted already.
    pub moves: Vec<Move>,
    /// Where the pending pod goes once they are done.
    pub placement: Placement,
}

/// What a plan is expected to gain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Gain {
    /// Pending pods that fit before the plan and after it.
    pub pending_fit_before: usize,
    pub pending_fit_after: usize,
    /// GPU compute the pending pods get, milli-GPU.
    pub gpu_milli_placed: u64,
    /// Nodes emptied of GPU work by the moves alone (every GPU idle after the
    /// evictions and re-placements, before the pending pods take them) that were
    /// not empty before.
    pub nodes_freed: usize,
    /// Evictions.
    pub moves: usize,
}

/// A defragmentation plan, in execution order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Pending pods no allowed moves make fit.
    pub unplaced: Vec<usize>,
    pub gain: Gain,
}

impl Plan {
    /// Every move, in order.
    pub fn moves(&self) -> impl Iterator<Item = &Move> {
        self.steps.iter().flat_map(|s| s.moves.iter())
    }
}

/// A fault while planning (a placement the fit filter accepted was refused by
/// the ledger, or the working ledger's checkpoints were misused).
#[derive(Debug, thiserror::Error)]
pub enum DefragError {
    #[error("the working ledger refused a verified step")]
    Ledger(#[from] LedgerError),
}

/// Plans moves that make `pending` fit, pods in the order given (the caller's
/// priority order). Pods that fit already are placed without moves. The
/// caller's ledger is not changed.
pub fn plan(
    scheduler: &mut Scheduler,
    ctx: &Context<'_>,
    pending: &[Request],
    limits: &Limits,
    rng: &mut dyn RngCore,
) -> Result<Plan, DefragError> {
    let cluster = ctx.cluster;
    let mut ledger = ctx.ledger.clone();
    let mut budgets = ctx.budgets.clone();
    let idle_before = idle_nodes(cluster, &ledger);
    let fit_before = pending
        .iter()
        .filter(|r| scheduler.place(cluster, &ledger, r, rng).is_some())
        .count();
    let mut out = Plan::default();
    let mut moves_left = limits.max_moves;
    // Nodes freed by moves are counted against the ledger as the moves left it,
    // before each pending pod takes its node.
    let mut freed = 0usize;
    for (i, req) in pending.iter().enumerate() {
        if let Some(p) = scheduler.place(cluster, &ledger, req, rng) {
            ledger.apply(cluster, &p)?;
            out.steps.push(Step {
                pending: i,
                moves: Vec::new(),
                placement: p,
            });
            continue;
        }
        let cap = moves_left.min(limits.max_moves_per_pod);
        match best_step(scheduler, ctx, &mut ledger, &budgets, req, cap, rng)? {
            Some(c) => {
                // Execute the chosen step on the working ledger, as the caller will.
                let mut moves = Vec::with_capacity(c.victims.len());
                for &v in &c.victims {
                    ledger.release(v)?;
                    budgets.spend(ctx.running.get(&v).and_then(|r| r.meta.budget));
                }
                let mut homes = Vec::with_capacity(c.victims.len());
                for (v, to) in c.victims.iter().zip(c.homes) {
                    ledger.apply(cluster, &to)?;
                    homes.push((*v, to));
                }
                freed += idle_nodes(cluster, &ledger)
                    .iter()
                    .filter(|n| !idle_before.contains(n))
                    .count();
                ledger.apply(cluster, &c.placement)?;
                for (v, to) in homes {
                    moves.push(Move {
                        pod: v,
                        from: c.node,
                        to,
                    });
                }
                moves_left -= moves.len();
                out.steps.push(Step {
                    pending: i,
                    moves,
                    placement: c.placement,
                });
            }
            None => out.unplaced.push(i),
        }
    }
    out.gain = Gain {
        pending_fit_before: fit_before,
        pending_fit_after: out.steps.len(),
        gpu_milli_placed: out
            .steps
            .iter()
            .map(|s| pending[s.pending].gpu.total_milli())
            .sum(),
        nodes_freed: freed,
        moves: out.steps.iter().map(|s| s.moves.len()).sum(),
    };
    Ok(out)
}

/// Nodes with GPUs, every one idle.
fn idle_nodes(cluster: &Cluster, ledger: &Ledger) -> Vec<NodeId> {
    cluster
        .ids()
        .filter(|id| {
            let u = ledger.node(*id);
            !u.gpus.is_empty() && u.gpus.iter().all(|g| g.is_idle())
        })
        .collect()
}

struct Candidate {
    node: NodeId,
    victims: Vec<AllocId>,
    homes: Vec<Placement>,
    placement: Placement,
    /// GPU compute the victims hold (tie-break: lighter moves first).
    moved_milli: u64,
}

fn fits(cluster: &Cluster, ledger: &Ledger, node: NodeId, req: &Request) -> bool {
    let view = NodeView {
        node: cluster.node(node),
        used: ledger.node(node),
        catalog: &cluster.catalog,
    };
    fit::check(view, req).is_ok()
}

/// GPU compute an allocation holds, milli-GPU.
fn held_milli(p: &Placement) -> u64 {
    p.grants.iter().map(|g| u64::from(g.cores_milli)).sum()
}

/// The cheapest verified step for `req` over every node, or `None`. Leaves the
/// working ledger as it found it.
fn best_step(
    scheduler: &mut Scheduler,
    ctx: &Context<'_>,
    ledger: &mut Ledger,
    budgets: &Budgets,
    req: &Request,
    cap: usize,
    rng: &mut dyn RngCore,
) -> Result<Option<Candidate>, DefragError> {
    // Movable pods per node, smallest first (ties by id, for a stable plan).
    let mut movable: FxHashMap<NodeId, Vec<(u64, AllocId)>> = FxHashMap::default();
    for (id, p) in ledger.allocations() {
        let Some(r) = ctx.running.get(&id) else {
            continue;
        };
        if r.meta.pinned || !r.meta.preemptible || !ctx.requests.contains_key(&id) {
            continue;
        }
        if !budgets.may_disrupt(r.meta.budget) {
            continue;
        }
        movable.entry(p.node).or_default().push((held_milli(p), id));
    }
    let mut nodes: Vec<NodeId> = movable.keys().copied().collect();
    nodes.sort_unstable();
    let mut best: Option<Candidate> = None;
    for node in nodes {
        let mut pods = movable.remove(&node).unwrap_or_default();
        pods.sort_unstable();
        let Some(victims) = fewest_victims(ctx, ledger, budgets, node, &pods, req)? else {
            continue;
        };
        if victims.is_empty() || victims.len() > cap {
            continue;
        }
        let moved_milli: u64 = victims
            .iter()
            .filter_map(|v| ledger.allocation(*v))
            .map(held_milli)
            .sum();
        if let Some(b) = &best
            && (victims.len(), moved_milli) >= (b.victims.len(), b.moved_milli)
        {
            continue;
        }
        if let Some(c) = verify(scheduler, ctx, ledger, node, victims, moved_milli, req, rng)? {
            best = Some(c);
        }
    }
    Ok(best)
}

/// The fewest of `pods` (movable, on `node`) whose leaving lets `req` fit there,
/// within the budgets; `None` when even all of them do not.
fn fewest_victims(
    ctx: &Context<'_>,
    ledger: &mut Ledger,
    budgets: &Budgets,
    node: NodeId,
    pods: &[(u64, AllocId)],
    req: &Request,
) -> Result<Option<Vec<AllocId>>, DefragError> {
    let cluster = ctx.cluster;
    let budget_of = |id: &AllocId| ctx.running.get(id).and_then(|r| r.meta.budget);
    // Release smallest first until it fits, never more from one budget than it allows.
    let cp = ledger.checkpoint();
    let mut spent: FxHashMap<super::BudgetId, u32> = FxHashMap::default();
    let mut released = Vec::new();
    let mut fit_now = false;
    for &(_, id) in pods {
        if let Some(b) = budget_of(&id) {
            let n = spent.entry(b).or_default();
            if *n >= budgets.allowed(b) {
                continue;
            }
            *n += 1;
        }
        ledger.release(id)?;
        released.push(id);
        if fits(cluster, ledger, node, req) {
            fit_now = true;
            break;
        }
    }
    ledger.rollback(cluster, cp)?;
    if !fit_now {
        return Ok(None);
    }
    // Take back each released pod, largest first, if the pod still fits without
    // its leaving: what remains is a minimal set (no single victim is spare).
    let mut keep: Vec<AllocId> = released.clone();
    for &id in released.iter().rev() {
        let trial: Vec<AllocId> = keep.iter().copied().filter(|v| *v != id).collect();
        let cp = ledger.checkpoint();
        for v in &trial {
            ledger.release(*v)?;
        }
        let ok = fits(cluster, ledger, node, req);
        ledger.rollback(cluster, cp)?;
        if ok {
            keep = trial;
        }
    }
    Ok(Some(keep))
}

/// Releases the victims, places `req` on `node` with the scheduler, and finds
/// every victim a home (anywhere the scheduler puts it, largest first); rolls
/// the working ledger back either way.
#[allow(clippy::too_many_arguments, reason = "one private step of the search")]
fn verify(
    scheduler: &mut Scheduler,
    ctx: &Context<'_>,
    ledger: &mut Ledger,
    node: NodeId,
    mut victims: Vec<AllocId>,
    moved_milli: u64,
    req: &Request,
    rng: &mut dyn RngCore,
) -> Result<Option<Candidate>, DefragError> {
    let cluster = ctx.cluster;
    victims.sort_by_key(|v| std::cmp::Reverse(ledger.allocation(*v).map(held_milli).unwrap_or(0)));
    let cp = ledger.checkpoint();
    for v in &victims {
        ledger.release(*v)?;
    }
    let result = (|| -> Result<Option<Candidate>, DefragError> {
        let Some(placement) = scheduler.place_within(cluster, ledger, req, &[node], rng) else {
            return Ok(None);
        };
        ledger.apply(cluster, &placement)?;
        let mut homes = Vec::with_capacity(victims.len());
        for v in &victims {
            let Some(r) = ctx.requests.get(v) else {
                return Ok(None);
            };
            let Some(to) = scheduler.place(cluster, ledger, r, rng) else {
                return Ok(None);
            };
            ledger.apply(cluster, &to)?;
            homes.push(to);
        }
        Ok(Some(Candidate {
            node,
            victims: victims.clone(),
            homes,
            placement,
            moved_milli,
        }))
    })();
    ledger.rollback(cluster, cp)?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Catalog, Node};
    use crate::policy::{self, PolicyArgs};
    use crate::queue::{BudgetId, PodMeta};
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn scheduler() -> Scheduler {
        Scheduler::new(policy::by_name("bestfit", &PolicyArgs::default()).unwrap())
    }

    fn cluster(gpus: &[u32]) -> Cluster {
        let catalog = Catalog::default();
        let model = catalog.find("A100-80GB").unwrap();
        let nodes = gpus
            .iter()
            .enumerate()
            .map(|(i, &g)| Node::uniform(format!("n{i}"), 64_000, 512_000, model, g))
            .collect();
        Cluster::new(catalog, nodes).unwrap()
    }

    /// A running world built by placing `pods` (request, meta) on explicit nodes.
    struct World {
        cluster: Cluster,
        ledger: Ledger,
        running: FxHashMap<AllocId, Running>,
        requests: FxHashMap<AllocId, Request>,
    }

    fn world(gpus: &[u32], pods: &[(u32, Request, PodMeta)]) -> World {
        let cluster = cluster(gpus);
        let mut ledger = Ledger::new(&cluster);
        let s = scheduler();
        let mut rng = SmallRng::seed_from_u64(0);
        let (mut running, mut requests) = (FxHashMap::default(), FxHashMap::default());
        for (node, req, meta) in pods {
            let p = s
                .place_within(&cluster, &ledger, req, &[NodeId(*node)], &mut rng)
                .expect("test pod fits its node");
            let id = ledger.apply(&cluster, &p).unwrap();
            running.insert(
                id,
                Running {
                    alloc: id,
                    meta: *meta,
                    started_s: 0,
                },
            );
            requests.insert(id, req.clone());
        }
        World {
            cluster,
            ledger,
            running,
            requests,
        }
    }

    fn one() -> Request {
        Request::whole(1, 1_000, 1_024)
    }

    fn run(w: &World, budgets: &Budgets, pending: &[Request]) -> Plan {
        let ctx = Context {
            cluster: &w.cluster,
            ledger: &w.ledger,
            running: &w.running,
            requests: &w.requests,
            budgets,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        plan(
            &mut scheduler(),
            &ctx,
            pending,
            &Limits::default(),
            &mut rng,
        )
        .unwrap()
    }

    #[test]
    fn scattered_single_gpu_pods_are_moved_to_free_a_whole_node() {
        // Two 8-GPU nodes: node 0 holds 6 one-GPU pods, node 1 holds 2. 8 idle GPUs
        // in total, no node with 8. Emptying node 1 costs 2 moves (they fit in node
        // 0's 2 idle GPUs); emptying node 0 would cost 6 and they would not fit.
        let m = PodMeta::default();
        let mut pods = vec![(0, one(), m); 6];
        pods.extend(vec![(1, one(), m); 2]);
        let w = world(&[8, 8], &pods);
        let plan = run(&w, &Budgets::new(), &[Request::whole(8, 1_000, 1_024)]);
        assert_eq!(plan.unplaced, Vec::<usize>::new());
        assert_eq!(plan.gain.moves, 2);
        assert_eq!(plan.gain.nodes_freed, 1);
        assert_eq!(
            (plan.gain.pending_fit_before, plan.gain.pending_fit_after),
            (0, 1)
        );
        assert_eq!(plan.gain.gpu_milli_placed, 8_000);
        assert_eq!(plan.steps[0].placement.node, NodeId(1));
        for mv in plan.moves() {
            assert_eq!((mv.from, mv.to.node), (NodeId(1), NodeId(0)));
        }
        // The caller's ledger is untouched.
        assert_eq!(w.ledger.allocation_count(), 8);
    }

    #[test]
    fn pinned_and_non_preemptible_pods_stay_and_budgets_are_honoured() {
        // Same layout; node 1's two pods are protected one way or another, so the
        // only way is node 0's six, which have nowhere to go (node 1 has 6 idle…
        // they would fit there, but then node 1 is not empty: the 8-GPU pod needs
        // node 0 empty and its 6 pods moved to node 1's 6 idle GPUs: 6 moves).
        let m = PodMeta::default();
        let pinned = PodMeta { pinned: true, ..m };
        let fixed = PodMeta {
            preemptible: false,
            ..m
        };
        let mut pods = vec![(0, one(), m); 6];
        pods.push((1, one(), pinned));
        pods.push((1, one(), fixed));
        let w = world(&[8, 8], &pods);
        let big = [Request::whole(8, 1_000, 1_024)];
        let plan = run(&w, &Budgets::new(), &big);
        assert_eq!(plan.gain.moves, 6);
        assert!(plan.moves().all(|mv| mv.from == NodeId(0)));
        // Now node 0's pods count against a budget that allows 5 disruptions: 6
        // are needed, so nothing is planned.
        let b = PodMeta {
            budget: Some(BudgetId(1)),
            ..m
        };
        let mut pods = vec![(0, one(), b); 6];
        pods.push((1, one(), pinned));
        pods.push((1, one(), fixed));
        let w = world(&[8, 8], &pods);
        let mut budgets = Budgets::new();
        budgets.set(BudgetId(1), 5);
        let plan = run(&w, &budgets, &big);
        assert_eq!(plan.unplaced, vec![0]);
        assert!(plan.steps.is_empty());
        // Six allowed: planned.
        budgets.set(BudgetId(1), 6);
        assert_eq!(run(&w, &budgets, &big).gain.moves, 6);
    }

    #[test]
    fn a_pod_that_fits_needs_no_moves_and_the_fewest_victims_are_chosen() {
        // Node 0 (4 GPUs): one 2-GPU pod and one 1-GPU pod; node 1 (4 GPUs): one 1-GPU pod.
        // A 3-GPU pod fits node 1 as it is (3 idle) → no moves. A second 3-GPU pod:
        // node 0 has 1 idle and needs 2 more, the 2-GPU pod's leaving (1 move) is
        // enough but it must go somewhere: node 1 has 0 idle after the first → none.
        // Moving the 1-GPU pod frees only 1. So the second is unplaced.
        let m = PodMeta::default();
        let pods = vec![
            (0, Request::whole(2, 1_000, 1_024), m),
            (0, one(), m),
            (1, one(), m),
        ];
        let w = world(&[4, 4], &pods);
        let three = Request::whole(3, 1_000, 1_024);
        let plan = run(&w, &Budgets::new(), &[three.clone(), three.clone()]);
        assert_eq!(plan.steps.len(), 1);
        assert!(plan.steps[0].moves.is_empty());
        assert_eq!(plan.unplaced, vec![1]);
        // With a third, empty 4-GPU node both fit as they are (best fit: the first
        // takes node 1's 3 idle GPUs, the second node 2): no moves at all.
        let w = world(&[4, 4, 4], &pods);
        let plan = run(&w, &Budgets::new(), &[three.clone(), three.clone()]);
        assert_eq!(plan.gain.moves, 0);
        assert_eq!(plan.gain.pending_fit_before, 2);
        // A 4-GPU pod on [4, 4] with the same pods: node 1 needs 1 move (its 1-GPU
        // pod onto node 0's idle GPU); node 0 would need 2. One move.
        let w = world(&[4, 4], &pods);
        let plan = run(&w, &Budgets::new(), &[Request::whole(4, 1_000, 1_024)]);
        assert_eq!(plan.gain.moves, 1);
        assert_eq!(plan.steps[0].placement.node, NodeId(1));
    }

    fn meta() -> impl Strategy<Value = PodMeta> {
        (any::<bool>(), 0u8..10, proptest::option::of(0u32..3)).prop_map(|(pre, pin, budget)| {
            PodMeta {
                preemptible: pre || pin > 2,
                pinned: pin == 0,
                budget: budget.map(BudgetId),
                ..PodMeta::default()
            }
        })
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            3 => (1u32..=2).prop_map(|n| Request::whole(n, 500, 512)),
            2 => (100u32..=900).prop_map(|m| Request::share_milli(m, 500, 512)),
        ]
    }

    proptest! {
        /// Over random clusters and running pods: a plan never moves a pinned or
        /// non-preemptible pod, never spends more of a budget than it allows, moves a
        /// pod at most once, and replayed step by step on the ledger every move has a
        /// destination the ledger accepts and every pending pod its placement.
        #[test]
        fn a_plan_honours_budgets_and_every_move_has_a_home(
            gpus in proptest::collection::vec(1u32..=8, 2..6),
            pods in proptest::collection::vec((0u32..6, request(), meta()), 0..30),
            allowed in proptest::collection::vec(0u32..3, 3),
            pending in proptest::collection::vec((1u32..=8).prop_map(|n| Request::whole(n, 500, 512)), 1..3),
        ) {
            let c = cluster(&gpus);
            let mut l = Ledger::new(&c);
            let s = scheduler();
            let mut rng = SmallRng::seed_from_u64(3);
            let (mut running, mut requests) = (FxHashMap::default(), FxHashMap::default());
            for (node, req, meta) in &pods {
                let node = NodeId(node % gpus.len() as u32);
                if let Some(p) = s.place_within(&c, &l, req, &[node], &mut rng) {
                    let id = l.apply(&c, &p).unwrap();
                    running.insert(id, Running { alloc: id, meta: *meta, started_s: 0 });
                    requests.insert(id, req.clone());
                }
            }
            let mut budgets = Budgets::new();
            for (i, a) in allowed.iter().enumerate() {
                budgets.set(BudgetId(i as u32), *a);
            }
            let ctx = Context { cluster: &c, ledger: &l, running: &running, requests: &requests, budgets: &budgets };
            let p = plan(&mut scheduler(), &ctx, &pending, &Limits::default(), &mut rng).unwrap();
            let mut spent: FxHashMap<BudgetId, u32> = FxHashMap::default();
            let mut seen = std::collections::BTreeSet::new();
            for mv in p.moves() {
                let r = running.get(&mv.pod).expect("moved pods are known running pods");
                prop_assert!(!r.meta.pinned && r.meta.preemptible);
                prop_assert!(seen.insert(mv.pod), "moved twice");
                if let Some(b) = r.meta.budget { *spent.entry(b).or_default() += 1; }
            }
            for (b, n) in spent {
                prop_assert!(n <= budgets.allowed(b), "budget {:?}: {} > {}", b, n, budgets.allowed(b));
            }
            let mut replay = l.clone();
            for step in &p.steps {
                for mv in &step.moves {
                    prop_assert_eq!(replay.allocation(mv.pod).map(|x| x.node), Some(mv.from));
                    replay.release(mv.pod).unwrap();
                }
                for mv in &step.moves {
                    prop_assert!(replay.apply(&c, &mv.to).is_ok(), "no home for {:?}", mv.pod);
                }
                prop_assert!(replay.apply(&c, &step.placement).is_ok());
            }
            prop_assert_eq!(p.steps.len() + p.unplaced.len(), pending.len());
            prop_assert_eq!(p.gain.moves, p.moves().count());
        }
    }
}
