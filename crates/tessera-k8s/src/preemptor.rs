//! Tessera preempts on its own, in both modes: for a pod that fits nowhere, the
//! mirror's plan ([`Mirror::preemption`]: priority within a queue, reclaim of
//! borrowed quota across queues, device-aware, budgets respected) is carried
//! out through the eviction API, each eviction with the victim's UID as
//! precondition (a pod re-created under the same name is never evicted by
//! mistake). The API server checks PodDisruptionBudgets again (429): a victim it
//! refuses stays, and the preemptor waits. While its victims are leaving, the
//! preemptor waits for them (up to [`PREEMPTION_WAIT`]) instead of choosing
//! more; it is placed once they are gone (by the standalone loop, or by
//! kube-scheduler's next attempt in extender mode).
//!
//! Extender mode needs this because kube-scheduler (before kubernetes/kubernetes#135486) never calls the
//! extender's `preempt` verb for `tessera.io` pods: its dry run counts no
//! victims for resources it ignores (`ignoredByScheduler`). [`run_for_extender`]
//! therefore looks for pods of ours that kube-scheduler marked unschedulable.
//!
//! Standalone pods whose devices are DRA claims are planned elsewhere
//! ([`crate::dra::preempt`]: their devices are in the DRA view, not the
//! ledger) and evicted here, by [`Preemptor::carry_out`], the same way.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;

use crate::convert;
use crate::events::EventSink;
use crate::extender::preempt::priority;
use crate::gate::SyncGate;
use crate::leader::Leadership;
use crate::mirror::{Mirror, PreemptionPlan, SharedMirror, may_preempt_for, victims_text};

/// How long a preemptor waits for its victims to leave before planning again.
pub const PREEMPTION_WAIT: Duration = Duration::from_secs(120);

/// Reasons a decision failed for that evicting others cannot cure.
const NOT_FOR_PREEMPTION: [&str; 5] = [
    "invalid request",
    "unsupported",
    "bound",
    "ledger refused",
    "queue quota",
];

/// Pods that have run less than this are not evicted for others.
pub const DEFAULT_MIN_RUNTIME: Duration = Duration::from_secs(60);

/// Annotation the extender-mode preemptor sets (to the time, RFC 3339) on a pod
/// kube-scheduler marked unschedulable that fits a node now: kube-scheduler
/// does not watch GpuNodes, so GPUs that Tessera sees free after its last try
/// (a GpuNode report catching up with a deleted pod, a MIG layout written)
/// would otherwise wait for its five-minute flush. An update of a pod it holds
/// as unschedulable makes it try that pod again.
pub const FITS_AT_ANNOTATION: &str = "tessera.io/fits-at";

/// The least time between two [`FITS_AT_ANNOTATION`] writes on one pod.
pub const NUDGE_EVERY: Duration = Duration::from_secs(30);

/// The reason a candidate is skipped when it fits now.
const FITS_NOW: &str = "it fits a node now; kube-scheduler's next attempt places it";

/// A preemption carried out: whom it evicted, on which node, for a pod of
/// which priority, and until when the pod is waited for.
#[derive(Debug, Clone)]
struct Preempting {
    victims: Vec<String>,
    until: Instant,
    node: String,
    priority: i32,
    key: String,
}

/// Nodes held for pods that preempted there, while they wait for the room
/// they made (kube-scheduler's nominated pods): a pod of no higher priority
/// may not take it meanwhile. On a real 1.36 control plane, an older pod of
/// the same priority that waited took the GPUs a preemption had freed, and
/// the preemptor waited on.
#[derive(Debug, Clone, Default)]
pub struct Nominated {
    /// Node → (UID, `namespace/name`, priority) of each pod nominated there.
    by_node: HashMap<String, Vec<(String, String, i32)>>,
}

impl Nominated {
    /// `Err` with the reason when `node` is held for another pod of `pod`'s
    /// priority or higher.
    pub fn check(&self, pod: &Pod, node: &str) -> Result<(), String> {
        let uid = convert::pod_uid(pod);
        let mine = priority(pod);
        match self
            .by_node
            .get(node)
            .and_then(|v| v.iter().find(|(u, _, p)| u != uid && *p >= mine))
        {
            Some((_, key, _)) => Err(format!(
                "held for pod {key}, which preempted pods there and waits for the room"
            )),
            None => Ok(()),
        }
    }
}

