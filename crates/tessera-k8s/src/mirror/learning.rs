//! The workload the `tessera` policy measures fragmentation against, learned
//! from the pods that arrive (issue 12): the core's [`LearnedWorkload`], fed
//! each pod once (by UID) in arrival order, rebuilt from the pods listed after
//! a restart, and the policy rebuilt whenever the learned target moves or the
//! cluster's GPU inventory changes. Policies that do not learn keep the one
//! they were built with.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;
use tessera_core::policy::{self, PolicyArgs};
use tessera_core::request::GpuAsk;
use tessera_core::workload::{LearnConfig, LearnedWorkload};

use super::Mirror;
use crate::convert;

/// What the mirror learns from.
pub struct Learning {
    pub(super) workload: LearnedWorkload,
    /// Pods already learned (each once, whatever relists show them again).
    seen: HashSet<String>,
}

impl Default for Learning {
    fn default() -> Learning {
        Learning {
            workload: LearnedWorkload::cold_start(LearnConfig::default()),
            seen: HashSet::new(),
        }
    }
}

impl Mirror {
    /// Learns `pods` not seen before, oldest first; rebuilds the policy if the
    /// target moved. Pods that are gone are forgotten by UID only: what ran
    /// stays in the histogram, as its decay intends.
    pub(super) fn learn_pods<'a>(&mut self, pods: impl IntoIterator<Item = &'a Pod>) {
        if !self.policy.learns_workload() {
            return;
        }
        let mut new: Vec<&Pod> = pods
            .into_iter()
            .filter(|p| !self.learning.seen.contains(convert::pod_uid(p)))
            .collect();
        new.sort_by(|a, b| {
            (
                a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                convert::pod_uid(a),
            )
                .cmp(&(
                    b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    convert::pod_uid(b),
                ))
        });
        let mut moved = false;
        for p in new {
            self.learning.seen.insert(convert::pod_uid(p).to_string());
            match convert::pod_request(p, &self.cluster.catalog) {
                Ok(req) if req.gpu != GpuAsk::None => moved |= self.learning.workload.observe(&req),
                _ => {}
            }
        }
        if moved {
            self.rebuild_policy();
        }
    }

    /// A pod left: its UID need not be remembered (what it asked stays learned).
    pub(super) fn unsee(&mut self, uid: &str) {
        self.learning.seen.remove(uid);
    }

    /// Drops UIDs of pods no longer in the cluster from the seen set.
    pub(super) fn forget_gone(&mut self) {
        let pods = &self.pods;
        self.learning.seen.retain(|uid| pods.contains_key(uid));
    }

    /// Builds the policy again from the learned target and the GPU inventory,
    /// dropping every cached verdict (they were scored by the old one).
    pub(super) fn rebuild_policy(&mut self) {
        if !self.policy.learns_workload() {
            return;
        }
        let args = PolicyArgs {
            workload: Some(self.learning.workload.target()),
            gpus_per_model: policy::gpus_per_model(&self.cluster),
        };
        match policy::by_name(self.policy.name(), &args) {
            Ok(p) => {
                self.policy = p;
                self.verdicts.clear();
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not rebuild the policy; keeping the old one")
            }
        }
    }

    /// The learned workload: how many pods it has learned and how often its
    /// target moved.
    pub fn learned(&self) -> (u64, u64) {
        (
            self.learning.workload.arrivals(),
            self.learning.workload.generation(),
        )
    }
}
