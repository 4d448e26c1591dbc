//! Judging nodes: the one "fit check, then score" ([`judge`]) and the one
//! per-shape cache of its verdicts ([`Verdicts`]) that the core scheduler, the
//! Kubernetes extender and standalone loop, and the simulator all read.
//!
//! For a cacheable policy a node's verdict depends only on the node's state and
//! the request's shape, so it stays valid until the ledger logs a change on that
//! node. Per shape, the cache keeps each node's verdict (score, or the typed
//! [`Reason`] it was rejected for) as of a ledger change cursor, and the fitting
//! nodes ordered best first. Bringing a shape up to date forgets only the nodes
//! changed since, so the cost of a decision grows with the nodes changed since
//! the shape was last asked (times log N), not with the cluster; the first ask
//! of a shape pays one pass. Nodes are judged when first read (the extender asks
//! for the nodes kube-scheduler names) or all together (the scheduler wants the
//! best one).
//!
//! What a shape is stays the caller's: the scheduler leaves host memory out of
//! its shapes (a filter only, checked while walking the order, so pods that
//! differ only in memory share one shape); the Kubernetes mirror keys by the
//! whole request plus the node resources the pod counts against, and adds its
//! node-side checks in the judging closure it passes.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::hash::Hash;

use rand::RngCore;
use rustc_hash::FxHashMap;

use crate::explain::Reason;
use crate::fit::{self, NodeView};
use crate::ledger::Ledger;
use crate::model::NodeId;
use crate::placement::{ScoreTerm, Scored};
use crate::policy::Policy;
use crate::request::Request;

/// Whether `policy` may take `req`'s verdicts from the cache: its scores must not
/// draw from the RNG, and GPUs pinned by UUID make every request its own shape.
pub fn cacheable(policy: &dyn Policy, req: &Request) -> bool {
    policy.cacheable() && req.constraints.pinned_uuids.is_empty()
}

/// Judges one node for `req`: the shared filter ([`fit::check`]: CPU and memory,
/// then GPUs), then the policy's score, ranked first by how well the node can
/// isolate a `hard` share ([`fit::mig_layout::hard_rank_penalty`]; 0 for every
/// other request). A node the policy declines is [`Reason::PolicyDeclined`].
pub fn judge(
    policy: &dyn Policy,
    view: NodeView<'_>,
    req: &Request,
    rng: &mut dyn RngCore,
) -> Result<Scored, Reason> {
    let fit = fit::check(view, req)?;
    let penalty = fit::mig_layout::hard_rank_penalty(view, req, &fit);
    let mut scored = policy
        .score(view, req, &fit, rng)
        .ok_or_else(|| Reason::PolicyDeclined {
            policy: policy.name().to_string(),
        })?;
    if penalty > 0.0 {
        scored.score -= penalty;
        scored.terms.push(ScoreTerm {
            name: "isolation-tier",
            value: -penalty,
        });
    }
    Ok(scored)
}

/// A node's verdict: its score, or why it cannot take the shape.
pub type Verdict = Result<f64, Reason>;

/// Total order on scores: higher first, then by the total order of `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Key(pub(crate) f64);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        // Descending: a higher score sorts first.
        other.0.total_cmp(&self.0)
    }
}

/// A node's entry in a shape: 16 bytes, so that a shape of many nodes stays
/// small (a decision touches the entries of scattered nodes, a cache miss each).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    /// Not judged yet, or forgotten since.
    Unknown,
    Fit(f64),
    /// Rejected for the shape's reason at this index.
    No(u32),
}

