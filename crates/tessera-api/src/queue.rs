//! `GpuQueue`: one team's (or department's) entitlement to the fleet.
//!
//! Cluster-scoped. Queues form a tree through `spec.parent`. Quotas are in
//! *GPU-equivalents* (`gpus`: a GPU counts its model's factor, set in the
//! scheduler's configuration; a share or MIG instance counts the larger of its
//! memory and compute fractions), CPU and memory, written as Kubernetes
//! quantities (`"2.5"`, `"500m"`, `"768Gi"`). A namespace joins a queue with the
//! label `tessera.io/queue`; a pod may name another queue with the annotation
//! `tessera.io/queue` only if its namespace's annotation `tessera.io/queues`
//! lists that queue.
//!
//! `spec` is written by operators; `status` by the scheduler (what the queue
//! holds and deserves now), for `kubectl get gpuqueues`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on a namespace: the queue its pods belong to.
pub const QUEUE_LABEL: &str = "tessera.io/queue";
/// Annotation on a pod: the queue it asks for (allowed by its namespace's [`ALLOWED_QUEUES`]).
pub const QUEUE_ANNOTATION: &str = "tessera.io/queue";
/// Annotation on a namespace: queues, comma separated, its pods may name.
pub const ALLOWED_QUEUES: &str = "tessera.io/queues";

/// A queue: guaranteed quota, limit, weight, lending and borrowing.
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default,
)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    kind = "GpuQueue",
    plural = "gpuqueues",
    singular = "gpuqueue",
    shortname = "gq",
    category = "tessera",
    status = "GpuQueueStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A Tessera queue: guaranteed quota, limit and weight in GPU-equivalents, CPU and memory; namespaces join it with the label tessera.io/queue.",
    printcolumn = r#"{"name":"Parent","type":"string","jsonPath":".spec.parent","description":"Parent queue"}"#,
    printcolumn = r#"{"name":"Guaranteed GPUs","type":"string","jsonPath":".spec.guaranteed.gpus","description":"Guaranteed GPU-equivalents"}"#,
    printcolumn = r#"{"name":"Limit GPUs","type":"string","jsonPath":".spec.limit.gpus","description":"GPU-equivalents never exceeded"}"#,
    printcolumn = r#"{"name":"Allocated GPUs","type":"string","jsonPath":".status.allocated.gpus","description":"GPU-equivalents its pods hold now"}"#,
    printcolumn = r#"{"name":"Deserved GPUs","type":"string","jsonPath":".status.deserved.gpus","description":"Its fair share now"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pendingPods","description":"Pods waiting"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuQueueSpec {
    /// The parent queue's name; none for a top-level queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Always available to the queue when it has pods to run.
    #[serde(default)]
    pub guaranteed: QueueResources,
    /// Never exceeded, borrowing included; unset fields are unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<QueueResources>,
    /// Share of unused quota relative to sibling queues (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Lend unused guaranteed quota to other queues (reclaimed when needed; default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lend: Option<bool>,
    /// Borrow quota other queues do not use (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow: Option<bool>,
}

/// Amounts as Kubernetes quantities.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct QueueResources {
    /// GPU-equivalents, e.g. `"8"` or `"2.5"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<String>,
    /// CPU, e.g. `"96"` or `"500m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory, e.g. `"768Gi"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

/// What the scheduler last saw of the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuQueueStatus {
    /// What its pods hold now.
    #[serde(default)]
    pub allocated: QueueResources,
    /// Its fair share now, given everyone's demand.
    #[serde(default)]
    pub deserved: QueueResources,
    /// Held beyond its guarantee (reclaimable).
    #[serde(default)]
    pub borrowed: QueueResources,
    /// Pods waiting for a node.
    #[serde(default)]
    pub pending_pods: u32,
    /// Why the queue's spec was not accepted, if it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn wire_names_and_crd() {
        let q = GpuQueue::new(
            "research",
            GpuQueueSpec {
                parent: Some("org".into()),
                guaranteed: QueueResources {
                    gpus: Some("2.5".into()),
                    cpu: Some("96".into()),
                    memory: Some("768Gi".into()),
                },
                limit: None,
                weight: Some(2),
                lend: Some(false),
                borrow: None,
            },
        );
        let v = serde_json::to_value(&q).unwrap();
        assert_eq!(v["kind"], "GpuQueue");
        assert_eq!(v["spec"]["guaranteed"]["gpus"], "2.5");
        assert_eq!(v["spec"]["lend"], false);
        assert!(v["spec"].get("borrow").is_none());
        let crd = GpuQueue::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("gpuqueues.tessera.io"));
        assert_eq!(crd.spec.scope, "Cluster");
        let cols = crd.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .len();
        assert_eq!(cols, 7);
    }
}
