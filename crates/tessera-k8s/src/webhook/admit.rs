//! The verdicts: [`validate`] (allow or deny) and [`mutate`] (our schedulerName).
//!
//! Which pods are Tessera's to judge: those that [`claims_tessera`] and those
//! that already carry a schedulerName Tessera serves (ours or one of
//! `--serve-scheduler-name`). Everything else — CPU pods, plain stock GPU pods
//! for the stock device plugin, other schedulers' pods — is allowed unchanged,
//! except that on any pod nobody but the scheduler touches the allocation
//! annotation, and no `cdi.k8s.io/*` annotation may name a GPU device.

use std::collections::BTreeSet;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tessera_core::allocation::ANNOTATION;
use tessera_core::request;

use super::claims::ClaimRoute;
use super::device_access::{self, Breach};
use super::{AdmissionRequest, AdmissionResponse, WebhookConfig, toleration};
use crate::convert;

/// Pod label by which a pod asking only for stock `nvidia.com/*` GPU resources
/// opts in to Tessera (value `"true"`).
pub const SCHEDULE_LABEL: &str = "tessera.io/schedule";

/// Annotations that only mean something to Tessera's request parser.
const REQUEST_ANNOTATIONS: [&str; 5] = [
    request::ANN_GPU_MODEL,
    request::ANN_GPU_UUIDS,
    request::ANN_ISOLATION,
    request::ANN_TOPOLOGY,
    request::ANN_SINGLE_ARCH,
];

/// The GPU resources a pod's containers ask for (requests or limits).
#[derive(Debug, Default, Clone, Copy)]
struct GpuAsk {
    /// Any `tessera.io/*` resource.
    tessera: bool,
    /// `nvidia.com/gpu` or `nvidia.com/mig-*`.
    stock: bool,
}

fn gpu_ask(pod: &Pod) -> GpuAsk {
    let mut ask = GpuAsk::default();
    let Some(spec) = pod.spec.as_ref() else {
        return ask;
    };
    let names = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.requests.iter().flatten().chain(r.limits.iter().flatten()))
        .map(|(k, _)| k.as_str());
    for name in names {
        if name.starts_with("tessera.io/") {
            ask.tessera = true;
        } else if name == request::RES_NVIDIA_GPU
            || name.starts_with(request::RES_NVIDIA_MIG_PREFIX)
        {
            ask.stock = true;
        }
    }
    ask
}

/// Whether the pod asks for Tessera by name: a `tessera.io/*` resource, or a
/// stock GPU resource together with a Tessera request annotation
/// (`tessera.io/isolation`, `tessera.io/gpu-model`, …) or the label
/// [`SCHEDULE_LABEL`]`: "true"`.
pub fn claims_tessera(pod: &Pod) -> bool {
    let ask = gpu_ask(pod);
    let annotated = convert::annotations(pod).any(|(k, _)| REQUEST_ANNOTATIONS.contains(&k));
    let labelled = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SCHEDULE_LABEL))
        .is_some_and(|v| v == "true");
    ask.tessera || (ask.stock && (annotated || labelled))
}

pub(super) fn uses_default_scheduler(pod: &Pod) -> bool {
    matches!(
        pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
        None | Some("" | "default-scheduler")
    )
}

/// Whether Tessera places the pod by its `schedulerName`: ours, or one of the
/// names it also serves (`--serve-scheduler-name`), whose pods the extender
/// judges and binds just the same.
fn scheduled_by_us(config: &WebhookConfig, pod: &Pod) -> bool {
    let name = convert::scheduler_name(pod);
    config.scheduler_name.as_deref() == Some(name)
        || config.served_scheduler_names.iter().any(|n| n == name)
}

/// Prefix of the pod annotations that containerd and CRI-O (with CDI enabled)
/// read as CDI device requests: `cdi.k8s.io/<any>: vendor.com/class=name,…`.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// CDI vendors whose devices are GPUs that only Tessera's grant may hand out:
/// NVIDIA's (`nvidia.com/gpu`, and subdomains such as `k8s.gpu.nvidia.com`,
/// `management.nvidia.com`) and Tessera's own.
const GPU_CDI_VENDORS: [&str; 2] = ["nvidia.com", "tessera.io"];

