//! What the double refuses as the real API server does, each sent over its
//! HTTP interface, and the matching good object still accepted (issue 41,
//! defect 14): ResourceSlice validation, claim status validation, claims
//! being deleted, PodDisruptionBudget-refused evictions, Priority admission.
//! The rules are `pkg/apis/resource/validation/validation.go` (1.34–1.36),
//! `pkg/registry/core/pod/storage/eviction.go` and
//! `plugin/pkg/admission/priority/admission.go`; the 429 bodies are compared
//! with file 11's recording where it is present.

use serde_json::{Value, json};

use crate::apiserver::dra::{claim, mig_slices, shared_slice, slice};
use crate::apiserver::{ApiServer, ApiService, Config, Resource};
use crate::replay::{Answer, fixture, send, steps};

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

fn service() -> (ApiServer, ApiService) {
    let server = ApiServer::new(Config::default());
    let (service, _session) = server.service();
    (server, service)
}

async fn post(service: &ApiService, path: &str, body: &Value) -> Answer {
    send(service, "POST", path, Some("application/json"), Some(body)).await
}

async fn merge(service: &ApiService, path: &str, body: &Value) -> Answer {
    send(
        service,
        "PATCH",
        path,
        Some("application/merge-patch+json"),
        Some(body),
    )
    .await
}

/// A 422 `Invalid` whose causes include `reason` on `field`; the message.
fn assert_invalid(a: &Answer, field: &str, reason: &str) -> String {
    assert_eq!(a.status, Some(422), "{}", a.body);
    assert_eq!(a.body["reason"], "Invalid", "{}", a.body);
    assert_eq!(a.body["kind"], "Status");
    let causes = a.body["details"]["causes"].as_array().cloned();
    assert!(
        causes
            .iter()
            .flatten()
            .any(|c| c["field"] == field && c["reason"] == reason),
        "no {reason} on {field}: {}",
        a.body
    );
    a.body["message"].as_str().unwrap_or_default().to_string()
}

fn named(mut s: Value, name: &str) -> Value {
    s["metadata"]["name"] = json!(name);
    s
}

// ---- ResourceSlices ---------------------------------------------------------

/// The double's own seed slices, the chart's shapes, are accepted.
#[tokio::test]
async fn good_slices_are_accepted() {
    let (_server, service) = service();
    for s in [slice("n1", 8), shared_slice("n2", 8), slice("n3", 128)] {
        let a = post(&service, SLICES, &s).await;
        assert_eq!(a.status, Some(201), "{}", a.body);
    }
    // 4 MIG GPUs: 72 placements and 4 counter sets, in three slices.
    let mig = mig_slices("n4", 4);
    assert_eq!(mig.len(), 3);
    for s in &mig {
        let a = post(&service, SLICES, s).await;
        assert_eq!(a.status, Some(201), "{}", a.body);
    }
    let mut all = named(slice("n5", 1), "n5-all");
    all["spec"].as_object_mut().unwrap().remove("nodeName");
    all["spec"]["allNodes"] = json!(true);
    assert_eq!(post(&service, SLICES, &all).await.status, Some(201));
}

