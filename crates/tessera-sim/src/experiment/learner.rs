//! A policy as the Kubernetes scheduler runs it, for the experiments in which pods
//! arrive over time (replay, tenants, preempt, gang, isolation): a policy that learns
//! its workload (`tessera`) starts from the generic cold-start prior, learns every pod
//! as it arrives and is rebuilt from the learned target and the GPU compute still free
//! per model each time that target or that supply moves ([`SupplyWatch`]).
//! `tessera-k8s`'s mirror does the same (there a pod without GPUs counts once bound to
//! a node with GPUs; every node here has GPUs). A policy that does not learn (FGD) is built once from the trace's typical
//! pods.

use std::sync::Arc;

use tessera_core::frag::TargetWorkload;
use tessera_core::ledger::Ledger;
use tessera_core::model::Cluster;
use tessera_core::policy::{self, Policy, PolicyArgs, SupplyWatch, UnknownPolicy};
use tessera_core::request::Request;
use tessera_core::workload::{LearnConfig, LearnedWorkload};

/// The policy named `name` on one cluster and, for a policy that learns, what it learns.
#[derive(Clone)]
pub(crate) struct Learner {
    name: String,
    /// The free GPU supply the policy was last built from, and when to build again.
    supply: SupplyWatch,
    /// Whether the policy last built reads the supply ([`Policy::follows_supply`]).
    follows: bool,
    /// What a policy that does not learn is built from.
    typical: Arc<TargetWorkload>,
    workload: Option<LearnedWorkload>,
}

impl Learner {
    /// Checks that `name` is a policy; one that learns starts from the cold-start
    /// prior, one that does not is built from `typical`; both with `cluster`'s GPU
    /// inventory as the supply (nothing placed yet).
    pub(crate) fn start(
        cluster: &Cluster,
        name: &str,
        typical: Arc<TargetWorkload>,
    ) -> Result<Learner, UnknownPolicy> {
        let mut learner = Learner {
            name: name.to_string(),
            supply: SupplyWatch::new(cluster, &Ledger::new(cluster)),
            typical,
            follows: false,
            workload: None,
        };
        if learner.policy()?.learns_workload() {
            learner.workload = Some(LearnedWorkload::cold_start(LearnConfig::default()));
        }
        Ok(learner)
    }

    /// The policy as it stands: built from the learned target, or from the typical
    /// pods for a policy that does not learn.
    pub(crate) fn policy(&mut self) -> Result<Box<dyn Policy>, UnknownPolicy> {
        let workload = match &self.workload {
            Some(w) => w.target(),
            None => self.typical.clone(),
        };
        let args = PolicyArgs {
            workload: Some(workload),
            model_supply: self.supply.built().to_vec(),
        };
        let p = policy::by_name(&self.name, &args)?;
        self.follows = p.follows_supply();
        Ok(p)
    }

    /// Learns an arrival to a cluster in the state `ledger` holds. `true` when the
    /// learned target or the free supply moved: callers holding a policy build it
    /// again ([`Learner::policy`]).
    pub(crate) fn observe(&mut self, req: &Request, ledger: &Ledger) -> bool {
        let Some(w) = self.workload.as_mut() else {
            return false;
        };
        if w.observe(req) {
            // Built again for its target, the policy takes the supply as it is now, as
            // the fill's driver and the Kubernetes mirror build theirs.
            self.supply.rebuilt(ledger);
            return true;
        }
        // A policy whose scores do not read the supply is not rebuilt for it.
        self.follows && self.supply.moved(ledger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learning_policy_moves_with_the_arrivals_and_fgd_does_not() {
        let c = crate::experiment::isolation::builtin_cluster();
        let whole = Request::whole(1, 4000, 0);
        let typical = Arc::new(TargetWorkload::from_requests([&whole], 1.0));
        let half = Request::share_milli(500, 2000, 0);
        let l = Ledger::new(&c);
        let mut fgd = Learner::start(&c, "fgd", typical.clone()).unwrap();
        assert!((0..1000).all(|_| !fgd.observe(&half, &l)));
        let mut tessera = Learner::start(&c, "tessera", typical).unwrap();
        let rebuilt = (0..1000).filter(|_| tessera.observe(&half, &l)).count();
        assert!(rebuilt > 0, "the learned target never moved");
        let learned = tessera.workload.as_ref().unwrap().target();
        let share: f64 = learned
            .pods
            .iter()
            .filter(|p| p.milli == 500)
            .map(|p| p.weight)
            .sum();
        assert!(share > 0.5, "half shares weigh {share} after 1,000 of them");
        // Rebuilt for its target, it reads the supply the ledger leaves now, though
        // one whole GPU of 782 is under the watch's step.
        let mut used = Ledger::new(&c);
        let node = c.nodes().iter().position(|n| !n.gpus.is_empty()).unwrap();
        used.apply(
            &c,
            &tessera_core::placement::Placement {
                node: tessera_core::model::NodeId(node as u32),
                grants: [tessera_core::placement::GpuGrant::whole(0, 1000)]
                    .into_iter()
                    .collect(),
                ..Default::default()
            },
        )
        .unwrap();
        let quarter = Request::share_milli(250, 1000, 0);
        assert!((0..1000).any(|_| tessera.observe(&quarter, &used)));
        assert_eq!(tessera.supply.built(), used.free_milli_by_model());
        assert_ne!(used.free_milli_by_model(), l.free_milli_by_model());
    }
}
