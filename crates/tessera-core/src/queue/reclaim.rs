//! Reclaim: a queue within its guarantee takes back what other queues borrowed.
//!
//! Reclaim is about quota, not priority: the owner's pod outranks every
//! borrower's pod whatever their priorities, and only what is *borrowed* is
//! taken — each victim's queue keeps its guarantee without that victim, and
//! without all of the plan's victims from it together. The victims themselves
//! are chosen by the device-aware planner ([`super::preempt::plan`]), so the
//! simulator and the Kubernetes scheduler reclaim by the same rule.

use super::admit::QueueUsage;
use super::preempt::{Context, Plan, plan};
use super::tree::QueueTree;
use super::{PodMeta, QueueId, Resources, Running};
use crate::Scheduler;
use crate::ledger::AllocId;
use crate::request::Request;
use rustc_hash::FxHashMap;

/// The quota state reclaim reads.
pub struct Quotas<'a> {
    pub tree: &'a QueueTree,
    pub usage: &'a QueueUsage,
    /// What a running allocation counts against its queue (`None`: unknown, never a victim).
    pub held: &'a dyn Fn(AllocId) -> Option<Resources>,
}

impl Quotas<'_> {
    /// Whether queue `q` stays at or above its GPU guarantee without `taken`
    /// (a queue outside the tree — a pod in no queue — has nothing borrowed).
    fn keeps(&self, q: QueueId, taken: Resources) -> bool {
        usize::from(q.0) < self.tree.len()
            && self.usage.of(q).saturating_sub(&taken).gpu_eq_milli
                >= self.tree.spec(q).guaranteed.gpu_eq_milli
    }
}

/// Victims among other queues' borrowed pods that let `owner`'s pod (asking
/// `request`) run; `may_evict` narrows them further (node eligibility, …).
pub fn reclaim(
    scheduler: &mut Scheduler,
    ctx: &Context<'_>,
    request: &Request,
    owner: &PodMeta,
    quotas: &Quotas<'_>,
    may_evict: &dyn Fn(&Running) -> bool,
) -> Option<Plan> {
    let borrowed = |r: &Running| {
        r.meta.queue != owner.queue
            && may_evict(r)
            && (quotas.held)(r.alloc).is_some_and(|g| quotas.keeps(r.meta.queue, g))
    };
    let outranks = PodMeta {
        priority: i32::MAX,
        ..*owner
    };
    plan(scheduler, ctx, request, &outranks, &borrowed).filter(|p| {
        let mut taken: FxHashMap<QueueId, Resources> = FxHashMap::default();
        for v in &p.victims {
            if let (Some(r), Some(g)) = (ctx.running.get(v), (quotas.held)(*v)) {
                *taken.entry(r.meta.queue).or_default() += g;
            }
        }
        taken.iter().all(|(&q, &g)| quotas.keeps(q, g))
    })
}
