//! Standalone mode with `--dra` against the stateful API-server double
//! (`tests/apiserver`, extended with `resource.k8s.io/v1`; those responses are
//! not recorded in ../shared/fixtures, see `apiserver/dra.rs`): Tessera
//! allocates pods' ResourceClaims with its policy, writes each claim's
//! allocation and reservation before the Binding, respects claims allocated by
//! others, never overwrites a changed claim, never gives one device twice (also
//! while the watch lags behind its writes), finishes after a restart, and says
//! why a pod waits or is refused; against a server without `resource.k8s.io/v1`
//! it still places every other pod.

mod apiserver;

use std::sync::Arc;
use std::time::Duration;

use apiserver::cluster::{Shape, node_of, pod, ready_node};
use apiserver::dra::{claim, classes, pod_with_claims, slice, standalone_config};
use apiserver::process::Process;
use apiserver::{ApiServer, Config, Resource};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use serde_json::{Value, json};
use tessera_api::{GpuDevice, GpuNode, GpuNodeSpec, GpuQueue, GpuQueueSpec, QueueResources};
use tessera_core::policy::{self, PolicyArgs};
use tessera_k8s::binder::Binder;
use tessera_k8s::dra::view::SharedDraView;
use tessera_k8s::leader::Leadership;
use tessera_k8s::metrics::Metrics;
use tessera_k8s::mirror::{Mirror, SharedMirror};
use tessera_k8s::standalone::{Dra, Standalone};

const KEY: &[u8] = b"dra-standalone-test-signing-key!";
const NS: &str = "ml";

fn key_file() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("tessera-dra-test-key-{}", std::process::id()));
    std::fs::write(&p, KEY).unwrap();
    p
}

fn config(policy: &str) -> tessera_k8s::run::Config {
    standalone_config(&key_file(), policy)
}

/// The allocation of one device of Tessera's driver in `node`'s pool, as a
/// scheduler writes it (`gpu` request, the node as its selector).
fn one_device(node: &str, device: &str) -> Value {
    json!({"devices": {"results": [
        {"request": "gpu", "driver": "gpu.tessera.io", "pool": node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}})
}

/// A one-GPU claim `ns/name` allocated `node`'s `device` and reserved for
/// pod `pod` (`uid`), as stored once a scheduler wrote it.
fn allocated_claim(ns: &str, name: &str, node: &str, device: &str, pod: &str, uid: &str) -> Value {
    let mut c = claim(ns, name, "gpu.tessera.io", 1);
    c["status"] = json!({"allocation": one_device(node, device),
        "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}]});
    c
}

/// A one-GPU claim `claim_name` in `ns`, and pod `ns/pod` using it (changed
/// by `shape` before it is created); the pod's UID.
fn one_gpu_pod(
    server: &ApiServer,
    ns: &str,
    pod: &str,
    claim_name: &str,
    shape: impl FnOnce(&mut Value),
) -> String {
    server
        .create(
            Resource::Claims,
            &claim(ns, claim_name, "gpu.tessera.io", 1),
        )
        .unwrap();
    let mut p = pod_with_claims(ns, pod, &[("gpu", Ok(claim_name))]);
    shape(&mut p);
    server.create(Resource::Pods, &p).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Nodes with `gpus` GPUs each published as slices, and the chart's classes.
fn cluster(server: &ApiServer, nodes: &[(&str, u32)]) {
    for (n, gpus) in nodes {
        server.create(Resource::Nodes, &ready_node(n)).unwrap();
        server.create(Resource::Slices, &slice(n, *gpus)).unwrap();
    }
    for c in classes() {
        server.create(Resource::DeviceClasses, &c).unwrap();
    }
}

fn get(server: &ApiServer, r: Resource, name: &str) -> Value {
    let ns = if r == Resource::Slices || r == Resource::DeviceClasses {
        ""
    } else {
        NS
    };
    server
        .get(r, ns, name)
        .unwrap_or_else(|| panic!("{name} stored"))
}

/// `(node, device)` of each allocation result of a stored claim.
fn devices(claim: &Value) -> Vec<(String, String)> {
    claim
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["pool"].as_str().unwrap_or_default().to_string(),
                r["device"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn reserved_uids(claim: &Value) -> Vec<String> {
    claim
        .pointer("/status/reservedFor")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str().map(str::to_string))
        .collect()
}

/// Event notes about pod `name`.
fn notes(server: &ApiServer, name: &str) -> Vec<String> {
    let mut v: Vec<String> = server
        .objects::<Value>(Resource::Events)
        .into_iter()
        .filter(|e| e.pointer("/regarding/name").and_then(Value::as_str) == Some(name))
        .filter_map(|e| e["note"].as_str().map(str::to_string))
        .collect();
    v.extend(
        server
            .objects::<Value>(Resource::CoreEvents)
            .into_iter()
            .filter(|e| e.pointer("/involvedObject/name").and_then(Value::as_str) == Some(name))
            .filter_map(|e| e["message"].as_str().map(str::to_string)),
    );
    v
}

async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn bound_to(server: &ApiServer, pod: &str) -> Option<String> {
    node_of(&get(server, Resource::Pods, pod)).map(str::to_string)
}

/// The policy picks the device, not first fit: with one GPU of `node-a` held
/// by another claim, `binpack` puts a one-GPU claim beside it and `spread`
/// on the empty `node-b`; either way the claim's allocation and reservation
/// are written before the Binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_gets_the_policys_device_and_is_written_before_the_binding() {
    for (policy, want_node) in [("binpack", "node-a"), ("spread", "node-b")] {
        let server = ApiServer::new(Config::default());
        cluster(&server, &[("node-a", 4), ("node-b", 4)]);
        // Someone else's claim holds node-a's gpu-0.
        let held = allocated_claim(NS, "held", "node-a", "gpu-0", "other", "uid-other");
        server.create(Resource::Claims, &held).unwrap();
        let uid = one_gpu_pod(&server, NS, "p1", "c1", |_| {});
        let proc = Process::start(&server, config(policy), &[]);
        until(
            &format!("{policy}: p1 bound"),
            Duration::from_secs(20),
            || bound_to(&server, "p1").is_some(),
        )
        .await;
        assert_eq!(
            bound_to(&server, "p1").as_deref(),
            Some(want_node),
            "{policy}"
        );
        let c1 = get(&server, Resource::Claims, "c1");
        let got = devices(&c1);
        assert_eq!(got.len(), 1, "{policy}: {c1}");
        assert_eq!(got[0].0, want_node, "{policy}: {c1}");
        assert_ne!(got[0], ("node-a".to_string(), "gpu-0".to_string()));
        assert_eq!(reserved_uids(&c1), [uid], "{policy}");
        assert_eq!(
            c1.pointer(
                "/status/allocation/nodeSelector/nodeSelectorTerms/0/matchFields/0/values/0"
            ),
            Some(&json!(want_node))
        );
        // The claim's write came before the Binding.
        let writes = server.writes();
        let claim_at = writes
            .iter()
            .position(|w| w.resource == "resourceclaims" && w.name == "c1" && w.status == 200);
        let bind_at = writes
            .iter()
            .position(|w| w.subresource == "binding" && w.name == "p1" && w.status == 201);
        assert!(
            claim_at.is_some() && claim_at < bind_at,
            "{policy}: claim write {claim_at:?}, binding {bind_at:?}"
        );
        // The other claim is untouched.
        assert_eq!(
            devices(&get(&server, Resource::Claims, "held")),
            [("node-a".to_string(), "gpu-0".to_string())]
        );
        proc.kill().unwrap();
    }
}

/// A claim allocated by someone else is respected: the pod goes to its node,
/// the allocation is not rewritten, the pod is only added to `reservedFor`.
/// A pod whose claim uses another driver's class gets an event naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_allocations_are_respected_and_other_drivers_refused() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2), ("node-b", 2)]);
    let mut theirs = claim(NS, "theirs", "gpu.tessera.io", 1);
    let alloc = json!({"devices": {"results": [
        {"request": "gpu", "driver": "gpu.tessera.io", "pool": "node-b", "device": "gpu-1",
         "futureField": "kept"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]}});
    theirs["status"] = json!({"allocation": alloc.clone(),
        "reservedFor": [{"resource": "pods", "name": "first", "uid": "uid-first"}]});
    server.create(Resource::Claims, &theirs).unwrap();
    let p = server
        .create(
            Resource::Pods,
            &pod_with_claims(NS, "sharer", &[("gpu", Ok("theirs"))]),
        )
        .unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    // Another driver's class and a claim of it.
    server
        .create(
            Resource::DeviceClasses,
            &json!({"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [
                {"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}),
        )
        .unwrap();
    server
        .create(Resource::Claims, &claim(NS, "nv", "gpu.nvidia.com", 1))
        .unwrap();
    server
        .create(
            Resource::Pods,
            &pod_with_claims(NS, "nvpod", &[("gpu", Ok("nv"))]),
        )
        .unwrap();
    let proc = Process::start(&server, config("tessera"), &[]);
    until("sharer bound", Duration::from_secs(20), || {
        bound_to(&server, "sharer").is_some()
    })
    .await;
    assert_eq!(bound_to(&server, "sharer").as_deref(), Some("node-b"));
    let c = get(&server, Resource::Claims, "theirs");
    assert_eq!(
        c["status"]["allocation"], alloc,
        "allocation rewritten: {c}"
    );
    assert_eq!(reserved_uids(&c), ["uid-first".to_string(), uid]);
    until("nvpod's event", Duration::from_secs(20), || {
        notes(&server, "nvpod").iter().any(|n| {
            n.contains("ResourceClaim ml/nv") && n.contains("not of driver gpu.tessera.io")
        })
    })
    .await;
    assert_eq!(bound_to(&server, "nvpod"), None);
    assert!(devices(&get(&server, Resource::Claims, "nv")).is_empty());
    proc.kill().unwrap();
}

/// A pod whose claim comes from a template waits, with a reason, until
/// `status.resourceClaimStatuses` names the claim the controller made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_claim_waits_for_the_pods_claim_status() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 1)]);
    let p = server
        .create(
            Resource::Pods,
            &pod_with_claims(NS, "tp", &[("gpu", Err("one-gpu"))]),
        )
        .unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let proc = Process::start(&server, config("tessera"), &[]);
    until("tp's waiting event", Duration::from_secs(20), || {
        notes(&server, "tp")
            .iter()
            .any(|n| n.contains("template ml/one-gpu") && n.contains("resourceClaimStatuses"))
    })
    .await;
    assert_eq!(bound_to(&server, "tp"), None);
    // The resourceclaim controller's work: the claim, owned by the pod, then the pod's status.
    let mut c = claim(NS, "tp-gpu-x7k2p", "gpu.tessera.io", 1);
    c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod", "name": "tp",
        "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    c["metadata"]["annotations"] = json!({"resource.kubernetes.io/pod-claim-name": "gpu"});
    server.create(Resource::Claims, &c).unwrap();
    let (client, _session) = server.client();
    let pods: kube::Api<Pod> = kube::Api::namespaced(client, NS);
    pods.patch_status(
        "tp",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"resourceClaimStatuses": [
            {"name": "gpu", "resourceClaimName": "tp-gpu-x7k2p"}]}})),
    )
    .await
    .unwrap();
    until("tp bound", Duration::from_secs(90), || {
        bound_to(&server, "tp").is_some()
    })
    .await;
    let c = get(&server, Resource::Claims, "tp-gpu-x7k2p");
    assert_eq!(devices(&c), [("node-a".to_string(), "gpu-0".to_string())]);
    assert_eq!(reserved_uids(&c), [uid]);
    proc.kill().unwrap();
}

/// After a restart: claims allocated before it are counted (a new claim gets
/// another device), and a pod whose claim is allocated and reserved for it
/// but which is not bound is bound to that node without rewriting the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_finishes_what_it_wrote_and_counts_it() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2), ("node-b", 2)]);
    // What the previous process wrote before it died: c1 allocated on
    // node-b/gpu-1 and reserved for p1, p1 not bound.
    let p1 = server
        .create(
            Resource::Pods,
            &pod_with_claims(NS, "p1", &[("gpu", Ok("c1"))]),
        )
        .unwrap();
    let uid1 = p1["metadata"]["uid"].as_str().unwrap().to_string();
    let c1 = allocated_claim(NS, "c1", "node-b", "gpu-1", "p1", &uid1);
    server.create(Resource::Claims, &c1).unwrap();
    let c1_rv = get(&server, Resource::Claims, "c1")["metadata"]["resourceVersion"].clone();
    // node-a full (both GPUs held by others): a new claim can only get node-b/gpu-0.
    for (i, dev) in ["gpu-0", "gpu-1"].iter().enumerate() {
        let mut c = claim(NS, &format!("full-{i}"), "gpu.tessera.io", 1);
        c["status"] = json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.tessera.io", "pool": "node-a", "device": dev}]}},
            "reservedFor": [{"resource": "pods", "name": "x", "uid": format!("uid-x{i}")}]});
        server.create(Resource::Claims, &c).unwrap();
    }
    one_gpu_pod(&server, NS, "p2", "c2", |_| {});
    let proc = Process::start(&server, config("spread"), &[]);
    until("both bound", Duration::from_secs(20), || {
        bound_to(&server, "p1").is_some() && bound_to(&server, "p2").is_some()
    })
    .await;
    assert_eq!(bound_to(&server, "p1").as_deref(), Some("node-b"));
    let c1 = get(&server, Resource::Claims, "c1");
    assert_eq!(
        c1["metadata"]["resourceVersion"], c1_rv,
        "c1 was rewritten: {c1}"
    );
    assert_eq!(
        devices(&get(&server, Resource::Claims, "c2")),
        [("node-b".to_string(), "gpu-0".to_string())]
    );
    assert_eq!(bound_to(&server, "p2").as_deref(), Some("node-b"));
    proc.kill().unwrap();
}

