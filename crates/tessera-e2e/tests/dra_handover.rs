//! A node handed from the device plugin to DRA on a real control plane
//! (Kubernetes 1.36: consumable capacity; issue 41, defect 9 and "one
//! ledger"). One node of 4 fake A100-80GB served by `tessera node-agent` (its
//! device plugin and GpuNode), Tessera `--mode standalone --dra` placing both
//! kinds of pods:
//!
//! 1. two `tessera.io/gpu` pods run on it; the DRA driver is started beside
//!    the device-plugin agent (the same GPUs, the same kubelet): it retires
//!    the node's GpuNode at its start, publishes no ResourceSlice while the
//!    pods run and says why in a Node event;
//! 2. the device-plugin agent restarts during the drain (a crash loop, a
//!    DaemonSet not yet updated): no slice serves the node yet, so it writes
//!    its GpuNode again, and the driver, which watches it, deletes it again;
//!    once the pods are deleted the driver publishes. (Before, the driver
//!    retired only at its start, so the GpuNode stayed and the node was in
//!    both worlds: its GPUs offered through the GpuNode and through the
//!    slices.)
//! 3. device-plugin pods and claim pods are submitted at once, whole GPUs and
//!    halves in a seeded mix, about twice what the node holds, in 5 rounds:
//!    the claim pods get GPUs, the device-plugin pods none (the node has no
//!    GpuNode), and per GPU (by UUID) what the grants on the stored pods and
//!    the allocations on the stored claims hold together is within its
//!    memory and compute. (Stop 50 ran these rounds in both worlds, where,
//!    before the fix of commit "DRA decisions tell the ledger at once", a
//!    claim and a `tessera.io` share decided in one pass were both given
//!    GPU 0: 122880 MiB, 1500 per mille.)
//! 4. the agent restarted once more, now that slices serve the node: it
//!    writes no GpuNode and says why in a Node event (`GpusServedThroughDRA`).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use tessera_e2e::SERIAL;
use tessera_e2e::claims::{delete_pods_and_claims, delete_pods_now};
use tessera_e2e::cluster::{decision, gpu_pod, node_of, phase};
use tessera_e2e::dra::{dra_plane, env_at_least, start_dra_beside};
use tessera_e2e::fill::{GPU_MIB, TracePod, claim, claims_resource, next, pod};
use tessera_e2e::plane::{ControlPlane, Identity};
use tessera_e2e::tessera::{
    a100s, fake_gpus_yaml, has_gpunode, spawn_gpu_agent, start_gpu_node, start_scheduler,
};

const NODE: &str = "hand-0";
const GPUS: usize = 4;
/// Asks in the mixed round: whole GPUs and halves, of both kinds.
const ASKS: usize = 12;

/// A device-plugin pod: a whole GPU, or half of one (memory and compute).
fn plugin_pod(name: &str, whole: bool) -> Pod {
    let limits = if whole {
        json!({"tessera.io/gpu": "1"})
    } else {
        json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "50", "tessera.io/gpu-cores": "50"})
    };
    serde_json::from_value(gpu_pod(name, "tessera", limits, None)).unwrap()
}

fn trace_pod(name: &str, whole: bool) -> TracePod {
    TracePod {
        name: name.to_string(),
        cpu_milli: 100,
        memory_mib: 128,
        gpus: u64::from(whole),
        share_milli: if whole { 0 } else { 500 },
    }
}

/// Device name -> GPU UUID, from the node's stored slices.
async fn uuids(admin: &kube::Client) -> BTreeMap<String, String> {
    let slices: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice"),
            "resourceslices",
        ),
    );
    let mut out = BTreeMap::new();
    for s in slices.list(&ListParams::default()).await.unwrap().items {
        let devices = s
            .data
            .pointer("/spec/devices")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for d in devices {
            if let (Some(name), Some(uuid)) = (
                d["name"].as_str(),
                d.pointer("/attributes/uuid/string").and_then(Value::as_str),
            ) {
                out.insert(name.to_string(), uuid.to_string());
            }
        }
    }
    out
}

