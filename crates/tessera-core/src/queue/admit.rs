//! Quota admission: may a queue take this much more now?
//!
//! Checked along the pod's queue and its ancestors. Above any limit: refused.
//! Within every guarantee on the path: admitted as *guaranteed* (never reclaimed).
//! Above a guarantee: *borrowing*, allowed only when every queue on the path may
//! borrow and the capacity is really spare — queues that do not lend keep their
//! unused guarantee free for themselves. Borrowed capacity is given back when its
//! owner returns (reclaim, through [`super::preempt`]).

use std::fmt;

use super::tree::QueueTree;
use super::{QueueId, Resources};

/// Per-queue usage, kept for leaves and summed up the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueUsage {
    used: Vec<Resources>,
}

impl QueueUsage {
    pub fn new(tree: &QueueTree) -> QueueUsage {
        QueueUsage {
            used: vec![Resources::ZERO; tree.len()],
        }
    }
    /// `leaf` (and its ancestors) now hold `r` more.
    pub fn add(&mut self, tree: &QueueTree, leaf: QueueId, r: Resources) {
        for q in tree.path(leaf) {
            self.used[usize::from(q.0)] += r;
        }
    }
    /// `leaf` (and its ancestors) hold `r` less.
    pub fn remove(&mut self, tree: &QueueTree, leaf: QueueId, r: Resources) {
        for q in tree.path(leaf) {
            let u = &mut self.used[usize::from(q.0)];
            *u = u.saturating_sub(&r);
        }
    }
    pub fn of(&self, q: QueueId) -> Resources {
        self.used.get(usize::from(q.0)).copied().unwrap_or_default()
    }
    /// Indexed by [`QueueId`], inner queues included.
    pub fn all(&self) -> &[Resources] {
        &self.used
    }
    /// Whether `q` holds more than its guarantee (its excess is reclaimable).
    pub fn is_borrowing(&self, tree: &QueueTree, q: QueueId) -> bool {
        !self.of(q).fits_within(&tree.spec(q).guaranteed)
    }
}

/// The verdict on one ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Within the guarantee of every queue on the path.
    Guaranteed,
    /// Beyond a guarantee, on capacity others do not use now; reclaimable.
    Borrowing,
    Refused(QuotaReason),
}

/// Why a queue may not take more now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaReason {
    /// The ask would pass the queue's limit.
    AboveLimit { queue: String },
    /// The ask would pass the queue's guarantee and the queue does not borrow.
    NoBorrowing { queue: String },
    /// The ask would pass a guarantee and the spare capacity is held back for
    /// queues that do not lend.
    NothingToBorrow { queue: String },
}

impl fmt::Display for QuotaReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaReason::AboveLimit { queue } => {
                write!(f, "queue {queue} would pass its limit")
            }
            QuotaReason::NoBorrowing { queue } => write!(
                f,
                "queue {queue} would pass its guaranteed quota and does not borrow"
            ),
            QuotaReason::NothingToBorrow { queue } => write!(
                f,
                "queue {queue} would pass its guaranteed quota and no spare quota is lent now"
            ),
        }
    }
}

