//! Tessera as the extender of the cluster's only kube-scheduler, wired as
//! deploy/examples/kube-scheduler-config.yaml says (plus a default-scheduler
//! profile: the shared scheduler). One scenario a test, each on its own
//! control plane.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tessera_e2e::SERIAL;
use tessera_e2e::cluster::{Cluster, decision, gpu_pod, node_of};
use tessera_e2e::plane::env_or_skip;
use tessera_e2e::tessera::{a100s, fake_gpus_yaml};

const A100_MIB: u64 = 81920;
const BIND: Duration = Duration::from_secs(30);

fn nodes(n: usize, gpus: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let name = format!("gpu-{i}");
            let yaml = fake_gpus_yaml(&a100s(&name, gpus));
            (name, yaml)
        })
        .collect()
}

/// The GPU UUIDs the node agent handed the container (its Allocate answer).
fn handed(c: &Cluster, pod: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for n in &c.nodes {
        for a in n.kubelet.admitted() {
            if a.pod == format!("default/{pod}") {
                let text = format!("{:?}", a.response);
                for part in text.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '-')) {
                    if (part.starts_with("GPU-") || part.starts_with("MIG-")) && part.len() > 20 {
                        out.insert(part.to_string());
                    }
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn fractional_pods_share_one_gpu() {
    let Some(env) = env_or_skip("extender::fractional_pods_share_one_gpu") else {
        return;
    };
    let _one = SERIAL.lock().await;
    let c = Cluster::extender(&env, &nodes(2, 2)).await.unwrap();
    let limits = json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "40", "tessera.io/gpu-cores": "40"});
    for name in ["frac-a", "frac-b"] {
        c.create(gpu_pod(name, "tessera", limits.clone(), None))
            .await
            .unwrap();
    }
    let (na, ta) = c.wait_running("frac-a", BIND).await.unwrap();
    let (nb, tb) = c.wait_running("frac-b", BIND).await.unwrap();
    let da = decision(&c.pods().get("frac-a").await.unwrap()).expect("frac-a has a decision");
    let db = decision(&c.pods().get("frac-b").await.unwrap()).expect("frac-b has a decision");
    println!(
        "frac-a on {na} ({:.1} s) {:?}; frac-b on {nb} ({:.1} s) {:?}",
        ta.as_secs_f64(),
        da.gpus
            .iter()
            .map(|g| (&g.uuid, g.memory_mib, g.cores_milli))
            .collect::<Vec<_>>(),
        tb.as_secs_f64(),
        db.gpus
            .iter()
            .map(|g| (&g.uuid, g.memory_mib, g.cores_milli))
            .collect::<Vec<_>>(),
    );
    assert_eq!(na, nb, "two 40 % pods are packed on one node");
    assert_eq!(da.gpus.len(), 1);
    assert_eq!(da.gpus[0].uuid, db.gpus[0].uuid, "and on one GPU");
    assert_eq!(da.gpus[0].cores_milli, 400);
    // The agent handed each exactly the GPU of its decision.
    assert_eq!(
        handed(&c, "frac-a"),
        BTreeSet::from([da.gpus[0].uuid.clone()])
    );
    assert_eq!(
        handed(&c, "frac-b"),
        BTreeSet::from([db.gpus[0].uuid.clone()])
    );
    // A third 40 % pod would over-commit that GPU: it goes to another.
    c.create(gpu_pod("frac-c", "tessera", limits.clone(), None))
        .await
        .unwrap();
    c.wait_running("frac-c", BIND).await.unwrap();
    let dc = decision(&c.pods().get("frac-c").await.unwrap()).unwrap();
    assert_ne!(dc.gpus[0].uuid, da.gpus[0].uuid);
    let all = c.audit(A100_MIB).await.unwrap();
    assert_eq!(all.len(), 3);
}

#[tokio::test]
async fn whole_gpus_are_exclusive_and_too_big_waits() {
    let Some(env) = env_or_skip("extender::whole_gpus_are_exclusive_and_too_big_waits") else {
        return;
    };
    let _one = SERIAL.lock().await;
    let c = Cluster::extender(&env, &nodes(2, 4)).await.unwrap();
    for i in 0..4 {
        let name = format!("whole-{i}");
        c.create(gpu_pod(
            &name,
            "tessera",
            json!({"nvidia.com/gpu": "2"}),
            None,
        ))
        .await
        .unwrap();
    }
    let mut seen = BTreeSet::new();
    for i in 0..4 {
        let name = format!("whole-{i}");
        let (node, t) = c.wait_running(&name, BIND).await.unwrap();
        let d = decision(&c.pods().get(&name).await.unwrap()).unwrap();
        let gpus: BTreeSet<String> = d.gpus.iter().map(|g| g.uuid.clone()).collect();
        println!("{name} on {node} after {:.1} s: {gpus:?}", t.as_secs_f64());
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            handed(&c, &name),
            gpus,
            "{name}: the agent hands the decision's GPUs"
        );
        for g in gpus {
            assert!(seen.insert(g.clone()), "GPU {g} granted twice");
        }
    }
    c.audit(A100_MIB).await.unwrap();
    // Every GPU is taken: a fifth pod stays Pending with Tessera's reason.
    c.create(gpu_pod(
        "whole-late",
        "tessera",
        json!({"nvidia.com/gpu": "1"}),
        None,
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = c.pods().get("whole-late").await.unwrap();
    assert_eq!(
        node_of(&p),
        None,
        "no GPU is left, yet whole-late was bound"
    );
    let ev = c.events("whole-late");
    println!("whole-late events:\n{ev}");
    assert!(ev.contains("FailedScheduling"), "{ev}");
}

#[tokio::test]
async fn mig_instance_is_granted_and_handed() {
    let Some(env) = env_or_skip("extender::mig_instance_is_granted_and_handed") else {
        return;
    };
    let _one = SERIAL.lock().await;
    let gpus = "  - uuid: GPU-7a000000-0000-4000-8000-000000000000\n    product: NVIDIA A100-SXM4-80GB\n    numaNode: 0\n    computeCapability: \"8.0\"\n    mig:\n      enabled: true\n      instances:\n        - { uuid: MIG-7a000000-0000-4000-8000-000000000001, profile: 3g.40gb, start: 0 }\n        - { uuid: MIG-7a000000-0000-4000-8000-000000000002, profile: 1g.10gb, start: 4 }\n";
    let c = Cluster::extender(&env, &[("mig-0".to_string(), fake_gpus_yaml(gpus))])
        .await
        .unwrap();
    c.create(gpu_pod(
        "mig-a",
        "tessera",
        json!({"tessera.io/mig-3g.40gb": "1"}),
        None,
    ))
    .await
    .unwrap();
    let (node, t) = c.wait_running("mig-a", BIND).await.unwrap();
    let d = decision(&c.pods().get("mig-a").await.unwrap()).unwrap();
    let mig = d.gpus[0].mig.clone().expect("a MIG grant");
    println!(
        "mig-a on {node} after {:.1} s: {} {}",
        t.as_secs_f64(),
        mig.profile,
        mig.uuid
    );
    assert_eq!(mig.profile, "3g.40gb");
    assert_eq!(mig.uuid, "MIG-7a000000-0000-4000-8000-000000000001");
    assert!(handed(&c, "mig-a").contains(&mig.uuid));
    // The only 3g.40gb is taken: a second waits.
    c.create(gpu_pod(
        "mig-b",
        "tessera",
        json!({"tessera.io/mig-3g.40gb": "1"}),
        None,
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(node_of(&c.pods().get("mig-b").await.unwrap()), None);
    c.audit(A100_MIB).await.unwrap();
}

/// A mixed cluster: one node with Tessera's agent (which serves
/// `nvidia.com/gpu` itself) and one with NVIDIA's stock plugin. Stock
/// `nvidia.com/gpu` pods of `default-scheduler`, through the same
/// kube-scheduler and extender, are bound to the stock node and run; once it
/// is full the next one waits with the reason, instead of being bound to
/// Tessera's node and refused at admission (seen on 1.36 before the fix).
#[tokio::test]
async fn default_scheduler_gpu_pod_is_still_bound() {
    let Some(env) = env_or_skip("extender::default_scheduler_gpu_pod_is_still_bound") else {
        return;
    };
    let _one = SERIAL.lock().await;
    let mut c = Cluster::extender(&env, &nodes(1, 2)).await.unwrap();
    c.add_stock_node("stock-0", 2).await.unwrap();
    for name in ["stock-a", "stock-b", "stock-c"] {
        c.create(gpu_pod(
            name,
            "default-scheduler",
            json!({"nvidia.com/gpu": "1"}),
            None,
        ))
        .await
        .unwrap();
    }
    c.create(gpu_pod("plain", "default-scheduler", json!({}), None))
        .await
        .unwrap();
    let mut on_stock = 0;
    for name in ["stock-a", "stock-b", "stock-c"] {
        let ran = c.wait_running(name, Duration::from_secs(10)).await;
        if let Ok((node, t)) = ran {
            assert_eq!(node, "stock-0", "{name} was bound to a node Tessera serves");
            println!(
                "{name} (default-scheduler, nvidia.com/gpu) Running on {node} {:.1} s after creation",
                t.as_secs_f64()
            );
            on_stock += 1;
        }
    }
    assert_eq!(on_stock, 2, "both stock GPUs used");
    let waiting = c
        .pods()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap_or("")
                .starts_with("stock-")
                && node_of(p).is_none()
        })
        .and_then(|p| p.metadata.name)
        .expect("the third stock pod waits");
    let deadline = std::time::Instant::now() + BIND;
    let events = loop {
        let e = c.events(&waiting);
        if e.contains("served by Tessera's node agent") || std::time::Instant::now() > deadline {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        events.contains("FailedScheduling") && events.contains("served by Tessera's node agent"),
        "{events}"
    );
    println!(
        "{waiting} waits: {}",
        events.lines().last().unwrap_or_default()
    );
    let failed: usize = c.nodes.iter().map(|n| n.kubelet.failed().len()).sum();
    assert_eq!(
        failed, 0,
        "a pod was refused at admission on Tessera's node"
    );
    let (_, t) = c.wait_running("plain", BIND).await.unwrap();
    println!("plain pod Running after {:.1} s", t.as_secs_f64());
}

#[tokio::test]
async fn extender_preempts_a_lower_priority_pod() {
    let Some(env) = env_or_skip("extender::extender_preempts_a_lower_priority_pod") else {
        return;
    };
    let _one = SERIAL.lock().await;
    let c = Cluster::extender(&env, &nodes(1, 2)).await.unwrap();
    let pcs: Api<PriorityClass> = Api::all(c.admin.clone());
    for (name, value) in [("e2e-low", 100), ("e2e-high", 1000)] {
        let pc: PriorityClass = serde_json::from_value(
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value}),
        )
        .unwrap();
        pcs.create(&PostParams::default(), &pc).await.unwrap();
    }
    c.create(gpu_pod(
        "low",
        "tessera",
        json!({"nvidia.com/gpu": "2"}),
        Some("e2e-low"),
    ))
    .await
    .unwrap();
    c.wait_running("low", BIND).await.unwrap();
    let low_uid = c.pods().get("low").await.unwrap().metadata.uid;
    c.create(gpu_pod(
        "high",
        "tessera",
        json!({"nvidia.com/gpu": "2"}),
        Some("e2e-high"),
    ))
    .await
    .unwrap();
    let waited = c.wait_running("high", BIND).await;
    if waited.is_err() {
        println!(
            "{}",
            c.plane
                .kubectl(&["get", "pods", "-o", "wide"], None)
                .unwrap_or_default()
        );
        for l in c
            .plane
            .log("kube-scheduler")
            .lines()
            .chain(c.plane.log("tessera-scheduler-0").lines())
            .chain(c.plane.log("kube-apiserver").lines())
        {
            if l.contains("low") || l.contains("high") || l.contains("reempt") {
                println!("{l}");
            }
        }
    }
    let (node, t) = waited.unwrap();
    println!(
        "high bound on {node} and Running {:.1} s after it was created (low preempted)",
        t.as_secs_f64()
    );
    let low = c.pods().get_opt("low").await.unwrap();
    assert!(
        low.is_none_or(|p| p.metadata.uid != low_uid),
        "the low-priority pod still exists"
    );
    c.audit(A100_MIB).await.unwrap();
}
