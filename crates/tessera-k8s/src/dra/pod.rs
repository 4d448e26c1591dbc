//! Which `ResourceClaim`s a pod uses, and what must happen to each before the
//! pod may be bound. Pure: the pod and a claim lookup in, steps or a reason out.
//!
//! A claim already allocated, by Tessera or anyone else, is respected as it
//! is: its node selector constrains the pod's node, and the pod is only added
//! to its `reservedFor`. An unallocated claim is Tessera's to allocate only
//! when every device class its requests name is one of ours
//! ([`is_our_class`]); a pod that needs another driver's claim allocated is
//! refused with a reason naming the claim, since allocating another driver's
//! devices would hand out what that driver's scheduler also hands out.

use k8s_openapi::api::core::v1::Pod;
use tessera_core::request::{GpuAsk, GpuMemory};

use super::choose::mib;
use super::claim::{ClaimAsk, ClaimError, Mode};
use super::types::{ClaimSpec, DeviceClass, ResourceClaim};
use super::{CLASS_GPU, CLASS_MIG, DRIVER};

/// `ResourceClaimReservedForMaxSize` (protocols.md §3.2).
pub const MAX_RESERVED_FOR: usize = 256;

/// What one claim of the pod still needs.
#[derive(Debug)]
pub enum Step {
    /// Allocated and reserved for the pod: nothing to write.
    Ready,
    /// Allocated (by anyone), not yet reserved for the pod: add it to `reservedFor`.
    Reserve,
    /// Not allocated: Tessera allocates it (the checked claim).
    Allocate(ClaimAsk),
}

/// One claim the pod uses.
#[derive(Debug)]
pub struct PodClaim {
    /// `namespace/name` of the claim, for messages.
    pub key: String,
    /// The claim as read (its `resourceVersion` is the write's precondition).
    pub claim: ResourceClaim,
    pub step: Step,
}

/// Why the pod cannot be placed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Something else must happen first (the resourceclaim controller creating
    /// the claim, its list arriving); retried.
    Wait(String),
    /// A claim is malformed or needs what Tessera does not allocate; retried
    /// with backoff, in case the objects change.
    Refuse(String),
}

impl NotReady {
    pub fn message(&self) -> &str {
        match self {
            NotReady::Wait(m) | NotReady::Refuse(m) => m,
        }
    }
}

/// Whether the pod uses DRA claims at all.
pub fn uses_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// Whether Tessera allocates devices of class `name`: the chart's classes, or a
/// class one of whose selectors compares `device.driver` with our driver's
/// name. A class that selects devices some other way may match other
/// drivers' devices, which are not ours to hand out.
pub fn is_our_class(name: &str, classes: &[DeviceClass]) -> bool {
    if name == CLASS_GPU || name == CLASS_MIG {
        return true;
    }
    let quoted = [format!("'{DRIVER}'"), format!("\"{DRIVER}\"")];
    classes
        .iter()
        .filter(|c| c.metadata.name.as_deref() == Some(name))
        .flat_map(|c| &c.spec.selectors)
        .filter_map(|s| s.cel.as_ref())
        .any(|cel| {
            let e = cel.expression.as_str();
            e.contains("device.driver") && quoted.iter().any(|q| e.contains(q.as_str()))
        })
}

/// The device classes an unallocated claim's requests name, in order.
fn classes_named(claim: &ResourceClaim) -> Vec<&str> {
    classes_of(&claim.spec)
}

/// The device classes a claim spec's requests name, `firstAvailable`
/// alternatives too, in order.
pub fn classes_of(spec: &ClaimSpec) -> Vec<&str> {
    let mut v = Vec::new();
    for r in &spec.devices.requests {
        if let Some(e) = &r.exactly {
            v.push(e.device_class_name.as_str());
        }
        v.extend(
            r.first_available
                .iter()
                .map(|s| s.device_class_name.as_str()),
        );
    }
    v
}

fn reserved_for(claim: &ResourceClaim, pod_uid: &str) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.reserved_for.iter().any(|r| r.uid == pod_uid))
}

