//! A policy as the Kubernetes scheduler runs it, for the experiments in which pods
//! arrive over time (replay, tenants, preempt, gang, isolation): a policy that learns
//! its workload (`tessera`) starts from the generic cold-start prior, learns every pod
//! as it arrives and is rebuilt from the learned target and the GPU compute still free
//! per model each time that target or that supply moves ([`PolicyInputs`]).
//! `tessera-k8s`'s mirror keeps the same inputs (there a pod without GPUs counts once
//! bound to a node with GPUs; every node here has GPUs). A policy that does not learn
//! (FGD) is built once from the trace's typical pods.

use std::sync::Arc;

use tessera_core::frag::TargetWorkload;
use tessera_core::ledger::Ledger;
use tessera_core::model::Cluster;
use tessera_core::policy::{self, Policy, PolicyInputs, UnknownPolicy};
use tessera_core::request::Request;
use tessera_core::workload::{LearnConfig, LearnedWorkload};

/// The policy named `name` on one cluster and what it is built from
/// ([`PolicyInputs`], the rule the fill's driver and the Kubernetes mirror follow too).
#[derive(Clone)]
pub(crate) struct Learner {
    name: String,
    inputs: PolicyInputs,
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
        let (inputs, _) = PolicyInputs::start(
            |a| policy::by_name(name, &a),
            typical,
            || LearnedWorkload::cold_start(LearnConfig::default()),
            cluster,
            &Ledger::new(cluster),
        )?;
        Ok(Learner {
            name: name.to_string(),
            inputs,
        })
    }

    /// The policy as it stands: built from the learned target, or from the typical
    /// pods for a policy that does not learn.
    pub(crate) fn policy(&mut self) -> Result<Box<dyn Policy>, UnknownPolicy> {
        let name = &self.name;
        self.inputs.build(|a| policy::by_name(name, &a))
    }

    /// Learns an arrival to a cluster in the state `ledger` holds. `true` when the
    /// policy is due to be built again ([`PolicyInputs::observe`]): callers holding
    /// one call [`Learner::policy`].
    pub(crate) fn observe(&mut self, req: &Request, ledger: &Ledger) -> bool {
        self.inputs.observe(req, ledger)
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
        let learned = tessera.inputs.target();
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
        assert_eq!(tessera.inputs.supply(), used.free_milli_by_model());
        assert_ne!(used.free_milli_by_model(), l.free_milli_by_model());
    }
}
