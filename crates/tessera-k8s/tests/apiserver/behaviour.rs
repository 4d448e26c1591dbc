//! The double's own behaviour through a kube client: the single-write binding
//! with annotations, faults and crashes of a session, counters and latency,
//! and server-side apply on leases.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::apiserver::{ApiServer, Config, Fault, Resource};
use crate::replay::{fixture, send, steps};

fn pod(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "fx"},
           "spec": {"schedulerName": "tessera", "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9",
                    "resources": {"limits": {"tessera.io/gpu": "1"}}}]}})
}

fn binding(name: &str, node: &str, uid: Option<&str>, annotations: &[(&str, &str)]) -> Binding {
    Binding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: uid.map(str::to_string),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        },
    }
}

async fn bind(api: &Api<Pod>, b: &Binding) -> Result<Value, kube::Error> {
    let name = b.metadata.name.clone().unwrap_or_default();
    api.create_subresource::<Binding, Value>("binding", &name, &PostParams::default(), b)
        .await
}

/// The Binding's annotations land in the same write as nodeName and
/// PodScheduled=True (`BindingREST`); a second binding gets file 01's 409.
#[tokio::test]
async fn binding_writes_node_annotations_and_condition_at_once() {
    let server = ApiServer::new(Config::default());
    let created = server.create(Resource::Pods, &pod("p1")).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let (client, _session) = server.client();
    let api: Api<Pod> = Api::namespaced(client, "fx");
    let before = server.resource_version();
    let (service, _s2) = server.service();
    let watch_path =
        format!("/api/v1/namespaces/fx/pods?watch=1&resourceVersion={before}&timeoutSeconds=0");

    let b = binding(
        "p1",
        "n1",
        Some(&uid),
        &[("tessera.io/allocation", "grant")],
    );
    let ok = bind(&api, &b).await.unwrap();
    assert_eq!(
        ok,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
    );
    assert_eq!(server.resource_version(), before + 1, "one write");
    let events = send(&service, "GET", &watch_path, None, None).await.body;
    let events = events.as_array().unwrap();
    assert_eq!(events.len(), 1);
    let p = &events[0]["object"];
    assert_eq!(events[0]["type"], "MODIFIED");
    assert_eq!(p["spec"]["nodeName"], "n1");
    assert_eq!(
        p["metadata"]["annotations"]["tessera.io/allocation"],
        "grant"
    );
    assert_eq!(p["status"]["conditions"][0]["type"], "PodScheduled");
    assert_eq!(p["status"]["conditions"][0]["status"], "True");

    // Again, even to the same node: 409 with the recorded body.
    let again = bind(
        &api,
        &binding("p1", "n1", None, &[("tessera.io/allocation", "other")]),
    )
    .await;
    let Err(kube::Error::Api(status)) = again else {
        panic!("expected a 409, got {again:?}");
    };
    assert_eq!(status.code, 409);
    if let Some(f) = fixture("01-bind-then-rebind.json") {
        let recorded = &steps(&f)[3]["response"]["body"];
        assert_eq!(status.message, recorded["message"].as_str().unwrap());
        assert_eq!(status.reason, "Conflict");
    }
    let stored = server.get(Resource::Pods, "fx", "p1").unwrap();
    assert_eq!(
        stored["metadata"]["annotations"]["tessera.io/allocation"], "grant",
        "unchanged"
    );

    // A stale uid (the pod was replaced) is a precondition failure.
    server.create(Resource::Pods, &pod("p2")).unwrap();
    let stale = bind(&api, &binding("p2", "n1", Some(&uid), &[])).await;
    let Err(kube::Error::Api(status)) = stale else {
        panic!("expected a 409, got {stale:?}");
    };
    assert_eq!(status.code, 409);
    assert!(
        status
            .message
            .contains("Precondition failed: UID in precondition"),
        "{}",
        status.message
    );
}

fn annotate(value: &str) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"annotations": {"a": value}}}))
}

async fn hangs<T>(f: impl std::future::Future<Output = T>) -> bool {
    tokio::time::timeout(Duration::from_millis(200), f)
        .await
        .is_err()
}

#[tokio::test]
async fn faults_fail_or_crash_a_sessions_nth_write() {
    let server = ApiServer::new(Config::default());
    server.create(Resource::Pods, &pod("p")).unwrap();
    let annotation = |s: &ApiServer| {
        s.get(Resource::Pods, "fx", "p").unwrap()["metadata"]["annotations"]["a"].clone()
    };

    let (client, session) = server.client();
    let api: Api<Pod> = Api::namespaced(client, "fx");
    session.fault(1, Fault::Fail);
    let failed = api
        .patch("p", &PatchParams::default(), &annotate("1"))
        .await;
    assert!(
        matches!(failed, Err(kube::Error::Api(ref s)) if s.code == 500),
        "{failed:?}"
    );
    assert_eq!(
        annotation(&server),
        Value::Null,
        "a failed write writes nothing"
    );
    api.patch("p", &PatchParams::default(), &annotate("2"))
        .await
        .unwrap();
    assert_eq!(annotation(&server), "2");

    let (client, session) = server.client();
    let api: Api<Pod> = Api::namespaced(client, "fx");
    session.fault(1, Fault::FailAfter);
    let late = api
        .patch("p", &PatchParams::default(), &annotate("2b"))
        .await;
    assert!(
        matches!(late, Err(kube::Error::Api(ref s)) if s.code == 504),
        "{late:?}"
    );
    assert_eq!(
        annotation(&server),
        "2b",
        "written though the answer was a timeout"
    );

    let (client, session) = server.client();
    let api: Api<Pod> = Api::namespaced(client, "fx");
    session.fault(1, Fault::CrashBefore);
    assert!(hangs(api.patch("p", &PatchParams::default(), &annotate("3"))).await);
    assert!(session.is_dead());
    assert_eq!(
        annotation(&server),
        "2b",
        "the request never reached the server"
    );

    let (client, session) = server.client();
    let api: Api<Pod> = Api::namespaced(client, "fx");
    session.fault(2, Fault::CrashAfter);
    api.patch("p", &PatchParams::default(), &annotate("4"))
        .await
        .unwrap();
    assert!(hangs(api.patch("p", &PatchParams::default(), &annotate("5"))).await);
    tokio::time::timeout(Duration::from_secs(1), session.died())
        .await
        .unwrap();
    assert_eq!(
        annotation(&server),
        "5",
        "committed, but the answer never came"
    );
    assert!(
        hangs(api.get("p")).await,
        "a dead process gets no more answers"
    );
    assert_eq!(session.writes(), 2);
}

