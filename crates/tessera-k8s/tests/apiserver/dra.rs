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
//! allocation, has at most 256 entries, unique by `uid`. The resourceVersion
//! precondition (409 with the recorded Conflict Status) is the generic one of
//! [`super::update`].

use serde_json::{Value, json};

use super::status::{self, ApiError, Cause};
use super::store::{Resource, key_of};

fn invalid(name: &str, field: &str, reason: &'static str, message: String) -> ApiError {
    status::invalid(
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