/// What one GPU holds across both worlds.
#[derive(Debug, Default)]
struct Held {
    memory_mib: u64,
    compute_milli: u64,
    holders: Vec<String>,
}

/// Per GPU UUID: the grants on live pods and the allocations on stored claims.
async fn audit(admin: &kube::Client) -> (BTreeMap<String, Held>, usize, usize) {
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    let mut grants = 0;
    let pods: Api<Pod> = Api::all(admin.clone());
    for p in pods.list(&ListParams::default()).await.unwrap().items {
        if matches!(phase(&p).as_str(), "Succeeded" | "Failed") {
            continue;
        }
        let Some(d) = decision(&p) else { continue };
        let name = p.metadata.name.clone().unwrap_or_default();
        for g in &d.gpus {
            assert!(g.mig.is_none(), "no MIG here");
            let h = held.entry(g.uuid.clone()).or_default();
            h.memory_mib += g.memory_mib;
            h.compute_milli += u64::from(g.cores_milli);
            h.holders.push(format!("pod {name}"));
            grants += 1;
        }
    }
    let by_device = uuids(admin).await;
    let mut results = 0;
    let claims: Api<DynamicObject> = Api::all_with(admin.clone(), &claims_resource());
    for c in claims.list(&ListParams::default()).await.unwrap().items {
        let name = c.metadata.name.clone().unwrap_or_default();
        let list = c
            .data
            .pointer("/status/allocation/devices/results")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for r in list {
            let device = r["device"].as_str().unwrap_or_default();
            let uuid = by_device
                .get(device)
                .unwrap_or_else(|| panic!("claim {name}: device {device} is in no slice"));
            let (mem, compute) = match r.get("consumedCapacity") {
                None => (GPU_MIB, 1000),
                Some(cc) => (
                    cc["memory"]
                        .as_str()
                        .and_then(tessera_node::dra::prepare::quantity_mib)
                        .unwrap_or_else(|| panic!("claim {name}: memory {cc}")),
                    cc["compute"]
                        .as_str()
                        .and_then(tessera_node::dra::prepare::quantity_count)
                        .unwrap_or_else(|| panic!("claim {name}: compute {cc}")),
                ),
            };
            let h = held.entry(uuid.clone()).or_default();
            h.memory_mib += mem;
            h.compute_milli += compute;
            h.holders.push(format!("claim {name}"));
            results += 1;
        }
    }
    (held, grants, results)
}

