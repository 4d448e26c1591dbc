//! `resource.k8s.io/v1` in the double: the ResourceClaim update rules and
//! objects to seed.
//!
//! Kubernetes v1.34+ DRA responses are not recorded in ../shared/fixtures
//! (the recordings are v1.28, which has no `resource.k8s.io/v1`). The shapes
//! follow the upstream types (`k8s.io/api/resource/v1/types.go`,
//! protocols.md §3.3–3.6); the rules copy the API server's
//! `pkg/registry/resource/resourceclaim/strategy.go` and
//! `pkg/apis/resource/validation` as far as the scheduler can observe them:
//! the status subresource changes only `status` (and metadata), the main
//! resource never changes `status` and `spec` is immutable; an allocation,
//! once set, cannot be changed (only removed); `reservedFor` needs an
//! allocation, has at most 256 entries, unique by `uid`; the rest of the
//! status validation (results, request names, `shareID`, no new consumer of a
//! claim being deleted) and the ResourceSlice validation are in
//! [`super::validation`]. The resourceVersion precondition (409 with the recorded Conflict Status) is the generic one of
//! [`super::update`].

use serde_json::{Value, json};

use super::status::{self, ApiError, Cause};
use super::store::{Resource, key_of};

fn invalid(name: &str, field: &str, reason: &'static str, message: String) -> ApiError {
    status::invalid_kind(
        Resource::Claims,
        name,
        vec![Cause {
            reason,
            message,
            field: field.into(),
        }],
    )
}

/// The claim strategy's PrepareForUpdate and validation.
pub fn prepare_claim_update(
    old: &Value,
    new: &mut Value,
    sub: Option<&str>,
) -> Result<(), ApiError> {
    let name = key_of(old).1;
    if sub == Some("status") {
        let status = new.get("status").cloned().unwrap_or(Value::Null);
        let meta = new.get("metadata").cloned();
        *new = old.clone();
        new["status"] = status;
        if let Some(m) = meta {
            new["metadata"] = m;
        }
    } else {
        new["status"] = old.get("status").cloned().unwrap_or(Value::Null);
        if new.get("spec") != old.get("spec") {
            return Err(invalid(
                &name,
                "spec",
                "FieldValueInvalid",
                "Invalid value: \"object\": field is immutable".into(),
            ));
        }
    }
    let was = old.pointer("/status/allocation").filter(|v| !v.is_null());
    let is = new.pointer("/status/allocation").filter(|v| !v.is_null());
    if let (Some(a), Some(b)) = (was, is)
        && a != b
    {
        return Err(invalid(
            &name,
            "status.allocation",
            "FieldValueInvalid",
            "Invalid value: \"object\": field is immutable".into(),
        ));
    }
    let reserved = new
        .pointer("/status/reservedFor")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !reserved.is_empty() && is.is_none() {
        return Err(invalid(
            &name,
            "status.reservedFor",
            "FieldValueForbidden",
            "Forbidden: may not be specified when `allocated` is not set".into(),
        ));
    }
    if reserved.len() > 256 {
        return Err(invalid(
            &name,
            "status.reservedFor",
            "FieldValueTooMany",
            format!("Too many: {}: must have at most 256 items", reserved.len()),
        ));
    }
    let mut uids: Vec<&str> = reserved
        .iter()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
        .collect();
    uids.sort_unstable();
    if uids.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid(
            &name,
            "status.reservedFor",
            "FieldValueDuplicate",
            "Duplicate value: a uid may appear only once".into(),
        ));
    }
    if sub == Some("status") {
        // The rest of `ValidateResourceClaimStatusUpdate`: results, request
        // names, shareIDs, and no new consumer of a claim being deleted.
        super::validation::claim_status(old, new)?;
    }
    Ok(())
}

// ---- objects to seed --------------------------------------------------------------------

/// The chart's two classes (docs/kubernetes.md §10).
pub fn classes() -> Vec<Value> {
    let class = |name: &str, ty: &str| {
        json!({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression":
            format!("device.driver == 'gpu.tessera.io' && device.attributes['gpu.tessera.io'].type == '{ty}'")}}]}})
    };
    vec![
        class("gpu.tessera.io", "gpu"),
        class("mig.tessera.io", "mig"),
    ]
}

/// A node agent's slice: `gpus` whole A100-80GB GPUs on `node`, as
/// `tessera-node`'s `dra::slice` publishes them.
pub fn slice(node: &str, gpus: u32) -> Value {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"name": format!("gpu-{i}"),
                "attributes": {
                    "type": {"string": "gpu"}, "index": {"int": i},
                    "uuid": {"string": format!("GPU-{node}-{i}")},
                    "model": {"string": "A100-80GB"}, "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                    "numa": {"int": 0}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    json!({"metadata": {"name": format!("{node}-gpu.tessera.io")},
        "spec": {"driver": "gpu.tessera.io", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}})
}

/// [`slice`] with every GPU shareable (KEP-5075): `allowMultipleAllocations`,
/// consumable `memory` (80Gi, asked in steps of 1Mi) and `compute` (1000, in
/// steps of 1), each consumed whole by a claim that does not ask it (the
/// policies' default), so a whole-GPU claim takes all of a GPU it lands on.
pub fn shared_slice(node: &str, gpus: u32) -> Value {
    let mut s = slice(node, gpus);
    for d in s["spec"]["devices"].as_array_mut().into_iter().flatten() {
        d["allowMultipleAllocations"] = json!(true);
        d["capacity"] = json!({
            "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi",
                "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}}},
            "compute": {"value": "1000", "requestPolicy": {"default": "1000",
                "validRange": {"min": "1", "max": "1000", "step": "1"}}}});
    }
    s
}

