//! `Status` error bodies, worded and shaped exactly as the recorded v1.28
//! server wrote them (`README.md` of the fixtures, "Error body"): `details.kind`
//! is the resource (`pods`), the subresource (`pods/binding`) or the Kind
//! (`Pod`) depending on which layer of the server refused.

use serde_json::{Map, Value, json};

use super::store::Resource;

/// An error answer: HTTP status and its `Status` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub body: Value,
    /// `Retry-After` header, when the server sends one.
    pub retry_after: Option<u32>,
}

fn failure(code: u16, message: String, reason: Option<&str>, details: Option<Value>) -> ApiError {
    let mut body = Map::new();
    body.insert("kind".into(), json!("Status"));
    body.insert("apiVersion".into(), json!("v1"));
    body.insert("metadata".into(), json!({}));
    body.insert("status".into(), json!("Failure"));
    body.insert("message".into(), json!(message));
    if let Some(r) = reason {
        body.insert("reason".into(), json!(r));
    }
    if let Some(d) = details {
        body.insert("details".into(), d);
    }
    body.insert("code".into(), json!(code));
    ApiError {
        code,
        body: Value::Object(body),
        retry_after: None,
    }
}

/// `details` naming an object of `resource` (with `group` for non-core groups).
fn details(resource: Resource, name: &str, kind: &str) -> Value {
    let mut d = Map::new();
    d.insert("name".into(), json!(name));
    if !resource.group().is_empty() {
        d.insert("group".into(), json!(resource.group()));
    }
    d.insert("kind".into(), json!(kind));
    Value::Object(d)
}

/// The `Status{Success, 201}` a binding (or eviction) returns (file 01).
pub fn success_201() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// `pods "x" not found` (files 02, 03, 16).
pub fn not_found(resource: Resource, name: &str) -> ApiError {
    failure(
        404,
        format!("{} \"{name}\" not found", resource.qualified()),
        Some("NotFound"),
        Some(details(resource, name, resource.plural())),
    )
}

/// A path the server does not serve.
pub fn no_route() -> ApiError {
    failure(
        404,
        "the server could not find the requested resource".into(),
        Some("NotFound"),
        Some(json!({})),
    )
}

/// `pods "p17" already exists` (files 10, 13, 17).
pub fn already_exists(resource: Resource, name: &str) -> ApiError {
    failure(
        409,
        format!("{} \"{name}\" already exists", resource.qualified()),
        Some("AlreadyExists"),
        Some(details(resource, name, resource.plural())),
    )
}

/// A stale `metadata.resourceVersion` in a PATCH or PUT (files 05, 07, 10).
pub fn modified(resource: Resource, name: &str) -> ApiError {
    failure(
        409,
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            resource.qualified()
        ),
        Some("Conflict"),
        Some(details(resource, name, resource.plural())),
    )
}

/// A failed storage precondition of a binding (file 04): `what` is `UID` or `ResourceVersion`.
pub fn precondition_failed(
    namespace: &str,
    name: &str,
    what: &str,
    given: &str,
    stored: &str,
) -> ApiError {
    failure(
        409,
        format!(
            "Operation cannot be fulfilled on pods \"{name}\": StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/{name}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: {what} in precondition: {given}, {what} in object meta: {stored}"
        ),
        Some("Conflict"),
        Some(json!({"name": name, "kind": "pods"})),
    )
}

/// A binding the pod's state refuses (files 01, 12, 16).
pub fn binding_conflict(name: &str, why: String) -> ApiError {
    failure(
        409,
        format!("Operation cannot be fulfilled on pods/binding \"{name}\": {why}"),
        Some("Conflict"),
        Some(json!({"name": name, "kind": "pods/binding"})),
    )
}

/// DeleteOptions preconditions that do not hold (file 16).
pub fn delete_precondition(name: &str, what: &str, given: &str, stored: &str) -> ApiError {
    let tail = if what == "UID" {
        "The object might have been deleted and then recreated"
    } else {
        "The object might have been modified"
    };
    failure(
        409,
        format!(
            "Operation cannot be fulfilled on Pod \"{name}\": the {what} in the precondition ({given}) does not match the {what} in record ({stored}). {tail}"
        ),
        Some("Conflict"),
        Some(json!({"name": name, "kind": "Pod"})),
    )
}

/// One field error of a 422.
pub struct Cause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

