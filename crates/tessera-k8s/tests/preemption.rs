//! Standalone mode preempts on its own, against kube-rs's mock API: a pod that
//! fits nowhere gets room by evicting (eviction API, UID precondition) the pods
//! the device-aware planner chooses — lower priority within its queue, or
//! borrowed quota across queues (reclaim) — never a pod a PodDisruptionBudget
//! protects, a non-preemptible one, or anything before the budgets are listed;
//! once the victims are gone it is placed.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ObjectMeta;
use tessera_k8s::mirror::{Reservation, SharedMirror};
use tessera_k8s::standalone::Standalone;

/// `name` in `ns` asking one GPU, ours, with a priority.
fn gpu_pod(ns: &str, name: &str, priority: i32) -> Pod {
    let mut p = pod(ns, name, &format!("uid-{name}"), &[("tessera.io/gpu", "1")]);
    let spec = p.spec.as_mut().unwrap();
    spec.scheduler_name = Some("tessera".into());
    spec.priority = Some(priority);
    p.metadata.labels = Some([("app".to_string(), name.to_string())].into());
    p
}

/// `p` bound to `node` with a signed allocation, as the API would show it.
fn bound(m: &SharedMirror, mut p: Pod, node: &str) -> Pod {
    let mut g = m.lock();
    let uid = p.metadata.uid.clone().unwrap();
    let Ok(Reservation::Write { annotation }) = g.reserve(&p, node) else {
        panic!("reserve {uid}")
    };
    g.unreserve(&uid);
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            tessera_core::allocation::ANNOTATION.to_string(),
            annotation.unwrap(),
        );
    p
}

/// A pod status as kube-scheduler writes it after a failed try: `PodScheduled`
/// False with `reason` (`Unschedulable`, or `SchedulerError`).
fn scheduled_false(reason: &str) -> k8s_openapi::api::core::v1::PodStatus {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some(reason.into()),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

fn pdb(ns: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(format!("guard-{app}")),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            disruptions_allowed: allowed,
            ..Default::default()
        }),
    }
}

struct World {
    s: Standalone,
    m: SharedMirror,
    api: tokio::task::JoinHandle<Vec<Seen>>,
}

/// One node with one GPU held by `holder` (bound); `waiting` pending.
fn world(holder: Pod, waiting: Pod, pdbs: Option<Vec<PodDisruptionBudget>>) -> World {
    world_answering(holder, waiting, pdbs, 201)
}

/// [`world`] whose API answers evictions with `evict_status` (429: a budget refuses).
fn world_answering(
    holder: Pod,
    waiting: Pod,
    pdbs: Option<Vec<PodDisruptionBudget>>,
    evict_status: u16,
) -> World {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    let m = mirror("tessera", nodes, inv, vec![]);
    let holder = bound(&m, holder, "n1");
    m.lock().replace_pods(vec![holder, waiting]);
    if let Some(p) = pdbs {
        m.lock().replace_pdbs(p);
    }
    let (client, api) = mock_api(move |s| {
        if s.path.ends_with("/eviction") && evict_status == 429 {
            // As kube-apiserver v1.28 answered (fixture 11-eviction-pdb.json).
            (
                429,
                status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                ),
            )
        } else {
            accept_writes(s)
        }
    });
    let s = standalone(&m, client, true).with_min_runtime(Duration::ZERO);
    World { s, m, api }
}

async fn finish(w: World) -> Vec<Seen> {
    drop(w.s);
    drop(w.m);
    w.api.await.unwrap()
}

fn evictions(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter()
        .filter(|s| s.path.ends_with("/eviction"))
        .collect()
}

