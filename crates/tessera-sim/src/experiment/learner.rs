//! A policy as the Kubernetes scheduler runs it, for the experiments in which pods
//! arrive over time (replay, tenants, isolation): a policy that learns its workload
//! (`tessera`) starts from the generic cold-start prior, learns every pod as it
//! arrives and is rebuilt from the learned target and the cluster's GPU inventory each
//! time that target moves. `tessera-k8s`'s mirror does the same, except that it learns
//! GPU pods only: it sees every pod of the cluster, most CPU-only pods on nodes without
//! GPUs, while every pod here runs on GPU nodes. A policy that does not learn (FGD) is
//! built once from the trace's typical pods.

use std::sync::Arc;

use tessera_core::frag::TargetWorkload;
use tessera_core::model::Cluster;
use tessera_core::policy::{self, Policy, PolicyArgs, UnknownPolicy};
use tessera_core::request::Request;
use tessera_core::workload::{LearnConfig, LearnedWorkload};

/// The policy named `name` on one cluster and, for a policy that learns, what it learns.
pub(crate) struct Learner {
    name: String,
    gpus_per_model: Vec<u32>,
    workload: Option<LearnedWorkload>,
}

impl Learner {
    /// The first policy: built from `typical` for a policy that does not learn, from
    /// the cold-start prior for one that does; both with `cluster`'s GPU inventory.
    pub(crate) fn start(
        cluster: &Cluster,
        name: &str,
        typical: Arc<TargetWorkload>,
    ) -> Result<(Learner, Box<dyn Policy>), UnknownPolicy> {
        let mut learner = Learner {
            name: name.to_string(),
            gpus_per_model: policy::gpus_per_model(cluster),
            workload: None,
        };
        let mut policy = learner.build(typical)?;
        if policy.learns_workload() {
            let workload = LearnedWorkload::cold_start(LearnConfig::default());
            policy = learner.build(workload.target())?;
            learner.workload = Some(workload);
        }
        Ok((learner, policy))
    }

    /// Learns an arrival; the policy rebuilt from the new target when it moved.
    pub(crate) fn observe(
        &mut self,
        req: &Request,
    ) -> Result<Option<Box<dyn Policy>>, UnknownPolicy> {
        let Some(w) = &mut self.workload else {
            return Ok(None);
        };
        if !w.observe(req) {
            return Ok(None);
        }
        let target = w.target();
        self.build(target).map(Some)
    }

    fn build(&self, workload: Arc<TargetWorkload>) -> Result<Box<dyn Policy>, UnknownPolicy> {
        let args = PolicyArgs {
            workload: Some(workload),
            gpus_per_model: self.gpus_per_model.clone(),
        };
        policy::by_name(&self.name, &args)
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
        let (mut fgd, _) = Learner::start(&c, "fgd", typical.clone()).unwrap();
        assert!((0..1000).all(|_| fgd.observe(&half).unwrap().is_none()));
        let (mut tessera, _) = Learner::start(&c, "tessera", typical).unwrap();
        let rebuilt = (0..1000)
            .filter(|_| tessera.observe(&half).unwrap().is_some())
            .count();
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
