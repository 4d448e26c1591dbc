//! Watches and paginated lists against the recordings that cannot be replayed
//! step by step (files 08, 14, 15, 18): the streams run concurrently with the
//! writes, and compaction is the double's `compact()`.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};

use crate::apiserver::{ApiServer, ApiService, Config, Resource};
use crate::replay::{fixture, send, steps};

fn pod(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "fx", "labels": labels},
           "spec": {"schedulerName": "tessera", "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9",
                    "resources": {"limits": {"tessera.io/gpu": "1"}}}]}})
}

async fn until_watchers(server: &ApiServer, n: usize) {
    for _ in 0..500 {
        if server.watchers() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the watches never registered");
}

fn summary(events: &Value) -> Vec<(String, Option<String>, Option<String>, bool)> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let o = &e["object"];
            (
                e["type"].as_str().unwrap_or_default().to_string(),
                o.pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                o.pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                o.pointer("/metadata/deletionTimestamp").is_some(),
            )
        })
        .collect()
}

/// File 08: create, annotate, bind and force-delete a pod under two watches.
#[tokio::test]
async fn watch_events_of_a_pod_lifecycle_match_file_08() {
    let Some(f) = fixture("08-watch-pods.json") else {
        return;
    };
    let s = steps(&f);
    let server = ApiServer::new(Config::default());
    let (service, _session) = server.service();
    let list = send(
        &service,
        "GET",
        "/api/v1/namespaces/fx/pods?labelSelector=case%3D08",
        None,
        None,
    )
    .await;
    let rv: u64 = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let watch = |extra: &str| {
        let service: ApiService = service.clone();
        let path = format!(
            "/api/v1/namespaces/fx/pods?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=1{extra}"
        );
        tokio::spawn(async move { send(&service, "GET", &path, None, None).await })
    };
    let a = watch("");
    let b = watch("&fieldSelector=spec.nodeName%3D");
    until_watchers(&server, 2).await;
    for step in &s[3..] {
        let r = &step["request"];
        let answer = send(
            &service,
            r["method"].as_str().unwrap(),
            r["path"].as_str().unwrap(),
            r["content_type"].as_str(),
            r.get("body").filter(|b| !b.is_null()),
        )
        .await;
        assert_eq!(
            answer.status,
            step["response"]["status"].as_u64().map(|v| v as u16),
            "{}",
            r["path"]
        );
    }
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(a.status, Some(200));
    let v = |n: u64| Some((rv + n).to_string());
    let n1 = Some("n1".to_string());
    // Recorded: ADDED 430, MODIFIED 431, MODIFIED 432 (bound), MODIFIED 433
    // (deletionTimestamp), DELETED 434, BOOKMARK 434: two resourceVersions per delete.
    assert_eq!(
        summary(&a.body),
        vec![
            ("ADDED".into(), v(1), None, false),
            ("MODIFIED".into(), v(2), None, false),
            ("MODIFIED".into(), v(3), n1.clone(), false),
            ("MODIFIED".into(), v(4), n1.clone(), true),
            ("DELETED".into(), v(5), n1, true),
            ("BOOKMARK".into(), v(5), None, false),
        ]
    );
    assert_eq!(
        a.body[4]["object"]["metadata"]["deletionGracePeriodSeconds"],
        0
    );
    // Watch B (unassigned pods): the binding is a DELETED of the old object at the new resourceVersion.
    assert_eq!(
        summary(&b.body),
        vec![
            ("ADDED".into(), v(1), None, false),
            ("MODIFIED".into(), v(2), None, false),
            ("DELETED".into(), v(3), None, false),
            ("BOOKMARK".into(), v(5), None, false),
        ]
    );
    let recorded_bookmark = &s[1]["response"]["events"][5]["object"];
    let mut ours = a.body[5]["object"].clone();
    ours["metadata"]["resourceVersion"] = recorded_bookmark["metadata"]["resourceVersion"].clone();
    assert_eq!(&ours, recorded_bookmark, "BOOKMARK object");
}