#[tokio::test]
async fn a_higher_priority_pod_evicts_and_then_runs() {
    let mut w = world(
        gpu_pod("ml", "low", 0),
        gpu_pod("ml", "high", 1000),
        Some(vec![]),
    );
    w.s.pass().await;
    w.s.flush().await;
    assert!(
        w.m.lock().held("uid-high").is_none(),
        "not before the victim is gone"
    );
    // The second pass waits for the victim instead of choosing more.
    w.s.pass().await;
    // The watch shows the victim gone; past the preemptor's backoff it is placed.
    w.m.lock().remove_pod("uid-low");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    w.s.pass().await;
    w.s.flush().await;
    assert!(w.m.lock().held("uid-high").is_some());
    let seen = finish(w).await;
    let ev = evictions(&seen);
    assert_eq!(ev.len(), 1, "one eviction, not one per pass: {seen:?}");
    assert_eq!(ev[0].method, "POST");
    assert_eq!(ev[0].path, "/api/v1/namespaces/ml/pods/low/eviction");
    // Issue 41, defect 8: the room made is nominated for the preemptor, with its UID.
    let nominated: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.path == "/api/v1/namespaces/ml/pods/high/status" && s.method == "PATCH")
        .filter(|s| s.body.pointer("/status/nominatedNodeName").is_some())
        .collect();
    assert_eq!(nominated.len(), 1, "{seen:?}");
    assert_eq!(nominated[0].body["metadata"]["uid"], "uid-high");
    // The body as kube-apiserver expects it (fixture 11-eviction-pdb.json), with the UID precondition.
    assert_eq!(ev[0].body["kind"], "Eviction", "{:?}", ev[0].body);
    assert_eq!(ev[0].body["apiVersion"], "policy/v1");
    assert_eq!(ev[0].body["metadata"]["name"], "low");
    assert_eq!(ev[0].body["metadata"]["namespace"], "ml");
    assert_eq!(
        ev[0].body["deleteOptions"]["preconditions"]["uid"],
        "uid-low"
    );
    assert!(seen.iter().any(|s| s.path.ends_with("/pods/high/binding")));
    let notes: Vec<&str> = seen
        .iter()
        .filter_map(|s| s.body["note"].as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("preempting lower-priority pods on node n1: evicted ml/low")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("evicted by Tessera for ml/high")),
        "{notes:?}"
    );
}

#[tokio::test]
async fn budgets_non_preemptible_pods_and_unlisted_budgets_stop_it() {
    // A PodDisruptionBudget allowing no disruption covers the holder.
    let mut w = world(
        gpu_pod("ml", "low", 0),
        gpu_pod("ml", "high", 1000),
        Some(vec![pdb("ml", "low", 0)]),
    );
    w.s.pass().await;
    w.s.flush().await;
    assert!(evictions(&finish(w).await).is_empty(), "budget");
    // The same budget allowing one: evicted.
    let mut w = world(
        gpu_pod("ml", "low", 0),
        gpu_pod("ml", "high", 1000),
        Some(vec![pdb("ml", "low", 1)]),
    );
    w.s.pass().await;
    w.s.flush().await;
    assert_eq!(evictions(&finish(w).await).len(), 1, "budget allows one");
    // Not preemptible.
    let mut keep = gpu_pod("ml", "low", 0);
    keep.metadata.annotations = Some([("tessera.io/preemptible".into(), "false".into())].into());
    let mut w = world(keep, gpu_pod("ml", "high", 1000), Some(vec![]));
    w.s.pass().await;
    w.s.flush().await;
    assert!(evictions(&finish(w).await).is_empty(), "non-preemptible");
    // Budgets not listed yet: nothing is planned.
    let mut w = world(gpu_pod("ml", "low", 0), gpu_pod("ml", "high", 1000), None);
    w.s.pass().await;
    w.s.flush().await;
    assert!(evictions(&finish(w).await).is_empty(), "budgets unknown");
    // Equal priority.
    let mut w = world(
        gpu_pod("ml", "low", 5),
        gpu_pod("ml", "high", 5),
        Some(vec![]),
    );
    w.s.pass().await;
    w.s.flush().await;
    assert!(evictions(&finish(w).await).is_empty(), "equal priority");
}

