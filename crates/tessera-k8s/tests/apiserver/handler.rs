//! Routing, faults, the write log, and GET and create for every resource.
//! LIST and WATCH are in [`super::list`], PUT/PATCH/DELETE in
//! [`super::update`], resource rules in [`super::pods`], [`super::leases`]
//! and [`super::events`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::sync::watch as flag;

use super::list::{list, watch_start};
use super::status::{self, ApiError};
use super::store::{Key, Resource, key_of};
use super::update::{PatchFailure, delete, patch_object, put};
use super::{Fault, Shared, State, WriteRecord, events, leases, pods, watch};

/// What the service does with a request.
pub enum Outcome {
    /// The answer, and extra time it takes (a long LIST).
    Respond(Response<axum::body::Body>, Duration),
    /// Never answered: the process died.
    Hang,
    /// The connection is closed without an answer (file 05, the panicking patch).
    Dropped,
}

/// A handler's answer.
pub enum Reply {
    Json(u16, Value),
    Error(ApiError),
    /// A watch stream: lines arrive on `rx` until the server-side timeout.
    Watch {
        rx: mpsc::UnboundedReceiver<String>,
        timeout: Duration,
        bookmark: Option<Resource>,
    },
    /// HTTP 200 with a single ERROR event, then the stream closes (file 14).
    ErrorEvent(ApiError),
    Dropped,
}

impl From<ApiError> for Reply {
    fn from(e: ApiError) -> Reply {
        Reply::Error(e)
    }
}

/// A parsed request.
pub struct Req<'a> {
    pub method: &'a str,
    pub resource: Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub body: &'a [u8],
}

impl Req<'_> {
    pub fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    pub fn json(&self) -> Result<Value, ApiError> {
        if self.body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(self.body).map_err(|e| {
            status::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {e}",
                self.resource.kind(),
                self.resource
                    .api_version()
                    .rsplit('/')
                    .next()
                    .unwrap_or("v1"),
                self.resource.kind()
            ))
        })
    }
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

/// Where an API path points.
struct Route {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, r, tail @ ..] => (Some(ns.to_string()), {
            let mut v = vec![*r];
            v.extend_from_slice(tail);
            v
        }),
        other => (None, other.to_vec()),
    };
    let resource = Resource::from_path(group, version, rest.first()?)?;
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return None;
    }
    Some(Route {
        resource,
        namespace,
        name,
        sub,
    })
}

fn verb(method: &str, has_name: bool, watch: bool) -> &'static str {
    match (method, has_name, watch) {
        ("GET", _, true) => "watch",
        ("GET", false, _) => "list",
        ("GET", true, _) => "get",
        ("POST", _, _) => "create",
        ("PUT", _, _) => "update",
        ("PATCH", _, _) => "patch",
        ("DELETE", _, _) => "delete",
        _ => "other",
    }
}

fn json_response(code: u16, body: &Value, retry_after: Option<u32>) -> Response<axum::body::Body> {
    let mut b = Response::builder()
        .status(code)
        .header("content-type", "application/json");
    if let Some(s) = retry_after {
        b = b.header("retry-after", s.to_string());
    }
    b.body(axum::body::Body::from(
        serde_json::to_vec(body).unwrap_or_default(),
    ))
    .unwrap_or_default()
}

const VERSION: &str = r#"{"major":"1","minor":"28","gitVersion":"v1.28.0","gitCommit":"8bfc72d03e2130f1bee566d692596931b0ff57cf","gitTreeState":"archive","buildDate":"2026-12-01T02:32:14Z","goVersion":"go1.27.3","compiler":"gc","platform":"linux/amd64"}"#;

