//! `PodGroup` (`scheduling.x-k8s.io/v1alpha1`), the gang object of the
//! Kubernetes scheduler-plugins project, read so that manifests written for its
//! coscheduling plugin work with Tessera unchanged. Tessera reads `spec` only;
//! its CRD is scheduler-plugins' (not shipped in Tessera's chart).
//!
//! Pods join a group with the label [`POD_GROUP_LABEL`] naming a `PodGroup` in
//! their namespace.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on a pod: the `PodGroup` (same namespace) it belongs to.
pub const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// A gang: at least `minMember` pods run together or none do.
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default,
)]
#[kube(
    group = "scheduling.x-k8s.io",
    version = "v1alpha1",
    kind = "PodGroup",
    plural = "podgroups",
    namespaced,
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// Pods that must be placed together (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_member: Option<i32>,
    /// How long members may wait for the rest before the wait is reported as timed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_timeout_seconds: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_scheduler_plugins_manifest() {
        let v = serde_json::json!({
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"minMember": 4, "scheduleTimeoutSeconds": 300,
                     "minResources": {"cpu": "8"}},
            "status": {"phase": "Pending"}
        });
        let pg: PodGroup = serde_json::from_value(v).unwrap();
        assert_eq!(pg.spec.min_member, Some(4));
        assert_eq!(pg.spec.schedule_timeout_seconds, Some(300));
    }
}
