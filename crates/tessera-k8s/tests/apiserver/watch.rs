//! The body of a WATCH response: one JSON object and `\n` per event, as the
//! server streams them (README "File format"), until the server-side timeout.
//! At the timeout a `BOOKMARK` with the current resourceVersion is sent when
//! bookmarks were asked for (the recorded server sent its bookmarks in the
//! last seconds of a watch, file 08), then the stream ends with no final event.
//! A stream of a crashed session stops delivering, as the dead process would.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures::StreamExt;
use http::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch as flag;

use super::Shared;
use super::store::{Resource, event_line};

/// What the stream sends.
pub enum Stream {
    /// One line, then the end (the ERROR of an expired watch, file 14).
    Once(String),
    Live {
        rx: UnboundedReceiver<String>,
        timeout: Duration,
        bookmark: Option<(Arc<Shared>, Resource)>,
        dead: flag::Receiver<bool>,
    },
}

impl Stream {
    pub fn once(line: String) -> Stream {
        Stream::Once(line)
    }

    pub fn live(
        rx: UnboundedReceiver<String>,
        timeout: Duration,
        bookmark: Option<(Arc<Shared>, Resource)>,
        dead: flag::Receiver<bool>,
    ) -> Stream {
        Stream::Live {
            rx,
            timeout,
            bookmark,
            dead,
        }
    }
}

/// The object of a BOOKMARK event: only the resourceVersion is meaningful (file 08).
fn bookmark_object(resource: Resource, rv: u64) -> Value {
    let mut o = json!({
        "kind": resource.kind(),
        "apiVersion": resource.api_version(),
        "metadata": {"resourceVersion": rv.to_string(), "creationTimestamp": null},
    });
    if resource == Resource::Pods {
        o["spec"] = json!({"containers": null});
        o["status"] = json!({});
    }
    o
}

struct Live {
    rx: UnboundedReceiver<String>,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    bookmark: Option<(Arc<Shared>, Resource)>,
    dead: flag::Receiver<bool>,
    ended: bool,
}

async fn next(mut s: Live) -> Option<(Result<Bytes, std::convert::Infallible>, Live)> {
    if s.ended {
        return None;
    }
    let is_dead = *s.dead.borrow();
    if is_dead {
        std::future::pending::<()>().await;
    }
    let mut dead = s.dead.clone();
    tokio::select! {
        biased;
        _ = async { drop(dead.wait_for(|d| *d).await) } => {
            std::future::pending::<()>().await;
            None
        }
        line = s.rx.recv() => line.map(|l| (Ok(Bytes::from(l)), s)),
        _ = &mut s.deadline => {
            s.ended = true;
            let (shared, resource) = s.bookmark.take()?;
            let rv = shared.lock().store.rv;
            let line = event_line("BOOKMARK", &bookmark_object(resource, rv));
            Some((Ok(Bytes::from(line)), s))
        }
    }
}

/// A 200 response streaming `stream`.
pub fn response(stream: Stream) -> Response<axum::body::Body> {
    let body = match stream {
        Stream::Once(line) => axum::body::Body::from(line),
        Stream::Live {
            rx,
            timeout,
            bookmark,
            dead,
        } => {
            let state = Live {
                rx,
                deadline: Box::pin(tokio::time::sleep(timeout)),
                bookmark,
                dead,
                ended: false,
            };
            axum::body::Body::from_stream(futures::stream::unfold(state, next).boxed())
        }
    };
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(body)
        .unwrap_or_default()
}
