//! Preemption on a real control plane (issue 41, defects 1 and 8), in both
//! modes:
//! - extender: a high-priority pod whose nodeSelector allows only the full
//!   node is preempted for at once, although another node has room
//!   (defect 1: the preemptor took "fits some node now" for "fits");
//! - `preemptionPolicy: Never` evicts nobody, in extender and in standalone
//!   mode; it waits, and runs once the room is freed by other means;
//! - standalone: the preemptor is nominated (`status.nominatedNodeName`, as
//!   kube-scheduler does) after its victims are evicted, then bound there;
//!   a waiting pod runs within seconds of the room being freed (it slept out
//!   its 60 s backoff before: the GPUs were freed by the node agent's report,
//!   after the deletion had woken it).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_e2e::SERIAL;
use tessera_e2e::cluster::{Cluster, gpu_pod, node_of, phase};
use tessera_e2e::plane::env_or_skip;
use tessera_e2e::tessera::{a100s, fake_gpus_yaml};

const A100_MIB: u64 = 81920;
const BIND: Duration = Duration::from_secs(30);
/// How long a pod that must not preempt is watched for evictions.
const QUIET: Duration = Duration::from_secs(15);

fn nodes(n: usize, gpus: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let name = format!("gpu-{i}");
            (name.clone(), fake_gpus_yaml(&a100s(&name, gpus)))
        })
        .collect()
}

/// `e2e-low` (100), `e2e-high` (1000) and `e2e-never` (1000, `preemptionPolicy: Never`).
async fn priority_classes(c: &Cluster) {
    let pcs: Api<PriorityClass> = Api::all(c.admin.clone());
    for (name, value, policy) in [
        ("e2e-low", 100, "PreemptLowerPriority"),
        ("e2e-high", 1000, "PreemptLowerPriority"),
        ("e2e-never", 1000, "Never"),
    ] {
        let pc: PriorityClass = serde_json::from_value(
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value, "preemptionPolicy": policy}),
        )
        .unwrap();
        pcs.create(&PostParams::default(), &pc).await.unwrap();
    }
}

fn two_gpus(name: &str, scheduler: &str, class: &str) -> Value {
    gpu_pod(name, scheduler, json!({"nvidia.com/gpu": "2"}), Some(class))
}

async fn uid(c: &Cluster, pod: &str) -> Option<String> {
    c.pods().get(pod).await.unwrap().metadata.uid
}

/// Whether pod `name` with UID `uid` still exists and is not being deleted.
async fn untouched(c: &Cluster, name: &str, uid: &Option<String>) -> bool {
    c.pods().get_opt(name).await.unwrap().is_some_and(|p| {
        &p.metadata.uid == uid && p.metadata.deletion_timestamp.is_none() && phase(&p) == "Running"
    })
}

/// A pod that never preempts waits on a full cluster, evicting nobody.
async fn never_preempting_waits(c: &Cluster, scheduler: &str) {
    let low_uid = uid(c, "low").await;
    c.create(two_gpus("never", scheduler, "e2e-never"))
        .await
        .unwrap();
    let t = Instant::now();
    while t.elapsed() < QUIET {
        assert!(
            untouched(c, "low", &low_uid).await,
            "{scheduler}: the low-priority pod was evicted for a pod with preemptionPolicy Never"
        );
        let never = c.pods().get("never").await.unwrap();
        assert!(
            node_of(&never).is_none(),
            "{scheduler}: the never-preempting pod was bound on a full cluster"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "{scheduler}: a pod with preemptionPolicy Never waited {} s on a full node, nobody evicted",
        QUIET.as_secs()
    );
}

/// Once `holder` is deleted by its owner, the never-preempting pod runs.
async fn never_runs_once_freed(c: &Cluster, holder: &str) {
    c.pods()
        .delete(holder, &DeleteParams::default())
        .await
        .unwrap();
    let (_, took) = c
        .wait_running("never", Duration::from_secs(60))
        .await
        .unwrap();
    println!(
        "never-preempting pod Running {:.1} s after {holder} was deleted",
        took.as_secs_f64()
    );
}

#[tokio::test]
async fn extender_preempts_on_the_only_node_the_pod_may_use() {
    let Some(env) = env_or_skip("preemption::extender_preempts_on_the_only_node_the_pod_may_use")
    else {
        return;
    };
    let _one = SERIAL.lock().await;
    let c = Cluster::extender(&env, &nodes(2, 2)).await.unwrap();
    priority_classes(&c).await;
    c.create(two_gpus("low", "tessera", "e2e-low"))
        .await
        .unwrap();
    let (full, _) = c.wait_running("low", BIND).await.unwrap();
    let low_uid = uid(&c, "low").await;
    // Only the node low runs on is allowed; the other has both GPUs free.
    let api: Api<Node> = Api::all(c.admin.clone());
    api.patch(
        &full,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"e2e-pool": "only"}}})),
    )
    .await
    .unwrap();
    let mut high = two_gpus("high", "tessera", "e2e-high");
    high["spec"]["nodeSelector"] = json!({"e2e-pool": "only"});
    c.create(high).await.unwrap();
    let (node, took) = c.wait_running("high", BIND).await.unwrap();
    assert_eq!(node, full, "high runs on the only node its selector allows");
    let low = c.pods().get_opt("low").await.unwrap();
    assert!(
        low.is_none_or(|p| p.metadata.uid != low_uid),
        "the low-priority pod still exists"
    );
    println!(
        "extender: high (nodeSelector: the full node only, another node empty) Running on {node} {:.1} s after creation, low preempted",
        took.as_secs_f64()
    );
    c.audit(A100_MIB).await.unwrap();
}