/// `ResourceSliceMaxDevices` (128), and 64 when devices consume counters.
#[tokio::test]
async fn a_slice_of_too_many_devices_is_refused() {
    let (_server, service) = service();
    let a = post(&service, SLICES, &slice("n1", 129)).await;
    let message = assert_invalid(&a, "spec.devices", "FieldValueTooMany");
    assert_eq!(
        message,
        "ResourceSlice.resource.k8s.io \"n1-gpu.tessera.io\" is invalid: spec.devices: Too many: 129: must have at most 128 items"
    );
    assert_eq!(a.body["details"]["group"], "resource.k8s.io");
    assert_eq!(a.body["details"]["kind"], "ResourceSlice");
    // Counter-consuming devices: 64 pass, 65 do not.
    let mig = mig_slices("m", 4);
    let mut devices = mig[1]["spec"]["devices"].as_array().unwrap().clone();
    devices.extend(
        mig[2]["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .cloned(),
    );
    let mut big = mig[1].clone();
    big["spec"]["devices"] = Value::Array(devices[..65].to_vec());
    let a = post(&service, SLICES, &big).await;
    let message = assert_invalid(&a, "spec.devices", "FieldValueTooMany");
    assert!(
        message.ends_with("Too many: 65: must have at most 64 items"),
        "{message}"
    );
    big["spec"]["devices"] = Value::Array(devices[..64].to_vec());
    assert_eq!(post(&service, SLICES, &big).await.status, Some(201));
}

/// 1.35+: "Only one of Devices and SharedCounters can be set in a ResourceSlice."
#[tokio::test]
async fn counters_and_devices_in_one_slice_are_refused() {
    let (_server, service) = service();
    let mig = mig_slices("m", 1);
    let mut both = mig[1].clone();
    both["spec"]["sharedCounters"] = mig[0]["spec"]["sharedCounters"].clone();
    let a = post(&service, SLICES, &both).await;
    let message = assert_invalid(&a, "spec", "FieldValueInvalid");
    assert!(
        message.contains(
            "spec: Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed"
        ),
        "{message}"
    );
    // An empty list is still set (Go's decoder keeps `[]` non-nil).
    let mut empty = mig[0].clone();
    empty["spec"]["devices"] = json!([]);
    assert_invalid(
        &post(&service, SLICES, &empty).await,
        "spec",
        "FieldValueInvalid",
    );
    for s in &mig {
        assert_eq!(post(&service, SLICES, s).await.status, Some(201));
    }
}

/// Counter sets: at most 8 a slice, DNS-label names, 1–32 counters each.
#[tokio::test]
async fn bad_counter_sets_are_refused() {
    let (_server, service) = service();
    let counters = mig_slices("m", 9);
    let mut nine = counters[0].clone();
    let mut sets = counters[0]["spec"]["sharedCounters"]
        .as_array()
        .unwrap()
        .clone();
    sets.extend(counters[1]["spec"]["sharedCounters"].as_array().unwrap()[..1].to_vec());
    nine["spec"]["sharedCounters"] = Value::Array(sets.clone());
    assert_invalid(
        &post(&service, SLICES, &nine).await,
        "spec.sharedCounters",
        "FieldValueTooMany",
    );
    let mut bad = counters[0].clone();
    bad["spec"]["sharedCounters"] = json!([{"name": "GPU_0", "counters": {}}]);
    let a = post(&service, SLICES, &bad).await;
    assert_invalid(&a, "spec.sharedCounters[0].name", "FieldValueInvalid");
    assert_invalid(&a, "spec.sharedCounters[0].counters", "FieldValueRequired");
    nine["spec"]["sharedCounters"] = Value::Array(sets[..8].to_vec());
    assert_eq!(post(&service, SLICES, &nine).await.status, Some(201));
}

/// Device names are DNS labels (`validateDeviceName`) and unique in a slice.
#[tokio::test]
async fn bad_and_duplicate_device_names_are_refused() {
    let (_server, service) = service();
    let mut s = slice("n1", 2);
    s["spec"]["devices"][0]["name"] = json!("GPU_0");
    let message = assert_invalid(
        &post(&service, SLICES, &s).await,
        "spec.devices[0].name",
        "FieldValueInvalid",
    );
    assert!(
        message
            .contains("spec.devices[0].name: Invalid value: \"GPU_0\": a lowercase RFC 1123 label"),
        "{message}"
    );
    s["spec"]["devices"][0]["name"] = json!("gpu-1");
    let message = assert_invalid(
        &post(&service, SLICES, &s).await,
        "spec.devices[1]",
        "FieldValueDuplicate",
    );
    assert!(
        message.ends_with("spec.devices[1]: Duplicate value: \"gpu-1\""),
        "{message}"
    );
    s["spec"]["devices"][0]["name"] = json!("gpu-0");
    assert_eq!(post(&service, SLICES, &s).await.status, Some(201));
}

/// Exactly one of `nodeName`, `nodeSelector`, `allNodes`,
/// `perDeviceNodeSelection`; a node selector of exactly one term.
#[tokio::test]
async fn node_selection_must_be_one_of() {
    let (_server, service) = service();
    let mut none = slice("n1", 1);
    none["spec"].as_object_mut().unwrap().remove("nodeName");
    let message = assert_invalid(
        &post(&service, SLICES, &none).await,
        "spec",
        "FieldValueRequired",
    );
    assert!(
        message.ends_with("spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"),
        "{message}"
    );
    let mut two = slice("n1", 1);
    two["spec"]["allNodes"] = json!(true);
    let message = assert_invalid(
        &post(&service, SLICES, &two).await,
        "spec",
        "FieldValueInvalid",
    );
    assert!(
        message.contains("spec: Invalid value: \"{`nodeName`, `allNodes`}\": exactly one of"),
        "{message}"
    );
    let mut terms = none.clone();
    let term =
        json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]});
    terms["spec"]["nodeSelector"] = json!({"nodeSelectorTerms": [term, term]});
    assert_invalid(
        &post(&service, SLICES, &terms).await,
        "spec.nodeSelector.nodeSelectorTerms",
        "FieldValueInvalid",
    );
    let mut empty_name = slice("n1", 1);
    empty_name["spec"]["nodeName"] = json!("");
    empty_name["spec"]["allNodes"] = json!(true);
    assert_invalid(
        &post(&service, SLICES, &empty_name).await,
        "spec.nodeName",
        "FieldValueInvalid",
    );
    // Per-device selection: each device names its own, and only then.
    let mut per = none.clone();
    per["spec"]["perDeviceNodeSelection"] = json!(true);
    assert_invalid(
        &post(&service, SLICES, &per).await,
        "spec.devices[0]",
        "FieldValueRequired",
    );
    per["spec"]["devices"][0]["nodeName"] = json!("n1");
    assert_eq!(post(&service, SLICES, &per).await.status, Some(201));
    let mut stray = named(slice("n2", 1), "n2-stray");
    stray["spec"]["devices"][0]["nodeName"] = json!("n2");
    assert_invalid(
        &post(&service, SLICES, &stray).await,
        "spec.devices[0]",
        "FieldValueInvalid",
    );
    terms["spec"]["nodeSelector"] = json!({"nodeSelectorTerms": [term]});
    let terms = named(terms, "n1-selected");
    assert_eq!(post(&service, SLICES, &terms).await.status, Some(201));
}

