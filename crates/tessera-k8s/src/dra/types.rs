//! The `resource.k8s.io/v1` objects the scheduler reads and writes
//! (protocols.md §3.3–3.5), as minimal serde structs of our own.
//!
//! The workspace's `k8s-openapi` is built for Kubernetes 1.33, which has no
//! `resource.k8s.io/v1`; as on the node side (`tessera-node`'s `dra::slice`),
//! these structs carry only what the allocator needs. Every field is optional
//! on the way in (a missing list is empty), so a claim from a newer server still
//! reads; whatever is checked is checked in [`super::claim`], with an error that
//! names the field. The scheduler writes only `status.allocation` and
//! `status.reservedFor`, by a merge patch on the status subresource
//! ([`super::write`]), so fields it does not know are never sent back; the
//! `extra` maps keep the unknown fields of the parts it does echo (an existing
//! allocation result, a consumer reference) intact.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `resource.k8s.io/v1`.
pub const API_VERSION: &str = "resource.k8s.io/v1";
/// The group every version of these kinds lives in.
pub const GROUP: &str = "resource.k8s.io";

// ---- ResourceClaim ---------------------------------------------------------------------

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClaimSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ClaimStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClaimSpec {
    #[serde(default)]
    pub devices: DeviceClaim,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceClaim {
    #[serde(default)]
    pub requests: Vec<DeviceRequest>,
    #[serde(default)]
    pub constraints: Vec<DeviceConstraint>,
    /// Opaque driver configuration: passed through, never read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<Value>,
}

/// One request: exactly one of `exactly` and `firstAvailable`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequest {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactly: Option<ExactDeviceRequest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_available: Vec<DeviceSubRequest>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactDeviceRequest {
    #[serde(default)]
    pub device_class_name: String,
    #[serde(default)]
    pub selectors: Vec<DeviceSelector>,
    /// `ExactCount` (the default) or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityRequirements>,
}