/// Serves one request under the lock; the caller adds latency around it.
pub fn serve(
    shared: &Arc<Shared>,
    session: u64,
    parts: &http::request::Parts,
    body: &Bytes,
    dead: flag::Receiver<bool>,
) -> Outcome {
    let path = parts.uri.path();
    let method = parts.method.as_str();
    if path == "/version" {
        let v: Value = serde_json::from_str(VERSION).unwrap_or_default();
        return Outcome::Respond(json_response(200, &v, None), Duration::ZERO);
    }
    let Some(Route {
        resource,
        namespace,
        name,
        sub,
    }) = parse_path(path)
    else {
        return Outcome::Respond(
            json_response(404, &status::no_route().body, None),
            Duration::ZERO,
        );
    };
    let req = Req {
        method,
        resource,
        namespace,
        name,
        sub,
        query: parse_query(parts.uri.query()),
        content_type: parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        body,
    };
    let watching = matches!(req.q("watch"), Some("true" | "1"));
    let listing = method == "GET" && req.name.is_none() && !watching;
    let mut st = shared.lock();
    let counter = format!(
        "{} {}{}",
        verb(method, req.name.is_some(), watching),
        resource.plural(),
        req.sub
            .as_ref()
            .map(|s| format!("/{s}"))
            .unwrap_or_default()
    );
    *st.counters.entry(counter).or_default() += 1;

    let writing = matches!(method, "POST" | "PUT" | "PATCH" | "DELETE");
    let mut crash_after = false;
    let mut timed_out = false;
    if writing {
        let Some(s) = st.sessions.get_mut(&session) else {
            return Outcome::Hang;
        };
        s.writes += 1;
        let n = s.writes;
        match s.faults.iter().find(|(k, _)| *k == n).map(|(_, f)| *f) {
            Some(Fault::CrashBefore) => {
                s.die();
                return Outcome::Hang;
            }
            Some(Fault::Fail) => {
                let e = status::injected("fault injected by the test double");
                record(&mut st, session, &req, e.code);
                return Outcome::Respond(json_response(e.code, &e.body, None), Duration::ZERO);
            }
            Some(Fault::CrashAfter) => crash_after = true,
            Some(Fault::FailAfter) => timed_out = true,
            None => {}
        }
    }
    let mut reply = dispatch(&mut st, &req, watching);
    if timed_out {
        reply = Reply::Error(status::timeout());
    }
    if writing {
        let code = match &reply {
            Reply::Json(c, _) => *c,
            Reply::Error(e) => e.code,
            _ => 0,
        };
        record(&mut st, session, &req, code);
    }
    if crash_after {
        if let Some(s) = st.sessions.get_mut(&session) {
            s.die();
        }
        return Outcome::Hang;
    }
    let per_item = st.config.list_latency_per_item;
    drop(st);
    let none = Duration::ZERO;
    match reply {
        Reply::Json(code, v) => {
            let items = v.get("items").and_then(Value::as_array).map_or(0, Vec::len);
            let extra = per_item * items as u32;
            if listing && code == 200 && v.pointer("/metadata/continue").is_none() {
                // The last page of a LIST: when this process has all of `resource`.
                let mut st = shared.lock();
                if let Some(s) = st.sessions.get_mut(&session) {
                    s.listed
                        .entry(resource.plural().to_string())
                        .or_insert(Instant::now() + extra);
                }
            }
            Outcome::Respond(json_response(code, &v, None), extra)
        }
        Reply::Error(e) => Outcome::Respond(json_response(e.code, &e.body, e.retry_after), none),
        Reply::ErrorEvent(e) => {
            let line = super::store::event_line("ERROR", &e.body);
            Outcome::Respond(watch::response(watch::Stream::once(line)), none)
        }
        Reply::Watch {
            rx,
            timeout,
            bookmark,
        } => Outcome::Respond(
            watch::response(watch::Stream::live(
                rx,
                timeout,
                bookmark.map(|r| (shared.clone(), r)),
                dead,
            )),
            none,
        ),
        Reply::Dropped => Outcome::Dropped,
    }
}

fn record(st: &mut State, session: u64, req: &Req<'_>, status: u16) {
    let rv = st.store.rv;
    st.writes.push(WriteRecord {
        session,
        at: Instant::now(),
        method: req.method.to_string(),
        resource: req.resource.plural().to_string(),
        namespace: req.namespace.clone().unwrap_or_default(),
        name: req.name.clone().unwrap_or_default(),
        subresource: req.sub.clone().unwrap_or_default(),
        status,
        rv,
    });
}

