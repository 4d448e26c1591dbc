//! PUT, PATCH (merge, strategic, JSON patch; apply in [`super::leases`]) and
//! DELETE of any resource, with the update rules the API server applies to
//! all kinds: `metadata.resourceVersion` as a precondition (409), leases
//! refusing an update without one (422), a `metadata.uid` that differs from
//! the stored one refused as immutable (422, the server's `BeforeUpdate`),
//! and no write (same resourceVersion) when nothing changed.

use std::sync::Arc;

use serde_json::{Value, json};

use super::handler::{Req, key};
use super::status::{self, ApiError};
use super::store::{Resource, key_of, rv_of, set_rv};
use super::{State, leases, patch, pods};

/// How an update came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    Put,
    Patch,
    Apply,
}

/// Stores `new` over `old` with the server's update rules; `None` status when
/// nothing changed (no write, same resourceVersion).
pub fn update_object(
    st: &mut State,
    req: &Req<'_>,
    old: &Arc<Value>,
    mut new: Value,
    how: How,
) -> Result<(u16, Value), ApiError> {
    let r = req.resource;
    let (ns, name) = key_of(old);
    if !new.is_object() {
        return Err(status::bad_request("the body is not an object".into()));
    }
    if new.get("metadata").is_none_or(|m| !m.is_object()) {
        new["metadata"] = json!({});
    }
    let stored_rv = rv_of(old).unwrap_or_default().to_string();
    match rv_of(&new) {
        None | Some("") if how == How::Put && !leases::allows_unconditional(r) => {
            return Err(leases::rv_required(&name));
        }
        Some(given) if !given.is_empty() && given != stored_rv => {
            return Err(status::modified(r, &name));
        }
        _ => {}
    }
    let new_name = new.pointer("/metadata/name").and_then(Value::as_str);
    if new_name.is_some_and(|n| n != name) {
        return Err(status::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            new_name.unwrap_or_default()
        )));
    }
    let old_uid = old.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
    match new.pointer("/metadata/uid").and_then(Value::as_str) {
        None | Some("") => new["metadata"]["uid"] = old_uid,
        Some(u) if Some(u) != old_uid.as_str() => {
            return Err(status::invalid(
                r,
                &name,
                vec![status::Cause {
                    reason: "FieldValueInvalid",
                    message: format!("Invalid value: \"{u}\": field is immutable"),
                    field: "metadata.uid".into(),
                }],
            ));
        }
        Some(_) => {}
    }
    new["metadata"]["name"] = json!(name);
    if r.namespaced() {
        new["metadata"]["namespace"] = json!(ns);
    }
    for field in [
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        match old.pointer(&format!("/metadata/{field}")) {
            Some(v) if !v.is_null() => new["metadata"][field] = v.clone(),
            _ => {
                if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove(field);
                }
            }
        }
    }
    new["kind"] = json!(r.kind());
    new["apiVersion"] = json!(r.api_version());
    match r {
        Resource::Pods => pods::prepare_update(old, &mut new, req.sub.as_deref())?,
        Resource::Leases => leases::check_times(&new)?,
        Resource::Claims => super::dra::prepare_claim_update(old, &mut new, req.sub.as_deref())?,
        Resource::Slices => super::validation::slice(&new, Some(old))?,
        Resource::Workloads | Resource::AdmissionChecks => {
            super::kueue::prepare_update(old, &mut new, req.sub.as_deref())
        }
        Resource::PodDisruptionBudgets => {
            pods::prepare_pdb_update(old, &mut new, req.sub.as_deref())
        }
        _ => {}
    }
    set_rv(&mut new, stored_rv.parse().unwrap_or(0));
    if new == **old {
        return Ok((200, (**old).clone()));
    }
    if r != Resource::Pods && held_deletion_ends(&new) {
        // The generic store's `shouldDeleteDuringUpdate`: the update that
        // removes the last finalizer of an object being deleted deletes it.
        st.store.delete(r, &key_of(old));
        return Ok((200, new));
    }
    if r == Resource::Pods && pods::may_go(&new) {
        // The update that removes the last finalizer of a deleted pod is the
        // deletion itself: one write, and the answer shows the updated object
        // at its old resourceVersion (file 16).
        st.store.delete(r, &key_of(old));
        return Ok((200, new));
    }
    if r == Resource::Leases && how != How::Apply {
        leases::record_update(st, old, &new, req.q("fieldManager"));
    }
    let stored = st.store.update(r, new);
    Ok((200, (*stored).clone()))
}