/// One shape's verdicts on every node, valid as of a ledger change cursor.
#[derive(Debug, Clone, Default)]
pub struct ShapeCache {
    cursor: u64,
    slots: Vec<Slot>,
    /// The distinct reasons nodes were rejected for (a handful per shape), by
    /// index, and the index of each.
    reasons: Vec<Reason>,
    reason_ids: FxHashMap<Reason, u32>,
    /// The nodes that fit, best first (ties: lower id first).
    order: BTreeSet<(Key, NodeId)>,
    /// Every node whose slot is unknown, in the order it was forgotten (some
    /// may have been judged since: they are skipped).
    stale: Vec<NodeId>,
    last_used: u64,
}

impl ShapeCache {
    /// Distinct reasons kept before the shape starts over (node-specific texts
    /// from a caller's judge could otherwise grow the table without bound).
    const MAX_REASONS: usize = 4096;

    /// Forgets every verdict (a cluster of `nodes` nodes, nothing judged).
    fn reset(&mut self, nodes: usize) {
        self.slots.clear();
        self.slots.resize(nodes, Slot::Unknown);
        self.reasons.clear();
        self.reason_ids.clear();
        self.order.clear();
        self.stale.clear();
        self.stale.extend((0..nodes as u32).map(NodeId));
    }

    /// Forgets one node's verdict.
    fn forget(&mut self, id: NodeId) {
        let Some(slot) = self.slots.get_mut(id.0 as usize) else {
            return;
        };
        match std::mem::replace(slot, Slot::Unknown) {
            Slot::Unknown => return,
            Slot::Fit(score) => {
                self.order.remove(&(Key(score), id));
            }
            Slot::No(_) => {}
        }
        self.stale.push(id);
        // A shape read only node by node (the extender's) never drains the list:
        // keep it as long as the cluster, at most twice over.
        if self.stale.len() > 2 * self.slots.len() + 64 {
            self.stale = (0..self.slots.len())
                .filter(|&i| self.slots[i] == Slot::Unknown)
                .map(|i| NodeId(i as u32))
                .collect();
        }
    }

    fn set(&mut self, id: NodeId, v: Verdict) {
        let slot = match v {
            Ok(score) => {
                self.order.insert((Key(score), id));
                Slot::Fit(score)
            }
            Err(reason) => match self.reason_ids.get(&reason) {
                Some(&i) => Slot::No(i),
                None => {
                    let i = self.reasons.len() as u32;
                    self.reason_ids.insert(reason.clone(), i);
                    self.reasons.push(reason);
                    Slot::No(i)
                }
            },
        };
        if let Some(s) = self.slots.get_mut(id.0 as usize) {
            *s = slot;
        }
    }

    /// Judges each of `ids` whose verdict is not known (the nodes a caller is
    /// about to read; ids outside the cluster are skipped).
    pub fn judge_each(
        &mut self,
        ids: impl IntoIterator<Item = NodeId>,
        judge: &mut impl FnMut(NodeId) -> Verdict,
    ) {
        for id in ids {
            if let Some(Slot::Unknown) = self.slots.get(id.0 as usize) {
                let v = judge(id);
                self.set(id, v);
            }
        }
    }

    /// The verdict on `id` if it has been judged.
    pub fn known(&self, id: NodeId) -> Option<Result<f64, &Reason>> {
        match self.known_index(id)? {
            Ok(score) => Some(Ok(score)),
            Err(i) => self.reasons.get(i).map(Err),
        }
    }

    /// Like [`ShapeCache::known`], with a rejection as its index into
    /// [`ShapeCache::reasons`] (for a caller that words each reason once).
    pub fn known_index(&self, id: NodeId) -> Option<Result<f64, usize>> {
        match *self.slots.get(id.0 as usize)? {
            Slot::Unknown => None,
            Slot::Fit(score) => Some(Ok(score)),
            Slot::No(i) => Some(Err(i as usize)),
        }
    }

    /// The distinct reasons this shape's nodes were rejected for.
    pub fn reasons(&self) -> &[Reason] {
        &self.reasons
    }

