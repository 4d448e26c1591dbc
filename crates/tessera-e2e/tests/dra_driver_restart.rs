//! The DRA driver killed while claims are prepared (issue 38, "unprepare,
//! deletion and restart recovery"; Kubernetes 1.34+): `tessera node-agent
//! --dra` is `kill -9`ed with a whole GPU and a share prepared, a pod arrives
//! while it is down (Tessera allocates it from the slices already
//! published), and the driver is started again with the same directories, as
//! the DaemonSet's restart does. The plugin watcher registers it again; the
//! kubelet's repeated prepares answer the same devices and CDI names; the
//! claim that arrived while it was down prepares; what it prepared before the
//! kill still counts (a claim written by hand onto the prepared whole GPU, as
//! a second allocator would, is refused) until that claim
//! is unprepared, which removes its CDI spec and frees the GPU.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_e2e::SERIAL;
use tessera_e2e::claims::{claim_pod, claims, devices, pod, until};
use tessera_e2e::dra::{dra_plane, env_at_least, start_dra_node};
use tessera_e2e::plane::ControlPlane;
use tessera_e2e::tessera::{a100s, fake_gpus_yaml, start_scheduler};

fn claim(name: &str, exactly: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}}})
}

fn whole() -> Value {
    json!({"deviceClassName": "gpu.tessera.io"})
}

fn share(memory: &str, compute: &str) -> Value {
    json!({"deviceClassName": "gpu.tessera.io",
        "capacity": {"requests": {"memory": memory, "compute": compute}}})
}

fn bound(plane: &ControlPlane, p: &str) -> bool {
    pod(plane, p).is_some_and(|v| v.pointer("/spec/nodeName").is_some_and(Value::is_string))
}