/// Reclaim: team-b borrows team-a's idle GPU with a high-priority pod; team-a's
/// pod, within its guarantee, takes it back whatever the priorities. The other
/// way round nothing is evicted: team-a's pod holds its own guarantee.
#[tokio::test]
async fn lent_quota_is_reclaimed_across_queues_and_only_what_is_borrowed() {
    let setup = |w: &World| {
        let mut g = w.m.lock();
        g.replace_queues(vec![
            gpu_queue("team-a", None, "1"),
            gpu_queue("team-b", None, "0"),
        ]);
        g.replace_namespaces(vec![
            queue_namespace("a", "team-a"),
            queue_namespace("b", "team-b"),
        ]);
    };
    let mut w = world(
        gpu_pod("b", "borrower", 1000),
        gpu_pod("a", "owner", 0),
        Some(vec![]),
    );
    setup(&w);
    w.s.pass().await;
    w.s.flush().await;
    let text = w.s.metrics.encode().unwrap();
    assert!(
        text.contains("tessera_queue_evictions_total{queue=\"team-b\",kind=\"reclaimed\"} 1"),
        "{text}"
    );
    let seen = finish(w).await;
    let ev = evictions(&seen);
    assert_eq!(ev.len(), 1, "{seen:?}");
    assert_eq!(ev[0].path, "/api/v1/namespaces/b/pods/borrower/eviction");
    let notes: Vec<&str> = seen
        .iter()
        .filter_map(|s| s.body["note"].as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("reclaiming borrowed quota")),
        "{notes:?}"
    );

    let mut w = world(
        gpu_pod("a", "owner", 0),
        gpu_pod("b", "borrower", 1000),
        Some(vec![]),
    );
    setup(&w);
    w.s.pass().await;
    w.s.flush().await;
    assert!(
        evictions(&finish(w).await).is_empty(),
        "a queue within its guarantee is not reclaimed from, nor preempted across queues"
    );
}

/// The API server refuses the eviction (a budget changed since it was read):
/// nothing is placed, and the event says what the API answered.
#[tokio::test]
async fn an_eviction_the_api_refuses_leaves_the_preemptor_waiting() {
    let mut w = world_answering(
        gpu_pod("ml", "low", 0),
        gpu_pod("ml", "high", 1000),
        Some(vec![]),
        429,
    );
    w.s.pass().await;
    w.s.flush().await;
    assert!(w.m.lock().held("uid-high").is_none());
    assert!(
        w.m.lock().held("uid-low").is_some(),
        "the victim keeps its GPU"
    );
    let seen = finish(w).await;
    let notes: Vec<&str> = seen
        .iter()
        .filter_map(|s| s.body["note"].as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("evicted none") && n.contains("disruption budget")),
        "{notes:?}"
    );
}

/// Extender mode: kube-scheduler never calls `preempt` for tessera.io pods, so
/// Tessera preempts for the pods kube-scheduler marked unschedulable — once,
/// then waits for the victims — and leaves alone those it has not tried yet.
#[tokio::test]
async fn extender_mode_preempts_for_pods_kube_scheduler_marked_unschedulable() {
    use tessera_k8s::preemptor::{Preemptor, extender_round};
    let mut high = gpu_pod("ml", "high", 1000);
    let w = world(gpu_pod("ml", "low", 0), high.clone(), Some(vec![]));
    let client = w.s.binder.client().clone();
    let mut p = Preemptor::new(w.m.clone(), client, None);
    p.min_runtime = Duration::ZERO;
    let names = vec!["tessera".to_string()];
    assert_eq!(
        extender_round(&mut p, &names).await,
        0,
        "not tried by kube-scheduler yet"
    );
    high.status = Some(scheduled_false("Unschedulable"));
    w.m.lock().upsert_pod(high);
    assert_eq!(extender_round(&mut p, &names).await, 1);
    assert_eq!(
        extender_round(&mut p, &names).await,
        1,
        "waiting for its victim"
    );
    drop(p);
    let seen = finish(w).await;
    let ev = evictions(&seen);
    assert_eq!(ev.len(), 1, "evicted once: {seen:?}");
    assert_eq!(ev[0].path, "/api/v1/namespaces/ml/pods/low/eviction");
    // The only patch: the room nominated for the preemptor (issue 41, defect 8),
    // which kube-scheduler's queue honours; no fits-at nudge for a pod that fits nowhere.
    let patches: Vec<&Seen> = seen.iter().filter(|s| s.method == "PATCH").collect();
    assert_eq!(patches.len(), 1, "{seen:?}");
    assert_eq!(patches[0].path, "/api/v1/namespaces/ml/pods/high/status");
    assert!(
        patches[0]
            .body
            .pointer("/status/nominatedNodeName")
            .is_some(),
        "{seen:?}"
    );
}