/// A `firstAvailable` alternative: an exact request without `adminAccess`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSubRequest {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub device_class_name: String,
    #[serde(default)]
    pub selectors: Vec<DeviceSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityRequirements>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<CelDeviceSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CelDeviceSelector {
    #[serde(default)]
    pub expression: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityRequirements {
    /// Capacity name → quantity.
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceToleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Exists` or `Equal` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// Exactly one of `matchAttribute` and `distinctAttribute`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceConstraint {
    #[serde(default)]
    pub requests: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_attribute: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct_attribute: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<ConsumerReference>,
    /// `devices` (written by drivers) and anything newer.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationResult {
    #[serde(default)]
    pub devices: DeviceAllocationResult,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceAllocationResult {
    #[serde(default)]
    pub results: Vec<DeviceRequestAllocationResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequestAllocationResult {
    /// `<request>` or `<request>/<subrequest>`.
    #[serde(default)]
    pub request: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
    #[serde(rename = "shareID", default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, String>,
    /// `tolerations`, `bindingConditions`, ... copied as they are.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uid: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

// ---- ResourceSlice ---------------------------------------------------------------------

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ResourceSliceSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: ResourcePool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_device_node_selection: Option<bool>,
    #[serde(default)]
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub generation: i64,
    #[serde(default)]
    pub resource_slice_count: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    #[serde(default)]
    pub capacity: BTreeMap<String, DeviceCapacity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<DeviceCounterConsumption>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<DeviceTaint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
}

/// One typed value; [`super::inventory`] checks that exactly one is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceAttribute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// List-typed values (`DRAListTypeAttributes`): kept to refuse them clearly.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCapacity {
    #[serde(default)]
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<CapacityRequestPolicy>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequestPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<CapacityRequestPolicyRange>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityRequestPolicyRange {
    #[serde(default)]
    pub min: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CounterSet {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub counters: BTreeMap<String, Counter>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counter {
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCounterConsumption {
    #[serde(default)]
    pub counter_set: String,
    #[serde(default)]
    pub counters: BTreeMap<String, Counter>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceTaint {
    #[serde(default)]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `None`, `NoSchedule` or `NoExecute`; unknown effects count as `None`.
    #[serde(default)]
    pub effect: String,
}

// ---- DeviceClass -----------------------------------------------------------------------

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: DeviceClassSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassSpec {
    #[serde(default)]
    pub selectors: Vec<DeviceSelector>,
    /// `config`, `extendedResourceName`: not read by the allocator.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A claim as the v1 API serves it. Not recorded from a server (the v1.28
    /// fixtures predate `resource.k8s.io/v1`): written from the upstream types
    /// (`k8s.io/api/resource/v1/types.go`, protocols.md §3.5).
    pub(crate) fn served_claim() -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ml", "uid": "u-1", "resourceVersion": "42"},
            "spec": {"devices": {
                "requests": [
                    {"name": "gpu", "exactly": {
                        "deviceClassName": "gpu.tessera.io",
                        "selectors": [{"cel": {"expression": "device.driver == 'gpu.tessera.io'"}}],
                        "allocationMode": "ExactCount", "count": 2,
                        "capacity": {"requests": {"memory": "20Gi"}},
                        "futureField": {"x": 1}
                    }},
                    {"name": "alt", "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu.tessera.io", "count": 1},
                        {"name": "small", "deviceClassName": "mig.tessera.io", "allocationMode": "All"}
                    ]}
                ],
                "constraints": [{"requests": ["gpu"], "matchAttribute": "gpu.tessera.io/nvlinkDomain"}],
                "config": [{"opaque": {"driver": "gpu.tessera.io", "parameters": {"a": 1}}}]
            }},
            "status": {
                "allocation": {
                    "devices": {"results": [{
                        "request": "gpu", "driver": "gpu.tessera.io", "pool": "n1", "device": "gpu-0",
                        "shareID": "s-1", "consumedCapacity": {"memory": "20Gi"},
                        "bindingConditions": ["x"]
                    }]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
                    "allocationTimestamp": "2026-12-01T00:00:00Z"
                },
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
                "devices": [{"driver": "gpu.tessera.io", "pool": "n1", "device": "gpu-0"}]
            }
        })
    }

    #[test]
    fn a_served_claim_reads_with_every_field_the_allocator_needs() {
        let c: ResourceClaim = serde_json::from_value(served_claim()).unwrap();
        let r = &c.spec.devices.requests;
        let e = r[0].exactly.as_ref().unwrap();
        assert_eq!(e.device_class_name, "gpu.tessera.io");
        assert_eq!(e.count, Some(2));
        assert_eq!(e.capacity.as_ref().unwrap().requests["memory"], "20Gi");
        assert_eq!(
            e.selectors[0].cel.as_ref().unwrap().expression,
            "device.driver == 'gpu.tessera.io'"
        );
        assert_eq!(
            r[1].first_available[1].allocation_mode.as_deref(),
            Some("All")
        );
        assert_eq!(
            c.spec.devices.constraints[0].match_attribute.as_deref(),
            Some("gpu.tessera.io/nvlinkDomain")
        );
        let st = c.status.as_ref().unwrap();
        let res = &st.allocation.as_ref().unwrap().devices.results[0];
        assert_eq!(res.share_id.as_deref(), Some("s-1"));
        assert_eq!(res.consumed_capacity["memory"], "20Gi");
        assert_eq!(st.reserved_for[0].uid, "pu");
    }

    /// What the scheduler echoes back keeps the fields it does not know.
    #[test]
    fn unknown_fields_of_echoed_parts_survive() {
        let c: ResourceClaim = serde_json::from_value(served_claim()).unwrap();
        let st = serde_json::to_value(c.status.as_ref().unwrap()).unwrap();
        let want = &served_claim()["status"];
        assert_eq!(&st, want);
    }
}