/// May `leaf` take `ask` more, with the cluster at `capacity`?
pub fn admit(
    tree: &QueueTree,
    usage: &QueueUsage,
    capacity: &Resources,
    leaf: QueueId,
    ask: &Resources,
) -> Admission {
    let mut borrowing = false;
    for q in tree.path(leaf) {
        let s = tree.spec(q);
        let after = usage.of(q) + *ask;
        if s.limit.is_some_and(|l| !after.fits_within(&l)) {
            return Admission::Refused(QuotaReason::AboveLimit {
                queue: s.name.clone(),
            });
        }
        if !after.fits_within(&s.guaranteed) {
            if !s.borrow {
                return Admission::Refused(QuotaReason::NoBorrowing {
                    queue: s.name.clone(),
                });
            }
            borrowing = true;
        }
    }
    if !borrowing {
        return Admission::Guaranteed;
    }
    // Spare = capacity − everyone's use − the unused guarantees of non-lenders
    // (other than the asker's own path), checked among the top-level queues.
    let top_of_leaf = tree.path(leaf).last().unwrap_or(leaf);
    let mut held_back = Resources::ZERO;
    let mut used = Resources::ZERO;
    for &q in tree.top() {
        used += usage.of(q);
        let s = tree.spec(q);
        if !s.lend && q != top_of_leaf {
            held_back += s.guaranteed.saturating_sub(&usage.of(q));
        }
    }
    if !(used + *ask + held_back).fits_within(capacity) {
        return Admission::Refused(QuotaReason::NothingToBorrow {
            queue: tree.spec(leaf).name.clone(),
        });
    }
    Admission::Borrowing
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::tree::QueueSpec;

    fn gpus(g: u64) -> Resources {
        Resources::new(g * 1000, 0, 0)
    }

    #[test]
    fn guaranteed_then_borrowing_then_limited() {
        let mut a = QueueSpec::new("a", gpus(4));
        a.limit = Some(gpus(6));
        let t = QueueTree::new(vec![a, QueueSpec::new("b", gpus(4))]).unwrap();
        let cap = gpus(10);
        let mut u = QueueUsage::new(&t);
        let a = QueueId(0);
        // 0 + 4 ≤ 4: guaranteed.
        assert_eq!(admit(&t, &u, &cap, a, &gpus(4)), Admission::Guaranteed);
        u.add(&t, a, gpus(4));
        // 4 + 2 = 6 > 4 but ≤ limit 6: borrowing.
        assert_eq!(admit(&t, &u, &cap, a, &gpus(2)), Admission::Borrowing);
        // 4 + 3 = 7 > limit 6.
        assert!(matches!(
            admit(&t, &u, &cap, a, &gpus(3)),
            Admission::Refused(QuotaReason::AboveLimit { .. })
        ));
        assert!(!u.is_borrowing(&t, a));
        u.add(&t, a, gpus(1));
        assert!(u.is_borrowing(&t, a));
        u.remove(&t, a, gpus(5));
        assert_eq!(u.of(a), Resources::ZERO);
    }

    #[test]
    fn non_borrowers_and_non_lenders() {
        let mut strict = QueueSpec::new("strict", gpus(2));
        strict.borrow = false;
        let mut keeper = QueueSpec::new("keeper", gpus(6));
        keeper.lend = false;
        let t = QueueTree::new(vec![strict, keeper, QueueSpec::new("c", gpus(2))]).unwrap();
        let cap = gpus(10);
        let u = QueueUsage::new(&t);
        let r = admit(&t, &u, &cap, QueueId(0), &gpus(3));
        assert!(
            matches!(r, Admission::Refused(QuotaReason::NoBorrowing { .. })),
            "{r:?}"
        );
        // c may take 4 (0 used + 4 + keeper's 6 held back ≤ 10) …
        let c = t.id("c").unwrap();
        assert_eq!(admit(&t, &u, &cap, c, &gpus(4)), Admission::Borrowing);
        // … but not 5: 5 + 6 > 10.
        let r = admit(&t, &u, &cap, c, &gpus(5));
        assert!(
            matches!(r, Admission::Refused(QuotaReason::NothingToBorrow { .. })),
            "{r:?}"
        );
        assert!(r_text(&r).contains("no spare quota"));
    }

    fn r_text(a: &Admission) -> String {
        match a {
            Admission::Refused(r) => r.to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn a_parent_guarantee_bounds_its_children() {
        let t = QueueTree::new(vec![
            QueueSpec::new("dept", gpus(4)),
            QueueSpec {
                parent: Some("dept".into()),
                ..QueueSpec::new("team", gpus(4))
            },
        ])
        .unwrap();
        let team = t.id("team").unwrap();
        let mut u = QueueUsage::new(&t);
        u.add(&t, team, gpus(4));
        assert_eq!(u.of(t.id("dept").unwrap()), gpus(4), "summed up the tree");
        assert_eq!(
            admit(&t, &u, &gpus(10), team, &gpus(1)),
            Admission::Borrowing
        );
    }
}
