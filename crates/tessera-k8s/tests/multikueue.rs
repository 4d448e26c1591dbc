//! Tessera as the scheduler of a MultiKueue worker: the admission check
//! `tessera.io/placement` on Kueue's `Workload`s (`kueue.x-k8s.io/v1beta1`,
//! shaped as Kueue v0.19.2's API server returns them) and the quota rule
//! that keeps Kueue-admitted pods from being counted by two quotas.
//!
//! - The check's answers ([`check::judge`], on a mirror built as a fresh
//!   process lists the cluster): a fragmented cluster where Kueue's integer
//!   count admits an 8-GPU workload no node can place keeps the check
//!   Pending, naming why; Ready once pods leave, and on an unfragmented
//!   cluster; shares judged per GPU; podSets that fit alone but not
//!   together; workloads that would take the same room; a workload told
//!   Ready whose pods are not all placed keeps its room (once, not twice);
//!   an ask that cannot be read is Rejected.
//! - The controller over the API-server double ([`controller::pass`]):
//!   nothing written before the sync gate opens; the AdmissionCheck marked
//!   Active; the check written with the workload's resourceVersion; a write
//!   from a stale view refused with 409, the object read again and judged
//!   afresh, Kueue's own change kept.
//! - `tessera kueue-admission` as it runs ([`controller::run`]): its own
//!   watchers, Ready once they are in.
//! - Quota: with `--trust-kueue-admission` a Kueue-admitted pod passes the
//!   GpuQueue gate and still counts in usage; without it, it is refused.

mod apiserver;
mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_core::allocation::ANNOTATION;
use tessera_k8s::convert;
use tessera_k8s::gate::{Kind, SyncGate};
use tessera_k8s::kueue::api::{CheckState, Workload};
use tessera_k8s::kueue::check::{self, Started};
use tessera_k8s::kueue::controller::{self, SharedObjects};
use tessera_k8s::kueue::{CONTROLLER_NAME, PODSET_LABEL};
use tessera_k8s::mirror::{QuotaCheck, Reservation, SharedMirror};
use tessera_k8s::standalone::node_allows;

const CHECK: &str = "tessera-placement";
const T0: &str = "2026-12-07T10:00:00Z";

/// A podSet: its name, count and one container's requests.
type PodSetAsk<'a> = (&'a str, i32, &'a [(&'a str, &'a str)]);

/// A container's requests, as a pod template carries them.
fn container(requests: &[(&str, &str)]) -> Value {
    let requests: serde_json::Map<String, Value> = requests
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "name": "main",
        "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
        "resources": {"requests": requests, "limits": requests}
    })
}

/// A Workload as Kueue v0.19.2 creates it for a `batch/v1` Job `name`
/// (owner reference to the Job, `kueue.x-k8s.io/job-uid` label), one podSet
/// per `(name, count, requests)`.
fn workload_spec(ns: &str, name: &str, podsets: &[PodSetAsk<'_>]) -> Value {
    let pod_sets: Vec<Value> = podsets
        .iter()
        .map(|(ps, count, req)| {
            json!({
                "name": ps,
                "count": count,
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "containers": [container(req)],
                        "restartPolicy": "Never",
                        "schedulerName": "tessera",
                        "dnsPolicy": "ClusterFirst",
                        "terminationGracePeriodSeconds": 30
                    }
                }
            })
        })
        .collect();
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": format!("job-{name}-3f1a2"),
            "namespace": ns,
            "labels": {"kueue.x-k8s.io/job-uid": format!("uid-job-{name}")},
            "annotations": {"kueue.x-k8s.io/job-owner-gvk": "batch/v1, Kind=Job"},
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": name,
                "uid": format!("uid-job-{name}"), "controller": true, "blockOwnerDeletion": true
            }],
            "finalizers": ["kueue.x-k8s.io/resource-in-use"]
        },
        "spec": {
            "active": true,
            "queueName": "user-queue",
            "priority": 0,
            "priorityClassSource": "",
            "podSets": pod_sets
        }
    })
}

