//! Which pods to evict so that a pod whose DRA claims fit nowhere fits
//! somewhere (standalone mode, `--dra`). Pure: the pod's claims, the
//! candidate nodes, the inventories, what claims hold now and, per node, the
//! pods that may be evicted in; the node and its victims out, or `None`.
//!
//! The victims are chosen by the core's one rule,
//! [`tessera_core::queue::victims`] (kube-scheduler's DefaultPreemption:
//! every candidate out, then reprieved one by one, budget violators first,
//! the most important first; a plan that overdraws a budget is dropped), the
//! same rule the device-plugin path's planner uses. This adapter supplies only
//! what is particular to claims: the fit check, [`place`] on the node's
//! inventories with what the candidates' claims free, so "fits" means exactly
//! what the normal pass will find once the victims are gone.
//!
//! What a victim frees is what its claims hold, counted only for a claim
//! whose every consumer (`reservedFor`, pods or not) is a victim: a claim
//! shared with a pod that stays, or reserved for something that is not a pod,
//! stays allocated. A claim the preemptor itself uses is never counted freed.
//!
//! Among nodes with a plan, the core's [`victims::pick_node`]
//! (kube-scheduler's `pickOneNodeForPreemption`: the lowest highest victim
//! priority, the lowest sum, the fewest victims, the latest start), then the
//! node whose name sorts first. Equal inputs give equal plans.
//!
//! Two kinds ([`Mode`]), as on the device-plugin path
//! ([`crate::mirror::Mirror::preemption`]):
//! - **Preemption** by priority within the preemptor's queue (the caller
//!   offers only pods of its queue): victims have strictly lower priority.
//! - **Reclaim** of borrowed quota across queues, for a pod whose queue is
//!   within its guarantee: victims are pods of *other* queues holding more
//!   than their guarantee, whatever their priority, and only what is borrowed
//!   is taken. A candidate is a victim only if its queue keeps its guarantee
//!   without it; a node's plan is dropped unless each victim queue keeps its
//!   guarantee without all its victims together, and unless the preemptor's
//!   queue stays within its guarantee with the pod's claims placed as they
//!   would be there (what they count depends on the devices, so the caller
//!   judges it per placement). The quota rule is the core's
//!   (`tessera_core::queue::reclaim::keeps_guarantee` and `all_keep`, which
//!   the device-plugin planner's reclaim asks too); its planner cannot be fed
//!   here, as it plans on the ledger's GPUs, not on claims. As there, only
//!   the victim's own queue (a leaf) is checked, not its parents. Unlike
//!   there, a node whose plan would take a queue below its guarantee is
//!   dropped and the other nodes still compete, rather than the whole plan.
//!
//! A queue's usage and a candidate's weight in it are milli GPU-equivalents
//! ([`super::quota`]); a claim counts against the first pod it is reserved
//! for, as in queue usage, so taking a pod that shares a claim with one that
//! stays counts as taken although nothing is freed: never below a guarantee.

use std::collections::{BTreeMap, BTreeSet};

use tessera_core::policy::Policy;
use tessera_core::queue::reclaim;
use tessera_core::queue::victims::{self, OnNode, Rank, Standing};

use super::cel::Env;
use super::inventory::{Holdings, NodeInventory};
use super::place::{Plan, SelectorCheck, place};
use super::pod::PodClaim;
use crate::convert::NodeFacts;

/// An allocated claim a candidate holds.
#[derive(Debug, Clone)]
pub struct HeldClaim {
    /// Its UID: the consumer its holdings are kept under in
    /// [`Situation::usage`] ([`super::inventory::claim_consumer`]).
    pub uid: String,
    /// The UIDs in its `reservedFor`, every kind of consumer.
    pub consumers: Vec<String>,
}

/// A pod that may be evicted for the preemptor.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its UID.
    pub id: String,
    pub priority: i32,
    /// When it started, Unix seconds.
    pub started_s: u64,
    /// The PodDisruptionBudget covering it (a key of [`Situation::budgets`]).
    pub budget: Option<String>,
    /// The claims reserved for it.
    pub claims: Vec<HeldClaim>,
    /// Its queue's name (empty when in none).
    pub queue: String,
    /// What it counts in its queue's usage: milli GPU-equivalents of the
    /// claims it is the first pod reserved for.
    pub milli: u64,
}