// ---- the loop on its own, with a view fed by the test (a watch that lags) -------

struct Loop {
    server: ApiServer,
    view: SharedDraView,
    mirror: SharedMirror,
    standalone: Standalone,
}

/// A standalone loop whose DRA view holds what the server has now, and is
/// never updated unless the test does it.
fn standalone_loop(server: ApiServer) -> Loop {
    let (client, _session) = server.client();
    let mirror = mirror_of(&server);
    loop_with(server, mirror, client)
}

/// A mirror of the server's nodes and pods (binpack, no GpuNodes).
fn mirror_of(server: &ApiServer) -> Mirror {
    let nodes: Vec<Node> = server.objects(Resource::Nodes);
    let pods: Vec<Pod> = server.objects(Resource::Pods);
    let policy = policy::by_name("binpack", &PolicyArgs::default()).unwrap();
    Mirror::from_objects(policy, KEY.to_vec(), nodes, vec![], pods)
}

/// The loop over `mirror`, writing through `client`, with a view of the
/// server's DRA objects as they are now.
fn loop_with(server: ApiServer, mirror: Mirror, client: kube::Client) -> Loop {
    let mirror = SharedMirror::new(mirror);
    let view = SharedDraView::new();
    refresh(&server, &view);
    let leader = Leadership::always();
    let standalone = Standalone::new(
        "tessera".into(),
        mirror.clone(),
        Binder::new(client.clone(), mirror.clone(), leader.clone()),
        leader,
        Arc::new(Metrics::new()),
        Some(tessera_k8s::events::Publisher::new(
            client,
            kube::runtime::events::Reporter::from("tessera"),
        )),
        Default::default(),
    )
    .with_dra(Dra::On(view.clone()));
    Loop {
        server,
        view,
        mirror,
        standalone,
    }
}

/// The view catches up with the server (what the watch would deliver).
fn refresh(server: &ApiServer, view: &SharedDraView) {
    let mut v = view.lock();
    v.replace_claims(server.objects(Resource::Claims));
    v.replace_slices(server.objects(Resource::Slices));
    v.replace_classes(server.objects(Resource::DeviceClasses));
}