/// Files 14 and 15: after the history is gone, a watch from an old
/// resourceVersion gets HTTP 200 and one ERROR 410, an exact LIST and a
/// continue token get HTTP 410 (the latter with a replacement token).
#[tokio::test]
async fn expired_resource_versions_match_files_14_and_15() {
    let (Some(f14), Some(f15)) = (
        fixture("14-watch-too-old-after-compaction.json"),
        fixture("15-list-continue-after-compaction.json"),
    ) else {
        return;
    };
    let server = ApiServer::new(Config::default());
    let (service, _session) = server.service();
    for name in ["p1", "p2", "p3"] {
        server
            .create(Resource::Pods, &pod(name, json!({})))
            .unwrap();
    }
    let page1 = send(
        &service,
        "GET",
        "/api/v1/namespaces/fx/pods?limit=2",
        None,
        None,
    )
    .await;
    let old_rv = page1.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // Inside the window a watch from the old resourceVersion replays what followed.
    server
        .create(Resource::Pods, &pod("p14", json!({})))
        .unwrap();
    let replayed = send(
        &service,
        "GET",
        &format!("/api/v1/namespaces/fx/pods?watch=1&resourceVersion={old_rv}&timeoutSeconds=0"),
        None,
        None,
    )
    .await;
    assert_eq!(summary(&replayed.body).len(), 1, "{}", replayed.body);
    assert_eq!(replayed.body[0]["type"], "ADDED");

    server.compact();
    let w = send(&service, "GET", "/api/v1/namespaces/fx/pods?watch=1&resourceVersion=1&allowWatchBookmarks=true&timeoutSeconds=3", None, None).await;
    assert_eq!(w.status, Some(200));
    let recorded = &steps(&f14)[6]["response"]["events"];
    assert_eq!(w.body.as_array().unwrap().len(), 1);
    let mut want = recorded[0].clone();
    want["object"]["message"] = json!(format!(
        "too old resource version: 1 ({})",
        server.resource_version() + 1
    ));
    assert_eq!(w.body[0], want);

    let exact = send(
        &service,
        "GET",
        &format!("/api/v1/namespaces/fx/pods?resourceVersion={old_rv}&resourceVersionMatch=Exact"),
        None,
        None,
    )
    .await;
    assert_eq!(exact.status, Some(410));
    assert_eq!(exact.body, steps(&f14)[8]["response"]["body"]);

    let token = page1.body["metadata"]["continue"].as_str().unwrap();
    let page2 = send(
        &service,
        "GET",
        &format!("/api/v1/namespaces/fx/pods?limit=2&continue={token}"),
        None,
        None,
    )
    .await;
    assert_eq!(page2.status, Some(410));
    let recorded = &steps(&f15)[3]["response"]["body"];
    assert_eq!(page2.body["message"], recorded["message"]);
    assert_eq!(page2.body["reason"], "Expired");
    let fresh = page2.body["metadata"]["continue"].as_str().unwrap();
    let page2b = send(
        &service,
        "GET",
        &format!("/api/v1/namespaces/fx/pods?limit=2&continue={fresh}"),
        None,
        None,
    )
    .await;
    assert_eq!(page2b.status, Some(200));
    assert_eq!(
        page2b.body["metadata"]["resourceVersion"],
        server.resource_version().to_string()
    );
    let names: Vec<&str> = page2b.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p3"]);
}

