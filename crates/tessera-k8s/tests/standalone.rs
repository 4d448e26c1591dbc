//! Standalone mode against kube-rs's mock API: placement honours taints and
//! selectors, binds (one binding carrying the annotation), and records FailedScheduling events
//! carrying the reason sentence or the parser's message.

mod common;

use std::sync::Arc;

use common::*;
use k8s_openapi::api::core::v1::{Pod, Taint};
use kube::runtime::events::Reporter;
use serde_json::{Value, json};
use tessera_k8s::binder::Binder;
use tessera_k8s::events::Publisher;
use tessera_k8s::leader::Leadership;
use tessera_k8s::metrics::Metrics;
use tessera_k8s::standalone::Standalone;

fn ours(mut p: Pod, selector: Option<(&str, &str)>) -> Pod {
    let spec = p.spec.as_mut().unwrap();
    spec.scheduler_name = Some("tessera".into());
    if let Some((k, v)) = selector {
        spec.node_selector = Some([(k.to_string(), v.to_string())].into());
    }
    p.metadata.creation_timestamp = None;
    p
}

fn answer(s: &Seen) -> (u16, Value) {
    if s.path.ends_with("/binding") {
        (201, status(201, "", ""))
    } else if s.path.contains("/events") {
        let mut ev = s.body.clone();
        ev["metadata"]["name"] = "ev".into();
        (201, ev)
    } else {
        let mut p = serde_json::to_value(pod("ml", "x", "uid-x", &[])).unwrap();
        p["apiVersion"] = "v1".into();
        p["kind"] = "Pod".into();
        (200, p)
    }
}

#[tokio::test]
async fn places_binds_and_explains() {
    let mut tainted = kube_node("tainted", "32", "64Gi");
    tainted.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        taints: Some(vec![Taint {
            key: "dedicated".into(),
            value: Some("infer".into()),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]),
        ..Default::default()
    });
    let mut labelled = kube_node("labelled", "32", "64Gi");
    labelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("pool".into(), "train".into());
    let nodes = vec![tainted, labelled, kube_node("small", "2", "4Gi")];
    let inv = vec![
        gpu_node("tainted", "A100-80GB", 81_920, 8),
        gpu_node("labelled", "A100-80GB", 81_920, 2),
        gpu_node("small", "A100-80GB", 81_920, 8),
    ];
    let good = ours(
        pod(
            "ml",
            "good",
            "uid-good",
            &[("cpu", "4"), ("tessera.io/gpu", "2")],
        ),
        None,
    );
    let too_big = ours(
        pod("ml", "too-big", "uid-big", &[("tessera.io/gpu", "4")]),
        Some(("pool", "train")),
    );
    let broken = ours(
        pod(
            "ml",
            "broken",
            "uid-broken",
            &[("tessera.io/gpu", "1"), ("tessera.io/gpu-cores", "0")],
        ),
        None,
    );
    // Someone else's pod is left alone.
    let theirs = pod("ml", "theirs", "uid-theirs", &[("tessera.io/gpu", "1")]);
    let m = mirror("tessera", nodes, inv, vec![good, too_big, broken, theirs]);

    let (client, api) = mock_api(answer);
    let leader = Leadership::always();
    let metrics = Arc::new(Metrics::new());
    let recorder = Publisher::new(client.clone(), Reporter::from("tessera"));
    let mut s = Standalone::new(
        "tessera".into(),
        m.clone(),
        Binder::new(client, m.clone(), leader.clone()),
        leader,
        metrics.clone(),
        Some(recorder),
        Default::default(),
    );
    let pending: Vec<String> = s
        .pending()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(pending.len(), 3, "{pending:?}");
    let next_retry = s.pass().await;
    assert!(next_retry.is_some(), "two pods wait for a retry");
    // Only the good pod is held now: 4 CPUs fit only on `labelled` (the taint and CPU rule out the rest).
    {
        let mm = m.lock();
        let held = mm.held("uid-good").expect("good pod placed");
        assert_eq!(held.node, "labelled");
        assert!(mm.held("uid-big").is_none() && mm.held("uid-theirs").is_none());
    }
    // A second pass right away retries nobody (backoff).
    s.pass().await;
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("tessera_pending_pods{reason=\"invalid request\"} 1"),
        "{text}"
    );
    s.flush().await;
    drop(s);
    drop(m);

    let seen = api.await.unwrap();
    let calls: Vec<(String, String)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect();
    let mut binds: Vec<&(String, String)> =
        calls.iter().filter(|(_, p)| p.contains("/pods/")).collect();
    binds.sort();
    // One write per pod: the binding carries the allocation annotation; the two
    // that wait show PodScheduled=False with the reason, once (the second pass
    // retried nobody), as kube-scheduler writes it (issue 41, defect 13).
    let call = |m: &str, p: &str| (m.to_string(), format!("/api/v1/namespaces/ml/pods/{p}"));
    assert_eq!(
        binds,
        [
            &call("PATCH", "broken/status"),
            &call("PATCH", "too-big/status"),
            &call("POST", "good/binding"),
        ]
    );
    let status = seen
        .iter()
        .find(|s| s.path.ends_with("too-big/status"))
        .unwrap();
    let c = &status.body["status"]["conditions"][0];
    assert_eq!(
        (&c["type"], &c["status"], &c["reason"]),
        (
            &json!("PodScheduled"),
            &json!("False"),
            &json!("Unschedulable")
        ),
        "{}",
        status.body
    );
    assert!(
        c["message"].as_str().unwrap().starts_with("0/3 nodes fit"),
        "{}",
        status.body
    );
    assert_eq!(
        status.body["metadata"]["uid"], "uid-big",
        "the UID as precondition"
    );
    let notes: Vec<(String, String)> = seen
        .iter()
        .filter(|s| s.path.contains("/events"))
        .map(|s| {
            (
                s.body["reason"].as_str().unwrap_or("").to_string(),
                s.body["note"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        notes.contains(&(
            "Scheduled".into(),
            "Successfully assigned ml/good to labelled".into()
        )),
        "{notes:?}"
    );
    // too-big: the sentence over all three nodes (`labelled` has only 2 GPUs).
    assert!(
        notes.contains(&(
            "FailedScheduling".into(),
            "0/3 nodes fit: 2 node(s) didn't match the pod's nodeSelector, 1 fewer than 4 GPUs in total".into()
        )),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|(r, n)| r == "FailedScheduling" && n.contains("tessera.io/gpu-cores")),
        "{notes:?}"
    );
}

fn one_node_standalone(
    pods: Vec<Pod>,
    leader: Leadership,
) -> (
    Standalone,
    tessera_k8s::mirror::SharedMirror,
    tokio::task::JoinHandle<Vec<Seen>>,
) {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 4)];
    let m = mirror("tessera", nodes, inv, pods);
    let (client, api) = mock_api(answer);
    let recorder = Publisher::new(
        client.clone(),
        Reporter {
            controller: "tessera".into(),
            instance: Some("tessera-0".into()),
        },
    );
    let s = Standalone::new(
        "tessera".into(),
        m.clone(),
        Binder::new(client, m.clone(), leader.clone()),
        leader,
        Arc::new(Metrics::new()),
        Some(recorder),
        Default::default(),
    );
    (s, m, api)
}

