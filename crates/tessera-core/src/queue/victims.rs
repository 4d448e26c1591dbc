//! Who goes: the one rule by which every preemption path of Tessera chooses
//! its victims and ranks its nodes, whatever it is that frees room (grants in
//! the ledger, allocated ResourceClaims) and whoever asks (the simulator, the
//! standalone scheduler's passes, the extender's `preempt` verb, the DRA
//! path). What differs between those callers is only the fit check, which is
//! passed in; who may go, in which order they are spared, what a disruption
//! budget allows and which node's plan wins are decided here.
//!
//! The rule is kube-scheduler's DefaultPreemption, so that a cluster sees the
//! same choices whether Tessera or kube-scheduler preempts:
//! - **Who may go** ([`may_go`]): a pod of strictly lower priority than the
//!   preemptor, preemptible (a pod annotated `tessera.io/preemptible: "false"`
//!   never goes), that has run at least the minimum run time.
//! - **On one node** ([`select_on_node`], kube-scheduler's
//!   `SelectVictimsOnNode`): every candidate is taken out and the pod is
//!   checked to fit; if it does not, the node is out. The victims are then
//!   reprieved one by one ([`reprieve`]), each spared if the pod still fits
//!   without evicting it: first those whose disruption budget the plan would
//!   overdraw, then the others, each group from the most important down
//!   ([`more_important`]: higher priority, then earlier start). A plan that
//!   still takes more pods of a budget than it allows is dropped
//!   (kube-scheduler only prefers fewer violations; Tessera never violates
//!   one).
//! - **Across nodes** ([`pick_node`] by [`Rank`], kube-scheduler's
//!   `pickOneNodeForPreemption`,
//!   its violation step being always 0 here): the lowest highest victim
//!   priority, then the lowest sum of priorities (each offset by 2^31, as
//!   there), then the fewest victims, then the latest start of the
//!   highest-priority victims (the least run time lost).
//!
//! Pure and generic: candidates are indices into the caller's list, the fit
//! check a closure over a set of them.

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeMap;

/// What ranks a candidate victim: its priority and when it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub priority: i32,
    /// Unix seconds (or any clock the caller uses for all candidates).
    pub started_s: u64,
}

/// Whether a running pod may be a victim of a preemptor of priority
/// `preemptor_priority` at all: strictly lower priority, preemptible, and run
/// for at least `min_runtime_s` by `now_s`. Budgets and the fit are judged
/// later, per plan.
pub fn may_go(
    victim: Standing,
    preemptible: bool,
    preemptor_priority: i32,
    now_s: u64,
    min_runtime_s: u64,
) -> bool {
    victim.priority < preemptor_priority
        && preemptible
        && now_s.saturating_sub(victim.started_s) >= min_runtime_s
}

/// kube-scheduler's `MoreImportantPod`: higher priority first, then the
/// earlier start. `Less` means `a` is the more important.
pub fn more_important(a: Standing, b: Standing) -> Ordering {
    b.priority
        .cmp(&a.priority)
        .then(a.started_s.cmp(&b.started_s))
}

/// How a plan's victims rank against another node's: lower is better.
/// kube-scheduler's `pickOneNodeForPreemption` with its fields in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    /// The highest priority among the victims (`i32::MIN` for none).
    pub highest: i32,
    /// The sum of the victims' priorities, each offset by 2^31 as
    /// kube-scheduler does so that negative priorities add up too (which
    /// also makes more victims of equal priority rank worse).
    pub sum: i64,
    pub count: usize,
    /// The earliest start among the victims of the highest priority,
    /// reversed: later is better (less run time lost).
    pub earliest_start: Reverse<u64>,
}

/// kube-scheduler's offset per victim in [`Rank::sum`]: `MaxInt32 + 1`.
const SUM_OFFSET: i64 = i32::MAX as i64 + 1;

impl Rank {
    pub fn of(victims: impl IntoIterator<Item = Standing> + Clone) -> Rank {
        let highest = victims
            .clone()
            .into_iter()
            .map(|v| v.priority)
            .max()
            .unwrap_or(i32::MIN);
        let mut r = Rank {
            highest,
            sum: 0,
            count: 0,
            earliest_start: Reverse(0),
        };
        let mut earliest: Option<u64> = None;
        for v in victims {
            r.count += 1;
            r.sum = r
                .sum
                .saturating_add(i64::from(v.priority).saturating_add(SUM_OFFSET));
            if v.priority == highest {
                earliest = Some(earliest.map_or(v.started_s, |e| e.min(v.started_s)));
            }
        }
        r.earliest_start = Reverse(earliest.unwrap_or(0));
        r
    }
}

