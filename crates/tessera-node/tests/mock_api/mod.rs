//! An API server for one watcher, on kube-rs's mock service: every LIST is
//! answered with one fixed list, the first WATCH is held open and streams the
//! events the test sends, and every request's URI is reported. Shared by the
//! tests of the agent's watches (its node's pods, its own Node).
#![allow(dead_code)] // each test binary uses its own part

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use http_body_util::Channel;
use kube::client::Body;
use tokio::sync::mpsc;
use tonic::codegen::Bytes;

/// The running double: send watch events on `events`, read URIs from `seen`.
pub struct MockApi {
    pub client: kube::Client,
    pub events: mpsc::UnboundedSender<Bytes>,
    pub seen: mpsc::UnboundedReceiver<String>,
    pub server: tokio::task::JoinHandle<()>,
}

impl MockApi {
    /// The URIs requested so far.
    pub fn uris(&mut self) -> Vec<String> {
        let mut uris = Vec::new();
        while let Ok(u) = self.seen.try_recv() {
            uris.push(u);
        }
        uris
    }
}

/// Starts the double; every LIST gets `list`.
pub fn start(list: serde_json::Value) -> MockApi {
    let (mock, mut handle) =
        tower_test::mock::pair::<Request<Body>, Response<Channel<Bytes, Infallible>>>();
    let client = kube::Client::new(mock, "default");
    let (seen_tx, seen) = mpsc::unbounded_channel::<String>();
    let (events, events_rx) = mpsc::unbounded_channel::<Bytes>();
    let events_rx = Arc::new(Mutex::new(Some(events_rx)));
    let list = Bytes::from(serde_json::to_vec(&list).expect("a JSON list"));
    // Each request answered on its own task, so a held-open watch does not
    // hold up the others.
    let server = tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let uri = req.uri().to_string();
            let _ = seen_tx.send(uri.clone());
            let (mut tx, body) = Channel::new(16);
            send.send_response(Response::new(body));
            let events_rx = events_rx.clone();
            let list = list.clone();
            tokio::spawn(async move {
                if uri.contains("watch=true") {
                    let Some(mut events) = events_rx.lock().unwrap().take() else {
                        return;
                    };
                    while let Some(ev) = events.recv().await {
                        if tx.send_data(ev).await.is_err() {
                            break;
                        }
                    }
                    return;
                }
                let _ = tx.send_data(list).await;
            });
        }
    });
    MockApi {
        client,
        events,
        seen,
        server,
    }
}

/// One watch event line: `{"type": kind, "object": object}\n`.
pub fn line(kind: &str, object: &serde_json::Value) -> Bytes {
    let mut v = serde_json::to_vec(&serde_json::json!({"type": kind, "object": object})).unwrap();
    v.push(b'\n');
    Bytes::from(v)
}
