//! Writing a decision: `status.allocation` and `status.reservedFor` of the
//! claim, through the `resourceclaims/status` subresource.
//!
//! The write is a JSON merge patch of only those two fields plus the claim's
//! `metadata.resourceVersion`, which the API server treats as a precondition:
//! if anyone changed the claim since we read it (another scheduler allocated
//! it, its pod went away), the answer is 409 Conflict and we re-read and decide
//! again; we never overwrite. A claim that already has an allocation is never
//! written here at all: someone else's allocation stands (and counts as used,
//! [`super::inventory::Holdings`]).
//!
//! Before its first allocation a claim gets the
//! `resource.kubernetes.io/delete-protection` finalizer, as kube-scheduler's
//! DRA plugin adds it: an update of the claim itself with the same
//! precondition, then the status patch with the version that update returned.
//! Without it a reserved claim could be deleted under its running pod, and
//! the resourceclaim controller never deallocates a claim that lacks it (its
//! GPUs would stay allocated to nobody, and preemption would free nothing).
//! A claim being deleted is never allocated (the API server refuses it too).

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::allocate::NodeAllocation;
use super::types::{
    AllocationResult, ConsumerReference, DeviceAllocationResult, DeviceRequestAllocationResult,
    ResourceClaim,
};

/// The pod a claim is reserved for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub name: String,
    pub uid: String,
}

impl PodRef {
    /// The pod as an entry of a claim's `status.reservedFor`.
    fn consumer(&self) -> ConsumerReference {
        ConsumerReference {
            api_group: None,
            resource: "pods".into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            extra: Default::default(),
        }
    }
}

/// The finalizer that keeps an allocated claim until its allocation is
/// cleared (`resourceapi.Finalizer`); the resourceclaim controller clears a
/// claim's allocation once nobody uses it only when the claim has it.
pub const DELETE_PROTECTION: &str = "resource.kubernetes.io/delete-protection";

/// Whether the claim carries [`DELETE_PROTECTION`].
pub fn is_protected(claim: &ResourceClaim) -> bool {
    claim
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == DELETE_PROTECTION))
}

/// The merge patch adding [`DELETE_PROTECTION`] to the claim's finalizers
/// (the whole list: a merge patch replaces lists), with the resourceVersion
/// precondition; `None` when it has it already.
pub fn protect_patch(claim: &ResourceClaim) -> Result<Option<Value>, WriteError> {
    if is_protected(claim) {
        return Ok(None);
    }
    let name = claim.metadata.name.clone().unwrap_or_default();
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(WriteError::Deleting { claim: name });
    }
    let rv = precondition(claim, &name)?;
    let mut finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push(DELETE_PROTECTION.to_string());
    Ok(Some(json!({
        "metadata": {"resourceVersion": rv, "finalizers": finalizers},
    })))
}

/// Adds [`DELETE_PROTECTION`] unless the claim has it: the claim as the server
/// then has it ([`Written::Allocated`] holds it, at its new resourceVersion),
/// or [`Written::Conflict`].
pub async fn protect(client: &kube::Client, claim: &ResourceClaim) -> Result<Written, WriteError> {
    let Some(patch) = protect_patch(claim)? else {
        return Ok(Written::Allocated(Box::new(claim.clone())));
    };
    patch_claim(client, claim, &patch, false).await
}

/// What the write came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// The claim as the server has it now.
    Allocated(Box<ResourceClaim>),
    /// The claim changed since it was read: read it again and decide again.
    Conflict,
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("claim {claim} is already allocated; its allocation is not rewritten")]
    AlreadyAllocated { claim: String },
    #[error("claim {claim} is reserved for 256 consumers already, the most the API allows")]
    Full { claim: String },
    #[error("claim {claim} has no {field}")]
    Incomplete { claim: String, field: &'static str },
    #[error("claim {claim} is being deleted; it is not allocated")]
    Deleting { claim: String },
    #[error("writing the allocation of claim {claim}: {source}")]
    Api {
        claim: String,
        #[source]
        source: kube::Error,
    },
    #[error("the API server's answer for claim {claim} does not read as a ResourceClaim: {source}")]
    Decode {
        claim: String,
        #[source]
        source: serde_json::Error,
    },
}

