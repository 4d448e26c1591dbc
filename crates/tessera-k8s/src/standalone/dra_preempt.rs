//! Preemption for standalone mode's pods with DRA claims (`--dra`, issue 29).
//!
//! A pod whose claims fit on no node (and only for that reason: a pod over
//! quota, waiting for its claims or refused is not helped by evicting
//! anyone) may make room by evicting others, with the device-plugin path's
//! rules: victims are pods of strictly lower priority in the same queue (or,
//! like the pod, in none), not annotated `tessera.io/preemptible: "false"`,
//! not being deleted, that have run at least the minimum run time, and whose
//! PodDisruptionBudget allows it. Only bound pods holding claims of Tessera's
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
//! Not done: reclaim of borrowed quota across queues (the device-plugin path
//! does it; here a pod only preempts within its queue), and room for the
//! pod's CPU, memory or pod slots: a node those keep it off is no candidate,
//! whoever holds them.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;

use super::{Standalone, node_allows, selector_matches};
use crate::convert::{self, NodeFacts};
use crate::dra::DRIVER;
use crate::dra::cel::Env;
use crate::dra::inventory::Usage;
use crate::dra::pod::pod_claims;
use crate::dra::preempt::{Candidate, HeldClaim, Situation, plan};
use crate::dra::quota::Devices;
use crate::dra::view::{DraView, SharedDraView};
use crate::extender::preempt::{preemptible, priority, started_s};
use crate::mirror::{Mirror, PreemptionPlan, Victim};

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
        if reason != CLAIMS_DO_NOT_FIT || !self.leader.is_leader() {
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

/// What one allocated claim of our driver holds, and its GPU-equivalents
/// (milli), counted against the first pod it is reserved for (as quotas count it).
struct Held {
    claim: HeldClaim,
    milli: u64,
}

/// Per consumer UID, the allocated claims of our driver reserved for it.
fn claims_by_consumer(m: &mut Mirror, v: &mut DraView) -> BTreeMap<String, Vec<Held>> {
    let catalog = m.cluster().catalog.clone();
    let ge = m.gpu_equivalents();
    let (claims, inventories) = v.claims_and_inventories();
    let devices = Devices::new(inventories);
    let mut out: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    for c in claims {
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
            uid: c.metadata.uid.clone().unwrap_or_default(),
            consumers: status.reserved_for.iter().map(|r| r.uid.clone()).collect(),
            usage: Usage::of_claims([c], None),
        };
        let milli = devices.claim_milli(&catalog, ge, c);
        let pods = status.reserved_for.iter().filter(|r| r.resource == "pods");
        for (i, r) in pods.enumerate() {
            out.entry(r.uid.clone()).or_default().push(Held {
                claim: held.clone(),
                milli: if i == 0 { milli } else { 0 },
            });
        }
    }
    out
}

/// The plan for `pod`, made under the mirror's lock and then the view's.
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
    let held = claims_by_consumer(m, v);
    let inventories = v.inventories().clone();
    let usage = v.usage();
    let me = convert::pod_uid(pod);
    let my_priority = priority(pod);
    let my_queue = m.preemption_queue(pod);
    let mut candidates: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
    let mut budgets: BTreeMap<String, u32> = BTreeMap::new();
    let mut victims: BTreeMap<String, Victim> = BTreeMap::new();
    for p in m.pods() {
        let uid = convert::pod_uid(p);
        let (Some(node), Some(holds)) = (convert::pod_node(p), held.get(uid)) else {
            continue;
        };
        // Unknown start: taken as just started (spared by the minimum run time).
        let started = started_s(p).unwrap_or(now_s);
        let eligible = uid != me
            && !convert::is_terminal(p)
            && p.metadata.deletion_timestamp.is_none()
            && priority(p) < my_priority
            && preemptible(p)
            && now_s.saturating_sub(started) >= min_runtime_s
            && m.preemption_queue(p) == my_queue;
        if !eligible {
            continue;
        }
        let budget = m.disruption_budget(p).map(|(name, allowed)| {
            budgets.insert(name.clone(), allowed);
            name
        });
        candidates
            .entry(node.to_string())
            .or_default()
            .push(Candidate {
                id: uid.to_string(),
                priority: priority(p),
                started_s: started,
                budget,
                claims: holds.iter().map(|h| h.claim.clone()).collect(),
            });
        let milli: u64 = holds.iter().map(|h| h.milli).sum();
        victims.insert(
            uid.to_string(),
            Victim {
                uid: uid.to_string(),
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                queue: my_queue.clone(),
                gpu_milli_seconds: milli.saturating_mul(now_s.saturating_sub(started)),
            },
        );
    }
    if candidates.is_empty() {
        return None;
    }
    let (nodes, policy) = m
        .host_fitting(&req, &host, |facts| node_allows(pod, facts))
        .ok()?;
    let nodes: Vec<NodeFacts> = nodes.into_iter().map(|(_, f)| f).collect();
    let env = Env::new();
    let chosen = plan(&Situation {
        claims: &claims,
        priority: my_priority,
        nodes: &nodes,
        inventories: &inventories,
        usage: &usage,
        policy,
        env: &env,
        selects: &selector_matches,
        candidates: &candidates,
        budgets: &budgets,
    })?;
    Some(PreemptionPlan {
        node: chosen.node,
        victims: chosen
            .victims
            .iter()
            .filter_map(|uid| victims.get(uid).cloned())
            .collect(),
        reclaim: false,
    })
}
