//! The workload the `tessera` policy measures fragmentation against, learned
//! from the pods that arrive (issue 12): the core's [`PolicyInputs`] — the
//! rule the simulator's experiments follow too — fed each pod once (by UID) in
//! arrival order, rebuilt from the pods listed after a restart, and the policy
//! rebuilt whenever the learned target moves, the cluster's GPU inventory
//! changes or the GPU compute still free per model moves (the model pressure is
//! weighed against it). Policies that do not learn keep the one they were built
//! with.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use tessera_core::frag::{TargetWorkload, TypicalPod};
use tessera_core::ledger::Ledger;
use tessera_core::model::{Catalog, Cluster, ModelId};
use tessera_core::policy::tessera::model_pressure;
use tessera_core::policy::{self, PolicyArgs, PolicyInputs};
use tessera_core::request::GpuAsk;
use tessera_core::workload::{LearnConfig, LearnedWorkload};

use super::Mirror;
use crate::convert;

/// What the mirror learns from.
pub struct Learning {
    /// The learned workload and the free GPU supply the policy was last built from.
    inputs: PolicyInputs,
    /// Pods already learned (each once, whatever relists show them again).
    seen: HashSet<String>,
}

impl Default for Learning {
    /// The cold-start prior, on no cluster yet.
    fn default() -> Learning {
        let cluster = Cluster::default();
        Learning {
            inputs: PolicyInputs::learning(
                LearnedWorkload::cold_start(LearnConfig::default()),
                &cluster,
                &Ledger::new(&cluster),
            ),
            seen: HashSet::new(),
        }
    }
}

impl Learning {
    /// The learned workload (always there: the inputs are made learning).
    fn workload(&self) -> Option<&LearnedWorkload> {
        self.inputs.learned()
    }
}