/// Consumable capacity only on a device that allows multiple allocations.
#[tokio::test]
async fn a_request_policy_needs_multiple_allocations() {
    let (_server, service) = service();
    let mut s = shared_slice("n1", 1);
    s["spec"]["devices"][0]
        .as_object_mut()
        .unwrap()
        .remove("allowMultipleAllocations");
    let message = assert_invalid(
        &post(&service, SLICES, &s).await,
        "spec.devices[0].capacity[memory].requestPolicy",
        "FieldValueForbidden",
    );
    assert!(
        message.contains("Forbidden: allowMultipleAllocations must be true"),
        "{message}"
    );
    assert_eq!(
        post(&service, SLICES, &shared_slice("n1", 1)).await.status,
        Some(201)
    );
}

/// An update is validated too; `nodeName`, `driver` and `pool.name` are immutable.
#[tokio::test]
async fn slice_updates_are_validated() {
    let (_server, service) = service();
    let created = post(&service, SLICES, &slice("n1", 2)).await.body;
    let path = format!("{SLICES}/n1-gpu.tessera.io");
    let mut moved = created.clone();
    moved["spec"]["nodeName"] = json!("n2");
    let a = send(
        &service,
        "PUT",
        &path,
        Some("application/json"),
        Some(&moved),
    )
    .await;
    let message = assert_invalid(&a, "spec.nodeName", "FieldValueInvalid");
    assert!(
        message.contains("spec.nodeName: Invalid value: \"n2\": field is immutable"),
        "{message}"
    );
    let mut bigger = created.clone();
    let device = created["spec"]["devices"][0].clone();
    bigger["spec"]["devices"] = Value::Array(
        (0..129)
            .map(|i| {
                let mut d = device.clone();
                d["name"] = json!(format!("gpu-{i}"));
                d
            })
            .collect(),
    );
    let a = send(
        &service,
        "PUT",
        &path,
        Some("application/json"),
        Some(&bigger),
    )
    .await;
    assert_invalid(&a, "spec.devices", "FieldValueTooMany");
    bigger["spec"]["devices"] =
        Value::Array(bigger["spec"]["devices"].as_array().unwrap()[..128].to_vec());
    let a = send(
        &service,
        "PUT",
        &path,
        Some("application/json"),
        Some(&bigger),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
}

// ---- ResourceClaim status -----------------------------------------------------

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";

fn result(request: &str, device: &str) -> Value {
    json!({"request": request, "driver": "gpu.tessera.io", "pool": "n1", "device": device})
}

fn allocation(results: Vec<Value>) -> Value {
    json!({"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}})
}

async fn new_claim(service: &ApiService, name: &str, count: i64) -> String {
    let a = post(service, CLAIMS, &claim("ml", name, "gpu.tessera.io", count)).await;
    assert_eq!(a.status, Some(201), "{}", a.body);
    format!("{CLAIMS}/{name}/status")
}

/// `AllocationResultsMaxSize`: at most 32 results in an allocation.
#[tokio::test]
async fn more_than_32_results_are_refused() {
    let (_server, service) = service();
    let status = new_claim(&service, "big", 33).await;
    let results = |n: usize| (0..n).map(|i| result("gpu", &format!("gpu-{i}"))).collect();
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(results(33))}}),
    )
    .await;
    let message = assert_invalid(&a, "status.allocation.devices.results", "FieldValueTooMany");
    assert_eq!(
        message,
        "ResourceClaim.resource.k8s.io \"big\" is invalid: status.allocation.devices.results: Too many: 33: must have at most 32 items"
    );
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(results(32))}}),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
}

