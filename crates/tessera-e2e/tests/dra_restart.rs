//! DRA restart recovery on a real control plane (issue 38; Kubernetes 1.34+):
//! Tessera `--mode standalone --dra` is `kill -9`ed while pods with claims from
//! a ResourceClaimTemplate arrive (the real resourceclaim controller making
//! their claims), more arrive while it is down, and it is started again: every
//! pod is bound once the GPUs allow, each claim allocated once, no device in
//! two claims (audited from the stored claims), and the claims it wrote
//! before the kill are kept as they are.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tessera_e2e::SERIAL;
use tessera_e2e::dra::{dra_plane, env_at_least, start_dra_nodes};
use tessera_e2e::fill::{GPU_MIB, audit_claims};
use tessera_e2e::plane::{ControlPlane, Identity};
use tessera_e2e::tessera::start_scheduler;

fn template_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "tessera", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]}}]}}))
    .unwrap()
}

async fn bound(pods: &Api<Pod>) -> usize {
    pods.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .count()
}

#[tokio::test]
async fn tessera_killed_while_claim_pods_arrive_recovers() {
    let Some(env) = env_at_least(
        "dra_restart::tessera_killed_while_claim_pods_arrive_recovers",
        34,
        "resource.k8s.io/v1",
    ) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let (mut plane, key) = dra_plane(&env, None).await.unwrap();
    let args = ["--leader-elect=false", "--dra"];
    let first = start_scheduler(&mut plane, "standalone", &key, &args)
        .await
        .unwrap();
    let _nodes = start_dra_nodes(&mut plane, 2, 4, "", None).await.unwrap();
    plane
        .apply(&json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}}}}))
        .unwrap();
    let admin = plane.client(Identity::Admin).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    // One pod bound, then 3 more and the kill at once: their claims (made by the
    // controller, allocated by Tessera) are in flight when it dies.
    pods.create(&PostParams::default(), &template_pod("a0"))
        .await
        .unwrap();
    let t = Instant::now();
    while bound(&pods).await < 1 {
        assert!(t.elapsed() < Duration::from_secs(60), "a0 not bound");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for k in 1..4 {
        pods.create(&PostParams::default(), &template_pod(&format!("a{k}")))
            .await
            .unwrap();
    }
    let killed = plane.kill(&first.proc_name);
    assert_eq!(killed, 1);
    let before = bound(&pods).await;
    let kept: Vec<(String, String)> = {
        let claims = audit_claims(&admin, GPU_MIB).await.unwrap();
        assert!(claims.violations.is_empty(), "{:?}", claims.violations);
        allocated(&plane)
    };
    // 6 more while it is down: 10 pods for 8 GPUs.
    for k in 0..6 {
        pods.create(&PostParams::default(), &template_pod(&format!("b{k}")))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restart = Instant::now();
    let _second = start_scheduler(&mut plane, "standalone", &key, &args)
        .await
        .unwrap();
    while bound(&pods).await < 8 {
        assert!(
            restart.elapsed() < Duration::from_secs(90),
            "not 8 of 10 bound within 90 s of the restart ({} now)",
            bound(&pods).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_bound = restart.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = audit_claims(&admin, GPU_MIB).await.unwrap();
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    assert_eq!(bound(&pods).await, 8, "8 GPUs, 8 pods bound, 2 wait");
    assert_eq!(audit.results, 8, "each bound pod's claim allocated once");
    let now = allocated(&plane);
    for c in &kept {
        assert!(
            now.contains(c),
            "claim {c:?} written before the kill changed: {now:?}"
        );
    }
    println!(
        "dra restart: killed with {before} of 4 bound ({} claims allocated); 6 more created while down; all 8 GPUs' pods bound {:.1} s after the restart; {} allocated results audited, none over-held; the claims written before the kill unchanged",
        kept.len(),
        all_bound.as_secs_f64(),
        audit.results
    );
}

/// (claim, device) of every allocated claim.
fn allocated(plane: &ControlPlane) -> Vec<(String, String)> {
    let out = plane
        .kubectl(
            &["get", "resourceclaims", "-n", "default", "-o", "json"],
            None,
        )
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut r = Vec::new();
    for c in v["items"].as_array().into_iter().flatten() {
        for res in c
            .pointer("/status/allocation/devices/results")
            .and_then(|x| x.as_array())
            .into_iter()
            .flatten()
        {
            r.push((
                c["metadata"]["name"].as_str().unwrap_or("").to_string(),
                format!(
                    "{}/{}",
                    res["pool"].as_str().unwrap_or(""),
                    res["device"].as_str().unwrap_or("")
                ),
            ));
        }
    }
    r
}
