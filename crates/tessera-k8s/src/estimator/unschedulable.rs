//! `GetUnschedulableReplicas`: how many of a workload's replicas have waited
//! unschedulable for longer than a threshold (karmada-descheduler moves that
//! many elsewhere), read the way Karmada's own estimator reads it (v1.18.2,
//! `pkg/estimator/server/replica`):
//!
//! - only `apps/v1` Deployments (another kind is refused, as there);
//! - its *new* ReplicaSet: one it controls whose pod template equals the
//!   Deployment's but for the `pod-template-hash` label (kube's
//!   `FindNewReplicaSet`; the oldest if several do);
//! - that ReplicaSet's pods: in the namespace, matching the Deployment's
//!   selector, controlled by it;
//! - a pod counts when its `PodScheduled` condition is `False` with reason
//!   `Unschedulable` and turned so longer than the threshold ago (Tessera's
//!   standalone mode writes that condition as kube-scheduler does).
//!
//! Read from the API server per request (a Deployment, its ReplicaSets, its
//! pods), not from the mirror: the mirror keeps no ReplicaSets and no pending
//! pods' conditions, and the descheduler asks once per workload every few
//! minutes.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{Api, ListParams};
use tessera_estimator::pb;
use tonic::Status;

/// The label a Deployment's controller adds to each ReplicaSet's template.
const HASH_LABEL: &str = "pod-template-hash";

/// Whether `pod` has waited unschedulable for longer than `threshold_s`
/// seconds by `now` (Unix seconds).
pub fn unschedulable_since(pod: &Pod, threshold_s: i64, now: i64) -> bool {
    let Some(c) = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
    else {
        return false;
    };
    let since = c.last_transition_time.as_ref().map(|t| t.0.as_second());
    c.status == "False"
        && c.reason.as_deref() == Some("Unschedulable")
        && since.is_some_and(|t| t.saturating_add(threshold_s.max(0)) < now)
}

fn controller(owners: Option<&Vec<OwnerReference>>) -> Option<&OwnerReference> {
    owners?.iter().find(|o| o.controller == Some(true))
}

fn controlled_by(owners: Option<&Vec<OwnerReference>>, uid: Option<&str>) -> bool {
    controller(owners).is_some_and(|o| Some(o.uid.as_str()) == uid)
}

/// A pod template as JSON without the `pod-template-hash` label.
fn without_hash(t: Option<&PodTemplateSpec>) -> serde_json::Value {
    let mut v = serde_json::to_value(t).unwrap_or_default();
    let emptied = v
        .pointer_mut("/metadata/labels")
        .and_then(|l| l.as_object_mut())
        .is_some_and(|labels| {
            labels.remove(HASH_LABEL);
            labels.is_empty()
        });
    if emptied && let Some(m) = v.pointer_mut("/metadata").and_then(|m| m.as_object_mut()) {
        m.remove("labels");
    }
    v
}

/// The Deployment's new ReplicaSet among `sets` (kube's `FindNewReplicaSet`:
/// controlled by it, the same template but for the hash label, the oldest
/// first).
pub fn new_replica_set<'a>(deploy: &Deployment, sets: &'a [ReplicaSet]) -> Option<&'a ReplicaSet> {
    let want = without_hash(deploy.spec.as_ref().map(|s| &s.template));
    let uid = deploy.metadata.uid.as_deref();
    let mut found: Vec<&ReplicaSet> = sets
        .iter()
        .filter(|rs| controlled_by(rs.metadata.owner_references.as_ref(), uid))
        .filter(|rs| without_hash(rs.spec.as_ref().and_then(|s| s.template.as_ref())) == want)
        .collect();
    found.sort_by(|a, b| {
        let at = |r: &ReplicaSet| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
        at(a)
            .cmp(&at(b))
            .then(a.metadata.name.cmp(&b.metadata.name))
    });
    found.first().copied()
}

/// `matchLabels` and `matchExpressions` as a label selector string.
fn selector_string(s: &LabelSelector) -> Result<String, String> {
    let mut parts: Vec<String> = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in s.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            other => return Err(format!("selector operator {other:?}")),
        });
    }
    Ok(parts.join(","))
}

/// How many replicas of the Deployment `resource` names have been
/// unschedulable for longer than `threshold_ns` (see the module docs).
pub async fn unschedulable_replicas(
    client: &kube::Client,
    resource: &pb::ObjectReference,
    threshold_ns: i64,
) -> Result<u32, Status> {
    if resource.api_version != "apps/v1" || resource.kind != "Deployment" {
        return Err(Status::unimplemented(format!(
            "GetUnschedulableReplicas: kind {}/{} of workload {}/{} is not supported (only apps/v1 Deployment, as in Karmada's estimator)",
            resource.api_version, resource.kind, resource.namespace, resource.name
        )));
    }
    let api_err = |what: &str, e: kube::Error| match &e {
        kube::Error::Api(s) if s.code == 404 => Status::not_found(format!("{what}: {}", s.message)),
        kube::Error::Api(s) if s.code == 403 => {
            Status::permission_denied(format!("{what}: {}", s.message))
        }
        _ => Status::unavailable(format!("{what}: {e}")),
    };
    let ns = resource.namespace.as_str();
    let deploy = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(&resource.name)
        .await
        .map_err(|e| api_err(&format!("Deployment {ns}/{}", resource.name), e))?;
    let selector = deploy
        .spec
        .as_ref()
        .map(|s| selector_string(&s.selector))
        .transpose()
        .map_err(|e| Status::invalid_argument(format!("Deployment {ns}/{}: {e}", resource.name)))?
        .unwrap_or_default();
    let lp = ListParams::default().labels(&selector);
    let sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| api_err(&format!("ReplicaSets of {ns}/{}", resource.name), e))?
        .items;
    let Some(rs) = new_replica_set(&deploy, &sets) else {
        return Ok(0);
    };
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| api_err(&format!("pods of {ns}/{}", resource.name), e))?
        .items;
    let threshold_s = threshold_ns.max(0) / 1_000_000_000;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let n = pods
        .iter()
        .filter(|p| {
            controlled_by(
                p.metadata.owner_references.as_ref(),
                rs.metadata.uid.as_deref(),
            )
        })
        .filter(|p| unschedulable_since(p, threshold_s, now))
        .count();
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}