/// Two pods, one GPU: the first pod's allocation is written, the watch never
/// shows it, and the second pod must still not get the same GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_never_share_a_dedicated_gpu_while_the_watch_lags() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 1)]);
    for i in 1..=2 {
        one_gpu_pod(&server, NS, &format!("p{i}"), &format!("c{i}"), |_| {});
    }
    let mut l = standalone_loop(server);
    l.standalone.pass().await;
    l.standalone.flush().await;
    // Exactly one claim got the GPU and exactly one pod was bound.
    let alloc: Vec<Vec<(String, String)>> = ["c1", "c2"]
        .iter()
        .map(|c| devices(&get(&l.server, Resource::Claims, c)))
        .collect();
    assert_eq!(
        alloc.iter().filter(|d| !d.is_empty()).count(),
        1,
        "one GPU, given once: {alloc:?}"
    );
    // Again, the view still lagging: the assumed write keeps counting.
    l.standalone.pass().await;
    l.standalone.flush().await;
    let alloc2: Vec<Vec<(String, String)>> = ["c1", "c2"]
        .iter()
        .map(|c| devices(&get(&l.server, Resource::Claims, c)))
        .collect();
    assert_eq!(alloc, alloc2);
    let bound: Vec<bool> = ["p1", "p2"]
        .iter()
        .map(|p| bound_to(&l.server, p).is_some())
        .collect();
    assert_eq!(bound.iter().filter(|b| **b).count(), 1, "{bound:?}");
    assert!(l.view.lock().assumed() >= 1);
    drop(l.mirror);
}

/// Claims count against queue quotas: with a queue guaranteed one GPU (no
/// borrowing) and two pods of its namespace asking one GPU each through
/// claims, on a node with two free GPUs, one pod is bound and the other waits
/// with the quota's sentence, its claim left unallocated; the queue's usage
/// counts the bound pod's GPU, also once the watch shows the written claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_count_against_their_queue_s_quota_and_usage() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2)]);
    for i in 1..=2 {
        one_gpu_pod(&server, NS, &format!("p{i}"), &format!("c{i}"), |_| {});
    }
    let mut l = standalone_loop(server);
    {
        let mut m = l.mirror.lock();
        // Room for the pods' CPU and memory: only the GPU is short.
        let guaranteed = QueueResources {
            gpus: Some("1".into()),
            cpu: Some("64".into()),
            memory: Some("512Gi".into()),
        };
        m.replace_queues(vec![GpuQueue::new(
            "team-a",
            GpuQueueSpec {
                guaranteed,
                borrow: Some(false),
                ..Default::default()
            },
        )]);
        let mut ns = Namespace::default();
        ns.metadata.name = Some(NS.into());
        ns.metadata.labels = Some([("tessera.io/queue".to_string(), "team-a".to_string())].into());
        m.replace_namespaces(vec![ns]);
    }
    let team_a_gpu_milli = |l: &Loop| {
        let report = l.mirror.lock().queue_report();
        let q = report.iter().find(|q| q.name == "team-a").expect("team-a");
        q.allocated.gpu_eq_milli
    };
    l.standalone.pass().await;
    l.standalone.flush().await;
    // One GPU-equivalent held by the bound pod's claim (assumed, not yet watched).
    assert_eq!(team_a_gpu_milli(&l), 1000);
    // The watch catches up; the next pass counts the written claim the same.
    refresh(&l.server, &l.view);
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(team_a_gpu_milli(&l), 1000);
    let bound: Vec<&str> = ["p1", "p2"]
        .into_iter()
        .filter(|p| bound_to(&l.server, p).is_some())
        .collect();
    assert_eq!(bound.len(), 1, "one GPU of quota: one pod, {bound:?}");
    let (ok, waiting) = if bound[0] == "p1" {
        ("c1", "p2")
    } else {
        ("c2", "p1")
    };
    let other = if ok == "c1" { "c2" } else { "c1" };
    assert_eq!(devices(&get(&l.server, Resource::Claims, ok)).len(), 1);
    let left = get(&l.server, Resource::Claims, other);
    assert!(devices(&left).is_empty(), "{left}");
    assert!(reserved_uids(&left).is_empty(), "{left}");
    let said = notes(&l.server, waiting);
    assert!(
        said.iter()
            .any(|n| n.contains("team-a") && n.contains("guaranteed quota")),
        "{said:?}"
    );
    drop(l.mirror);
}

/// A claim that changed since it was read (someone allocated it meanwhile)
/// is not overwritten: the 409 sends the pod back, and once the view shows
/// the new claim the pod goes where that allocation says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_claim_write_is_never_overwritten() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2), ("node-b", 2)]);
    let uid = one_gpu_pod(&server, NS, "p1", "c1", |_| {});
    let mut l = standalone_loop(server);
    // Another scheduler allocates c1 after our view read it.
    let theirs = one_device("node-b", "gpu-1");
    let (client, _s) = l.server.client();
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client, NS, &tessera_k8s::dra::write::claims_resource());
    api.patch_status(
        "c1",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"allocation": theirs.clone()}})),
    )
    .await
    .unwrap();
    l.standalone.pass().await;
    l.standalone.flush().await;
    let c1 = get(&l.server, Resource::Claims, "c1");
    assert_eq!(c1["status"]["allocation"], theirs, "overwritten: {c1}");
    assert!(reserved_uids(&c1).is_empty());
    assert!(
        l.server
            .writes()
            .iter()
            .any(|w| w.resource == "resourceclaims" && w.status == 409),
        "our write was sent with the old resourceVersion and refused"
    );
    assert_eq!(bound_to(&l.server, "p1"), None);
    assert!(
        l.mirror.lock().held(&uid).is_none(),
        "the hold is given back"
    );
    // The watch catches up; after the backoff the pod follows their allocation.
    refresh(&l.server, &l.view);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(bound_to(&l.server, "p1").as_deref(), Some("node-b"));
    let c1 = get(&l.server, Resource::Claims, "c1");
    assert_eq!(c1["status"]["allocation"], theirs);
    assert_eq!(reserved_uids(&c1), [uid]);
}

/// The double as a cluster without `resource.k8s.io` (Kubernetes before
/// 1.34, or the group turned off): every path of the group is answered as a
/// real API server answers a group it does not serve, `404` with the
/// `NotFound` Status "the server could not find the requested resource" and
/// empty details (the double's `no_route`; ../shared/fixtures records no such
/// answer, so this is the standard Status of that shape).
fn client_without_dra(server: &ApiServer) -> kube::Client {
    let (inner, _session) = server.service();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let mut inner = inner.clone();
        async move {
            if req.uri().path().starts_with("/apis/resource.k8s.io/") {
                let body = serde_json::to_vec(&apiserver::status::no_route().body).unwrap();
                return Ok(http::Response::builder()
                    .status(404)
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body))
                    .unwrap());
            }
            tower::Service::call(&mut inner, req).await
        }
    });
    kube::Client::new(service, "default")
}

/// `--dra` against an API server that does not serve `resource.k8s.io/v1`:
/// the scheduler still starts and places an ordinary `tessera.io/gpu` pod,
/// and refuses a pod with claims with an event saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_dra_api_ordinary_pods_are_placed_and_claims_refused() {
    use apiserver::cluster::{Shape, add_gpu_nodes, pod};
    let server = ApiServer::new(Config::default());
    add_gpu_nodes(&server, 1, 2);
    server
        .create(
            Resource::Pods,
            &pod(NS, "plain", "tessera", Shape::Whole(1), 1000, 1024, 0),
        )
        .unwrap();
    server
        .create(
            Resource::Pods,
            &pod_with_claims(NS, "claimer", &[("gpu", Ok("c1"))]),
        )
        .unwrap();
    let mut config = config("tessera");
    config.listen = apiserver::process::free_addr();
    config.metrics_listen = apiserver::process::free_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(tessera_k8s::run::run(
        config,
        client_without_dra(&server),
        async move {
            let _ = stopped.await;
        },
    ));
    until("plain bound", Duration::from_secs(20), || {
        bound_to(&server, "plain").is_some()
    })
    .await;
    assert_eq!(bound_to(&server, "plain").as_deref(), Some("gpu-node-0"));
    let refused = |n: &String| {
        n.contains("uses DRA ResourceClaims")
            && n.contains("the API server does not serve resource.k8s.io/v1")
    };
    until("claimer refused", Duration::from_secs(20), || {
        notes(&server, "claimer").iter().any(refused)
    })
    .await;
    assert_eq!(bound_to(&server, "claimer"), None);
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}