/// The claims `pod` uses, each with its step; `lookup(namespace, name)` finds a
/// claim as this scheduler sees it (the watch, plus its own writes not yet
/// shown; `Err` for one that did not read).
pub fn pod_claims<'a>(
    pod: &Pod,
    lookup: impl Fn(&str, &str) -> Option<Result<&'a ResourceClaim, &'a str>>,
    classes: &[DeviceClass],
) -> Result<Vec<PodClaim>, NotReady> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let entries = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    let mut out = Vec::new();
    for entry in entries {
        let (name, template) = match (
            &entry.resource_claim_name,
            &entry.resource_claim_template_name,
        ) {
            (Some(n), None) => (n.clone(), None),
            (None, Some(t)) => match statuses.iter().find(|s| s.name == entry.name) {
                // The controller decided no claim is needed for this entry.
                Some(s) if s.resource_claim_name.is_none() => continue,
                Some(s) => (s.resource_claim_name.clone().unwrap_or_default(), Some(t)),
                None => {
                    return Err(NotReady::Wait(format!(
                        "waiting for the ResourceClaim of template {ns}/{t} (pod.spec.resourceClaims entry {:?}): pod.status.resourceClaimStatuses does not name it yet",
                        entry.name
                    )));
                }
            },
            _ => {
                return Err(NotReady::Refuse(format!(
                    "pod.spec.resourceClaims entry {:?}: exactly one of resourceClaimName and resourceClaimTemplateName must be set",
                    entry.name
                )));
            }
        };
        let key = format!("{ns}/{name}");
        let claim = match lookup(ns, &name) {
            None => {
                return Err(NotReady::Wait(format!(
                    "waiting for ResourceClaim {key}, which does not exist (yet)"
                )));
            }
            Some(Err(why)) => {
                return Err(NotReady::Refuse(format!(
                    "ResourceClaim {key} does not read: {why}"
                )));
            }
            Some(Ok(c)) => c,
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(NotReady::Wait(format!(
                "ResourceClaim {key} is being deleted"
            )));
        }
        if let Some(t) = template {
            let owned = claim
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == pod_uid);
            if !owned {
                return Err(NotReady::Wait(format!(
                    "ResourceClaim {key} (from template {t}) is not owned by this pod"
                )));
            }
        }
        let allocated = claim
            .status
            .as_ref()
            .is_some_and(|s| s.allocation.is_some());
        let step = if allocated && reserved_for(claim, pod_uid) {
            Step::Ready
        } else if allocated {
            let n = claim.status.as_ref().map_or(0, |s| s.reserved_for.len());
            if n >= MAX_RESERVED_FOR {
                return Err(NotReady::Wait(format!(
                    "ResourceClaim {key} is reserved for {n} consumers, the most the API allows"
                )));
            }
            Step::Reserve
        } else {
            if let Some(other) = classes_named(claim)
                .into_iter()
                .find(|c| !is_our_class(c, classes))
            {
                return Err(NotReady::Refuse(format!(
                    "ResourceClaim {key} asks device class {other:?}, which is not of driver {DRIVER}: Tessera allocates only its own devices (allocate the claim another way first, or let kube-scheduler place the pod)"
                )));
            }
            let ask = ClaimAsk::resolve(claim, classes)
                .map_err(|e: ClaimError| NotReady::Refuse(format!("ResourceClaim {key}: {e}")))?;
            Step::Allocate(ask)
        };
        out.push(PodClaim {
            key,
            claim: claim.clone(),
            step,
        });
    }
    Ok(out)
}

