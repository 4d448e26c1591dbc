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
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use tessera_core::request::RequestError;

use super::forward::{Forwarded, PEER_BIND_PATH, Peers};
use super::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    ExtenderPreemptionArgs, ExtenderPreemptionResult, NodeList, NodeMessages, Text,
};
use crate::binder::{BindError, Binder};
use crate::gate::SyncGate;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::mirror::{FilterOutcome, SharedMirror};

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
    /// A state that only judges: no binder, always the leader, synced, every
    /// pod its own, no peers (the benches and tests of the verbs).
    pub fn judging_only(mirror: SharedMirror) -> ExtenderState {
        ExtenderState {
            mirror,
            binder: None,
            metrics: Arc::new(Metrics::new()),
            leader: Leadership::always(),
            gate: SyncGate::synced(),
            scheduler_names: Arc::from([]),
            peers: None,
        }
    }

    fn ours(&self, pod: &Pod) -> bool {
        self.scheduler_names.is_empty()
            || self
                .scheduler_names
                .iter()
                .any(|n| n == crate::convert::scheduler_name(pod))
    }

    /// Waits for the initial lists; the error message when they are not in.
    async fn synced(&self) -> Result<(), String> {
        // Synced, the usual case: no subscription and timer per call.
        if self.gate.is_synced() || self.gate.wait(SYNC_WAIT).await {
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

pub(crate) fn decode<'a, T: Deserialize<'a>>(
    verb: &str,
    body: &'a [u8],
) -> Result<T, (StatusCode, String)> {
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
    let outcome = st.judge_filter(&args.pod, &names);
    st.metrics.observe_decision("filter", started.elapsed());
    match outcome {
        Err(e) => json(&ExtenderFilterResult {
            error: e.to_string(),
            ..ExtenderFilterResult::default()
        }),
        Ok(o) => filter_answer(&args, &o),
    }
}

impl ExtenderState {
    /// `filter`'s verdicts on `names` for `pod`. Node objects in the body are
    /// never taken into the mirror: only the watch is trusted.
    pub(crate) fn judge_filter<'a>(
        &self,
        pod: &Pod,
        names: &[&'a str],
    ) -> Result<FilterOutcome<'a>, RequestError> {
        if self.ours(pod) {
            self.mirror.lock().filter(pod, names)
        } else if let Some(resource) = crate::binder::tessera_resource(pod) {
            // Another profile's pod asking for Tessera's resources: it gets no grant
            // whatever the node, so no node (bind would refuse it too).
            let why: Arc<str> = Arc::from(format!(
                "the pod asks for {resource} but its schedulerName {:?} is not one Tessera serves",
                crate::convert::scheduler_name(pod)
            ));
            Ok(FilterOutcome {
                unresolvable: names.iter().map(|n| (*n, why.clone())).collect(),
                ..Default::default()
            })
        } else if let Some(resource) = crate::binder::stock_gpu_resource(pod) {
            // Another profile's stock GPU pod: where Tessera's agent serves that
            // resource, its Allocate refuses pods Tessera did not place, so the
            // pod would be bound and then fail at admission. Elsewhere (NVIDIA's
            // plugin): no opinion.
            let why: Arc<str> = Arc::from(format!(
                "{resource} on this node is served by Tessera's node agent, which hands GPUs only to pods Tessera places (schedulerName {:?} is not one Tessera serves)",
                crate::convert::scheduler_name(pod)
            ));
            let m = self.mirror.lock();
            let (served, passed): (Vec<&'a str>, Vec<&'a str>) =
                names.iter().partition(|n| m.serves_nvidia_gpu(n));
            Ok(FilterOutcome {
                passed,
                unresolvable: served.into_iter().map(|n| (n, why.clone())).collect(),
                ..Default::default()
            })
        } else {
            // Not a pod of ours (another profile shares this extender): no opinion.
            Ok(FilterOutcome {
                passed: names.to_vec(),
                ..Default::default()
            })
        }
    }

    /// `prioritize`'s scores on `names` for `pod`.
    pub(crate) fn judge_prioritize<'a>(
        &self,
        pod: &Pod,
        names: &[&'a str],
    ) -> Result<Vec<(&'a str, i64)>, RequestError> {
        if self.ours(pod) {
            self.mirror.lock().prioritize(pod, names)
        } else {
            Ok(names.iter().map(|n| (*n, 0)).collect())
        }
    }
}

/// `filter`'s answer: the nodes that passed in the form they came in (names,
/// or the node objects of the request), and the rejected ones with their reasons.
pub(crate) fn filter_answer(args: &ExtenderArgs<'_>, o: &FilterOutcome<'_>) -> Response {
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
    let scores = st.judge_prioritize(&args.pod, &names);
    st.metrics.observe_decision("prioritize", started.elapsed());
    match scores {
        Ok(s) => prioritize_answer(&s),
        // Prioritize has no error field; kube-scheduler ignores a failed call.
        Err(e) => (StatusCode::BAD_REQUEST, format!("prioritize: {e}\n")).into_response(),
    }
}

/// `prioritize`'s answer: a `HostPriority` per scored node.
pub(crate) fn prioritize_answer(scores: &[(&str, i64)]) -> Response {
    match encode_priorities(scores) {
        Ok(buf) => ([(header::CONTENT_TYPE, "application/json")], buf).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `[{"Host":"…","Score":…},…]`, written straight into one buffer sized for
/// it: the bytes serde_json writes for a `Vec<HostPriority>` (a test holds
/// them equal), without building that vector, and with names that need no
/// escaping (node names never do) copied as they are. Through serde_json it
/// took twice as long: 9 µs of the verb's 38 at 300 nodes (issue 30).
fn encode_priorities(scores: &[(&str, i64)]) -> Result<Vec<u8>, serde_json::Error> {
    let longest = scores.iter().map(|(h, _)| h.len()).max().unwrap_or(0);
    let mut buf = Vec::with_capacity(2 + scores.len() * (32 + longest));
    buf.push(b'[');
    for (i, (host, score)) in scores.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        buf.extend_from_slice(br#"{"Host":"#);
        push_json_str(&mut buf, host)?;
        buf.extend_from_slice(br#","Score":"#);
        serde_json::to_writer(&mut buf, score)?;
        buf.push(b'}');
    }
    buf.push(b']');
    Ok(buf)
}

/// `s` as a JSON string, as serde_json writes it: it escapes only `"`, `\`
/// and control characters, so a string with none of them is copied quoted.
fn push_json_str(buf: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
        Ok(())
    } else {
        serde_json::to_writer(buf, s)
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
            // A leader that hangs (its socket accepts, nothing answers) would
            // hold the call for all of `left`, past kube-scheduler's
            // httpTimeout, though the lead moved meanwhile: follow the lead.
            let forwarded = tokio::select! {
                r = peers.forward(&endpoint, body, left) => r,
                () = st.leader.moved_from(&endpoint) => {
                    tracing::info!(pod = %args.pod_name, from = %endpoint, "the lead moved while a forwarded bind was unanswered; asking where it is now");
                    continue;
                }
            };
            match forwarded {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::wire::tests::fixture_bodies;

    /// A state over two nodes named as in the captured bodies:
    /// `fake-gpu-node-1` with 8 H100-80GB, `fake-gpu-node-2` with 8 A100-80GB.
    fn fixture_state() -> ExtenderState {
        let (mut kn, mut gn) = crate::bench::synthetic_objects(2);
        for (i, (k, g)) in kn.iter_mut().zip(&mut gn).enumerate() {
            let name = format!("fake-gpu-node-{}", i + 1);
            k.metadata.name = Some(name.clone());
            g.metadata.name = Some(name.clone());
            g.spec.node_name = name;
        }
        let mirror = crate::bench::synthetic_mirror("tessera", kn, gn).expect("known policy");
        ExtenderState::judging_only(SharedMirror::new(mirror))
    }

    /// `ExtenderArgs` with its Pod decoded whole by k8s-openapi, as before issue 30.
    #[derive(Deserialize)]
    struct WholeArgs<'a> {
        #[serde(rename = "Pod")]
        pod: Pod,
        #[serde(rename = "Nodes", default)]
        nodes: Option<NodeList>,
        #[serde(rename = "NodeNames", default, borrow)]
        node_names: Option<Vec<Text<'a>>>,
    }

    /// Both verbs' answers to `args` (status and body), on a fresh state.
    async fn answers(args: &ExtenderArgs<'_>) -> Vec<(StatusCode, Bytes)> {
        let st = fixture_state();
        let names = args.candidate_names();
        let filtered = match st.judge_filter(&args.pod, &names) {
            Ok(o) => filter_answer(args, &o),
            Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        };
        let scored = match st.judge_prioritize(&args.pod, &names) {
            Ok(s) => prioritize_answer(&s),
            Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        };
        let mut out = Vec::new();
        for r in [filtered, scored] {
            let status = r.status();
            let body = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .expect("a body");
            out.push((status, body));
        }
        out
    }

    /// kube-scheduler's captured bodies as sent, and with the pod asking for a
    /// Tessera share (as the bind bench sends it), pinned to H100s by
    /// annotation, or asking for more than fits anywhere: the verbs answer
    /// the same whether the Pod is decoded whole or without its managed fields.
    #[tokio::test]
    async fn the_trimmed_pod_gets_the_answers_the_whole_pod_gets() {
        let mut bodies = Vec::new();
        for (name, body) in fixture_bodies() {
            let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            let share = serde_json::json!({"limits": {"cpu": "100m", "tessera.io/gpu-memory": "4Gi", "tessera.io/gpu-cores": "10"}});
            let mut asks = v.clone();
            asks["Pod"]["spec"]["containers"][0]["resources"] = share.clone();
            let mut pinned = asks.clone();
            pinned["Pod"]["metadata"]["annotations"]["tessera.io/gpu-model"] =
                serde_json::json!("H100-80GB");
            let mut too_big = v.clone();
            too_big["Pod"]["spec"]["containers"][0]["resources"] =
                serde_json::json!({"limits": {"tessera.io/gpu": "9"}});
            bodies.push((format!("{name} as sent"), body));
            for (what, v) in [("a share", asks), ("pinned", pinned), ("9 GPUs", too_big)] {
                let b = serde_json::to_vec(&v).expect("encodes");
                bodies.push((format!("{name} asking {what}"), b));
            }
        }
        let mut differing = std::collections::BTreeSet::new();
        for (name, body) in &bodies {
            let trimmed: ExtenderArgs<'_> = decode("filter", body).expect("decodes");
            let whole: WholeArgs<'_> = decode("filter", body).expect("decodes whole");
            let whole = ExtenderArgs {
                pod: whole.pod,
                nodes: whole.nodes,
                node_names: whole.node_names,
            };
            assert_ne!(
                trimmed.pod, whole.pod,
                "{name}: the body has managed fields"
            );
            let got = answers(&trimmed).await;
            assert_eq!(got, answers(&whole).await, "{name}");
            assert!(
                got.iter().all(|(s, _)| *s == StatusCode::OK),
                "{name}: {got:?}"
            );
            differing.insert(got);
        }
        // The asks lead to different answers, so an ask lost in decoding would show.
        if !bodies.is_empty() {
            assert!(differing.len() >= 4, "{differing:?}");
        }
    }

    /// The prioritize answer is the bytes serde_json writes for the list, for
    /// any name and score.
    #[test]
    fn priorities_encode_as_serde_json_does() {
        let names = [
            "fake-gpu-node-1",
            "",
            "a\"b",
            "back\\slash",
            "tab\there",
            "nul\u{0}",
            "del\u{7f}",
            "ünïcödé/節點",
            "</script>",
        ];
        let scores = [0, 10, -1, i64::MIN, i64::MAX, 7, 3, 1_000_000, 5];
        let list: Vec<(&str, i64)> = names.into_iter().zip(scores).collect();
        for n in [0, 1, list.len()] {
            let expected = serde_json::to_vec(
                &list[..n]
                    .iter()
                    .map(|(h, s)| crate::extender::wire::HostPriority {
                        host: (*h).into(),
                        score: *s,
                    })
                    .collect::<Vec<_>>(),
            )
            .expect("encodes");
            let got = encode_priorities(&list[..n]).expect("encodes");
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&expected)
            );
        }
    }
}