/// A result names a request of the claim's spec, or `request/subrequest`.
#[tokio::test]
async fn results_must_name_a_request_of_the_claim() {
    let (_server, service) = service();
    let status = new_claim(&service, "c", 1).await;
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(vec![result("nope", "gpu-0")])}}),
    )
    .await;
    let message = assert_invalid(
        &a,
        "status.allocation.devices.results[0].request",
        "FieldValueInvalid",
    );
    assert!(
        message.ends_with("status.allocation.devices.results[0].request: Invalid value: \"nope\": must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"),
        "{message}"
    );
    for bad in ["gpu/big", "gpu/big/x"] {
        let a = merge(
            &service,
            &status,
            &json!({"status": {"allocation": allocation(vec![result(bad, "gpu-0")])}}),
        )
        .await;
        assert_invalid(
            &a,
            "status.allocation.devices.results[0].request",
            "FieldValueInvalid",
        );
    }
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(vec![result("gpu", "GPU_0")])}}),
    )
    .await;
    assert_invalid(
        &a,
        "status.allocation.devices.results[0].device",
        "FieldValueInvalid",
    );
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(vec![result("gpu", "gpu-0")])}}),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
    // A prioritized list: its subrequests may be named.
    let mut listed = claim("ml", "listed", "gpu.tessera.io", 1);
    listed["spec"]["devices"]["requests"] = json!([{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.tessera.io"},
        {"name": "small", "deviceClassName": "gpu.tessera.io"}]}]);
    assert_eq!(post(&service, CLAIMS, &listed).await.status, Some(201));
    let path = format!("{CLAIMS}/listed/status");
    let a = merge(
        &service,
        &path,
        &json!({"status": {"allocation": allocation(vec![result("gpu/huge", "gpu-1")])}}),
    )
    .await;
    assert_invalid(
        &a,
        "status.allocation.devices.results[0].request",
        "FieldValueInvalid",
    );
    let a = merge(
        &service,
        &path,
        &json!({"status": {"allocation": allocation(vec![result("gpu/small", "gpu-1")])}}),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
}

