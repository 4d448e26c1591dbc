//! A policy as the Kubernetes scheduler runs it, for the experiments in which pods
//! arrive over time (replay, tenants, preempt, gang, isolation): a policy that learns
//! its workload (`tessera`) starts from the generic cold-start prior, learns every pod
//! as it arrives and is rebuilt from the learned target and the cluster's GPU
//! inventory each time that target moves. `tessera-k8s`'s mirror does the same (there
//! a pod without GPUs counts once bound to a node with GPUs; every node here has
//! GPUs). A policy that does not learn (FGD) is built once from the trace's typical
//! pods.

use std::sync::Arc;

use tessera_core::frag::TargetWorkload;
use tessera_core::model::Cluster;
use tessera_core::policy::{self, Policy, PolicyArgs, UnknownPolicy};
use tessera_core::request::Request;
use tessera_core::workload::{LearnConfig, LearnedWorkload};

/// The policy named `name` on one cluster and, for a policy that learns, what it learns.
#[derive(Clone)]
pub(crate) struct Learner {
    name: String,
    gpus_per_model: Vec<u32>,
    /// What a policy that does not learn is built from.
    typical: Arc<TargetWorkload>,
    workload: Option<LearnedWorkload>,
}

impl Learner {
    /// Checks that `name` is a policy; one that learns starts from the cold-start
    /// prior, one that does not is built from `typical`; both with `cluster`'s GPU
    /// inventory.
    pub(crate) fn start(
        cluster: &Cluster,
        name: &str,
        typical: Arc<TargetWorkload>,
    ) -> Result<Learner, UnknownPolicy> {
        let mut learner = Learner {
            name: name.to_string(),
            gpus_per_model: policy::gpus_per_model(cluster),
            typical,
            workload: None,
        };
        if learner.policy()?.learns_workload() {
            learner.workload = Some(LearnedWorkload::cold_start(LearnConfig::default()));
        }
        Ok(learner)
    }

    /// The policy as it stands: built from the learned target, or from the typical
    /// pods for a policy that does not learn.
    pub(crate) fn policy(&self) -> Result<Box<dyn Policy>, UnknownPolicy> {
        let workload = match &self.workload {
            Some(w) => w.target(),
            None => self.typical.clone(),
        };
        let args = PolicyArgs {
            workload: Some(workload),
            gpus_per_model: self.gpus_per_model.clone(),
        };
        policy::by_name(&self.name, &args)
    }

    /// Learns an arrival. `true` when the learned target moved: callers holding a
    /// policy build it again ([`Learner::policy`]).
    pub(crate) fn observe(&mut self, req: &Request) -> bool {
        self.workload.as_mut().is_some_and(|w| w.observe(req))
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
        let mut fgd = Learner::start(&c, "fgd", typical.clone()).unwrap();
        assert!((0..1000).all(|_| !fgd.observe(&half)));
        let mut tessera = Learner::start(&c, "tessera", typical).unwrap();
        let rebuilt = (0..1000).filter(|_| tessera.observe(&half)).count();
        assert!(rebuilt > 0, "the learned target never moved");
        let learned = tessera.workload.as_ref().unwrap().target();
        let share: f64 = learned
            .pods
            .iter()
            .filter(|p| p.milli == 500)
            .map(|p| p.weight)
            .sum();
        assert!(share > 0.5, "half shares weigh {share} after 1,000 of them");
    }
}