/// What the claims Tessera is to allocate ask of GPUs, as a core [`GpuAsk`],
/// for the workload the policy learns (a DRA pod's GPUs are in its claims, not
/// in its resources): whole GPUs of [`CLASS_GPU`] (counts summed), or one
/// share of one (memory and per-mille compute asked as consumable capacity).
/// `GpuAsk::None` for anything else (MIG profiles, `All`, other classes,
/// shares mixed with more): such a pod is learned by its CPU and memory only.
pub fn learned_ask(claims: &[PodClaim]) -> GpuAsk {
    let mut whole = 0u32;
    let mut shares = Vec::new();
    for c in claims {
        let Step::Allocate(ask) = &c.step else {
            continue;
        };
        for r in &ask.requests {
            let Some(alt) = r.alternatives.first() else {
                continue;
            };
            let Mode::Count(n) = alt.mode else {
                return GpuAsk::None;
            };
            if alt.class != CLASS_GPU {
                return GpuAsk::None;
            }
            if alt.capacity.is_empty() {
                whole = whole.saturating_add(n);
                continue;
            }
            let memory = alt.capacity.get("memory").map(|q| mib(*q));
            let compute = alt
                .capacity
                .get("compute")
                .map(|q| q.nano() / 1_000_000_000);
            match (memory, compute) {
                (Some(m), Some(c)) if n == 1 && (1..1000).contains(&c) => {
                    shares.push((m, c as u32));
                }
                _ => return GpuAsk::None,
            }
        }
    }
    match (whole, shares.as_slice()) {
        (0, []) => GpuAsk::None,
        (n, []) => GpuAsk::Whole { count: n },
        (0, [(memory, cores)]) => GpuAsk::Shared {
            count: 1,
            memory: GpuMemory::Mib(*memory),
            cores_milli: *cores,
        },
        _ => GpuAsk::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn classes() -> Vec<DeviceClass> {
        serde_json::from_value(json!([
            {"metadata": {"name": "gpu.tessera.io"}, "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.tessera.io'"}}]}},
            {"metadata": {"name": "mine"}, "spec": {"selectors": [{"cel": {"expression":
                "device.driver == \"gpu.tessera.io\" && device.attributes['gpu.tessera.io'].numa == 0"}}]}},
            {"metadata": {"name": "theirs"}, "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.nvidia.com'"}}]}},
            {"metadata": {"name": "anything"}, "spec": {}}
        ]))
        .unwrap()
    }

    fn claim(name: &str, class: &str, status: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("cu-{name}"),
                "resourceVersion": "5",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pu"}]},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class}}]}},
            "status": status
        }))
        .unwrap()
    }

    fn pod(entries: serde_json::Value, statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "pu"},
            "spec": {"containers": [], "resourceClaims": entries},
            "status": {"resourceClaimStatuses": statuses}
        }))
        .unwrap()
    }

    #[test]
    fn classes_are_ours_by_name_or_by_a_driver_comparison() {
        let c = classes();
        assert!(is_our_class("gpu.tessera.io", &c));
        assert!(is_our_class(CLASS_MIG, &c));
        assert!(is_our_class("mine", &c));
        assert!(!is_our_class("theirs", &c));
        // Selects every driver's devices: not ours to allocate.
        assert!(!is_our_class("anything", &c));
        assert!(!is_our_class("missing", &c));
    }

    /// Each pod/claim situation and the step or reason it gives.
    #[test]
    fn steps_and_reasons() {
        let allocated = json!({"allocation": {"devices": {"results": []}},
            "reservedFor": [{"resource": "pods", "name": "q", "uid": "qu"}]});
        let mine = json!({"allocation": {"devices": {"results": []}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}]});
        let claims = [
            claim("free", "mine", json!(null)),
            claim("shared", "theirs", allocated),
            claim("ready", "theirs", mine),
            claim("nv", "theirs", json!(null)),
            claim("bad", "gpu.tessera.io", json!(null)),
        ];
        let mut bad = claims[4].clone();
        bad.spec.devices.requests[0].exactly.as_mut().unwrap().count = Some(0);
        let all: Vec<ResourceClaim> = claims[..4].iter().cloned().chain([bad]).collect();
        let lookup = |_: &str, n: &str| {
            all.iter()
                .find(|c| c.metadata.name.as_deref() == Some(n))
                .map(Ok)
        };
        let steps = |p: &Pod| pod_claims(p, lookup, &classes());
        let direct = |names: &[&str]| {
            pod(
                serde_json::Value::Array(
                    names
                        .iter()
                        .map(|n| json!({"name": format!("e-{n}"), "resourceClaimName": n}))
                        .collect(),
                ),
                json!([]),
            )
        };
        let got = steps(&direct(&["free", "shared", "ready"])).unwrap();
        assert!(matches!(got[0].step, Step::Allocate(_)));
        assert!(matches!(got[1].step, Step::Reserve));
        assert!(matches!(got[2].step, Step::Ready));
        assert_eq!(got[1].key, "ml/shared");
        let refuse = |names: &[&str]| match steps(&direct(names)) {
            Err(NotReady::Refuse(m)) => m,
            other => panic!("{names:?}: {other:?}"),
        };
        assert!(refuse(&["nv"]).contains("ResourceClaim ml/nv asks device class \"theirs\""));
        assert!(refuse(&["bad"]).contains("ml/bad: spec.devices.requests[0].exactly.count"));
        let wait = |p: &Pod| match steps(p) {
            Err(NotReady::Wait(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(wait(&direct(&["gone"])).contains("ml/gone, which does not exist"));
        let templated = |statuses| {
            pod(
                json!([{"name": "g", "resourceClaimTemplateName": "t"}]),
                statuses,
            )
        };
        assert!(wait(&templated(json!([]))).contains("resourceClaimStatuses"));
        let named = steps(&templated(
            json!([{"name": "g", "resourceClaimName": "free"}]),
        ))
        .unwrap();
        assert_eq!(named[0].key, "ml/free");
        // No claim was needed for the entry.
        assert!(
            steps(&templated(json!([{"name": "g"}])))
                .unwrap()
                .is_empty()
        );
        let mut stranger = templated(json!([{"name": "g", "resourceClaimName": "free"}]));
        stranger.metadata.uid = Some("other".into());
        assert!(wait(&stranger).contains("not owned by this pod"));
    }
}
