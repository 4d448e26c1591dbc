//! Standalone mode: Tessera places and binds pods whose `schedulerName` is ours,
//! with no kube-scheduler in front.
//!
//! Besides the core's GPU, CPU and memory fit, it honours what kube-scheduler
//! would check for such pods: `nodeSelector`, required node affinity, taints
//! and tolerations, cordoned and not-ready nodes. A pod that fits nowhere gets a
//! `FailedScheduling` event with the aggregated reason sentence and is retried
//! with exponential backoff (1 s doubling to 60 s); a malformed request gets the
//! parser's message. Only the leader places pods; it starts the moment it
//! gains leadership, and nothing is placed before the initial lists are in.
//!
//! Also checked, as the kubelet would refuse otherwise: the node's pod count,
//! ephemeral storage and extended resources (device-plugin slots), see
//! [`crate::hostfit`]. Not evaluated here — such pods are refused with a clear
//! event rather than placed wrongly (use extender mode, where kube-scheduler
//! judges them): host ports, required inter-pod (anti-)affinity, hard topology
//! spread constraints, and volumes whose PersistentVolumes may carry node
//! affinity (persistentVolumeClaim, ephemeral). Preferred (soft) terms are ignored.
//!
//! Gangs: pods labelled `scheduling.x-k8s.io/pod-group` (scheduler-plugins'
//! `PodGroup`, so coscheduling manifests work unchanged) are placed all or
//! nothing, at least `minMember` of them together; see [`Standalone::pass`].
//!
//! DRA: with `--dra`, pods with `spec.resourceClaims` get their claims
//! allocated by Tessera before they are bound; see [`claims`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::binder::Binder;
use crate::convert::{self};
use crate::events::{EventSink, Publisher};
use crate::extender::preempt::priority;
use crate::gate::SyncGate;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::mirror::{Mirror, Reservation, SharedMirror, gang_of};
pub use crate::preemptor::DEFAULT_MIN_RUNTIME;
use crate::preemptor::{Nominated, Preemptor};

pub mod claims;
pub mod condition;
mod dra_preempt;
mod eligible;
mod gang;

pub use claims::{Dra, PlaceError};

pub use eligible::{node_allows, node_constraints_key, selector_matches, unsupported};

/// First retry delay after a failed attempt.
pub const BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A pod that failed: its backoff, and what wakes it before the backoff ends.
#[derive(Debug, Clone)]
struct Retry {
    failures: u32,
    failed: Instant,
    /// When the backoff ends.
    at: Instant,
    reason: String,
    /// The pod's resourceVersion when it failed.
    version: Option<String>,
    /// [`Standalone::released`] when it failed.
    released: u64,
}

impl Retry {
    /// Whether the pod still waits at `now`. As kube-scheduler requeues an
    /// unschedulable pod on a cluster event that may make it fit, a pod is
    /// tried again, one initial backoff after its failure at the latest, when
    /// it changed (e.g. the resourceclaim controller named its claim in its
    /// status) or room was given back since (a pod gone, a claim released):
    /// waiting out a doubled backoff made template-claim pods on a real 1.36
    /// cluster wait 7 s after their claim was made or a GPU was freed.
    fn waits(&self, pod: &Pod, now: Instant, released: u64) -> bool {
        if self.at <= now {
            return false;
        }
        let event = released != self.released || pod.metadata.resource_version != self.version;
        !(event && self.failed + BACKOFF_START <= now)
    }

    /// When the loop should look at it again: one initial backoff after the
    /// failure (an event meanwhile makes it due then), else at its backoff's end.
    fn due(&self, now: Instant) -> Instant {
        let woken = self.failed + BACKOFF_START;
        if woken > now {
            woken.min(self.at)
        } else {
            self.at
        }
    }
}

/// The delay before attempt `failures + 1`: 1 s, 2 s, 4 s … capped at 60 s.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    (BACKOFF_START * 2u32.pow(exp)).min(BACKOFF_MAX)
}

/// Binds in flight at most; further pods wait for the next pass (kube-scheduler
/// binds in goroutines after its assume step, unbounded; this bounds memory
/// and the API server's load from one scheduler).
pub const MAX_BINDS_IN_FLIGHT: usize = 128;

/// How long a shutdown waits for binds in flight and queued events.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(10);