/// `(namespace, uid, name)` of stored claim `name`, as the kubelet sends it.
fn claim_ref(plane: &ControlPlane, name: &str) -> (String, String, String) {
    let all = claims(plane);
    let c = all
        .iter()
        .find(|c| c["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("claim {name} stored"));
    (
        "default".into(),
        c["metadata"]["uid"].as_str().unwrap().into(),
        name.into(),
    )
}

fn cdi_ids(
    r: &tessera_node::dra::proto::v1::NodePrepareResourcesResponse,
    uid: &str,
) -> Vec<String> {
    let answer = &r.claims[uid];
    assert!(answer.error.is_empty(), "prepare of {uid}: {answer:?}");
    answer
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

#[tokio::test]
async fn dra_driver_killed_while_claims_are_prepared_recovers() {
    let Some(env) = env_at_least(
        "dra_driver_restart::dra_driver_killed_while_claims_are_prepared_recovers",
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
    let yaml = fake_gpus_yaml(&a100s("dra-0", 2));
    let mut node = start_dra_node(&mut plane, "dra-0", &yaml, "consumable-capacity")
        .await
        .unwrap();
    plane.apply(&claim("whole", whole())).unwrap();
    plane.apply(&claim("share", share("40Gi", "500"))).unwrap();
    for (p, c) in [("a", "whole"), ("b", "share")] {
        plane
            .create(&claim_pod(p, json!({"resourceClaimName": c})))
            .unwrap();
    }
    until("a and b bound", Duration::from_secs(60), || {
        bound(&plane, "a") && bound(&plane, "b")
    })
    .await;
    let (whole_ref, share_ref) = (claim_ref(&plane, "whole"), claim_ref(&plane, "share"));
    let first = node
        .prepare(&[whole_ref.clone(), share_ref.clone()])
        .await
        .unwrap();
    let (whole_ids, share_ids) = (cdi_ids(&first, &whole_ref.1), cdi_ids(&first, &share_ref.1));
    let specs_before: Vec<String> = node.cdi_specs().into_iter().map(|s| s.0).collect();
    assert_eq!(
        specs_before.len(),
        2,
        "one CDI spec per claim: {specs_before:?}"
    );

    // Killed with both prepared; a pod arrives while the driver is down.
    assert!(node.kill_driver(&mut plane), "the driver was running");
    plane.apply(&claim("late", share("20Gi", "250"))).unwrap();
    plane
        .create(&claim_pod("c", json!({"resourceClaimName": "late"})))
        .unwrap();
    let t = Instant::now();
    until(
        "c bound while the driver is down",
        Duration::from_secs(60),
        || bound(&plane, "c"),
    )
    .await;
    println!(
        "pod c bound {:.1} s after creation, its node's DRA driver down",
        t.elapsed().as_secs_f64()
    );

    let took = node.restart_driver(&mut plane).await.unwrap();
    println!(
        "driver restarted and registered again in {:.1} s",
        took.as_secs_f64()
    );
    // The kubelet repeats the prepares of running pods' claims: the same answers.
    let again = node
        .prepare(&[whole_ref.clone(), share_ref.clone()])
        .await
        .unwrap();
    assert_eq!(cdi_ids(&again, &whole_ref.1), whole_ids);
    assert_eq!(cdi_ids(&again, &share_ref.1), share_ids);
    let specs_after: Vec<String> = node.cdi_specs().into_iter().map(|s| s.0).collect();
    assert_eq!(specs_after, specs_before, "the same CDI specs, none lost");
    // The claim allocated while the driver was down prepares.
    let late_ref = claim_ref(&plane, "late");
    let late = node.prepare(std::slice::from_ref(&late_ref)).await.unwrap();
    let late_ids = cdi_ids(&late, &late_ref.1);
    println!(
        "prepared after the restart: whole {whole_ids:?}, share {share_ids:?}, late {late_ids:?}"
    );

    // What was prepared before the kill still holds its GPU: a claim written
    // by hand onto the whole GPU (a second allocator) is refused.
    let all = claims(&plane);
    let stored = all
        .iter()
        .find(|c| c["metadata"]["name"] == "whole")
        .unwrap();
    let allocation = stored["status"]["allocation"].clone();
    plane.apply(&claim("intruder", whole())).unwrap();
    plane
        .kubectl(
            &[
                "patch",
                "resourceclaim",
                "intruder",
                "-n",
                "default",
                "--subresource=status",
                "--type=merge",
                "-p",
                &json!({"status": {"allocation": allocation}}).to_string(),
            ],
            None,
        )
        .unwrap();
    assert_eq!(
        devices(
            all.iter()
                .find(|c| c["metadata"]["name"] == "whole")
                .unwrap()
        ),
        devices(
            claims(&plane)
                .iter()
                .find(|c| c["metadata"]["name"] == "intruder")
                .unwrap()
        ),
        "the intruder holds the whole claim's device in the stored claims"
    );
    let intruder_ref = claim_ref(&plane, "intruder");
    let refused = node
        .prepare(std::slice::from_ref(&intruder_ref))
        .await
        .unwrap();
    let why = &refused.claims[&intruder_ref.1].error;
    println!("intruder refused: {why}");
    // On a shareable GPU a request without capacity consumes its defaults
    // (all of it): refused as a share beyond the GPU, or as a second holder.
    assert!(
        why.contains("already prepared for claim default/whole")
            || why.contains("more than the GPU has"),
        "refused for the prepared holder: {refused:?}"
    );

    // Unprepared after the restart: its spec goes, and the GPU is free again.
    let out = node
        .unprepare(std::slice::from_ref(&whole_ref))
        .await
        .unwrap();
    assert!(out.claims[&whole_ref.1].error.is_empty(), "{out:?}");
    let specs: Vec<String> = node.cdi_specs().into_iter().map(|s| s.0).collect();
    assert!(
        !specs.iter().any(|s| s.contains(&whole_ref.1)),
        "the whole claim's CDI spec removed: {specs:?}"
    );
    assert!(
        specs.iter().any(|s| s.contains(&share_ref.1)),
        "the share's spec kept: {specs:?}"
    );
    let now = node
        .prepare(std::slice::from_ref(&intruder_ref))
        .await
        .unwrap();
    cdi_ids(&now, &intruder_ref.1);
    println!(
        "dra_driver_restart: kill -9 with 2 claims prepared, 1 allocated while down; after the restart the repeated prepares answer the same CDI devices, the late claim prepares, a second holder of the prepared GPU is refused until its claim is unprepared"
    );
}
