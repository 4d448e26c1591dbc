//! Preemption and reclaim decided by Tessera itself (standalone mode), on the
//! core's device-aware planner ([`tessera_core::queue::preempt::plan`]).
//!
//! Two kinds, as KAI-Scheduler and Kueue separate them:
//! - **Preemption** by priority, *within* a queue (or among pods in no queue):
//!   victims have strictly lower priority than the pod.
//! - **Reclaim**, *across* queues, for a pod whose queue is within its guarantee:
//!   victims are pods of queues holding more than their guarantee, and only what
//!   is borrowed is taken (each victim's queue stays at or above its guarantee
//!   without all its victims), whatever the priorities.
//!
//! Never a pod annotated `tessera.io/preemptible: "false"`, one that has run less
//! than the minimum run time, one being deleted already, or one whose
//! PodDisruptionBudget (watched here, its `status.disruptionsAllowed`) would be
//! overdrawn by the plan. Until the PodDisruptionBudgets are listed nothing is
//! planned. The eviction API enforces the budgets again when the victims are
//! evicted (429), so a budget that changed since cannot be violated.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};
use rustc_hash::FxHashMap;
use tessera_core::Scheduler;
use tessera_core::ledger::AllocId;
use tessera_core::queue::preempt::{Context, plan};
use tessera_core::queue::reclaim::{Quotas, reclaim};
use tessera_core::queue::victims::{self, Standing};
use tessera_core::queue::{BudgetId, Budgets, PodMeta, QueueId, Resources, Running};
use tessera_core::request::Request;

use super::{Mirror, QuotaCheck};
use crate::convert::{self, NodeFacts};
use crate::extender::preempt::{preemptible, priority, started_s};

/// The queue id that stands for "in no queue" in the planner's metadata.
const NO_QUEUE: QueueId = QueueId(u16::MAX);

/// One PodDisruptionBudget: its namespace, selector (`None` when it does not
/// read: it then covers every pod of its namespace, the safe reading) and the
/// disruptions it allows now.
#[derive(Debug, Clone)]
struct Pdb {
    namespace: String,
    selector: Option<Selector>,
    allowed: u32,
}

/// The budgets the mirror watches.
#[derive(Debug, Default)]
pub(super) struct Disruption {
    pdbs: BTreeMap<String, Pdb>,
    synced: bool,
}

/// A pod to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Its queue's name (empty when in none).
    pub queue: String,
    /// GPU time it has run (lost when it starts over): GPU-equivalent milli × seconds.
    pub gpu_milli_seconds: u64,
}

/// What to evict for a pod, and where it then goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreemptionPlan {
    pub node: String,
    pub victims: Vec<Victim>,
    /// Reclaim of borrowed quota (across queues) rather than preemption by priority.
    pub reclaim: bool,
}

fn pdb_entry(p: &PodDisruptionBudget) -> Option<(String, Pdb)> {
    let name = p.metadata.name.clone()?;
    let namespace = p
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let selector = p
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .and_then(|s| Selector::try_from(s).ok());
    let allowed = p
        .status
        .as_ref()
        .map_or(0, |s| u32::try_from(s.disruptions_allowed).unwrap_or(0));
    Some((
        format!("{namespace}/{name}"),
        Pdb {
            namespace,
            selector,
            allowed,
        },
    ))
}

impl Mirror {
    pub fn replace_pdbs(&mut self, items: impl IntoIterator<Item = PodDisruptionBudget>) {
        self.disruption.pdbs = items.into_iter().filter_map(|p| pdb_entry(&p)).collect();
        self.disruption.synced = true;
    }

    pub fn upsert_pdb(&mut self, p: PodDisruptionBudget) {
        if let Some((k, v)) = pdb_entry(&p) {
            self.disruption.pdbs.insert(k, v);
        }
    }

    pub fn remove_pdb(&mut self, p: &PodDisruptionBudget) {
        if let Some((k, _)) = pdb_entry(p) {
            self.disruption.pdbs.remove(&k);
        }
    }