/// The DRA view's problems reach `/metrics` and the mirror's list (the web
/// view's Problems): a slice that does not read and a device left out of
/// node-a's inventory count 2 in `tessera_dra_problems` once a pod with claims
/// is decided, and the rest of the view still works
/// (the pod's claim is allocated on node-a's good GPU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_views_problems_are_counted_in_metrics() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 1)]);
    one_gpu_pod(&server, NS, "p1", "c1", |_| {});
    let mut l = standalone_loop(server);
    let gauge = |l: &Loop| {
        l.standalone
            .metrics
            .encode()
            .unwrap()
            .lines()
            .find_map(|s| s.strip_prefix("tessera_dra_problems ").map(str::to_string))
    };
    assert_eq!(gauge(&l).as_deref(), Some("0"));
    {
        let mut v = l.view.lock();
        v.upsert_slice(json!({"metadata": {"name": "broken"}, "spec": {"driver": 7}}));
        let mut s = get(&l.server, Resource::Slices, "node-a-gpu.tessera.io");
        let bad = json!({"name": "gpu-9", "attributes": {"type": {"string": "gpu", "int": 1}}});
        s["spec"]["devices"].as_array_mut().unwrap().push(bad);
        v.upsert_slice(s);
    }
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(gauge(&l).as_deref(), Some("2"));
    // …and the mirror lists them, so the web view and `tessera_problems` do.
    let listed = l.mirror.lock().problems();
    assert!(
        listed.iter().any(|p| p.contains("broken")) && listed.iter().any(|p| p.contains("gpu-9")),
        "{listed:?}"
    );
    assert_eq!(
        devices(&get(&l.server, Resource::Claims, "c1")),
        [("node-a".to_string(), "gpu-0".to_string())]
    );
}

// ---- gangs with claims ----

/// PodGroup `name` in [`NS`] with `min` members, as the mirror holds it.
fn gang_group(name: &str, min: i32) -> tessera_api::PodGroup {
    tessera_api::PodGroup {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: tessera_api::PodGroupSpec {
            min_member: Some(min),
            schedule_timeout_seconds: None,
        },
    }
}

/// `pod` labelled as a member of gang `gang`.
fn in_gang(mut pod: Value, gang: &str) -> Value {
    pod["metadata"]["labels"] = json!({"scheduling.x-k8s.io/pod-group": gang});
    pod
}

/// Creates claim `claim` (one GPU) and pod `name` of gang `gang` using it;
/// returns the pod's uid.
fn claim_member(server: &ApiServer, gang: &str, name: &str, claim_name: &str) -> String {
    one_gpu_pod(server, NS, name, claim_name, |p| {
        *p = in_gang(p.take(), gang)
    })
}

/// A Ready DRA node `name` with `gpus` GPUs appears, in the server, the
/// mirror and the view.
fn add_dra_node(l: &Loop, name: &str, gpus: u32) {
    l.server.create(Resource::Nodes, &ready_node(name)).unwrap();
    l.server
        .create(Resource::Slices, &slice(name, gpus))
        .unwrap();
    l.mirror
        .lock()
        .upsert_node(serde_json::from_value(ready_node(name)).unwrap());
    refresh(&l.server, &l.view);
}

/// Whether the claim write of `claim` came before `pod`'s Binding.
fn written_before_binding(server: &ApiServer, claim: &str, pod: &str) -> bool {
    let writes = server.writes();
    let claim_at = writes
        .iter()
        .position(|w| w.resource == "resourceclaims" && w.name == claim && w.status == 200);
    let bind_at = writes
        .iter()
        .position(|w| w.subresource == "binding" && w.name == pod && w.status == 201);
    claim_at.is_some() && bind_at.is_some() && claim_at < bind_at
}

/// Gang `name` of two members `name`-0 and `name`-1, each with a one-GPU
/// claim (`c0`, `c1`), on node-a with `gpus` GPUs, after one pass of a loop
/// whose view never follows the writes; the loop and the members' UIDs.
async fn gang_of_two(name: &str, gpus: u32) -> (Loop, Vec<String>) {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", gpus)]);
    let uids: Vec<String> = (0..2)
        .map(|i| claim_member(&server, name, &format!("{name}-{i}"), &format!("c{i}")))
        .collect();
    let mut l = standalone_loop(server);
    l.mirror
        .lock()
        .replace_pod_groups(vec![gang_group(name, 2)]);
    l.standalone.pass().await;
    l.standalone.flush().await;
    (l, uids)
}

/// A gang of two, each with a one-GPU claim, on one free GPU: the first
/// member's allocation is decided, the second's does not fit, and the first
/// is undone (no claim allocated, nothing assumed or held) and both wait with
/// the gang's event. A second GPU appears: both are bound, with distinct
/// devices, though the view never showed the first member's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_with_claims_is_allocated_whole_or_not_at_all() {
    let (mut l, uids) = gang_of_two("train", 1).await;
    for (i, uid) in uids.iter().enumerate() {
        assert_eq!(bound_to(&l.server, &format!("train-{i}")), None);
        let c = get(&l.server, Resource::Claims, &format!("c{i}"));
        assert!(devices(&c).is_empty(), "{c}");
        assert!(reserved_uids(&c).is_empty(), "{c}");
        assert!(l.mirror.lock().held(uid).is_none(), "train-{i} held");
        let said = notes(&l.server, &format!("train-{i}"));
        assert!(
            said.iter()
                .any(|n| n.contains("gang ml/train does not fit")
                    && n.contains("1 of the 2 members")),
            "train-{i}: {said:?}"
        );
    }
    assert_eq!(
        l.view.lock().assumed(),
        0,
        "the undone allocation is dropped"
    );
    // A second GPU, on a new node.
    add_dra_node(&l, "node-b", 1);
    // Past the members' first backoff (1 s).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    let mut got = Vec::new();
    for (i, uid) in uids.iter().enumerate() {
        let pod = format!("train-{i}");
        let c = get(&l.server, Resource::Claims, &format!("c{i}"));
        let d = devices(&c);
        assert_eq!(d.len(), 1, "{c}");
        assert_eq!(bound_to(&l.server, &pod).as_deref(), Some(d[0].0.as_str()));
        assert_eq!(&reserved_uids(&c), std::slice::from_ref(uid));
        got.push(d[0].clone());
    }
    assert_ne!(got[0], got[1], "one device given twice: {got:?}");
}

/// A gang of two on two free GPUs of one node, the view never showing the
/// writes: both are bound, with distinct devices (the second member saw the
/// first's assumed allocation), each claim written before its Binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_with_claims_gets_distinct_devices_written_before_binding() {
    let (l, uids) = gang_of_two("pair", 2).await;
    let mut got = Vec::new();
    for (i, uid) in uids.iter().enumerate() {
        let (pod, claim) = (format!("pair-{i}"), format!("c{i}"));
        assert_eq!(bound_to(&l.server, &pod).as_deref(), Some("node-a"));
        let c = get(&l.server, Resource::Claims, &claim);
        assert_eq!(devices(&c).len(), 1, "{c}");
        assert_eq!(&reserved_uids(&c), std::slice::from_ref(uid));
        assert!(
            written_before_binding(&l.server, &claim, &pod),
            "{claim} before {pod}'s Binding: {:?}",
            l.server.writes()
        );
        got.extend(devices(&c));
    }
    assert_ne!(got[0], got[1], "one device given twice: {got:?}");
}