/// Plans and carries out preemptions; remembers whom each preemptor evicted.
pub struct Preemptor {
    mirror: SharedMirror,
    client: kube::Client,
    events: Option<EventSink>,
    /// Preemptors whose victims are leaving, and the room they made.
    preempting: HashMap<String, Preempting>,
    /// Pods younger than this are never evicted for others.
    pub min_runtime: Duration,
    /// Where evictions are counted, per victim's queue.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The last line logged per candidate (extender mode), so a line is
    /// repeated only when what happens to that pod changes.
    said: HashMap<String, String>,
    /// The longest the last extender round held the mirror's lock at once
    /// (the verbs wait for it meanwhile).
    lock_hold: Duration,
    /// When each pod was last asked to be tried again ([`FITS_AT_ANNOTATION`]).
    nudged: HashMap<String, Instant>,
}

impl Preemptor {
    pub fn new(mirror: SharedMirror, client: kube::Client, events: Option<EventSink>) -> Preemptor {
        Preemptor {
            mirror,
            client,
            events,
            preempting: HashMap::new(),
            min_runtime: DEFAULT_MIN_RUNTIME,
            metrics: None,
            said: HashMap::new(),
            lock_hold: Duration::ZERO,
            nudged: HashMap::new(),
        }
    }

    /// Makes kube-scheduler try `pod` again (it fits now): sets
    /// [`FITS_AT_ANNOTATION`], with the pod's resourceVersion as precondition
    /// (a pod changed since is being tried anyway), at most every
    /// [`NUDGE_EVERY`]. Returns whether it wrote.
    pub async fn nudge(&mut self, pod: &Pod) -> bool {
        let uid = convert::pod_uid(pod).to_string();
        if self
            .nudged
            .get(&uid)
            .is_some_and(|t| t.elapsed() < NUDGE_EVERY)
        {
            return false;
        }
        let (Some(ns), Some(name), Some(rv)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
            pod.metadata.resource_version.as_deref(),
        ) else {
            return false;
        };
        self.nudged.insert(uid, Instant::now());
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": rv,
            "annotations": {FITS_AT_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string()},
        }});
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(pod = %convert::pod_key(pod), "extender preemption: it fits a node now; asked kube-scheduler to try it again ({FITS_AT_ANNOTATION})");
                true
            }
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                tracing::debug!(pod = %convert::pod_key(pod), code = e.code, "not asking kube-scheduler to try it again: it changed or is gone");
                false
            }
            Err(e) => {
                tracing::warn!(pod = %convert::pod_key(pod), error = %e, "could not ask kube-scheduler to try it again");
                false
            }
        }
    }

    /// The longest the last extender-mode round held the mirror's lock at once.
    pub fn longest_lock_hold(&self) -> Duration {
        self.lock_hold
    }

    /// Logs `line` for `pod` at info unless it is what was said last time.
    fn say(&mut self, pod: &Pod, line: String) {
        let uid = convert::pod_uid(pod).to_string();
        if self.said.get(&uid) != Some(&line) {
            tracing::info!(pod = %convert::pod_key(pod), priority = priority(pod), "extender preemption: {line}");
            self.said.insert(uid, line);
        }
    }

    /// Forgets preemptors that are no longer waiting (`live`: UIDs still waiting).
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.preempting.retain(|uid, _| live(uid));
    }

    /// `uid` was placed: its preemption is over.
    pub fn placed(&mut self, uid: &str) {
        self.preempting.remove(uid);
    }

    /// The nodes held for preemptors that still wait for the room they made
    /// (until placed, gone, or [`PREEMPTION_WAIT`] after the evictions).
    pub fn nominated(&self) -> Nominated {
        let now = Instant::now();
        let mut n = Nominated::default();
        for (uid, p) in self.preempting.iter().filter(|(_, p)| now < p.until) {
            n.by_node.entry(p.node.clone()).or_default().push((
                uid.clone(),
                p.key.clone(),
                p.priority,
            ));
        }
        n
    }

    fn record(&self, pod: &Pod, reason: &str, note: String) {
        if let Some(events) = &self.events {
            events.pod_event(pod, EventType::Normal, reason, note);
        }
    }

    /// Tries to make room for `pod` (whose decision failed for `reason`) by
    /// evicting others; returns the sentence for its event if it did, or is
    /// waiting for earlier victims to leave.
    pub async fn try_for(&mut self, pod: &Pod, reason: &str) -> Option<String> {
        self.try_explained(pod, reason).await.ok()
    }

    /// [`Preemptor::try_for`], with the reason when nothing was done (for the
    /// extender-mode log, which must say why each candidate is skipped).
    pub async fn try_explained(&mut self, pod: &Pod, reason: &str) -> Result<String, String> {
        if NOT_FOR_PREEMPTION.contains(&reason) {
            return Err(format!(
                "it fits nowhere for a reason evicting cannot cure ({reason})"
            ));
        }
        let uid = convert::pod_uid(pod).to_string();
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let plan = {
            let mut m = self.mirror.lock();
            let _held = HoldTimer::new(&mut self.lock_hold);
            // Judged with the lock released since (a chunk of an extender
            // round, a standalone decision): it may have been placed meanwhile.
            if !m.pod(&uid).is_some_and(|p| m.is_waiting(p)) {
                return Err("it is no longer waiting (placed, held or gone)".into());
            }
            if let Some(waiting) = still_leaving(&self.preempting, &m, &uid) {
                return Ok(waiting);
            }
            let catalog = m.cluster().catalog.clone();
            let req = convert::pod_request(pod, &catalog).map_err(|e| e.to_string())?;
            if convert::never_preempts(pod) {
                return Err("its preemptionPolicy is Never".into());
            }
            if !may_preempt_for(pod, &req) {
                return Err("it asks for no GPU, or is gated".into());
            }
            m.preemption(pod, &req, now_s, self.min_runtime.as_secs(), |facts| {
                crate::standalone::node_allows(pod, facts)
            })
            .ok_or_else(|| {
                format!(
                    "no set of victims makes room: none of lower priority (spec.priority {}) in \
                     its queue, preemptible, running for {} s or more and within its \
                     PodDisruptionBudget, frees what it needs on a node it may use (or the \
                     budgets are not listed yet)",
                    priority(pod),
                    self.min_runtime.as_secs()
                )
            })?
        };
        Ok(self.carry_out(pod, plan).await)
    }

    /// While the victims evicted for `uid` are leaving (up to
    /// [`PREEMPTION_WAIT`]), the sentence saying so: no new plan is made
    /// meanwhile. `m`: the mirror, locked by the caller.
    pub fn waiting_for_victims(&self, m: &Mirror, uid: &str) -> Option<String> {
        still_leaving(&self.preempting, m, uid)
    }

    /// Evicts `plan`'s victims for `pod` and remembers them (the pod then
    /// waits for them, see [`Preemptor::waiting_for_victims`]), with its
    /// events and metrics; returns the sentence for the pod's event. Plans
    /// come from [`Mirror::preemption`] or, for pods whose devices are DRA
    /// claims, from [`crate::dra::preempt`]; the caller checked leadership
    /// and that the budgets are listed.
    pub async fn carry_out(&mut self, pod: &Pod, plan: PreemptionPlan) -> String {
        let uid = convert::pod_uid(pod).to_string();
        let client = self.client.clone();
        let mut evicted = Vec::new();
        let mut refused = Vec::new();
        for v in &plan.victims {
            let api: Api<Pod> = Api::namespaced(client.clone(), &v.namespace);
            // Written out rather than with kube-rs's `Api::evict`, whose body
            // (kube 3.0) names the field `delete_options` and carries no
            // apiVersion/kind: the API server would drop the UID precondition.
            let eviction = Eviction {
                metadata: ObjectMeta {
                    name: Some(v.name.clone()),
                    namespace: Some(v.namespace.clone()),
                    ..ObjectMeta::default()
                },
                delete_options: Some(DeleteOptions {
                    preconditions: Some(Preconditions {
                        uid: Some(v.uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteOptions::default()
                }),
            };
            let sent = api
                .create_subresource::<Eviction, serde_json::Value>(
                    "eviction",
                    &v.name,
                    &PostParams::default(),
                    &eviction,
                )
                .await;
            match sent {
                Ok(_) => evicted.push(v.clone()),
                Err(kube::Error::Api(e)) if e.code == 404 => evicted.push(v.clone()),
                Err(e) => refused.push(format!("{}/{}: {e}", v.namespace, v.name)),
            }
        }
        if let Some(metrics) = &self.metrics {
            for v in &evicted {
                metrics.count_eviction(&v.queue, plan.reclaim, v.gpu_milli_seconds);
            }
        }
        // The room made is the preemptor's: `status.nominatedNodeName`, as
        // kube-scheduler sets it, which its scheduling queue honours for every
        // pod of lower priority (issue 41, defect 8). The UID in the patch is
        // its precondition.
        if !evicted.is_empty() {
            nominate(&client, pod, &plan.node).await;
        }
        let kind = if plan.reclaim {
            "reclaiming borrowed quota"
        } else {
            "preempting lower-priority pods"
        };
        let by = convert::pod_key(pod);
        if let Some(events) = &self.events {
            let m = self.mirror.lock();
            for v in &evicted {
                if let Some(victim) = m.pod(&v.uid) {
                    events.pod_event(
                        victim,
                        EventType::Normal,
                        "Preempted",
                        format!("evicted by Tessera for {by} on node {} ({kind})", plan.node),
                    );
                }
            }
        }
        self.preempting.insert(
            uid,
            Preempting {
                victims: evicted.iter().map(|v| v.uid.clone()).collect(),
                until: Instant::now() + PREEMPTION_WAIT,
                node: plan.node.clone(),
                priority: priority(pod),
                key: convert::pod_key(pod),
            },
        );
        let mut sentence = format!(
            "{kind} on node {}: evicted {}",
            plan.node,
            if evicted.is_empty() {
                "none".to_string()
            } else {
                victims_text(&evicted)
            }
        );
        if !refused.is_empty() {
            sentence.push_str(&format!("; the API refused {}", refused.join("; ")));
        }
        self.record(pod, "Preempting", sentence.clone());
        sentence
    }
}

/// Sets `pod`'s `status.nominatedNodeName` to `node` (merge patch of the status
/// with the pod's UID); a failure is logged, the preemption stands.
async fn nominate(client: &kube::Client, pod: &Pod, node: &str) {
    let (Some(ns), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
        pod.metadata.uid.as_deref(),
    ) else {
        return;
    };
    let patch =
        serde_json::json!({"metadata": {"uid": uid}, "status": {"nominatedNodeName": node}});
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    if let Err(e) = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(pod = %format!("{ns}/{name}"), node, error = %e, "nominatedNodeName not written");
    }
}

/// [`Preemptor::waiting_for_victims`] on the map itself (read while another
/// field of the preemptor is borrowed).
fn still_leaving(
    preempting: &HashMap<String, Preempting>,
    m: &Mirror,
    uid: &str,
) -> Option<String> {
    let p = preempting.get(uid)?;
    let left = p.victims.iter().filter(|v| m.pod(v).is_some()).count();
    (left > 0 && Instant::now() < p.until)
        .then(|| format!("waiting for {left} preempted pod(s) to leave"))
}

/// Most pods tried per round in extender mode (each try may plan on a copy of the ledger).
const ROUND_LIMIT: usize = 16;
/// Candidates judged per hold of the mirror's lock in an extender-mode round.
const JUDGE_CHUNK: usize = 64;

/// Whether kube-scheduler has tried `pod` and found no node (`PodScheduled`
/// False, reason `Unschedulable`).
fn marked_unschedulable(pod: &Pod) -> bool {
    scheduled_false_for(pod, "Unschedulable")
}

/// Whether kube-scheduler's last try of `pod` ended in an error
/// (`PodScheduled` False, reason `SchedulerError`: e.g. the extender could not
/// be reached). v1.28 then holds the pod until an event it watches or its
/// five-minute flush (found by tessera-e2e with Tessera killed and restarted).
fn marked_error(pod: &Pod) -> bool {
    scheduled_false_for(pod, "SchedulerError")
}

fn scheduled_false_for(pod: &Pod, reason: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some(reason)
            })
        })
}

