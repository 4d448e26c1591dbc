//! Table tests for the planner (the arithmetic in the comments: free = capacity
//! − held; cost = milli-GPU held × seconds run, with `now_s` = 1,000) and a
//! property test over random clusters.

use proptest::prelude::*;
use rustc_hash::FxHashMap;

use super::*;
use crate::model::file::mig_instances;
use crate::model::{Catalog, Link};
use crate::placement::GpuGrant;
use crate::policy::{self, PolicyArgs};
use crate::queue::{BudgetId, Budgets, PodMeta, Running};
use crate::request::{GpuMemory, Wish};

const NOW_S: u64 = 1_000;
/// The preemptor's priority in the tables.
const HIGH: i32 = 5;

/// A cluster, its ledger and the pods running on it, by name.
struct World {
    cluster: Cluster,
    ledger: Ledger,
    running: FxHashMap<AllocId, Running>,
    names: FxHashMap<AllocId, &'static str>,
    budgets: Budgets,
}

/// One running pod of a table.
#[derive(Clone)]
struct Pod {
    name: &'static str,
    grants: Vec<GpuGrant>,
    priority: i32,
    preemptible: bool,
    budget: Option<u32>,
    started_s: u64,
}

/// A low-priority, preemptible pod holding `grants` since time 0.
fn pod(name: &'static str, grants: Vec<GpuGrant>) -> Pod {
    Pod {
        name,
        grants,
        priority: 0,
        preemptible: true,
        budget: None,
        started_s: 0,
    }
}

/// A share of GPU `gpu`: `milli` of its compute and `mib` of its memory.
fn share(gpu: u8, milli: u32, mib: u64) -> Vec<GpuGrant> {
    vec![GpuGrant::shared(gpu, mib, milli)]
}

fn whole(gpu: u8) -> Vec<GpuGrant> {
    vec![GpuGrant::whole(gpu, 81_920)]
}

impl Pod {
    fn prio(mut self, p: i32) -> Pod {
        self.priority = p;
        self
    }
    fn pinned(mut self) -> Pod {
        self.preemptible = false;
        self
    }
    fn since(mut self, s: u64) -> Pod {
        self.started_s = s;
        self
    }
    fn budget(mut self, b: u32) -> Pod {
        self.budget = Some(b);
        self
    }
}

/// One node `n` of A100-80GB GPUs (32 cores, 128 GiB) with `links`.
fn a100_node(gpus: u32, links: Vec<Link>) -> Cluster {
    let catalog = Catalog::default();
    let a100 = catalog.find("A100-80GB").unwrap();
    let mut node = Node::uniform("n", 32_000, 131_072, a100, gpus);
    node.links = links;
    Cluster::new(catalog, vec![node]).unwrap()
}

impl World {
    fn new(cluster: Cluster, pods: &[Pod]) -> World {
        let mut w = World {
            ledger: Ledger::new(&cluster),
            cluster,
            running: FxHashMap::default(),
            names: FxHashMap::default(),
            budgets: Budgets::new(),
        };
        for p in pods {
            let placement = Placement {
                node: NodeId(0),
                grants: p.grants.iter().copied().collect(),
                cpu_milli: 1_000,
                memory_mib: 1_024,
                ..Placement::default()
            };
            let alloc = w.ledger.apply(&w.cluster, &placement).unwrap();
            w.running.insert(
                alloc,
                Running {
                    alloc,
                    meta: PodMeta {
                        priority: p.priority,
                        preemptible: p.preemptible,
                        budget: p.budget.map(BudgetId),
                        ..PodMeta::default()
                    },
                    started_s: p.started_s,
                },
            );
            w.names.insert(alloc, p.name);
        }
        w
    }

