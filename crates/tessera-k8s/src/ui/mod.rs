//! The live web view on the ops port (read-only): `/ui/` is the GPU mosaic
//! (each node a tile, each GPU a cell with its tenants' shares coloured by
//! namespace, unhealthy GPUs marked), pending pods with their reasons, the GPU
//! queues (held against the fair share, guaranteed, borrowed, waiting),
//! utilisation and fragmentation over the last hour, and a search box.
//!
//! The page's HTML, CSS and JS are compiled into the binary (`include_str!`),
//! with no external requests, so it works in an air-gapped cluster. Routes:
//!
//! - `GET /ui/`: the page (`/ui` redirects here, so relative URLs work behind
//!   `kubectl port-forward` and the API server's service proxy alike);
//! - `GET /ui/snapshot`: the latest full frame (JSON, see [`observer::Frame`]);
//! - `GET /ui/events`: server-sent events: one `full` frame, then a `delta`
//!   per tick (tiles that changed, the pending list, the summary);
//! - `GET /ui/find?q=`: nodes, pods and GPU UUIDs matching `q`;
//! - `GET /chargeback?from=&to=`: the accounting (see [`crate::accounting`]).
//!
//! [`offline_page`] renders one frame into a self-contained file: the
//! simulator's snapshot of a fill.

pub mod mosaic;
pub mod observer;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

pub use observer::Observer;

use crate::accounting::{Usage, UsageQuery};
use crate::metrics::Metrics;
use crate::mirror::SharedMirror;

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// An event stream ends after this long and the browser reconnects (it gets
/// a full frame again): a server shutting down gracefully waits for open
/// responses, so none may stay open for ever.
const STREAM_FOR: Duration = Duration::from_secs(25);

/// The UI and chargeback routes over a new observer of `mirror`, sampling on
/// the current runtime while the router lives.
pub fn router(mirror: SharedMirror, metrics: Arc<Metrics>) -> Router {
    let observer = Observer::new(mirror, metrics);
    observer.start();
    router_with(observer)
}

/// The routes over an existing observer (tests drive its ticks themselves).
pub fn router_with(observer: Arc<Observer>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("ui/") }))
        .route("/ui/", get(index))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript", APP_JS) }),
        )
        .route("/ui/app.css", get(|| async { asset("text/css", APP_CSS) }))
        .route("/ui/snapshot", get(snapshot))
        .route("/ui/events", get(events))
        .route("/ui/find", get(find))
        .route("/chargeback", get(chargeback))
        .with_state(observer)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    let head = r#"<link rel="stylesheet" href="app.css"><script src="app.js" defer></script>"#;
    asset_owned(
        "text/html; charset=utf-8",
        INDEX.replace("<!--HEAD-->", head),
    )
}

fn asset_owned(content_type: &'static str, body: String) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// One self-contained page showing `frame` (a full frame's JSON), no server needed.
pub fn offline_page(frame_json: &str, title: &str) -> String {
    // `</` would end the script element early.
    let data = frame_json.replace("</", "<\\/");
    let head = format!(
        "<style>{APP_CSS}</style>\n<script>window.TESSERA_SNAPSHOT = {data};</script>\n<script>{}</script>",
        APP_JS.replace("</", "<\\/")
    );
    INDEX.replace("<!--HEAD-->", &head).replace(
        "<title>Tessera · GPU mosaic</title>",
        &format!("<title>{}</title>", html_escape(title)),
    )
}

/// A self-contained mosaic page of a core cluster and ledger (the simulator's
/// fill snapshot); each allocation's group (shown as its namespace) and pod
/// name come from `label`; fragment is measured against `workload` (the one the
/// policy that made the state measured against).
pub fn ledger_page(
    cluster: &tessera_core::Cluster,
    ledger: &tessera_core::Ledger,
    label: impl Fn(tessera_core::AllocId) -> (String, String),
    workload: &tessera_core::frag::TargetWorkload,
    title: &str,
) -> String {
    let (mut namespaces, mut models) = (mosaic::Names::default(), mosaic::Names::default());
    let tiles = mosaic::from_ledger(
        cluster,
        ledger,
        label,
        &mut namespaces,
        &mut models,
        workload,
    );
    let healthy = tiles
        .iter()
        .flat_map(|t| &t.gpus)
        .filter(|c| c.flags & mosaic::UNHEALTHY == 0)
        .count() as u64;
    let frame = observer::Frame {
        v: 1,
        t: 0,
        ns: Some(&namespaces.table),
        models: Some(&models.table),
        nodes: tiles.iter().collect(),
        gone: Vec::new(),
        pending: &[],
        problems: &[],
        queues: &[],
        workload: None,
        sum: observer::Summary {
            nodes: tiles.len(),
            gpus: tiles.iter().map(|t| t.gpus.len()).sum(),
            unhealthy_gpus: tiles.iter().map(|t| t.gpus.len()).sum::<usize>() - healthy as usize,
            allocated_milli: ledger.used_milli(),
            capacity_milli: healthy * 1000,
            frag_milli: tiles.iter().map(|t| u64::from(t.frag_milli)).sum(),
            pending: 0,
            problems: 0,
        },
        series: Vec::new(),
    };
    offline_page(&serde_json::to_string(&frame).unwrap_or_default(), title)
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn snapshot(State(o): State<Arc<Observer>>) -> Response {
    let (_, full) = o.full();
    asset_owned("application/json", full.to_string())
}

async fn events(
    State(o): State<Arc<Observer>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // Subscribe before reading the full frame, so no delta falls in between.
    let rx = o.subscribe();
    let (seq, full) = o.full();
    let first = Event::default()
        .event("full")
        .retry(Duration::from_secs(1))
        .data(&*full);
    let deadline = tokio::time::Instant::now() + STREAM_FOR;
    let rest = futures::stream::unfold((rx, seq, o), move |(mut rx, last, o)| async move {
        loop {
            let next = tokio::select! {
                r = rx.recv() => r,
                () = tokio::time::sleep_until(deadline) => return None,
            };
            match next {
                Ok((s, _)) if s <= last => continue,
                Ok((s, delta)) => {
                    let e = Event::default().event("delta").data(&*delta);
                    return Some((Ok(e), (rx, s, o)));
                }
                // Deltas were missed: start again from the whole mosaic.
                Err(RecvError::Lagged(_)) => {
                    let (s, full) = o.full();
                    let e = Event::default().event("full").data(&*full);
                    return Some((Ok(e), (rx, s, o)));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    });
    Sse::new(futures::stream::once(async move { Ok(first) }).chain(rest))
        .keep_alive(KeepAlive::default())
}

#[derive(Debug, Deserialize)]
struct FindQuery {
    #[serde(default)]
    q: String,
}

async fn find(State(o): State<Arc<Observer>>, Query(q): Query<FindQuery>) -> Response {
    json(&o.find(&q.q, 50))
}

async fn chargeback(
    State(o): State<Arc<Observer>>,
    q: Result<Query<UsageQuery>, QueryRejection>,
) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("chargeback: from and to must be unix seconds: {e}\n"),
            )
                .into_response();
        }
    };
    let from = q.from.unwrap_or(0);
    let to = q.to.unwrap_or(u64::MAX / 1000);
    if from >= to {
        return (
            StatusCode::BAD_REQUEST,
            format!("chargeback: from ({from}) must be before to ({to})\n"),
        )
            .into_response();
    }
    json(&o.with_meter(|m| Usage::from_meter(m, from, to)))
}

fn json<T: Serialize>(v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