pub fn put(st: &mut State, req: &Req<'_>, name: &str) -> Result<(u16, Value), ApiError> {
    let new = req.json()?;
    let old = st
        .store
        .get(req.resource, &key(req, name))
        .cloned()
        .ok_or_else(|| status::not_found(req.resource, name))?;
    update_object(st, req, &old, new, How::Put)
}

/// Why a PATCH got no 2xx.
pub enum PatchFailure {
    Api(ApiError),
    Dropped,
}

impl From<ApiError> for PatchFailure {
    fn from(e: ApiError) -> PatchFailure {
        PatchFailure::Api(e)
    }
}

pub fn patch_object(
    st: &mut State,
    req: &Req<'_>,
    name: &str,
) -> Result<(u16, Value), PatchFailure> {
    let body: Value = serde_json::from_slice(req.body)
        .map_err(|e| status::bad_request(format!("error decoding patch: {e}")))?;
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if ct == "application/apply-patch+yaml" {
        return leases::apply(st, req, name, &body).map_err(PatchFailure::Api);
    }
    let old = st
        .store
        .get(req.resource, &key(req, name))
        .cloned()
        .ok_or_else(|| status::not_found(req.resource, name))?;
    let mut new = (*old).clone();
    match ct {
        "application/merge-patch+json" => patch::merge(&mut new, &body),
        "application/strategic-merge-patch+json" => patch::strategic(&mut new, &body),
        "application/json-patch+json" => match patch::json_patch(&mut new, &body) {
            Ok(()) => {}
            Err(patch::PatchError::OpFailed) => return Err(status::json_patch_failed().into()),
            Err(patch::PatchError::Malformed(m)) => return Err(status::bad_request(m).into()),
            Err(patch::PatchError::ServerPanic) => return Err(PatchFailure::Dropped),
        },
        other => {
            return Err(ApiError {
                code: 415,
                body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"),
                    "reason": "UnsupportedMediaType", "code": 415}),
                retry_after: None,
            }
            .into());
        }
    }
    update_object(st, req, &old, new, How::Patch).map_err(PatchFailure::Api)
}

pub fn delete(st: &mut State, req: &Req<'_>, name: &str) -> Result<(u16, Value), ApiError> {
    if req.resource == Resource::Pods {
        return pods::delete(st, req, name);
    }
    let k = key(req, name);
    let Some(old) = st.store.get(req.resource, &k).cloned() else {
        return Err(status::not_found(req.resource, name));
    };
    // The generic store's graceful deletion (`BeforeDelete`,
    // `deletionFinalizersForGarbageCollection`): an object that finalizers
    // hold stays, marked with `deletionTimestamp` and grace 0, until the last
    // finalizer is removed; a repeated DELETE leaves it as it is. (A
    // ResourceClaim with `resource.kubernetes.io/delete-protection` is held so.)
    if finalizers(&old) {
        if old
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null())
        {
            return Ok((200, (*old).clone()));
        }
        let mut marked = (*old).clone();
        marked["metadata"]["deletionTimestamp"] = json!(super::handler::now());
        marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        let stored = st.store.update(req.resource, marked);
        return Ok((200, (*stored).clone()));
    }
    let gone = st.store.delete(req.resource, &k);
    Ok((200, gone.map(|g| (*g).clone()).unwrap_or_default()))
}

fn finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// Whether `obj` is being deleted and no finalizer holds it any more.
fn held_deletion_ends(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
        && !finalizers(obj)
}
