//! What a policy is built from — its target workload, learned from the arrivals or
//! fixed, and the GPU compute still free per model — and when it is due to be built
//! again. The one rule for every holder of a policy: the fill experiment's driver, the
//! simulator's other experiments and the Kubernetes mirror all keep a
//! [`PolicyInputs`], so the policy the simulator measures is built from what the
//! scheduler's would be, at the same moments.

use std::sync::Arc;

use super::{Policy, PolicyArgs};
use crate::frag::TargetWorkload;
use crate::ledger::Ledger;
use crate::model::Cluster;
use crate::request::Request;
use crate::workload::LearnedWorkload;

/// A policy's inputs and when to rebuild it. A policy that learns its workload
/// ([`Policy::learns_workload`]) reads the [`LearnedWorkload`]'s target, which moves as
/// pods arrive; one that does not reads the fixed target it started with. Either is
/// built again when its target moves, or when the free supply has moved by a
/// [`SupplyWatch`] step and the policy reads it ([`Policy::follows_supply`]); a
/// rebuild always takes the supply as it is then.
#[derive(Debug, Clone)]
pub struct PolicyInputs {
    /// What a learning policy learns from (`None`: the policy does not learn).
    learned: Option<LearnedWorkload>,
    /// The target of a policy that does not learn (unread while `learned` is set).
    fixed: Arc<TargetWorkload>,
    supply: SupplyWatch,
    /// Whether the policy last built reads the supply.
    follows: bool,
}

impl PolicyInputs {
    /// Builds the policy with `make` from `fixed` and the supply `ledger` leaves free;
    /// if that policy learns its workload, builds it again from `learned()` (the
    /// cold-start prior, or what is known up front) and keeps learning from there.
    pub fn start<E>(
        mut make: impl FnMut(PolicyArgs) -> Result<Box<dyn Policy>, E>,
        fixed: Arc<TargetWorkload>,
        learned: impl FnOnce() -> LearnedWorkload,
        cluster: &Cluster,
        ledger: &Ledger,
    ) -> Result<(PolicyInputs, Box<dyn Policy>), E> {
        let mut inputs = PolicyInputs {
            learned: None,
            fixed,
            supply: SupplyWatch::new(cluster, ledger),
            follows: false,
        };
        let mut policy = inputs.build(&mut make)?;
        if policy.learns_workload() {
            inputs.learned = Some(learned());
            policy = inputs.build(make)?;
        }
        Ok((inputs, policy))
    }

    /// Inputs for a policy known to learn its workload, from `learned`, on the supply
    /// `ledger` leaves free in `cluster`; nothing is built yet.
    pub fn learning(learned: LearnedWorkload, cluster: &Cluster, ledger: &Ledger) -> PolicyInputs {
        PolicyInputs {
            fixed: learned.target(),
            learned: Some(learned),
            supply: SupplyWatch::new(cluster, ledger),
            follows: false,
        }
    }

    /// The arguments the policy is built from now.
    pub fn args(&self) -> PolicyArgs {
        PolicyArgs {
            workload: Some(self.target()),
            model_supply: self.supply.built().to_vec(),
        }
    }

    /// Builds the policy with `make` from [`PolicyInputs::args`], noting whether it
    /// follows the supply.
    pub fn build<E>(
        &mut self,
        make: impl FnOnce(PolicyArgs) -> Result<Box<dyn Policy>, E>,
    ) -> Result<Box<dyn Policy>, E> {
        let policy = make(self.args())?;
        self.follows = policy.follows_supply();
        Ok(policy)
    }

    /// Learns an arrival to a cluster in the state `ledger` holds. `true` when the
    /// policy is due to be built again: its learned target moved (it then takes the
    /// supply as it is now), or it reads the supply and that moved.
    pub fn observe(&mut self, req: &Request, ledger: &Ledger) -> bool {
        if self.learn(req) {
            self.supply.retake(ledger);
            return true;
        }
        self.supply_moved(ledger)
    }