    fn plan_with(&self, req: &Request, min_runtime_s: u64) -> Option<Plan> {
        let mut s = Scheduler::new(policy::by_name("tessera", &PolicyArgs::default()).unwrap());
        let ctx = Context {
            cluster: &self.cluster,
            ledger: &self.ledger,
            running: &self.running,
            budgets: &self.budgets,
            now_s: NOW_S,
            min_runtime_s,
        };
        let preemptor = PodMeta {
            priority: HIGH,
            ..PodMeta::default()
        };
        plan(&mut s, &ctx, req, &preemptor, &|_| true)
    }

    fn plan(&self, req: &Request) -> Option<Plan> {
        self.plan_with(req, 0)
    }

    /// The plan's victims by name, sorted.
    fn victims(&self, plan: &Option<Plan>) -> Option<Vec<&'static str>> {
        plan.as_ref().map(|p| {
            let mut v: Vec<&'static str> = p.victims.iter().map(|a| self.names[a]).collect();
            v.sort_unstable();
            v
        })
    }
}

fn share_req(milli: u32, mib: u64) -> Request {
    let mut r = Request::share_milli(milli, 0, 0);
    r.gpu = GpuAsk::Shared {
        count: 1,
        memory: GpuMemory::Mib(mib),
        cores_milli: milli,
    };
    r
}

#[test]
fn shares_take_room_on_one_gpu() {
    struct Case {
        name: &'static str,
        pods: Vec<Pod>,
        req: Request,
        want: Option<Vec<&'static str>>,
    }
    let cases = vec![
        Case {
            // GPU 0: 1000 − 400 (c) − 500 (h) = 100 free; without c, 500 ≥ 500 fits.
            // GPU 1: 1000 − 300 (d) − 600 (h2) = 100 free; without d only 400 < 500.
            // d has the lowest priority, but only c's GPU can take the share.
            name: "the victim whose GPU can hold the share, not the lowest priority",
            pods: vec![
                pod("c", share(0, 400, 20_000)).prio(1),
                pod("h", share(0, 500, 40_000)).prio(9),
                pod("d", share(1, 300, 10_000)),
                pod("h2", share(1, 600, 60_000)).prio(9),
            ],
            req: share_req(500, 20_000),
            want: Some(vec!["c"]),
        },
        Case {
            // One victim either way: a 600 × 1,000 = 600,000, b 600 × 500 = 300,000.
            name: "equal counts: the least GPU time lost",
            pods: vec![
                pod("a", share(0, 600, 10_000)),
                pod("b", share(1, 600, 10_000)).since(500),
            ],
            req: share_req(500, 10_000),
            want: Some(vec!["b"]),
        },
        Case {
            // 1000 milli: GPU 0 needs e1 + e2 + e3 (3 victims, 3 × 200 × 100 = 60,000),
            // GPU 1 needs f alone (1 victim, 600 × 1,000 = 600,000): fewest victims first.
            name: "fewest victims before least GPU time",
            pods: vec![
                pod("e1", share(0, 200, 1_000)).since(900),
                pod("e2", share(0, 200, 1_000)).since(900),
                pod("e3", share(0, 200, 1_000)).since(900),
                pod("f", share(1, 600, 1_000)),
            ],
            req: share_req(1_000, 1_000),
            want: Some(vec!["f"]),
        },
        Case {
            // Memory counts too: GPU 0 has 81,920 − 70,000 = 11,920 MiB free and 700
            // milli; evicting m (60,000 MiB) frees enough memory. GPU 1's cheap n frees
            // compute but its 75,000 MiB neighbour leaves 81,920 − 75,000 = 6,920 < 20,000.
            name: "memory on the same GPU",
            pods: vec![
                pod("m", share(0, 100, 60_000)),
                pod("k", share(0, 200, 10_000)).prio(9),
                pod("n", share(1, 100, 1_000)).since(990),
                pod("k2", share(1, 100, 75_000)).prio(9),
            ],
            req: share_req(300, 20_000),
            want: Some(vec!["m"]),
        },
        Case {
            // Low priority but not preemptible on GPU 0; higher priority on GPU 1.
            name: "non-preemptible pods are never chosen",
            pods: vec![
                pod("np", share(0, 600, 1_000)).pinned(),
                pod("hi", share(1, 600, 1_000)).prio(9),
            ],
            req: share_req(500, 1_000),
            want: None,
        },
        Case {
            name: "equal priority is no reason to preempt",
            pods: vec![
                pod("eq0", share(0, 600, 1_000)).prio(HIGH),
                pod("eq1", share(1, 600, 1_000)).prio(HIGH),
            ],
            req: share_req(500, 1_000),
            want: None,
        },
    ];
    for c in cases {
        let w = World::new(a100_node(2, Vec::new()), &c.pods);
        let plan = w.plan(&c.req);
        assert_eq!(w.victims(&plan), c.want, "{}", c.name);
        if let Some(p) = plan {
            // The plan is real: without its victims the ledger takes the placement.
            let mut l = w.ledger.clone();
            for v in &p.victims {
                l.release(*v).unwrap();
            }
            l.apply(&w.cluster, &p.placement).unwrap();
        }
    }
}