/// The status Kueue writes when it reserves quota in ClusterQueue `gpu-cq`
/// and adds the ClusterQueue's admission checks as Pending.
fn reserved_status(wl: &Value, check_state: &str) -> Value {
    let podsets = wl["spec"]["podSets"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let assignments: Vec<Value> = podsets
        .iter()
        .map(|ps| {
            json!({
                "name": ps["name"], "count": ps["count"],
                "flavors": {"nvidia.com/gpu": "a100", "tessera.io/gpu": "a100"},
                "resourceUsage": {}
            })
        })
        .collect();
    json!({
        "admission": {"clusterQueue": "gpu-cq", "podSetAssignments": assignments},
        "conditions": [{
            "type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
            "message": "Quota reserved in ClusterQueue gpu-cq",
            "lastTransitionTime": T0, "observedGeneration": 1
        }],
        "admissionChecks": [{
            "name": CHECK, "state": check_state, "message": "",
            "lastTransitionTime": T0
        }],
        "resourceRequests": [],
        "requeueState": {"count": 0}
    })
}

/// A Workload with quota reserved and our check in `state`, as read from the API.
fn reserved(ns: &str, name: &str, podsets: &[PodSetAsk<'_>], state: &str) -> Workload {
    let mut v = workload_spec(ns, name, podsets);
    v["metadata"]["uid"] = json!(format!("uid-wl-{name}"));
    v["metadata"]["resourceVersion"] = json!("100");
    v["metadata"]["creationTimestamp"] = json!(T0);
    v["metadata"]["generation"] = json!(1);
    v["status"] = reserved_status(&v, state);
    serde_json::from_value(v).expect("a Workload as the API returns it")
}

/// Places `p` as the scheduler does (decide, reserve: the grant is signed)
/// and returns it as the API server holds it once bound.
fn place(m: &SharedMirror, mut p: Pod) -> Pod {
    let mut g = m.lock();
    let asks = convert::pod_asks(&p, &g.cluster().catalog);
    let (req, host) = (asks.request.expect("request"), asks.host.expect("host"));
    let (placement, _) = g
        .decide(&req, &host, |f| node_allows(&p, f))
        .unwrap_or_else(|e| panic!("{e}"));
    let node = g.cluster().node(placement.node).name.clone();
    let Reservation::Write { annotation } = g.reserve(&p, &node).expect("decided, so it fits")
    else {
        panic!("a fresh pod")
    };
    if let Some(a) = annotation {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION.to_string(), a);
    }
    p.spec.as_mut().unwrap().node_name = Some(node);
    g.upsert_pod(p.clone());
    p
}

/// One GPU taken on node `node` (pinned by its hostname label).
fn one_gpu_on(node: &str) -> Pod {
    let mut p = pod(
        "other",
        &format!("one-{node}"),
        &format!("uid-one-{node}"),
        &[("nvidia.com/gpu", "1")],
    );
    p.spec.as_mut().unwrap().node_selector =
        Some([("kubernetes.io/hostname".to_string(), node.to_string())].into());
    p
}

/// Two nodes of eight A100-80GB.
fn two_eights(pods: Vec<Pod>) -> SharedMirror {
    mirror(
        "tessera",
        vec![
            kube_node("gpu-a", "64", "512Gi"),
            kube_node("gpu-b", "64", "512Gi"),
        ],
        vec![
            gpu_node("gpu-a", "A100-80GB", 81_920, 8),
            gpu_node("gpu-b", "A100-80GB", 81_920, 8),
        ],
        pods,
    )
}

/// The same cluster as a fresh process lists it, with `fill` bound.
fn relisted(fill: Vec<Pod>) -> SharedMirror {
    let placed = {
        let m = two_eights(vec![]);
        fill.into_iter().map(|p| place(&m, p)).collect()
    };
    two_eights(placed)
}

const EIGHT: &[(&str, &str)] = &[("cpu", "8"), ("memory", "64Gi"), ("nvidia.com/gpu", "8")];

fn judge_one(m: &SharedMirror, wl: &Workload) -> check::Decision {
    check::judge(&mut m.lock(), &[], &[wl]).remove(0)
}

#[test]
fn a_fragmented_worker_keeps_an_8_gpu_workload_pending_until_pods_leave() {
    // One GPU taken on each node: 14 of 16 free, so Kueue's integer quota
    // admits 8 GPUs, but no node has 8 free.
    let m = relisted(vec![one_gpu_on("gpu-a"), one_gpu_on("gpu-b")]);
    let wl = reserved("ml", "train", &[("main", 1, EIGHT)], "Pending");
    let d = judge_one(&m, &wl);
    assert_eq!(d.state, CheckState::Pending, "{d:?}");
    assert!(
        d.message
            .starts_with("podSet main: 0 of 1 pods (8 whole GPU(s)"),
        "{}",
        d.message
    );
    assert!(d.message.contains("0/2 nodes fit"), "{}", d.message);
    // A pod leaves: node gpu-a is whole again.
    m.lock().remove_pod("uid-one-gpu-a");
    let d = judge_one(&m, &wl);
    assert_eq!(d.state, CheckState::Ready, "{d:?}");
    assert_eq!(d.message, "Tessera can place every pod now: 1 × main");
    // Two of them do not fit (only one node is whole).
    let two = reserved("ml", "two", &[("main", 2, EIGHT)], "Pending");
    let d = judge_one(&m, &two);
    assert_eq!(d.state, CheckState::Pending);
    assert!(
        d.message.starts_with("podSet main: 1 of 2 pods"),
        "{}",
        d.message
    );
}

#[test]
fn an_unfragmented_worker_is_ready_at_once() {
    let m = relisted(vec![]);
    let wl = reserved("ml", "train", &[("main", 2, EIGHT)], "Pending");
    assert_eq!(judge_one(&m, &wl).state, CheckState::Ready);
}

#[test]
fn shares_are_judged_per_gpu_not_summed() {
    // One node of two 80 GiB GPUs, 50 GiB taken on each: 60 GiB free in sum
    // (what Kueue counts of tessera.io/gpu-memory), 30 GiB on each GPU.
    fn share(gib: &'static str, cores: &'static str) -> Vec<(&'static str, &'static str)> {
        vec![
            ("tessera.io/gpu", "1"),
            ("tessera.io/gpu-memory", gib),
            ("tessera.io/gpu-cores", cores),
        ]
    }
    let node = || {
        (
            vec![kube_node("gpu-s", "64", "512Gi")],
            vec![gpu_node("gpu-s", "A100-80GB", 81_920, 2)],
        )
    };
    let placed: Vec<Pod> = {
        let (n, inv) = node();
        let m = mirror("tessera", n, inv, vec![]);
        (0..2)
            .map(|i| {
                let r = share("50Gi", "50");
                place(
                    &m,
                    pod("other", &format!("half-{i}"), &format!("uid-half-{i}"), &r),
                )
            })
            .collect()
    };
    let (n, inv) = node();
    let m = mirror("tessera", n, inv, placed);
    let thirty = share("30Gi", "40");
    let fits = reserved("ml", "small", &[("main", 2, &thirty)], "Pending");
    let d = judge_one(&m, &fits);
    assert_eq!(d.state, CheckState::Ready, "{d:?}");
    // 40 GiB is within the summed 60 GiB but on no single GPU.
    let forty = share("40Gi", "40");
    let big = reserved("ml", "big", &[("main", 1, &forty)], "Pending");
    let d = judge_one(&m, &big);
    assert_eq!(d.state, CheckState::Pending, "{d:?}");
    assert!(
        d.message.contains("GPU share(s) of 40960 MiB") && d.message.contains("0/1 nodes fit"),
        "{}",
        d.message
    );
}

#[test]
fn podsets_must_fit_together() {
    let m = relisted(vec![]);
    let one: &[(&str, &str)] = &[("cpu", "1"), ("nvidia.com/gpu", "1")];
    // Each podSet alone fits; a launcher of one GPU and two workers of eight do not.
    let workers = reserved("ml", "w", &[("worker", 2, EIGHT)], "Pending");
    assert_eq!(judge_one(&m, &workers).state, CheckState::Ready);
    let launcher = reserved("ml", "l", &[("launcher", 1, one)], "Pending");
    assert_eq!(judge_one(&m, &launcher).state, CheckState::Ready);
    let mpi = reserved(
        "ml",
        "mpi",
        &[("launcher", 1, one), ("worker", 2, EIGHT)],
        "Pending",
    );
    let d = judge_one(&m, &mpi);
    assert_eq!(d.state, CheckState::Pending, "{d:?}");
    assert!(
        d.message.starts_with("podSet worker: 1 of 2 pods"),
        "{}",
        d.message
    );
    // With one worker it fits: the message lists every podSet.
    let small = reserved(
        "ml",
        "mpi1",
        &[("launcher", 1, one), ("worker", 1, EIGHT)],
        "Pending",
    );
    let d = judge_one(&m, &small);
    assert_eq!(d.state, CheckState::Ready, "{d:?}");
    assert_eq!(
        d.message,
        "Tessera can place every pod now: 1 × launcher, 1 × worker"
    );
}

#[test]
fn workloads_judged_together_never_share_room() {
    let m = relisted(vec![one_gpu_on("gpu-b")]);
    // One whole node: the first workload (in the order given) takes it.
    let first = reserved("ml", "first", &[("main", 1, EIGHT)], "Pending");
    let second = reserved("ml", "second", &[("main", 1, EIGHT)], "Pending");
    let d = check::judge(&mut m.lock(), &[], &[&first, &second]);
    assert_eq!(d[0].state, CheckState::Ready, "{d:?}");
    assert_eq!(d[1].state, CheckState::Pending, "{d:?}");
    // A workload that does not fit takes nothing from the ones after it.
    let huge = reserved("ml", "huge", &[("main", 3, EIGHT)], "Pending");
    let d = check::judge(&mut m.lock(), &[], &[&huge, &first]);
    assert_eq!(d[0].state, CheckState::Pending);
    assert_eq!(d[1].state, CheckState::Ready, "{d:?}");
}

/// The pod Kueue's job controller makes of `wl`'s podSet `ps`: the template
/// with Kueue's podSet label, owned by the Job that owns the workload.
fn job_pod(wl: &Workload, ps: usize, i: usize) -> Pod {
    let mut p = check::podset_pod(wl, &wl.spec.pod_sets[ps]);
    let job = wl.metadata.owner_references.clone().unwrap_or_default();
    p.metadata.name = Some(format!("{}-{i}", job[0].name));
    p.metadata.uid = Some(format!("uid-{}-{i}", job[0].name));
    p.metadata.owner_references = Some(job);
    p
}

#[test]
fn a_ready_workload_keeps_its_room_until_its_pods_are_placed_and_only_once() {
    let m = relisted(vec![]);
    let started = reserved("ml", "started", &[("main", 1, EIGHT)], "Ready");
    let next = reserved("ml", "next", &[("main", 2, EIGHT)], "Pending");
    let s = [Started { workload: &started }];
    // Told Ready, its pod not created yet: one node is spoken for.
    let d = check::judge(&mut m.lock(), &s, &[&next]);
    assert_eq!(d[0].state, CheckState::Pending, "{d:?}");
    assert!(
        d[0].message.starts_with("podSet main: 1 of 2 pods"),
        "{}",
        d[0].message
    );
    // Its pod placed: counted once (by the ledger), not again as missing.
    let bound = place(&m, job_pod(&started, 0, 0));
    assert_eq!(
        bound.metadata.labels.as_ref().unwrap()[PODSET_LABEL],
        "main"
    );
    let single = reserved("ml", "single", &[("main", 1, EIGHT)], "Pending");
    let d = check::judge(&mut m.lock(), &s, &[&single]);
    assert_eq!(d[0].state, CheckState::Ready, "{d:?}");
}

#[test]
fn an_ask_that_cannot_be_read_is_rejected() {
    let m = relisted(vec![]);
    let wl = reserved(
        "ml",
        "bad",
        &[("main", 1, &[("tessera.io/gpu", "65")])],
        "Pending",
    );
    let d = judge_one(&m, &wl);
    assert_eq!(d.state, CheckState::Rejected, "{d:?}");
    assert!(d.message.starts_with("podSet main: "), "{}", d.message);
}

#[test]
fn kueue_admitted_pods_pass_the_gpuqueue_gate_only_when_trusted_and_still_count() {
    let (n, inv) = fixture_cluster();
    let m = mirror("tessera", n, inv, vec![]);
    {
        let mut g = m.lock();
        let mut q = gpu_queue("team", None, "2");
        q.spec.borrow = Some(false);
        g.replace_queues(vec![q]);
        g.replace_namespaces(vec![queue_namespace("ml", "team")]);
    }
    let wl = reserved(
        "ml",
        "job",
        &[("main", 2, &[("tessera.io/gpu", "2")])],
        "Ready",
    );
    // The first pod of the workload takes the queue's whole guarantee.
    place(&m, job_pod(&wl, 0, 0));
    let second = job_pod(&wl, 0, 1);
    let plain = pod("ml", "plain", "uid-plain", &[("tessera.io/gpu", "2")]);
    let mut g = m.lock();
    let req = convert::pod_request(&second, &g.cluster().catalog.clone()).unwrap();
    // Off (the default): Kueue admitted it, and Tessera's quota refuses it too.
    assert!(
        matches!(g.quota(&second, &req), QuotaCheck::Refused(ref why) if why.contains("team")),
        "{:?}",
        g.quota(&second, &req)
    );
    g.set_trust_kueue(true);
    assert_eq!(
        g.quota(&second, &req),
        QuotaCheck::Admitted {
            queue: "team".into(),
            borrowing: true
        }
    );
    // A pod without Kueue's label is judged by the GpuQueue as before.
    assert!(matches!(g.quota(&plain, &req), QuotaCheck::Refused(_)));
    // What the Kueue pods hold still counts in the queue's usage.
    let team = g
        .queue_tree()
        .and_then(|t| t.id("team"))
        .expect("queue team");
    let usage = g.queue_usage(None).expect("usage");
    assert_eq!(usage.of(team).gpu_eq_milli, 2000);
}

// ---- the controller over the API-server double ----------------------------------------

use apiserver::{ApiServer, Config, Resource};

fn admission_check() -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK},
        "spec": {"controllerName": CONTROLLER_NAME, "retryDelayMinutes": 15}
    })
}