    /// Learns an arrival without looking at the supply (a caller that learns many at
    /// once): `true` when the learned target moved. A policy that does not learn
    /// learns nothing.
    pub fn learn(&mut self, req: &Request) -> bool {
        self.learned.as_mut().is_some_and(|w| w.observe(req))
    }

    /// `true` when the policy reads the supply and it has moved by a step since the
    /// last build (which then takes the supply now).
    pub fn supply_moved(&mut self, ledger: &Ledger) -> bool {
        self.follows && self.supply.moved(ledger)
    }

    /// The policy is built again for another reason (its target moved, the cluster
    /// changed): it takes the supply `ledger` leaves free in `cluster` now, and
    /// watches it in steps of that cluster's size.
    pub fn retake_supply(&mut self, cluster: &Cluster, ledger: &Ledger) {
        self.supply = SupplyWatch::new(cluster, ledger);
    }

    /// The target the policy is built from: the learned one, else the fixed one.
    pub fn target(&self) -> Arc<TargetWorkload> {
        match &self.learned {
            Some(w) => w.target(),
            None => self.fixed.clone(),
        }
    }

    /// The free supply the policy was last built from.
    pub fn supply(&self) -> &[u32] {
        self.supply.built()
    }

    /// What the policy learns from (`None`: it does not learn).
    pub fn learned(&self) -> Option<&LearnedWorkload> {
        self.learned.as_ref()
    }
}

/// Whether some model's share of the free supply moved by more than 5 % of itself
/// between `a` and `b` (one with none free on one side and some on the other always
/// has): the pressure reads shares, so supply used up evenly changes nothing.
fn shares_moved(a: &[u32], b: &[u32]) -> bool {
    let total = |v: &[u32]| v.iter().map(|&x| f64::from(x)).sum::<f64>();
    let (ta, tb) = (total(a), total(b));
    if ta == 0.0 || tb == 0.0 {
        return ta != tb;
    }
    (0..a.len().max(b.len())).any(|m| {
        let sa = f64::from(a.get(m).copied().unwrap_or(0)) / ta;
        let sb = f64::from(b.get(m).copied().unwrap_or(0)) / tb;
        match (sa > 0.0, sb > 0.0) {
            (true, true) => (sb / sa - 1.0).abs() > 0.05,
            (false, false) => false,
            _ => true,
        }
    })
}

/// When a policy built from the free supply ([`Ledger::free_milli_by_model`]) is due to be
/// built again: once the supply it was built from has moved, summed over the models,
/// by 1 % of the cluster's GPU compute, and some model's share of it by 5 % of that
/// share (supply used up evenly leaves the pressure as it was). Rebuilding drops
/// the score caches, so it follows the supply in steps rather than on every
/// placement.
#[derive(Debug, Clone)]
pub struct SupplyWatch {
    built: Vec<u32>,
    step: u64,
}

impl SupplyWatch {
    /// Watches `cluster`, whose policy is built from the supply `ledger` leaves free now.
    pub fn new(cluster: &Cluster, ledger: &Ledger) -> SupplyWatch {
        SupplyWatch {
            built: ledger.free_milli_by_model(),
            step: (cluster.gpu_count() as u64 * 10).max(1),
        }
    }

    /// The supply the policy was last built from.
    pub fn built(&self) -> &[u32] {
        &self.built
    }

    /// The policy is built again for another reason: it takes the supply `ledger`
    /// leaves free now.
    fn retake(&mut self, ledger: &Ledger) {
        self.built = ledger.free_milli_by_model();
    }

    /// `true` when the policy should be built again, from the supply now (which
    /// [`SupplyWatch::built`] then holds); `false` while it is close enough.
    pub fn moved(&mut self, ledger: &Ledger) -> bool {
        let now = ledger.free_milli_by_model();
        let drift: u64 = (0..now.len().max(self.built.len()))
            .map(|m| {
                let a = u64::from(now.get(m).copied().unwrap_or(0));
                let b = u64::from(self.built.get(m).copied().unwrap_or(0));
                a.abs_diff(b)
            })
            .sum();
        if drift < self.step || !shares_moved(&self.built, &now) {
            return false;
        }
        self.built = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Catalog, ModelSet, Node, NodeId};
    use crate::placement::{GpuGrant, Placement};
    use crate::workload::LearnConfig;