#[test]
fn gpu_time_lost_is_held_milli_times_runtime() {
    // b: 600 milli × (1,000 − 500) s = 300,000.
    let w = World::new(
        a100_node(1, Vec::new()),
        &[pod("b", share(0, 600, 1_000)).since(500)],
    );
    let p = w.plan(&share_req(500, 1_000)).unwrap();
    assert_eq!(p.gpu_milli_seconds_lost, 300_000);
}

#[test]
fn young_pods_are_spared() {
    // y has run 1,000 − 500 = 500 s: under a 600 s minimum it stays, under 400 s it goes.
    let w = World::new(
        a100_node(1, Vec::new()),
        &[pod("y", share(0, 600, 1_000)).since(500)],
    );
    assert_eq!(w.plan_with(&share_req(500, 1_000), 600), None);
    assert_eq!(
        w.victims(&w.plan_with(&share_req(500, 1_000), 400)),
        Some(vec!["y"])
    );
}

#[test]
fn whole_gpu_needs_every_tenant_gone() {
    // GPU 1 is cheaper (t alone) but u may not go, so GPU 1 can never be whole again.
    let w = World::new(
        a100_node(2, Vec::new()),
        &[
            pod("s1", share(0, 300, 1_000)),
            pod("s2", share(0, 300, 1_000)),
            pod("t", share(1, 200, 1_000)).since(999),
            pod("u", share(1, 100, 1_000)).pinned(),
        ],
    );
    let p = w.plan(&Request::whole(1, 0, 0));
    assert_eq!(w.victims(&p), Some(vec!["s1", "s2"]));
    assert_eq!(p.unwrap().placement.grants[0].gpu, 0);
}

#[test]
fn multi_gpu_pods_get_a_connected_set() {
    // NVLink pairs (0,1) and (2,3); PCIe between them. GPU 0 idle, y on 1
    // (1000 × 1,000 = 1,000,000), z on 2 (may not go), x on 3 (1000 × 100 = 100,000).
    let n = 4;
    let links: Vec<Link> = (0..n * n)
        .map(|i| {
            let (a, b) = (i / n, i % n);
            if a == b {
                Link::Unknown
            } else if a / 2 == b / 2 {
                Link::NvLink(4)
            } else {
                Link::PcieSwitch
            }
        })
        .collect();
    let w = World::new(
        a100_node(4, links),
        &[
            pod("y", whole(1)),
            pod("z", whole(2)).pinned(),
            pod("x", whole(3)).since(900),
        ],
    );
    let gpus = |p: &Option<Plan>| -> Vec<u8> {
        p.as_ref()
            .unwrap()
            .placement
            .grants
            .iter()
            .map(|g| g.gpu)
            .collect()
    };
    // Without a topology requirement {0, 3} costs the cheaper x.
    let free = w.plan(&Request::whole(2, 0, 0));
    assert_eq!(w.victims(&free), Some(vec!["x"]));
    assert_eq!(gpus(&free), vec![0, 3]);
    // NVLink required: {0, 3} is not connected and {2, 3} holds z, so {0, 1} and y.
    let mut req = Request::whole(2, 0, 0);
    req.constraints.nvlink = Wish::Required;
    let linked = w.plan(&req);
    assert_eq!(w.victims(&linked), Some(vec!["y"]));
    assert_eq!(gpus(&linked), vec![0, 1]);
}