/// Whether a fully-qualified CDI device name (`vendor/class=name`) is of a GPU
/// vendor of [`GPU_CDI_VENDORS`]. A name without `=` is judged by what it has:
/// the runtime may not parse it, but nothing is lost by refusing it.
fn is_gpu_cdi_device(device: &str) -> bool {
    let kind = device.split_once('=').map_or(device, |(k, _)| k).trim();
    let vendor = kind
        .split_once('/')
        .map_or(kind, |(v, _)| v)
        .to_ascii_lowercase();
    GPU_CDI_VENDORS
        .iter()
        .any(|v| vendor == *v || vendor.ends_with(&format!(".{v}")))
}

/// The pod's CDI annotations that ask for a GPU device, as one line each:
/// `annotation cdi.k8s.io/x names nvidia.com/gpu=all`. The node agent hands a
/// container its devices through the kubelet (the device plugin's answer), never
/// through the pod's own annotations, so no pod needs one of these.
fn gpu_cdi_requests(pod: &Pod) -> Vec<String> {
    convert::annotations(pod)
        .filter(|(k, _)| k.starts_with(CDI_ANNOTATION_PREFIX))
        .flat_map(|(k, v)| {
            v.split(',')
                .map(str::trim)
                .filter(|d| is_gpu_cdi_device(d))
                .map(move |d| format!("annotation {k} names {d}"))
        })
        .collect()
}

fn allocation_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .map(String::as_str)
}

/// The pod in `object`, or the denial that names what is wrong with it.
fn pod_in(uid: &str, field: &str, object: Option<&Value>) -> Result<Pod, AdmissionResponse> {
    let Some(object) = object else {
        return Err(AdmissionResponse::deny(
            uid,
            format!("Tessera: the admission request carries no {field}"),
        ));
    };
    serde_json::from_value(object.clone()).map_err(|e| {
        AdmissionResponse::deny(uid, format!("Tessera: the {field} is not a valid Pod: {e}"))
    })
}

/// Allows or denies a pod CREATE or UPDATE; never patches.
pub fn validate(config: &WebhookConfig, req: &AdmissionRequest) -> AdmissionResponse {
    let uid = req.uid.as_str();
    let update = match req.operation.as_str() {
        "CREATE" => false,
        "UPDATE" => true,
        // DELETE and CONNECT change nothing we guard.
        _ => return AdmissionResponse::allow(uid),
    };
    let pod = match pod_in(uid, "object", req.object.as_ref()) {
        Ok(p) => p,
        Err(deny) => return deny,
    };
    let old = if update {
        match pod_in(uid, "oldObject", req.old_object.as_ref()) {
            Ok(p) => Some(p),
            Err(deny) => return deny,
        }
    } else {
        None
    };
    let key = convert::pod_key(&pod);

    let new_alloc = allocation_of(&pod);
    let old_alloc = old.as_ref().and_then(allocation_of);
    let writer = config.allocation_writers.contains(&req.user_info.username);
    if new_alloc != old_alloc && !writer {
        let verb = match (old_alloc, new_alloc) {
            (None, _) => "set",
            (_, None) => "remove",
            _ => "change",
        };
        let who = match req.user_info.username.as_str() {
            "" => "an unnamed user",
            name => name,
        };
        return AdmissionResponse::deny(
            uid,
            format!(
                "Tessera: {who} may not {verb} the {ANNOTATION} annotation of pod {key}; only the Tessera scheduler writes it (it records the GPUs the pod holds)"
            ),
        );
    }

    // Every pod, not only those Tessera places: the runtime honours the annotation
    // whoever scheduled the pod, so a CPU pod of another scheduler on a GPU node
    // would reach every GPU. On UPDATE only what the update adds, as below.
    let old_cdi = old.as_ref().map(gpu_cdi_requests).unwrap_or_default();
    let new_cdi: Vec<String> = gpu_cdi_requests(&pod)
        .into_iter()
        .filter(|r| !old_cdi.contains(r))
        .collect();
    if !new_cdi.is_empty() {
        return AdmissionResponse::deny(
            uid,
            format!(
                "Tessera: pod {key} may not ask the container runtime for GPUs in a CDI annotation (the node agent hands over the GPUs Tessera grants): {}",
                new_cdi.join("; ")
            ),
        );
    }

    if !(claims_tessera(&pod) || scheduled_by_us(config, &pod)) {
        return AdmissionResponse::allow(uid);
    }
    // Resources cannot change on UPDATE; the request was judged at CREATE.
    if !update && let Err(e) = convert::pod_request(&pod, &config.catalog) {
        return AdmissionResponse::deny(
            uid,
            format!("Tessera: invalid GPU request in pod {key}: {e}"),
        );
    }
    let breaches = pod
        .spec
        .as_ref()
        .map(device_access::breaches)
        .unwrap_or_default();
    // On UPDATE only what the update adds (an ephemeral container): a pod
    // admitted before this rule must still be labelled, annotated and deleted.
    let before: BTreeSet<String> = old
        .as_ref()
        .and_then(|o| o.spec.as_ref())
        .map(device_access::breaches)
        .unwrap_or_default()
        .iter()
        .map(Breach::to_string)
        .collect();
    let added: Vec<String> = breaches
        .iter()
        .map(Breach::to_string)
        .filter(|b| !before.contains(b))
        .collect();
    if !added.is_empty() {
        return AdmissionResponse::deny(
            uid,
            format!(
                "Tessera: pod {key} may not choose its own GPUs (the node agent sets them for the GPUs Tessera grants): {}",
                added.join("; ")
            ),
        );
    }
    AdmissionResponse::allow(uid)
}

