//! `PodScheduled=False` on pods Tessera could not place (issue 41, defect 13), as
//! kube-scheduler writes it after a failed attempt: `kubectl get pods` and
//! `describe` show the reason, and tools waiting on the condition see it.
//!
//! Written only when it would change what the pod shows (status, reason or
//! message), so a pod failing for the same reason is written once; the write is a
//! strategic merge patch of the status subresource (the list merges by `type`)
//! carrying the pod's UID, so a pod deleted and recreated under the same name is
//! never written by mistake (the API server refuses a patch whose UID differs).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::convert;
use crate::mirror::SharedMirror;

/// kube-scheduler's reason for a pod that fits nowhere now.
pub const UNSCHEDULABLE: &str = "Unschedulable";

/// The status patch that makes `pod` show `PodScheduled=False` with `message`,
/// or `None` when it shows exactly that already (or is bound, or has no UID).
pub fn unschedulable_patch(pod: &Pod, message: &str, now: &str) -> Option<Value> {
    if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
        return None;
    }
    let uid = pod.metadata.uid.as_deref()?;
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    if current.is_some_and(|c| {
        c.status == "False"
            && c.reason.as_deref() == Some(UNSCHEDULABLE)
            && c.message.as_deref() == Some(message)
    }) {
        return None;
    }
    // The transition time stays when only the message changes.
    let since = current
        .filter(|c| c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or_else(|| now.to_string(), |t| t.0.to_string());
    Some(json!({
        "metadata": {"uid": uid},
        "status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": UNSCHEDULABLE,
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": since,
        }]}
    }))
}

/// Writes `patch` to `pod`'s status, off the scheduling path; a failure is
/// logged (the next failed attempt writes again). The pod the server answers
/// gives the mirror's copy its new resourceVersion and conditions while the
/// mirror still holds the version the patch was made from, so the next pass does
/// not bind with a resourceVersion our own write made stale (a newer one from
/// the watch is never replaced).
pub fn write(client: &kube::Client, mirror: &SharedMirror, pod: &Pod, patch: Value) {
    let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else {
        return;
    };
    let uid = convert::pod_uid(pod).to_string();
    let read = pod.metadata.resource_version.clone();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mirror = mirror.clone();
    tokio::spawn(async move {
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(written) => {
                // What the write changed: the version and the conditions.
                let mut m = mirror.lock();
                let Some(mut now) = m
                    .pod(&uid)
                    .filter(|p| p.metadata.resource_version == read)
                    .cloned()
                else {
                    return;
                };
                if written.metadata.resource_version.is_none()
                    || written.metadata.uid != now.metadata.uid
                {
                    return;
                }
                now.metadata.resource_version = written.metadata.resource_version;
                let conditions = written.status.and_then(|s| s.conditions);
                now.status.get_or_insert_with(Default::default).conditions = conditions;
                m.upsert_pod(now);
            }
            Err(e) => {
                tracing::debug!(pod = %format!("{ns}/{name}"), error = %e, "PodScheduled=False not written")
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(conditions: Value, node: Option<&str>) -> Pod {
        let mut p = json!({"metadata": {"name": "p", "namespace": "ml", "uid": "u-1"},
                           "spec": {"containers": []}, "status": {"conditions": conditions}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn written_once_per_message_with_the_pods_uid() {
        let now = "2026-12-06T21:00:00Z";
        let fresh = pod(json!([]), None);
        let patch = unschedulable_patch(&fresh, "0/2 nodes are available", now).unwrap();
        assert_eq!(patch["metadata"]["uid"], "u-1");
        let c = &patch["status"]["conditions"][0];
        assert_eq!(
            (&c["type"], &c["status"], &c["reason"]),
            (
                &json!("PodScheduled"),
                &json!("False"),
                &json!(UNSCHEDULABLE)
            )
        );
        assert_eq!(c["lastTransitionTime"], now);
        // Shown already: nothing to write.
        let shown = pod(patch["status"]["conditions"].clone(), None);
        assert_eq!(
            unschedulable_patch(&shown, "0/2 nodes are available", now),
            None
        );
        // Another message: written, the transition time kept.
        let again =
            unschedulable_patch(&shown, "claims do not fit", "2026-12-06T21:05:00Z").unwrap();
        assert_eq!(again["status"]["conditions"][0]["lastTransitionTime"], now);
        assert_eq!(
            again["status"]["conditions"][0]["message"],
            "claims do not fit"
        );
        // A bound pod is never marked unschedulable.
        assert_eq!(
            unschedulable_patch(&pod(json!([]), Some("n1")), "x", now),
            None
        );
    }
}