    /// Judges every node whose verdict is not known, in the order they were
    /// forgotten (node order after a reset).
    pub fn judge_all(&mut self, judge: &mut impl FnMut(NodeId) -> Verdict) {
        let mut stale = std::mem::take(&mut self.stale);
        for &id in &stale {
            if self.slots.get(id.0 as usize) == Some(&Slot::Unknown) {
                let v = judge(id);
                self.set(id, v);
            }
        }
        // Keep the list's allocation: nearly every decision forgets a node or two.
        stale.clear();
        self.stale = stale;
    }

    /// The nodes judged to fit, best first (ties: lower id first). After
    /// [`ShapeCache::judge_all`], every node that fits.
    pub fn ranked(&self) -> impl Iterator<Item = (NodeId, f64)> + '_ {
        self.order.iter().map(|&(Key(score), id)| (id, score))
    }
}

/// Per request shape (`K`, the caller's key), the verdicts of every node.
///
/// The least recently used shape is dropped when `max_shapes` are kept. A shape
/// whose policy is not cacheable ([`cacheable`]) is judged afresh on every ask:
/// the entry then only carries the verdicts from one ask to the reads that follow it.
#[derive(Debug, Clone)]
pub struct Verdicts<K> {
    shapes: FxHashMap<K, ShapeCache>,
    max_shapes: usize,
    clock: u64,
}

impl<K: Hash + Eq + Clone> Verdicts<K> {
    /// A cache keeping at most `max_shapes` shapes (at least one).
    pub fn new(max_shapes: usize) -> Verdicts<K> {
        Verdicts {
            shapes: FxHashMap::default(),
            max_shapes: max_shapes.max(1),
            clock: 0,
        }
    }

    /// Forgets every shape (the cluster itself changed, or the policy did).
    pub fn clear(&mut self) {
        self.shapes.clear();
    }

    /// Forgets `node`'s verdict in every shape: something a verdict reads
    /// changed outside the ledger (a node resource the caller's judge checks).
    pub fn forget(&mut self, node: NodeId) {
        for s in self.shapes.values_mut() {
            s.forget(node);
        }
    }

    /// The verdicts of `key`'s shape on a cluster of `nodes` nodes, brought up
    /// to date with `ledger`: nodes changed since the shape was last asked are
    /// forgotten; everything is when the ledger's log no longer reaches back
    /// that far, the cluster's size changed, the shape's table of reasons is
    /// full, or `reuse` is false (a policy that is not [`cacheable`]).
    pub fn shape(&mut self, key: K, ledger: &Ledger, nodes: usize, reuse: bool) -> &mut ShapeCache {
        self.clock += 1;
        if self.shapes.len() >= self.max_shapes
            && !self.shapes.contains_key(&key)
            && let Some(old) = self
                .shapes
                .iter()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(k, _)| k.clone())
        {
            self.shapes.remove(&old);
        }
        let clock = self.clock;
        let s = self.shapes.entry(key).or_insert_with(|| ShapeCache {
            cursor: u64::MAX,
            ..ShapeCache::default()
        });
        s.last_used = clock;
        let fresh = s.slots.len() == nodes && s.reasons.len() < ShapeCache::MAX_REASONS;
        let changed = if reuse && fresh {
            ledger.changes_since(s.cursor)
        } else {
            None
        };
        match changed {
            Some(ids) => {
                for &id in ids {
                    s.forget(id);
                }
            }
            None => s.reset(nodes),
        }
        s.cursor = ledger.change_cursor();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::demo::demo_cluster;
    use crate::policy;
    use rand::SeedableRng;

    /// Judges with the binpack policy; counts the nodes it judged.
    fn judged(
        s: &mut ShapeCache,
        cluster: &crate::Cluster,
        ledger: &Ledger,
        req: &Request,
        ids: &[u32],
    ) -> usize {
        let p = policy::by_name("binpack", &policy::PolicyArgs::default()).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let mut n = 0;
        let mut judge = |id: NodeId| {
            n += 1;
            judge(p.as_ref(), NodeView::of(cluster, ledger, id), req, &mut rng).map(|s| s.score)
        };
        if ids.is_empty() {
            s.judge_all(&mut judge);
        } else {
            s.judge_each(ids.iter().map(|&i| NodeId(i)), &mut judge);
        }
        n
    }

