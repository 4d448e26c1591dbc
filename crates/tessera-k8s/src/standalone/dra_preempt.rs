//! Preemption for standalone mode's pods with DRA claims (`--dra`, issue 29).
//!
//! A pod whose claims fit on no node (and only for that reason: a pod over
//! quota, waiting for its claims or refused is not helped by evicting
//! anyone) may make room by evicting others, with the device-plugin path's
//! rules: victims are pods not annotated `tessera.io/preemptible: "false"`,
//! not being deleted, that have run at least the minimum run time, and whose
//! PodDisruptionBudget allows it; preempting, pods of strictly lower
//! priority in the same queue (or, like the pod, in none); reclaiming, pods
//! of other queues (below). Only bound pods holding claims of Tessera's
//! driver on a node the pod may use are candidates: only their devices are
//! in the DRA view. Which of them, and where, is the pure
//! [`crate::dra::preempt::plan`]; the evictions, events, metrics and the wait
//! for the victims to leave are the [`crate::preemptor::Preemptor`]'s, as for
//! any pod. Once the victims are gone and the resourceclaim controller has
//! released their claims, a normal pass places the pod.
//!
//! Only the leader evicts (the pass runs only there), nothing before the
//! initial lists, the DRA objects' included, are in (the pass waits for
//! them), and nothing before the PodDisruptionBudgets are listed.
//!
//! When no plan within its queue is found and the pod's queue is within its
//! guarantee (the quota check of the DRA decision,
//! [`Mirror::quota_with_claims`], with what its claims count where the plan
//! places them), it may reclaim, as on the device-plugin path: candidates are
//! then pods of other queues, whatever their priority, weighed by what their
//! claims count in their queue ([`crate::dra::quota`], a claim against the
//! first pod it is reserved for, as queue usage counts it), and each victim
//! queue keeps its guarantee without all its victims. The plan says
//! `reclaim`, so the events and metrics say so. Only the victim's own queue
//! is checked, not its parents, as in the core's reclaim.
//!
//! Not done: room for the pod's CPU, memory or pod slots: a node those keep
//! it off is no candidate, whoever holds them.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;

use super::claims::{claims_milli, count_claims};
use super::{Standalone, node_allows, selector_matches};
use crate::convert::{self, NodeFacts};
use crate::dra::DRIVER;
use crate::dra::cel::Env;
use crate::dra::inventory::{claim_consumer, grant_holdings};
use crate::dra::place::Plan;
use crate::dra::pod::pod_claims;
use crate::dra::preempt::{Candidate, HeldClaim, Mode, Quota, Quotas, Situation, plan};
use crate::dra::view::{DraView, SharedDraView};
use crate::extender::preempt::{preemptible, priority, started_s};
use crate::mirror::{Mirror, PreemptionPlan, QuotaCheck, Victim};
use tessera_core::queue::victims::{self, Standing};

/// The reason a DRA decision gives when no node takes the pod's claims: the
/// one failure evicting others can cure.
const CLAIMS_DO_NOT_FIT: &str = "claims do not fit";

impl Standalone {
    /// Tries to make room for `pod`, whose DRA decision failed for `reason`;
    /// the sentence for its event when it evicted (or still waits for
    /// earlier victims to leave), `None` when nothing was done.
    pub(super) async fn preempt_dra(
        &mut self,
        view: &SharedDraView,
        pod: &Pod,
        reason: &str,
    ) -> Option<String> {
        if reason != CLAIMS_DO_NOT_FIT || !self.leader.is_leader() || convert::never_preempts(pod) {
            return None;
        }
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let min_runtime_s = self.preemptor.min_runtime.as_secs();
        let plan = {
            let mut m = self.mirror.lock();
            if let Some(waiting) = self
                .preemptor
                .waiting_for_victims(&m, convert::pod_uid(pod))
            {
                return Some(waiting);
            }
            if !m.budgets_listed() {
                return None;
            }
            let mut v = view.lock();
            plan_for(&mut m, &mut v, pod, now_s, min_runtime_s)?
        };
        Some(self.preemptor.carry_out(pod, plan).await)
    }
}

/// Per consumer UID, the allocated claims of our driver reserved for it.
fn claims_by_consumer(v: &mut DraView) -> BTreeMap<String, Vec<HeldClaim>> {
    let mut out: BTreeMap<String, Vec<HeldClaim>> = BTreeMap::new();
    for c in v.claims() {
        let Some(status) = c.status.as_ref() else {
            continue;
        };
        let ours = status
            .allocation
            .as_ref()
            .is_some_and(|a| a.devices.results.iter().any(|r| r.driver == DRIVER));
        if !ours {
            continue;
        }
        let held = HeldClaim {
            uid: claim_consumer(c),
            consumers: status.reserved_for.iter().map(|r| r.uid.clone()).collect(),
        };
        for r in status.reserved_for.iter().filter(|r| r.resource == "pods") {
            out.entry(r.uid.clone()).or_default().push(held.clone());
        }
    }
    out
}

/// Every queue's holdings and guarantee, milli GPU-equivalents (empty
/// without queues).
fn queue_quotas(m: &mut Mirror) -> BTreeMap<String, Quota> {
    let Some(usage) = m.queue_usage(None) else {
        return BTreeMap::new();
    };
    let Some(tree) = m.queue_tree() else {
        return BTreeMap::new();
    };
    tree.ids()
        .map(|q| {
            let spec = tree.spec(q);
            let quota = Quota {
                held_milli: usage.of(q).gpu_eq_milli,
                guaranteed_milli: spec.guaranteed.gpu_eq_milli,
            };
            (spec.name.clone(), quota)
        })
        .collect()
}