/// Gives a pod CREATE our schedulerName when it is ours to place: it
/// [`claims_tessera`] (or, with `all_gpu_pods`, asks for any GPU), uses the
/// default scheduler, and this webhook is set to name one. Never changes a pod
/// that names a scheduler of its own. A pod so named, or one that claims
/// Tessera under a name Tessera serves, also gets the configured
/// toleration of each [`WebhookConfig::tolerated_taints`] it does not tolerate yet.
pub fn mutate(
    config: &WebhookConfig,
    req: &AdmissionRequest,
    all_gpu_pods: bool,
) -> AdmissionResponse {
    mutate_routed(config, req, all_gpu_pods, &ClaimRoute::NotAsked)
}

/// [`mutate`], with what the pod's claims say about who allocates them
/// ([`super::claims`]): a claim of a Tessera class makes the pod Tessera's, one
/// that cannot be read denies it.
pub fn mutate_routed(
    config: &WebhookConfig,
    req: &AdmissionRequest,
    all_gpu_pods: bool,
    route: &ClaimRoute,
) -> AdmissionResponse {
    let uid = req.uid.as_str();
    let allow = AdmissionResponse::allow(uid);
    let Some(ours) = config
        .scheduler_name
        .as_ref()
        .filter(|_| config.set_scheduler_name)
    else {
        return allow;
    };
    if req.operation != "CREATE" {
        return allow;
    }
    let pod = match pod_in(uid, "object", req.object.as_ref()) {
        Ok(p) => p,
        Err(deny) => return deny,
    };
    if let ClaimRoute::Unreadable(why) = route {
        return AdmissionResponse::deny(
            uid,
            format!("Tessera cannot tell who allocates this pod's claims: {why}"),
        );
    }
    let ask = gpu_ask(&pod);
    let ours_to_place =
        claims_tessera(&pod) || (all_gpu_pods && ask.stock) || *route == ClaimRoute::Tessera(true);
    if !ours_to_place {
        return allow;
    }
    let mut ops = Vec::new();
    if uses_default_scheduler(&pod) {
        ops.push(json!({"op": "add", "path": "/spec/schedulerName", "value": ours}));
    } else if !scheduled_by_us(config, &pod) {
        return allow;
    }
    ops.extend(toleration_ops(config, &pod));
    if ops.is_empty() {
        return allow;
    }
    let patch = Value::Array(ops);
    AdmissionResponse {
        patch_type: Some("JSONPatch".into()),
        patch: Some(base64::engine::general_purpose::STANDARD.encode(patch.to_string())),
        ..allow
    }
}

/// JSON-patch operations adding a toleration of each configured taint the pod
/// does not tolerate yet.
fn toleration_ops(config: &WebhookConfig, pod: &Pod) -> Vec<Value> {
    let have = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let missing: Vec<Value> = config
        .tolerated_taints
        .iter()
        .filter(|taint| !have.iter().any(|h| convert::tolerates(h, taint)))
        .filter_map(|taint| serde_json::to_value(toleration::toleration_for(taint)).ok())
        .collect();
    if missing.is_empty() {
        Vec::new()
    } else if pod.spec.as_ref().is_some_and(|s| s.tolerations.is_some()) {
        missing
            .into_iter()
            .map(|t| json!({"op": "add", "path": "/spec/tolerations/-", "value": t}))
            .collect()
    } else {
        vec![json!({"op": "add", "path": "/spec/tolerations", "value": missing})]
    }
}

#[cfg(test)]
mod tests;
