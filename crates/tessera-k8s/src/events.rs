//! Kubernetes Events off the scheduling path, as kube-scheduler's event
//! broadcaster does: the scheduler queues an event and goes on; a task
//! publishes the queue a few at a time through kube-rs's [`Recorder`], which
//! folds repeats of one event into a series (one PATCH instead of a new
//! object). A full queue drops the event and counts it: an event is never
//! worth delaying a bind.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::{Notify, mpsc};

/// Events waiting to be published, at most.
pub const QUEUE: usize = 4096;
/// Events published at once.
const CONCURRENT: usize = 8;

#[derive(Default)]
struct Counts {
    queued: AtomicUsize,
    dropped: AtomicU64,
    idle: Notify,
}

/// A handle that queues events for the publishing task.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<(ObjectReference, Event)>,
    counts: Arc<Counts>,
}

impl EventSink {
    /// Starts the publishing task on the current runtime; it ends when every
    /// handle is dropped and the queue is empty.
    pub fn spawn(recorder: Recorder) -> EventSink {
        let (tx, rx) = mpsc::channel::<(ObjectReference, Event)>(QUEUE);
        let counts = Arc::new(Counts::default());
        let task_counts = counts.clone();
        tokio::spawn(tokio_stream_from(rx).for_each_concurrent(
            CONCURRENT,
            move |(reference, event)| {
                let recorder = recorder.clone();
                let counts = task_counts.clone();
                async move {
                    if let Err(e) = recorder.publish(&event, &reference).await {
                        tracing::warn!(
                            object = reference.name.as_deref().unwrap_or(""),
                            reason = %event.reason,
                            error = %e,
                            "could not record event"
                        );
                    }
                    if counts.queued.fetch_sub(1, Ordering::AcqRel) == 1 {
                        counts.idle.notify_waiters();
                    }
                }
            },
        ));
        EventSink { tx, counts }
    }

    /// Queues an event about `pod`; never waits.
    pub fn pod_event(&self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Scheduling".into(),
            secondary: None,
        };
        self.counts.queued.fetch_add(1, Ordering::AcqRel);
        if self.tx.try_send((pod.object_ref(&()), event)).is_err() {
            self.counts.queued.fetch_sub(1, Ordering::AcqRel);
            let dropped = self.counts.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(dropped, "event queue full; events dropped");
            }
        }
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    /// Waits until every queued event has been published (or failed).
    pub async fn flush(&self) {
        loop {
            let idle = self.counts.idle.notified();
            if self.counts.queued.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

fn tokio_stream_from<T>(mut rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