/// The plan for `pod`, made under the mirror's lock and then the view's:
/// preemption by priority within its queue first, then reclaim across
/// queues when its queue is within its guarantee.
fn plan_for(
    m: &mut Mirror,
    v: &mut DraView,
    pod: &Pod,
    now_s: u64,
    min_runtime_s: u64,
) -> Option<PreemptionPlan> {
    let catalog = m.cluster().catalog.clone();
    let asks = convert::pod_asks(pod, &catalog);
    let (req, host) = (asks.request.ok()?, asks.host.ok()?);
    let classes = v.classes();
    let claims = pod_claims(pod, |ns, n| v.claim(ns, n), &classes).ok()?;
    // Queue usage from the claims as the view shows them now, the same
    // claims the candidates' weights are read from.
    let mut usage = count_claims(m, v);
    let held = claims_by_consumer(v);
    let inventories = v.inventories().clone();
    // What claims hold, and what device-plugin grants hold of the same GPUs.
    let (cluster, grants) = m.grants();
    usage.add(&grant_holdings(cluster, grants, &inventories));
    let me = convert::pod_uid(pod);
    let my_priority = priority(pod);
    // Its claims only add to the ask: a queue that borrows without them
    // borrows with them. (Asked first: it brings the queue tree up to date,
    // which the queues read below come from.)
    let may_reclaim = matches!(
        m.quota_with_claims(pod, &req, 0),
        QuotaCheck::Admitted {
            borrowing: false,
            ..
        }
    );
    let my_queue = m.preemption_queue(pod);
    // Per node: pods of its queue of lower priority, and pods of other queues.
    let mut own: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
    let mut others: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
    let mut budgets: BTreeMap<String, u32> = BTreeMap::new();
    let mut victims: BTreeMap<String, Victim> = BTreeMap::new();
    for p in m.pods() {
        let uid = convert::pod_uid(p);
        let (Some(node), Some(holds)) = (convert::pod_node(p), held.get(uid)) else {
            continue;
        };
        // Unknown start: taken as just started (spared by the minimum run time).
        let started = started_s(p).unwrap_or(now_s);
        let alive =
            uid != me && !convert::is_terminal(p) && p.metadata.deletion_timestamp.is_none();
        let standing = Standing {
            priority: priority(p),
            started_s: started,
        };
        // Who may go: the core's one rule. Reclaim outranks every borrower
        // whatever the priorities, as the core's `reclaim` does.
        let may_go =
            |over: i32| victims::may_go(standing, preemptible(p), over, now_s, min_runtime_s);
        let queue = m.preemption_queue(p);
        let into = if queue == my_queue {
            may_go(my_priority).then_some(&mut own)
        } else {
            (may_reclaim && may_go(i32::MAX)).then_some(&mut others)
        };
        let (true, Some(into)) = (alive, into) else {
            continue;
        };
        let budget = m.disruption_budget(p).map(|(name, allowed)| {
            budgets.insert(name.clone(), allowed);
            name
        });
        // What its claims count in its queue (a claim against the first pod
        // it is reserved for), as `count_claims` just told the mirror.
        let milli = m.claim_holding(uid);
        into.entry(node.to_string()).or_default().push(Candidate {
            id: uid.to_string(),
            priority: priority(p),
            started_s: started,
            budget,
            claims: holds.clone(),
            queue: queue.clone(),
            milli,
        });
        victims.insert(
            uid.to_string(),
            Victim {
                uid: uid.to_string(),
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                queue,
                gpu_milli_seconds: milli.saturating_mul(now_s.saturating_sub(started)),
            },
        );
    }
    if own.is_empty() && others.is_empty() {
        return None;
    }
    let (nodes, _) = m
        .host_fitting(&req, &host, |facts| node_allows(pod, facts))
        .ok()?;
    let nodes: Vec<NodeFacts> = nodes.into_iter().map(|(_, f, _)| f).collect();
    // A policy of its own, so the mirror stays free for reclaim's quota
    // question during the plan (as the device-plugin path's planner has).
    let policy = m.policy_copy();
    let env = Env::new();
    let situation = |candidates, mode| Situation {
        claims: &claims,
        priority: my_priority,
        mode,
        nodes: &nodes,
        inventories: &inventories,
        usage: &usage,
        policy: policy.as_ref(),
        env: &env,
        selects: &selector_matches,
        candidates,
        budgets: &budgets,
    };
    let mut chosen = plan(&situation(&own, Mode::Priority)).map(|c| (c, false));
    if chosen.is_none() && !others.is_empty() {
        let queues = queue_quotas(m);
        let mirror = RefCell::new(&mut *m);
        let within_guarantee = |placed: &Plan| {
            let mut m = mirror.borrow_mut();
            let ask = claims_milli(
                &catalog,
                m.gpu_equivalents(),
                &inventories,
                &claims,
                placed,
                me,
            );
            matches!(
                m.quota_with_claims(pod, &req, ask),
                QuotaCheck::Admitted {
                    borrowing: false,
                    ..
                }
            )
        };
        let quotas = Quotas {
            queue: &my_queue,
            queues: &queues,
            within_guarantee: &within_guarantee,
        };
        chosen = plan(&situation(&others, Mode::Reclaim(quotas))).map(|c| (c, true));
    }
    let (chosen, reclaim) = chosen?;
    Some(PreemptionPlan {
        node: chosen.node,
        victims: chosen
            .victims
            .iter()
            .filter_map(|uid| victims.get(uid).cloned())
            .collect(),
        reclaim,
    })
}
