//! The DRA path on a real control plane (Kubernetes 1.34+, resource.k8s.io/v1;
//! on 1.28 this test says it does not apply): the agent's ResourceSlices
//! accepted by the API server, claims made from ResourceClaimTemplates by the
//! real resourceclaim controller (kube-controller-manager), Tessera
//! `--mode standalone --dra` allocating them (every allocation and
//! `reservedFor` accepted by the server, each claim delete-protected first),
//! the agent's `NodePrepareResources` writing the CDI spec of exactly the
//! allocated device, and the real controller releasing what deleted pods
//! held: a template claim is deleted with its pod, and a user's claim is
//! deallocated (which it does only for a claim carrying
//! `resource.kubernetes.io/delete-protection`, issue 41 defect 3), so the
//! waiting pods get the GPUs. No device is in two allocated claims (audited
//! from the stored claims).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_e2e::SERIAL;
use tessera_e2e::claims::{claim_of, claim_pod, claims, devices, force_delete, pod, until};
use tessera_e2e::dra::{dra_plane, env_at_least, start_dra_node};
use tessera_e2e::plane::ControlPlane;
use tessera_e2e::tessera::{a100s, fake_gpus_yaml, start_scheduler};

const DELETE_PROTECTION: &str = "resource.kubernetes.io/delete-protection";

/// No device in two allocated claims (whole GPUs here).
fn audit(all: &[Value]) {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for c in all {
        for d in devices(c) {
            let name = c["metadata"]["name"].as_str().unwrap_or("").to_string();
            if let Some(other) = seen.insert(d.clone(), name.clone()) {
                panic!("device {d} allocated to {other} and {name}");
            }
        }
    }
}

