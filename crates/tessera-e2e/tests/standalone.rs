//! Tessera alone (`--mode standalone`, no kube-scheduler) on a real control
//! plane: node selectors, taints and cordon respected, events written,
//! `tessera explain` for a bound and a pending pod.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tessera_e2e::SERIAL;
use tessera_e2e::cluster::{Cluster, decision, gpu_pod, node_of};
use tessera_e2e::plane::env_or_skip;
use tessera_e2e::tessera::{a100s, fake_gpus_yaml};

const BIND: Duration = Duration::from_secs(30);

#[tokio::test]
async fn standalone_respects_selectors_taints_and_cordon_and_explains() {
    let Some(env) =
        env_or_skip("standalone::standalone_respects_selectors_taints_and_cordon_and_explains")
    else {
        return;
    };
    let _one = SERIAL.lock().await;
    let nodes: Vec<(String, String)> = (0..3)
        .map(|i| {
            let name = format!("gpu-{i}");
            let yaml = fake_gpus_yaml(&a100s(&name, 2));
            (name, yaml)
        })
        .collect();
    let c = Cluster::standalone(&env, &nodes).await.unwrap();
    let api: Api<Node> = Api::all(c.admin.clone());
    let pp = PatchParams::default();
    api.patch(
        "gpu-0",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"pool": "a"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "gpu-1",
        &pp,
        &Patch::Merge(json!({"spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]}})),
    )
    .await
    .unwrap();
    c.plane.kubectl(&["cordon", "gpu-2"], None).unwrap();
    // Let the scheduler's watches see the three changes.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let share = json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "25", "tessera.io/gpu-cores": "25"});
    let with = |name: &str, spec: serde_json::Value| {
        let mut p = gpu_pod(name, "tessera", share.clone(), None);
        for (k, v) in spec.as_object().unwrap() {
            p["spec"][k] = v.clone();
        }
        p
    };
    c.create(with("sel", json!({"nodeSelector": {"pool": "a"}})))
        .await
        .unwrap();
    c.create(with(
        "tol",
        json!({"nodeSelector": {"kubernetes.io/hostname": "gpu-1"},
               "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"}]}),
    ))
    .await
    .unwrap();
    c.create(with(
        "notol",
        json!({"nodeSelector": {"kubernetes.io/hostname": "gpu-1"}}),
    ))
    .await
    .unwrap();
    c.create(with(
        "cordoned",
        json!({"nodeSelector": {"kubernetes.io/hostname": "gpu-2"}}),
    ))
    .await
    .unwrap();
    c.create(with("anywhere", json!({}))).await.unwrap();

    let (n, t) = c.wait_running("sel", BIND).await.unwrap();
    println!("sel on {n} after {:.1} s", t.as_secs_f64());
    assert_eq!(n, "gpu-0", "nodeSelector pool=a");
    let (n, t) = c.wait_running("tol", BIND).await.unwrap();
    println!("tol on {n} after {:.1} s", t.as_secs_f64());
    assert_eq!(n, "gpu-1", "the toleration lets it onto the tainted node");
    let (n, _) = c.wait_running("anywhere", BIND).await.unwrap();
    assert_ne!(n, "gpu-1", "untolerated taint");
    assert_ne!(n, "gpu-2", "cordoned");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["notol", "cordoned"] {
        let p = c.pods().get(name).await.unwrap();
        assert_eq!(node_of(&p), None, "{name} was bound");
    }
    let d = decision(&c.pods().get("sel").await.unwrap()).unwrap();
    assert_eq!(d.node, "gpu-0");
    assert_eq!(d.gpus.len(), 1);

    // Events: the scheduler says where the bound pod went and why the others wait.
    let ev = c.events("sel");
    println!("events of sel:\n{ev}");
    assert!(ev.contains("Scheduled"), "{ev}");
    let ev = c.events("notol");
    println!("events of notol:\n{ev}");
    assert!(ev.contains("FailedScheduling"), "{ev}");

    // tessera explain, as an operator would run it.
    let bound = c.explain("sel").unwrap();
    println!("tessera explain default/sel:\n{bound}");
    assert!(bound.contains("gpu-0"), "{bound}");
    let pending = c.explain("notol").unwrap();
    println!("tessera explain default/notol:\n{pending}");
    assert!(pending.to_lowercase().contains("taint"), "{pending}");
    let cordoned = c.explain("cordoned").unwrap();
    println!("tessera explain default/cordoned:\n{cordoned}");
    assert!(
        cordoned.to_lowercase().contains("unschedulable")
            || cordoned.to_lowercase().contains("cordon"),
        "{cordoned}"
    );
    c.audit(81920).await.unwrap();
}