/// Which candidates may be victims.
pub enum Mode<'a> {
    /// Preemption within a queue: those of strictly lower priority than
    /// [`Situation::priority`].
    Priority,
    /// Reclaim of borrowed quota across queues, whatever the priorities.
    Reclaim(Quotas<'a>),
}

/// What a queue holds and is guaranteed, milli GPU-equivalents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub held_milli: u64,
    pub guaranteed_milli: u64,
}

/// The quota state reclaim reads.
pub struct Quotas<'a> {
    /// The preemptor's queue: its pods are never reclaimed from.
    pub queue: &'a str,
    /// Per queue name; a queue missing here (a pod in no queue) has nothing
    /// borrowed.
    pub queues: &'a BTreeMap<String, Quota>,
    /// Whether the preemptor's queue stays within its guarantee with the
    /// pod's claims placed as in the plan (`false`: it would borrow, and a
    /// borrower reclaims nothing).
    pub within_guarantee: &'a dyn Fn(&Plan) -> bool,
}

impl Quotas<'_> {
    /// Whether `queue` stays at or above its guarantee without `taken_milli`.
    fn keeps(&self, queue: &str, taken_milli: u64) -> bool {
        self.queues.get(queue).is_some_and(|q| {
            reclaim::keeps_guarantee(q.held_milli, q.guaranteed_milli, taken_milli)
        })
    }

    /// Whether every victim queue keeps its guarantee without all its victims.
    fn keep_all(&self, victims: &[&Candidate]) -> bool {
        reclaim::all_keep(
            victims.iter().map(|v| (v.queue.as_str(), v.milli)),
            |q, milli| self.keeps(q, milli),
        )
    }
}

impl Mode<'_> {
    /// Whether `c` may be a victim at all (before the plan's own checks).
    fn may_evict(&self, c: &Candidate, priority: i32) -> bool {
        match self {
            Mode::Priority => c.priority < priority,
            Mode::Reclaim(q) => c.queue != q.queue && q.keeps(&c.queue, c.milli),
        }
    }
}

/// Everything a plan is made from.
pub struct Situation<'a> {
    /// The preemptor's claims ([`super::pod::pod_claims`]).
    pub claims: &'a [PodClaim],
    /// The preemptor's priority: in [`Mode::Priority`], only candidates
    /// strictly below it are victims.
    pub priority: i32,
    /// Preemption by priority, or reclaim.
    pub mode: Mode<'a>,
    /// The nodes the pod may go to (its host checks passed).
    pub nodes: &'a [NodeFacts],
    pub inventories: &'a BTreeMap<String, NodeInventory>,
    /// What every allocated claim holds now.
    pub usage: &'a Holdings,
    pub policy: &'a dyn Policy,
    pub env: &'a Env,
    pub selects: SelectorCheck<'a>,
    /// Per node name, the pods there that may be evicted.
    pub candidates: &'a BTreeMap<String, Vec<Candidate>>,
    /// Per budget (`namespace/name`), the disruptions it allows now; a
    /// budget a candidate names that is missing here allows none.
    pub budgets: &'a BTreeMap<String, u32>,
}

/// The node to make room on and whom to evict there (UIDs, the most
/// important first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victims {
    pub node: String,
    pub victims: Vec<String>,
}

/// `usage` once the claims `victims` free hold nothing (see the module docs):
/// the core's [`Holdings::without`] those claims.
fn freed(s: &Situation<'_>, victims: &[&Candidate]) -> Holdings {
    let gone: BTreeSet<&str> = victims.iter().map(|v| v.id.as_str()).collect();
    let own: BTreeSet<&str> = s
        .claims
        .iter()
        .filter_map(|c| c.claim.metadata.uid.as_deref())
        .collect();
    let released = victims.iter().flat_map(|v| &v.claims).filter(|c| {
        c.consumers.iter().all(|u| gone.contains(u.as_str())) && !own.contains(c.uid.as_str())
    });
    s.usage.without(released.map(|c| c.uid.as_str()))
}

