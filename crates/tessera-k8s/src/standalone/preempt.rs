//! Standalone mode preempts on its own: for a pod that fits nowhere, the
//! mirror's plan ([`Mirror::preemption`]: priority within a queue, reclaim of
//! borrowed quota across queues, device-aware, budgets respected) is carried
//! out through the eviction API, each eviction with the victim's UID as
//! precondition (a pod re-created under the same name is never evicted by
//! mistake). The API server checks PodDisruptionBudgets again (429): a victim it
//! refuses stays, and the preemptor waits. While its victims are leaving, the
//! preemptor waits for them (up to [`PREEMPTION_WAIT`]) instead of choosing
//! more; it is placed by a normal pass once they are gone.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;

use super::Standalone;
use crate::binder::lock;
use crate::convert;
use crate::mirror::{may_preempt_for, victims_text};

/// How long a preemptor waits for its victims to leave before planning again.
pub const PREEMPTION_WAIT: Duration = Duration::from_secs(120);

/// Reasons a decision failed for that evicting others cannot cure.
const NOT_FOR_PREEMPTION: [&str; 5] = [
    "invalid request",
    "unsupported",
    "bound",
    "ledger refused",
    "queue quota",
];

impl Standalone {
    /// Tries to make room for `pod` (whose decision failed for `reason`) by
    /// evicting others; returns the sentence for its event if it did, or is
    /// waiting for earlier victims to leave.
    pub(super) async fn preempt_for(&mut self, pod: &Pod, reason: &str) -> Option<String> {
        if NOT_FOR_PREEMPTION.contains(&reason) {
            return None;
        }
        let uid = convert::pod_uid(pod).to_string();
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let plan = {
            let mut m = lock(&self.mirror);
            if let Some((victims, until)) = self.preempting.get(&uid) {
                let left = victims.iter().filter(|v| m.pod(v).is_some()).count();
                if left > 0 && Instant::now() < *until {
                    return Some(format!("waiting for {left} preempted pod(s) to leave"));
                }
            }
            let catalog = m.cluster().catalog.clone();
            let req = convert::pod_request(pod, &catalog).ok()?;
            if !may_preempt_for(pod, &req) {
                return None;
            }
            m.preemption(pod, &req, now_s, self.min_runtime.as_secs())?
        };
        let client = self.binder.client().clone();
        let mut evicted = Vec::new();
        let mut refused = Vec::new();
        for v in &plan.victims {
            let api: Api<Pod> = Api::namespaced(client.clone(), &v.namespace);
            // Written out rather than with kube-rs's `Api::evict`, whose body
            // (kube 3.0) names the field `delete_options` and carries no
            // apiVersion/kind: the API server would drop the UID precondition.
            let eviction = Eviction {
                metadata: ObjectMeta {
                    name: Some(v.name.clone()),
                    namespace: Some(v.namespace.clone()),
                    ..ObjectMeta::default()
                },
                delete_options: Some(DeleteOptions {
                    preconditions: Some(Preconditions {
                        uid: Some(v.uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteOptions::default()
                }),
            };
            let sent = api
                .create_subresource::<Eviction, serde_json::Value>(
                    "eviction",
                    &v.name,
                    &PostParams::default(),
                    &eviction,
                )
                .await;
            match sent {
                Ok(_) => evicted.push(v.clone()),
                Err(kube::Error::Api(e)) if e.code == 404 => evicted.push(v.clone()),
                Err(e) => refused.push(format!("{}/{}: {e}", v.namespace, v.name)),
            }
        }
        let kind = if plan.reclaim {
            "reclaiming borrowed quota"
        } else {
            "preempting lower-priority pods"
        };
        let by = convert::pod_key(pod);
        if let Some(events) = &self.events {
            let m = lock(&self.mirror);
            for v in &evicted {
                if let Some(victim) = m.pod(&v.uid) {
                    events.pod_event(
                        victim,
                        EventType::Normal,
                        "Preempted",
                        format!("evicted by Tessera for {by} on node {} ({kind})", plan.node),
                    );
                }
            }
        }
        self.preempting.insert(
            uid,
            (
                evicted.iter().map(|v| v.uid.clone()).collect(),
                Instant::now() + PREEMPTION_WAIT,
            ),
        );
        let mut sentence = format!(
            "{kind} on node {}: evicted {}",
            plan.node,
            if evicted.is_empty() {
                "none".to_string()
            } else {
                victims_text(&evicted)
            }
        );
        if !refused.is_empty() {
            sentence.push_str(&format!("; the API refused {}", refused.join("; ")));
        }
        self.record(pod, EventType::Normal, "Preempting", sentence.clone());
        Some(sentence)
    }
}