/// A mixed gang: one member asks a `tessera.io/gpu` (device-plugin node
/// `gpu-node-0`), one a claim (DRA nodes). While the only DRA GPU is
/// someone else's, the claim member does not fit and the GPU member's hold is
/// given back: neither is bound. A DRA node arrives: both are bound, each on
/// its kind of node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_gang_is_placed_whole_or_not_at_all() {
    use apiserver::cluster::{Shape, add_gpu_nodes, pod};
    let server = ApiServer::new(Config::default());
    add_gpu_nodes(&server, 1, 1);
    cluster(&server, &[("node-a", 1)]);
    let held = allocated_claim(NS, "held", "node-a", "gpu-0", "other", "uid-other");
    server.create(Resource::Claims, &held).unwrap();
    let plain = server
        .create(
            Resource::Pods,
            &in_gang(
                pod(NS, "mix-gpu", "tessera", Shape::Whole(1), 1000, 1024, 0),
                "mix",
            ),
        )
        .unwrap();
    let plain_uid = plain["metadata"]["uid"].as_str().unwrap().to_string();
    let claimer_uid = claim_member(&server, "mix", "mix-claim", "c1");
    let inventories: Vec<tessera_api::GpuNode> = server.objects(Resource::GpuNodes);
    let mut l = standalone_loop(server);
    {
        let mut m = l.mirror.lock();
        for gn in inventories {
            m.upsert_inventory(gn);
        }
        m.replace_pod_groups(vec![gang_group("mix", 2)]);
    }
    l.standalone.pass().await;
    l.standalone.flush().await;
    for (pod, uid) in [("mix-gpu", &plain_uid), ("mix-claim", &claimer_uid)] {
        assert_eq!(bound_to(&l.server, pod), None, "{pod}");
        assert!(l.mirror.lock().held(uid).is_none(), "{pod} held");
        let said = notes(&l.server, pod);
        assert!(
            said.iter().any(|n| n.contains("gang ml/mix does not fit")
                && n.contains("member ml/mix-claim does not fit")),
            "{pod}: {said:?}"
        );
    }
    assert!(devices(&get(&l.server, Resource::Claims, "c1")).is_empty());
    add_dra_node(&l, "node-b", 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(
        bound_to(&l.server, "mix-gpu").as_deref(),
        Some("gpu-node-0")
    );
    assert_eq!(bound_to(&l.server, "mix-claim").as_deref(), Some("node-b"));
    let c1 = get(&l.server, Resource::Claims, "c1");
    assert_eq!(devices(&c1), [("node-b".to_string(), "gpu-0".to_string())]);
    assert_eq!(reserved_uids(&c1), [claimer_uid]);
    assert!(written_before_binding(&l.server, "c1", "mix-claim"));
}

/// Without `--dra`, a gang member with claims is refused with the single
/// pod's sentence, and its gang waits: nothing is bound or allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dra_a_gang_with_claims_waits_saying_why() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 4)]);
    for i in 0..2 {
        claim_member(&server, "off", &format!("off-{i}"), &format!("c{i}"));
    }
    let mut l = standalone_loop(server);
    l.standalone = l.standalone.with_dra(Dra::Off);
    l.mirror
        .lock()
        .replace_pod_groups(vec![gang_group("off", 2)]);
    l.standalone.pass().await;
    l.standalone.flush().await;
    for i in 0..2 {
        let pod = format!("off-{i}");
        assert_eq!(bound_to(&l.server, &pod), None);
        assert!(devices(&get(&l.server, Resource::Claims, &format!("c{i}"))).is_empty());
        let said = notes(&l.server, &pod);
        assert!(
            said.iter().any(|n| n.contains("gang ml/off does not fit")
                && n.contains("allocates them only when run with --dra")),
            "{pod}: {said:?}"
        );
    }
}

// ---- preemption ----

/// The eviction requests a client sent: path and JSON body.
type Evictions = Arc<std::sync::Mutex<Vec<(String, Value)>>>;

/// A client of `server` that keeps every eviction's body (the double's
/// write log has none) before passing the request on unchanged.
fn recording_client(server: &ApiServer) -> (kube::Client, Evictions) {
    let (inner, _session) = server.service();
    let seen: Evictions = Arc::default();
    let log = seen.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let mut inner = inner.clone();
        let log = log.clone();
        async move {
            if !req.uri().path().ends_with("/eviction") {
                return tower::Service::call(&mut inner, req).await;
            }
            let (parts, body) = req.into_parts();
            let bytes = http_body_util::BodyExt::collect(body)
                .await
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            log.lock()
                .unwrap()
                .push((parts.uri.path().to_string(), json));
            let req = http::Request::from_parts(parts, kube::client::Body::from(bytes));
            tower::Service::call(&mut inner, req).await
        }
    });
    (kube::Client::new(service, "default"), seen)
}

/// [`standalone_loop`] whose client records evictions, with the
/// PodDisruptionBudgets `pdbs` listed in the mirror (`None`: not listed yet).
fn preempting_loop(
    server: ApiServer,
    pdbs: Option<Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>>,
) -> (Loop, Evictions) {
    let mut m = mirror_of(&server);
    if let Some(pdbs) = pdbs {
        m.replace_pdbs(pdbs);
    }
    let (client, evictions) = recording_client(&server);
    (loop_with(server, m, client), evictions)
}

/// Pod `name` of `priority`, bound to node-a and running for an hour (the
/// kubelet's status), its claim `name`-gpu allocated node-a's gpu-0 and
/// reserved for it (what Tessera wrote when it placed it); its UID.
async fn running_on_node_a(server: &ApiServer, name: &str, priority: i32) -> String {
    holding(server, NS, name, priority, 0).await
}

/// Pod `name` of `priority` asking one GPU through its claim `name`-gpu; its UID.
fn waiting_for_one_gpu(server: &ApiServer, name: &str, priority: i32) -> String {
    waiting_in(server, NS, name, priority)
}

/// Pod `ns/name` of `priority` asking one GPU through its claim `name`-gpu; its UID.
fn waiting_in(server: &ApiServer, ns: &str, name: &str, priority: i32) -> String {
    one_gpu_pod(server, ns, name, &format!("{name}-gpu"), |p| {
        p["spec"]["priority"] = json!(priority);
    })
}

fn eviction_writes(server: &ApiServer) -> Vec<(String, u16)> {
    server
        .writes()
        .into_iter()
        .filter(|w| w.subresource == "eviction")
        .map(|w| (w.name, w.status))
        .collect()
}

/// A one-GPU node whose GPU a low-priority pod's claim holds; a
/// high-priority pod's one-GPU claim fits nowhere. The low pod is evicted
/// (eviction API, its UID as precondition) and both pods' events say so; a
/// later pass waits for it instead of evicting again. The test then does what
/// the kubelet and the resourceclaim controller would (the double runs
/// neither): the pod goes, and its claim, reserved for nobody, loses its
/// allocation. The high pod's claim then gets the GPU and the pod is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_pod_evicts_the_claim_holder_and_then_runs() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 1)]);
    let low = running_on_node_a(&server, "low", 0).await;
    let high = waiting_for_one_gpu(&server, "high", 1000);
    let (mut l, evictions) = preempting_loop(server, Some(vec![]));
    l.standalone.pass().await;
    l.standalone.flush().await;
    let sent = evictions.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, "/api/v1/namespaces/ml/pods/low/eviction");
    assert_eq!(sent[0].1["kind"], "Eviction", "{:?}", sent[0].1);
    assert_eq!(
        sent[0].1["deleteOptions"]["preconditions"]["uid"],
        json!(low)
    );
    assert_eq!(eviction_writes(&l.server), [("low".to_string(), 201)]);
    let evicted = get(&l.server, Resource::Pods, "low");
    assert!(
        evicted.pointer("/metadata/deletionTimestamp").is_some(),
        "a bound pod terminates gracefully: {evicted}"
    );
    assert_eq!(
        bound_to(&l.server, "high"),
        None,
        "not before the victim is gone"
    );
    assert!(devices(&get(&l.server, Resource::Claims, "high-gpu")).is_empty());
    let said = notes(&l.server, "high");
    assert!(
        said.iter()
            .any(|n| n.contains("preempting lower-priority pods on node node-a: evicted ml/low")),
        "{said:?}"
    );
    assert!(
        notes(&l.server, "low")
            .iter()
            .any(|n| n.contains("evicted by Tessera for ml/high")),
        "{:?}",
        notes(&l.server, "low")
    );
    // The watch shows the victim terminating; past the backoff, the next
    // pass waits for it rather than evicting again.
    l.mirror
        .lock()
        .upsert_pod(serde_json::from_value(evicted).unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(
        evictions.lock().unwrap().len(),
        1,
        "one eviction, not one per pass"
    );
    // The kubelet: the pod is gone. The resourceclaim controller: the claim
    // is reserved for nobody, so its allocation is removed.
    let (client, _s) = l.server.client();
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), NS);
    pods.delete("low", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let claims: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client, NS, &tessera_k8s::dra::write::claims_resource());
    claims
        .patch_status(
            "low-gpu",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"reservedFor": null, "allocation": null}})),
        )
        .await
        .unwrap();
    l.mirror.lock().remove_pod(&low);
    refresh(&l.server, &l.view);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(bound_to(&l.server, "high").as_deref(), Some("node-a"));
    let c = get(&l.server, Resource::Claims, "high-gpu");
    assert_eq!(devices(&c), [("node-a".to_string(), "gpu-0".to_string())]);
    assert_eq!(reserved_uids(&c), [high]);
    assert_eq!(evictions.lock().unwrap().len(), 1);
}

