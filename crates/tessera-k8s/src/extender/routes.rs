//! The extender's HTTP surface: `filter`, `prioritize`, `bind`, `preempt`
//! (at the root and under `/scheduler`, whichever `urlPrefix` points at), plus
//! `/healthz`, `/readyz` and `/metrics`. [`router`] needs no socket: tests call
//! it with `tower::ServiceExt::oneshot`.
//!
//! Every answer is `200` with the protocol's own `Error` field where it has
//! one (filter, bind), so kube-scheduler shows our message; a body that is not
//! valid JSON for the verb is a `400` naming what is wrong.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::forward::{Forwarded, PEER_BIND_PATH, Peers};
use super::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    ExtenderPreemptionArgs, ExtenderPreemptionResult, HostPriority, NodeList, NodeMessages, Text,
};
use crate::binder::{BindError, Binder};
use crate::gate::SyncGate;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::mirror::SharedMirror;

/// What the extender's handlers share.
#[derive(Clone)]
pub struct ExtenderState {
    pub mirror: SharedMirror,
    /// `None`: binding is not configured here (bind answers with an error).
    pub binder: Option<Binder>,
    pub metrics: Arc<Metrics>,
    pub leader: Leadership,
    /// Closed until nodes, GpuNodes and pods have been listed.
    pub gate: SyncGate,
    /// The `schedulerName`s whose pods Tessera judges; others get no opinion
    /// (every node passes, every score 0). Empty: every pod.
    pub scheduler_names: Arc<[String]>,
    /// Set: a follower forwards `bind` to the leader, and a leader takes
    /// forwarded binds ([`super::forward`]). `None`: a follower refuses `bind`.
    pub peers: Option<Peers>,
}

/// Longest a call waits for the initial lists before it is answered with an
/// error (kube-scheduler's extender timeout is 5 s by default in the chart).
const SYNC_WAIT: Duration = Duration::from_secs(3);

impl ExtenderState {
    fn ours(&self, pod: &k8s_openapi::api::core::v1::Pod) -> bool {
        self.scheduler_names.is_empty()
            || self
                .scheduler_names
                .iter()
                .any(|n| n == crate::convert::scheduler_name(pod))
    }

    /// Waits for the initial lists; the error message when they are not in.
    async fn synced(&self) -> Result<(), String> {
        if self.gate.wait(SYNC_WAIT).await {
            Ok(())
        } else {
            Err(self.gate.not_synced_message())
        }
    }
}

/// The extender's routes.
pub fn router(state: ExtenderState) -> Router {
    let verbs = || {
        Router::new()
            .route("/filter", post(filter))
            .route("/prioritize", post(prioritize))
            .route("/bind", post(bind))
            .route("/preempt", post(preempt))
    };
    Router::new()
        .merge(verbs())
        .nest("/scheduler", verbs())
        .merge(ops_routes())
        .with_state(state)
}

/// Health, readiness, metrics, the web view and chargeback ([`crate::ui`]):
/// what is served on the pod's network address, while the extender's verbs
/// stay on loopback for the kube-scheduler in the same pod.
pub fn ops_router(state: ExtenderState) -> Router {
    let ui = crate::ui::router(state.mirror.clone(), state.metrics.clone());
    ops_routes().with_state(state).merge(ui)
}

fn ops_routes() -> Router<ExtenderState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route(PEER_BIND_PATH, post(peer_bind))
}

fn decode<'a, T: Deserialize<'a>>(verb: &str, body: &'a [u8]) -> Result<T, (StatusCode, String)> {
    let bad = |e: &dyn std::fmt::Display| {
        (
            StatusCode::BAD_REQUEST,
            format!("{verb}: request body is not a valid extender message: {e}\n"),
        )
    };
    // One UTF-8 check of the whole body, not one per string (thousands of node names).
    let text = std::str::from_utf8(body).map_err(|e| bad(&e))?;
    serde_json::from_str(text).map_err(|e| bad(&e))
}

