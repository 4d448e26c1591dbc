//! Many teams, one fleet: queues with quotas, fair share, priorities,
//! device-aware preemption, gangs and defragmentation.
//!
//! Everything here is pure, like the rest of the core: the caller passes the
//! cluster, the ledger, what it knows about each pod ([`PodMeta`]) and `now`;
//! the functions return decisions as data (an admission verdict, a preemption
//! plan, a gang placement, a defragmentation plan). The Kubernetes adapter and
//! the simulator apply them.
//!
//! - [`equiv`]: quota is counted in *GPU-equivalents* (a factor per GPU model; a
//!   share, MPS slice or MIG instance counts by the larger of its memory and
//!   compute fractions), beside CPU and memory: [`Resources`].
//! - [`tree`]: the queue tree (guaranteed quota, limit, weight, lend/borrow), validated.
//! - [`fair`]: dominant-resource fair shares over the tree, water-filled, with
//!   optional time-decayed usage.
//! - [`admit`]: may this queue take this much more now (within its guarantee,
//!   by borrowing, or not at all), as a typed verdict.
//! - [`victims`]: the one rule for who goes and which node's plan wins
//!   (kube-scheduler's order), for every preemption path, whatever holds the room.
//! - [`preempt`]: victims chosen per GPU so that what they free makes the pod fit.
//! - [`reclaim`]: a queue within its guarantee takes back what others borrowed.
//! - [`gang`]: all-or-nothing placement of a group on the ledger's checkpoints.
//! - [`defrag`]: moves that free whole GPUs or nodes for pods that do not fit.

pub mod admit;
pub mod defrag;
pub mod equiv;
pub mod fair;
pub mod gang;
pub mod preempt;
pub mod reclaim;
pub mod tree;
pub mod victims;

use std::ops::{Add, AddAssign, Sub};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::ledger::AllocId;

pub use equiv::GpuEquivalents;
pub use tree::{QueueSpec, QueueTree, TreeError};

/// Index of a queue in its [`QueueTree`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QueueId(pub u16);

/// A disruption budget (a PodDisruptionBudget) pods may count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BudgetId(pub u32);

/// A gang (a `PodGroup`): pods placed all together or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GangId(pub u32);

/// What the scheduler knows about a pod beyond its resource request: whom it
/// belongs to and how it may be disturbed. Priority and preemptibility are
/// separate: a pod may be high priority and non-preemptible, or low priority
/// and preemptible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMeta {
    pub queue: QueueId,
    /// From the pod's PriorityClass (higher wins).
    pub priority: i32,
    /// Whether the scheduler may evict it to make room for others.
    pub preemptible: bool,
    /// The disruption budget it counts against, if any.
    pub budget: Option<BudgetId>,
    pub gang: Option<GangId>,
    /// Never moved by defragmentation ("do not disturb").
    pub pinned: bool,
}

impl Default for PodMeta {
    fn default() -> Self {
        PodMeta {
            queue: QueueId(0),
            priority: 0,
            preemptible: true,
            budget: None,
            gang: None,
            pinned: false,
        }
    }
}

/// A running pod as preemption, reclaim and defragmentation see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub alloc: AllocId,
    pub meta: PodMeta,
    /// When it started running (the caller's clock, seconds).
    pub started_s: u64,
}

/// Disruptions each budget still allows (a PodDisruptionBudget's
/// `status.disruptionsAllowed`). A budget not listed allows none: a pod whose
/// budget is unknown is never disrupted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budgets {
    allowed: FxHashMap<BudgetId, u32>,
}

