//! Fair shares: what each queue deserves now, given everyone's demand.
//!
//! Shares are divided level by level down the tree. Among siblings:
//!
//! 1. each queue first gets its guarantee, or its demand if that is less;
//! 2. a queue that does not lend keeps its unused guarantee out of the pool;
//! 3. what is left is divided by weighted *dominant resource fairness*
//!    (progressive filling): every queue that still wants more and may borrow
//!    grows along the direction of its remaining demand, its dominant share
//!    rising at the rate of its weight, until a resource runs out (queues that
//!    need it stop) or the queue is satisfied; the others go on;
//! 4. nobody passes its limit.
//!
//! A queue's share then becomes what its children divide. Demand is what a queue
//! holds plus what it has pending, so a queue with nothing to run deserves
//! nothing beyond it, and its guarantee is lent to the others.
//!
//! The scheduler serves the queue furthest below its share first ([`order_key`]);
//! usage history ([`UsageHistory`]) can make a team that used much recently yield.

use super::tree::QueueTree;
use super::{QueueId, Resources};

/// What each queue deserves, indexed by [`QueueId`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairShares {
    pub deserved: Vec<Resources>,
}

/// Divides `capacity` among the queues. `demand` is indexed by [`QueueId`]; only
/// leaves' entries are read (a parent's demand is its children's sum).
pub fn fair_shares(tree: &QueueTree, capacity: Resources, demand: &[Resources]) -> FairShares {
    let n = tree.len();
    // Aggregate demand bottom-up (children come after parents in id order).
    let mut agg = vec![Resources::ZERO; n];
    for q in (0..n).rev() {
        let id = QueueId(q as u16);
        if tree.is_leaf(id) {
            agg[q] = demand.get(q).copied().unwrap_or_default();
        }
        if let Some(p) = tree.parent(id) {
            let d = agg[q];
            agg[usize::from(p.0)] += d;
        }
    }
    let mut deserved = vec![Resources::ZERO; n];
    divide(tree, tree.top(), capacity, capacity, &agg, &mut deserved);
    let mut queue: Vec<QueueId> = tree.top().to_vec();
    while let Some(q) = queue.pop() {
        let kids = tree.children(q);
        if !kids.is_empty() {
            let available = deserved[usize::from(q.0)];
            divide(tree, kids, available, capacity, &agg, &mut deserved);
            queue.extend_from_slice(kids);
        }
    }
    FairShares { deserved }
}

const DIMS: usize = 3;

fn dims(r: &Resources) -> [u64; DIMS] {
    [r.gpu_eq_milli, r.cpu_milli, r.memory_mib]
}

fn from_dims(d: [u64; DIMS]) -> Resources {
    Resources::new(d[0], d[1], d[2])
}

/// Divides `available` among `kids` (siblings); `total` is the cluster's capacity
/// (dominant shares are measured against it).
fn divide(
    tree: &QueueTree,
    kids: &[QueueId],
    available: Resources,
    total: Resources,
    demand: &[Resources],
    out: &mut [Resources],
) {
    let k = kids.len();
    let avail = dims(&available);
    let mut cap = vec![[0u64; DIMS]; k];
    let mut base = vec![[0u64; DIMS]; k];
    let mut reserved = [0u64; DIMS];
    for (i, q) in kids.iter().enumerate() {
        let s = tree.spec(*q);
        let mut c = demand[usize::from(q.0)];
        if let Some(l) = s.limit {
            c = c.min(&l);
        }
        if !s.borrow {
            c = c.min(&s.guaranteed);
        }
        cap[i] = dims(&c);
        base[i] = dims(&c.min(&s.guaranteed));
        if !s.lend {
            let unused = s.guaranteed.saturating_sub(&c.min(&s.guaranteed));
            for (r, u) in reserved.iter_mut().zip(dims(&unused)) {
                *r += u;
            }
        }
    }
    // Guarantees above what there is (a shrunken cluster): scale them down alike.
    for r in 0..DIMS {
        let sum: u64 = base.iter().map(|b| b[r]).sum();
        if sum > avail[r] {
            for b in base.iter_mut() {
                b[r] = (u128::from(b[r]) * u128::from(avail[r]) / u128::from(sum)) as u64;
            }
        }
    }
    let mut pool = [0u64; DIMS];
    for r in 0..DIMS {
        let used: u64 = base.iter().map(|b| b[r]).sum::<u64>() + reserved[r];
        pool[r] = avail[r].saturating_sub(used);
    }
    let want: Vec<[u64; DIMS]> = (0..k)
        .map(|i| std::array::from_fn(|r| cap[i][r].saturating_sub(base[i][r])))
        .collect();
    let weight: Vec<f64> = kids
        .iter()
        .map(|q| f64::from(tree.spec(*q).weight))
        .collect();
    let extra = progressive_fill(&want, &weight, pool, dims(&total));
    for (i, q) in kids.iter().enumerate() {
        out[usize::from(q.0)] = from_dims(std::array::from_fn(|r| base[i][r] + extra[i][r]));
    }
}