/// Encodes `value` into a buffer sized for it up front (`bytes_hint`), so a
/// 5,000-node answer is not copied over and over as the buffer grows.
fn json_sized<T: Serialize>(value: &T, bytes_hint: usize) -> Response {
    let mut buf = Vec::with_capacity(bytes_hint.max(128));
    match serde_json::to_writer(&mut buf, value) {
        Ok(()) => ([(header::CONTENT_TYPE, "application/json")], buf).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn json<T: Serialize>(value: &T) -> Response {
    json_sized(value, 128)
}

async fn filter(State(st): State<ExtenderState>, body: Bytes) -> Response {
    let args: ExtenderArgs<'_> = match decode("filter", &body) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    if let Err(error) = st.synced().await {
        return json(&ExtenderFilterResult {
            error,
            ..ExtenderFilterResult::default()
        });
    }
    let started = Instant::now();
    let names = args.candidate_names();
    // Node objects in the body are never taken into the mirror: only the watch is trusted.
    let outcome = if st.ours(&args.pod) {
        st.mirror.lock().filter(&args.pod, &names)
    } else if let Some(resource) = crate::binder::tessera_resource(&args.pod) {
        // Another profile's pod asking for Tessera's resources: it gets no grant
        // whatever the node, so no node (bind would refuse it too).
        let why: Arc<str> = Arc::from(format!(
            "the pod asks for {resource} but its schedulerName {:?} is not one Tessera serves",
            crate::convert::scheduler_name(&args.pod)
        ));
        Ok(crate::mirror::FilterOutcome {
            unresolvable: names.iter().map(|n| (*n, why.clone())).collect(),
            ..Default::default()
        })
    } else {
        // Not a pod of ours (another profile shares this extender): no opinion.
        Ok(crate::mirror::FilterOutcome {
            passed: names.clone(),
            ..Default::default()
        })
    };
    st.metrics.observe_decision("filter", started.elapsed());
    let o = match outcome {
        Err(e) => {
            return json(&ExtenderFilterResult {
                error: e.to_string(),
                ..ExtenderFilterResult::default()
            });
        }
        Ok(o) => o,
    };
    let (nodes, node_names) = match (&args.node_names, &args.nodes) {
        (Some(_), _) | (None, None) => (
            None,
            Some(o.passed.iter().map(|n| Text::from(*n)).collect()),
        ),
        (None, Some(list)) => {
            let keep: std::collections::HashSet<&str> = o.passed.iter().copied().collect();
            let items = list
                .items
                .iter()
                .filter(|n| n.metadata.name.as_deref().is_some_and(|x| keep.contains(x)))
                .cloned()
                .collect();
            (
                Some(NodeList {
                    metadata: list.metadata.clone(),
                    items,
                }),
                None,
            )
        }
    };
    let hint = 128 + (o.passed.len() + o.failed.len() + o.unresolvable.len()) * 48;
    json_sized(
        &ExtenderFilterResult {
            nodes,
            node_names,
            failed_nodes: messages(&o.failed),
            failed_and_unresolvable_nodes: messages(&o.unresolvable),
            error: String::new(),
        },
        hint,
    )
}

/// Messages as the wire map, borrowing names and texts.
fn messages<'a>(list: &'a [(&str, Arc<str>)]) -> NodeMessages<'a> {
    NodeMessages(
        list.iter()
            .map(|(n, m)| (Text::from(*n), Text::from(&**m)))
            .collect(),
    )
}

async fn prioritize(State(st): State<ExtenderState>, body: Bytes) -> Response {
    let args: ExtenderArgs<'_> = match decode("prioritize", &body) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    if let Err(e) = st.synced().await {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("prioritize: {e}\n"),
        )
            .into_response();
    }
    let started = Instant::now();
    let names = args.candidate_names();
    let scores = if st.ours(&args.pod) {
        st.mirror.lock().prioritize(&args.pod, &names)
    } else {
        Ok(names.iter().map(|n| (*n, 0)).collect())
    };
    st.metrics.observe_decision("prioritize", started.elapsed());
    match scores {
        Ok(s) => json_sized(
            &s.iter()
                .map(|(host, score)| HostPriority {
                    host: (*host).into(),
                    score: *score,
                })
                .collect::<Vec<_>>(),
            64 + s.len() * (32 + s.first().map_or(0, |(h, _)| h.len())),
        ),
        // Prioritize has no error field; kube-scheduler ignores a failed call.
        Err(e) => (StatusCode::BAD_REQUEST, format!("prioritize: {e}\n")).into_response(),
    }
}

async fn bind(State(st): State<ExtenderState>, body: Bytes) -> Response {
    let args: ExtenderBindingArgs = match decode("bind", &body) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let started = Instant::now();
    let error = match &st.binder {
        None => "binding is not enabled on this Tessera extender".to_string(),
        Some(b) => match &st.peers {
            None => bind_here(b, &args)
                .await
                .err()
                .map_or(String::new(), |e| e.to_string()),
            Some(peers) => bind_anywhere(&st, b, peers, &args, &body).await,
        },
    };
    st.metrics.observe_decision("bind", started.elapsed());
    if !error.is_empty() {
        st.metrics.bind_failed();
        tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, %error, "bind failed");
    }
    json(&ExtenderBindingResult { error })
}

async fn bind_here(b: &Binder, args: &ExtenderBindingArgs) -> Result<(), BindError> {
    b.bind(
        &args.pod_namespace,
        &args.pod_name,
        &args.pod_uid,
        &args.node,
    )
    .await
}

/// Pause between tries while no leader takes a bind.
const FORWARD_RETRY: Duration = Duration::from_millis(100);