    /// After a placement only the changed node is judged again, whether the
    /// shape is read node by node or all at once.
    #[test]
    fn only_changed_nodes_are_judged_again() {
        let cluster = demo_cluster();
        let mut ledger = Ledger::new(&cluster);
        let req = Request::share_milli(300, 2000, 4096);
        let mut v: Verdicts<Request> = Verdicts::new(4);
        let n = cluster.len();
        let s = v.shape(req.clone(), &ledger, n, true);
        assert_eq!(
            judged(s, &cluster, &ledger, &req, &[]),
            n,
            "first ask: every node"
        );
        assert_eq!(
            judged(s, &cluster, &ledger, &req, &[]),
            0,
            "nothing changed"
        );
        let (best, _) = s.ranked().next().expect("a node fits");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let p = policy::by_name("binpack", &policy::PolicyArgs::default()).unwrap();
        let scored = judge(
            p.as_ref(),
            NodeView::of(&cluster, &ledger, best),
            &req,
            &mut rng,
        )
        .expect("fits");
        let placement =
            crate::Placement::of(NodeView::of(&cluster, &ledger, best), &req, best, scored);
        ledger.apply(&cluster, &placement).unwrap();
        let s = v.shape(req.clone(), &ledger, n, true);
        assert_eq!(s.known(best), None, "the changed node is forgotten");
        assert_eq!(
            judged(s, &cluster, &ledger, &req, &[best.0, 0, 1]),
            1,
            "read one by one"
        );
        assert_eq!(
            judged(s, &cluster, &ledger, &req, &[]),
            0,
            "then nothing is stale"
        );
        let s = v.shape(req.clone(), &ledger, n, false);
        assert_eq!(
            judged(s, &cluster, &ledger, &req, &[]),
            n,
            "not reused: all again"
        );
    }

    /// An entry stays two to a cache line (see [`Slot`]).
    #[test]
    fn a_node_entry_takes_16_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }

    /// The least recently used shape goes when the cache is full.
    #[test]
    fn the_least_recently_used_shape_is_dropped() {
        let cluster = demo_cluster();
        let ledger = Ledger::new(&cluster);
        let mut v: Verdicts<u32> = Verdicts::new(2);
        let n = cluster.len();
        for key in [1, 2, 1, 3] {
            v.shape(key, &ledger, n, true).judge_all(&mut |_| Ok(1.0));
        }
        assert!(v.shapes.contains_key(&1) && v.shapes.contains_key(&3));
        assert!(!v.shapes.contains_key(&2), "2 was used least recently");
    }

    /// A node forgotten outside the ledger is judged again; the stale list of a
    /// shape read node by node stays bounded.
    #[test]
    fn forgotten_nodes_are_judged_again_and_the_stale_list_is_bounded() {
        let cluster = demo_cluster();
        let ledger = Ledger::new(&cluster);
        let mut v: Verdicts<u32> = Verdicts::new(2);
        let n = cluster.len();
        let mut calls = 0;
        for _ in 0..1000 {
            v.forget(NodeId(3));
            let s = v.shape(7, &ledger, n, true);
            s.judge_each([NodeId(3)], &mut |_| {
                calls += 1;
                Err(Reason::Unhealthy)
            });
        }
        assert_eq!(calls, 1000, "judged again after every forget");
        assert!(v.shapes[&7].stale.len() <= 2 * n + 64);
        assert_eq!(v.shapes[&7].reasons.len(), 1, "one reason, kept once");
        assert_eq!(v.shapes[&7].known(NodeId(3)), Some(Err(&Reason::Unhealthy)));
    }
}