/// A decision held in the mirror, to be written.
struct Decided {
    node: String,
    annotation: Option<String>,
}

/// What a finished bind task reports.
type Finished = (Pod, String, Result<(), PlaceError>);

/// [`Standalone::decide`] on a mirror the caller has locked (a gang decides
/// all its members under one lock); nodes held for preemptors (`nominated`)
/// are not for pods of no higher priority.
fn decide_locked(
    m: &mut Mirror,
    metrics: &Metrics,
    pod: &Pod,
    nominated: &Nominated,
) -> Result<Decided, (String, String)> {
    let started = Instant::now();
    let catalog = m.cluster().catalog.clone();
    let invalid = |e: String| (e, "invalid request".to_string());
    let asks = convert::pod_asks(pod, &catalog);
    let req = asks.request.map_err(|e| invalid(e.to_string()))?;
    let host = asks.host.map_err(invalid)?;
    if let Some(why) = unsupported(pod) {
        return Err((why, "unsupported".to_string()));
    }
    if crate::dra::pod::uses_claims(pod) {
        // Pods with claims, in gangs or not, are decided by
        // `claims::decide_dra_locked`; placed from here, they would be bound
        // with their claims unallocated.
        return Err((
            format!(
                "pod {} uses DRA ResourceClaims: it is placed only once its claims are allocated",
                convert::pod_key(pod)
            ),
            "unsupported".to_string(),
        ));
    }
    if let crate::mirror::QuotaCheck::Refused(why) = m.quota(pod, &req) {
        return Err((why, "queue quota".to_string()));
    }
    let decided = m.decide(&req, &host, |facts| {
        node_allows(pod, facts).and_then(|()| nominated.check(pod, &facts.name))
    });
    metrics.observe_decision("standalone", started.elapsed());
    let (placement, _) = decided.map_err(|e| (e.to_string(), e.top_reason()))?;
    let node = m.cluster().node(placement.node).name.clone();
    match m.hold(pod, placement, req, host) {
        Ok(Reservation::Write { annotation }) => Ok(Decided { node, annotation }),
        Ok(Reservation::AlreadyBound) => Err((
            format!("pod {} is bound already", convert::pod_key(pod)),
            "bound".to_string(),
        )),
        Err(e) => Err((e.to_string(), "ledger refused".to_string())),
    }
}

/// The standalone scheduler loop.
pub struct Standalone {
    pub scheduler_name: String,
    pub mirror: SharedMirror,
    pub binder: Binder,
    pub leader: Leadership,
    pub metrics: Arc<Metrics>,
    /// Where events go (published off the scheduling path).
    events: Option<EventSink>,
    /// Woken by the pod watcher when something changed.
    pub wake: Arc<Notify>,
    /// Failed pods: when and why, and when to retry.
    retries: HashMap<String, Retry>,
    /// [`Standalone::released`] at the start of the pass under way.
    pass_released: u64,
    /// Binds whose API call is in flight.
    binds: JoinSet<Finished>,
    /// Closed until the initial lists are in.
    gate: SyncGate,
    /// Evicts for pods that fit nowhere (see [`crate::preemptor`]).
    preemptor: Preemptor,
    /// Whether pods' DRA claims are allocated (see [`claims`]).
    dra: Dra,
}

/// `pods` tried in order: by their queue keys (lower first) when queues are
/// defined, then highest priority, then oldest, then by name.
fn in_order(pods: Vec<Pod>, keys: Option<Vec<Vec<f64>>>) -> Vec<Pod> {
    let mut order: Vec<(Vec<f64>, Pod)> = match keys {
        Some(k) => k.into_iter().zip(pods).collect(),
        None => pods.into_iter().map(|p| (Vec::new(), p)).collect(),
    };
    order.sort_by(|(ka, a), (kb, b)| {
        ka.partial_cmp(kb)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| priority(b).cmp(&priority(a)))
            .then_with(|| {
                a.metadata
                    .creation_timestamp
                    .cmp(&b.metadata.creation_timestamp)
            })
            .then_with(|| convert::pod_key(a).cmp(&convert::pod_key(b)))
    });
    order.into_iter().map(|(_, p)| p).collect()
}