/// Where the pod's claims allocate on `node` once `victims` are gone, if
/// they all do.
fn placement(s: &Situation<'_>, node: &NodeFacts, victims: &[&Candidate]) -> Option<Plan> {
    let usage = freed(s, victims);
    place(
        s.claims,
        std::slice::from_ref(node),
        s.inventories,
        &usage,
        s.policy,
        s.env,
        s.selects,
        // Feasibility only: the host fit was judged, the score is not used.
        &BTreeMap::new(),
    )
    .ok()
}

/// Whether the pod's claims all allocate on `node` once `victims` are gone.
fn fits(s: &Situation<'_>, node: &NodeFacts, victims: &[&Candidate]) -> bool {
    placement(s, node, victims).is_some()
}

/// How `c` ranks as a victim ([`victims::Standing`]).
fn standing(c: &Candidate) -> Standing {
    Standing {
        priority: c.priority,
        started_s: c.started_s,
    }
}

/// The node and victims that make room for the pod, if any set of
/// candidates does; `None` also when the pod fits somewhere already (a normal
/// pass places it).
pub fn plan(s: &Situation<'_>) -> Option<Victims> {
    let mut plans = Vec::new();
    for node in s.nodes {
        let Some(victims) = select(s, node) else {
            continue;
        };
        if victims.is_empty() {
            return None;
        }
        let rank = Rank::of(victims.iter().map(|v| standing(v)));
        plans.push((node.name.as_str(), rank, victims));
    }
    let (node, victims) = victims::pick_node(plans)?;
    Some(Victims {
        node: node.to_string(),
        victims: victims.iter().map(|v| v.id.clone()).collect(),
    })
}

