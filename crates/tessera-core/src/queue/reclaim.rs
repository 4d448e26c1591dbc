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
            && keeps_guarantee(
                self.usage.of(q).gpu_eq_milli,
                self.tree.spec(q).guaranteed.gpu_eq_milli,
                taken.gpu_eq_milli,
            )
    }
}

/// Reclaim's rule for one queue: a queue holding `held_milli`
/// GPU-equivalents keeps its guarantee of `guaranteed_milli` without
/// `taken_milli` (only what it borrowed may be taken). Every reclaim path —
/// this planner's and the DRA claim planner's — asks this.
pub fn keeps_guarantee(held_milli: u64, guaranteed_milli: u64, taken_milli: u64) -> bool {
    held_milli.saturating_sub(taken_milli) >= guaranteed_milli
}

/// Reclaim's rule for a whole plan: every queue keeps its guarantee without
/// all of the plan's `victims` (queue, milli GPU-equivalents) from it
/// together; `keeps(queue, taken)` is [`keeps_guarantee`] over that queue's
/// quota state.
pub fn all_keep<Q: Ord>(
    victims: impl IntoIterator<Item = (Q, u64)>,
    keeps: impl Fn(&Q, u64) -> bool,
) -> bool {
    let mut taken: std::collections::BTreeMap<Q, u64> = std::collections::BTreeMap::new();
    for (q, milli) in victims {
        let e = taken.entry(q).or_default();
        *e = e.saturating_add(milli);
    }
    taken.iter().all(|(q, milli)| keeps(q, *milli))
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
        let victims = p.victims.iter().filter_map(|v| {
            let (r, g) = (ctx.running.get(v)?, (quotas.held)(*v)?);
            Some((r.meta.queue, g.gpu_eq_milli))
        });
        all_keep(victims, |&q, milli| {
            quotas.keeps(
                q,
                Resources {
                    gpu_eq_milli: milli,
                    ..Resources::ZERO
                },
            )
        })
    })
}