impl Standalone {
    /// A scheduler loop; with a `recorder`, its events are published by a task
    /// spawned on the current runtime.
    pub fn new(
        scheduler_name: String,
        mirror: SharedMirror,
        binder: Binder,
        leader: Leadership,
        metrics: Arc<Metrics>,
        recorder: Option<Publisher>,
        wake: Arc<Notify>,
    ) -> Standalone {
        let events = recorder.map(EventSink::spawn);
        let mut preemptor = Preemptor::new(mirror.clone(), binder.client().clone(), events.clone());
        preemptor.metrics = Some(metrics.clone());
        Standalone {
            scheduler_name,
            mirror,
            binder,
            leader,
            metrics,
            events,
            wake,
            retries: HashMap::new(),
            pass_released: 0,
            binds: JoinSet::new(),
            gate: SyncGate::synced(),
            preemptor,
            dra: Dra::Off,
        }
    }

    /// Allocates pods' DRA claims from `dra` (the `--dra` flag).
    pub fn with_dra(mut self, dra: Dra) -> Standalone {
        self.dra = dra;
        self
    }

    /// Pods younger than `d` are never evicted for others (default
    /// [`DEFAULT_MIN_RUNTIME`]).
    pub fn with_min_runtime(mut self, d: Duration) -> Standalone {
        self.preemptor.min_runtime = d;
        self
    }

    /// Places nothing before `gate` opens.
    pub fn with_gate(mut self, gate: SyncGate) -> Standalone {
        self.gate = gate;
        self
    }

    /// Pods of ours waiting for a node, in the order they are tried: the pods
    /// of the queue furthest below its fair share first (when queues are
    /// defined), then highest priority, then oldest. A pod whose bind is in
    /// flight is held in the mirror and not listed; a pod behind scheduling
    /// gates (Kueue's admission, for one) is not ours to place until they are gone.
    pub fn pending(&self) -> Vec<Pod> {
        let mut m = self.mirror.lock();
        let pods: Vec<Pod> = m.waiting_pods().filter(|p| self.ours(p)).cloned().collect();
        let keys = m.queue_order(&pods);
        drop(m);
        in_order(pods, keys)
    }

    /// Room given back so far: holdings the mirror released plus claims the
    /// DRA view saw give devices back.
    fn released(&self) -> u64 {
        let m = self.mirror.lock().released();
        match &self.dra {
            Dra::On(view) => m + view.lock().released(),
            _ => m,
        }
    }

    /// Whether `pod` still waits out its backoff at `now`, given `released`.
    fn backing_off(&self, pod: &Pod, now: Instant, released: u64) -> bool {
        self.retries
            .get(convert::pod_uid(pod))
            .is_some_and(|r| r.waits(pod, now, released))
    }

    fn ours(&self, p: &Pod) -> bool {
        convert::scheduler_name(p) == self.scheduler_name && !convert::is_gated(p)
    }

    /// What a pass tries, in [`Standalone::pending`]'s order, and the UIDs of
    /// every pod of ours still waiting. Without queues a pod in its backoff
    /// (and in no gang) is not copied: a pass runs on every placement change,
    /// and copying 10,000 pods that wait for a retry on each was most of its
    /// work (issue 28 item 9). With queues every waiting pod counts towards
    /// its queue's demand, so all are listed as before.
    pub fn to_try(&self, now: Instant) -> (Vec<Pod>, HashSet<String>) {
        let mut m = self.mirror.lock();
        let live: HashSet<String> = m
            .waiting_pods()
            .filter(|p| self.ours(p))
            .map(|p| convert::pod_uid(p).to_string())
            .collect();
        let queued = m.queue_tree().is_some();
        let released = self.pass_released;
        let due = |p: &Pod| queued || gang_of(p).is_some() || !self.backing_off(p, now, released);
        let pods: Vec<Pod> = m
            .waiting_pods()
            .filter(|p| self.ours(p) && due(p))
            .cloned()
            .collect();
        let keys = m.queue_order(&pods);
        drop(m);
        (in_order(pods, keys), live)
    }

    /// Decides a pod's node and holds the placement in the mirror, in one
    /// critical section (the ledger is the one truth: the next decision sees
    /// this one). `Err` carries the event sentence and the metrics reason.
    fn decide(&self, pod: &Pod) -> Result<Decided, (String, String)> {
        let nominated = self.preemptor.nominated();
        decide_locked(&mut self.mirror.lock(), &self.metrics, pod, &nominated)
    }