/// A `shareID` (a share of an `allowMultipleAllocations` device) is a UID in
/// normalized RFC 4122 form (`validateUID`).
#[tokio::test]
async fn a_share_id_must_be_a_normalized_uid() {
    let (_server, service) = service();
    let status = new_claim(&service, "c", 1).await;
    let share = |id: &str| {
        let mut r = result("gpu", "gpu-0");
        r["shareID"] = json!(id);
        r["consumedCapacity"] = json!({"memory": "20Gi"});
        json!({"status": {"allocation": allocation(vec![r])}})
    };
    let field = "status.allocation.devices.results[0].shareID";
    let message = assert_invalid(
        &merge(&service, &status, &share("share-1")).await,
        field,
        "FieldValueInvalid",
    );
    assert!(
        message.ends_with(
            "shareID: Invalid value: \"share-1\": error validating uid: invalid UUID length: 7"
        ),
        "{message}"
    );
    let message = assert_invalid(
        &merge(
            &service,
            &status,
            &share("8F7C1B2A-3D4E-4F50-8A6B-7C8D9E0F1A2B"),
        )
        .await,
        field,
        "FieldValueInvalid",
    );
    assert!(
        message.contains("must be in RFC 4122 normalized form"),
        "{message}"
    );
    assert_invalid(
        &merge(
            &service,
            &status,
            &share("8f7c1b2a+3d4e-4f50-8a6b-7c8d9e0f1a2b"),
        )
        .await,
        field,
        "FieldValueInvalid",
    );
    let a = merge(
        &service,
        &status,
        &share("8f7c1b2a-3d4e-4f50-8a6b-7c8d9e0f1a2b"),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
}

/// A claim held by `resource.kubernetes.io/delete-protection` stays, marked,
/// when deleted; while it is, `reservedFor` may lose entries but gain none
/// ("new entries may not be added while `deallocationRequested` or
/// `deletionTimestamp` are set"), so a new allocation cannot be written with
/// its pod, nor a pod added to an allocation. Removing the last finalizer
/// deletes it.
#[tokio::test]
async fn a_claim_being_deleted_gains_no_consumer() {
    let (server, service) = service();
    let mut c = claim("ml", "c", "gpu.tessera.io", 1);
    c["metadata"]["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
    assert_eq!(post(&service, CLAIMS, &c).await.status, Some(201));
    let status = format!("{CLAIMS}/c/status");
    let pod = |n: &str, uid: &str| json!({"resource": "pods", "name": n, "uid": uid});
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(vec![result("gpu", "gpu-0")]),
            "reservedFor": [pod("a", "uid-a")]}}),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
    let gone = send(&service, "DELETE", &format!("{CLAIMS}/c"), None, None).await;
    assert_eq!(gone.status, Some(200), "{}", gone.body);
    let held = server
        .get(Resource::Claims, "ml", "c")
        .expect("the finalizer holds it");
    assert!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
    // A second consumer: refused.
    let a = merge(
        &service,
        &status,
        &json!({"status": {"reservedFor": [pod("a", "uid-a"), pod("b", "uid-b")]}}),
    )
    .await;
    let message = assert_invalid(&a, "status.reservedFor", "FieldValueForbidden");
    assert!(
        message.ends_with("status.reservedFor: Forbidden: new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set"),
        "{message}"
    );
    // Releasing the one it has, and the allocation: accepted.
    let a = merge(&service, &status, &json!({"status": {"reservedFor": null}})).await;
    assert_eq!(a.status, Some(200), "{}", a.body);
    let a = merge(&service, &status, &json!({"status": {"allocation": null}})).await;
    assert_eq!(a.status, Some(200), "{}", a.body);
    // A new allocation with a consumer, on the claim being deleted: refused.
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(vec![result("gpu", "gpu-1")]),
            "reservedFor": [pod("b", "uid-b")]}}),
    )
    .await;
    assert_invalid(&a, "status.reservedFor", "FieldValueForbidden");
    // The API server's rule is about consumers: an allocation alone passes
    // its validation (kube-scheduler and Tessera refuse to write one to a
    // claim being deleted themselves).
    let a = merge(
        &service,
        &status,
        &json!({"status": {"allocation": allocation(vec![result("gpu", "gpu-1")])}}),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
    let a = merge(
        &service,
        &format!("{CLAIMS}/c"),
        &json!({"metadata": {"finalizers": null}}),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
    assert!(server.get(Resource::Claims, "ml", "c").is_none());
    // Without a finalizer a DELETE removes the claim at once.
    assert_eq!(
        post(&service, CLAIMS, &claim("ml", "d", "gpu.tessera.io", 1))
            .await
            .status,
        Some(201)
    );
    let gone = send(&service, "DELETE", &format!("{CLAIMS}/d"), None, None).await;
    assert_eq!(gone.status, Some(200));
    assert!(server.get(Resource::Claims, "ml", "d").is_none());
}

// ---- Evictions and PodDisruptionBudgets ------------------------------------------------

const PODS: &str = "/api/v1/namespaces/fx/pods";
const PDBS: &str = "/apis/policy/v1/namespaces/fx/poddisruptionbudgets";

fn labelled_pod(name: &str, app: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "fx", "labels": {"app": app}},
        "spec": {"schedulerName": "tessera", "containers": [{"name": "main",
            "image": "registry.k8s.io/pause:3.9", "resources": {"limits": {"tessera.io/gpu": "1"}}}]}})
}