/// `Kind "name" is invalid: field: message` (files 06, 10, 12, 13).
pub fn invalid(resource: Resource, name: &str, causes: Vec<Cause>) -> ApiError {
    let parts: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    let joined = if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("[{}]", parts.join(", "))
    };
    // Core kinds are named by Kind ("Pod"), group kinds by qualified resource.
    let (subject, kind) = if resource.group().is_empty() || resource == Resource::Events {
        (resource.kind().to_string(), resource.kind().to_string())
    } else {
        (resource.qualified(), resource.plural().to_string())
    };
    let mut d = details(resource, name, &kind);
    if resource == Resource::Events {
        // events.k8s.io reports its 422s with Kind "Event" and no group (file 13).
        d = json!({"name": name, "kind": "Event"});
    }
    if let Value::Object(m) = &mut d {
        m.insert(
            "causes".into(),
            Value::Array(
                causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect(),
            ),
        );
    }
    failure(
        422,
        format!("{subject} \"{name}\" is invalid: {joined}"),
        Some("Invalid"),
        Some(d),
    )
}

/// A 422 of a registry strategy's validation (`rest.BeforeCreate` /
/// `BeforeUpdate`: `errors.NewInvalid(kind.GroupKind(), name, errs)`): the
/// subject is `Kind.group` (`ResourceSlice.resource.k8s.io "x" is invalid: …`)
/// and `details` carry `group` and the Kind, as file 06 shows for core `Pod`.
pub fn invalid_kind(resource: Resource, name: &str, causes: Vec<Cause>) -> ApiError {
    let parts: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    let joined = if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("[{}]", parts.join(", "))
    };
    let subject = if resource.group().is_empty() {
        resource.kind().to_string()
    } else {
        format!("{}.{}", resource.kind(), resource.group())
    };
    let mut d = details(resource, name, resource.kind());
    if let Value::Object(m) = &mut d {
        m.insert(
            "causes".into(),
            Value::Array(
                causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect(),
            ),
        );
    }
    failure(
        422,
        format!("{subject} \"{name}\" is invalid: {joined}"),
        Some("Invalid"),
        Some(d),
    )
}

/// `pods "x" is forbidden: …`: an admission plugin's refusal
/// (`admission.NewForbidden` → `apierrors.NewForbidden(resource, name, err)`),
/// `details` naming the resource as file 17's RBAC 403 does.
pub fn forbidden(resource: Resource, name: &str, why: &str) -> ApiError {
    failure(
        403,
        format!("{} \"{name}\" is forbidden: {why}", resource.qualified()),
        Some("Forbidden"),
        Some(details(resource, name, resource.plural())),
    )
}

/// The eviction subresource's refusal for a PodDisruptionBudget (file 11):
/// 429 `TooManyRequests`, one `DisruptionBudget` cause, and, when the budget
/// is not yet processed, `Retry-After` with `details.retryAfterSeconds`
/// (`pkg/registry/core/pod/storage/eviction.go`, `createTooManyRequestsError`
/// and `checkAndDecrement`).
pub fn disruption_budget(cause: String, retry_after: Option<u32>) -> ApiError {
    let mut d = Map::new();
    d.insert(
        "causes".into(),
        json!([{"reason": "DisruptionBudget", "message": cause}]),
    );
    if let Some(s) = retry_after {
        d.insert("retryAfterSeconds".into(), json!(s));
    }
    let mut e = failure(
        429,
        "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        Some("TooManyRequests"),
        Some(Value::Object(d)),
    );
    e.retry_after = retry_after;
    e
}

/// The generic 422 of a failed JSON-patch operation (file 05): no hint of which op.
pub fn json_patch_failed() -> ApiError {
    failure(
        422,
        "the server rejected our request due to an error in our request".into(),
        Some("Invalid"),
        Some(json!({})),
    )
}

/// 400 without details (files 10, 13, 17).
pub fn bad_request(message: String) -> ApiError {
    failure(400, message, Some("BadRequest"), None)
}

/// A 500 without `reason`, as bad Binding targets get (file 17).
pub fn internal(message: String) -> ApiError {
    failure(500, message, None, None)
}

/// An injected fault: what a server that fails a write answers.
pub fn injected(message: &str) -> ApiError {
    failure(
        500,
        format!("Internal error occurred: {message}"),
        Some("InternalError"),
        Some(json!({"causes": [{"message": message}]})),
    )
}

/// The server's answer when a request outlives its deadline; the write may
/// still have been committed (apiserver `timeout.go`, not recorded).
pub fn timeout() -> ApiError {
    failure(
        504,
        "Timeout: request did not complete within requested timeout - context deadline exceeded"
            .into(),
        Some("Timeout"),
        Some(json!({})),
    )
}

/// 410 Expired (files 14, 15); `continue_token` for an expired LIST continue.
pub fn expired(message: &str, continue_token: Option<String>) -> ApiError {
    let mut e = failure(410, message.into(), Some("Expired"), None);
    if let (Some(t), Value::Object(m)) = (continue_token, &mut e.body) {
        m.insert("metadata".into(), json!({ "continue": t }));
    }
    e
}

/// 405 for a verb a resource does not have.
pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
    failure(
        405,
        format!(
            "the server does not allow this method on the requested resource ({method} {path})"
        ),
        Some("MethodNotAllowed"),
        Some(json!({})),
    )
}