#[tokio::test]
async fn a_node_handed_to_dra_waits_for_the_drain_then_keeps_one_ledger() {
    let Some(env) = env_at_least(
        "dra_handover::a_node_handed_to_dra_waits_for_the_drain_then_keeps_one_ledger",
        36,
        "consumable capacity",
    ) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let (mut plane, key): (ControlPlane, _) = dra_plane(&env, None).await.unwrap();
    let _s = start_scheduler(
        &mut plane,
        "standalone",
        &key,
        &["--leader-elect=false", "--dra"],
    )
    .await
    .unwrap();
    let yaml = fake_gpus_yaml(&a100s(NODE, GPUS));
    let gpu = start_gpu_node(&mut plane, NODE, &yaml, &key, &[])
        .await
        .unwrap();
    let admin = plane.client(Identity::Admin).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");

    // 1. Device-plugin pods run; the driver beside them publishes nothing.
    for i in 0..2 {
        pods.create(
            &PostParams::default(),
            &plugin_pod(&format!("before-{i}"), true),
        )
        .await
        .unwrap();
    }
    let t = Instant::now();
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        if list.len() == 2 && list.iter().all(|p| phase(p) == "Running") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "device-plugin pods not running: {:?}",
            list.iter()
                .map(|p| (node_of(p), phase(p)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dra = start_dra_beside(&mut plane, gpu, &yaml, "consumable-capacity")
        .await
        .unwrap();
    let t = Instant::now();
    let mut event = String::new();
    while t.elapsed() < Duration::from_secs(8) {
        assert!(
            dra.slices(&plane).unwrap().is_empty(),
            "a ResourceSlice was published while device-plugin pods run"
        );
        if event.is_empty() {
            event = node_event(&plane, "DevicePluginPodsRunning");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("while device-plugin pods ran: no slice for 8 s; the Node's event: {event}");
    assert!(
        event.contains("default/before-0") && event.contains("default/before-1"),
        "a Node event names the pods that hold the GPUs: {event:?}"
    );
    assert!(
        !has_gpunode(&plane, NODE),
        "the DRA driver retires the node's GpuNode at its start"
    );

    // 2. The agent restarts during the drain: no slice yet, so it writes its
    // GpuNode again, and the driver deletes it again.
    let retired = |plane: &ControlPlane| {
        plane
            .log(&dra.proc_name())
            .matches("GpuNode deleted")
            .count()
    };
    let before = retired(&plane);
    plane.kill(&format!("node-agent-{NODE}"));
    spawn_gpu_agent(&mut plane, NODE, &dra.kubelet, &key, &[]).unwrap();
    let t = Instant::now();
    while retired(&plane) == before {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the GpuNode an agent wrote during the drain was not deleted by the driver; GpuNode there: {}",
            has_gpunode(&plane, NODE)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "an agent restarted during the drain wrote its GpuNode; the driver deleted it {:.1} s after the restart",
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !has_gpunode(&plane, NODE),
        "the node keeps no GpuNode beside the driver"
    );
    let drained = Instant::now();
    delete_pods_now(&pods, Duration::from_secs(60)).await;
    dra.wait_slices(&plane, drained, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!has_gpunode(&plane, NODE), "a GpuNode beside the slices");
    println!(
        "drained: slices published {:.1} s after the delete; no GpuNode",
        drained.elapsed().as_secs_f64()
    );
    // Its GPUs known to the scheduler before the round (its mirror's watch).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 3. Both kinds at once, twice what the node holds, in seeded rounds.
    let (mut total_bound, mut total_plugin, mut total_results, mut total_grants) = (0, 0, 0, 0);
    for &seed in SEEDS {
        let r = round(&admin, seed).await;
        for (uuid, h) in &r.held {
            println!(
                "  {uuid}: {} MiB, {} per mille: {}",
                h.memory_mib,
                h.compute_milli,
                h.holders.join(", ")
            );
        }
        let over: Vec<(&String, &Held)> = r
            .held
            .iter()
            .filter(|(_, h)| h.memory_mib > GPU_MIB || h.compute_milli > 1000)
            .collect();
        println!(
            "seed {seed}: {} of {ASKS} bound ({} device-plugin pods with {} grants, {} claim pods with {} allocated results) on {GPUS} GPUs, {} GPUs held beyond what they allow",
            r.bound,
            r.bound_plugin,
            r.grants,
            r.bound - r.bound_plugin,
            r.results,
            over.len()
        );
        assert!(
            over.is_empty(),
            "seed {seed}: GPUs held twice across worlds: {over:?}"
        );
        assert!(
            r.bound_plugin == 0 && r.bound > 0,
            "seed {seed}: only claim pods are placed on a DRA node: {} of {} bound are device-plugin pods",
            r.bound_plugin,
            r.bound
        );
        total_bound += r.bound;
        total_plugin += r.bound_plugin;
        total_results += r.results;
        total_grants += r.grants;
        delete_pods_and_claims(&admin).await;
    }
    let failed = dra.kubelet.failed();
    assert!(failed.is_empty(), "refused at admission: {failed:?}");
    println!(
        "handover, seeds {SEEDS:?}: {total_bound} pods bound ({total_plugin} device-plugin pods with {total_grants} grants, {} claim pods with {total_results} allocated results), 0 GPUs held beyond what they allow, 0 refused at admission",
        total_bound - total_plugin
    );

    // 4. A restart after the handover: slices serve the node, so the agent
    // writes no GpuNode and says why.
    plane.kill(&format!("node-agent-{NODE}"));
    let before = retired(&plane);
    spawn_gpu_agent(&mut plane, NODE, &dra.kubelet, &key, &[]).unwrap();
    let t = Instant::now();
    let mut event = String::new();
    while t.elapsed() < Duration::from_secs(12) {
        assert!(
            !has_gpunode(&plane, NODE),
            "an agent restarted after the handover published the GpuNode again"
        );
        if event.is_empty() {
            event = node_event(&plane, "GpusServedThroughDRA");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "an agent restarted after the handover: no GpuNode for 12 s; the Node's event: {event}"
    );
    assert_eq!(
        retired(&plane),
        before,
        "the agent wrote a GpuNode the driver had to delete"
    );
    assert!(
        event.contains("the DRA driver serves its GPUs") && event.contains("ResourceSlices"),
        "a Node event says why the agent does not serve the node: {event:?}"
    );
    drop(plane);
}

/// The message of the first event on the node with `reason` ("" if none yet).
fn node_event(plane: &ControlPlane, reason: &str) -> String {
    plane
        .kubectl(
            &[
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                &format!("involvedObject.name={NODE},reason={reason}"),
                "-o",
                "jsonpath={.items[0].message}",
            ],
            None,
        )
        .unwrap_or_default()
}

/// Seeds of the mixed rounds.
const SEEDS: &[u64] = &[1, 2, 3, 4, 5];

/// `ASKS` asks of `seed`: a device-plugin pod or a claim pod, a whole GPU or
/// half of one, every kind equally likely.
fn asks(seed: u64) -> Vec<(String, bool, bool)> {
    let mut s = seed;
    (0..ASKS)
        .map(|k| {
            let r = next(&mut s);
            (
                format!("s{seed}-{k:02}"),
                r.is_multiple_of(2),
                (r >> 1).is_multiple_of(2),
            )
        })
        .collect()
}

struct Round {
    bound: usize,
    bound_plugin: usize,
    grants: usize,
    results: usize,
    held: BTreeMap<String, Held>,
}

/// One round: every claim, then every pod, created at once; settled when all
/// are bound or none was for 10 s; audited.
async fn round(admin: &kube::Client, seed: u64) -> Round {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let claims: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "default", &claims_resource());
    let asks = asks(seed);
    join_all(
        asks.iter()
            .filter(|(_, plugin, _)| !plugin)
            .map(|(name, _, whole)| {
                let c: DynamicObject =
                    serde_json::from_value(claim(name, &trace_pod(name, *whole))).unwrap();
                let claims = claims.clone();
                async move { claims.create(&PostParams::default(), &c).await.unwrap() }
            }),
    )
    .await;
    join_all(asks.iter().map(|(name, plugin, whole)| {
        let body: Pod = if *plugin {
            plugin_pod(name, *whole)
        } else {
            serde_json::from_value(pod(name, "tessera", &trace_pod(name, *whole))).unwrap()
        };
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &body).await.unwrap() }
    }))
    .await;
    let (mut last, mut since, t0) = (0, Instant::now(), Instant::now());
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let bound = list.iter().filter(|p| node_of(p).is_some()).count();
        if bound != last {
            (last, since) = (bound, Instant::now());
        }
        if bound == ASKS
            || since.elapsed() > Duration::from_secs(10)
            || t0.elapsed() > Duration::from_secs(120)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    let bound = list.iter().filter(|p| node_of(p).is_some()).count();
    let bound_plugin = list
        .iter()
        .filter(|p| node_of(p).is_some() && decision(p).is_some())
        .count();
    let (held, grants, results) = audit(admin).await;
    Round {
        bound,
        bound_plugin,
        grants,
        results,
        held,
    }
}