/// Found on a real v1.28 kube-scheduler (tessera-e2e, extender preemption):
/// kube-scheduler preempted the victim itself, retried the preemptor before
/// the node agent's GpuNode report had dropped the deleted victim, got "2
/// fewer than 2 idle GPUs" from the extender and then never tried it again
/// (no event it watches changed: it does not watch GpuNodes) until its
/// five-minute flush. The same after Tessera was killed and restarted: the
/// pods tried meanwhile ended with `SchedulerError` (connection refused) and
/// waited. A pod it marked unschedulable, or errored, that fits now gets
/// `tessera.io/fits-at` (an update kube-scheduler requeues it on), with its
/// resourceVersion as precondition, once per 30 s.
#[tokio::test]
async fn extender_mode_asks_kube_scheduler_to_retry_a_pod_that_fits_now() {
    use tessera_k8s::preemptor::{FITS_AT_ANNOTATION, Preemptor, extender_round};
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    let m = mirror("tessera", nodes, inv, vec![]);
    let mut waiting = gpu_pod("ml", "waiting", 0);
    waiting.metadata.resource_version = Some("41".into());
    waiting.status = Some(scheduled_false("Unschedulable"));
    // Its last try was an error (the extender could not be reached): the same.
    let mut errored = waiting.clone();
    errored.metadata.name = Some("errored".into());
    errored.metadata.uid = Some("uid-errored".into());
    errored.status = Some(scheduled_false("SchedulerError"));
    m.lock().replace_pods(vec![waiting.clone(), errored]);
    let answer = serde_json::to_value(&waiting).unwrap();
    let (client, api) = mock_api(move |s| {
        if s.method == "PATCH" {
            (200, answer.clone())
        } else {
            accept_writes(s)
        }
    });
    let mut p = Preemptor::new(m.clone(), client, None);
    let names = vec!["tessera".to_string()];
    assert_eq!(extender_round(&mut p, &names).await, 0, "nothing to evict");
    assert_eq!(extender_round(&mut p, &names).await, 0);
    drop(p);
    drop(m);
    let seen = api.await.unwrap();
    let mut patches: Vec<&Seen> = seen.iter().filter(|s| s.method == "PATCH").collect();
    patches.sort_by_key(|s| s.path.clone());
    assert_eq!(patches.len(), 2, "once each within 30 s: {seen:?}");
    assert_eq!(patches[0].path, "/api/v1/namespaces/ml/pods/errored");
    patches.remove(0);
    assert_eq!(patches[0].path, "/api/v1/namespaces/ml/pods/waiting");
    assert_eq!(patches[0].content_type, "application/merge-patch+json");
    assert_eq!(patches[0].body["metadata"]["resourceVersion"], "41");
    assert!(
        patches[0].body["metadata"]["annotations"][FITS_AT_ANNOTATION].is_string(),
        "{:?}",
        patches[0].body
    );
    assert!(evictions(&seen).is_empty());
}