/// Binds here while this replica leads, else forwards to the leader the Lease
/// names; with neither (a failover in progress), waits and tries again up to
/// [`Peers::wait`]. Returns the error text ("" when bound).
async fn bind_anywhere(
    st: &ExtenderState,
    b: &Binder,
    peers: &Peers,
    args: &ExtenderBindingArgs,
    body: &Bytes,
) -> String {
    let deadline = Instant::now() + peers.wait();
    let mut last = String::from("no replica leads");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if st.leader.is_leader() {
            match bind_here(b, args).await {
                // Lost the lead between the check and the write: ask the next leader.
                Err(BindError::NotLeader) => last = BindError::NotLeader.to_string(),
                r => return r.err().map_or(String::new(), |e| e.to_string()),
            }
        } else if let Some(endpoint) = st.leader.leader_endpoint() {
            match peers.forward(&endpoint, body, left).await {
                Ok(Forwarded::Answered(answer)) => {
                    return match serde_json::from_slice::<ExtenderBindingResult>(&answer) {
                        Ok(r) => r.error,
                        Err(e) => format!("the leader at {endpoint} answered bind with {e}"),
                    };
                }
                Ok(Forwarded::NotLeader) => last = format!("{endpoint} no longer leads"),
                Err(e) => last = e,
            }
            tracing::debug!(pod = %args.pod_name, error = %last, "forwarding bind; retrying");
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return format!(
                "this replica does not lead and no leader took the bind within {:.1} s ({last}); kube-scheduler retries it",
                peers.wait().as_secs_f64()
            );
        }
        st.leader.changed_within(FORWARD_RETRY.min(left)).await;
    }
}

/// A bind forwarded by a follower: only the leader takes it; anyone else
/// answers 503 so that the follower asks the next leader.
async fn peer_bind(
    State(st): State<ExtenderState>,
    headers: http::HeaderMap,
    body: Bytes,
) -> Response {
    let Some(peers) = &st.peers else {
        return (StatusCode::NOT_FOUND, "forwarding is not enabled here\n").into_response();
    };
    if let Err(e) = peers.verify(&headers, PEER_BIND_PATH, &body) {
        tracing::warn!(error = %e, "refused a forwarded bind");
        return (StatusCode::UNAUTHORIZED, format!("{e}\n")).into_response();
    }
    let args: ExtenderBindingArgs = match decode("bind", &body) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let Some(b) = &st.binder else {
        return (StatusCode::NOT_FOUND, "binding is not enabled here\n").into_response();
    };
    if !st.leader.is_leader() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not the leader\n").into_response();
    }
    let started = Instant::now();
    let error = match bind_here(b, &args).await {
        Ok(()) => String::new(),
        Err(BindError::NotLeader) => {
            return (StatusCode::SERVICE_UNAVAILABLE, "not the leader\n").into_response();
        }
        Err(e) => e.to_string(),
    };
    st.metrics.observe_decision("bind", started.elapsed());
    if !error.is_empty() {
        tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, %error, "forwarded bind failed");
    }
    json(&ExtenderBindingResult { error })
}

async fn preempt(State(st): State<ExtenderState>, body: Bytes) -> Response {
    let args: ExtenderPreemptionArgs = match decode("preempt", &body) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    if let Err(e) = st.synced().await {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("preempt: {e}\n")).into_response();
    }
    let started = Instant::now();
    let candidates = args.meta_victims();
    let chosen = if st.ours(&args.pod) {
        let now_s = u64::try_from(k8s_openapi::jiff::Timestamp::now().as_second()).unwrap_or(0);
        super::preempt::choose(&mut st.mirror.lock(), &args.pod, &candidates, now_s)
    } else {
        // Not a pod of ours: no opinion, kube-scheduler's candidates stand.
        Ok(candidates
            .into_iter()
            .filter(|(_, v)| !v.pods.is_empty())
            .collect())
    };
    st.metrics.observe_decision("preempt", started.elapsed());
    match chosen {
        Ok(nodes) => json(&ExtenderPreemptionResult {
            node_name_to_meta_victims: nodes,
        }),
        Err(e) => (StatusCode::BAD_REQUEST, format!("preempt: {e}\n")).into_response(),
    }
}

/// Ready once the initial lists are in, leader or not: a follower answers
/// filter and prioritize from its own mirror, so a failover has no gap. The body
/// says which, and the last leader-election error if the last attempt failed.
async fn ready(State(st): State<ExtenderState>) -> Response {
    if !st.gate.is_synced() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not synced: {}\n", st.gate.not_synced_message()),
        )
            .into_response();
    }
    let role = if st.leader.is_leader() {
        "leader"
    } else {
        "follower"
    };
    let text = match st.leader.last_error() {
        Some(e) => format!("{role}; leader election failing: {e}\n"),
        None => format!("{role}\n"),
    };
    (StatusCode::OK, text).into_response()
}

async fn metrics(State(st): State<ExtenderState>) -> Response {
    // Under the lock only copies; the fragmentation of every node is computed
    // after, on a blocking thread (issue 28 item 9: it ran under the lock on an
    // async worker, and the verbs waited for it).
    let figures = {
        let mut m = st.mirror.lock();
        crate::metrics::ClusterFigures::read(&mut m)
    };
    st.metrics.set_state(
        st.leader.is_leader(),
        st.leader.errors(),
        st.gate.is_synced(),
    );
    let metrics = st.metrics.clone();
    let encoded = tokio::task::spawn_blocking(move || {
        metrics.apply_cluster(figures);
        metrics.encode()
    })
    .await;
    match encoded {
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        Ok(Ok(text)) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
    }
}