#[tokio::test]
async fn counters_see_concurrent_requests_under_latency() {
    let server = ApiServer::new(Config {
        latency: (Duration::from_millis(2), Duration::from_millis(4)),
        ..Config::default()
    });
    server.create(Resource::Pods, &pod("p")).unwrap();
    let (client, _session) = server.client();
    let api: Api<Pod> = Api::namespaced(client, "fx");
    let gets = (0..10).map(|_| api.get("p"));
    for r in futures::future::join_all(gets).await {
        r.unwrap();
    }
    api.list(&Default::default()).await.unwrap();
    let c = server.counters();
    assert_eq!(c.verb("get"), 10);
    assert_eq!(c.by_request.get("list pods"), Some(&1));
    assert_eq!(c.in_flight, 0);
    assert!(c.max_in_flight >= 2, "{c:?}");
}

/// kube-lease-manager takes a free lease with an apply patch: a second manager
/// changing a field the first one owns is refused until the lease is released.
#[tokio::test]
async fn lease_apply_conflicts_with_another_manager() {
    let server = ApiServer::new(Config::default());
    let (service, _session) = server.service();
    let path =
        |m: &str| format!("/apis/coordination.k8s.io/v1/namespaces/fx/leases/l?fieldManager={m}");
    let take = |who: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "spec": {"holderIdentity": who, "renewTime": "2026-12-01T03:29:59.733369Z", "leaseDurationSeconds": 2}})
    };
    const APPLY: &str = "application/apply-patch+yaml";
    let a = send(&service, "PATCH", &path("a"), Some(APPLY), Some(&take("a"))).await;
    assert_eq!(a.status, Some(201), "{}", a.body);
    let b = send(&service, "PATCH", &path("b"), Some(APPLY), Some(&take("b"))).await;
    assert_eq!(b.status, Some(409), "{}", b.body);
    assert_eq!(b.body["reason"], "Conflict");
    let release =
        json!({"spec": {"holderIdentity": null, "renewTime": null, "leaseDurationSeconds": null}});
    let r = send(
        &service,
        "PATCH",
        &path("b"),
        Some("application/strategic-merge-patch+json"),
        Some(&release),
    )
    .await;
    assert_eq!(r.status, Some(200));
    let b = send(&service, "PATCH", &path("b"), Some(APPLY), Some(&take("b"))).await;
    assert_eq!(b.status, Some(200), "{}", b.body);
    assert_eq!(b.body["spec"]["holderIdentity"], "b");
}

/// File 11 without a PodDisruptionBudget: a pending pod is gone at once, a
/// bound one terminates gracefully marked `DisruptionTarget`, a missing one is 404.
#[tokio::test]
async fn eviction_without_a_budget_matches_file_11() {
    let Some(f) = fixture("11-eviction-pdb.json") else {
        return;
    };
    let s = steps(&f);
    let server = ApiServer::new(Config::default());
    let (service, _session) = server.service();
    let evict = |name: &str| format!("/api/v1/namespaces/fx/pods/{name}/eviction");
    let body = |name: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "fx"}});
    server.create(Resource::Pods, &pod("p11-pending")).unwrap();
    let before = server.resource_version();
    let e = send(
        &service,
        "POST",
        &evict("p11-pending"),
        Some("application/json"),
        Some(&body("p11-pending")),
    )
    .await;
    assert_eq!(e.status, Some(201));
    assert_eq!(e.body, s[3]["response"]["body"]);
    assert!(server.get(Resource::Pods, "fx", "p11-pending").is_none());
    assert_eq!(
        server.resource_version(),
        before + 3,
        "recorded: 383 → 387 with nothing else between"
    );

    server.create(Resource::Pods, &pod("p11-free")).unwrap();
    let (client, _s) = server.client();
    bind(
        &Api::namespaced(client, "fx"),
        &binding("p11-free", "n1", None, &[]),
    )
    .await
    .unwrap();
    let e = send(
        &service,
        "POST",
        &evict("p11-free"),
        Some("application/json"),
        Some(&body("p11-free")),
    )
    .await;
    assert_eq!(e.status, Some(201));
    let p = server
        .get(Resource::Pods, "fx", "p11-free")
        .expect("a bound pod terminates gracefully");
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 30);
    let target = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned()
        .unwrap();
    let recorded = s[14]["response"]["body"]["status"]["conditions"][2].clone();
    assert_eq!(
        (&target["reason"], &target["message"]),
        (&recorded["reason"], &recorded["message"])
    );

    let missing = send(
        &service,
        "POST",
        &evict("no-such-pod"),
        Some("application/json"),
        Some(&body("no-such-pod")),
    )
    .await;
    assert_eq!(missing.status, Some(404));
    assert_eq!(missing.body, s[20]["response"]["body"]);
}
