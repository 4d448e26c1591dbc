//! Kubernetes Events off the scheduling path, as kube-scheduler's event
//! broadcaster does: the scheduler queues an event and goes on; a task
//! publishes the queue a few at a time through a [`Publisher`], which folds
//! repeats of one event into a series (one PATCH instead of a new object). A
//! full queue drops the event and counts it: an event is never worth delaying
//! a bind.
//!
//! A repeat is the same object, reason, action, type, reporter *and note*, as
//! client-go's events library keys them (kube-scheduler's): kube-rs's
//! `Recorder` leaves the note out, so a pod's FailedScheduling event kept its
//! first note ("waiting for the ResourceClaim …") as a growing series after the
//! real reason had changed (issue 41, defect 13). A new note is a new event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use tokio::sync::{Notify, mpsc};

/// How long a published event is remembered for folding repeats into it.
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// What makes two events one series: the object (by UID, or kind/namespace/name
/// without one), reason, action, type and note.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    object: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    reason: String,
    action: String,
    warning: bool,
    note: Option<String>,
}

#[derive(Debug, Clone)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes events.k8s.io/v1 Events for one reporter, folding repeats into series.
#[derive(Clone)]
pub struct Publisher {
    client: kube::Client,
    reporter: Reporter,
    cache: Arc<std::sync::Mutex<HashMap<SeriesKey, Published>>>,
}

impl Publisher {
    pub fn new(client: kube::Client, reporter: Reporter) -> Publisher {
        Publisher {
            client,
            reporter,
            cache: Arc::default(),
        }
    }

    fn key(ev: &Event, r: &ObjectReference) -> SeriesKey {
        SeriesKey {
            object: match &r.uid {
                Some(uid) => (Some(uid.clone()), None, None, None),
                None => (None, r.kind.clone(), r.namespace.clone(), r.name.clone()),
            },
            reason: ev.reason.clone(),
            action: ev.action.clone(),
            warning: matches!(ev.type_, EventType::Warning),
            note: ev.note.clone(),
        }
    }

    /// Publishes `ev` about `reference`: a new Event, or the next count of the
    /// series of the same event published in the last [`SERIES_TTL`].
    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Self::key(ev, reference);
        let namespace = reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        // The cache is locked only to read and to record, never across a request,
        // so the sink's concurrent publishes stay concurrent.
        let repeat = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.retain(|_, p| p.last + SERIES_TTL > now);
            cache.get(&key).cloned()
        };
        if let Some(p) = repeat {
            let patch = serde_json::json!({"series": EventSeries {
                count: p.count + 1,
                last_observed_time: MicroTime(now),
            }});
            match api
                .patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
                        key,
                        Published {
                            name: p.name,
                            count: p.count + 1,
                            last: now,
                        },
                    );
                    return Ok(());
                }
                // Gone (its TTL on the server): a new event below.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!(
            "{}.{:x}",
            reference
                .name
                .as_deref()
                .unwrap_or(&self.reporter.controller),
            now.as_nanosecond()
        );
        let event = K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            related: ev.secondary.clone(),
            ..K8sEvent::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key,
            Published {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }
}

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
    pub fn spawn(recorder: Publisher) -> EventSink {
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
