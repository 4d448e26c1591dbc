//! The Tessera scheduler killed (`kill -9`) while pods are being created, then
//! started again on the same address: every pod bound once, no GPU
//! over-committed (audited from the stored decisions), in both modes.

use std::time::{Duration, Instant};

use serde_json::json;
use tessera_e2e::SERIAL;
use tessera_e2e::cluster::{Cluster, gpu_pod, node_of};
use tessera_e2e::plane::env_or_skip;
use tessera_e2e::tessera::{a100s, fake_gpus_yaml};

const A100_MIB: u64 = 81920;

/// Pod `i` of the sequence: shares of 10-25 % and, every fifth, a whole GPU
/// (24 pods: 4 whole GPUs and 2.5 GPUs of shares on the 8 GPUs, so every
/// pod fits in any order a packing policy takes them).
fn nth_pod(i: usize) -> serde_json::Value {
    let limits = if i % 5 == 4 {
        json!({"nvidia.com/gpu": "1"})
    } else {
        let pct = [10, 15][i % 2].to_string();
        json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": pct, "tessera.io/gpu-cores": pct})
    };
    gpu_pod(&format!("p-{i:02}"), "tessera", limits, None)
}

async fn killed_while_pods_arrive(mut c: Cluster) {
    let n = 24;
    // 8 pods, the kill at once (binds of some may be in flight), 8 more while
    // it is down, then the restart and the last 8.
    for i in 0..8 {
        c.create(nth_pod(i)).await.unwrap();
    }
    assert!(c.kill_scheduler(), "the scheduler was running");
    let down = Instant::now();
    for i in 8..16 {
        c.create(nth_pod(i)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restart = Instant::now();
    c.restart_scheduler().await.unwrap();
    for i in 16..n {
        c.create(nth_pod(i)).await.unwrap();
    }
    let mut first_after: Option<Duration> = None;
    loop {
        let pods = c.pods().list(&Default::default()).await.unwrap().items;
        let bound: Vec<_> = pods.iter().filter(|p| node_of(p).is_some()).collect();
        if first_after.is_none()
            && bound.iter().any(|p| {
                let name = p.metadata.name.clone().unwrap_or_default();
                let i: usize = name[2..].parse().unwrap_or(0);
                (8..16).contains(&i)
            })
        {
            first_after = Some(restart.elapsed());
        }
        if bound.len() == n {
            break;
        }
        if restart.elapsed() >= Duration::from_secs(90) {
            for p in pods.iter().filter(|p| node_of(p).is_none()) {
                let name = p.metadata.name.clone().unwrap_or_default();
                println!(
                    "{}\n{}",
                    c.events(&name),
                    c.explain(&name).unwrap_or_else(|e| e.to_string())
                );
            }
            for p in pods.iter().filter(|p| node_of(p).is_none()) {
                let name = p.metadata.name.clone().unwrap_or_default();
                println!(
                    "{name}: {}",
                    serde_json::to_string(&p.status).unwrap_or_default()
                );
                for l in c
                    .plane
                    .log("kube-scheduler")
                    .lines()
                    .filter(|l| l.contains(&format!("\"default/{name}\"")))
                {
                    println!("  {l}");
                }
            }
        }
        assert!(
            restart.elapsed() < Duration::from_secs(90),
            "{} of {n} pods bound 90 s after the restart",
            bound.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all = restart.elapsed();
    for i in 0..n {
        c.wait_running(&format!("p-{i:02}"), Duration::from_secs(30))
            .await
            .unwrap();
    }
    let decisions = c.audit(A100_MIB).await.unwrap();
    assert_eq!(decisions.len(), n, "one decision per pod");
    let failed: usize = c.nodes.iter().map(|nd| nd.kubelet.failed().len()).sum();
    assert_eq!(failed, 0, "a pod was refused at admission");
    println!(
        "{}: killed {:.1} s before the restart; first pod created while down bound {:.1} s after the restart; all {n} bound and Running {:.1} s after it; 0 over-committed GPUs, 0 refused at admission",
        c.mode,
        restart.duration_since(down).as_secs_f64(),
        first_after.unwrap_or_default().as_secs_f64(),
        all.as_secs_f64()
    );
}

fn nodes() -> Vec<(String, String)> {
    (0..2)
        .map(|i| {
            let name = format!("gpu-{i}");
            let yaml = fake_gpus_yaml(&a100s(&name, 4));
            (name, yaml)
        })
        .collect()
}

#[tokio::test]
async fn standalone_scheduler_killed_while_pods_arrive() {
    let Some(env) = env_or_skip("restart::standalone_scheduler_killed_while_pods_arrive") else {
        return;
    };
    let _one = SERIAL.lock().await;
    killed_while_pods_arrive(Cluster::standalone(&env, &nodes()).await.unwrap()).await;
}

#[tokio::test]
async fn extender_killed_while_pods_arrive() {
    let Some(env) = env_or_skip("restart::extender_killed_while_pods_arrive") else {
        return;
    };
    let _one = SERIAL.lock().await;
    killed_while_pods_arrive(Cluster::extender(&env, &nodes()).await.unwrap()).await;
}