/// kube-scheduler's `pickOneNodeForPreemption` over per-node plans: the plan
/// whose victims rank lowest ([`Rank`]), then the node that sorts first (so
/// equal inputs give equal plans whatever order the nodes come in). `None`
/// when there is no plan. A node where the pod fits without evicting anyone is
/// the caller's to handle before: there is nothing to preempt.
pub fn pick_node<N: Ord, P>(plans: impl IntoIterator<Item = (N, Rank, P)>) -> Option<(N, P)> {
    plans
        .into_iter()
        .min_by(|(na, ra, _), (nb, rb, _)| ra.cmp(rb).then_with(|| na.cmp(nb)))
        .map(|(n, _, p)| (n, p))
}

/// Spares victims one by one in `order`, each left out of the set when
/// `fits` still holds without it, so that every victim kept is one without
/// which the preemptor would not run. `victims` must fit as given; the kept
/// ones come back in their original order.
pub fn reprieve(
    victims: &[usize],
    order: &[usize],
    fits: &mut dyn FnMut(&[usize]) -> bool,
) -> Vec<usize> {
    let mut kept = victims.to_vec();
    for v in order {
        if !kept.contains(v) {
            continue;
        }
        let without: Vec<usize> = kept.iter().copied().filter(|k| k != v).collect();
        if fits(&without) {
            kept = without;
        }
    }
    kept
}

/// A candidate on one node, as [`select_on_node`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnNode<B> {
    pub standing: Standing,
    /// The disruption budget covering it, if any.
    pub budget: Option<B>,
}

/// kube-scheduler's `SelectVictimsOnNode` (see the module docs): the victims
/// among `candidates` (all of which [`may_go`]) that let the pod fit, the most
/// important first, as indices; `Some(empty)` when it fits without evicting
/// anyone, `None` when no allowed set does. `allowed(b)`: the disruptions
/// budget `b` allows now.
pub fn select_on_node<B: Ord + Clone>(
    candidates: &[OnNode<B>],
    allowed: &dyn Fn(&B) -> u32,
    fits: &mut dyn FnMut(&[usize]) -> bool,
) -> Option<Vec<usize>> {
    if fits(&[]) {
        return Some(Vec::new());
    }
    let mut all: Vec<usize> = (0..candidates.len()).collect();
    if all.is_empty() || !fits(&all) {
        return None;
    }
    all.sort_by(|&a, &b| {
        more_important(candidates[a].standing, candidates[b].standing).then(a.cmp(&b))
    });
    // kube-scheduler's `filterPodsWithPDBViolation`: in order of importance,
    // each budget's allowance is used up; the pods past it would violate it.
    let mut left: BTreeMap<B, u32> = BTreeMap::new();
    let (violating, rest): (Vec<usize>, Vec<usize>) =
        all.iter().partition(|&&i| match &candidates[i].budget {
            None => false,
            Some(b) => {
                let n = left.entry(b.clone()).or_insert_with(|| allowed(b));
                if *n > 0 {
                    *n -= 1;
                    false
                } else {
                    true
                }
            }
        });
    let order: Vec<usize> = violating.iter().chain(&rest).copied().collect();
    let victims = reprieve(&all, &order, fits);
    within_budgets(victims.iter().map(|&i| &candidates[i]), allowed).then_some(victims)
}

