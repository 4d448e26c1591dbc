//! The [`Scheduler`]: ranks nodes for a request with one policy and makes the
//! [`Decision`].
//!
//! A decision is made on a snapshot: the scheduler reads the cluster and the
//! ledger and returns a [`Placement`] or an [`Explanation`]; the caller applies
//! it (ledger, Kubernetes binding or simulator event). Nothing here mutates the ledger.
//!
//! Speed: a cacheable policy's verdicts are kept per request shape in the core's
//! one cache ([`crate::judge::Verdicts`]). A decision refreshes only the nodes the
//! ledger logged as changed since that shape was last asked, then walks the shape's
//! nodes from the best until one also passes the host-memory check (host memory is
//! a filter only, never scored, so it is left out of the shape). The cost of a
//! decision therefore grows with the number of nodes changed since the shape was
//! last seen (times log N), not with the cluster size; the first request of a new
//! shape pays one full pass.

use rand::RngCore;

use crate::explain::Explanation;
use crate::fit::{self, NodeView};
use crate::judge::{self, Key, Verdicts, judge};
use crate::ledger::Ledger;
use crate::model::{Cluster, NodeId};
use crate::placement::{Placement, Scored};
use crate::policy::Policy;
use crate::request::Request;

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a placement is the common, hot case; boxing it costs an allocation per decision"
)]
pub enum Decision {
    Place(Placement),
    Unschedulable(Explanation),
}

/// Most request shapes whose verdicts a scheduler keeps.
const MAX_SHAPES: usize = 256;

/// Makes decisions for one policy, keeping node verdicts per request shape
/// ([`crate::judge::Verdicts`]; the shape is the request without host memory).
pub struct Scheduler {
    policy: Box<dyn Policy>,
    verdicts: Verdicts<Request>,
}

impl Scheduler {
    pub fn new(policy: Box<dyn Policy>) -> Scheduler {
        Scheduler {
            policy,
            verdicts: Verdicts::new(MAX_SHAPES),
        }
    }

    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// Forgets cached verdicts (after the cluster itself changed shape).
    pub fn clear_cache(&mut self) {
        self.verdicts.clear();
    }