/// Nothing is evicted for a pod of the same priority as the holder, nor
/// when the holder's PodDisruptionBudget allows no disruption, nor before
/// the budgets are listed: the pod waits with the claims' sentence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_eviction_for_equal_priority_a_closed_budget_or_unlisted_budgets() {
    let closed = serde_json::from_value(json!({
        "metadata": {"name": "guard-low", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "low"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
            "expectedPods": 1}}))
    .unwrap();
    let cases = [
        ("equal priority", 1000, Some(vec![])),
        ("a budget allowing none", 0, Some(vec![closed])),
        ("budgets not listed", 0, None),
    ];
    for (case, low_priority, pdbs) in cases {
        let server = ApiServer::new(Config::default());
        cluster(&server, &[("node-a", 1)]);
        running_on_node_a(&server, "low", low_priority).await;
        waiting_for_one_gpu(&server, "high", 1000);
        let (mut l, evictions) = preempting_loop(server, pdbs);
        l.standalone.pass().await;
        l.standalone.flush().await;
        assert!(evictions.lock().unwrap().is_empty(), "{case}");
        assert!(eviction_writes(&l.server).is_empty(), "{case}");
        assert_eq!(bound_to(&l.server, "high"), None, "{case}");
        let said = notes(&l.server, "high");
        assert!(
            said.iter()
                .any(|n| n.contains("0/1 nodes can take the pod's ResourceClaims")),
            "{case}: {said:?}"
        );
        assert!(
            !said.iter().any(|n| n.contains("preempting")),
            "{case}: {said:?}"
        );
    }
}

// ---- reclaim ----

/// The namespaces of queues `queue-a` and `queue-b`, and one in no queue.
const NS_A: &str = "team-a";
const NS_B: &str = "team-b";
const NS_FREE: &str = "free";

/// Queues `queue-a` and `queue-b`, each guaranteed 1 GPU (and the node's
/// CPU and memory, so only GPUs count), joined by namespaces `team-a` and
/// `team-b`; `free` joins none.
fn two_queues(m: &mut Mirror) {
    let queue = |name: &str| {
        let guaranteed = QueueResources {
            gpus: Some("1".into()),
            cpu: Some("64".into()),
            memory: Some("512Gi".into()),
        };
        GpuQueue::new(
            name,
            GpuQueueSpec {
                guaranteed,
                ..Default::default()
            },
        )
    };
    m.replace_queues(vec![queue("queue-a"), queue("queue-b")]);
    let ns = |name: &str, queue: Option<&str>| {
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.into());
        ns.metadata.labels =
            queue.map(|q| [("tessera.io/queue".to_string(), q.to_string())].into());
        ns
    };
    m.replace_namespaces(vec![
        ns(NS_A, Some("queue-a")),
        ns(NS_B, Some("queue-b")),
        ns(NS_FREE, None),
    ]);
}

/// Pod `ns/name` of `priority` (label `app: name`), running for an hour on
/// node-a (the kubelet's status), its claim `name`-gpu allocated node-a's
/// `gpu` and reserved for it (what Tessera wrote when it placed it); its UID.
async fn holding(server: &ApiServer, ns: &str, name: &str, priority: i32, gpu: usize) -> String {
    let mut p = pod_with_claims(ns, name, &[("gpu", Ok(&format!("{name}-gpu")))]);
    p["spec"]["priority"] = json!(priority);
    p["spec"]["nodeName"] = json!("node-a");
    p["metadata"]["labels"] = json!({"app": name});
    let uid = server.create(Resource::Pods, &p).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let hour_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    let (client, _s) = server.client();
    let pods: kube::Api<Pod> = kube::Api::namespaced(client, ns);
    pods.patch_status(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"phase": "Running",
            "startTime": hour_ago.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}})),
    )
    .await
    .unwrap();
    let c = allocated_claim(
        ns,
        &format!("{name}-gpu"),
        "node-a",
        &format!("gpu-{gpu}"),
        name,
        &uid,
    );
    server.create(Resource::Claims, &c).unwrap();
    uid
}

/// Pod `team-a/a1` of priority 0 (below every holder's) asking one GPU
/// through its claim `a1-gpu`; its UID.
fn a1_waiting(server: &ApiServer) -> String {
    waiting_in(server, NS_A, "a1", 0)
}

fn stored(server: &ApiServer, r: Resource, ns: &str, name: &str) -> Value {
    server
        .get(r, ns, name)
        .unwrap_or_else(|| panic!("{ns}/{name} stored"))
}

/// Two queues guaranteed 1 GPU each on a 2-GPU node; queue-b's pods (priority
/// 1000) hold both GPUs, borrowing one. Pod team-a/a1 (priority 0) asks one
/// GPU: its queue is within its guarantee, so it reclaims what queue-b
/// borrows: exactly one queue-b pod is evicted (UID precondition), whatever
/// the priorities, and the events say reclaim. Once the victim is gone and
/// its claim released (what the kubelet and the resourceclaim controller
/// would do), a1's claim gets the freed GPU and a1 is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_within_its_guarantee_reclaims_one_borrowed_gpu() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2)]);
    let b1 = holding(&server, NS_B, "b1", 1000, 0).await;
    let b2 = holding(&server, NS_B, "b2", 1000, 1).await;
    let a1 = a1_waiting(&server);
    let (mut l, evictions) = preempting_loop(server, Some(vec![]));
    two_queues(&mut l.mirror.lock());
    l.standalone.pass().await;
    l.standalone.flush().await;
    let sent = evictions.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "only what queue-b borrows: {sent:?}");
    let (victim, victim_uid, stays) = if sent[0].0.ends_with("/b1/eviction") {
        ("b1", &b1, "b2")
    } else {
        ("b2", &b2, "b1")
    };
    assert_eq!(
        sent[0].0,
        format!("/api/v1/namespaces/{NS_B}/pods/{victim}/eviction")
    );
    assert_eq!(
        sent[0].1["deleteOptions"]["preconditions"]["uid"],
        json!(victim_uid)
    );
    assert_eq!(eviction_writes(&l.server), [(victim.to_string(), 201)]);
    let evicted = stored(&l.server, Resource::Pods, NS_B, victim);
    assert!(evicted.pointer("/metadata/deletionTimestamp").is_some());
    let kept = stored(&l.server, Resource::Pods, NS_B, stays);
    assert!(kept.pointer("/metadata/deletionTimestamp").is_none());
    let said = notes(&l.server, "a1");
    let reclaiming = format!("reclaiming borrowed quota on node node-a: evicted {NS_B}/{victim}");
    assert!(said.iter().any(|n| n.contains(&reclaiming)), "{said:?}");
    let victim_said = notes(&l.server, victim);
    assert!(
        victim_said
            .iter()
            .any(|n| n.contains("evicted by Tessera for team-a/a1")
                && n.contains("reclaiming borrowed quota")),
        "{victim_said:?}"
    );
    // The watch shows the victim terminating: the next pass waits for it.
    l.mirror
        .lock()
        .upsert_pod(serde_json::from_value(evicted).unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(evictions.lock().unwrap().len(), 1, "one eviction in all");
    // The kubelet and the resourceclaim controller.
    let (client, _s) = l.server.client();
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), NS_B);
    pods.delete(victim, &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let claims: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client, NS_B, &tessera_k8s::dra::write::claims_resource());
    claims
        .patch_status(
            &format!("{victim}-gpu"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"reservedFor": null, "allocation": null}})),
        )
        .await
        .unwrap();
    l.mirror.lock().remove_pod(victim_uid);
    refresh(&l.server, &l.view);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    let placed = stored(&l.server, Resource::Pods, NS_A, "a1");
    assert_eq!(node_of(&placed), Some("node-a"), "{placed}");
    let c = stored(&l.server, Resource::Claims, NS_A, "a1-gpu");
    let freed = if victim == "b1" { "gpu-0" } else { "gpu-1" };
    assert_eq!(devices(&c), [("node-a".to_string(), freed.to_string())]);
    assert_eq!(reserved_uids(&c), [a1]);
    assert_eq!(evictions.lock().unwrap().len(), 1);
}