/// One extender-mode round: pods of `names` that kube-scheduler marked
/// unschedulable and that still fit nowhere get a preemption, highest priority
/// first; returns how many evicted something (or are waiting for victims).
/// Those it marked unschedulable, or whose last try was an error, that fit
/// now are asked to be tried again ([`FITS_AT_ANNOTATION`]).
/// Each candidate's outcome is logged at info when it changes (a pod waiting
/// for minutes does not repeat its line every round).
pub async fn extender_round(p: &mut Preemptor, names: &[String]) -> usize {
    p.lock_hold = Duration::ZERO;
    // Which pods are candidates: one short pass under the lock, UIDs only.
    let candidate = |pod: &Pod| {
        names.iter().any(|n| n == convert::scheduler_name(pod))
            && !convert::is_gated(pod)
            && (marked_unschedulable(pod) || marked_error(pod))
    };
    let uids: Vec<String> = {
        let m = p.mirror.lock();
        let _held = HoldTimer::new(&mut p.lock_hold);
        m.waiting_pods()
            .filter(|pod| candidate(pod))
            .map(|pod| convert::pod_uid(pod).to_string())
            .collect()
    };
    // Judged a chunk per hold of the lock, the verbs served between chunks: a
    // round over 10,000 waiting pods held the lock for all of them at once
    // (issue 28 item 9). Pods of one shape share one decision per round.
    let mut skipped: Vec<(Pod, String)> = Vec::new();
    let mut todo: Vec<(Pod, String)> = Vec::new();
    // Keyed by the pod's node constraints too: a pod pinned to full nodes
    // does not fit now because another may go elsewhere (issue 41, defect 1).
    let mut fits: HashMap<
        (
            tessera_core::request::Request,
            crate::hostfit::HostAsk,
            String,
        ),
        Option<String>,
    > = HashMap::new();
    for chunk in uids.chunks(JUDGE_CHUNK) {
        {
            let mut m = p.mirror.lock();
            let _held = HoldTimer::new(&mut p.lock_hold);
            let catalog = m.cluster().catalog.clone();
            for uid in chunk {
                // Bound, gone or retried since the first pass: not a candidate now.
                let Some(pod) = m
                    .pod(uid)
                    .filter(|pod| m.is_waiting(pod) && candidate(pod))
                    .cloned()
                else {
                    continue;
                };
                let asks = convert::pod_asks(&pod, &catalog);
                let (req, host) = match (asks.request, asks.host) {
                    (Ok(r), Ok(h)) => (r, h),
                    (Err(e), _) => {
                        skipped.push((pod, format!("its request does not read: {e}")));
                        continue;
                    }
                    (_, Err(e)) => {
                        skipped.push((pod, format!("its CPU or memory does not read: {e}")));
                        continue;
                    }
                };
                if let crate::mirror::QuotaCheck::Refused(why) = m.quota(&pod, &req) {
                    skipped.push((pod, format!("its queue may not take more: {why}")));
                    continue;
                }
                // A pod that fits now, on a node it may use, is retried by kube-scheduler.
                let constraints = crate::standalone::node_constraints_key(&pod);
                let outcome = fits
                    .entry((req, host, constraints))
                    .or_insert_with_key(|(req, host, _)| {
                        match m.decide(req, host, |facts| {
                            crate::standalone::node_allows(&pod, facts)
                        }) {
                            Ok(_) => None,
                            Err(e) => Some(
                                e.ranked()
                                    .first()
                                    .map(|(r, _)| r.to_string())
                                    .unwrap_or_default(),
                            ),
                        }
                    })
                    .clone();
                match outcome {
                    None => skipped.push((pod, FITS_NOW.into())),
                    // Asked again only once it fits: its next try may well
                    // succeed, or say why it does not.
                    Some(_) if marked_error(&pod) => skipped.push((
                        pod,
                        "kube-scheduler's last try ended in an error; it fits nowhere now either"
                            .into(),
                    )),
                    Some(reason) => todo.push((pod, reason)),
                }
            }
        }
        tokio::task::yield_now().await;
    }
    let live: std::collections::HashSet<String> = todo
        .iter()
        .chain(&skipped)
        .map(|(pod, _)| convert::pod_uid(pod).to_string())
        .collect();
    p.retain(|uid| live.contains(uid));
    p.said.retain(|uid, _| live.contains(uid));
    p.nudged.retain(|uid, _| live.contains(uid));
    if !todo.is_empty() || !skipped.is_empty() {
        tracing::debug!(
            candidates = todo.len(),
            skipped = skipped.len(),
            "extender preemption round"
        );
    }
    let mut nudges = 0;
    for (pod, why) in skipped {
        p.say(&pod, format!("not preempting for it: {why}"));
        if why == FITS_NOW && nudges < ROUND_LIMIT && p.nudge(&pod).await {
            nudges += 1;
        }
    }
    todo.sort_by_key(|(pod, _)| std::cmp::Reverse(priority(pod)));
    let mut acted = 0;
    let more = todo.len().saturating_sub(ROUND_LIMIT);
    for (pod, reason) in todo.into_iter().take(ROUND_LIMIT) {
        match p.try_explained(&pod, &reason).await {
            Ok(done) => {
                acted += 1;
                p.say(&pod, done);
            }
            Err(why) => p.say(&pod, format!("not preempting for it: {why}")),
        }
    }
    if more > 0 {
        tracing::info!(
            left = more,
            "extender preemption round: more unschedulable pods than one round takes; the rest wait for the next"
        );
    }
    acted
}