#[test]
fn mig_instances_are_freed_on_a_mig_gpu() {
    // GPU 0 in MIG mode with two 3g.40gb instances held by a (1,000 s) and b (500 s);
    // GPU 1 is a plain GPU with a cheap share c that no MIG request can use.
    let catalog = Catalog::default();
    let a100 = catalog.find("A100-80GB").unwrap();
    let mut node = Node::uniform("n", 32_000, 131_072, a100, 2);
    node.gpus[0].mig_enabled = true;
    node.gpus[0].mig_instances =
        mig_instances(&catalog, a100, "GPU-0", &["3g.40gb", "3g.40gb"]).unwrap();
    let geo = catalog.spec(a100).mig.clone().unwrap();
    let cluster = Cluster::new(catalog, vec![node]).unwrap();
    let (_, p3g) = geo.profile("3g.40gb").unwrap();
    let inst = |k: usize| {
        let i = &cluster.node(NodeId(0)).gpus[0].mig_instances[k];
        vec![fit::mig_grant(
            0,
            &geo,
            p3g,
            fit::instance_slot(&geo, i).unwrap(),
        )]
    };
    let w = World::new(
        cluster.clone(),
        &[
            pod("a", inst(0)),
            pod("b", inst(1)).since(500),
            pod("c", share(1, 100, 1_000)).since(999),
        ],
    );
    let req = Request {
        gpu: GpuAsk::Mig {
            profile: "3g.40gb".into(),
        },
        ..Request::default()
    };
    let p = w.plan(&req);
    assert_eq!(w.victims(&p), Some(vec!["b"]));
    let g = p.unwrap().placement.grants[0];
    assert_eq!(
        (g.gpu, g.mig.map(|s| s.start)),
        (
            0,
            Some(cluster.node(NodeId(0)).gpus[0].mig_instances[1].start)
        )
    );
}

#[test]
fn disruption_budgets_are_never_overdrawn() {
    // Whole GPU: GPU 0 needs p1 + p2 (budget 7; 2 × 300 × 100 = 60,000), GPU 1 needs
    // q1 + q2 (no budget; 2 × 300 × 1,000 = 600,000). Two victims either way.
    let pods = [
        pod("p1", share(0, 300, 1_000)).since(900).budget(7),
        pod("p2", share(0, 300, 1_000)).since(900).budget(7),
        pod("q1", share(1, 300, 1_000)),
        pod("q2", share(1, 300, 1_000)),
    ];
    for (allowed, want) in [
        (2, vec!["p1", "p2"]), // the budget affords both: the cheaper pair
        (1, vec!["q1", "q2"]), // one disruption left cannot take both p's
        (0, vec!["q1", "q2"]), // none left: the p's are not candidates at all
    ] {
        let mut w = World::new(a100_node(2, Vec::new()), &pods);
        w.budgets.set(BudgetId(7), allowed);
        assert_eq!(
            w.victims(&w.plan(&Request::whole(1, 0, 0))),
            Some(want),
            "disruptionsAllowed {allowed}"
        );
    }
    // A pod whose budget the caller does not know is never disrupted.
    let w = World::new(
        a100_node(1, Vec::new()),
        &[pod("u", share(0, 600, 1_000)).budget(8)],
    );
    assert_eq!(w.plan(&share_req(500, 1_000)), None);
}