/// No reclaim: when queue-b holds only its guarantee (its one GPU; the
/// other is held by a pod in no queue, never reclaimed), and when queue-a
/// would borrow (it holds its guarantee already through a0, of a priority
/// above a1's, on a 3-GPU node where queue-b borrows one). a1 waits with the
/// claims' sentence and nobody is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reclaim_from_a_queue_at_its_guarantee_or_for_a_borrowing_queue() {
    type Holder = (&'static str, &'static str, usize);
    let cases: [(&str, u32, &[Holder]); 2] = [
        (
            "queue-b at its guarantee",
            2,
            &[(NS_B, "b1", 0), (NS_FREE, "f1", 1)],
        ),
        (
            "queue-a would borrow",
            3,
            &[(NS_B, "b1", 0), (NS_B, "b2", 1), (NS_A, "a0", 2)],
        ),
    ];
    for (case, gpus, holders) in cases {
        let server = ApiServer::new(Config::default());
        cluster(&server, &[("node-a", gpus)]);
        for (ns, name, gpu) in holders {
            holding(&server, ns, name, 1000, *gpu).await;
        }
        a1_waiting(&server);
        let (mut l, evictions) = preempting_loop(server, Some(vec![]));
        two_queues(&mut l.mirror.lock());
        l.standalone.pass().await;
        l.standalone.flush().await;
        assert!(evictions.lock().unwrap().is_empty(), "{case}");
        assert!(eviction_writes(&l.server).is_empty(), "{case}");
        let waiting = stored(&l.server, Resource::Pods, NS_A, "a1");
        assert_eq!(node_of(&waiting), None, "{case}");
        let said = notes(&l.server, "a1");
        assert!(
            said.iter()
                .any(|n| n.contains("0/1 nodes can take the pod's ResourceClaims")),
            "{case}: {said:?}"
        );
        assert!(
            !said.iter().any(|n| n.contains("reclaiming")),
            "{case}: {said:?}"
        );
    }
}

/// Issue 41, defect 5: claim writes were fenced by one `is_leader()` check
/// and then allowed 10 s, so a leader about to lapse could write an
/// allocation after another replica took over. They are fenced as Bindings
/// are: a leader with less than the least write window left starts none (the
/// hold is given back, nothing is written), and one with more writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_near_its_deadline_writes_no_claim() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 1)]);
    let uid = one_gpu_pod(&server, NS, "p1", "c1", |_| {});
    let mut l = standalone_loop(server);
    let now = tokio::time::Instant::now();
    l.standalone
        .binder
        .leadership()
        .set_until(true, Some(now + Duration::from_millis(300)));
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert!(
        !l.server
            .writes()
            .iter()
            .any(|w| w.resource == "resourceclaims"),
        "a claim write started with 0.3 s of leadership left: {:?}",
        l.server.writes()
    );
    assert!(devices(&get(&l.server, Resource::Claims, "c1")).is_empty());
    assert_eq!(bound_to(&l.server, "p1"), None);
    assert!(
        l.mirror.lock().held(&uid).is_none(),
        "the hold is given back"
    );
    // Renewed: the next try writes and binds.
    l.standalone.binder.leadership().set_until(
        true,
        Some(tokio::time::Instant::now() + Duration::from_secs(10)),
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(bound_to(&l.server, "p1").as_deref(), Some("node-a"));
    assert_eq!(devices(&get(&l.server, Resource::Claims, "c1")).len(), 1);
}

/// Issue 41, defect 4: the overlay dropped confirmed writes at its 30 s
/// deadline, so with the claims watch stalled the GPU of a landed allocation
/// was handed to a second claim. Past the deadline, the second pod still does
/// not get it; once the watch shows the first claim, nothing is assumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_write_outlives_the_deadline_while_the_watch_stalls() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 1)]);
    for i in 1..=2 {
        one_gpu_pod(&server, NS, &format!("p{i}"), &format!("c{i}"), |_| {});
    }
    let mut l = standalone_loop(server);
    l.standalone.pass().await;
    l.standalone.flush().await;
    let later = tokio::time::Instant::now() + tessera_k8s::dra::overlay::ASSUME_TTL * 3;
    l.view.lock().expire(later);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    l.standalone.flush().await;
    let alloc: Vec<usize> = ["c1", "c2"]
        .iter()
        .map(|c| devices(&get(&l.server, Resource::Claims, c)).len())
        .collect();
    assert_eq!(
        alloc.iter().sum::<usize>(),
        1,
        "one GPU, given once: {alloc:?}"
    );
    refresh(&l.server, &l.view);
    assert_eq!(l.view.lock().assumed(), 0, "the watch caught up");
    drop(l.mirror);
}

/// A DRA pod's GPUs are in its claims, not its resources: the learning
/// `tessera` policy learns the pod once, at its first decision, with the GPU
/// its claim asks (before, claim pods were never learned: the workload the
/// policy measures fragmentation against held none of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_pod_is_learned_once_with_the_gpus_its_claim_asks() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2)]);
    for i in 1..=3 {
        one_gpu_pod(&server, NS, &format!("p{i}"), &format!("c{i}"), |_| {});
    }
    let nodes: Vec<Node> = server.objects(Resource::Nodes);
    let pods: Vec<Pod> = server.objects(Resource::Pods);
    let policy = policy::by_name("tessera", &PolicyArgs::default()).unwrap();
    let mirror = Mirror::from_objects(policy, KEY.to_vec(), nodes, vec![], pods);
    let (client, _session) = server.client();
    let mut l = loop_with(server, mirror, client);
    let before = l.mirror.lock().learned().0;
    l.standalone.pass().await;
    l.standalone.flush().await;
    let bound = ["p1", "p2", "p3"]
        .iter()
        .filter(|p| bound_to(&l.server, p).is_some())
        .count();
    assert_eq!(bound, 2, "two GPUs, three pods");
    assert_eq!(l.mirror.lock().learned().0, before + 3, "each pod learned");
    // The pod that waits is decided again: not learned twice.
    for _ in 0..2 {
        refresh(&l.server, &l.view);
        l.standalone.pass().await;
        l.standalone.flush().await;
    }
    assert_eq!(l.mirror.lock().learned().0, before + 3, "each pod once");
}

/// The standalone loop over `server`, whose node-a also has the `GpuNode` the
/// node agent published before the node moved to DRA: `gpus` GPUs by the
/// UUIDs its slice's devices carry ([`slice`]).
fn loop_in_both_worlds(server: ApiServer, gpus: u32) -> Loop {
    let inventory = GpuNode::new(
        "node-a",
        GpuNodeSpec {
            node_name: "node-a".into(),
            gpus: (0..gpus)
                .map(|index| GpuDevice {
                    index,
                    uuid: format!("GPU-node-a-{index}"),
                    model: "A100-80GB".into(),
                    memory_mib: 81920,
                    sm_count: 108,
                    ..Default::default()
                })
                .collect(),
        },
    );
    let policy = policy::by_name("binpack", &PolicyArgs::default()).unwrap();
    let mirror = Mirror::from_objects(
        policy,
        KEY.to_vec(),
        server.objects::<Node>(Resource::Nodes),
        vec![inventory],
        server.objects::<Pod>(Resource::Pods),
    );
    let (client, _session) = server.client();
    loop_with(server, mirror, client)
}

/// GPUs granted to `tessera.io` pods, by position on their node (the ledger's
/// allocations that count claims left out).
fn granted_gpus(l: &Loop) -> Vec<u8> {
    let mut m = l.mirror.lock();
    let (_, grants) = m.grants();
    let mut gpus: Vec<u8> = grants
        .flat_map(|(_, p)| p.grants.iter().map(|g| g.gpu).collect::<Vec<_>>())
        .collect();
    gpus.sort_unstable();
    gpus
}

