//! Reading and making DRA objects in scenarios, through `kubectl` as the
//! admin: pods with one claim, the stored claims and their devices.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::plane::ControlPlane;

/// A pod of `tessera` with one claim entry `gpu`, from `source`
/// (`{"resourceClaimName": …}` or `{"resourceClaimTemplateName": …}`).
pub fn claim_pod(name: &str, source: Value) -> Value {
    let mut claim = json!({"name": "gpu"});
    claim
        .as_object_mut()
        .unwrap()
        .extend(source.as_object().unwrap().clone());
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "tessera", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "resourceClaims": [claim],
            "containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}}]}})
}

/// The stored claims of namespace `default`.
pub fn claims(plane: &ControlPlane) -> Vec<Value> {
    let out = plane
        .kubectl(
            &["get", "resourceclaims", "-n", "default", "-o", "json"],
            None,
        )
        .unwrap();
    serde_json::from_str::<Value>(&out).unwrap()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Pod `name` of `default` as stored, `None` once gone.
pub fn pod(plane: &ControlPlane, name: &str) -> Option<Value> {
    let out = plane
        .kubectl(
            &[
                "get",
                "pod",
                "-n",
                "default",
                name,
                "-o",
                "json",
                "--ignore-not-found",
            ],
            None,
        )
        .ok()?;
    serde_json::from_str(&out).ok()
}

/// `driver/pool/device` of each result of the claim's allocation.
pub fn devices(claim: &Value) -> Vec<String> {
    claim
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{}/{}/{}",
                r["driver"].as_str().unwrap_or(""),
                r["pool"].as_str().unwrap_or(""),
                r["device"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The claim of pod `p` (by its `status.resourceClaimStatuses`, or the user's claim it names).
pub fn claim_of<'a>(all: &'a [Value], p: &Value) -> Option<&'a Value> {
    let name = p
        .pointer("/status/resourceClaimStatuses/0/resourceClaimName")
        .or_else(|| p.pointer("/spec/resourceClaims/0/resourceClaimName"))?
        .as_str()?;
    all.iter().find(|c| c["metadata"]["name"] == name)
}

/// `kubectl delete pod --grace-period=0 --force` (no kubelet to wait for).
pub fn force_delete(plane: &ControlPlane, pod: &str) {
    plane
        .kubectl(
            &[
                "delete",
                "pod",
                "-n",
                "default",
                pod,
                "--grace-period=0",
                "--force",
            ],
            None,
        )
        .unwrap();
}

/// Waits until `f` holds, polling every 0.2 s; panics naming `what` after `limit`.
pub async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < limit,
            "not within {} s: {what}",
            limit.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t.elapsed()
}

/// Waits until `api` lists none of `what` (named in the failure), for at most
/// `within` after `since`.
async fn wait_none<K>(api: &kube::Api<K>, what: &str, since: Instant, within: Duration)
where
    K: Clone + std::fmt::Debug + k8s_openapi::serde::de::DeserializeOwned,
{
    loop {
        let n = api
            .list(&kube::api::ListParams::default())
            .await
            .unwrap()
            .items
            .len();
        if n == 0 {
            return;
        }
        assert!(since.elapsed() < within, "{n} {what} not gone");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every pod `pods` lists deleted at once (grace 0: no kubelet finishes a
/// graceful delete here), and gone within `within` of the delete.
pub async fn delete_pods_now(pods: &kube::Api<k8s_openapi::api::core::v1::Pod>, within: Duration) {
    use kube::api::{DeleteParams, ListParams};
    pods.delete_collection(
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
        &ListParams::default(),
    )
    .await
    .unwrap();
    wait_none(pods, "pods", Instant::now(), within).await;
}

/// Every pod (grace 0) and claim in `default` deleted, and gone: the
/// resourceclaim controller deallocates a claim and lifts its delete
/// protection once its pod is gone (pods within 60 s, claims within 90 s of
/// the start).
pub async fn delete_pods_and_claims(admin: &kube::Client) {
    use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), "default");
    let claims: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "default", &crate::fill::claims_resource());
    let t = Instant::now();
    delete_pods_now(&pods, Duration::from_secs(60)).await;
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    wait_none(&claims, "claims", t, Duration::from_secs(90)).await;
}