/// Weighted DRF by progressive filling: returns each claimant's extra allocation.
fn progressive_fill(
    want: &[[u64; DIMS]],
    weight: &[f64],
    pool: [u64; DIMS],
    total: [u64; DIMS],
) -> Vec<[u64; DIMS]> {
    let k = want.len();
    let mut got = vec![[0f64; DIMS]; k];
    let mut left: [f64; DIMS] = pool.map(|p| p as f64);
    // Dominant share of a claimant's whole remaining want (its direction of growth).
    let dom = |w: &[u64; DIMS]| {
        (0..DIMS)
            .filter(|&r| total[r] > 0)
            .map(|r| w[r] as f64 / total[r] as f64)
            .fold(0.0, f64::max)
    };
    let mut active: Vec<bool> = (0..k).map(|i| dom(&want[i]) > 0.0).collect();
    for _round in 0..=k {
        let live: Vec<usize> = (0..k).filter(|&i| active[i]).collect();
        if live.is_empty() {
            break;
        }
        // Claimant i at level λ takes min(1, λ·wᵢ/domᵢ) of what it still wants.
        let rem: Vec<[f64; DIMS]> = live
            .iter()
            .map(|&i| std::array::from_fn(|r| want[i][r] as f64 - got[i][r]))
            .collect();
        let doms: Vec<f64> = live.iter().map(|&i| dom(&want[i])).collect();
        let take = |lambda: f64, j: usize| (lambda * weight[live[j]] / doms[j]).min(1.0);
        let fits = |lambda: f64| {
            (0..DIMS).all(|r| {
                let s: f64 = (0..live.len()).map(|j| take(lambda, j) * rem[j][r]).sum();
                s <= left[r] * (1.0 + 1e-12) + 1e-9
            })
        };
        // The level at which every live claimant is satisfied.
        let full = (0..live.len())
            .map(|j| doms[j] / weight[live[j]])
            .fold(0.0, f64::max);
        let lambda = if fits(full) {
            full
        } else {
            let (mut lo, mut hi) = (0.0, full);
            for _ in 0..100 {
                let mid = 0.5 * (lo + hi);
                if fits(mid) { lo = mid } else { hi = mid }
            }
            lo
        };
        for (j, &i) in live.iter().enumerate() {
            let f = take(lambda, j);
            for r in 0..DIMS {
                let g = f * rem[j][r];
                got[i][r] += g;
                left[r] -= g;
            }
        }
        // Stop the satisfied, and those that need a resource that ran out.
        let exhausted: Vec<bool> = (0..DIMS)
            .map(|r| left[r] <= 1e-6 * (pool[r] as f64).max(1.0))
            .collect();
        let mut changed = false;
        for (j, &i) in live.iter().enumerate() {
            let satisfied = take(lambda, j) >= 1.0 - 1e-12;
            let blocked = (0..DIMS).any(|r| exhausted[r] && rem[j][r] > 0.5);
            if satisfied || blocked {
                active[i] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    got.iter()
        .zip(want)
        .map(|(g, w)| std::array::from_fn(|r| (g[r].floor() as u64).min(w[r])))
        .collect()
}

/// How far a queue is into its share: the largest of usage / deserved over the
/// three resources (∞ when it holds something it deserves none of).
pub fn share_ratio(usage: &Resources, deserved: &Resources) -> f64 {
    let f = |u: u64, d: u64| match (u, d) {
        (0, _) => 0.0,
        (_, 0) => f64::INFINITY,
        (u, d) => u as f64 / d as f64,
    };
    f(usage.gpu_eq_milli, deserved.gpu_eq_milli)
        .max(f(usage.cpu_milli, deserved.cpu_milli))
        .max(f(usage.memory_mib, deserved.memory_mib))
}

/// The order in which leaves are served: compare keys lexicographically, lowest
/// first. Each element is a queue's [`share_ratio`] from the top of the tree down
/// to the leaf, so a team under its share inside a department over its share
/// waits for the departments under theirs.
pub fn order_key(
    tree: &QueueTree,
    usage: &[Resources],
    shares: &FairShares,
    leaf: QueueId,
) -> Vec<f64> {
    let mut path: Vec<QueueId> = tree.path(leaf).collect();
    path.reverse();
    path.iter()
        .map(|q| {
            let i = usize::from(q.0);
            share_ratio(&usage[i], &shares.deserved[i])
        })
        .collect()
}

/// Time-decayed GPU usage per queue: an exponentially weighted mean of each
/// queue's GPU-equivalents in use, with a half-life. Blended into the usage the
/// scheduler orders by, it makes a team that used a lot recently yield first.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageHistory {
    half_life_s: f64,
    mean_gpu_eq_milli: Vec<f64>,
    last_s: Option<u64>,
}

impl UsageHistory {
    pub fn new(queues: usize, half_life_s: u64) -> UsageHistory {
        UsageHistory {
            half_life_s: half_life_s.max(1) as f64,
            mean_gpu_eq_milli: vec![0.0; queues],
            last_s: None,
        }
    }

    /// The half-life, seconds.
    pub fn half_life_s(&self) -> u64 {
        self.half_life_s as u64
    }

    /// Folds in that `usage` held from the last call until `now_s`.
    pub fn advance(&mut self, now_s: u64, usage: &[Resources]) {
        let dt = match self.last_s {
            Some(t) if now_s > t => (now_s - t) as f64,
            Some(_) => return,
            None => {
                self.last_s = Some(now_s);
                return;
            }
        };
        let keep = 0.5f64.powf(dt / self.half_life_s);
        for (m, u) in self.mean_gpu_eq_milli.iter_mut().zip(usage) {
            *m = *m * keep + u.gpu_eq_milli as f64 * (1.0 - keep);
        }
        self.last_s = Some(now_s);
    }

    /// The decayed mean usage of `queue`, milli GPU-equivalents.
    pub fn mean_gpu_eq_milli(&self, queue: QueueId) -> f64 {
        self.mean_gpu_eq_milli
            .get(usize::from(queue.0))
            .copied()
            .unwrap_or(0.0)
    }

    /// Usage to order by: `(1 − w)·now + w·recent mean` in GPU-equivalents (CPU
    /// and memory as they are now); `w` in [0, 1].
    pub fn blended(&self, queue: QueueId, now: &Resources, w: f64) -> Resources {
        let w = w.clamp(0.0, 1.0);
        let g = (1.0 - w) * now.gpu_eq_milli as f64 + w * self.mean_gpu_eq_milli(queue);
        Resources {
            gpu_eq_milli: g.round() as u64,
            ..*now
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::tree::QueueSpec;

    fn gpus(g: u64) -> Resources {
        Resources::new(g * 1000, 0, 0)
    }

    fn tree(specs: &[(&str, Option<&str>, u64, u32)]) -> QueueTree {
        QueueTree::new(
            specs
                .iter()
                .map(|&(n, p, g, w)| QueueSpec {
                    parent: p.map(str::to_string),
                    weight: w,
                    ..QueueSpec::new(n, gpus(g))
                })
                .collect(),
        )
        .unwrap()
    }

    fn g(r: &Resources) -> u64 {
        r.gpu_eq_milli / 1000
    }

    #[test]
    fn everyone_busy_gets_the_guarantee() {
        // 100 GPUs, guarantees 40/30/20/10, everyone wants 100 → exactly the guarantees.
        let t = tree(&[
            ("a", None, 40, 1),
            ("b", None, 30, 1),
            ("c", None, 20, 1),
            ("d", None, 10, 1),
        ]);
        let s = fair_shares(&t, gpus(100), &[gpus(100); 4]);
        let got: Vec<u64> = s.deserved.iter().map(g).collect();
        assert_eq!(got, vec![40, 30, 20, 10]);
    }

    #[test]
    fn idle_guarantee_is_lent_by_weight() {
        // a (40) is idle; b, c, d each want 100. Pool after guarantees: 100 − 60 = 40,
        // split by weight 1:1:2 → b 30+10, c 20+10, d 10+20.
        let t = tree(&[
            ("a", None, 40, 1),
            ("b", None, 30, 1),
            ("c", None, 20, 1),
            ("d", None, 10, 2),
        ]);
        let s = fair_shares(&t, gpus(100), &[gpus(0), gpus(100), gpus(100), gpus(100)]);
        let got: Vec<u64> = s.deserved.iter().map(g).collect();
        assert_eq!(got, vec![0, 40, 30, 30]);
    }

    #[test]
    fn a_satisfied_queue_leaves_the_rest_to_others() {
        // b wants only 35: it gets 35 and c takes the rest of the pool (100 − 35 − 20 = 45 → 65).
        let t = tree(&[("b", None, 30, 1), ("c", None, 20, 1)]);
        let s = fair_shares(&t, gpus(100), &[gpus(35), gpus(100)]);
        assert_eq!((g(&s.deserved[0]), g(&s.deserved[1])), (35, 65));
    }

    #[test]
    fn non_lenders_keep_their_guarantee_and_non_borrowers_stop_at_it() {
        let mut specs = vec![
            QueueSpec::new("keeper", gpus(40)),
            QueueSpec::new("greedy", gpus(30)),
            QueueSpec::new("modest", gpus(30)),
        ];
        specs[0].lend = false;
        specs[2].borrow = false;
        let t = QueueTree::new(specs).unwrap();
        // keeper idle but keeps 40 out of the pool; modest stops at 30; greedy gets 30.
        let s = fair_shares(&t, gpus(100), &[gpus(0), gpus(100), gpus(100)]);
        let got: Vec<u64> = s.deserved.iter().map(g).collect();
        assert_eq!(got, vec![0, 30, 30]);
    }

    #[test]
    fn limits_cap_borrowing() {
        let mut specs = vec![QueueSpec::new("a", gpus(10)), QueueSpec::new("b", gpus(10))];
        specs[0].limit = Some(gpus(25));
        let t = QueueTree::new(specs).unwrap();
        // Both want everything: a stops at its limit 25, b takes the other 75.
        let s = fair_shares(&t, gpus(100), &[gpus(100), gpus(100)]);
        assert_eq!((g(&s.deserved[0]), g(&s.deserved[1])), (25, 75));
    }

    #[test]
    fn children_divide_their_parents_share() {
        // research (60) has two teams wanting 50 each with guarantees 20/20; prod (40) wants 40.
        // research deserves 60 → teams 20+10 each.
        let t = tree(&[
            ("research", None, 60, 1),
            ("prod", None, 40, 1),
            ("ta", Some("research"), 20, 1),
            ("tb", Some("research"), 20, 1),
        ]);
        let mut demand = vec![Resources::ZERO; 4];
        demand[t.id("prod").unwrap().0 as usize] = gpus(40);
        demand[t.id("ta").unwrap().0 as usize] = gpus(50);
        demand[t.id("tb").unwrap().0 as usize] = gpus(50);
        let s = fair_shares(&t, gpus(100), &demand);
        let at = |n: &str| g(&s.deserved[t.id(n).unwrap().0 as usize]);
        assert_eq!(
            (at("research"), at("prod"), at("ta"), at("tb")),
            (60, 40, 30, 30)
        );
    }

    #[test]
    fn drf_equalises_dominant_shares_across_resources() {
        // 90 GPUs, 90 cores. Queue g wants GPUs only, queue c wants cores only, no
        // guarantees: each gets all it wants of its own resource (they do not compete).
        let t = QueueTree::new(vec![
            QueueSpec::new("g", Resources::ZERO),
            QueueSpec::new("c", Resources::ZERO),
        ])
        .unwrap();
        let cap = Resources::new(90_000, 90_000, 0);
        let s = fair_shares(
            &t,
            cap,
            &[Resources::new(90_000, 0, 0), Resources::new(0, 90_000, 0)],
        );
        assert_eq!(s.deserved[0].gpu_eq_milli, 90_000);
        assert_eq!(s.deserved[1].cpu_milli, 90_000);
        // g wants (90 GPUs, 45 cores), c wants (45, 90): both dominant shares are 1.0, so both
        // take the same fraction λ of their want; GPUs bind at 90λ + 45λ = 90 → λ = 2/3:
        // g gets (60, 30) and c gets (30, 60), equal dominant shares of 2/3.
        let s = fair_shares(
            &t,
            cap,
            &[
                Resources::new(90_000, 45_000, 0),
                Resources::new(45_000, 90_000, 0),
            ],
        );
        let (a, b) = (s.deserved[0], s.deserved[1]);
        assert!((a.gpu_eq_milli as i64 - 60_000).abs() <= 2, "{a:?}");
        assert!((a.cpu_milli as i64 - 30_000).abs() <= 2, "{a:?}");
        assert!((b.cpu_milli as i64 - 60_000).abs() <= 2, "{b:?}");
    }

    #[test]
    fn order_serves_the_queue_furthest_below_its_share() {
        let t = tree(&[("a", None, 50, 1), ("b", None, 50, 1)]);
        let s = fair_shares(&t, gpus(100), &[gpus(100), gpus(100)]);
        let usage = [gpus(45), gpus(20)];
        let ka = order_key(&t, &usage, &s, QueueId(0));
        let kb = order_key(&t, &usage, &s, QueueId(1));
        assert!(kb < ka, "b at 0.4 of its share goes before a at 0.9");
    }

    #[test]
    fn history_remembers_recent_use_with_a_half_life() {
        let mut h = UsageHistory::new(2, 100);
        h.advance(0, &[gpus(10), gpus(0)]);
        h.advance(100, &[gpus(10), gpus(0)]);
        // After one half-life at 10 GPUs: 10 000 × (1 − 0.5) = 5 000 milli.
        assert!((h.mean_gpu_eq_milli(QueueId(0)) - 5_000.0).abs() < 1e-6);
        assert_eq!(h.mean_gpu_eq_milli(QueueId(1)), 0.0);
        let b = h.blended(QueueId(0), &gpus(0), 0.5);
        assert_eq!(b.gpu_eq_milli, 2_500);
    }
}