impl Mirror {
    /// Learns `pods` not seen before, oldest first; rebuilds the policy if the
    /// target moved. Pods that are gone are forgotten by UID only: what ran
    /// stays in the histogram, as its decay intends.
    ///
    /// A GPU pod is learned when first seen (its arrival). A pod without GPUs
    /// is learned once it is bound to a node with a GPU inventory, where it
    /// takes CPU and memory GPU pods need (the simulator's workloads hold such
    /// pods too); until then it is not marked seen, and one on a node without
    /// GPUs never is.
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
            let req = match convert::pod_request(p, &self.cluster.catalog) {
                Ok(req) if req.gpu == GpuAsk::None => {
                    let on_gpus =
                        convert::pod_node(p).is_some_and(|n| self.inventory.contains_key(n));
                    if !on_gpus {
                        continue;
                    }
                    req
                }
                Ok(req) => req,
                Err(_) => {
                    self.learning.seen.insert(convert::pod_uid(p).to_string());
                    continue;
                }
            };
            self.learning.seen.insert(convert::pod_uid(p).to_string());
            moved |= self.learning.inputs.learn(&req);
        }
        if moved {
            self.rebuild_policy();
        }
    }

    /// Learns a pod whose GPUs come from DRA claims, once by UID, at its first
    /// decision (its arrival, as for other GPU pods): its CPU and memory with
    /// `gpu`, what its claims ask ([`crate::dra::pod::learned_ask`]). A pod
    /// whose claims ask nothing the core models (`GpuAsk::None`) is not learned.
    pub fn learn_claim_pod(&mut self, pod: &Pod, gpu: GpuAsk) {
        if !self.policy.learns_workload() || gpu == GpuAsk::None {
            return;
        }
        let uid = convert::pod_uid(pod);
        if self.learning.seen.contains(uid) {
            return;
        }
        self.learning.seen.insert(uid.to_string());
        let Ok(mut req) = convert::pod_request(pod, &self.cluster.catalog) else {
            return;
        };
        req.gpu = gpu;
        if self.learning.inputs.learn(&req) {
            self.rebuild_policy();
        }
    }

    /// Learns the pods that were waiting for their node's GPU inventory: not
    /// learned yet, bound to a node that has one now.
    pub(super) fn learn_waiting(&mut self) {
        if !self.policy.learns_workload() {
            return;
        }
        let waiting: Vec<Pod> = self
            .pods
            .iter()
            .filter(|(uid, p)| {
                !self.learning.seen.contains(*uid)
                    && convert::pod_node(p).is_some_and(|n| self.inventory.contains_key(n))
            })
            .map(|(_, p)| p.clone())
            .collect();
        self.learn_pods(waiting.iter());
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

    /// Builds the policy again from the learned target and the GPU compute free
    /// now, dropping every cached verdict (they were scored by the old one).
    pub(super) fn rebuild_policy(&mut self) {
        if !self.policy.learns_workload() {
            return;
        }
        self.learning
            .inputs
            .retake_supply(&self.cluster, &self.ledger);
        let name = self.policy.name();
        match self.learning.inputs.build(|a| policy::by_name(name, &a)) {
            Ok(p) => {
                self.policy = p;
                self.verdicts.clear();
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not rebuild the policy; keeping the old one")
            }
        }
    }

    /// Rebuilds a learning policy once the free GPU supply has moved from the one
    /// it was built from by a step ([`PolicyInputs::supply_moved`]).
    pub(super) fn follow_supply(&mut self) {
        if !self.policy.learns_workload() {
            return;
        }
        if self.learning.inputs.supply_moved(&self.ledger) {
            self.rebuild_policy();
        }
    }

    /// The free GPU compute per model a learning policy weighs the constrained
    /// demand against (as of its last build); the inventory for one that does not
    /// learn.
    pub fn model_supply(&self) -> Vec<u32> {
        if self.policy.learns_workload() {
            self.learning.inputs.supply().to_vec()
        } else {
            policy::gpus_per_model(&self.cluster)
        }
    }

    /// A policy that scores as the scheduler's own does now (built from the same
    /// learned target and inventory; a policy that does not learn from its
    /// defaults), for the planners that need one of their own: preemption's
    /// placement of the preemptor. `binpack` if the name no longer resolves.
    pub fn policy_copy(&self) -> Box<dyn policy::Policy> {
        let args = if self.policy.learns_workload() {
            self.learning.inputs.args()
        } else {
            PolicyArgs::default()
        };
        policy::by_name(self.policy.name(), &args)
            .or_else(|_| policy::by_name("binpack", &PolicyArgs::default()))
            .unwrap_or_else(|e| unreachable!("built-in policy: {e}"))
    }

    /// The learned workload: how many pods it has learned and how often its
    /// target moved.
    pub fn learned(&self) -> (u64, u64) {
        (
            self.learning
                .workload()
                .map_or(0, LearnedWorkload::arrivals),
            self.learning
                .workload()
                .map_or(0, LearnedWorkload::generation),
        )
    }

    /// The workload the policy measures fragmentation against: the learned target
    /// where the policy learns, else the built-in one it was made with. Metrics, the
    /// web view and `kubectl tessera top` measure against the same, so the fragment
    /// they show is the one the scheduler minimises.
    pub fn target_workload(&self) -> Arc<TargetWorkload> {
        if self.policy.learns_workload() {
            self.learning.inputs.target()
        } else {
            Arc::new(TargetWorkload::builtin())
        }
    }

    /// What `tessera explain` and the metrics say of the target workload.
    pub fn workload_report(&mut self) -> WorkloadReport {
        self.refresh();
        let target = self.target_workload();
        let catalog = &self.cluster.catalog;
        let mut shapes: Vec<&TypicalPod> = target.pods.iter().collect();
        shapes.sort_by(|a, b| b.weight.total_cmp(&a.weight));
        let pressure = model_pressure(&target, &self.model_supply())
            .into_iter()
            .enumerate()
            .filter(|&(_, p)| p > 0.0)
            .map(|(m, p)| (catalog.spec(ModelId(m as u8)).name.clone(), p))
            .collect();
        WorkloadReport {
            learned: self.policy.learns_workload(),
            pods_learned: self
                .learning
                .workload()
                .map_or(0, LearnedWorkload::arrivals),
            generation: self
                .learning
                .workload()
                .map_or(0, LearnedWorkload::generation),
            prior_pods: self
                .learning
                .workload()
                .map_or(0.0, |w| w.config().prior_mass),
            shapes: target.pods.len(),
            top: shapes
                .into_iter()
                .take(WorkloadReport::TOP)
                .map(|p| Shape::of(p, catalog))
                .collect(),
            pressure,
        }
    }
}

