//! Queues in Kubernetes: `GpuQueue` objects and namespace labels decide which
//! quota a pod counts against; the extender's filter, the standalone loop and
//! explain refuse a pod its queue cannot take, with a sentence naming the queue;
//! a broken queue never lifts the quotas in force.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::ObjectMeta;
use tessera_api::{GpuQueue, GpuQueueSpec, QueueResources};
use tessera_k8s::convert;
use tessera_k8s::explain::{self, Report};
use tessera_k8s::metrics::Metrics;
use tessera_k8s::mirror::{Mirror, QuotaCheck, Reservation, SharedMirror};
use tessera_k8s::standalone::Standalone;

fn queue(name: &str, gpus: &str, limit: Option<&str>, borrow: bool) -> GpuQueue {
    GpuQueue::new(
        name,
        GpuQueueSpec {
            guaranteed: QueueResources {
                gpus: Some(gpus.into()),
                ..Default::default()
            },
            limit: limit.map(|l| QueueResources {
                gpus: Some(l.into()),
                ..Default::default()
            }),
            borrow: Some(borrow),
            ..Default::default()
        },
    )
}

fn namespace(name: &str, queue: Option<&str>, allowed: Option<&str>) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: queue.map(|q| [("tessera.io/queue".to_string(), q.to_string())].into()),
            annotations: allowed.map(|a| [("tessera.io/queues".to_string(), a.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn gpu_pod(ns: &str, name: &str, gpus: &str) -> Pod {
    pod(
        ns,
        name,
        &format!("uid-{name}"),
        &[("tessera.io/gpu", gpus)],
    )
}

/// Decides and holds `p` as the binder would (a reservation counts against its queue).
fn place(m: &mut Mirror, p: &Pod) {
    let catalog = m.cluster().catalog.clone();
    let asks = convert::pod_asks(p, &catalog);
    let (req, host) = (asks.request.unwrap(), asks.host.unwrap());
    let (placement, _) = m
        .decide(&req, &host, |_| Ok(()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        m.hold(p, placement, req, host),
        Ok(Reservation::Write { .. })
    ));
}

fn nodes() -> Vec<&'static str> {
    vec!["fake-gpu-node-1", "fake-gpu-node-2"]
}

fn setup(queues: Vec<GpuQueue>, namespaces: Vec<Namespace>) -> SharedMirror {
    let (n, inv) = fixture_cluster();
    let m = mirror("tessera", n, inv, vec![]);
    {
        let mut g = m.lock();
        g.replace_queues(queues);
        g.replace_namespaces(namespaces);
    }
    m
}

#[test]
fn a_queue_without_borrowing_stops_at_its_guarantee() {
    let m = setup(
        vec![queue("team-a", "2", None, false)],
        vec![
            namespace("ml", Some("team-a"), None),
            namespace("free", None, None),
        ],
    );
    let mut g = m.lock();
    let first = gpu_pod("ml", "first", "2");
    let req = convert::pod_request(&first, &g.cluster().catalog.clone()).unwrap();
    assert_eq!(
        g.quota(&first, &req),
        QuotaCheck::Admitted {
            queue: "team-a".into(),
            borrowing: false
        }
    );
    place(&mut g, &first);
    // 2 of 2 held: one more GPU passes the guarantee and the queue does not borrow.
    let second = gpu_pod("ml", "second", "1");
    let names = nodes();
    let out = g.filter(&second, &names).unwrap();
    assert!(out.passed.is_empty(), "{out:?}");
    let why = out.reason("fake-gpu-node-1").unwrap();
    assert!(
        why.contains("team-a") && why.contains("does not borrow"),
        "{why}"
    );
    assert!(why.contains("holds 2"), "{why}");
    // The same pod in a namespace with no queue is not held back.
    let other = gpu_pod("free", "other", "1");
    assert_eq!(g.filter(&other, &names).unwrap().passed.len(), 2);
    // Explain says the pod waits for its queue, not for a node.
    let r = explain::report(&mut g, &second);
    assert!(matches!(r, Report::WaitsForQueue { .. }), "{r}");
    assert!(r.to_string().contains("waits for its queue's quota"), "{r}");
    // The first pod leaving frees the quota.
    g.remove_pod("uid-first");
    assert_eq!(g.filter(&second, &names).unwrap().passed.len(), 2);
}

#[test]
fn borrowing_stops_at_the_limit_and_counts_real_grants() {
    let m = setup(
        vec![
            queue("team-a", "1", Some("3"), true),
            queue("team-b", "8", None, true),
        ],
        vec![namespace("ml", Some("team-a"), None)],
    );
    let mut g = m.lock();
    let a = gpu_pod("ml", "a", "2");
    let req = convert::pod_request(&a, &g.cluster().catalog.clone()).unwrap();
    assert_eq!(
        g.quota(&a, &req),
        QuotaCheck::Admitted {
            queue: "team-a".into(),
            borrowing: true
        }
    );
    place(&mut g, &a);
    let usage = g.queue_usage(None).unwrap();
    let tree = g.queue_tree().unwrap().clone();
    assert_eq!(usage.of(tree.id("team-a").unwrap()).gpu_eq_milli, 2_000);
    // 2 held + 2 asked = 4 > limit 3.
    let b = gpu_pod("ml", "b", "2");
    let names = nodes();
    let out = g.filter(&b, &names).unwrap();
    assert!(out.passed.is_empty());
    assert!(
        out.reason("fake-gpu-node-2")
            .unwrap()
            .contains("would pass its limit")
    );
    // 2 + 1 = 3 ≤ 3.
    let c = gpu_pod("ml", "c", "1");
    assert_eq!(g.filter(&c, &names).unwrap().passed.len(), 2);
}

#[test]
fn a_pod_names_a_queue_only_where_its_namespace_allows() {
    let m = setup(
        vec![
            queue("team-a", "4", None, true),
            queue("team-b", "4", None, true),
        ],
        vec![
            namespace("ml", Some("team-a"), Some("team-b")),
            namespace("web", Some("team-a"), None),
        ],
    );
    let mut g = m.lock();
    let mut allowed = gpu_pod("ml", "x", "1");
    allowed.metadata.annotations = Some([("tessera.io/queue".into(), "team-b".into())].into());
    let req = convert::pod_request(&allowed, &g.cluster().catalog.clone()).unwrap();
    assert!(matches!(
        g.quota(&allowed, &req),
        QuotaCheck::Admitted { ref queue, .. } if queue == "team-b"
    ));
    let mut refused = gpu_pod("web", "y", "1");
    refused.metadata.annotations = Some([("tessera.io/queue".into(), "team-b".into())].into());
    match g.quota(&refused, &req) {
        QuotaCheck::Refused(why) => {
            assert!(why.contains("web") && why.contains("team-b"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // A namespace label naming a queue that does not exist is refused, by name.
    g.upsert_namespace(namespace("web", Some("team-z"), None));
    match g.quota(&gpu_pod("web", "z", "1"), &req) {
        QuotaCheck::Refused(why) => assert!(why.contains("team-z"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_broken_queue_is_reported_and_the_last_valid_tree_stays() {
    let m = setup(
        vec![queue("team-a", "1", None, false)],
        vec![namespace("ml", Some("team-a"), None)],
    );
    let mut g = m.lock();
    assert!(g.queue_tree().is_some());
    place(&mut g, &gpu_pod("ml", "a", "1"));
    // A typo in another queue: the spec does not read.
    g.upsert_queue(queue("team-b", "lots", None, true));
    let problems = g.queue_problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("team-b") && p.contains("spec.guaranteed.gpus")),
        "{problems:?}"
    );
    assert!(g.problems().iter().any(|p| p.contains("team-b")));
    // team-a's quota still holds.
    let names = nodes();
    assert!(
        g.filter(&gpu_pod("ml", "b", "1"), &names)
            .unwrap()
            .passed
            .is_empty()
    );
    // A cycle is refused the same way.
    let mut x = queue("x", "0", None, true);
    x.spec.parent = Some("y".into());
    let mut y = queue("y", "0", None, true);
    y.spec.parent = Some("x".into());
    g.replace_queues(vec![queue("team-a", "1", None, false), x, y]);
    assert!(g.queue_problems().iter().any(|p| p.contains("cycle")));
    assert!(
        g.filter(&gpu_pod("ml", "c", "1"), &names)
            .unwrap()
            .passed
            .is_empty()
    );
}

/// Standalone mode: a pod over its queue's quota is not bound; its event says why.
#[tokio::test]
async fn standalone_refuses_over_quota_with_an_event() {
    let mut a = gpu_pod("ml", "a", "1");
    let mut b = gpu_pod("ml", "b", "1");
    for p in [&mut a, &mut b] {
        p.spec.as_mut().unwrap().scheduler_name = Some("tessera".into());
    }
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 4)];
    let m = mirror("tessera", nodes, inv, vec![a, b]);
    {
        let mut g = m.lock();
        g.replace_queues(vec![queue("team-a", "1", None, false)]);
        g.replace_namespaces(vec![namespace("ml", Some("team-a"), None)]);
    }
    let (client, api) = mock_api(accept_writes);
    let mut s = standalone(&m, client, true);
    s.pass().await;
    s.flush().await;
    drop(s);
    let held: Vec<bool> = ["uid-a", "uid-b"]
        .iter()
        .map(|u| m.lock().held(u).is_some())
        .collect();
    assert_eq!(
        held.iter().filter(|h| **h).count(),
        1,
        "one GPU of quota: one pod"
    );
    drop(m);
    let seen = api.await.unwrap();
    assert_eq!(
        seen.iter().filter(|s| s.path.ends_with("/binding")).count(),
        1
    );
    let notes: Vec<String> = seen
        .iter()
        .filter(|s| s.path.contains("/events"))
        .map(|s| s.body["note"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("team-a") && n.contains("guaranteed quota")),
        "{notes:?}"
    );
}

/// A standalone scheduler over one 3-GPU node, its mirror and the mock API's log.
fn standalone_over(
    pods: Vec<Pod>,
    queues: Vec<GpuQueue>,
    namespaces: Vec<Namespace>,
) -> (Standalone, SharedMirror, tokio::task::JoinHandle<Vec<Seen>>) {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 3)];
    let m = mirror("tessera", nodes, inv, pods);
    {
        let mut g = m.lock();
        g.replace_queues(queues);
        g.replace_namespaces(namespaces);
    }
    let (client, api) = mock_api(accept_writes);
    let s = standalone(&m, client, false);
    (s, m, api)
}

fn ours(ns: &str, name: &str, gpus: &str) -> Pod {
    let mut p = gpu_pod(ns, name, gpus);
    p.spec.as_mut().unwrap().scheduler_name = Some("tessera".into());
    p
}

/// The last GPU goes to the queue furthest below its fair share, not to the
/// pod first in line by name (both queues may take it).
#[tokio::test]
async fn standalone_serves_the_queue_furthest_below_its_share_first() {
    let holder = ours("ml-a", "holder", "2");
    let a = ours("ml-a", "a-new", "1");
    let b = ours("ml-b", "b-new", "1");
    let (mut s, m, api) = standalone_over(
        vec![holder.clone(), a, b],
        vec![
            queue("team-a", "2", None, true),
            queue("team-b", "1", None, true),
        ],
        vec![
            namespace("ml-a", Some("team-a"), None),
            namespace("ml-b", Some("team-b"), None),
        ],
    );
    place(&mut m.lock(), &holder);
    s.pass().await;
    s.flush().await;
    drop(s);
    assert!(
        m.lock().held("uid-b-new").is_some(),
        "team-b holds nothing: it goes first"
    );
    assert!(m.lock().held("uid-a-new").is_none());
    drop(m);
    let seen = api.await.unwrap();
    assert!(seen.iter().any(|s| s.path.ends_with("/pods/b-new/binding")));
}

/// Kueue interop: a pod behind scheduling gates is never decided, held or bound
/// (the API server would refuse the binding with a 409 anyway).
#[tokio::test]
async fn gated_pods_are_left_alone() {
    let mut gated = ours("ml", "gated", "1");
    gated.spec.as_mut().unwrap().scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
            name: "kueue.x-k8s.io/admission".into(),
        }]);
    let (mut s, m, api) = standalone_over(vec![gated.clone()], vec![], vec![]);
    s.pass().await;
    s.flush().await;
    assert!(m.lock().held("uid-gated").is_none());
    // Kueue admits it: the gate is removed and the pod is placed.
    gated.spec.as_mut().unwrap().scheduling_gates = None;
    m.lock().upsert_pod(gated);
    s.pass().await;
    s.flush().await;
    drop(s);
    assert!(m.lock().held("uid-gated").is_some());
    drop(m);
    let seen = api.await.unwrap();
    assert_eq!(
        seen.iter().filter(|s| s.path.ends_with("/binding")).count(),
        1
    );
}

#[test]
fn metrics_show_each_queue_s_quota_use_share_and_waiting_pods() {
    let m = setup(
        vec![
            queue("team-a", "1", None, true),
            queue("team-b", "2", None, true),
        ],
        vec![namespace("ml", Some("team-a"), None)],
    );
    let mut g = m.lock();
    place(&mut g, &gpu_pod("ml", "a", "3"));
    g.upsert_pod(gpu_pod("ml", "waiting", "1"));
    let metrics = Metrics::new();
    metrics.update_cluster(&mut g);
    let text = metrics.encode().unwrap();
    let line = |q: &str, kind: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("tessera_queue_gpu_equivalents{")
                    && l.contains(&format!("queue=\"{q}\""))
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .unwrap_or_else(|| panic!("no {q}/{kind} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(line("team-a", "allocated"), 3.0);
    assert_eq!(line("team-a", "guaranteed"), 1.0);
    assert_eq!(line("team-a", "borrowed"), 2.0);
    // team-a wants 3 held + 1 waiting = 4 of 12 GPUs, team-b nothing: it deserves all 4.
    assert_eq!(line("team-a", "deserved"), 4.0);
    assert_eq!(line("team-b", "allocated"), 0.0);
    assert!(
        text.contains("tessera_queue_pending_pods{queue=\"team-a\"} 1"),
        "{text}"
    );
}

/// `kubectl get gpuqueues` columns come from status: written as a merge patch of
/// the status subresource with the watched resourceVersion as precondition, and
/// not rewritten when unchanged.
#[tokio::test]
async fn queue_status_is_written_with_a_precondition_and_only_when_changed() {
    let mut q = queue("team-a", "1", None, true);
    q.metadata.resource_version = Some("7".into());
    let m = setup(vec![q.clone()], vec![namespace("ml", Some("team-a"), None)]);
    place(&mut m.lock(), &gpu_pod("ml", "a", "2"));
    let (client, api) = mock_api(|s| {
        if s.body["metadata"]["resourceVersion"] == "stale" {
            (409, status(409, "Conflict", "the object has been modified"))
        } else {
            let mut obj = s.body.clone();
            obj["metadata"]["name"] = "team-a".into();
            obj["spec"] = serde_json::json!({});
            (200, obj)
        }
    });
    assert_eq!(tessera_k8s::queue_status::publish(&client, &m).await, 1);
    // The watch brings the written status back: nothing more to write.
    let written = tessera_k8s::queue_status::changed(&mut m.lock());
    assert_eq!(written.len(), 1);
    q.status = Some(written[0].2.clone());
    m.lock().upsert_queue(q.clone());
    assert_eq!(tessera_k8s::queue_status::publish(&client, &m).await, 0);
    // A stale object (someone else wrote since): the 409 is not counted as written.
    q.status = None;
    q.metadata.resource_version = Some("stale".into());
    m.lock().upsert_queue(q);
    assert_eq!(tessera_k8s::queue_status::publish(&client, &m).await, 0);
    drop(client);
    let seen = api.await.unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let first = &seen[0];
    assert_eq!(first.method, "PATCH");
    assert_eq!(
        first.path,
        "/apis/tessera.io/v1alpha1/gpuqueues/team-a/status"
    );
    assert_eq!(first.content_type, "application/merge-patch+json");
    assert_eq!(first.body["metadata"]["resourceVersion"], "7");
    assert_eq!(first.body["status"]["allocated"]["gpus"], "2");
    assert_eq!(first.body["status"]["borrowed"]["gpus"], "1");
    assert_eq!(first.body["status"]["pendingPods"], 0);
}

/// The documented example (deploy/examples/gpuqueues.yaml) reads as a valid tree.
#[test]
fn the_example_queues_form_a_valid_tree() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/examples/gpuqueues.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut specs = Vec::new();
    for doc in text.split("\n---\n") {
        let v: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
        if v["kind"] == "GpuQueue" {
            let q: GpuQueue = serde_json::from_value(v).unwrap();
            specs.push(tessera_k8s::mirror::queue_spec(&q).unwrap());
        }
    }
    let tree = tessera_core::queue::QueueTree::new(specs).unwrap();
    let vision = tree.id("vision").unwrap();
    assert_eq!(tree.parent(vision), tree.id("research"));
    assert_eq!(tree.spec(vision).guaranteed.gpu_eq_milli, 8_000);
    let prod = tree.spec(tree.id("prod").unwrap());
    assert!(!prod.lend && !prod.borrow);
    assert_eq!(
        tree.spec(tree.id("research").unwrap())
            .guaranteed
            .memory_mib,
        1536 * 1024
    );
}

/// With usage history on, a queue that used much recently yields first: both
/// queues hold nothing now and each waits with one pod, but team-a held two GPUs
/// for the last ten minutes. Without history the two tie (and names decide).
#[tokio::test(start_paused = true)]
async fn recent_use_makes_a_queue_yield_when_history_is_on() {
    let order = |history: bool| async move {
        let m = setup(
            vec![
                queue("team-a", "1", None, true),
                queue("team-b", "1", None, true),
            ],
            vec![
                namespace("a", Some("team-a"), None),
                namespace("b", Some("team-b"), None),
            ],
        );
        if history {
            m.lock()
                .set_usage_history(std::time::Duration::from_secs(300), 1.0);
        }
        let old = gpu_pod("a", "old", "2");
        place(&mut m.lock(), &old);
        let (pa, pb) = (gpu_pod("a", "a-next", "1"), gpu_pod("b", "b-next", "1"));
        let waiting = vec![pa, pb];
        m.lock().queue_order(&waiting);
        tokio::time::advance(std::time::Duration::from_secs(600)).await;
        m.lock().remove_pod("uid-old");
        let keys = m.lock().queue_order(&waiting).unwrap();
        (keys[0].clone(), keys[1].clone())
    };
    let (a, b) = order(false).await;
    assert_eq!(a, b, "without history both queues hold nothing now");
    let (a, b) = order(true).await;
    // team-a's decayed mean after 600 s at 2 GPUs with a 300 s half-life: 2 × (1 − ¼) = 1.5
    // GPUs against a share of 1 → 1.5; team-b 0.
    assert!((a[0] - 1.5).abs() < 0.01 && b[0] == 0.0, "{a:?} {b:?}");
}