/// A node whose GpuNode still lists its GPUs when its slices appear (moved to
/// DRA without draining, issue 41 defect 9 on the scheduler's side): a GPU a
/// `tessera.io/gpu` pod was granted is not given to a claim too. Of two
/// one-GPU claim pods on a node with two GPUs, one of which the grant holds,
/// exactly one claim is allocated, on the other GPU; the second pod waits.
/// Fails if standalone's DRA decision does not add `grant_holdings` to what
/// claims hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_granted_to_a_device_plugin_pod_is_not_given_to_a_claim() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2)]);
    server
        .create(
            Resource::Pods,
            &pod(NS, "granted", "tessera", Shape::Whole(1), 100, 128, 0),
        )
        .unwrap();
    let mut l = loop_in_both_worlds(server, 2);
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(bound_to(&l.server, "granted").as_deref(), Some("node-a"));
    let granted: Pod = serde_json::from_value(get(&l.server, Resource::Pods, "granted")).unwrap();
    l.mirror.lock().upsert_pod(granted);

    for i in 1..=2 {
        one_gpu_pod(&l.server, NS, &format!("p{i}"), &format!("c{i}"), |_| {});
    }
    let pods: Vec<Pod> = l.server.objects(Resource::Pods);
    for p in pods {
        l.mirror.lock().upsert_pod(p);
    }
    refresh(&l.server, &l.view);
    for _ in 0..2 {
        l.standalone.pass().await;
        l.standalone.flush().await;
        refresh(&l.server, &l.view);
    }
    let alloc: Vec<Vec<(String, String)>> = ["c1", "c2"]
        .iter()
        .map(|c| devices(&get(&l.server, Resource::Claims, c)))
        .collect();
    let given: Vec<&(String, String)> = alloc.iter().flatten().collect();
    assert_eq!(given.len(), 1, "one GPU left for claims: {alloc:?}");
    let bound: Vec<bool> = ["p1", "p2"]
        .iter()
        .map(|p| bound_to(&l.server, p).is_some())
        .collect();
    assert_eq!(bound.iter().filter(|b| **b).count(), 1, "{bound:?}");
    // The claim got the GPU the grant does not hold.
    let grants = granted_gpus(&l);
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert_ne!(given[0].1, format!("gpu-{}", grants[0]), "{alloc:?}");
}

/// The other way round: on a node in both worlds, a GPU an allocated claim
/// holds is counted in the ledger, so no `tessera.io` pod is granted it. With
/// another scheduler's claim on gpu-0 of two GPUs, a pod asking two whole
/// GPUs waits and a pod asking one gets gpu-1. Fails if the claims' holdings
/// are not told to the mirror (`Mirror::set_claims_on_gpus`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_a_claim_holds_is_not_granted_to_a_device_plugin_pod() {
    let server = ApiServer::new(Config::default());
    cluster(&server, &[("node-a", 2)]);
    let held = allocated_claim(NS, "held", "node-a", "gpu-0", "other", "uid-other");
    server.create(Resource::Claims, &held).unwrap();
    for (name, gpus) in [("two", 2), ("one", 1)] {
        let p = pod(NS, name, "tessera", Shape::Whole(gpus), 100, 128, 0);
        server.create(Resource::Pods, &p).unwrap();
    }
    let mut l = loop_in_both_worlds(server, 2);
    l.standalone.pass().await;
    l.standalone.flush().await;
    assert_eq!(bound_to(&l.server, "one").as_deref(), Some("node-a"));
    assert_eq!(bound_to(&l.server, "two"), None, "only gpu-1 is free");
    assert_eq!(granted_gpus(&l), [1], "the claim holds gpu-0");
    // The claim is untouched.
    assert_eq!(
        devices(&get(&l.server, Resource::Claims, "held")),
        [("node-a".to_string(), "gpu-0".to_string())]
    );
}

/// Both kinds decided in one pass, before any watch shows the other's write
/// (found on a real 1.36 control plane by the e2e `dra_handover`: a claim and
/// a `tessera.io` share were both given GPU 0). On a node in both worlds with
/// one GPU, a one-GPU claim pod and a one-GPU `tessera.io` pod, created in
/// either order and tried in the same pass: exactly one of them holds the
/// GPU. Fails if a DRA decision does not tell the mirror the allocation it
/// just assumed (the ledger then grants the claim's GPU), or if a grant
/// reserved in the pass is not in what the next claim decision counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_pod_and_a_device_plugin_pod_tried_in_one_pass_do_not_share_a_gpu() {
    for claim_first in [true, false] {
        let server = ApiServer::new(Config::default());
        cluster(&server, &[("node-a", 1)]);
        let plugin = || pod(NS, "plugin", "tessera", Shape::Whole(1), 100, 128, 0);
        if !claim_first {
            server.create(Resource::Pods, &plugin()).unwrap();
        }
        one_gpu_pod(&server, NS, "claimer", "c1", |_| {});
        if claim_first {
            server.create(Resource::Pods, &plugin()).unwrap();
        }
        let mut l = loop_in_both_worlds(server, 1);
        refresh(&l.server, &l.view);
        l.standalone.pass().await;
        l.standalone.flush().await;
        let claimed = devices(&get(&l.server, Resource::Claims, "c1"));
        let granted = granted_gpus(&l);
        let bound: Vec<&str> = ["claimer", "plugin"]
            .into_iter()
            .filter(|p| bound_to(&l.server, p).is_some())
            .collect();
        assert_eq!(
            claimed.len() + granted.len(),
            1,
            "claim first: {claim_first}: one GPU, held once: claim {claimed:?}, grants {granted:?}, bound {bound:?}"
        );
        assert_eq!(bound.len(), 1, "claim first: {claim_first}: {bound:?}");
    }
}

/// Found by `dra_crash_restart` (seed 24, under load): a claim whose first
/// write failed with its outcome unknown is written again when its pod is
/// tried next. That second write was not assumed: only the entry of unknown
/// outcome counted the devices, and it ends once the watch shows the claim
/// changed since it was read, which the second write's own delete
/// protection does. So while that second write's status patch was on its
/// way, another claim was given the same GPU, and both were allocated.
/// Here: every request takes 200 ms; p1's first write (its delete
/// protection) is answered 500; p1 is tried again, and 300 ms later, when
/// the protection has landed and the allocation is still on its way, the
/// view catches up with the server and a second pod asks for the GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_written_again_keeps_its_gpu_while_the_write_is_on_its_way() {
    use apiserver::Fault;
    let server = ApiServer::new(Config {
        latency: (Duration::from_millis(200), Duration::from_millis(200)),
        ..Config::default()
    });
    cluster(&server, &[("node-a", 1)]);
    one_gpu_pod(&server, NS, "p1", "c1", |_| {});
    let (client, session) = server.client();
    let mirror = mirror_of(&server);
    let mut l = loop_with(server, mirror, client);
    // The first write of the pass: p1's claim's delete protection, refused
    // with a 500 (nothing written, outcome unknown to the client).
    session.fault(session.writes() + 1, Fault::Fail);
    l.standalone.pass().await;
    l.standalone.flush().await;
    let failed: Vec<String> = l
        .server
        .writes()
        .iter()
        .filter(|w| w.status == 500)
        .map(|w| format!("{} {}/{}", w.method, w.resource, w.name))
        .collect();
    assert_eq!(
        failed,
        vec!["PATCH resourceclaims/c1".to_string()],
        "the fault hit p1's claim"
    );
    assert!(devices(&get(&l.server, Resource::Claims, "c1")).is_empty());
    // p1 again, after its backoff: its claim is written again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    l.standalone.pass().await;
    // Its protection has landed (200 ms), its allocation is on its way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    one_gpu_pod(&l.server, NS, "p2", "c2", |_| {});
    let p2: Pod = serde_json::from_value(get(&l.server, Resource::Pods, "p2")).unwrap();
    l.mirror.lock().upsert_pod(p2);
    refresh(&l.server, &l.view);
    l.standalone.pass().await;
    l.standalone.flush().await;
    let c1 = devices(&get(&l.server, Resource::Claims, "c1"));
    let c2 = devices(&get(&l.server, Resource::Claims, "c2"));
    assert_eq!(c1.len(), 1, "p1's claim is allocated in the end: {c1:?}");
    assert!(
        c2.is_empty(),
        "the GPU of p1's claim went to p2's too: c1 {c1:?}, c2 {c2:?}"
    );
}