/// The victims on `node`, the most important first, chosen by the core's
/// [`victims::select_on_node`] with [`fits`] as its fit check; then the
/// reclaim rule. `Some(empty)` when the pod fits there without evicting
/// anyone.
fn select<'a>(s: &'a Situation<'_>, node: &NodeFacts) -> Option<Vec<&'a Candidate>> {
    let lower: Vec<&Candidate> = s
        .candidates
        .get(&node.name)
        .into_iter()
        .flatten()
        .filter(|c| s.mode.may_evict(c, s.priority))
        .collect();
    let on_node: Vec<OnNode<&str>> = lower
        .iter()
        .map(|c| OnNode {
            standing: standing(c),
            budget: c.budget.as_deref(),
        })
        .collect();
    // A budget missing from the list allows none.
    let allowed = |b: &&str| s.budgets.get(*b).copied().unwrap_or(0);
    let pick = |set: &[usize]| -> Vec<&Candidate> { set.iter().map(|&i| lower[i]).collect() };
    let mut fits_with = |set: &[usize]| fits(s, node, &pick(set));
    let chosen = victims::select_on_node(&on_node, &allowed, &mut fits_with)?;
    let victims = pick(&chosen);
    if let Mode::Reclaim(q) = &s.mode
        && !victims.is_empty()
    {
        // Only what is borrowed, and only for a queue within its guarantee.
        if !q.keep_all(&victims) {
            return None;
        }
        let placed = placement(s, node, &victims)?;
        if !(q.within_guarantee)(&placed) {
            return None;
        }
    }
    Some(victims)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use tessera_core::policy::{self, PolicyArgs};

    use super::*;
    use crate::dra::claim::ClaimAsk;
    use crate::dra::inventory::{claims_holdings, node_inventory};
    use crate::dra::pod::Step;
    use crate::dra::types::{DeviceClass, ResourceClaim, ResourceSlice};

    fn classes() -> Vec<DeviceClass> {
        serde_json::from_value(
            json!([{"metadata": {"name": "gpu.tessera.io"}, "spec": {"selectors":
            [{"cel": {"expression": "device.driver == 'gpu.tessera.io'"}}]}}]),
        )
        .unwrap()
    }

    /// `gpus` whole GPUs on `node`, as the node agent publishes them.
    fn slice(node: &str, gpus: usize) -> ResourceSlice {
        let devices: Vec<Value> = (0..gpus)
            .map(|i| {
                json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"},
                "model": {"string": "A100-80GB"}}, "capacity": {"memory": {"value": "80Gi"}}})
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": format!("{node}-slice")},
            "spec": {"driver": "gpu.tessera.io", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices}}))
        .unwrap()
    }

    fn claim(uid: &str, count: u32) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly":
                {"deviceClassName": "gpu.tessera.io", "count": count}}]}}}))
        .unwrap()
    }

    /// The preemptor's claim, to allocate: `count` whole GPUs.
    fn wants(count: u32) -> Vec<PodClaim> {
        let c = claim("mine", count);
        let ask = ClaimAsk::resolve(&c, &classes()).unwrap();
        vec![PodClaim {
            key: "ml/mine".into(),
            claim: c,
            step: Step::Allocate(ask),
        }]
    }

    /// Claim `uid` allocated `node`'s GPUs `gpus`, reserved for `consumers`.
    fn held(uid: &str, node: &str, gpus: &[usize], consumers: &[&str]) -> HeldClaim {
        let results: Vec<Value> = gpus
            .iter()
            .map(|i| {
                json!({"request": "g", "driver": "gpu.tessera.io", "pool": node,
                "device": format!("gpu-{i}")})
            })
            .collect();
        let reserved: Vec<Value> = consumers
            .iter()
            .map(|u| json!({"resource": "pods", "name": u, "uid": u}))
            .collect();
        let mut c = claim(uid, gpus.len() as u32);
        c.status = Some(
            serde_json::from_value(json!({"allocation": {"devices": {"results": results}},
                "reservedFor": reserved}))
            .unwrap(),
        );
        CLAIMS.with(|all| all.borrow_mut().insert(uid.into(), c));
        HeldClaim {
            uid: uid.into(),
            consumers: consumers.iter().map(|u| u.to_string()).collect(),
        }
    }

    thread_local! {
        /// The claims [`held`] made on this test's thread, by UID, from which
        /// [`World::plan`] reads the usage.
        static CLAIMS: std::cell::RefCell<BTreeMap<String, ResourceClaim>> =
            std::cell::RefCell::default();
    }

    /// GPUs claim `uid` holds.
    fn gpus_of(uid: &str) -> u64 {
        CLAIMS.with(|all| claims_holdings(all.borrow().get(uid), None).devices.len() as u64)
    }

    /// Pod `id` on its node, holding `claims`, in no queue; it counts 1000
    /// per GPU of each claim it is the first consumer of.
    fn pod(id: &str, priority: i32, started_s: u64, claims: Vec<HeldClaim>) -> Candidate {
        let milli = claims
            .iter()
            .filter(|c| c.consumers.first().map(String::as_str) == Some(id))
            .map(|c| 1000 * gpus_of(&c.uid))
            .sum();
        Candidate {
            id: id.into(),
            priority,
            started_s,
            budget: None,
            claims,
            queue: String::new(),
            milli,
        }
    }

    /// [`holder`] in queue `queue`.
    fn queued(queue: &str, id: &str, priority: i32, node: &str, gpus: &[usize]) -> Candidate {
        Candidate {
            queue: queue.into(),
            ..holder(id, priority, node, gpus)
        }
    }

    /// One pod holding GPUs `gpus` of `node` through its own claim.
    fn holder(id: &str, priority: i32, node: &str, gpus: &[usize]) -> Candidate {
        pod(
            id,
            priority,
            1000,
            vec![held(&format!("c-{id}"), node, gpus, &[id])],
        )
    }

    struct World {
        nodes: Vec<(&'static str, usize)>,
        candidates: Vec<(&'static str, Candidate)>,
        /// Claims allocated to pods that are not candidates.
        others: Vec<HeldClaim>,
        budgets: BTreeMap<String, u32>,
        /// Reclaim instead of preemption by priority: the preemptor's queue,
        /// what it holds and is guaranteed (milli), and every queue's quota.
        reclaim: Option<(&'static str, Quota, BTreeMap<String, Quota>)>,
    }

    impl World {
        fn new(nodes: &[(&'static str, usize)]) -> World {
            World {
                nodes: nodes.to_vec(),
                candidates: Vec::new(),
                others: Vec::new(),
                budgets: BTreeMap::new(),
                reclaim: None,
            }
        }

        /// Reclaim for a pod of queue `own` holding `own_held` of its
        /// guarantee `own_guaranteed`; `queues`: (name, held, guaranteed).
        fn reclaiming(
            mut self,
            own: &'static str,
            own_held: u64,
            own_guaranteed: u64,
            queues: &[(&str, u64, u64)],
        ) -> World {
            let quota = |held_milli, guaranteed_milli| Quota {
                held_milli,
                guaranteed_milli,
            };
            let mut all: BTreeMap<String, Quota> = queues
                .iter()
                .map(|(n, h, g)| (n.to_string(), quota(*h, *g)))
                .collect();
            all.entry(own.into())
                .or_insert(quota(own_held, own_guaranteed));
            self.reclaim = Some((own, quota(own_held, own_guaranteed), all));
            self
        }

        fn with(mut self, node: &'static str, c: Candidate) -> World {
            self.candidates.push((node, c));
            self
        }

        /// The plan for a preemptor of `priority` asking `gpus` whole GPUs.
        fn plan(&self, priority: i32, gpus: u32) -> Option<Victims> {
            let inventories: BTreeMap<String, NodeInventory> = self
                .nodes
                .iter()
                .map(|(n, g)| (n.to_string(), node_inventory(n, &[slice(n, *g)])))
                .collect();
            let nodes: Vec<NodeFacts> = self
                .nodes
                .iter()
                .map(|(n, _)| NodeFacts {
                    name: n.to_string(),
                    ..NodeFacts::default()
                })
                .collect();
            // Every allocated claim counts once in the usage, shared or not.
            let mut all: BTreeMap<&str, &HeldClaim> = BTreeMap::new();
            for c in self.candidates.iter().flat_map(|(_, c)| &c.claims) {
                all.insert(&c.uid, c);
            }
            for c in &self.others {
                all.insert(&c.uid, c);
            }
            let usage = CLAIMS.with(|claims| {
                let claims = claims.borrow();
                claims_holdings(all.keys().filter_map(|uid| claims.get(*uid)), None)
            });
            let mut candidates: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
            for (n, c) in &self.candidates {
                candidates.entry(n.to_string()).or_default().push(c.clone());
            }
            let claims = wants(gpus);
            let policy = policy::by_name("binpack", &PolicyArgs::default()).unwrap();
            let env = Env::new();
            // The preemptor's claims count 1000 per whole GPU placed.
            let within = |p: &Plan| {
                let (_, own, _) = self.reclaim.as_ref().expect("reclaiming");
                let ask: u64 = p
                    .allocations
                    .iter()
                    .map(|(_, a)| 1000 * a.results.len() as u64)
                    .sum();
                own.held_milli + ask <= own.guaranteed_milli
            };
            let mode = match &self.reclaim {
                None => Mode::Priority,
                Some((queue, _, queues)) => Mode::Reclaim(Quotas {
                    queue,
                    queues,
                    within_guarantee: &within,
                }),
            };
            plan(&Situation {
                claims: &claims,
                priority,
                mode,
                nodes: &nodes,
                inventories: &inventories,
                usage: &usage,
                policy: policy.as_ref(),
                env: &env,
                selects: &|_, _| true,
                candidates: &candidates,
                budgets: &self.budgets,
            })
        }
    }

    fn victims(node: &str, ids: &[&str]) -> Option<Victims> {
        Some(Victims {
            node: node.into(),
            victims: ids.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Two GPUs, held by priorities 1 and 5; a pod of priority 10 asking
    /// one: both are taken out, the priority-5 pod is reprieved first (the
    /// pod still fits without evicting it), the priority-1 pod is not.
    #[test]
    fn the_lowest_priority_pod_is_the_victim() {
        let w = World::new(&[("node-a", 2)])
            .with("node-a", holder("p5", 5, "node-a", &[0]))
            .with("node-a", holder("p1", 1, "node-a", &[1]));
        assert_eq!(w.plan(10, 1), victims("node-a", &["p1"]));
    }

    /// Three GPUs held by priorities 1, 3 and 5; a pod asking two: the
    /// priority-5 pod is reprieved, the priority-3 one cannot be (one GPU
    /// free is not enough), so the plan keeps it as a second victim.
    #[test]
    fn a_reprieve_that_does_not_fit_keeps_the_extra_victim() {
        let w = World::new(&[("node-a", 3)])
            .with("node-a", holder("p1", 1, "node-a", &[0]))
            .with("node-a", holder("p3", 3, "node-a", &[1]))
            .with("node-a", holder("p5", 5, "node-a", &[2]));
        assert_eq!(w.plan(10, 2), victims("node-a", &["p3", "p1"]));
        assert_eq!(w.plan(10, 3), victims("node-a", &["p5", "p3", "p1"]));
        // More than the node has: nobody is evicted for nothing.
        assert_eq!(w.plan(10, 4), None);
    }

    /// A one-GPU node whose GPU is held by a claim shared by two pods: it is
    /// freed only when both are victims; not when the other consumer stays
    /// (a higher-priority pod, or a consumer that is not a pod at all).
    #[test]
    fn a_claim_shared_with_a_consumer_that_stays_is_not_freed() {
        let shared = |other: &str| held("shared", "node-a", &[0], &["low", other]);
        // The other consumer is no candidate (priority 20, above the preemptor).
        let mut w =
            World::new(&[("node-a", 1)]).with("node-a", pod("low", 1, 1000, vec![shared("high")]));
        w.others.push(shared("high"));
        assert_eq!(w.plan(10, 1), None);
        // A non-pod consumer (a ReplicaSet reservation) never leaves.
        let w = World::new(&[("node-a", 1)])
            .with("node-a", pod("low", 1, 1000, vec![shared("rs-uid")]));
        assert_eq!(w.plan(10, 1), None);
        // Both consumers are victims: the claim is freed.
        let w = World::new(&[("node-a", 1)])
            .with("node-a", pod("low", 1, 1000, vec![shared("low2")]))
            .with("node-a", pod("low2", 2, 1000, vec![shared("low2")]));
        assert_eq!(w.plan(10, 1), victims("node-a", &["low2", "low"]));
    }

    /// Budgets: "a" (priority 1) is covered by a budget, "b" (priority 2)
    /// by none. Asking one GPU, priority order alone would evict "a"; with
    /// the budget allowing none, "a" is reprieved first and "b" evicted.
    /// Asking two, both are needed: no plan while the budget allows none,
    /// both once it allows one.
    #[test]
    fn budgets_are_never_overdrawn() {
        let mut a = holder("a", 1, "node-a", &[0]);
        a.budget = Some("ml/guard".into());
        let world = |allowed: u32| {
            let mut w = World::new(&[("node-a", 2)])
                .with("node-a", a.clone())
                .with("node-a", holder("b", 2, "node-a", &[1]));
            w.budgets.insert("ml/guard".into(), allowed);
            w
        };
        assert_eq!(world(0).plan(10, 1), victims("node-a", &["b"]));
        assert_eq!(world(0).plan(10, 2), None);
        assert_eq!(world(1).plan(10, 2), victims("node-a", &["b", "a"]));
        // Without the budget, priority order alone: "a" goes.
        let w = World::new(&[("node-a", 2)])
            .with("node-a", holder("a", 1, "node-a", &[0]))
            .with("node-a", holder("b", 2, "node-a", &[1]));
        assert_eq!(w.plan(10, 1), victims("node-a", &["a"]));
        // A budget the candidate names but nobody listed allows nothing.
        let mut w = world(0);
        w.budgets.clear();
        assert_eq!(w.plan(10, 2), None);
    }

    /// Only strictly lower priorities are victims; with none, no plan. A pod
    /// that fits somewhere already gets no plan either.
    #[test]
    fn no_plan_without_a_lower_priority_pod_or_when_it_fits() {
        let w = World::new(&[("node-a", 1)]).with("node-a", holder("p", 5, "node-a", &[0]));
        assert_eq!(w.plan(5, 1), None, "equal priority");
        assert_eq!(w.plan(4, 1), None, "higher priority");
        assert_eq!(w.plan(6, 1), victims("node-a", &["p"]));
        assert_eq!(World::new(&[("node-a", 1)]).plan(6, 1), None, "no pods");
        let w = World::new(&[("node-a", 1), ("node-b", 1)])
            .with("node-a", holder("p", 5, "node-a", &[0]));
        assert_eq!(w.plan(6, 1), None, "node-b is free");
    }

    /// Node choice, each row decided by one rule (a one-GPU pod, priority
    /// 100). Each node has one GPU, held by one claim all its pods share, so
    /// every pod listed on a node is a victim there.
    #[test]
    fn nodes_are_chosen_by_priority_then_count_then_sum_then_start_then_name() {
        // (node-a's pods, node-b's pods, the winner); pods as (priority, started_s).
        type Row = (&'static [(i32, u64)], &'static [(i32, u64)], &'static str);
        let rows: [Row; 8] = [
            // Highest victim priority: 5 on a, 3 on b.
            (&[(5, 0)], &[(3, 0)], "node-b"),
            (&[(3, 0)], &[(5, 0)], "node-a"),
            // ... before the count: one victim on a, two of lower priority on b.
            (&[(5, 0)], &[(3, 0), (3, 0)], "node-b"),
            // Same highest (3): one victim on a, two on b.
            (&[(3, 0)], &[(3, 0), (3, 0)], "node-a"),
            // ... the count before the sum: 3+1+1 = 5 on a in three, 3+3 = 6 on b in two.
            (&[(3, 0), (1, 0), (1, 0)], &[(3, 0), (3, 0)], "node-b"),
            // Same highest and count: sum 1+3 on a, 3+3 on b.
            (&[(1, 0), (3, 0)], &[(3, 0), (3, 0)], "node-a"),
            // Same priorities: b's victim started later (less run time lost).
            (&[(3, 100)], &[(3, 200)], "node-b"),
            // All equal: the first name.
            (&[(3, 100)], &[(3, 100)], "node-a"),
        ];
        for (i, (a, b, want)) in rows.iter().enumerate() {
            let mut w = World::new(&[("node-a", 1), ("node-b", 1)]);
            for (node, pods) in [("node-a", a), ("node-b", b)] {
                let ids: Vec<String> = (0..pods.len()).map(|j| format!("{node}-{j}")).collect();
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                let shared = held(&format!("c-{node}"), node, &[0], &refs);
                for (id, (prio, start)) in ids.iter().zip(pods.iter()) {
                    w = w.with(node, pod(id, *prio, *start, vec![shared.clone()]));
                }
            }
            let got = w.plan(100, 1);
            assert_eq!(
                got.as_ref().map(|v| v.node.as_str()),
                Some(*want),
                "row {i}"
            );
            let on_winner = if *want == "node-a" { a.len() } else { b.len() };
            assert_eq!(got.map(|v| v.victims.len()), Some(on_winner), "row {i}");
        }
    }

    // ---- reclaim ----

    /// One 4-GPU node: queue b (guaranteed 1) holds 2 GPUs with b1 and b2,
    /// queue c (guaranteed 1) holds its 1 GPU with c1, n1 is in no queue.
    /// Reclaim for a pod of queue a (guaranteed 1, holding nothing) asking
    /// one GPU takes from b only, whatever the priorities (100 against the
    /// preemptor's 0): b1 is reprieved (b2 alone makes room: 2000 − 1000 ≥
    /// 1000), b2 goes. c is at its guarantee, n1 has no queue: never
    /// victims. Asking two would take b to 0 < 1000: no plan.
    #[test]
    fn reclaim_takes_only_from_queues_over_their_guarantee() {
        let world = || {
            World::new(&[("node-a", 4)])
                .with("node-a", queued("b", "b1", 100, "node-a", &[0]))
                .with("node-a", queued("b", "b2", 100, "node-a", &[1]))
                .with("node-a", queued("c", "c1", 100, "node-a", &[2]))
                .with("node-a", holder("n1", 100, "node-a", &[3]))
        };
        let w = world().reclaiming("a", 0, 1000, &[("b", 2000, 1000), ("c", 1000, 1000)]);
        assert_eq!(w.plan(0, 1), victims("node-a", &["b2"]));
        assert_eq!(w.plan(0, 2), None, "b would drop below its guarantee");
        // By priority alone (the same pods, a preemptor of priority 0): none.
        assert_eq!(world().plan(0, 1), None);
        // With c guaranteed nothing (all its 1000 borrowed) and a
        // guaranteed 2, asking two: b1 is reprieved, b2 and c1 go, one from
        // each queue (b: 2000 − 1000 ≥ 1000, c: 1000 − 1000 ≥ 0).
        let w = world().reclaiming("a", 0, 2000, &[("b", 2000, 1000), ("c", 1000, 0)]);
        assert_eq!(w.plan(0, 2), victims("node-a", &["b2", "c1"]));
    }

    /// The preemptor's own queue is never reclaimed from, even were it
    /// listed over its guarantee: its pods are preemption's, by priority.
    #[test]
    fn reclaim_never_takes_from_the_preemptor_s_queue() {
        let w = World::new(&[("node-a", 1)])
            .with("node-a", queued("a", "a1", 0, "node-a", &[0]))
            .reclaiming("a", 0, 1000, &[("a", 2000, 1000)]);
        assert_eq!(w.plan(10, 1), None);
        let w = World::new(&[("node-a", 1)])
            .with("node-a", queued("x", "a1", 0, "node-a", &[0]))
            .reclaiming("a", 0, 1000, &[("x", 2000, 1000)]);
        assert_eq!(w.plan(10, 1), victims("node-a", &["a1"]), "another queue's");
    }

    /// A queue is never taken below its guarantee, counting all its victims
    /// on the node together: b (guaranteed 1) holds 3 GPUs on a 3-GPU node,
    /// each pod alone leaves it above its guarantee. Asking two takes two
    /// (3000 − 2000 = 1000 ≥ 1000); asking three would leave 0: no plan.
    /// With b's guarantee at 2, one may go but not two.
    #[test]
    fn a_queue_is_never_taken_below_its_guarantee() {
        let world = |b_guaranteed: u64, a_guaranteed: u64| {
            World::new(&[("node-a", 3)])
                .with("node-a", queued("b", "b1", 1, "node-a", &[0]))
                .with("node-a", queued("b", "b2", 2, "node-a", &[1]))
                .with("node-a", queued("b", "b3", 3, "node-a", &[2]))
                .reclaiming("a", 0, a_guaranteed, &[("b", 3000, b_guaranteed)])
        };
        assert_eq!(world(1000, 3000).plan(0, 1), victims("node-a", &["b1"]));
        assert_eq!(
            world(1000, 3000).plan(0, 2),
            victims("node-a", &["b2", "b1"])
        );
        assert_eq!(world(1000, 3000).plan(0, 3), None);
        assert_eq!(world(2000, 3000).plan(0, 1), victims("node-a", &["b1"]));
        assert_eq!(world(2000, 3000).plan(0, 2), None);
        // A pod holding more than b's borrowed part alone is no victim:
        // b (guaranteed 1) holds 2 GPUs through one pod.
        let w = World::new(&[("node-a", 2)])
            .with("node-a", queued("b", "big", 1, "node-a", &[0, 1]))
            .reclaiming("a", 0, 1000, &[("b", 2000, 1000)]);
        assert_eq!(w.plan(0, 1), None);
    }

    /// Only a queue within its guarantee reclaims: queue a (guaranteed 1)
    /// holding nothing may take one GPU back from b, which borrows two; once
    /// it holds its guarantee, or asks two (it would borrow), no plan.
    #[test]
    fn no_reclaim_when_the_preemptor_s_queue_would_borrow() {
        let world = |a_held: u64, a_guaranteed: u64| {
            World::new(&[("node-a", 3)])
                .with("node-a", queued("b", "b1", 1, "node-a", &[0]))
                .with("node-a", queued("b", "b2", 1, "node-a", &[1]))
                .with("node-a", queued("b", "b3", 1, "node-a", &[2]))
                .reclaiming("a", a_held, a_guaranteed, &[("b", 3000, 1000)])
        };
        assert!(world(0, 1000).plan(0, 1).is_some());
        assert_eq!(world(1000, 1000).plan(0, 1), None, "a holds its guarantee");
        assert_eq!(world(0, 1000).plan(0, 2), None, "two would borrow one");
        assert_eq!(world(0, 2000).plan(0, 2).map(|v| v.victims.len()), Some(2));
    }
}