impl WriteError {
    /// Whether nothing was written: the server refused (a 4xx) or nothing was
    /// sent. Otherwise (a 5xx, a lost connection, an answer that does not
    /// read) the write may have landed, and what was assumed of it must stand
    /// until the watch shows the outcome or its deadline passes.
    pub fn nothing_written(&self) -> bool {
        match self {
            WriteError::AlreadyAllocated { .. }
            | WriteError::Full { .. }
            | WriteError::Incomplete { .. }
            | WriteError::Deleting { .. } => true,
            WriteError::Api {
                source: kube::Error::Api(s),
                ..
            } => s.code < 500,
            WriteError::Api { .. } | WriteError::Decode { .. } => false,
        }
    }
}

/// `resourceclaims` of `resource.k8s.io/v1`.
pub fn claims_resource() -> ApiResource {
    ApiResource {
        group: super::types::GROUP.into(),
        version: "v1".into(),
        api_version: super::types::API_VERSION.into(),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    }
}

/// A share's ID: a UID derived from the claim, request and device, so that a
/// retried decision writes the same one and two shares of a claim differ.
fn share_id(claim_uid: &str, request: &str, device: &str) -> String {
    let h = Sha256::digest(format!("{claim_uid}\0{request}\0{device}").as_bytes());
    let x: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    // Shaped as a version-4-like UUID (the API validates the shape).
    format!(
        "{}-{}-4{}-8{}-{}",
        &x[0..8],
        &x[8..12],
        &x[13..16],
        &x[17..20],
        &x[20..32]
    )
}

/// The `status.allocation` that records `alloc` for the claim of `claim_uid`.
pub fn allocation_result(alloc: &NodeAllocation, claim_uid: &str) -> AllocationResult {
    let results = alloc
        .results
        .iter()
        .map(|c| DeviceRequestAllocationResult {
            request: c.request.clone(),
            driver: c.device.driver.clone(),
            pool: c.device.pool.clone(),
            device: c.device.device.clone(),
            admin_access: c.admin_access.then_some(true),
            share_id: (!c.consumed.is_empty())
                .then(|| share_id(claim_uid, &c.request, &c.device.to_string())),
            consumed_capacity: c
                .consumed
                .iter()
                .map(|(k, q)| (k.clone(), q.to_string()))
                .collect(),
            extra: Default::default(),
        })
        .collect();
    let node_selector = serde_json::from_value(json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [alloc.node]}]}]}))
    .ok();
    AllocationResult {
        devices: DeviceAllocationResult {
            results,
            config: Vec::new(),
        },
        node_selector,
        extra: Default::default(),
    }
}

/// The claim's resourceVersion, which every write carries as its precondition.
fn precondition(claim: &ResourceClaim, name: &str) -> Result<String, WriteError> {
    claim
        .metadata
        .resource_version
        .clone()
        .ok_or(WriteError::Incomplete {
            claim: name.to_string(),
            field: "metadata.resourceVersion",
        })
}

/// The merge patch: the allocation, the claim's consumers plus `pod`, and the
/// resourceVersion precondition. Pure, so tests read it without a server.
pub fn status_patch(
    claim: &ResourceClaim,
    allocation: &AllocationResult,
    pod: &PodRef,
) -> Result<Value, WriteError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
    {
        return Err(WriteError::AlreadyAllocated { claim: name });
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(WriteError::Deleting { claim: name });
    }
    let rv = precondition(claim, &name)?;
    let mut reserved: Vec<ConsumerReference> = claim
        .status
        .as_ref()
        .map(|s| s.reserved_for.clone())
        .unwrap_or_default();
    if !reserved.iter().any(|r| r.uid == pod.uid) {
        reserved.push(pod.consumer());
    }
    Ok(json!({
        "metadata": {"resourceVersion": rv},
        "status": {"allocation": allocation, "reservedFor": reserved},
    }))
}