/// Issue 27 item 6: the extender-mode log must say why a candidate is skipped;
/// the preemptor names it (here: the only pod that could make room has equal
/// priority, so nothing is evicted and the reason cites its priority).
#[tokio::test]
async fn a_skipped_candidate_says_why() {
    use tessera_k8s::preemptor::Preemptor;
    let high = gpu_pod("ml", "high", 5);
    let w = world(gpu_pod("ml", "low", 5), high.clone(), Some(vec![]));
    let client = w.s.binder.client().clone();
    let mut p = Preemptor::new(w.m.clone(), client, None);
    p.min_runtime = Duration::ZERO;
    let why = p
        .try_explained(&high, "not enough idle GPUs")
        .await
        .unwrap_err();
    assert!(
        why.contains("no set of victims makes room") && why.contains("spec.priority 5"),
        "{why}"
    );
    let why = p.try_explained(&high, "queue quota").await.unwrap_err();
    assert!(why.contains("evicting cannot cure (queue quota)"), "{why}");
    drop(p);
    assert!(evictions(&finish(w).await).is_empty());
}

/// A candidate judged with the lock released (a chunk of an extender round)
/// may be placed before its preemption is tried: nothing is evicted for a pod
/// that no longer waits.
#[tokio::test]
async fn nothing_is_evicted_for_a_pod_that_no_longer_waits() {
    use tessera_k8s::preemptor::Preemptor;
    let mut high = gpu_pod("ml", "high", 1000);
    high.spec.as_mut().unwrap().node_name = Some("n1".into());
    let w = world(gpu_pod("ml", "low", 0), high.clone(), Some(vec![]));
    let client = w.s.binder.client().clone();
    let mut p = Preemptor::new(w.m.clone(), client, None);
    p.min_runtime = Duration::ZERO;
    let why = p
        .try_explained(&high, "not enough idle GPUs")
        .await
        .unwrap_err();
    assert!(why.contains("no longer waiting"), "{why}");
    drop(p);
    assert!(evictions(&finish(w).await).is_empty());
}