/// Finding 9: a new leader waited for the next periodic pass (up to 10 s)
/// before placing anything; it must start the moment it leads.
#[tokio::test(start_paused = true)]
async fn a_new_leader_places_pods_at_once() {
    let p = ours(pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]), None);
    let leader = Leadership::default();
    let (s, m, api) = one_node_standalone(vec![p], leader.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(s.run(async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        m.lock().held("uid-a").is_none(),
        "a follower places nothing"
    );
    leader.set(true);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        m.lock().held("uid-a").is_some(),
        "placed within 100 ms of gaining leadership"
    );
    let _ = stop.send(());
    task.await.unwrap();
    drop(m);
    let seen = api.await.unwrap();
    assert!(seen.iter().any(|s| s.path.ends_with("/binding")));
}

/// Finding 18: checks standalone mode does not make are refused with an event,
/// never silently skipped.
#[tokio::test]
async fn pods_needing_checks_this_mode_does_not_make_are_refused_clearly() {
    let mut p = ours(pod("ml", "web", "uid-w", &[("tessera.io/gpu", "1")]), None);
    p.spec.as_mut().unwrap().containers[0].ports =
        Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            container_port: 80,
            host_port: Some(8080),
            ..Default::default()
        }]);
    let (mut s, m, api) = one_node_standalone(vec![p], Leadership::always());
    s.pass().await;
    assert!(m.lock().held("uid-w").is_none());
    s.flush().await;
    drop(s);
    drop(m);
    let seen = api.await.unwrap();
    let note = seen
        .iter()
        .find(|s| s.path.contains("/events"))
        .map(|s| s.body["note"].as_str().unwrap_or("").to_string())
        .expect("an event");
    assert!(note.contains("does not evaluate host ports"), "{note}");
    assert!(!seen.iter().any(|s| s.path.ends_with("/binding")));
}

/// Issue 28 item 9: a pass ran on every watch event and copied every waiting
/// pod, those waiting out a backoff included (10,000 unschedulable pods were
/// copied for each of the agents' 83 status updates a second). Now a pass
/// copies only the pods due for a try (without queues), while every waiting
/// pod stays known, so none loses its backoff.
#[tokio::test]
async fn a_pass_copies_only_the_pods_due_for_a_try() {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 8)];
    // Nine GPUs on a node of eight: none fits, all go into backoff.
    let stuck: Vec<Pod> = (0..50)
        .map(|i| {
            ours(
                pod(
                    "ml",
                    &format!("stuck-{i}"),
                    &format!("uid-stuck-{i}"),
                    &[("tessera.io/gpu", "9")],
                ),
                None,
            )
        })
        .collect();
    let m = mirror("tessera", nodes, inv, stuck);
    let (client, _api) = mock_api(answer);
    let leader = Leadership::always();
    let mut s = Standalone::new(
        "tessera".into(),
        m.clone(),
        Binder::new(client, m.clone(), leader.clone()),
        leader,
        Arc::new(Metrics::new()),
        None,
        Default::default(),
    );
    let (first, live) = s.to_try(std::time::Instant::now());
    assert_eq!((first.len(), live.len()), (50, 50), "all due at first");
    assert!(s.pass().await.is_some(), "they wait for a retry");
    let (due, live) = s.to_try(std::time::Instant::now());
    assert!(due.is_empty(), "{} pods copied while in backoff", due.len());
    assert_eq!(live.len(), 50, "all still waiting");
    assert_eq!(
        s.pending().len(),
        50,
        "pending() still lists every waiting pod"
    );
    // Once their backoff is over they are due again.
    let later = std::time::Instant::now() + std::time::Duration::from_secs(2);
    assert_eq!(s.to_try(later).0.len(), 50);
}