/// Whether `victims` take no more pods of any budget than it allows.
fn within_budgets<'a, B: Ord + Clone + 'a>(
    victims: impl IntoIterator<Item = &'a OnNode<B>>,
    allowed: &dyn Fn(&B) -> u32,
) -> bool {
    let mut per: BTreeMap<&B, u32> = BTreeMap::new();
    for b in victims.into_iter().filter_map(|v| v.budget.as_ref()) {
        *per.entry(b).or_default() += 1;
    }
    per.iter().all(|(b, n)| *n <= allowed(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(priority: i32, started_s: u64) -> OnNode<u32> {
        OnNode {
            standing: Standing {
                priority,
                started_s,
            },
            budget: None,
        }
    }

    /// Room for `need` units where each candidate frees its `sizes[i]`.
    fn frees(sizes: &[u32], need: u32) -> impl FnMut(&[usize]) -> bool + '_ {
        move |set: &[usize]| set.iter().map(|&i| sizes[i]).sum::<u32>() >= need
    }

    #[test]
    fn the_least_important_victims_are_kept_and_the_rest_spared() {
        // Three pods of one unit each, two needed: the most important (priority
        // 5) is spared; the two priority-1 pods both go, the earlier started
        // (more important) one listed first.
        let c = [at(1, 100), at(5, 50), at(1, 200)];
        let mut fits = frees(&[1, 1, 1], 2);
        let v = select_on_node(&c, &|_| 0, &mut fits).unwrap();
        assert_eq!(v, vec![0, 2]);
    }

    #[test]
    fn a_node_where_even_all_candidates_are_not_enough_is_out() {
        let c = [at(1, 0), at(1, 0)];
        assert_eq!(select_on_node(&c, &|_| 0, &mut frees(&[1, 1], 3)), None);
        assert_eq!(select_on_node::<u32>(&[], &|_| 0, &mut frees(&[], 1)), None);
        // Fits already: nobody goes.
        assert_eq!(
            select_on_node(&c, &|_| 0, &mut frees(&[1, 1], 0)),
            Some(vec![])
        );
    }

    #[test]
    fn budget_violators_are_spared_first_and_an_overdraw_drops_the_plan() {
        // Budget 7 allows one disruption. Pods 0 and 1 are in it, pod 2 is not:
        // of the two in the budget the less important (0) would violate it and
        // is spared first, so the plan takes 2 and 1 (the most important first).
        let mut c = [at(1, 10), at(2, 10), at(3, 10)];
        c[0].budget = Some(7);
        c[1].budget = Some(7);
        let v = select_on_node(&c, &|_| 1, &mut frees(&[1, 1, 1], 2)).unwrap();
        assert_eq!(v, vec![2, 1]);
        // Without the budget the least important two go.
        let free = [at(1, 10), at(2, 10), at(3, 10)];
        assert_eq!(
            select_on_node(&free, &|_| 1, &mut frees(&[1, 1, 1], 2)).unwrap(),
            vec![1, 0]
        );
        // Both budget pods needed: it would overdraw, so no plan.
        assert_eq!(select_on_node(&c, &|_| 1, &mut frees(&[5, 5, 0], 10)), None);
        // With two allowed it goes through.
        assert!(select_on_node(&c, &|_| 2, &mut frees(&[5, 5, 0], 10)).is_some());
    }

    #[test]
    fn nodes_rank_by_highest_priority_then_sum_then_count_then_latest_start() {
        let s = |priority, started_s| Standing {
            priority,
            started_s,
        };
        // Two low victims beat one higher one (lowest highest priority first).
        assert!(Rank::of([s(1, 0), s(1, 0)]) < Rank::of([s(2, 0)]));
        // Same highest: the offset sum makes one victim beat two.
        assert!(Rank::of([s(2, 0)]) < Rank::of([s(2, 0), s(1, 0)]));
        // Negative priorities add up as positive ones do.
        assert!(Rank::of([s(-5, 0)]) < Rank::of([s(-5, 0), s(-9, 0)]));
        // Same highest and count: lower sum wins.
        assert!(Rank::of([s(2, 0), s(0, 0)]) < Rank::of([s(2, 0), s(1, 0)]));
        // All equal but start: the later start (less run time lost) wins; only
        // the highest-priority victims' starts count.
        assert!(Rank::of([s(2, 500)]) < Rank::of([s(2, 100)]));
        assert!(Rank::of([s(2, 500), s(1, 1)]) < Rank::of([s(2, 100), s(1, 900)]));
    }

    #[test]
    fn the_node_whose_victims_rank_lowest_wins_then_the_first_name() {
        let s = |priority| Standing {
            priority,
            started_s: 0,
        };
        let plans = |order: &[(&'static str, i32)]| {
            order
                .iter()
                .map(|&(n, p)| (n, Rank::of([s(p)]), n.len()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pick_node(plans(&[("b", 3), ("a", 5), ("c", 1)])),
            Some(("c", 1))
        );
        // A tie goes to the name that sorts first, whatever the order given.
        assert_eq!(pick_node(plans(&[("b", 1), ("a", 1)])).unwrap().0, "a");
        assert_eq!(pick_node(plans(&[("a", 1), ("b", 1)])).unwrap().0, "a");
        assert_eq!(pick_node(plans(&[])), None);
    }

    #[test]
    fn who_may_go() {
        let s = Standing {
            priority: 1,
            started_s: 100,
        };
        assert!(may_go(s, true, 2, 200, 60));
        assert!(!may_go(s, true, 1, 200, 60), "equal priority never goes");
        assert!(!may_go(s, false, 2, 200, 60), "not preemptible");
        assert!(!may_go(s, true, 2, 150, 60), "ran less than the minimum");
    }
}