/// The target workload as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    /// Learned from the pods that arrived (else the built-in openb-derived one).
    pub learned: bool,
    /// Pods learned since the scheduler started (after a restart: the pods listed).
    pub pods_learned: u64,
    /// How often the target moved enough to rebuild the policy.
    pub generation: u64,
    /// Weight of the cold-start prior, in pods (learned pods outweigh it as they come).
    pub prior_pods: f64,
    /// Shapes in the target.
    pub shapes: usize,
    /// The heaviest shapes, heaviest first.
    pub top: Vec<Shape>,
    /// Model pressure (the share of a model's GPUs that model-constrained shapes
    /// need, against the average): models above 0 only.
    pub pressure: BTreeMap<String, f64>,
}

impl WorkloadReport {
    /// Shapes listed in `top`.
    pub const TOP: usize = 8;
}

/// One shape of the target workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    pub gpus: u32,
    /// Milli-GPU asked of each GPU.
    pub gpu_milli: u32,
    pub cpu_milli: u64,
    /// The models it may use; empty: any.
    pub models: Vec<String>,
    /// Its weight in the target (the weights sum to 1).
    pub weight: f64,
    /// In words, as `tessera explain` and the web view show it: `2 GPU, 8 CPU`,
    /// `500m of a GPU on V100-32GB, 4 CPU`, `no GPU, 12 CPU`.
    pub text: String,
}

impl Shape {
    fn of(p: &TypicalPod, catalog: &Catalog) -> Shape {
        let ids = (0..catalog.specs().len()).map(|i| ModelId(i as u8));
        let models = if ids.clone().all(|m| p.models.contains(m)) {
            Vec::new()
        } else {
            ids.filter(|&m| p.models.contains(m))
                .map(|m| catalog.spec(m).name.clone())
                .collect()
        };
        let gpu = match p.gpus {
            0 => "no GPU".to_string(),
            1 if p.milli < 1000 => format!("{}m of a GPU", p.milli),
            n => format!("{n} GPU"),
        };
        let on = if models.is_empty() {
            String::new()
        } else {
            format!(" on {}", models.join("|"))
        };
        Shape {
            gpus: p.gpus,
            gpu_milli: p.milli,
            cpu_milli: p.cpu_milli,
            text: format!("{gpu}{on}, {} CPU", p.cpu_milli as f64 / 1000.0),
            models,
            weight: p.weight,
        }
    }
}

impl std::fmt::Display for WorkloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.learned {
            write!(
                f,
                "fragment measured against the workload learned from {} pod(s) on a cold-start prior of {} ({} shape(s), rebuilt {} time(s))",
                self.pods_learned, self.prior_pods, self.shapes, self.generation
            )?;
        } else {
            write!(
                f,
                "fragment measured against the built-in workload ({} shape(s))",
                self.shapes
            )?;
        }
        if !self.top.is_empty() {
            let top: Vec<String> = self
                .top
                .iter()
                .map(|s| format!("{} {:.1}%", s.text, s.weight * 100.0))
                .collect();
            write!(f, "\n  heaviest shapes: {}", top.join("; "))?;
        }
        if !self.pressure.is_empty() {
            let p: Vec<String> = self
                .pressure
                .iter()
                .map(|(m, p)| format!("{m} {p:.2}"))
                .collect();
            write!(
                f,
                "\n  model pressure (unconstrained pods pay to use these): {}",
                p.join(", ")
            )?;
        }
        Ok(())
    }
}