#[test]
fn may_evict_narrows_the_candidates() {
    let w = World::new(
        a100_node(2, Vec::new()),
        &[
            pod("a", share(0, 600, 1_000)),
            pod("b", share(1, 600, 1_000)).since(500),
        ],
    );
    let b = w
        .names
        .iter()
        .find(|(_, n)| **n == "b")
        .map(|(a, _)| *a)
        .unwrap();
    let mut s = Scheduler::new(policy::by_name("binpack", &PolicyArgs::default()).unwrap());
    let ctx = Context {
        cluster: &w.cluster,
        ledger: &w.ledger,
        running: &w.running,
        budgets: &w.budgets,
        now_s: NOW_S,
        min_runtime_s: 0,
    };
    let pre = PodMeta {
        priority: HIGH,
        ..PodMeta::default()
    };
    // b is cheaper, but the caller rules it out.
    let p = plan(&mut s, &ctx, &share_req(500, 1_000), &pre, &|r| {
        r.alloc != b
    });
    assert_eq!(w.victims(&p), Some(vec!["a"]));
}

/// A random pod for the property test: node, GPU, kind (0 share, 1 whole, 2 CPU-only),
/// milli, MiB, CPU, priority, preemptible, budget, start.
type RandomPod = (u32, u8, u8, u32, u64, u64, i32, bool, Option<u32>, u64);