/// Room is never made on a node the pod may not go to: the only victim sits on
/// a node tainted against the preemptor, so nothing is evicted.
#[tokio::test]
async fn no_eviction_on_a_node_the_pod_may_not_use() {
    let mut w = world(
        gpu_pod("ml", "low", 0),
        gpu_pod("ml", "high", 1000),
        Some(vec![]),
    );
    let mut tainted = kube_node("n1", "32", "64Gi");
    tainted.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        taints: Some(vec![k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            value: Some("other".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    w.m.lock().upsert_node(tainted);
    w.s.pass().await;
    w.s.flush().await;
    assert!(evictions(&finish(w).await).is_empty());
}

/// Issue 41, defect 1 (seen on a real kube-scheduler): extender preemption
/// judged "does it fit a node now" without the pod's node constraints, so a
/// high-priority pod whose nodeSelector allows only a full node was not
/// preempted for while another node it may not use had room; the victim went
/// only once unrelated pods filled the other node. n1 is full (a low-priority
/// pod), n2 is empty, the pod may only go to n1: its victim is evicted now.
/// A pod of the same shape without the selector fits n2 and evicts nothing
/// (the per-shape cache must not mix the two).
#[tokio::test]
async fn extender_preemption_judges_fit_with_the_pods_node_constraints() {
    use tessera_k8s::preemptor::{Preemptor, extender_round};
    let nodes = vec![kube_node("n1", "32", "64Gi"), kube_node("n2", "32", "64Gi")];
    let inv = vec![
        gpu_node("n1", "A100-80GB", 81_920, 1),
        gpu_node("n2", "A100-80GB", 81_920, 1),
    ];
    let m = mirror("tessera", nodes, inv, vec![]);
    let low = bound(&m, gpu_pod("ml", "low", 0), "n1");
    let mut free = gpu_pod("ml", "free", 1000);
    free.status = Some(scheduled_false("Unschedulable"));
    let mut pinned = gpu_pod("ml", "pinned", 1000);
    pinned.status = Some(scheduled_false("Unschedulable"));
    pinned.spec.as_mut().unwrap().node_selector =
        Some([("kubernetes.io/hostname".to_string(), "n1".to_string())].into());
    m.lock().replace_pods(vec![low, free, pinned]);
    m.lock().replace_pdbs(vec![]);
    let (client, api) = mock_api(accept_writes);
    let mut p = Preemptor::new(m.clone(), client, None);
    p.min_runtime = Duration::ZERO;
    let names = vec!["tessera".to_string()];
    assert_eq!(
        extender_round(&mut p, &names).await,
        1,
        "the pinned pod evicts its victim on n1"
    );
    drop(p);
    drop(m);
    let seen = api.await.unwrap();
    let ev = evictions(&seen);
    assert_eq!(ev.len(), 1, "{seen:?}");
    assert_eq!(ev[0].path, "/api/v1/namespaces/ml/pods/low/eviction");
}

/// Issue 41, defect 8: `preemptionPolicy: Never` was ignored. Such a pod
/// waits for room and evicts nobody, in a standalone pass and in an extender
/// round alike; the log says why.
#[tokio::test]
async fn a_pod_that_never_preempts_evicts_nobody() {
    use tessera_k8s::preemptor::{Preemptor, extender_round};
    let mut high = gpu_pod("ml", "high", 1000);
    high.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
    let mut w = world(gpu_pod("ml", "low", 0), high.clone(), Some(vec![]));
    w.s.pass().await;
    w.s.flush().await;
    high.status = Some(scheduled_false("Unschedulable"));
    w.m.lock().upsert_pod(high.clone());
    let client = w.s.binder.client().clone();
    let mut p = Preemptor::new(w.m.clone(), client, None);
    p.min_runtime = Duration::ZERO;
    let names = vec!["tessera".to_string()];
    assert_eq!(extender_round(&mut p, &names).await, 0);
    let why = p
        .try_explained(&high, "not enough idle GPUs")
        .await
        .unwrap_err();
    assert!(why.contains("preemptionPolicy is Never"), "{why}");
    drop(p);
    let seen = finish(w).await;
    assert!(evictions(&seen).is_empty(), "{seen:?}");
}

/// Issue 41, defect 8 (real 1.36, standalone): the room a preemption made
/// went to an older pending pod of the same priority (one that never
/// preempts), and the preemptor waited on. While a preemptor waits for the
/// room it made, its node is held for it: pods of no higher priority are
/// not placed there.
#[tokio::test]
async fn the_room_a_preemption_made_goes_to_the_preemptor() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let at = |s: &str| Some(Time(s.parse().unwrap()));
    let mut older = gpu_pod("ml", "older", 1000);
    older.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
    older.metadata.creation_timestamp = at("2026-12-07T01:00:00Z");
    let mut high = gpu_pod("ml", "high", 1000);
    high.metadata.creation_timestamp = at("2026-12-07T01:00:05Z");
    let mut w = world(gpu_pod("ml", "low", 0), high, Some(vec![]));
    w.m.lock().upsert_pod(older);
    w.s.pass().await;
    w.s.flush().await;
    // The victim is gone; both pending pods are tried again.
    w.m.lock().remove_pod("uid-low");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    w.s.pass().await;
    w.s.flush().await;
    assert!(
        w.m.lock().held("uid-high").is_some(),
        "the preemptor placed"
    );
    assert!(w.m.lock().held("uid-older").is_none(), "not the older pod");
    let seen = finish(w).await;
    assert_eq!(evictions(&seen).len(), 1, "{seen:?}");
    assert!(seen.iter().any(|s| s.path.ends_with("/pods/high/binding")));
    assert!(!seen.iter().any(|s| s.path.ends_with("/pods/older/binding")));
}