    fn spawn_bind(&mut self, pod: Pod, d: Decided) {
        let binder = self.binder.clone();
        self.binds.spawn(async move {
            let outcome = binder.write(&pod, &d.node, d.annotation).await;
            (pod, d.node, outcome.map_err(PlaceError::from))
        });
    }

    fn record(&self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        if let Some(events) = &self.events {
            events.pod_event(pod, type_, reason, note);
        }
    }

    fn failed(&mut self, pod: &Pod, message: String, reason: String) {
        // A failed write (bind, claim) is no PodScheduled=False: the pod was placed.
        let placed = matches!(reason.as_str(), "bind failed" | "claim write failed");
        let uid = convert::pod_uid(pod).to_string();
        let failures = self.retries.get(&uid).map_or(0, |r| r.failures) + 1;
        let now = Instant::now();
        self.retries.insert(
            uid,
            Retry {
                failures,
                failed: now,
                at: now + backoff(failures),
                reason,
                version: pod.metadata.resource_version.clone(),
                released: self.pass_released,
            },
        );
        // PodScheduled=False, as kube-scheduler shows a pod it could not place
        // (written when what the pod shows would change).
        if self.leader.is_leader() && !placed {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            if let Some(patch) = condition::unschedulable_patch(pod, &message, &now) {
                condition::write(self.binder.client(), &self.mirror, pod, patch);
            }
        }
        self.record(pod, EventType::Warning, "FailedScheduling", message);
    }

    /// Takes a finished bind's outcome: an event, and the pod back in the
    /// queue (its GPUs freed by the binder) when the bind failed.
    fn finish(&mut self, done: Result<Finished, tokio::task::JoinError>) {
        let Ok((pod, node, outcome)) = done else {
            return;
        };
        match outcome {
            Ok(()) => {
                self.retries.remove(convert::pod_uid(&pod));
                self.record(
                    &pod,
                    EventType::Normal,
                    "Scheduled",
                    format!("Successfully assigned {} to {node}", convert::pod_key(&pod)),
                );
            }
            Err(e @ PlaceError::Bind(_)) => {
                self.metrics.bind_failed();
                self.failed(&pod, e.to_string(), "bind failed".into())
            }
            Err(e) => self.failed(&pod, e.to_string(), "claim write failed".into()),
        }
    }

    /// One pass over the pending pods whose backoff has expired: each is
    /// decided and held at once, and its bind written in the background;
    /// returns when the next retry is due (if any pod is waiting).
    pub async fn pass(&mut self) -> Option<Instant> {
        while let Some(done) = self.binds.try_join_next() {
            self.finish(done);
        }
        if !self.leader.is_leader() || !self.gate.is_synced() {
            return None;
        }
        // Binds with an unknown outcome past their deadline: the server says how they ended.
        self.binder.settle_expired().await;
        let now = Instant::now();
        // Taken before the pass: a release during it wakes the pods it fails.
        self.pass_released = self.released();
        // Claims' devices count in their pods' queues before the order is made.
        if let Dra::On(view) = &self.dra {
            let (mut m, mut v) = (self.mirror.lock(), view.lock());
            claims::count_claims(&mut m, &mut v);
            claims::tell_problems(&mut m, &mut v, &self.metrics);
        }
        let (pending, live) = self.to_try(now);
        tracing::debug!(
            to_try = pending.len(),
            waiting = live.len(),
            binds = self.binds.len(),
            "scheduling pass"
        );
        self.retries.retain(|uid, _| live.contains(uid));
        self.preemptor.retain(|uid| live.contains(uid));
        // A gang's waiting members, in the order of the pending list; the gang is
        // tried where its first member comes.
        let mut gangs: HashMap<String, Vec<Pod>> = HashMap::new();
        for p in &pending {
            if let Some(g) = gang_of(p) {
                gangs.entry(g).or_default().push(p.clone());
            }
        }
        for pod in pending {
            // At the cap, wait here for a bind to finish and go on down this list:
            // leaving the pass instead would list, order and copy every waiting
            // pod again for each bind that finishes (quadratic in a backlog).
            while self.binds.len() >= MAX_BINDS_IN_FLIGHT {
                match self.binds.join_next().await {
                    Some(done) => self.finish(done),
                    None => break,
                }
            }
            if !self.leader.is_leader() {
                break;
            }
            let uid = convert::pod_uid(&pod).to_string();
            if self.backing_off(&pod, now, self.pass_released) {
                continue;
            }
            if crate::dra::pod::uses_claims(&pod) && gang_of(&pod).is_none() {
                self.attempt_dra(pod).await;
                continue;
            }
            if let Some(g) = gang_of(&pod) {
                if let Some(members) = gangs.remove(&g) {
                    self.attempt_gang(&g, members);
                }
                continue;
            }
            let decided = self.decide(&pod);
            tracing::debug!(pod = %convert::pod_key(&pod), placed = ?decided.as_ref().map(|d| &d.node).map_err(|e| &e.1), "decided");
            match decided {
                Err((message, reason)) => match self.preemptor.try_for(&pod, &reason).await {
                    Some(preempting) => self.failed(
                        &pod,
                        format!("{message}; {preempting}"),
                        "preempting".into(),
                    ),
                    None => self.failed(&pod, message, reason),
                },
                Ok(d) => {
                    self.preemptor.placed(&uid);
                    self.spawn_bind(pod, d)
                }
            }
        }
        let mut waiting: BTreeMap<&str, i64> = BTreeMap::new();
        for r in self.retries.values() {
            *waiting.entry(r.reason.as_str()).or_default() += 1;
        }
        self.metrics.set_pending(waiting);
        let now = Instant::now();
        self.retries.values().map(|r| r.due(now)).min()
    }

