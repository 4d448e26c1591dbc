//! Issue 41, defect 13: a pod's FailedScheduling event kept its first note as a
//! growing series after the reason had changed (kube-rs's Recorder folds
//! repeats without looking at the note). The publisher folds only the same
//! note, as client-go's events library (kube-scheduler's) does: a new note is
//! a new Event. Against a mock API that records each call and answers as the
//! API server does (the created object, the patched one).

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::client::Body;
use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::Value;
use tessera_k8s::events::Publisher;

#[tokio::test]
async fn a_new_note_is_a_new_event_and_a_repeat_counts_in_its_series() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let calls: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let seen = calls.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            seen.lock().unwrap().push((method, v.clone()));
            send.send_response(
                Response::builder()
                    .status(if v.get("series").is_some() { 200 } else { 201 })
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&v).unwrap()))
                    .unwrap(),
            );
        }
    });
    let client = kube::Client::new(service, "default");
    let p = Publisher::new(client, Reporter::from("tessera"));
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some("p1".into()),
        namespace: Some("ml".into()),
        uid: Some("u-1".into()),
        ..ObjectReference::default()
    };
    let failed = |note: &str| Event {
        type_: EventType::Warning,
        reason: "FailedScheduling".into(),
        note: Some(note.into()),
        action: "Scheduling".into(),
        secondary: None,
    };
    let waiting = failed("waiting for the ResourceClaim of template t");
    let no_fit = failed("0/2 nodes are available: claims do not fit");
    p.publish(&waiting, &pod).await.unwrap();
    p.publish(&waiting, &pod).await.unwrap();
    p.publish(&no_fit, &pod).await.unwrap();
    p.publish(&no_fit, &pod).await.unwrap();
    p.publish(&no_fit, &pod).await.unwrap();
    let calls = calls.lock().unwrap().clone();
    let shape: Vec<(&str, Option<i64>)> = calls
        .iter()
        .map(|(m, v)| {
            (
                m.as_str(),
                v.pointer("/series/count").and_then(Value::as_i64),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("POST", None),
            ("PATCH", Some(2)),
            ("POST", None),
            ("PATCH", Some(2)),
            ("PATCH", Some(3))
        ]
    );
    assert_eq!(
        calls[2].1["note"],
        "0/2 nodes are available: claims do not fit"
    );
    assert_eq!(calls[0].1["regarding"]["uid"], "u-1");
    assert_eq!(calls[0].1["reportingController"], "tessera");
}
