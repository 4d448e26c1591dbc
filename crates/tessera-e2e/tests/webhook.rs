//! The admission webhooks served to the real API server over TLS on loopback
//! (the chart's webhook configurations, `failurePolicy: Fail`): a forged,
//! changed or removed grant is refused, and so is a pod choosing its own
//! GPUs; a default-scheduler pod asking Tessera's resources gets Tessera's
//! schedulerName and is placed; with Tessera scaled to 0 a plain pod is still
//! created (the matchConditions send it nowhere) while a GPU pod is refused,
//! and after the restart it is admitted again.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use tessera_core::allocation::ANNOTATION;
use tessera_e2e::SERIAL;
use tessera_e2e::cluster::{Cluster, gpu_pod};
use tessera_e2e::plane::env_or_skip;
use tessera_e2e::tessera::{a100s, fake_gpus_yaml};

fn share(name: &str, scheduler: &str) -> serde_json::Value {
    gpu_pod(
        name,
        scheduler,
        json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory-percent": "25", "tessera.io/gpu-cores": "25"}),
        None,
    )
}

/// The API server's refusal of `what`, which must name `says`.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>, says: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: admitted ({v:?})"),
        Err(kube::Error::Api(s)) => {
            assert!(s.message.contains(says), "{what}: {}", s.message);
            println!("{what}: refused ({}): {}", s.code, s.message);
            s.message
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

#[tokio::test]
async fn webhooks_over_tls_guard_grants_and_let_plain_pods_through() {
    let Some(env) =
        env_or_skip("webhook::webhooks_over_tls_guard_grants_and_let_plain_pods_through")
    else {
        return;
    };
    let _one = SERIAL.lock().await;
    let nodes = vec![("gpu-w0".to_string(), fake_gpus_yaml(&a100s("gpu-w0", 2)))];
    let mut c = Cluster::standalone_with_webhooks(&env, &nodes)
        .await
        .unwrap();
    let pods = c.pods();

    // Placed by Tessera: the scheduler's own Binding carries the grant.
    c.create(share("placed", "tessera")).await.unwrap();
    c.wait_running("placed", Duration::from_secs(60))
        .await
        .unwrap();
    let placed = pods.get("placed").await.unwrap();
    let grant = placed
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .cloned();
    assert!(grant.is_some(), "the placed pod carries its grant");

    // Forged at creation, changed, removed: refused.
    let mut forged = share("forged", "tessera");
    forged["metadata"]["annotations"] = json!({ANNOTATION: grant.clone().unwrap()});
    refused(
        "a pod created with a copied grant",
        c.try_create(forged).await,
        "may not set",
    );
    let change = json!({"metadata": {"annotations": {ANNOTATION: "v1.forged.grant"}}});
    refused(
        "the grant changed",
        pods.patch("placed", &PatchParams::default(), &Patch::Merge(&change))
            .await,
        "may not change",
    );
    let remove = json!({"metadata": {"annotations": {ANNOTATION: null}}});
    refused(
        "the grant removed",
        pods.patch("placed", &PatchParams::default(), &Patch::Merge(&remove))
            .await,
        "may not remove",
    );
    // Other annotations of a granted pod may still change.
    let label = json!({"metadata": {"annotations": {"team": "ml"}}});
    pods.patch("placed", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("another annotation of a granted pod");

    // A pod choosing its own GPUs.
    let mut own = share("own-gpus", "tessera");
    own["spec"]["containers"][0]["env"] =
        json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]);
    refused(
        "a pod setting NVIDIA_VISIBLE_DEVICES",
        c.try_create(own).await,
        "may not choose its own GPUs",
    );

    // The mutating webhook: a default-scheduler pod asking tessera.io/gpu is Tessera's.
    let created = c
        .create(share("defaulted", "default-scheduler"))
        .await
        .unwrap();
    assert_eq!(
        created
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref()),
        Some("tessera"),
        "schedulerName set by the mutating webhook"
    );
    c.wait_running("defaulted", Duration::from_secs(60))
        .await
        .unwrap();

    // Scaled to 0.
    assert!(c.kill_scheduler());
    let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": "10m"}}}]}});
    c.create(plain)
        .await
        .expect("a plain pod while Tessera is down");
    let msg = refused(
        "a GPU pod while Tessera is down",
        c.try_create(share("while-down", "tessera")).await,
        "failed calling webhook",
    );
    assert!(
        msg.contains("validate.pods.tessera.io") || msg.contains("tessera"),
        "{msg}"
    );

    // Back: admitted again.
    c.restart_scheduler().await.unwrap();
    c.create(share("after", "tessera")).await.unwrap();
    c.wait_running("after", Duration::from_secs(60))
        .await
        .unwrap();
    println!(
        "webhooks over TLS: copied, changed and removed grants refused, own GPUs refused, schedulerName set; while scaled to 0 a plain pod admitted and a GPU pod refused; admitted again after the restart"
    );
}