    /// Waits for every bind in flight and every queued event (tests, shutdown).
    pub async fn flush(&mut self) {
        while let Some(done) = self.binds.join_next().await {
            self.finish(done);
        }
        if let Some(events) = &self.events {
            events.flush().await;
        }
    }

    /// Runs passes until `shutdown` resolves: after every wake-up from the
    /// watcher, when a bind finishes, when a retry is due, and at least every 10 s.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let next = self.pass().await;
            let sleep = next
                .map(|at| at.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(10))
                .min(Duration::from_secs(10));
            let wake = self.wake.clone();
            let leader = self.leader.clone();
            let gate = self.gate.clone();
            let binding = !self.binds.is_empty();
            tokio::select! {
                _ = &mut shutdown => {
                    // Binds in flight are bounded by their own timeouts.
                    let _ = tokio::time::timeout(SHUTDOWN_FLUSH, self.flush()).await;
                    return;
                }
                _ = wake.notified() => {}
                Some(done) = self.binds.join_next(), if binding => self.finish(done),
                // A new leader starts at once, not at the next periodic pass.
                _ = leader.changed() => {}
                _ = gate.wait(Duration::from_secs(3600)), if !gate.is_synced() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap() {
        let secs: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    /// Issue 41, defect 13 (real 1.36, template-claim pods): a pod in a long
    /// backoff waited it out after its claim was made or a GPU was freed. It
    /// is tried again one initial backoff after its failure once the pod
    /// changed or room was given back, and otherwise at its backoff's end.
    #[test]
    fn an_event_wakes_a_pod_from_its_backoff() {
        let t0 = Instant::now();
        let mut pod = Pod::default();
        pod.metadata.resource_version = Some("7".into());
        let r = Retry {
            failures: 4,
            failed: t0,
            at: t0 + backoff(4),
            reason: "claims do not fit".into(),
            version: Some("7".into()),
            released: 3,
        };
        let later = t0 + Duration::from_secs(2);
        assert!(r.waits(&pod, later, 3), "nothing happened: it waits");
        assert!(!r.waits(&pod, later, 4), "room given back");
        assert!(
            r.waits(&pod, t0 + Duration::from_millis(500), 4),
            "not before one initial backoff"
        );
        let mut changed = pod.clone();
        changed.metadata.resource_version = Some("8".into());
        assert!(!r.waits(&changed, later, 3), "the pod changed");
        assert!(!r.waits(&pod, t0 + backoff(4), 3), "its backoff is over");
        assert_eq!(r.due(t0), t0 + BACKOFF_START);
        assert_eq!(r.due(later), t0 + backoff(4));
    }
}