/// A bound pod the kubelet (which the double does not run) reports Running,
/// Ready or not.
async fn running(service: &ApiService, name: &str, app: &str, ready: bool) {
    assert_eq!(
        post(service, PODS, &labelled_pod(name, app)).await.status,
        Some(201)
    );
    let bind = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"kind": "Node", "name": "n1"}});
    let a = post(service, &format!("{PODS}/{name}/binding"), &bind).await;
    assert_eq!(a.status, Some(201), "{}", a.body);
    let status = json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
    let a = merge(service, &format!("{PODS}/{name}/status"), &status).await;
    assert_eq!(a.status, Some(200), "{}", a.body);
}

async fn evict(service: &ApiService, name: &str) -> Answer {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": "fx"}});
    post(service, &format!("{PODS}/{name}/eviction"), &body).await
}

async fn budget_status(service: &ApiService, status: Value) {
    let a = merge(
        service,
        &format!("{PDBS}/guard/status"),
        &json!({"status": status}),
    )
    .await;
    assert_eq!(a.status, Some(200), "{}", a.body);
}

/// The recorded body of file 11's step `i`, if the recording is here.
fn recorded(i: usize) -> Option<Value> {
    fixture("11-eviction-pdb.json").map(|f| steps(&f)[i]["response"]["body"].clone())
}

