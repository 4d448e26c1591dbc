//! Tessera as a Kueue admission-check controller: the worker-cluster side of
//! MultiKueue (and of a single Kueue cluster).
//!
//! Kueue counts GPUs as integers against a ClusterQueue's quota, so a
//! cluster with quota left but its GPUs fragmented (a share taken on every
//! GPU, or 8 free GPUs spread over 4 nodes) admits an 8-GPU job it cannot
//! place, and a MultiKueue manager, which keeps the first worker to admit,
//! sends the job there. With an `AdmissionCheck` whose
//! `spec.controllerName` is [`CONTROLLER_NAME`] on the worker's ClusterQueue,
//! Kueue reserves quota and then waits for this controller: for every podSet
//! (template and count) of the workload it asks the placement judge how many
//! pods fit now, all podSets together ([`check`]), and sets the check
//! `Ready` or leaves it `Pending` with a message naming what does not fit.
//!
//! The process keeps its own mirror of the cluster, fed by the scheduler's
//! watchers ([`crate::run::watch_placement_state`]) under their sync gate,
//! and verifies the pods' signed grants with the scheduler's key, as
//! `tessera estimator` does; it watches `Workload`s and `AdmissionCheck`s
//! besides ([`controller`]). Nothing is written before every list is in.
//! Every write is a merge patch of the status subresource carrying the
//! object's `resourceVersion`: on a 409 the object is read again and judged
//! afresh, never overwritten.
//!
//! Quota is Kueue's: the pods of an admitted workload carry Kueue's label
//! [`PODSET_LABEL`] (set on the job's pod template when Kueue starts it,
//! `pkg/controller/jobframework/reconciler.go` at v0.19.2), and a scheduler
//! started with `--trust-kueue-admission` lets such pods past its own
//! `GpuQueue` quota gate while still counting them in their queue's usage
//! ([`admitted_by_kueue`], [`crate::mirror::Mirror::set_trust_kueue`]).
//!
//! API shapes: Kueue v0.19.2, `kueue.x-k8s.io/v1beta1` ([`api`]).

pub mod api;
pub mod check;
pub mod controller;

use k8s_openapi::api::core::v1::Pod;

/// The `spec.controllerName` of the AdmissionChecks this controller answers.
pub const CONTROLLER_NAME: &str = "tessera.io/placement";

/// Kueue's label on the pods of an admitted workload: the podSet they belong
/// to (`pkg/constants/constants.go`, `PodSetLabel`, v0.19.2). Set when Kueue
/// starts the job, removed when it stops it.
pub const PODSET_LABEL: &str = "kueue.x-k8s.io/podset";

/// Kueue's annotation naming the admitted workload on its pods (set with
/// topology-aware scheduling on; `apis/kueue/v1beta1/topology_types.go`).
pub const WORKLOAD_ANNOTATION: &str = "kueue.x-k8s.io/workload";

/// Whether `pod` belongs to a workload Kueue admitted: it carries
/// [`PODSET_LABEL`], which Kueue sets only when it starts an admitted job.
/// Any pod can carry a label, so the scheduler trusts it only when told to
/// (`--trust-kueue-admission`), where Kueue manages the namespaces.
pub fn admitted_by_kueue(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PODSET_LABEL))
        .is_some_and(|v| !v.is_empty())
}