fn random_pod() -> impl Strategy<Value = RandomPod> {
    (
        0u32..2,
        0u8..4,
        0u8..3,
        1u32..10,
        0u64..50_000,
        0u64..12_000,
        0i32..4,
        proptest::bool::weighted(0.8),
        proptest::option::of(0u32..2),
        0u64..1_000,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Over random clusters: every plan is made of allowed victims, never overdraws a
    /// budget, really fits once they are gone and needs each of them; and when no plan
    /// comes back for a pod that fits nowhere as things stand (without budgets in play),
    /// no node fits even with every candidate gone.
    #[test]
    fn plans_are_allowed_real_and_minimal(
        pods in proptest::collection::vec(random_pod(), 0..16),
        allowed in (0u32..3, 0u32..3),
        ask in (0u8..3, 1u32..3, 1u32..11, 0u64..60_000, 0u64..40_000),
        preemptor_priority in 0i32..5,
        min_runtime_s in 0u64..400,
    ) {
        let catalog = Catalog::default();
        let a100 = catalog.find("A100-80GB").unwrap();
        let nodes = (0..2).map(|i| Node::uniform(format!("n{i}"), 32_000, 65_536, a100, 4)).collect();
        let cluster = Cluster::new(catalog, nodes).unwrap();
        let mut ledger = Ledger::new(&cluster);
        let mut running = FxHashMap::default();
        for (node, gpu, kind, tenth, mib, cpu, priority, preemptible, budget, started_s) in &pods {
            let grants = match kind {
                0 => [GpuGrant::shared(*gpu, *mib, tenth * 100)].into_iter().collect(),
                1 => [GpuGrant::whole(*gpu, 81_920)].into_iter().collect(),
                _ => Default::default(),
            };
            let p = Placement { node: NodeId(*node), grants, cpu_milli: *cpu, memory_mib: cpu * 2, ..Placement::default() };
            if let Ok(alloc) = ledger.apply(&cluster, &p) {
                let meta = PodMeta { priority: *priority, preemptible: *preemptible, budget: budget.map(BudgetId), ..PodMeta::default() };
                running.insert(alloc, Running { alloc, meta, started_s: *started_s });
            }
        }
        let mut budgets = Budgets::new();
        budgets.set(BudgetId(0), allowed.0);
        budgets.set(BudgetId(1), allowed.1);
        let (kind, count, tenth, mib, cpu) = ask;
        let mut req = match kind {
            0 => share_req(tenth * 100, mib),
            1 => Request::whole(count, 0, 0),
            _ => Request::cpu_only(0, 0),
        };
        if let GpuAsk::Shared { count: c, .. } = &mut req.gpu { *c = count; }
        req.cpu_milli = cpu;
        req.memory_mib = cpu;
        let preemptor = PodMeta { priority: preemptor_priority, ..PodMeta::default() };
        let ctx = Context { cluster: &cluster, ledger: &ledger, running: &running, budgets: &budgets, now_s: NOW_S, min_runtime_s };
        let mut s = Scheduler::new(policy::by_name("binpack", &PolicyArgs::default()).unwrap());
        let eligible = |r: &Running| r.meta.priority < preemptor_priority && r.meta.preemptible
            && NOW_S - r.started_s >= min_runtime_s && budgets.may_disrupt(r.meta.budget);
        match plan(&mut s, &ctx, &req, &preemptor, &|_| true) {
            Some(p) => {
                let mut spent: FxHashMap<BudgetId, u32> = FxHashMap::default();
                let mut lost = 0u64;
                for v in &p.victims {
                    let r = running[v];
                    prop_assert!(eligible(&r), "victim {v:?} not allowed: {r:?}");
                    prop_assert_eq!(ledger.allocation(*v).unwrap().node, p.node);
                    if let Some(b) = r.meta.budget { *spent.entry(b).or_default() += 1; }
                    let held: u64 = ledger.allocation(*v).unwrap().grants.iter().map(|g| u64::from(g.cores_milli)).sum();
                    lost += held * (NOW_S - r.started_s);
                }
                for (b, n) in &spent {
                    prop_assert!(*n <= budgets.allowed(*b), "budget {b:?}: {n} > {}", budgets.allowed(*b));
                }
                prop_assert_eq!(p.gpu_milli_seconds_lost, lost);
                let mut dedup = p.victims.clone();
                dedup.dedup();
                prop_assert_eq!(dedup.len(), p.victims.len());
                let fits_without = |victims: &[AllocId]| {
                    let mut l = ledger.clone();
                    for v in victims { l.release(*v).unwrap(); }
                    l.apply(&cluster, &p.placement).is_ok()
                };
                prop_assert!(fits_without(&p.victims), "the request must fit without the victims");
                for v in &p.victims {
                    let others: Vec<AllocId> = p.victims.iter().copied().filter(|o| o != v).collect();
                    prop_assert!(!fits_without(&others), "victim {v:?} was not needed");
                }
            }
            None => {
                // The caller asks only when the pod fits nowhere as things stand.
                let fits_now = cluster.ids().any(|id| {
                    let view = NodeView { node: cluster.node(id), used: ledger.node(id), catalog: &cluster.catalog };
                    fit::check(view, &req).is_ok()
                });
                if !fits_now && pods.iter().all(|p| p.8.is_none()) {
                    for id in cluster.ids() {
                        let mut l = ledger.clone();
                        for r in running.values().filter(|r| eligible(r)) {
                            if l.allocation(r.alloc).unwrap().node == id {
                                l.release(r.alloc).unwrap();
                            }
                        }
                        let view = NodeView { node: cluster.node(id), used: l.node(id), catalog: &cluster.catalog };
                        prop_assert!(fit::check(view, &req).is_err(), "no plan, yet node {id:?} fits with every candidate gone");
                    }
                }
            }
        }
    }
}

#[test]
fn between_equal_plans_the_lower_priority_pod_goes() {
    // Either whole pod frees a GPU, each alone, with the same GPU time run:
    // kube-scheduler's order (victims::Rank) breaks the tie, so the
    // priority-0 pod goes and the priority-3 one stays, whichever GPU it holds.
    for (a, b) in [(0, 3), (3, 0)] {
        let w = World::new(
            a100_node(2, Vec::new()),
            &[pod("a", whole(0)).prio(a), pod("b", whole(1)).prio(b)],
        );
        let low = if a == 0 { "a" } else { "b" };
        assert_eq!(
            w.victims(&w.plan(&Request::whole(1, 0, 0))),
            Some(vec![low])
        );
    }
}