/// Extender mode: a round every `every`, while leading and synced, until `shutdown`.
pub async fn run_for_extender(
    mut p: Preemptor,
    names: Vec<String>,
    leader: Leadership,
    gate: SyncGate,
    every: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(every);
    let mut was = "";
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {
                let now = match (leader.is_leader(), gate.is_synced()) {
                    (false, _) => "paused: this replica does not lead",
                    (true, false) => "paused: the initial lists are not in yet",
                    (true, true) => "running",
                };
                if now != was {
                    tracing::info!(every_s = every.as_secs(), schedulers = ?names, "extender preemption rounds {now}");
                    was = now;
                }
                if now == "running" {
                    extender_round(&mut p, &names).await;
                }
            }
        }
    }
}

/// Raises `*longest` to how long it lived, when dropped (put it right after
/// taking a lock, to time the hold).
struct HoldTimer<'a> {
    since: Instant,
    longest: &'a mut Duration,
}

impl<'a> HoldTimer<'a> {
    fn new(longest: &'a mut Duration) -> HoldTimer<'a> {
        HoldTimer {
            since: Instant::now(),
            longest,
        }
    }
}

impl Drop for HoldTimer<'_> {
    fn drop(&mut self) {
        *self.longest = (*self.longest).max(self.since.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;
    use crate::mirror::{Mirror, SharedMirror};

    /// Issue 28 item 9: a round over many waiting pods judged them all under
    /// one hold of the mirror's lock, with no await between them, so the verbs
    /// (which need the lock) waited for the whole round. Now the round yields
    /// between chunks: on a one-thread runtime another task runs meanwhile.
    /// Before, the probe below ran 0 times during the round.
    #[tokio::test(flavor = "current_thread")]
    async fn a_round_over_many_waiting_pods_lets_other_work_in_between() {
        let (kn, gn) = crate::bench::synthetic_objects(4);
        let policy = tessera_core::policy::by_name("tessera", &Default::default()).expect("policy");
        let mut m =
            Mirror::from_objects(policy, b"preemptor-test-key".to_vec(), kn, gn, Vec::new());
        let waiting = 10 * JUDGE_CHUNK;
        for i in 0..waiting {
            // Nine GPUs on nodes of eight: fits nowhere, and no eviction can help.
            m.upsert_pod(crate::bench::unschedulable_pod(
                &format!("stuck-{i}"),
                json!({"cpu": "1", "tessera.io/gpu": "9"}),
            ));
        }
        let mirror = SharedMirror::new(m);
        let client = kube::Client::try_from(kube::Config::new(http::Uri::from_static(
            "http://127.0.0.1:9",
        )))
        .expect("client");
        let mut p = Preemptor::new(mirror, client, None);

        let ran = Arc::new(AtomicUsize::new(0));
        let probe = {
            let ran = ran.clone();
            tokio::spawn(async move {
                loop {
                    ran.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                }
            })
        };
        tokio::task::yield_now().await; // the probe starts
        let before = ran.load(Ordering::SeqCst);
        let acted = extender_round(&mut p, &["tessera".to_string()]).await;
        let during = ran.load(Ordering::SeqCst) - before;
        probe.abort();
        assert_eq!(
            acted, 0,
            "nothing can be evicted for a pod that fits nowhere"
        );
        assert!(
            during >= 9,
            "other work ran {during} times while {waiting} pods were judged in chunks of {JUDGE_CHUNK}"
        );
    }
}