    /// The budget covering `pod` (the first of its namespace whose selector
    /// matches): its index, `namespace/name` and entry.
    fn covering(&self, pod: &Pod) -> Option<(usize, &String, &Pdb)> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        self.disruption
            .pdbs
            .iter()
            .enumerate()
            .find(|(_, (_, b))| {
                b.namespace == ns && b.selector.as_ref().is_none_or(|s| s.matches(labels))
            })
            .map(|(i, (k, b))| (i, k, b))
    }

    /// The budget covering `pod` and the disruptions it allows.
    fn budget_of(&self, pod: &Pod) -> Option<(BudgetId, u32)> {
        self.covering(pod)
            .map(|(i, _, b)| (BudgetId(i as u32), b.allowed))
    }

    /// Whether the PodDisruptionBudgets are listed: nothing is planned before.
    pub fn budgets_listed(&self) -> bool {
        self.disruption.synced
    }

    /// `pod`'s queue as the preemption rules read it: its name, empty when
    /// it is in none (or its queue does not resolve: it then counts as in
    /// none, as in [`Mirror::preemption`]). For planners outside the ledger
    /// ([`crate::dra::preempt`]: devices held through DRA claims).
    pub fn preemption_queue(&self, pod: &Pod) -> String {
        match (&self.queues.tree, self.queues.queue_of(pod)) {
            (Some(t), Ok(Some(q))) => t.spec(q).name.clone(),
            _ => String::new(),
        }
    }

    /// The PodDisruptionBudget covering `pod` (`namespace/name`) and the
    /// disruptions it allows now, for the same planners.
    pub fn disruption_budget(&self, pod: &Pod) -> Option<(String, u32)> {
        self.covering(pod).map(|(_, k, b)| (k.clone(), b.allowed))
    }

    /// Victims whose eviction lets `pod` (asking `req`) run, if Tessera may
    /// evict any: preemption by priority within its queue first, then reclaim
    /// of borrowed quota when its queue is within its guarantee. `now_s`: Unix
    /// seconds; pods younger than `min_runtime_s` are spared. Only pods on nodes
    /// `eligible` accepts for `pod` (selectors, affinity, taints) are victims:
    /// room made where the pod may not go would be evicted for nothing.
    pub fn preemption(
        &mut self,
        pod: &Pod,
        req: &Request,
        now_s: u64,
        min_runtime_s: u64,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
    ) -> Option<PreemptionPlan> {
        self.refresh();
        if !self.disruption.synced {
            return None;
        }
        // Room made on a node whose agent is gone would be evicted for nothing:
        // the pod could not go there.
        let allowed_nodes: Vec<bool> = self
            .facts
            .iter()
            .map(|f| eligible(f).is_ok() && self.stale_block(&f.name).is_none())
            .collect();
        let own_queue = self.queues.queue_of(pod).ok().flatten();
        let reclaim_ok = own_queue.is_some()
            && matches!(
                self.quota(pod, req),
                QuotaCheck::Admitted {
                    borrowing: false,
                    ..
                }
            );
        let usage = self.queue_usage(None);
        let mut running: FxHashMap<AllocId, Running> = FxHashMap::default();
        let mut who: FxHashMap<AllocId, (Victim, Resources)> = FxHashMap::default();
        let mut budgets = Budgets::new();
        for (uid, h) in &self.held {
            let (Some(id), true, Some(p)) = (h.id, h.bound, self.pods.get(uid)) else {
                continue;
            };
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let budget = self.budget_of(p).map(|(b, allowed)| {
                budgets.set(b, allowed);
                b
            });
            let queue = self.queues.queue_of(p).ok().flatten().unwrap_or(NO_QUEUE);
            let started = started_s(p).unwrap_or(now_s);
            let queue_name = match (&self.queues.tree, queue) {
                (Some(t), q) if q != NO_QUEUE => t.spec(q).name.clone(),
                _ => String::new(),
            };
            running.insert(
                id,
                Running {
                    alloc: id,
                    meta: PodMeta {
                        queue,
                        priority: priority(p),
                        preemptible: preemptible(p),
                        budget,
                        gang: None,
                        pinned: false,
                    },
                    // Unknown start: treat as just started (spared by the minimum run time).
                    started_s: started,
                },
            );
            let held = self
                .ledger
                .allocation(id)
                .map(|a| self.queues.ge.placement(&self.cluster, a))
                .unwrap_or_default();
            who.insert(
                id,
                (
                    Victim {
                        uid: uid.clone(),
                        namespace: p.metadata.namespace.clone().unwrap_or_default(),
                        name: p.metadata.name.clone().unwrap_or_default(),
                        queue: queue_name,
                        gpu_milli_seconds: held.gpu_eq_milli * now_s.saturating_sub(started),
                    },
                    held,
                ),
            );
        }
        let mine = own_queue.unwrap_or(NO_QUEUE);
        let preemptor = PodMeta {
            queue: mine,
            priority: priority(pod),
            preemptible: preemptible(pod),
            ..PodMeta::default()
        };
        // Nobody the planner could choose: skip it (it copies the ledger, and a
        // standalone pass asks for every pod that fits nowhere).
        let any_lower = running.values().any(|r| {
            let standing = Standing {
                priority: r.meta.priority,
                started_s: r.started_s,
            };
            r.meta.queue == mine
                && victims::may_go(
                    standing,
                    r.meta.preemptible,
                    preemptor.priority,
                    now_s,
                    min_runtime_s,
                )
        });
        if !any_lower && !reclaim_ok {
            return None;
        }
        let mut scheduler = Scheduler::new(self.policy_copy());
        let ctx = Context {
            cluster: &self.cluster,
            ledger: &self.ledger,
            running: &running,
            budgets: &budgets,
            now_s,
            min_runtime_s,
        };
        let ledger = &self.ledger;
        let on_allowed_node = |r: &Running| {
            ledger.allocation(r.alloc).is_some_and(|a| {
                allowed_nodes
                    .get(a.node.0 as usize)
                    .copied()
                    .unwrap_or(false)
            })
        };
        let same_queue = |r: &Running| r.meta.queue == mine && on_allowed_node(r);
        let mut found =
            plan(&mut scheduler, &ctx, req, &preemptor, &same_queue).map(|p| (p, false));
        if found.is_none()
            && reclaim_ok
            && let (Some(tree), Some(usage)) = (self.queues.tree.as_ref(), usage.as_ref())
        {
            let held = |a: AllocId| who.get(&a).map(|(_, g)| *g);
            let quotas = Quotas {
                tree,
                usage,
                held: &held,
            };
            found = reclaim(
                &mut scheduler,
                &ctx,
                req,
                &preemptor,
                &quotas,
                &on_allowed_node,
            )
            .map(|p| (p, true));
        }
        let (p, reclaimed) = found?;
        if p.victims.is_empty() {
            // It fits without evicting anyone: the normal path places it.
            return None;
        }
        Some(PreemptionPlan {
            node: self.cluster.node(p.node).name.clone(),
            victims: p
                .victims
                .iter()
                .filter_map(|v| who.get(v).map(|(w, _)| w.clone()))
                .collect(),
            reclaim: reclaimed,
        })
    }
}

/// Pods the mirror knows by key, for messages.
pub fn victims_text(victims: &[Victim]) -> String {
    victims
        .iter()
        .map(|v| format!("{}/{}", v.namespace, v.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `pod` is one Tessera may place by evicting others: it asks for GPUs,
/// is not gated and its `preemptionPolicy` is not `Never`.
pub fn may_preempt_for(pod: &Pod, req: &Request) -> bool {
    req.gpu != tessera_core::request::GpuAsk::None
        && !convert::is_gated(pod)
        && !convert::never_preempts(pod)
}
