//! `NodePrepareResources` / `NodeUnprepareResources` with the real preparer:
//! the claim is read through a fake API (claim JSON in the shape of
//! protocols.md §3.5, `status.allocation.devices.results`), and the CDI spec
//! written for exactly the devices of driver `gpu.tessera.io` on this node.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::NodeView;
use tessera_node::dra::prepare::{
    ClaimError, ClaimSource, Preparer, ResourceClaim, quantity_count, quantity_mib,
};
use tessera_node::dra::service::{ClaimPreparer, ClaimRef};
use tessera_node::health::GpuHealth;
use tokio::sync::watch;

const NODE: &str = "node-a";
const UID: &str = "0f4c8c53-1b2a-4c1e-9d7a-2a1f0e3b4c5d";

/// Claims by `namespace/name`, as the API server would return them.
#[derive(Default)]
struct FakeClaims(Mutex<BTreeMap<String, Value>>);

#[tonic::async_trait]
impl ClaimSource for FakeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        let v = self
            .0
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .ok_or_else(|| ClaimError::NotFound {
                namespace: namespace.into(),
                name: name.into(),
            })?;
        serde_json::from_value(v).map_err(|e| ClaimError::Unreadable(e.to_string()))
    }
}

fn claim(uid: &str, results: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "ml", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "1234"}]
        }
    })
}

struct Setup {
    claims: Arc<FakeClaims>,
    preparer: Preparer,
    view: watch::Sender<NodeView>,
    dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let fake = Fake::from_yaml(
        r#"
gpus:
  - { uuid: GPU-0, product: NVIDIA A100-SXM4-80GB }
  - { uuid: GPU-1, product: NVIDIA A100-SXM4-80GB }
  - uuid: GPU-2
    product: NVIDIA A100-SXM4-80GB
    mig: { enabled: true, instances: [ { uuid: MIG-a, profile: 3g.40gb, start: 4 } ] }
"#,
        "t",
    )
    .unwrap();
    let (view, rx) = watch::channel(NodeView {
        settings: Default::default(),
        gpus: fake.discover().unwrap(),
        health: BTreeMap::new(),
    });
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(FakeClaims::default());
    let preparer = Preparer::new(claims.clone(), rx, NODE.into(), dir.path().join("cdi"));
    Setup {
        claims,
        preparer,
        view,
        dir,
    }
}

fn put(s: &Setup, c: Value) {
    s.claims.0.lock().unwrap().insert("ml/train".into(), c);
}

fn kubelet_claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        name: "train".into(),
        uid: uid.into(),
    }
}

fn spec_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("cdi"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn prepare_writes_a_cdi_spec_for_exactly_the_claimed_devices() {
    let s = setup();
    put(
        &s,
        claim(
            UID,
            json!([
                {"request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-1"},
                {"request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-2-mig-3g40gb-4"},
                // Another driver's device in the same claim is not ours to prepare.
                {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth1"}
            ]),
        ),
    );
    let answer = s.preparer.prepare(&kubelet_claim(UID)).await.unwrap();
    let ids: Vec<Vec<String>> = answer.iter().map(|d| d.cdi_device_ids.clone()).collect();
    assert_eq!(
        ids,
        [
            vec![
                format!("gpu.tessera.io/claim={UID}-gpu-1"),
                "nvidia.com/gpu=GPU-1".to_string()
            ],
            vec![
                format!("gpu.tessera.io/claim={UID}-gpu-2-mig-3g40gb-4"),
                "nvidia.com/gpu=MIG-a".to_string()
            ],
        ]
    );
    assert_eq!(answer[0].request_names, ["gpu"]);
    assert_eq!(answer[0].pool_name, NODE);
    assert_eq!(answer[1].device_name, "gpu-2-mig-3g40gb-4");
    let file = format!("gpu.tessera.io-claim_{UID}.json");
    assert_eq!(spec_files(s.dir.path()), std::slice::from_ref(&file));
    let spec: Value =
        serde_json::from_slice(&std::fs::read(s.dir.path().join("cdi").join(&file)).unwrap())
            .unwrap();
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "gpu.tessera.io/claim");
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [format!("{UID}-gpu-1"), format!("{UID}-gpu-2-mig-3g40gb-4")]
    );
    assert_eq!(
        spec["containerEdits"]["env"],
        json!([
            "NVIDIA_VISIBLE_DEVICES=void",
            "TESSERA_ISOLATION=exclusive",
            // The whole GPU's memory, then the 3g.40gb instance's.
            "TESSERA_GPU_MEMORY_MIB=81920,40192"
        ])
    );

    // Idempotent: the same answer and the same file again.
    let before = std::fs::read(s.dir.path().join("cdi").join(&file)).unwrap();
    assert_eq!(
        s.preparer.prepare(&kubelet_claim(UID)).await.unwrap(),
        answer
    );
    assert_eq!(
        std::fs::read(s.dir.path().join("cdi").join(&file)).unwrap(),
        before
    );
    // Unprepare removes it, and again is no error.
    s.preparer.unprepare(&kubelet_claim(UID)).await.unwrap();
    assert!(spec_files(s.dir.path()).is_empty());
    s.preparer.unprepare(&kubelet_claim(UID)).await.unwrap();
}