/// A node of `gpus` A100-80GBs in MIG mode, as the node agent publishes them
/// with `partitionable-mig` (the shape of `dra::tests::mig_slice_with`): per
/// GPU a counter set `gpu-<i>-counter-set` (`compute-slices`, and
/// `memory-slice-<k>` of 1 each) and a device `gpu-<i>-mig-<profile>-<start>`
/// per placement the model's table allows, consuming the profile's compute
/// slices and the memory slices it covers. No instance exists yet. One pool
/// of several slices, as the v1.35+ API server wants them (and as
/// `tessera-node`'s `dra::slice` writes them): counter sets in slices of
/// their own, at most 8 to a slice, and the devices, which consume counters,
/// at most 64 to a slice ([`super::validation`]).
pub fn mig_slices(node: &str, gpus: u32) -> Vec<Value> {
    let catalog = tessera_core::model::Catalog::default();
    let a100 = catalog.find("A100-80GB").expect("A100-80GB in the catalog");
    let geo = catalog.spec(a100).mig.clone().expect("A100-80GB has MIG");
    let mut sets = Vec::new();
    let mut devices = Vec::new();
    for g in 0..gpus {
        let set = format!("gpu-{g}-counter-set");
        let mut all = json!({"compute-slices": {"value": geo.compute_slices.to_string()}});
        for k in 0..geo.memory_slices {
            all[format!("memory-slice-{k}")] = json!({"value": "1"});
        }
        sets.push(json!({"name": set, "counters": all}));
        for p in &geo.profiles {
            for &start in &p.starts {
                let Some(mask) = geo.placement_mask(p, start) else {
                    continue;
                };
                let mut used = json!({"compute-slices": {"value": p.compute_slices.to_string()}});
                for k in (0..8).filter(|k| mask & (1 << k) != 0) {
                    used[format!("memory-slice-{k}")] = json!({"value": "1"});
                }
                let label: String = p.name.chars().filter(char::is_ascii_alphanumeric).collect();
                devices.push(json!({
                    "name": format!("gpu-{g}-mig-{label}-{start}"),
                    "attributes": {"type": {"string": "mig"}, "profile": {"string": p.name},
                        "parentIndex": {"int": g}, "parentUUID": {"string": format!("GPU-{node}-{g}")},
                        "model": {"string": "A100-80GB"},
                        "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
                    "capacity": {"memory": {"value": format!("{}Mi", p.memory_mib)}},
                    "consumesCounters": [{"counterSet": set, "counters": used}]
                }));
            }
        }
    }
    let mut specs: Vec<(&str, Vec<Value>)> = Vec::new();
    for c in sets.chunks(super::validation::SLICE_MAX_COUNTER_SETS) {
        specs.push(("sharedCounters", c.to_vec()));
    }
    for c in devices.chunks(super::validation::SLICE_MAX_DEVICES_ADVANCED) {
        specs.push(("devices", c.to_vec()));
    }
    let count = specs.len();
    specs
        .into_iter()
        .enumerate()
        .map(|(k, (field, items))| {
            let mut spec = json!({"driver": "gpu.tessera.io", "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": count}});
            spec[field] = Value::Array(items);
            json!({"metadata": {"name": format!("{node}-gpu.tessera.io-{k}")}, "spec": spec})
        })
        .collect()
}

/// A claim asking a share of one GPU: `memory` (a quantity) and `compute`
/// (of 1000).
pub fn share_claim(namespace: &str, name: &str, memory: &str, compute: u32) -> Value {
    json!({"metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.io",
                "capacity": {"requests": {"memory": memory, "compute": compute.to_string()}}}}]}}})
}

/// A claim asking one MIG placement of `profile` (`1g.10gb`).
pub fn mig_claim(namespace: &str, name: &str, profile: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "mig.tessera.io",
                "selectors": [{"cel": {"expression":
                    format!("device.attributes['gpu.tessera.io'].profile == '{profile}'")}}]}}]}}})
}

/// A claim asking `count` devices of `class`.
pub fn claim(namespace: &str, name: &str, class: &str, count: i64) -> Value {
    json!({"metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": class, "count": count}}]}}})
}

/// A pod of scheduler `tessera` using claims: `(entry, Ok(claim name) | Err(template name))`.
pub fn pod_with_claims(
    namespace: &str,
    name: &str,
    claims: &[(&str, Result<&str, &str>)],
) -> Value {
    let entries: Vec<Value> = claims
        .iter()
        .map(|(entry, c)| match c {
            Ok(n) => json!({"name": entry, "resourceClaimName": n}),
            Err(t) => json!({"name": entry, "resourceClaimTemplateName": t}),
        })
        .collect();
    let refs: Vec<Value> = claims.iter().map(|(e, _)| json!({"name": e})).collect();
    json!({"metadata": {"name": name, "namespace": namespace},
        "spec": {"schedulerName": "tessera", "resourceClaims": entries,
            "containers": [{"name": "main", "image": "cuda",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "claims": refs}}]}})
}

/// Tessera in standalone mode with `--dra`, on loopback ports of its own, no
/// leader election, signing with `key_file`, placing with `policy`.
pub fn standalone_config(key_file: &std::path::Path, policy: &str) -> tessera_k8s::run::Config {
    tessera_k8s::run::RawConfig {
        mode: Some("standalone".into()),
        listen: Some("127.0.0.1:0".into()),
        metrics_listen: Some("127.0.0.1:0".into()),
        signing_key_file: Some(key_file.to_path_buf()),
        scheduler_name: Some("tessera".into()),
        leader_elect: Some(false),
        policy: Some(policy.into()),
        dra: Some(true),
        ..tessera_k8s::run::RawConfig::default()
    }
    .resolve()
    .expect("valid config")
}