    /// Decides where `req` goes.
    pub fn decide(
        &mut self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Decision {
        match self.place(cluster, ledger, req, rng) {
            Some(p) => Decision::Place(p),
            None => Decision::Unschedulable(self.explain(cluster, ledger, req, rng)),
        }
    }

    /// Like [`Scheduler::decide`], but `None` instead of an explanation when nothing
    /// fits: for callers that only count failures (the simulator), since explaining
    /// costs a scan of every node.
    pub fn place(
        &mut self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Option<Placement> {
        let best = if judge::cacheable(self.policy.as_ref(), req) {
            self.decide_cached(cluster, ledger, req, rng)
        } else {
            self.decide_scan(cluster, ledger, req, rng)
        };
        best.map(|(id, scored)| Placement::of(NodeView::of(cluster, ledger, id), req, id, scored))
    }

    /// Like [`Scheduler::place`], but only on `nodes` (a topology domain for a gang,
    /// the nodes a defragmentation move may go to). Scans them without the score cache.
    pub fn place_within(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        nodes: &[NodeId],
        rng: &mut dyn RngCore,
    ) -> Option<Placement> {
        let ids = nodes
            .iter()
            .copied()
            .filter(|id| (id.0 as usize) < cluster.len());
        self.scan(cluster, ledger, req, ids, rng)
            .map(|(id, scored)| Placement::of(NodeView::of(cluster, ledger, id), req, id, scored))
    }

    fn decide_scan(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Option<(NodeId, Scored)> {
        self.scan(cluster, ledger, req, cluster.ids(), rng)
    }

    /// The best of `ids` (ties: the earlier node), each judged once, in order: a
    /// policy that draws from the RNG draws once per node.
    fn scan(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        ids: impl Iterator<Item = NodeId>,
        rng: &mut dyn RngCore,
    ) -> Option<(NodeId, Scored)> {
        let mut best: Option<(NodeId, Scored)> = None;
        for id in ids {
            if let Ok(s) = judge(
                self.policy.as_ref(),
                NodeView::of(cluster, ledger, id),
                req,
                rng,
            ) && best.as_ref().is_none_or(|(_, b)| s.score > b.score)
            {
                best = Some((id, s));
            }
        }
        best
    }

    /// The best node from the shape's cached order: the first that also has the
    /// host memory, judged once more for its GPUs and score parts.
    fn decide_cached(
        &mut self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Option<(NodeId, Scored)> {
        let mut shape = req.clone();
        shape.memory_mib = 0;
        let policy = self.policy.as_ref();
        let cache = self
            .verdicts
            .shape(shape.clone(), ledger, cluster.len(), true);
        cache.judge_all(&mut |id| {
            judge(policy, NodeView::of(cluster, ledger, id), &shape, rng).map(|s| s.score)
        });
        cache.ranked().find_map(|(id, _)| {
            let view = NodeView::of(cluster, ledger, id);
            fit::check_host(view, req).ok()?;
            judge(policy, view, &shape, rng).ok().map(|s| (id, s))
        })
    }

    /// Why `req` fits nowhere (or how many nodes it fits): one reason per node from the
    /// shared filter. Costs one filter pass over every node, no scoring.
    pub fn explain(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        _rng: &mut dyn RngCore,
    ) -> Explanation {
        let mut e = Explanation::new(cluster.len());
        for id in cluster.ids() {
            match fit::check(NodeView::of(cluster, ledger, id), req) {
                Ok(_) => e.fit += 1,
                Err(r) => e.add(r),
            }
        }
        e
    }

    /// Every feasible node with its score, best first (for `tessera place`).
    pub fn rank(
        &self,
        cluster: &Cluster,
        ledger: &Ledger,
        req: &Request,
        rng: &mut dyn RngCore,
    ) -> Vec<(NodeId, Scored)> {
        let mut v: Vec<(NodeId, Scored)> = cluster
            .ids()
            .filter_map(|id| {
                judge(
                    self.policy.as_ref(),
                    NodeView::of(cluster, ledger, id),
                    req,
                    rng,
                )
                .ok()
                .map(|s| (id, s))
            })
            .collect();
        v.sort_by(|a, b| Key(a.1.score).cmp(&Key(b.1.score)).then(a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::demo::demo_cluster;
    use crate::policy;
    use rand::SeedableRng;

    /// The cached path and the plain scan agree decision by decision while the cluster fills.
    #[test]
    fn cached_decisions_equal_full_scans() {
        for name in ["binpack", "spread", "fgd", "tessera", "bestfit"] {
            let cluster = demo_cluster();
            let mut ledger = Ledger::new(&cluster);
            let mut cached =
                Scheduler::new(policy::by_name(name, &policy::PolicyArgs::default()).unwrap());
            let scan =
                Scheduler::new(policy::by_name(name, &policy::PolicyArgs::default()).unwrap());
            let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
            let shapes = [
                Request::share_milli(300, 2000, 4096),
                Request::share_milli(700, 4000, 8192),
                Request::whole(1, 8000, 16384),
                Request::whole(4, 16000, 65536),
                Request::share_milli(500, 1000, 2048),
            ];
            let mut placed = Vec::new();
            for i in 0..200 {
                let req = &shapes[i % shapes.len()];
                let a = cached.decide(&cluster, &ledger, req, &mut rng);
                let b = scan.decide_scan(&cluster, &ledger, req, &mut rng);
                match (&a, b) {
                    (Decision::Place(p), Some((id, s))) => {
                        assert_eq!(p.score, s.score, "{name} step {i}: same best score");
                        let _ = id;
                        placed.push(ledger.apply(&cluster, p).unwrap());
                    }
                    (Decision::Unschedulable(_), None) => {}
                    (a, b) => panic!("{name} step {i}: cached {a:?} vs scan {b:?}"),
                }
                if i % 7 == 6 && !placed.is_empty() {
                    ledger.release(placed.remove(i % placed.len())).unwrap();
                }
            }
        }
    }

    #[test]
    fn unschedulable_explains_per_node() {
        let cluster = demo_cluster();
        let ledger = Ledger::new(&cluster);
        let mut s =
            Scheduler::new(policy::by_name("tessera", &policy::PolicyArgs::default()).unwrap());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        match s.decide(&cluster, &ledger, &Request::whole(16, 0, 0), &mut rng) {
            Decision::Unschedulable(e) => assert_eq!(
                e.to_string(),
                "0/12 nodes fit: 12 fewer than 16 GPUs in total"
            ),
            d => panic!("expected no fit, got {d:?}"),
        }
    }
}