impl Budgets {
    pub fn new() -> Budgets {
        Budgets::default()
    }
    pub fn set(&mut self, budget: BudgetId, disruptions_allowed: u32) {
        self.allowed.insert(budget, disruptions_allowed);
    }
    /// Disruptions still allowed for `budget`.
    pub fn allowed(&self, budget: BudgetId) -> u32 {
        self.allowed.get(&budget).copied().unwrap_or(0)
    }
    /// Whether a pod with this budget may be disrupted once more; `None` (no budget) always may.
    pub fn may_disrupt(&self, budget: Option<BudgetId>) -> bool {
        budget.is_none_or(|b| self.allowed(b) > 0)
    }
    /// Spend one disruption of `budget`; false (and nothing spent) when none is left.
    pub fn spend(&mut self, budget: Option<BudgetId>) -> bool {
        let Some(b) = budget else { return true };
        match self.allowed.get_mut(&b) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

/// An amount of the three quota resources: GPU-equivalents (milli), CPU
/// (milli-cores) and memory (MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// GPU-equivalents in milli (1000 = one GPU of factor 1.0).
    pub gpu_eq_milli: u64,
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

impl Resources {
    pub const ZERO: Resources = Resources {
        gpu_eq_milli: 0,
        cpu_milli: 0,
        memory_mib: 0,
    };

    pub fn new(gpu_eq_milli: u64, cpu_milli: u64, memory_mib: u64) -> Resources {
        Resources {
            gpu_eq_milli,
            cpu_milli,
            memory_mib,
        }
    }

    /// Every component at most `other`'s.
    pub fn fits_within(&self, other: &Resources) -> bool {
        self.gpu_eq_milli <= other.gpu_eq_milli
            && self.cpu_milli <= other.cpu_milli
            && self.memory_mib <= other.memory_mib
    }

    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        Resources {
            gpu_eq_milli: self.gpu_eq_milli.saturating_sub(other.gpu_eq_milli),
            cpu_milli: self.cpu_milli.saturating_sub(other.cpu_milli),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
        }
    }

    pub fn min(&self, other: &Resources) -> Resources {
        Resources {
            gpu_eq_milli: self.gpu_eq_milli.min(other.gpu_eq_milli),
            cpu_milli: self.cpu_milli.min(other.cpu_milli),
            memory_mib: self.memory_mib.min(other.memory_mib),
        }
    }

    pub fn max(&self, other: &Resources) -> Resources {
        Resources {
            gpu_eq_milli: self.gpu_eq_milli.max(other.gpu_eq_milli),
            cpu_milli: self.cpu_milli.max(other.cpu_milli),
            memory_mib: self.memory_mib.max(other.memory_mib),
        }
    }

    /// The largest of the three components as a fraction of `total`'s (DRF's
    /// dominant share). A component whose total is zero is left out.
    pub fn dominant_share(&self, total: &Resources) -> f64 {
        let frac = |a: u64, t: u64| if t == 0 { 0.0 } else { a as f64 / t as f64 };
        frac(self.gpu_eq_milli, total.gpu_eq_milli)
            .max(frac(self.cpu_milli, total.cpu_milli))
            .max(frac(self.memory_mib, total.memory_mib))
    }

    pub fn is_zero(&self) -> bool {
        *self == Resources::ZERO
    }
}

impl Add for Resources {
    type Output = Resources;
    fn add(self, o: Resources) -> Resources {
        Resources {
            gpu_eq_milli: self.gpu_eq_milli.saturating_add(o.gpu_eq_milli),
            cpu_milli: self.cpu_milli.saturating_add(o.cpu_milli),
            memory_mib: self.memory_mib.saturating_add(o.memory_mib),
        }
    }
}

impl AddAssign for Resources {
    fn add_assign(&mut self, o: Resources) {
        *self = *self + o;
    }
}

impl Sub for Resources {
    type Output = Resources;
    /// Saturating: usage never goes below zero.
    fn sub(self, o: Resources) -> Resources {
        self.saturating_sub(&o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dominant_share_is_the_largest_fraction() {
        let total = Resources::new(10_000, 100_000, 1_000_000);
        // GPU 2/10 = 0.2, CPU 30/100 = 0.3, memory 0.1 → CPU dominates.
        let r = Resources::new(2_000, 30_000, 100_000);
        assert!((r.dominant_share(&total) - 0.3).abs() < 1e-12);
        // A zero total leaves the component out instead of dividing by zero.
        let no_cpu = Resources::new(10_000, 0, 1_000_000);
        assert!((r.dominant_share(&no_cpu) - 0.2).abs() < 1e-12);
    }

    #[test]
    fn budgets_never_go_below_zero_and_unknown_budgets_allow_nothing() {
        let mut b = Budgets::new();
        b.set(BudgetId(1), 1);
        assert!(b.may_disrupt(None));
        assert!(!b.may_disrupt(Some(BudgetId(2))), "unknown budget");
        assert!(b.spend(Some(BudgetId(1))));
        assert!(!b.spend(Some(BudgetId(1))), "spent");
        assert!(!b.may_disrupt(Some(BudgetId(1))));
    }
}