/// Creates the workload as Kueue does (status dropped on create), then
/// writes Kueue's reservation on its status subresource.
async fn kueue_creates(kueue: &kube::Client, wl: Value, state: &str) -> Workload {
    let ns = wl["metadata"]["namespace"].as_str().unwrap().to_string();
    let api: Api<Workload> = Api::namespaced(kueue.clone(), &ns);
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(wl.clone()).unwrap(),
        )
        .await
        .expect("created");
    assert!(created.status.is_none(), "status is dropped on create");
    let name = created.metadata.name.clone().unwrap();
    let patch = json!({"status": reserved_status(&wl, state)});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("Kueue reserves quota")
}

async fn listed(objects: &SharedObjects, wake: &tokio::sync::Notify) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !objects.lock().unwrap().listed() {
        assert!(tokio::time::Instant::now() < deadline, "never listed");
        let _ = tokio::time::timeout(Duration::from_millis(100), wake.notified()).await;
    }
}

/// The writes of session `of` (the controller's client) to Workloads.
fn workload_writes(api: &ApiServer, of: &apiserver::Session) -> Vec<apiserver::WriteRecord> {
    api.writes()
        .into_iter()
        .filter(|w| w.session == of.id && w.resource == "workloads")
        .collect()
}

fn stored_check(api: &ApiServer, ns: &str, name: &str) -> Value {
    let wl = api.get(Resource::Workloads, ns, name).expect("stored");
    wl["status"]["admissionChecks"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_written_before_sync_then_the_check_is_written_with_a_precondition() {
    let api = ApiServer::new(Config::default());
    let (kueue, _k) = api.client();
    let (client, s) = api.client();
    api.create(Resource::AdmissionChecks, &admission_check())
        .unwrap();
    let wl = kueue_creates(
        &kueue,
        workload_spec("ml", "train", &[("main", 1, EIGHT)]),
        "Pending",
    )
    .await;
    let name = wl.metadata.name.clone().unwrap();
    let m = relisted(vec![one_gpu_on("gpu-a"), one_gpu_on("gpu-b")]);
    let objects: SharedObjects = Default::default();
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut tasks = tokio::task::JoinSet::new();
    controller::watch_kueue(&mut tasks, &client, &objects, &wake);
    listed(&objects, &wake).await;

    // The mirror's lists are not all in: no write, not even the Active mark.
    let gate = SyncGate::new();
    let before = api.writes().len();
    let r = controller::pass(&client, &m, &gate, &objects).await;
    assert_eq!(r, controller::PassReport::default());
    assert_eq!(api.writes().len(), before, "{:?}", api.writes());
    for k in [Kind::Nodes, Kind::Inventory, Kind::Pods, Kind::Queues] {
        gate.mark(k);
    }
    controller::pass(&client, &m, &gate, &objects).await;
    assert_eq!(api.writes().len(), before, "namespaces are still missing");
    gate.mark(Kind::Namespaces);

    // Synced: the check is marked Active, the fragmented cluster keeps the workload Pending.
    let r = controller::pass(&client, &m, &gate, &objects).await;
    assert_eq!(r.activated, vec![CHECK.to_string()]);
    let ac = api.get(Resource::AdmissionChecks, "", CHECK).unwrap();
    assert_eq!(ac["status"]["conditions"][0]["type"], "Active");
    assert_eq!(ac["status"]["conditions"][0]["status"], "True");
    assert_eq!(r.written, vec![(format!("ml/{name}"), CheckState::Pending)]);
    let c = stored_check(&api, "ml", &name);
    assert_eq!(c["state"], "Pending");
    assert!(
        c["message"].as_str().unwrap().contains("0 of 1 pods"),
        "{c}"
    );
    assert_eq!(c["lastTransitionTime"], T0, "the state did not change");
    let w = workload_writes(&api, &s);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        (w[0].method.as_str(), w[0].subresource.as_str(), w[0].status),
        ("PATCH", "status", 200)
    );

    // Nothing changed: nothing written.
    let r = controller::pass(&client, &m, &gate, &objects).await;
    assert!(r.written.is_empty(), "{r:?}");
    assert_eq!(workload_writes(&api, &s).len(), 1);

    // A pod leaves: Ready, Kueue's other fields kept.
    m.lock().remove_pod("uid-one-gpu-a");
    let r = controller::pass(&client, &m, &gate, &objects).await;
    assert_eq!(r.written, vec![(format!("ml/{name}"), CheckState::Ready)]);
    let stored = api.get(Resource::Workloads, "ml", &name).unwrap();
    let c = &stored["status"]["admissionChecks"][0];
    assert_eq!(c["state"], "Ready");
    assert_ne!(c["lastTransitionTime"], T0);
    assert_eq!(stored["status"]["conditions"][0]["type"], "QuotaReserved");
    assert_eq!(stored["status"]["requeueState"]["count"], 0);
    assert_eq!(stored["spec"]["podSets"][0]["count"], 1);
    // Ready is not judged again.
    let r = controller::pass(&client, &m, &gate, &objects).await;
    assert!(r.written.is_empty(), "{r:?}");
    tasks.abort_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_from_a_stale_view_is_refused_and_the_fresh_object_judged() {
    let api = ApiServer::new(Config::default());
    let (kueue, _k) = api.client();
    let (client, s) = api.client();
    api.create(Resource::AdmissionChecks, &admission_check())
        .unwrap();
    let mut spec_a = workload_spec("ml", "a", &[("main", 1, EIGHT)]);
    spec_a["metadata"]["name"] = json!("wl-a");
    let mut spec_b = workload_spec("ml", "b", &[("main", 1, EIGHT)]);
    spec_b["metadata"]["name"] = json!("wl-b");
    kueue_creates(&kueue, spec_a, "Pending").await;
    kueue_creates(&kueue, spec_b, "Pending").await;
    let m = relisted(vec![]);
    let gate = SyncGate::synced();
    // The controller's view, frozen: no watch delivers what Kueue writes next.
    let objects: SharedObjects = Default::default();
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut tasks = tokio::task::JoinSet::new();
    controller::watch_kueue(&mut tasks, &client, &objects, &wake);
    listed(&objects, &wake).await;
    tasks.abort_all();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;

    // Meanwhile Kueue evicts wl-a and sets our check to Retry, and adds a
    // check of its own to wl-b.
    let wls: Api<Workload> = Api::namespaced(kueue.clone(), "ml");
    let retry = json!({"status": {"admissionChecks": [{
        "name": CHECK, "state": "Retry", "message": "evicted by Kueue", "lastTransitionTime": T0
    }]}});
    wls.patch_status("wl-a", &PatchParams::default(), &Patch::Merge(&retry))
        .await
        .unwrap();
    let other = json!({"status": {"admissionChecks": [
        {"name": CHECK, "state": "Pending", "message": "", "lastTransitionTime": T0},
        {"name": "prov", "state": "Pending", "message": "waiting for capacity", "lastTransitionTime": T0}
    ]}});
    wls.patch_status("wl-b", &PatchParams::default(), &Patch::Merge(&other))
        .await
        .unwrap();

    let r = controller::pass(&client, &m, &gate, &objects).await;
    // Both first writes were refused; each object was read again; wl-b was
    // judged afresh and written, wl-a is no longer Pending and is left alone.
    assert_eq!(r.conflicts, 2, "{r:?}");
    assert_eq!(
        r.written,
        vec![("ml/wl-b".to_string(), CheckState::Ready)],
        "{r:?}"
    );
    let a = stored_check(&api, "ml", "wl-a");
    assert_eq!(
        (a["state"].as_str(), a["message"].as_str()),
        (Some("Retry"), Some("evicted by Kueue"))
    );
    let b = api.get(Resource::Workloads, "ml", "wl-b").unwrap();
    let checks = b["status"]["admissionChecks"].as_array().unwrap();
    assert_eq!(checks.len(), 2, "{checks:?}");
    assert_eq!(checks[0]["state"], "Ready");
    assert_eq!(
        checks[1]["message"], "waiting for capacity",
        "Kueue's entry is kept"
    );
    let refused = workload_writes(&api, &s)
        .iter()
        .filter(|w| w.status == 409)
        .count();
    assert_eq!(refused, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_answers_once_its_own_watchers_have_listed_the_cluster() {
    let api = ApiServer::new(Config {
        // Each list takes its time: the first pass finds the gate closed.
        list_latency_per_item: Duration::from_millis(300),
        ..Config::default()
    });
    apiserver::cluster::add_gpu_nodes(&api, 2, 8);
    let (kueue, _k) = api.client();
    api.create(Resource::AdmissionChecks, &admission_check())
        .unwrap();
    let mut spec = workload_spec("ml", "train", &[("main", 2, EIGHT)]);
    spec["metadata"]["name"] = json!("wl-train");
    kueue_creates(&kueue, spec, "Pending").await;
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("key");
    std::fs::write(&key, "kueue-run-test-signing-key").expect("key");
    let config = controller::RawKueueConfig {
        health_listen: Some(apiserver::process::free_addr().to_string()),
        mirror: tessera_k8s::run::RawMirrorConfig {
            signing_key_file: Some(key),
            ..Default::default()
        },
        interval_s: Some(1),
        ..Default::default()
    }
    .resolve()
    .expect("valid configuration");
    let (client, s) = api.client();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(controller::run(config, client, async {
        let _ = stop_rx.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let c = stored_check(&api, "ml", "wl-train");
        if c["state"] == "Ready" {
            break;
        }
        assert_eq!(c["state"], "Pending", "{c}");
        assert!(tokio::time::Instant::now() < deadline, "never Ready: {c}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two empty nodes of eight: the first and only write says Ready (a pass
    // on a partial list would have written Pending first: no nodes).
    let w = workload_writes(&api, &s);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        (w[0].name.as_str(), w[0].subresource.as_str()),
        ("wl-train", "status")
    );
    stop_controller(stop_tx, running).await;
}

/// Resolves a running controller's shutdown and waits for its clean stop.
async fn stop_controller(
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<Result<(), controller::KueueError>>,
) {
    stop.send(()).expect("still running");
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("stops on shutdown")
        .expect("task")
        .expect("clean stop");
}

/// `--leader-elect`: replicas of the controller over one API server elect
/// one writer on the Lease `tessera-kueue-admission`. While another holds it
/// (here a Lease of 30 s held by `x`), neither replica writes anything,
/// though a workload waits; once it is free one of them takes it and only
/// that one writes; when that one stops (and releases the Lease), the other
/// takes over and judges the next workload. Without election both would
/// judge the same room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_elect_one_writer_and_the_other_takes_over() {
    let api = ApiServer::new(Config::default());
    apiserver::cluster::add_gpu_nodes(&api, 2, 8);
    let (kueue, _k) = api.client();
    api.create(Resource::AdmissionChecks, &admission_check())
        .unwrap();
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    api.create(
        Resource::Leases,
        &json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": controller::LEASE_NAME, "namespace": "tessera-system"},
            "spec": {"holderIdentity": "x", "leaseDurationSeconds": 30, "acquireTime": now, "renewTime": now},
        }),
    )
    .expect("x's Lease");
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("key");
    std::fs::write(&key, "kueue-elect-test-signing-key").expect("key");
    let replica = |identity: &str| {
        controller::RawKueueConfig {
            health_listen: Some(apiserver::process::free_addr().to_string()),
            mirror: tessera_k8s::run::RawMirrorConfig {
                signing_key_file: Some(key.clone()),
                ..Default::default()
            },
            interval_s: Some(1),
            leader_elect: true,
            identity: Some(identity.into()),
            lease_namespace: Some("tessera-system".into()),
            lease_timings: Some((
                Duration::from_secs(2),
                Duration::from_millis(1400),
                Duration::from_millis(400),
            )),
        }
        .resolve()
        .expect("valid configuration")
    };
    let holder = || {
        api.get(Resource::Leases, "tessera-system", controller::LEASE_NAME)
            .and_then(|l| {
                l.pointer("/spec/holderIdentity")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
    };
    let mut replicas = std::collections::BTreeMap::new();
    for id in ["a", "b"] {
        let (client, session) = api.client();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(controller::run(replica(id), client, async {
            let _ = stop_rx.await;
        }));
        replicas.insert(id.to_string(), (session, stop_tx, running));
    }
    let ready = |name: &str| {
        let name = name.to_string();
        let api = api.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let c = stored_check(&api, "ml", &name);
                if c["state"] == "Ready" {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{name} never Ready: {c}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let mut one = workload_spec("ml", "one", &[("main", 1, EIGHT)]);
    one["metadata"]["name"] = json!("wl-one");
    kueue_creates(&kueue, one, "Pending").await;
    // x leads: a few passes of both replicas, and nothing written.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (id, (session, _, _)) in &replicas {
        let w = workload_writes(&api, session);
        assert!(w.is_empty(), "{id} wrote while x leads: {w:?}");
    }
    assert_eq!(stored_check(&api, "ml", "wl-one")["state"], "Pending");
    // x is gone: one replica takes the Lease and writes wl-one.
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(kueue.clone(), "tessera-system")
        .delete(controller::LEASE_NAME, &Default::default())
        .await
        .expect("x's Lease deleted");
    ready("wl-one").await;
    let first = holder().expect("a holder");
    let writers: Vec<&String> = replicas
        .iter()
        .filter(|(_, (s, _, _))| !workload_writes(&api, s).is_empty())
        .map(|(id, _)| id)
        .collect();
    assert_eq!(writers, vec![&first], "only the leader {first} wrote");
    // The leader stops: it releases the Lease, the other takes it and judges the next.
    let (_, stop, running) = replicas.remove(&first).expect("the leader");
    stop_controller(stop, running).await;
    let other = replicas.keys().next().expect("the other").clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while holder().as_deref() != Some(other.as_str()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{other} never took over: {:?}",
            holder()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut two = workload_spec("ml", "two", &[("main", 1, EIGHT)]);
    two["metadata"]["name"] = json!("wl-two");
    kueue_creates(&kueue, two, "Pending").await;
    ready("wl-two").await;
    let (session, stop, running) = replicas.remove(&other).expect("the other");
    let by_other: Vec<String> = workload_writes(&api, &session)
        .iter()
        .map(|w| w.name.clone())
        .collect();
    assert_eq!(
        by_other,
        vec!["wl-two".to_string()],
        "{other} wrote only what came after it led"
    );
    stop_controller(stop, running).await;
}