#[tokio::test]
async fn claims_from_templates_are_allocated_prepared_and_released() {
    let Some(env) = env_at_least(
        "dra::claims_from_templates_are_allocated_prepared_and_released",
        34,
        "resource.k8s.io/v1",
    ) else {
        return;
    };
    let _one = SERIAL.lock().await;
    let (mut plane, key) = dra_plane(&env, None).await.unwrap();
    let _scheduler = start_scheduler(
        &mut plane,
        "standalone",
        &key,
        &["--leader-elect=false", "--dra"],
    )
    .await
    .unwrap();
    let node = start_dra_node(&mut plane, "dra-0", &fake_gpus_yaml(&a100s("dra-0", 2)), "")
        .await
        .unwrap();

    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}}}});
    let mine = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "mine", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}}});
    for o in [&template, &mine] {
        plane.apply(o).unwrap();
    }
    let t0 = Instant::now();
    for p in ["p1", "p2", "p3"] {
        let body = claim_pod(p, json!({"resourceClaimTemplateName": "one-gpu"}));
        plane.create(&body).unwrap();
    }
    let bound = |plane: &ControlPlane, p: &str| {
        pod(plane, p).is_some_and(|v| v.pointer("/spec/nodeName").is_some_and(|n| n.is_string()))
    };
    let took = until(
        "two of three template pods bound",
        Duration::from_secs(90),
        || {
            ["p1", "p2", "p3"]
                .iter()
                .filter(|p| bound(&plane, p))
                .count()
                == 2
        },
    )
    .await;
    println!(
        "2 of 3 template pods bound {:.1} s after creation",
        (t0.elapsed()).as_secs_f64()
    );
    let _ = took;
    let all = claims(&plane);
    audit(&all);
    let (first, waiting): (Vec<&str>, Vec<&str>) =
        ["p1", "p2", "p3"].iter().partition(|p| bound(&plane, p));
    for p in &first {
        let v = pod(&plane, p).unwrap();
        let c = claim_of(&all, &v).unwrap_or_else(|| panic!("{p}: no claim: {v}"));
        assert_eq!(devices(c).len(), 1, "{c}");
        assert!(devices(c)[0].starts_with("gpu.tessera.io/dra-0/"), "{c}");
        assert_eq!(
            c["status"]["reservedFor"][0]["uid"], v["metadata"]["uid"],
            "{c}"
        );
        assert_eq!(
            c["metadata"]["ownerReferences"][0]["name"], *p,
            "made by the resourceclaim controller: {c}"
        );
        assert!(
            c["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == DELETE_PROTECTION)),
            "delete-protected: {c}"
        );
    }
    // The kubelet prepares the first pod's claim: the CDI spec names its device.
    let p = pod(&plane, first[0]).unwrap();
    let c = claim_of(&all, &p).unwrap().clone();
    let claim_ref = (
        "default".to_string(),
        c["metadata"]["uid"].as_str().unwrap().to_string(),
        c["metadata"]["name"].as_str().unwrap().to_string(),
    );
    let prepared = node
        .prepare(std::slice::from_ref(&claim_ref))
        .await
        .unwrap();
    let answer = &prepared.claims[&claim_ref.1];
    assert!(answer.error.is_empty(), "{answer:?}");
    let device = devices(&c)[0].rsplit('/').next().unwrap().to_string();
    assert_eq!(answer.devices.len(), 1, "{answer:?}");
    assert_eq!(answer.devices[0].device_name, device, "{answer:?}");
    let specs = node.cdi_specs();
    println!(
        "prepared {}: {:?}; CDI specs {:?}",
        claim_ref.2,
        answer.devices[0].cdi_device_ids,
        specs.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    assert!(!specs.is_empty(), "a CDI spec is written");
    let unprepared = node
        .unprepare(std::slice::from_ref(&claim_ref))
        .await
        .unwrap();
    assert!(
        unprepared.claims[&claim_ref.1].error.is_empty(),
        "{unprepared:?}"
    );

    // Deleting a bound pod: the real controller deletes its template claim, the waiting one follows.
    let t = Instant::now();
    force_delete(&plane, first[0]);
    until(
        "the waiting template pod bound after a delete",
        Duration::from_secs(90),
        || bound(&plane, waiting[0]),
    )
    .await;
    println!(
        "{} bound {:.1} s after {} was deleted",
        waiting[0],
        t.elapsed().as_secs_f64(),
        first[0]
    );
    audit(&claims(&plane));

    // A user's claim: used by p4 once a GPU is free, then released by the real controller.
    let body = claim_pod("p4", json!({"resourceClaimName": "mine"}));
    plane.create(&body).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!bound(&plane, "p4"), "p4 waits: both GPUs are taken");
    force_delete(&plane, first[1]);
    until("p4 bound", Duration::from_secs(90), || bound(&plane, "p4")).await;
    let mine_now = || {
        claims(&plane)
            .into_iter()
            .find(|c| c["metadata"]["name"] == "mine")
            .unwrap()
    };
    assert_eq!(devices(&mine_now()).len(), 1);
    audit(&claims(&plane));
    let t = Instant::now();
    force_delete(&plane, "p4");
    until(
        "the user's claim deallocated by the resourceclaim controller",
        Duration::from_secs(60),
        || {
            let c = mine_now();
            devices(&c).is_empty()
                && !c["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|x| x == DELETE_PROTECTION))
        },
    )
    .await;
    println!(
        "the user's claim deallocated and its finalizer removed {:.1} s after its pod was deleted",
        t.elapsed().as_secs_f64()
    );
    // Consumable capacity and partitionable MIG on a real server: a node with one
    // GPU in MIG mode (placements consuming its counters) and one shareable GPU.
    let tag = "  - uuid: GPU-00000mig-0000-4000-8000-000000000000\n    product: NVIDIA A100-SXM4-80GB\n    computeCapability: \"8.0\"\n    mig: { enabled: true, instances: [] }\n  - uuid: GPU-0000share-0000-4000-8000-000000000001\n    product: NVIDIA A100-SXM4-80GB\n    computeCapability: \"8.0\"\n";
    let node1 = start_dra_node(
        &mut plane,
        "dra-1",
        &fake_gpus_yaml(tag),
        "consumable-capacity,partitionable-mig",
    )
    .await
    .unwrap();
    let slices = plane
        .kubectl(
            &[
                "get",
                "resourceslices",
                "--field-selector",
                "spec.nodeName=dra-1",
                "-o",
                "json",
            ],
            None,
        )
        .unwrap();
    let slices: Value = serde_json::from_str(&slices).unwrap();
    let devices_of: Vec<Value> = slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect();
    let counters: usize = slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["spec"]["sharedCounters"].as_array().map_or(0, Vec::len))
        .sum();
    let placements = devices_of
        .iter()
        .filter(|d| {
            d["consumesCounters"]
                .as_array()
                .is_some_and(|c| !c.is_empty())
        })
        .count();
    let shareable = devices_of
        .iter()
        .filter(|d| d["allowMultipleAllocations"] == true)
        .count();
    println!(
        "dra-1: {} devices accepted ({placements} MIG placements consuming {counters} counter set(s), {shareable} shareable GPU(s))",
        devices_of.len()
    );
    assert!(placements > 0 && counters > 0 && shareable == 1, "{slices}");
    let mig_claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "slice", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "mig.tessera.io",
            "selectors": [{"cel": {"expression": "device.attributes[\"gpu.tessera.io\"].profile == \"3g.40gb\""}}]}}]}}});
    let share_claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "share", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io",
            "capacity": {"requests": {"memory": "20Gi", "compute": "300"}}}}]}}});
    for o in [&mig_claim, &share_claim] {
        plane.apply(o).unwrap();
    }
    for (p, c) in [("p5", "slice"), ("p6", "share")] {
        let body = claim_pod(p, json!({"resourceClaimName": c}));
        plane.create(&body).unwrap();
    }
    let t = Instant::now();
    until(
        "the MIG and share pods bound",
        Duration::from_secs(60),
        || bound(&plane, "p5") && bound(&plane, "p6"),
    )
    .await;
    println!(
        "MIG placement and share pods bound {:.1} s after creation",
        t.elapsed().as_secs_f64()
    );
    let all = claims(&plane);
    for name in ["slice", "share"] {
        let c = all.iter().find(|c| c["metadata"]["name"] == name).unwrap();
        let r = &c["status"]["allocation"]["devices"]["results"][0];
        assert_eq!(r["pool"], "dra-1", "{c}");
        let claim_ref = (
            "default".to_string(),
            c["metadata"]["uid"].as_str().unwrap().to_string(),
            name.to_string(),
        );
        let prepared = node1
            .prepare(std::slice::from_ref(&claim_ref))
            .await
            .unwrap();
        let answer = &prepared.claims[&claim_ref.1];
        assert!(answer.error.is_empty(), "{name}: {answer:?}");
        println!(
            "{name}: allocated {} (consumed {}), prepared as {:?}",
            r["device"], r["consumedCapacity"], answer.devices[0].cdi_device_ids
        );
        if name == "slice" {
            assert!(
                r["device"].as_str().unwrap().contains("-mig-3g40gb-"),
                "{c}"
            );
            // The placement's instance was created at prepare: NVIDIA's CDI name is a MIG UUID.
            assert!(
                answer.devices[0]
                    .cdi_device_ids
                    .iter()
                    .any(|id| id.starts_with("nvidia.com/gpu=MIG-")),
                "{answer:?}"
            );
        } else {
            assert_eq!(r["consumedCapacity"]["compute"], "300", "{c}");
            assert!(r["shareID"].is_string(), "{c}");
        }
    }
    audit(&claims(&plane));
    let failed = node.kubelet.failed();
    assert!(failed.is_empty(), "{failed:?}");
    println!(
        "dra: slices accepted, template claims made by the resourceclaim controller, allocated by Tessera (delete-protected, reservedFor), prepared with a CDI spec, released on delete; no device in two claims"
    );
}