/// File 11: a budget over `app=guarded` (minAvailable 1). A Pending pod is
/// evicted despite it; a Running one is refused with 429 while the budget is
/// unprocessed (Retry-After 10) and while it allows no disruption, and
/// evicted once it allows one, which the eviction takes.
#[tokio::test]
async fn evictions_a_budget_refuses_are_429() {
    let (server, service) = service();
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard", "namespace": "fx"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}});
    let created = post(&service, PDBS, &pdb).await;
    assert_eq!(created.status, Some(201));
    assert_eq!(
        created.body["status"],
        json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0})
    );
    assert_eq!(created.body["metadata"]["generation"], 1);
    // Pending: the budget is skipped.
    assert_eq!(
        post(&service, PODS, &labelled_pod("pending", "guarded"))
            .await
            .status,
        Some(201)
    );
    assert_eq!(evict(&service, "pending").await.status, Some(201));
    assert!(server.get(Resource::Pods, "fx", "pending").is_none());

    running(&service, "run", "guarded", true).await;
    let a = evict(&service, "run").await;
    assert_eq!(a.status, Some(429), "{}", a.body);
    assert_eq!(
        a.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "reason": "TooManyRequests",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget guard is still being processed by the server."}],
                "retryAfterSeconds": 10},
            "code": 429})
    );
    if let Some(want) = recorded(8) {
        assert_eq!(a.body, want, "file 11 step 8");
    }
    budget_status(
        &service,
        json!({"observedGeneration": 1, "currentHealthy": 1, "desiredHealthy": 1,
            "expectedPods": 1, "disruptionsAllowed": 0}),
    )
    .await;
    let a = evict(&service, "run").await;
    assert_eq!(a.status, Some(429), "{}", a.body);
    assert_eq!(
        a.body["details"],
        json!({"causes": [{"reason": "DisruptionBudget",
            "message": "The disruption budget guard needs 1 healthy pods and has 1 currently"}]})
    );
    if let Some(want) = recorded(10) {
        assert_eq!(a.body, want, "file 11 step 10");
    }
    let pod = server.get(Resource::Pods, "fx", "run").unwrap();
    assert!(
        pod["metadata"]["deletionTimestamp"].is_null(),
        "refused: untouched"
    );
    budget_status(
        &service,
        json!({"currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2, "disruptionsAllowed": 1}),
    )
    .await;
    let a = evict(&service, "run").await;
    assert_eq!(a.status, Some(201), "{}", a.body);
    let guard = server
        .get(Resource::PodDisruptionBudgets, "fx", "guard")
        .unwrap();
    assert_eq!(guard["status"]["disruptionsAllowed"], 0);
    assert!(
        guard["status"]["disruptedPods"]["run"].is_string(),
        "{guard}"
    );
    assert_eq!(
        guard["status"]["conditions"][0]["reason"],
        "InsufficientPods"
    );
    let pod = server.get(Resource::Pods, "fx", "run").unwrap();
    assert!(pod["metadata"]["deletionTimestamp"].is_string());
    // Terminating: evicted again. Uncovered: evicted.
    assert_eq!(evict(&service, "run").await.status, Some(201));
    running(&service, "free", "free", true).await;
    assert_eq!(evict(&service, "free").await.status, Some(201));
}

/// A pod that is not Ready passes a healthy budget (`IfHealthyBudget`)
/// without taking from it; two budgets over one pod are a 500.
#[tokio::test]
async fn unhealthy_pods_and_overlapping_budgets() {
    let (server, service) = service();
    let pdb = |name: &str| {
        json!({"metadata": {"name": name, "namespace": "fx"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    };
    assert_eq!(post(&service, PDBS, &pdb("guard")).await.status, Some(201));
    budget_status(
        &service,
        json!({"observedGeneration": 1, "currentHealthy": 1, "desiredHealthy": 1,
            "expectedPods": 2, "disruptionsAllowed": 0}),
    )
    .await;
    running(&service, "ready", "guarded", true).await;
    running(&service, "sick", "guarded", false).await;
    assert_eq!(evict(&service, "ready").await.status, Some(429));
    assert_eq!(evict(&service, "sick").await.status, Some(201));
    let guard = server
        .get(Resource::PodDisruptionBudgets, "fx", "guard")
        .unwrap();
    assert_eq!(guard["status"]["disruptionsAllowed"], 0);
    assert!(guard["status"].get("disruptedPods").is_none(), "{guard}");
    assert_eq!(post(&service, PDBS, &pdb("second")).await.status, Some(201));
    let a = evict(&service, "ready").await;
    assert_eq!(a.status, Some(500), "{}", a.body);
    assert_eq!(a.body["reason"], "InternalError");
}

// ---- Priority admission -------------------------------------------------------------

const CLASSES: &str = "/apis/scheduling.k8s.io/v1/priorityclasses";

fn pod_of(name: &str, spec: Value) -> Value {
    let mut p = labelled_pod(name, "x");
    for (k, v) in spec.as_object().unwrap() {
        p["spec"][k] = v.clone();
    }
    p
}

/// An unknown `priorityClassName` is refused as the Priority plugin does.
#[tokio::test]
async fn an_unknown_priority_class_is_forbidden() {
    let (server, service) = service();
    let a = post(
        &service,
        PODS,
        &pod_of("p", json!({"priorityClassName": "nope"})),
    )
    .await;
    assert_eq!(a.status, Some(403), "{}", a.body);
    assert_eq!(
        a.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"p\" is forbidden: no PriorityClass with name nope was found",
            "reason": "Forbidden", "details": {"name": "p", "kind": "pods"}, "code": 403})
    );
    assert!(server.get(Resource::Pods, "fx", "p").is_none());
}

/// A known class is resolved into `spec.priority` (and its
/// `preemptionPolicy`); the built-in system classes exist; a pod may not
/// bring a priority of its own that differs.
#[tokio::test]
async fn a_priority_class_is_resolved_into_the_priority() {
    let (_server, service) = service();
    for (name, value, policy) in [("high", 1000, None), ("polite", 500, Some("Never"))] {
        let mut class = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value});
        if let Some(p) = policy {
            class["preemptionPolicy"] = json!(p);
        }
        assert_eq!(post(&service, CLASSES, &class).await.status, Some(201));
    }
    let a = post(
        &service,
        PODS,
        &pod_of("h", json!({"priorityClassName": "high"})),
    )
    .await;
    assert_eq!(a.status, Some(201), "{}", a.body);
    assert_eq!(a.body["spec"]["priority"], 1000);
    assert_eq!(a.body["spec"]["preemptionPolicy"], "PreemptLowerPriority");
    let a = post(
        &service,
        PODS,
        &pod_of("q", json!({"priorityClassName": "polite"})),
    )
    .await;
    assert_eq!(a.body["spec"]["priority"], 500);
    assert_eq!(a.body["spec"]["preemptionPolicy"], "Never");
    let a = post(
        &service,
        PODS,
        &pod_of("s", json!({"priorityClassName": "system-cluster-critical"})),
    )
    .await;
    assert_eq!(a.status, Some(201), "{}", a.body);
    assert_eq!(a.body["spec"]["priority"], 2_000_000_000);
    let a = post(
        &service,
        PODS,
        &pod_of("h2", json!({"priorityClassName": "high", "priority": 5})),
    )
    .await;
    assert_eq!(a.status, Some(403), "{}", a.body);
    assert_eq!(
        a.body["message"],
        "pods \"h2\" is forbidden: the integer value of priority (5) must not be provided in pod spec; priority admission controller computed 1000 from the given PriorityClass name"
    );
    let a = post(
        &service,
        PODS,
        &pod_of(
            "q2",
            json!({"priorityClassName": "polite", "preemptionPolicy": "PreemptLowerPriority"}),
        ),
    )
    .await;
    assert_eq!(a.status, Some(403), "{}", a.body);
    // No class and no default: priority 0; a priority of its own is refused.
    let a = post(&service, PODS, &pod_of("z", json!({}))).await;
    assert_eq!(a.body["spec"]["priority"], 0);
    let a = post(&service, PODS, &pod_of("z2", json!({"priority": 7}))).await;
    assert_eq!(a.status, Some(403), "{}", a.body);
    // A global default applies to pods that name none.
    let default = json!({"metadata": {"name": "standard"}, "value": 100, "globalDefault": true});
    assert_eq!(post(&service, CLASSES, &default).await.status, Some(201));
    let a = post(&service, PODS, &pod_of("d", json!({}))).await;
    assert_eq!(a.status, Some(201), "{}", a.body);
    assert_eq!(a.body["spec"]["priority"], 100);
    assert_eq!(a.body["spec"]["priorityClassName"], "standard");
}
