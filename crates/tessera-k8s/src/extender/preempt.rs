//! The `preempt` verb, device-aware: of the victims kube-scheduler proposes on
//! each candidate node, answer with those the core planner
//! ([`tessera_core::queue::preempt::plan`]) chooses, so that what they free
//! actually makes the pod fit (on the same GPU for a share, idle GPUs for whole
//! GPUs, a MIG instance, a connected set), with the fewest victims and the least
//! GPU time lost. A node where no subset of its proposed victims makes room is
//! left out of the answer, so kube-scheduler never evicts for nothing there.
//!
//! Why only kube-scheduler's candidates: it owns PodDisruptionBudgets (it
//! watches them, the mirror does not) and has already applied the priority rule,
//! so answering with a subset never evicts a pod it would not and never adds a
//! budget violation; the node's `NumPDBViolations` is passed back unchanged, an
//! upper bound for the subset. On top of that, a pod annotated
//! `tessera.io/preemptible: "false"` is never chosen (priority and preemptibility
//! are separate), nor one of equal or higher priority than the preemptor.
//! Victims the mirror does not hold free nothing on its GPUs and are not chosen.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use rustc_hash::FxHashMap;
use tessera_core::Scheduler;
use tessera_core::ledger::AllocId;
use tessera_core::queue::preempt::{Context, plan};
use tessera_core::queue::{Budgets, PodMeta, Running};
use tessera_core::request::{GpuAsk, RequestError};

use super::wire::{MetaPod, MetaVictims};
use crate::mirror::Mirror;

/// Annotation that takes a pod out of preemption (`"false"`); any other value,
/// or none, leaves it preemptible.
pub const PREEMPTIBLE_ANNOTATION: &str = "tessera.io/preemptible";

pub(crate) fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

pub(crate) fn preemptible(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PREEMPTIBLE_ANNOTATION))
        .is_none_or(|v| v.trim() != "false")
}

pub(crate) fn started_s(pod: &Pod) -> Option<u64> {
    let t = pod.status.as_ref()?.start_time.as_ref()?;
    u64::try_from(t.0.as_second()).ok()
}

/// The victims to answer with, per candidate node (`now_s`: Unix seconds, to
/// weigh the GPU time each victim has run). Pods without GPUs keep
/// kube-scheduler's answer: there is no device to be wrong about.
pub fn choose(
    mirror: &mut Mirror,
    pod: &Pod,
    candidates: &BTreeMap<String, MetaVictims>,
    now_s: u64,
) -> Result<BTreeMap<String, MetaVictims>, RequestError> {
    let cluster = mirror.shared_cluster();
    let req = crate::convert::pod_request(pod, &cluster.catalog)?;
    if req.gpu == GpuAsk::None {
        return Ok(candidates
            .iter()
            .filter(|(_, v)| !v.pods.is_empty())
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect());
    }
    let ledger = mirror.ledger().clone();
    // The planner places the preemptor with the scheduler's policy as it scores now
    // (its learned target included): which GPUs it takes decides which victims a
    // node's plan keeps.
    let mut scheduler = Scheduler::new(mirror.policy_copy());
    let preemptor = PodMeta {
        priority: priority(pod),
        preemptible: preemptible(pod),
        ..PodMeta::default()
    };
    let budgets = Budgets::new();
    let mut out = BTreeMap::new();
    for (node, proposed) in candidates {
        let Some(id) = cluster.node_id(node) else {
            continue;
        };
        let mut running: FxHashMap<AllocId, Running> = FxHashMap::default();
        let mut uid_of: FxHashMap<AllocId, &str> = FxHashMap::default();
        for v in &proposed.pods {
            let Some(alloc) = mirror
                .held(&v.uid)
                .filter(|h| h.node == *node)
                .and_then(|h| h.id)
            else {
                continue;
            };
            let victim = mirror.pod(&v.uid);
            let meta = PodMeta {
                // kube-scheduler proposed it, so it ranks below the preemptor even
                // when the mirror has not seen the pod object yet.
                priority: victim.map_or(i32::MIN, priority),
                preemptible: victim.is_none_or(preemptible),
                ..PodMeta::default()
            };
            let started_s = victim.and_then(started_s).unwrap_or(now_s);
            running.insert(
                alloc,
                Running {
                    alloc,
                    meta,
                    started_s,
                },
            );
            uid_of.insert(alloc, &v.uid);
        }
        if running.is_empty() {
            continue;
        }
        let ctx = Context {
            cluster: &cluster,
            ledger: &ledger,
            running: &running,
            budgets: &budgets,
            now_s,
            min_runtime_s: 0,
        };
        let Some(p) = plan(&mut scheduler, &ctx, &req, &preemptor, &|_| true) else {
            continue;
        };
        // An empty list is invalid in the protocol: the pod would fit already.
        if p.node != id || p.victims.is_empty() {
            continue;
        }
        out.insert(
            node.clone(),
            MetaVictims {
                pods: p
                    .victims
                    .iter()
                    .filter_map(|a| uid_of.get(a))
                    .map(|uid| MetaPod {
                        uid: (*uid).to_string(),
                    })
                    .collect(),
                num_pdb_violations: proposed.num_pdb_violations,
            },
        );
    }
    Ok(out)
}