    /// One T4 node (2 GPUs) and six G2 nodes (48 GPUs).
    fn cluster() -> Cluster {
        let cat = Catalog::default();
        let (t4, g2) = (cat.find("T4").unwrap(), cat.find("G2").unwrap());
        let mut nodes = vec![Node::uniform("t4", 32_000, 1 << 20, t4, 2)];
        for i in 0..6 {
            nodes.push(Node::uniform(format!("g2-{i}"), 96_000, 1 << 20, g2, 8));
        }
        Cluster::new(cat, nodes).unwrap()
    }

    fn start(name: &str, c: &Cluster, l: &Ledger) -> (PolicyInputs, Box<dyn Policy>) {
        let fixed = Arc::new(TargetWorkload::from_requests(
            [&Request::whole(1, 4000, 0)],
            1.0,
        ));
        PolicyInputs::start(
            |a| super::super::by_name(name, &a),
            fixed,
            || LearnedWorkload::cold_start(LearnConfig::default()),
            c,
            l,
        )
        .unwrap()
    }

    fn on_t4(c: &Cluster) -> Request {
        Request::whole(1, 1000, 0)
            .with_models(&["T4"], &c.catalog)
            .unwrap()
    }

    #[test]
    fn a_policy_that_does_not_learn_keeps_its_fixed_target() {
        let c = cluster();
        let mut l = Ledger::new(&c);
        let (mut inputs, policy) = start("fgd", &c, &l);
        assert!(inputs.learned().is_none());
        let fixed = inputs.target();
        for node in 1..7 {
            for gpu in 0..8 {
                l.apply(&c, &whole(node, gpu)).unwrap();
            }
        }
        assert!((0..1000).all(|_| !inputs.observe(&on_t4(&c), &l)));
        assert!(Arc::ptr_eq(&fixed, &inputs.target()));
        assert!(!policy.follows_supply());
    }

    fn whole(node: u32, gpu: u8) -> Placement {
        Placement {
            node: NodeId(node),
            grants: [GpuGrant::whole(gpu, 1000)].into_iter().collect(),
            ..Placement::default()
        }
    }

    #[test]
    fn a_learning_policy_follows_its_target_then_the_supply() {
        let c = cluster();
        let mut l = Ledger::new(&c);
        let (mut inputs, policy) = start("tessera", &c, &l);
        // Built from the cold-start prior: no model-constrained shape, no pressure.
        assert!(inputs.learned().is_some());
        assert!(!policy.follows_supply());
        assert!(
            inputs
                .target()
                .pods
                .iter()
                .all(|p| p.models == ModelSet::ALL)
        );
        // T4-bound pods arrive: the target moves and the policy built from it reads
        // the supply.
        let moved = (0..300).filter(|_| inputs.observe(&on_t4(&c), &l)).count();
        assert!(moved > 0);
        let policy = inputs
            .build(|a| super::super::by_name("tessera", &a))
            .unwrap();
        assert!(policy.follows_supply());
        assert!(
            inputs
                .target()
                .pods
                .iter()
                .any(|p| p.models != ModelSet::ALL)
        );
        // Use up the T4 node: the supply moved by more than a step (1 % of 50 GPUs)
        // and the T4's share of it by all of it, so the policy is due a rebuild that
        // reads the supply as it is now; then it is not, until the supply moves again.
        assert!(!inputs.supply_moved(&l));
        l.apply(&c, &whole(0, 0)).unwrap();
        l.apply(&c, &whole(0, 1)).unwrap();
        assert_ne!(inputs.supply(), l.free_milli_by_model());
        assert!(inputs.supply_moved(&l));
        assert_eq!(inputs.supply(), l.free_milli_by_model());
        assert!(!inputs.supply_moved(&l));
    }
}
