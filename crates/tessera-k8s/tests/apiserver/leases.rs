//! Lease rules (file 10) and the server-side apply that kube-lease-manager 0.13
//! takes the lease with.
//!
//! kube-lease-manager sends: GET the Lease; POST it with an empty spec if it is
//! missing (409 AlreadyExists is fine); to take a free lease an apply patch
//! (`application/apply-patch+yaml`, `fieldManager=kube-lease-manager-<id>`, no
//! `force`) setting holderIdentity, acquireTime, renewTime and
//! leaseDurationSeconds, then a strategic patch of leaseTransitions; to renew a
//! strategic patch of renewTime and leaseDurationSeconds; to release (its own,
//! or an expired one) a strategic patch setting the four fields to `null`.
//! Two replicas racing for a free lease are kept apart by the apply: the loser
//! gets a 409 because another manager owns a field it would change. The double
//! keeps one owner per `spec` field, which is what that needs.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::handler::{Req, create, key};
use super::status::{self, ApiError, Cause};
use super::store::{Resource, key_of};
use super::update::{How, update_object};
use super::{State, patch};

/// Pods (and most kinds) take an update without resourceVersion; leases do not (files 07, 10).
pub fn allows_unconditional(r: Resource) -> bool {
    r != Resource::Leases
}

/// The recorded 422 of a lease PUT without resourceVersion (file 10).
pub fn rv_required(name: &str) -> ApiError {
    status::invalid(
        Resource::Leases,
        name,
        vec![Cause {
            reason: "FieldValueInvalid",
            message: "Invalid value: 0x0: must be specified for an update".into(),
            field: "metadata.resourceVersion".into(),
        }],
    )
}

/// Whether `s` is a MicroTime: exactly six fractional digits (`2006-01-02T15:04:05.000000Z07:00`).
pub fn is_micro_time(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    let zone = &s.get(26..).unwrap_or_default();
    b.len() >= 27
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..26)
        && (*zone == "Z"
            || (zone.len() == 6
                && (zone.starts_with('+') || zone.starts_with('-'))
                && zone.as_bytes()[3] == b':'))
}

/// The recorded 400 for a MicroTime without microseconds (files 10, 13).
pub fn micro_time_error(kind: &str, value: &str) -> ApiError {
    let rest = value.get(19..).unwrap_or_default();
    status::bad_request(format!(
        "{kind} in version \"v1\" cannot be handled as a {kind}: parsing time \"{value}\" as \"2006-01-02T15:04:05.000000Z07:00\": cannot parse \"{rest}\" as \".000000\""
    ))
}

/// Checks the MicroTime fields of a lease.
pub fn check_times(lease: &Value) -> Result<(), ApiError> {
    for f in ["acquireTime", "renewTime"] {
        if let Some(v) = lease.pointer(&format!("/spec/{f}")).and_then(Value::as_str)
            && !is_micro_time(v)
        {
            return Err(micro_time_error("Lease", v));
        }
    }
    Ok(())
}

fn spec_of(v: &Value) -> Map<String, Value> {
    v.get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// An update (not an apply) takes the fields it changed for its manager, and
/// fields it removed lose their owner.
pub fn record_update(st: &mut State, old: &Value, new: &Value, manager: Option<&str>) {
    let manager = manager.unwrap_or("unknown").to_string();
    let (before, after) = (spec_of(old), spec_of(new));
    let owners = st.lease_owners.entry(key_of(old)).or_default();
    for (k, v) in &after {
        if before.get(k) != Some(v) {
            owners.insert(k.clone(), manager.clone());
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            owners.remove(k);
        }
    }
}

/// Server-side apply of a lease (other kinds: a merge patch that may create).
pub fn apply(
    st: &mut State,
    req: &Req<'_>,
    name: &str,
    body: &Value,
) -> Result<(u16, Value), ApiError> {
    let Some(manager) = req.q("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(status::bad_request(
            "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests"
                .into(),
        ));
    };
    let force = req.q("force") == Some("true");
    let k = key(req, name);
    let Some(old) = st.store.get(req.resource, &k).cloned() else {
        let mut obj = body.clone();
        obj["metadata"]["name"] = json!(name);
        if req.resource.namespaced() {
            obj["metadata"]["namespace"] = json!(k.0);
        }
        let created = create(st, req.resource, &obj)?;
        let owners: BTreeMap<String, String> = spec_of(&created)
            .keys()
            .map(|f| (f.clone(), manager.to_string()))
            .collect();
        st.lease_owners.insert(k, owners);
        return Ok((201, (*created).clone()));
    };
    let current = spec_of(&old);
    let applied = spec_of(body);
    let owners = st.lease_owners.get(&k).cloned().unwrap_or_default();
    let conflicts: Vec<(&String, &String)> = applied
        .iter()
        .filter(|(f, v)| current.get(*f).is_some_and(|c| c != *v))
        .filter_map(|(f, _)| owners.get(f).filter(|o| *o != manager).map(|o| (f, o)))
        .collect();
    if !conflicts.is_empty() && !force && req.resource == Resource::Leases {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(f, o)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{o}\" using coordination.k8s.io/v1"), "field": format!(".spec.{f}")}))
            .collect();
        let list: Vec<String> = conflicts
            .iter()
            .map(|(f, o)| format!("conflict with \"{o}\" using coordination.k8s.io/v1: .spec.{f}"))
            .collect();
        let n = conflicts.len();
        return Err(ApiError {
            code: 409,
            body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("Apply failed with {n} conflict{}: {}", if n == 1 { "" } else { "s" }, list.join("\n")),
                "reason": "Conflict", "details": {"causes": causes}, "code": 409}),
            retry_after: None,
        });
    }
    let mut new = (*old).clone();
    let mut applied_body = body.clone();
    if let Some(m) = applied_body
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
    {
        m.remove("resourceVersion");
    }
    patch::merge(&mut new, &applied_body);
    let result = update_object(st, req, &old, new, How::Apply)?;
    let owners = st.lease_owners.entry(k).or_default();
    for f in applied.keys() {
        owners.insert(f.clone(), manager.to_string());
    }
    Ok(result)
}