/// The merge patch that adds `pod` to an allocated claim's `reservedFor`
/// (the whole list: a merge patch replaces lists), with the resourceVersion
/// precondition. The allocation is not touched: whoever made it, it stands.
pub fn reserve_patch(claim: &ResourceClaim, pod: &PodRef) -> Result<Value, WriteError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let Some(status) = claim.status.as_ref().filter(|s| s.allocation.is_some()) else {
        return Err(WriteError::Incomplete {
            claim: name,
            field: "status.allocation",
        });
    };
    let rv = precondition(claim, &name)?;
    let mut reserved = status.reserved_for.clone();
    if !reserved.iter().any(|r| r.uid == pod.uid) {
        if reserved.len() >= super::pod::MAX_RESERVED_FOR {
            return Err(WriteError::Full { claim: name });
        }
        reserved.push(pod.consumer());
    }
    Ok(json!({
        "metadata": {"resourceVersion": rv},
        "status": {"reservedFor": reserved},
    }))
}

/// Reserves an allocated claim for `pod`, unless the claim changed since it
/// was read ([`Written::Conflict`]).
pub async fn write_reservation(
    client: &kube::Client,
    claim: &ResourceClaim,
    pod: &PodRef,
) -> Result<Written, WriteError> {
    let patch = reserve_patch(claim, pod)?;
    patch_claim_status(client, claim, &patch).await
}

/// Writes `allocation` and reserves the claim for `pod`, unless the claim
/// changed since it was read ([`Written::Conflict`]). The claim must carry
/// [`DELETE_PROTECTION`] already ([`protect`] first): refused otherwise.
pub async fn write_allocation(
    client: &kube::Client,
    claim: &ResourceClaim,
    allocation: &AllocationResult,
    pod: &PodRef,
) -> Result<Written, WriteError> {
    let patch = status_patch(claim, allocation, pod)?;
    if !is_protected(claim) {
        return Err(WriteError::Incomplete {
            claim: claim.metadata.name.clone().unwrap_or_default(),
            field: "metadata.finalizers (resource.kubernetes.io/delete-protection)",
        });
    }
    patch_claim_status(client, claim, &patch).await
}

/// Sends a merge patch to the claim's status subresource.
async fn patch_claim_status(
    client: &kube::Client,
    claim: &ResourceClaim,
    patch: &Value,
) -> Result<Written, WriteError> {
    patch_claim(client, claim, patch, true).await
}

/// Sends a merge patch to the claim (`status`: its status subresource).
async fn patch_claim(
    client: &kube::Client,
    claim: &ResourceClaim,
    patch: &Value,
    status: bool,
) -> Result<Written, WriteError> {
    let name = claim.metadata.name.clone().ok_or(WriteError::Incomplete {
        claim: String::new(),
        field: "metadata.name",
    })?;
    let ns = claim
        .metadata
        .namespace
        .clone()
        .ok_or(WriteError::Incomplete {
            claim: name.clone(),
            field: "metadata.namespace",
        })?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &claims_resource());
    let pp = PatchParams::default();
    let sent = if status {
        api.patch_status(&name, &pp, &Patch::Merge(patch)).await
    } else {
        api.patch(&name, &pp, &Patch::Merge(patch)).await
    };
    match sent {
        Ok(obj) => {
            let v = serde_json::to_value(obj).map_err(|source| WriteError::Decode {
                claim: name.clone(),
                source,
            })?;
            let c = serde_json::from_value(v).map_err(|source| WriteError::Decode {
                claim: name,
                source,
            })?;
            Ok(Written::Allocated(Box::new(c)))
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
        Err(source) => Err(WriteError::Api {
            claim: name,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_ids_are_stable_distinct_and_uuid_shaped() {
        let a = share_id("u", "r", "d/p/gpu-0");
        assert_eq!(a, share_id("u", "r", "d/p/gpu-0"));
        assert_ne!(a, share_id("u", "r", "d/p/gpu-1"));
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }
}