fn dispatch(st: &mut State, req: &Req<'_>, watching: bool) -> Reply {
    let result = match (req.method, &req.name, req.sub.as_deref()) {
        ("GET", None, None) if watching => return watch_start(st, req),
        ("GET", None, None) => list(st, req),
        // The status subresource reads as the object (file-less: kube's `get_status`).
        ("GET", Some(n), None | Some("status")) => get(st, req, n),
        ("POST", None, None) => create_at(st, req),
        ("POST", Some(n), Some("binding")) if req.resource == Resource::Pods => {
            pods::bind(st, req, n).map(|v| (201, v))
        }
        ("POST", Some(n), Some("eviction")) if req.resource == Resource::Pods => {
            pods::evict(st, req, n).map(|v| (201, v))
        }
        ("PUT", Some(n), None | Some("status")) => put(st, req, n),
        ("PATCH", Some(n), None | Some("status")) => match patch_object(st, req, n) {
            Ok(r) => Ok(r),
            Err(PatchFailure::Api(e)) => Err(e),
            Err(PatchFailure::Dropped) => return Reply::Dropped,
        },
        ("DELETE", Some(n), None) => delete(st, req, n),
        _ => Err(status::method_not_allowed(
            req.method,
            req.resource.plural(),
        )),
    };
    match result {
        Ok((code, v)) => Reply::Json(code, v),
        Err(e) => Reply::Error(e),
    }
}

pub fn key(req: &Req<'_>, name: &str) -> Key {
    let ns = if req.resource.namespaced() {
        req.namespace.clone().unwrap_or_default()
    } else {
        String::new()
    };
    (ns, name.to_string())
}

fn get(st: &mut State, req: &Req<'_>, name: &str) -> Result<(u16, Value), ApiError> {
    st.store
        .get(req.resource, &key(req, name))
        .map(|o| (200, (**o).clone()))
        .ok_or_else(|| status::not_found(req.resource, name))
}

pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Creates `obj` of `resource`: validation, defaults, AlreadyExists, then the write.
pub fn create(st: &mut State, resource: Resource, obj: &Value) -> Result<Arc<Value>, ApiError> {
    let mut obj = obj.clone();
    if !obj.is_object() {
        return Err(status::bad_request("the body is not an object".into()));
    }
    if obj.get("metadata").is_none_or(|m| !m.is_object()) {
        obj["metadata"] = json!({});
    }
    if obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        let Some(prefix) = obj
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return Err(status::invalid(
                resource,
                "",
                vec![status::Cause {
                    reason: "FieldValueRequired",
                    message: "Required value: name or generateName is required".into(),
                    field: "metadata.name".into(),
                }],
            ));
        };
        let suffix: String = (0..5)
            .map(|_| {
                const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
                ALPHABET[rand::Rng::random_range(&mut st.rng, 0..ALPHABET.len())] as char
            })
            .collect();
        obj["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
    }
    if resource.namespaced() {
        if obj.pointer("/metadata/namespace").is_none() {
            obj["metadata"]["namespace"] = json!("default");
        }
    } else if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("namespace");
    }
    obj["kind"] = json!(resource.kind());
    obj["apiVersion"] = json!(resource.api_version());
    match resource {
        Resource::Pods => pods::defaults(&mut obj),
        Resource::Namespaces => {
            let name = key_of(&obj).1;
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        Resource::Leases => leases::check_times(&obj)?,
        Resource::Events => events::validate(&obj)?,
        Resource::Slices => super::validation::slice(&obj, None)?,
        Resource::PodDisruptionBudgets => pods::pdb_defaults(&mut obj),
        Resource::Workloads | Resource::AdmissionChecks => super::kueue::prepare_create(&mut obj),
        _ => {}
    }
    let k = key_of(&obj);
    if st.store.get(resource, &k).is_some() {
        return Err(status::already_exists(resource, &k.1));
    }
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("deletionTimestamp");
    }
    obj["metadata"]["uid"] = json!(st.uid());
    obj["metadata"]["creationTimestamp"] = json!(now());
    Ok(st.store.create(resource, obj))
}

fn create_at(st: &mut State, req: &Req<'_>) -> Result<(u16, Value), ApiError> {
    let mut obj = req.json()?;
    if req.resource.namespaced() {
        let ns = req.namespace.clone().unwrap_or_else(|| "default".into());
        match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != ns => {
                return Err(status::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
            _ => {
                if obj.get("metadata").is_none_or(|m| !m.is_object()) {
                    obj["metadata"] = json!({});
                }
                obj["metadata"]["namespace"] = json!(ns);
            }
        }
    }
    if req.resource == Resource::Pods && obj.is_object() {
        // Admission runs on the API path only (see `pods::admit_priority`).
        pods::admit_priority(st, &mut obj)?;
    }
    create(st, req.resource, &obj).map(|o| (201, (*o).clone()))
}
