//! LIST with `limit`/`continue` served at the first page's resourceVersion
//! (file 09), `resourceVersion=0` ignoring `limit`, exact and continued
//! lists past the history answered 410 (files 14, 15); and the start of a WATCH.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::State;
use super::handler::{Reply, Req};
use super::select::{FieldSelector, LabelSelector};
use super::status::{self, ApiError};
use super::store::{Filter, Resource, WatchFrom, key_of};

fn filter(req: &Req<'_>) -> Result<Filter, ApiError> {
    Ok(Filter {
        resource: req.resource,
        namespace: if req.resource.namespaced() {
            req.namespace.clone()
        } else {
            None
        },
        labels: LabelSelector::parse(req.q("labelSelector").unwrap_or_default())?,
        fields: FieldSelector::parse(req.resource, req.q("fieldSelector").unwrap_or_default())?,
    })
}

/// The key a continue token's `start` counts from.
fn list_key(req: &Req<'_>, obj: &Value) -> String {
    let (ns, name) = key_of(obj);
    if req.resource.namespaced() && req.namespace.is_none() {
        format!("{ns}/{name}")
    } else {
        name
    }
}

fn continue_token(rv: i64, start: &str) -> String {
    let start = serde_json::to_string(start).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(format!(
        "{{\"v\":\"meta.k8s.io/v1\",\"rv\":{rv},\"start\":{start}}}"
    ))
}

fn decode_token(token: &str) -> Result<(i64, String), ApiError> {
    let bad = || status::bad_request(format!("continue key is not valid: {token}"));
    let raw = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_i64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    Ok((rv, start.to_string()))
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

pub fn list(st: &mut State, req: &Req<'_>) -> Result<(u16, Value), ApiError> {
    let f = filter(req)?;
    let current = st.store.rv;
    let limit: Option<usize> = req
        .q("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0);
    let rv_param = req.q("resourceVersion").unwrap_or_default();
    let exact = req.q("resourceVersionMatch") == Some("Exact");
    let (items, list_rv, start, limit) = if let Some(token) = req.q("continue") {
        let (rv, start) = decode_token(token)?;
        let at = if rv < 0 { current } else { rv as u64 };
        match st.store.snapshot(&f, at) {
            Some(items) => (items, at, Some(start), limit),
            None => {
                return Err(status::expired(
                    CONTINUE_EXPIRED,
                    Some(continue_token(-1, &start)),
                ));
            }
        }
    } else if rv_param == "0" && !exact {
        // Served from the watch cache, which ignores `limit` (file 09).
        (
            st.store.snapshot(&f, current).unwrap_or_default(),
            current,
            None,
            None,
        )
    } else if exact {
        let at: u64 = rv_param
            .parse()
            .map_err(|_| status::bad_request(format!("invalid resource version: {rv_param}")))?;
        match st.store.snapshot(&f, at) {
            Some(items) => (items, at, None, limit),
            None => {
                return Err(status::expired(
                    "The resourceVersion for the provided list is too old.",
                    None,
                ));
            }
        }
    } else {
        (
            st.store.snapshot(&f, current).unwrap_or_default(),
            current,
            None,
            limit,
        )
    };
    let mut items: Vec<Arc<Value>> = items;
    if let Some(start) = &start {
        items.retain(|o| list_key(req, o).as_str() >= start.as_str());
    }
    let total = items.len();
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if let Some(limit) = limit
        && total > limit
    {
        items.truncate(limit);
        let last = items.last().map(|o| list_key(req, o)).unwrap_or_default();
        metadata["continue"] = json!(continue_token(list_rv as i64, &format!("{last}\u{0}")));
        if f.labels.is_empty() && f.fields.is_empty() {
            metadata["remainingItemCount"] = json!(total - limit);
        }
    }
    // Built-in lists carry no kind/apiVersion on their items; custom resources do.
    let strip = req.resource.group().is_empty()
        || req.resource == Resource::Leases
        || req.resource.group() == "resource.k8s.io";
    let items: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut v = (**o).clone();
            if strip && let Some(m) = v.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            v
        })
        .collect();
    Ok((
        200,
        json!({
            "kind": format!("{}List", req.resource.kind()),
            "apiVersion": req.resource.api_version(),
            "metadata": metadata,
            "items": items,
        }),
    ))
}

pub fn watch_start(st: &mut State, req: &Req<'_>) -> Reply {
    let f = match filter(req) {
        Ok(f) => f,
        Err(e) => return Reply::Error(e),
    };
    let from = match req.q("resourceVersion").unwrap_or_default() {
        "" | "0" => WatchFrom::Now,
        v => match v.parse() {
            Ok(rv) => WatchFrom::After(rv),
            Err(_) => {
                return Reply::Error(status::bad_request(format!(
                    "invalid resource version: {v}"
                )));
            }
        },
    };
    let mut timeout = Duration::from_secs(
        req.q("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1800),
    );
    if let Some(cap) = st.config.watch_timeout_cap {
        timeout = timeout.min(cap);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    match st.store.watch(f, from, tx) {
        Ok(()) => Reply::Watch {
            rx,
            timeout,
            bookmark: matches!(req.q("allowWatchBookmarks"), Some("true" | "1"))
                .then_some(req.resource),
        },
        Err(e) => Reply::ErrorEvent(e),
    }
}