/// Paginated LIST at the first page's resourceVersion (file 09): a pod created
/// between pages is not in page 2, and page 2 reports page 1's resourceVersion.
#[tokio::test]
async fn pages_are_served_at_the_first_pages_resource_version() {
    let server = ApiServer::new(Config::default());
    let (service, _session) = server.service();
    for name in ["a", "b", "d"] {
        server
            .create(Resource::Pods, &pod(name, json!({})))
            .unwrap();
    }
    let p1 = send(
        &service,
        "GET",
        "/api/v1/namespaces/fx/pods?limit=2",
        None,
        None,
    )
    .await;
    assert_eq!(p1.body["metadata"]["remainingItemCount"], 1);
    server.create(Resource::Pods, &pod("c", json!({}))).unwrap();
    let token = p1.body["metadata"]["continue"].as_str().unwrap();
    let p2 = send(
        &service,
        "GET",
        &format!("/api/v1/namespaces/fx/pods?limit=2&continue={token}"),
        None,
        None,
    )
    .await;
    assert_eq!(
        p2.body["metadata"]["resourceVersion"],
        p1.body["metadata"]["resourceVersion"]
    );
    let names: Vec<&str> = p2.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["d"]);
    assert!(p2.body["metadata"].get("continue").is_none());
    let all = send(
        &service,
        "GET",
        "/api/v1/namespaces/fx/pods?limit=2&resourceVersion=0",
        None,
        None,
    )
    .await;
    assert_eq!(
        all.body["items"].as_array().unwrap().len(),
        4,
        "resourceVersion=0 ignores limit"
    );
}

/// File 18: with resourceVersion 0 or none, a watch starts with ADDED for every match.
#[tokio::test]
async fn watch_without_resource_version_starts_with_the_current_state() {
    let server = ApiServer::new(Config::default());
    let (service, _session) = server.service();
    server
        .create(Resource::Pods, &pod("p11-run", json!({"app": "guarded"})))
        .unwrap();
    server
        .create(Resource::Pods, &pod("other", json!({})))
        .unwrap();
    for rv in ["&resourceVersion=0", ""] {
        let w = send(
            &service,
            "GET",
            &format!("/api/v1/namespaces/fx/pods?watch=1{rv}&timeoutSeconds=0&labelSelector=app"),
            None,
            None,
        )
        .await;
        let s = summary(&w.body);
        assert_eq!(s.len(), 1, "{rv}: {}", w.body);
        assert_eq!(s[0].0, "ADDED");
        assert_eq!(w.body[0]["object"]["metadata"]["name"], "p11-run");
    }
}

/// kube-rs's watcher on the double: paged initial list, live events, and a
/// relist after its watch was closed and the history expired (410).
#[tokio::test]
async fn kube_watcher_lists_watches_and_relists_after_expiry() {
    let server = ApiServer::new(Config {
        watch_timeout_cap: Some(Duration::from_millis(200)),
        ..Config::default()
    });
    for i in 0..5 {
        server
            .create(Resource::Pods, &pod(&format!("p{i}"), json!({})))
            .unwrap();
    }
    let (client, _session) = server.client();
    let api: Api<Pod> = Api::all(client);
    // Without bookmarks a re-watch starts from the last event it saw.
    let stream = watcher::watcher(
        api,
        watcher::Config::default().page_size(2).disable_bookmarks(),
    );
    let mut stream = std::pin::pin!(stream.into_stream());
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("watcher event in time")
            .expect("no watcher error")
            .expect("stream goes on")
    };
    assert!(matches!(next().await, Event::Init));
    let mut listed = 0;
    loop {
        match next().await {
            Event::InitApply(_) => listed += 1,
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(listed, 5);
    assert_eq!(server.counters().verb("list"), 3, "pages of 2");
    server
        .create(Resource::Pods, &pod("late", json!({})))
        .unwrap();
    match next().await {
        Event::Apply(p) => assert_eq!(p.metadata.name.as_deref(), Some("late")),
        other => panic!("unexpected {other:?}"),
    }
    // The watch ends after 200 ms and resumes from "late"; a write of another
    // kind and a compaction put that resourceVersion out of the history, so the
    // re-watch gets 410 and the watcher starts over with a fresh list.
    server
        .create(Resource::Nodes, &json!({"metadata": {"name": "n9"}}))
        .unwrap();
    server.compact();
    let mut relisted = false;
    for _ in 0..5 {
        if let Ok(Ok(Some(Event::Init))) =
            tokio::time::timeout(Duration::from_secs(5), stream.next())
                .await
                .map(|e| e.transpose())
        {
            relisted = true;
            break;
        }
    }
    assert!(relisted, "the watcher relisted after the 410");
}