#[tokio::test]
async fn extender_never_preempting_pod_evicts_nobody() {
    let Some(env) = env_or_skip("preemption::extender_never_preempting_pod_evicts_nobody") else {
        return;
    };
    let _one = SERIAL.lock().await;
    let c = Cluster::extender(&env, &nodes(1, 2)).await.unwrap();
    priority_classes(&c).await;
    c.create(two_gpus("low", "tessera", "e2e-low"))
        .await
        .unwrap();
    c.wait_running("low", BIND).await.unwrap();
    never_preempting_waits(&c, "tessera").await;
    never_runs_once_freed(&c, "low").await;
    c.audit(A100_MIB).await.unwrap();
}

#[tokio::test]
async fn standalone_nominates_its_preemptor_and_never_preempting_waits() {
    let Some(env) =
        env_or_skip("preemption::standalone_nominates_its_preemptor_and_never_preempting_waits")
    else {
        return;
    };
    let _one = SERIAL.lock().await;
    let c = Cluster::standalone(&env, &nodes(1, 2)).await.unwrap();
    priority_classes(&c).await;
    c.create(two_gpus("low", "tessera", "e2e-low"))
        .await
        .unwrap();
    let (node, _) = c.wait_running("low", BIND).await.unwrap();
    let low_started = Instant::now();
    let low_uid = uid(&c, "low").await;
    never_preempting_waits(&c, "tessera").await;
    // Standalone spares pods younger than its minimum run time (60 s).
    let min_runtime = Duration::from_secs(61);
    if let Some(left) = min_runtime.checked_sub(low_started.elapsed()) {
        tokio::time::sleep(left).await;
    }
    c.create(two_gpus("high", "tessera", "e2e-high"))
        .await
        .unwrap();
    let pods: Api<Pod> = c.pods();
    let t = Instant::now();
    let mut nominated: Option<(String, Duration)> = None;
    let bound = loop {
        let p = pods.get("high").await.unwrap();
        if nominated.is_none()
            && let Some(n) = p
                .status
                .as_ref()
                .and_then(|s| s.nominated_node_name.clone())
        {
            nominated = Some((n, t.elapsed()));
        }
        if let Some(n) = node_of(&p) {
            break n;
        }
        assert!(
            t.elapsed() < BIND,
            "high not bound within {} s",
            BIND.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (nominee, at) = nominated.expect("the preemptor's status.nominatedNodeName was set");
    assert_eq!(nominee, node, "nominated to the node its victim left");
    assert_eq!(bound, node);
    let low = c.pods().get_opt("low").await.unwrap();
    assert!(
        low.is_none_or(|p| p.metadata.uid != low_uid),
        "the low-priority pod still exists"
    );
    println!(
        "standalone: high nominated to {nominee} {:.1} s after creation, bound there {:.1} s after creation",
        at.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    // The never-preempting pod still waits (high is not lower); it runs
    // once high is deleted, woken by the room the node agent reports freed.
    let never = c.pods().get("never").await.unwrap();
    assert!(node_of(&never).is_none(), "never bound on a full node");
    never_runs_once_freed(&c, "high").await;
    c.audit(A100_MIB).await.unwrap();
}