#[tokio::test]
async fn a_share_gets_its_limits_from_the_consumed_capacity() {
    let s = setup();
    put(
        &s,
        claim(
            UID,
            json!([{
                "request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-0",
                "shareID": "7d4c1e2f-0000-4000-8000-000000000001",
                "consumedCapacity": {"memory": "20Gi", "compute": "250"}
            }]),
        ),
    );
    let answer = s.preparer.prepare(&kubelet_claim(UID)).await.unwrap();
    assert_eq!(
        answer[0].share_id.as_deref(),
        Some("7d4c1e2f-0000-4000-8000-000000000001")
    );
    let spec: Value = serde_json::from_slice(
        &std::fs::read(
            s.dir
                .path()
                .join("cdi")
                .join(format!("gpu.tessera.io-claim_{UID}.json")),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["containerEdits"]["env"],
        json!([
            "NVIDIA_VISIBLE_DEVICES=void",
            "TESSERA_ISOLATION=mps",
            "TESSERA_GPU_MEMORY_MIB=20480"
        ])
    );
    // The client's limits and its daemon's pipe are the share device's own edits
    // (only a container handed the share gets them); an external daemon
    // (`--mps-daemons external`, the default) serves the node at <root>/pipe.
    assert_eq!(
        spec["devices"][0]["containerEdits"],
        json!({
            "env": [
                "TESSERA_DRA_DEVICE_0=GPU-0",
                "CUDA_MPS_PIPE_DIRECTORY=/tessera/mps/pipe",
                // 250 per-mille → 25 %; 20Gi = 20480 MiB on the client's device 0.
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"
            ],
            "mounts": [
                {"hostPath": "/run/tessera/mps/pipe", "containerPath": "/tessera/mps/pipe", "options": ["rbind", "rw"]},
                {"hostPath": "/run/tessera/mps/shm", "containerPath": "/dev/shm", "options": ["rbind", "rw"]}
            ]
        })
    );
}

#[tokio::test]
async fn claims_that_cannot_be_prepared_say_why_and_write_nothing() {
    let s = setup();
    let ours = |device: &str, pool: &str| json!([{"request": "gpu", "driver": "gpu.tessera.io", "pool": pool, "device": device}]);
    let cases: Vec<(Value, &str, &str)> = vec![
        (claim("other-uid", ours("gpu-0", NODE)), UID, "recreated"),
        (
            json!({"metadata": {"name": "train", "namespace": "ml", "uid": UID}}),
            UID,
            "is not allocated",
        ),
        (claim(UID, ours("gpu-0", "node-b")), UID, "not this node's"),
        (claim(UID, ours("gpu-9", NODE)), UID, "no device \"gpu-9\""),
        // GPU-2 is in MIG mode: it is not a whole-GPU device.
        (claim(UID, ours("gpu-2", NODE)), UID, "no device \"gpu-2\""),
        (
            claim(UID, ours("gpu-0", NODE)),
            "../../etc/x",
            "not a Kubernetes UID",
        ),
        (
            claim(
                UID,
                json!([{"request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-0",
                         "shareID": "s", "consumedCapacity": {"compute": "2000"}}]),
            ),
            UID,
            "per-mille",
        ),
    ];
    for (c, uid, why) in cases {
        put(&s, c);
        let err = s.preparer.prepare(&kubelet_claim(uid)).await.unwrap_err();
        assert!(err.contains(why), "{err:?} should say {why:?}");
        assert!(
            spec_files(s.dir.path()).is_empty(),
            "{why}: nothing written"
        );
    }
    // An unhealthy GPU is not prepared.
    s.view.send_modify(|v| {
        v.health.insert(
            "GPU-0".into(),
            GpuHealth::Unhealthy {
                reason: "XID 79".into(),
                xid: Some(79),
            },
        );
    });
    put(&s, claim(UID, ours("gpu-0", NODE)));
    let err = s.preparer.prepare(&kubelet_claim(UID)).await.unwrap_err();
    assert!(err.contains("unhealthy"), "{err}");
    assert!(spec_files(s.dir.path()).is_empty());
    // A claim the API does not have.
    s.claims.0.lock().unwrap().clear();
    let err = s.preparer.prepare(&kubelet_claim(UID)).await.unwrap_err();
    assert!(err.contains("not found"), "{err}");
}

/// A prepare that fails at its last step (the CDI spec cannot be written)
/// leaves the claim recorded as it was before: not at all, or as an earlier
/// prepare recorded it (the record the sweep of forgotten claims goes by).
#[tokio::test]
async fn a_failed_spec_write_leaves_the_claim_record_as_it_was() {
    let s = setup();
    put(
        &s,
        claim(
            UID,
            json!([{"request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-0"}]),
        ),
    );
    let cdi = s.dir.path().join("cdi");
    std::fs::write(&cdi, b"not a directory").unwrap();
    let err = s.preparer.prepare(&kubelet_claim(UID)).await.unwrap_err();
    assert!(err.contains("cannot write CDI spec"), "{err}");
    assert!(s.preparer.records().await.claims.is_empty());

    std::fs::remove_file(&cdi).unwrap();
    s.preparer.prepare(&kubelet_claim(UID)).await.unwrap();
    let recorded = s.preparer.records().await.claims;
    assert_eq!(
        (recorded[UID].name.as_str(), recorded[UID].devices.clone()),
        ("train", vec!["gpu-0".to_string()])
    );
    std::fs::remove_dir_all(&cdi).unwrap();
    std::fs::write(&cdi, b"not a directory").unwrap();
    s.preparer.prepare(&kubelet_claim(UID)).await.unwrap_err();
    assert_eq!(s.preparer.records().await.claims, recorded);
}

#[test]
fn quantities_in_mib() {
    assert_eq!(quantity_mib("20Gi"), Some(20480));
    assert_eq!(quantity_mib("512Mi"), Some(512));
    assert_eq!(quantity_mib("1073741824"), Some(1024));
    assert_eq!(quantity_mib("1G"), Some(954), "10^9 bytes, rounded up");
    // As the API server writes them (canonical forms).
    assert_eq!(quantity_mib("1.5Gi"), Some(1536));
    assert_eq!(quantity_mib("80Gi"), Some(81920));
    assert_eq!(quantity_mib("10Xi"), None);
    assert_eq!(quantity_mib("-1Gi"), None);
    assert_eq!(quantity_count("300"), Some(300));
    assert_eq!(
        quantity_count("1k"),
        Some(1000),
        "a whole GPU's 1000, stored as 1k"
    );
    assert_eq!(quantity_count("1500m"), Some(2));
    assert_eq!(quantity_count("lots"), None);
}

/// Real 1.36 (e2e dra_two_allocators): the API server stores a share's
/// `compute: 1000` as `1k`, as kube-scheduler's DRA plugin writes a whole GPU
/// on a shareable device; prepare read only plain integers and refused it.
#[tokio::test]
async fn a_share_whose_compute_the_server_wrote_as_1k_is_prepared() {
    let s = setup();
    put(&s, claim(UID, result("gpu-0", Some(("80Gi", "1k")))));
    let answer = s.preparer.prepare(&kubelet_claim(UID)).await.unwrap();
    assert_eq!(answer.len(), 1);
    assert!(answer[0].share_id.is_some());
}

/// A claim named `name` with UID `uid` and these results.
fn put_named(s: &Setup, name: &str, uid: &str, results: Value) {
    let mut c = claim(uid, results);
    c["metadata"]["name"] = json!(name);
    s.claims.0.lock().unwrap().insert(format!("ml/{name}"), c);
}

fn named(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn result(device: &str, share: Option<(&str, &str)>) -> Value {
    let mut r =
        json!({"request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": device});
    if let Some((memory, compute)) = share {
        r["shareID"] = json!(format!("share-{device}-{memory}-{compute}"));
        r["consumedCapacity"] = json!({"memory": memory, "compute": compute});
    }
    json!([r])
}

/// Issue 41, defect 2 (the last line): two allocators each blind to the
/// other's in-flight writes can both allocate one device, and the API server
/// accepts both claims. The driver refuses to prepare a device another
/// prepared claim holds beyond what it allows, naming the holder, and writes
/// nothing for the refused claim; once the holder is unprepared, it prepares.
#[tokio::test]
async fn a_device_held_by_another_prepared_claim_is_refused() {
    let s = setup();
    let uid = |n: u8| format!("00000000-0000-4000-8000-00000000000{n}");
    // A whole GPU: one claim.
    put_named(&s, "a", &uid(1), result("gpu-0", None));
    s.preparer.prepare(&named("a", &uid(1))).await.unwrap();
    put_named(&s, "b", &uid(2), result("gpu-0", None));
    let err = s.preparer.prepare(&named("b", &uid(2))).await.unwrap_err();
    assert!(err.contains("already prepared for claim ml/a"), "{err}");
    put_named(&s, "c", &uid(3), result("gpu-0", Some(("10Gi", "100"))));
    let err = s.preparer.prepare(&named("c", &uid(3))).await.unwrap_err();
    assert!(err.contains("already prepared for claim ml/a"), "{err}");
    // A MIG instance: one claim.
    put_named(&s, "d", &uid(4), result("gpu-2-mig-3g40gb-4", None));
    s.preparer.prepare(&named("d", &uid(4))).await.unwrap();
    put_named(&s, "e", &uid(5), result("gpu-2-mig-3g40gb-4", None));
    let err = s.preparer.prepare(&named("e", &uid(5))).await.unwrap_err();
    assert!(err.contains("already prepared for claim ml/d"), "{err}");
    // Shares of a GPU: within its 80 GiB and 1000 per-mille together.
    put_named(&s, "f", &uid(6), result("gpu-1", Some(("50Gi", "500"))));
    s.preparer.prepare(&named("f", &uid(6))).await.unwrap();
    put_named(&s, "g", &uid(7), result("gpu-1", Some(("40Gi", "400"))));
    let err = s.preparer.prepare(&named("g", &uid(7))).await.unwrap_err();
    assert!(err.contains("more than the GPU has"), "{err}");
    put_named(&s, "h", &uid(8), result("gpu-1", Some(("20Gi", "600"))));
    let err = s.preparer.prepare(&named("h", &uid(8))).await.unwrap_err();
    assert!(err.contains("1100 of 1000"), "{err}");
    put_named(&s, "i", &uid(9), result("gpu-1", Some(("20Gi", "400"))));
    s.preparer.prepare(&named("i", &uid(9))).await.unwrap();
    // A share's consumed capacity that does not read is no share of nothing.
    let mut bad = result("gpu-1", Some(("lots", "1")));
    bad[0]["shareID"] = json!("share-bad");
    put_named(&s, "j", "00000000-0000-4000-8000-000000000010", bad);
    let err = s
        .preparer
        .prepare(&named("j", "00000000-0000-4000-8000-000000000010"))
        .await
        .unwrap_err();
    assert!(err.contains("does not read"), "{err}");
    // Refused claims wrote nothing and are not recorded.
    let records = s.preparer.records().await;
    let mut prepared: Vec<&str> = records.claims.values().map(|c| c.name.as_str()).collect();
    prepared.sort();
    assert_eq!(prepared, ["a", "d", "f", "i"]);
    assert_eq!(spec_files(s.dir.path()).len(), 4);
    // Preparing a claim again is not a conflict with itself.
    s.preparer.prepare(&named("a", &uid(1))).await.unwrap();
    // The holder unprepared, the device is free.
    s.preparer.unprepare(&named("a", &uid(1))).await.unwrap();
    s.preparer.prepare(&named("b", &uid(2))).await.unwrap();
}
