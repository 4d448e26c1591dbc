//! The mirror: restart recovery from pod annotations, and fractional packing.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_k8s::mirror::Reservation;

/// What the API server holds after a successful bind: the annotation and `spec.nodeName`.
fn as_bound(mut p: Pod, node: &str, annotation: Option<String>) -> Pod {
    if let Some(a) = annotation {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION.to_string(), a);
    }
    p.spec.as_mut().unwrap().node_name = Some(node.to_string());
    p
}

fn cluster() -> (
    Vec<k8s_openapi::api::core::v1::Node>,
    Vec<tessera_api::GpuNode>,
) {
    let nodes = vec![
        kube_node("a100-1", "64", "512Gi"),
        kube_node("a100-2", "64", "512Gi"),
        kube_node("cpu-1", "16", "64Gi"),
    ];
    let mut mig = gpu_node("a100-2", "A100-80GB", 81_920, 2);
    mig.spec.gpus[1].mig.enabled = true;
    // Tessera grants only MIG instances that exist.
    mig.spec.gpus[1].mig.instances = vec![tessera_api::MigInstance {
        profile: "3g.40gb".into(),
        start: 4,
        size: 4,
        uuid: "MIG-a100-2-1-0".into(),
    }];
    (nodes, vec![gpu_node("a100-1", "A100-80GB", 81_920, 4), mig])
}

#[test]
fn a_new_mirror_rebuilds_the_same_ledger_from_pod_annotations() {
    let (nodes, inv) = cluster();
    let first = mirror("tessera", nodes.clone(), inv.clone(), vec![]);
    type Ask<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);
    let asks: Vec<Ask<'_>> = vec![
        (
            "whole",
            "a100-1",
            vec![("cpu", "4"), ("memory", "16Gi"), ("tessera.io/gpu", "2")],
        ),
        (
            "share-1",
            "a100-1",
            vec![
                ("cpu", "1"),
                ("tessera.io/gpu", "1"),
                ("tessera.io/gpu-memory", "20Gi"),
                ("tessera.io/gpu-cores", "25"),
            ],
        ),
        ("share-2", "a100-2", vec![("tessera.io/gpu-milli", "300")]),
        ("mig", "a100-2", vec![("tessera.io/mig-3g.40gb", "1")]),
        ("cpu-only", "cpu-1", vec![("cpu", "2"), ("memory", "4Gi")]),
    ];
    let mut api_pods = Vec::new();
    for (name, node, res) in &asks {
        let p = pod("ml", name, &format!("uid-{name}"), res);
        let r = first
            .lock()
            .reserve(&p, node)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let Reservation::Write { annotation } = r else {
            panic!("{name}: fresh pod")
        };
        assert_eq!(annotation.is_some(), *name != "cpu-only", "{name}");
        api_pods.push(as_bound(p, node, annotation));
    }
    // A pod that wrote the annotation itself (no valid signature) holds no GPU
    // Tessera granted; bound, it blocks its node until the node agent reports
    // what the kubelet gave it (see a_bound_pod_whose_grant_does_not_verify_blocks_its_node).
    let mut forged = pod("ml", "forged", "uid-forged", &[("tessera.io/gpu", "1")]);
    let fake = Allocation::decode_unverified(
        api_pods[0].metadata.annotations.as_ref().unwrap()[ANNOTATION].as_str(),
    )
    .unwrap();
    let mut fake = fake;
    fake.pod_uid = "uid-forged".into();
    fake.signature.clear();
    forged = as_bound(
        forged,
        "a100-1",
        Some(serde_json::to_string(&fake).unwrap()),
    );
    api_pods.push(forged);
    // Its cpu/memory count in both: the first mirror learns it from the watch stream.
    first.lock().upsert_pod(api_pods.last().unwrap().clone());
    // The watch stream now shows the bound pods; nothing changes.
    for p in &api_pods {
        first.lock().upsert_pod(p.clone());
    }
    let before = first.lock().usage();

    // A new process lists the same objects (in another order).
    api_pods.reverse();
    let second = mirror("tessera", nodes, inv, api_pods.clone());
    let mut m2 = second.lock();
    assert_eq!(m2.usage(), before);
    assert_eq!(m2.ledger().allocation_count(), asks.len() + 1);
    assert!(
        m2.problems()
            .iter()
            .any(|p| p.contains("ml/forged") && p.contains("not signed")),
        "{:?}",
        m2.problems()
    );
    // The rebuilt ledger is not empty: the whole-GPU pod holds two GPUs of a100-1.
    let a1 = &before["a100-1"];
    assert_eq!(a1.gpus.iter().filter(|g| g.exclusive).count(), 2);
    // Deleting a pod frees its GPUs.
    let uid = "uid-whole";
    m2.remove_pod(uid);
    assert_eq!(
        m2.usage()["a100-1"]
            .gpus
            .iter()
            .filter(|g| g.exclusive)
            .count(),
        0
    );
}

#[test]
fn fractional_pods_pack_onto_one_gpu_until_it_is_full() {
    let nodes = vec![
        kube_node("n1", "32", "128Gi"),
        kube_node("n2", "32", "128Gi"),
    ];
    let inv = vec![
        gpu_node("n1", "A100-80GB", 81_920, 2),
        gpu_node("n2", "A100-80GB", 81_920, 2),
    ];
    let m = mirror("tessera", nodes, inv, vec![]);
    let names = vec!["n1", "n2"];
    let ask = [
        ("tessera.io/gpu", "1"),
        ("tessera.io/gpu-memory-percent", "40"),
        ("tessera.io/gpu-cores", "40"),
    ];
    let mut placed = Vec::new();
    for i in 0..3 {
        let p = pod("ml", &format!("frac-{i}"), &format!("uid-{i}"), &ask);
        let mut mm = m.lock();
        // What kube-scheduler does: filter, prioritize, pick the highest score, bind.
        let passed = mm.filter(&p, &names).unwrap().passed;
        assert_eq!(passed.len(), 2, "pod {i}: both nodes can take 40 %");
        let scores = mm.prioritize(&p, &passed).unwrap();
        let best = scores.iter().max_by_key(|(_, s)| *s).unwrap().0.to_string();
        let Reservation::Write {
            annotation: Some(a),
        } = mm.reserve(&p, &best).unwrap()
        else {
            panic!("pod {i}: expected an annotation")
        };
        let alloc = Allocation::decode_verified(&a, KEY, &format!("uid-{i}"), &best).unwrap();
        assert_eq!(alloc.gpus.len(), 1);
        // 40 % of 81920 MiB = 32768 MiB.
        assert_eq!(alloc.gpus[0].memory_mib, 32_768);
        placed.push((best, alloc.gpus[0].index));
    }
    assert_eq!(
        placed[0], placed[1],
        "the first two share one GPU of one node"
    );
    assert_ne!(
        placed[2], placed[0],
        "a third 40 % would make 120 %: it goes elsewhere"
    );
}

/// The extender's per-shape verdicts follow every change: a bind, a deletion, an inventory update.
#[test]
fn cached_verdicts_follow_the_ledger_and_the_inventory() {
    let nodes = vec![kube_node("n1", "32", "64Gi")];
    let inv = vec![gpu_node("n1", "A100-80GB", 81_920, 1)];
    let m = mirror("tessera", nodes, inv.clone(), vec![]);
    let names = vec!["n1"];
    let ask = [("tessera.io/gpu", "1")];
    let mut mm = m.lock();
    let probe = pod("ml", "probe", "uid-probe", &ask);
    assert_eq!(mm.filter(&probe, &names).unwrap().passed, names);
    // Another pod of the same shape takes the only GPU.
    let other = pod("ml", "other", "uid-other", &ask);
    mm.reserve(&other, "n1").unwrap();
    let out = mm.filter(&probe, &names).unwrap();
    assert!(out.passed.is_empty());
    assert_eq!(out.reason("n1"), Some("fewer than 1 idle GPUs"));
    assert!(mm.prioritize(&probe, &names).unwrap().is_empty());
    // It goes away: the GPU is free again.
    mm.remove_pod("uid-other");
    assert_eq!(mm.filter(&probe, &names).unwrap().passed, names);
    // The node agent marks the GPU unhealthy: never, whatever is preempted.
    let mut sick = inv[0].clone();
    sick.spec.gpus[0].health = tessera_api::GpuHealth::Unhealthy;
    mm.upsert_inventory(sick);
    let out = mm.filter(&probe, &names).unwrap();
    assert_eq!(out.reason("n1"), Some("no healthy GPU"));
    assert!(
        out.failed.is_empty(),
        "an unhealthy GPU is not resolvable by preemption"
    );
}

/// Issue 10, item 4: agents republish GpuNode status every minute and nodes
/// their heartbeats; such updates must not rebuild the cluster (and drop every
/// cache), while a change to what placement reads must.
#[test]
fn only_changes_placement_reads_rebuild_the_cluster() {
    let (nodes, inv) = cluster();
    let m = mirror("tessera", nodes.clone(), inv.clone(), vec![]);
    let mut m = m.lock();
    let start = m.generation();

    // Status churn: free memory and the timestamp change, nothing else.
    let mut churn = inv[0].clone();
    churn.status = Some(tessera_api::GpuNodeStatus {
        free_memory_mib: 12_345,
        last_update: Some("2026-12-01T07:00:00Z".into()),
        ..Default::default()
    });
    m.upsert_inventory(churn.clone());
    let mut heartbeat = nodes[0].clone();
    heartbeat.metadata.resource_version = Some("999".into());
    m.upsert_node(heartbeat.clone());
    assert_eq!(m.generation(), start, "status churn rebuilt the cluster");

    // A GPU turning unhealthy (through status) is a change placement reads.
    let mut sick = churn.clone();
    sick.status.as_mut().unwrap().gpus = vec![tessera_api::GpuCondition {
        index: 0,
        health: tessera_api::GpuHealth::Unhealthy,
        ..Default::default()
    }];
    m.upsert_inventory(sick);
    assert_eq!(m.generation(), start + 1, "a health change is applied");
    let gpu0 = m
        .cluster()
        .nodes()
        .iter()
        .find(|n| n.name == "a100-1")
        .map(|n| n.gpus[0].health);
    assert_eq!(gpu0, Some(tessera_core::model::Health::Unhealthy));

    // So is a new label on the Node.
    let mut labelled = heartbeat;
    labelled
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("pool".into(), "train".into());
    m.upsert_node(labelled);
    assert_eq!(m.generation(), start + 2, "a label change is applied");
}

/// Issue 12: the Kubernetes scheduler measures fragmentation against the
/// workload it has seen arrive, and rebuilds that workload from the pods
/// after a restart.
#[test]
fn the_scheduler_learns_the_workload_from_arriving_pods() {
    let (nodes, inv) = cluster();
    let live = mirror("tessera", nodes.clone(), inv.clone(), vec![]);
    let probe = pod(
        "default",
        "probe",
        "uid-probe",
        &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "300")],
    );
    // The best placement's raw score (the extender's 0–10 scale is too coarse to show it).
    let scores = |m: &tessera_k8s::mirror::SharedMirror| {
        let mut m = m.lock();
        let catalog = m.cluster().catalog.clone();
        let req = tessera_k8s::convert::pod_request(&probe, &catalog).expect("request");
        let host = tessera_k8s::hostfit::host_ask(&probe).expect("host ask");
        let (placement, _) = m.decide(&req, &host, |_| Ok(())).expect("fits");
        (placement.node, placement.score.to_bits())
    };
    let before = scores(&live);
    let learned_before = live.lock().learned();
    // 600 pending pods of one new shape (a 70 % share) arrive.
    let arrivals: Vec<Pod> = (0..600)
        .map(|i| {
            pod(
                "default",
                &format!("p-{i}"),
                &format!("uid-p-{i}"),
                &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "700")],
            )
        })
        .collect();
    for p in &arrivals {
        live.lock().upsert_pod(p.clone());
    }
    let learned_after = live.lock().learned();
    assert_eq!(
        learned_after.0,
        learned_before.0 + 600,
        "each pod learned once"
    );
    assert!(learned_after.1 > learned_before.1, "the target moved");
    // Seeing the same pods again (a relist) learns nothing more.
    live.lock().replace_pods(arrivals.clone());
    assert_eq!(live.lock().learned().0, learned_after.0);
    // A restarted scheduler rebuilds the same workload from the pods.
    let restarted = mirror("tessera", nodes, inv, arrivals);
    assert_eq!(restarted.lock().learned().0, learned_after.0);
    assert_eq!(
        scores(&restarted),
        scores(&live),
        "same workload, same scores"
    );
    assert_ne!(scores(&live), before, "the new shape moved the scores");
}

/// Pods without GPUs count in the learned workload where they take CPU from GPU
/// nodes, as the simulator's workloads do: learned once bound to a node with a GPU
/// inventory (also when that inventory is listed after the pod), once only, and
/// never on a node without GPUs.
#[test]
fn pods_without_gpus_are_learned_once_bound_to_a_gpu_node() {
    let (nodes, inv) = cluster();
    let live = mirror("tessera", nodes.clone(), inv.clone(), vec![]);
    let learned = |m: &tessera_k8s::mirror::SharedMirror| m.lock().learned().0;
    let start = learned(&live);
    let cpu_pod = |name: &str| pod("default", name, &format!("uid-{name}"), &[("cpu", "4")]);
    live.lock().upsert_pod(cpu_pod("c1"));
    assert_eq!(learned(&live), start, "pending: not yet");
    live.lock()
        .upsert_pod(as_bound(cpu_pod("c1"), "cpu-1", None));
    assert_eq!(learned(&live), start, "on a node without GPUs: never");
    live.lock()
        .upsert_pod(as_bound(cpu_pod("c2"), "a100-1", None));
    assert_eq!(learned(&live), start + 1, "on a GPU node");
    live.lock()
        .upsert_pod(as_bound(cpu_pod("c2"), "a100-1", None));
    live.lock()
        .replace_pods(vec![as_bound(cpu_pod("c2"), "a100-1", None)]);
    assert_eq!(learned(&live), start + 1, "once");
    // The pod listed before the GPU inventory of its node.
    let late = mirror(
        "tessera",
        nodes,
        vec![],
        vec![as_bound(cpu_pod("c3"), "a100-1", None)],
    );
    let before = learned(&late);
    late.lock().upsert_inventory(inv[0].clone());
    assert_eq!(
        learned(&late),
        before + 1,
        "learned when the inventory appears"
    );
}

/// Issue 12: operators see the workload the policy scores against. The metrics
/// measure fragmentation against the learned target (pending pods move it, the
/// ledger stays as it was) and list its heaviest shapes; `tessera explain`
/// reports the same.
/// 600 pending pods of a shape the built-in workload does not have (1 GPU, 700 ‰).
fn learn_a_new_shape(live: &tessera_k8s::mirror::SharedMirror) {
    for i in 0..600 {
        live.lock().upsert_pod(pod(
            "default",
            &format!("p-{i}"),
            &format!("uid-p-{i}"),
            &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "700")],
        ));
    }
}

#[test]
fn metrics_and_explain_show_the_learned_workload() {
    let (nodes, inv) = cluster();
    let live = mirror("tessera", nodes, inv, vec![]);
    let metrics = tessera_k8s::metrics::Metrics::new();
    let scrape = |m: &tessera_k8s::mirror::SharedMirror| {
        metrics.update_cluster(&mut m.lock());
        metrics.encode().expect("metrics encode")
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .trim()
            .parse()
            .expect("a number")
    };
    let before = scrape(&live);
    assert_eq!(value(&before, "tessera_learned_workload_pods"), 0.0);
    let frag_before = value(&before, "tessera_cluster_fragmentation_milli");
    learn_a_new_shape(&live);
    let after = scrape(&live);
    assert_eq!(value(&after, "tessera_learned_workload_pods"), 600.0);
    assert!(value(&after, "tessera_learned_workload_generation") > 0.0);
    // The pods wait (nothing was bound): only the target moved.
    assert_ne!(
        value(&after, "tessera_cluster_fragmentation_milli"),
        frag_before,
        "fragmentation is measured against the learned workload"
    );
    let report = live.lock().workload_report();
    assert!(report.learned);
    assert_eq!(report.pods_learned, 600);
    let top = &report.top[0];
    assert_eq!((top.gpus, top.gpu_milli), (1, 700), "{report:?}");
    assert!(top.weight > 0.5, "{report:?}");
    let weight = value(
        &after,
        &format!(
            "tessera_workload_shape_weight{{gpus=\"1\",gpu_milli=\"700\",cpu_milli=\"{}\",models=\"\"}}",
            top.cpu_milli
        ),
    );
    assert!((weight - top.weight).abs() < 1e-9, "{after}");
    assert!(
        report.to_string().contains("learned from 600 pod(s)"),
        "{report}"
    );
}

/// Preemption places the preemptor with a copy of the scheduler's policy: after
/// the mirror has learned a new shape, the copy scores every node as a policy
/// built from the learned target and the inventory does, not as the built-in
/// workload's policy (what preemption used before).
#[test]
fn preemption_scores_with_the_learned_policy() {
    use tessera_core::policy::{self, PolicyArgs};
    let (nodes, inv) = cluster();
    let live = mirror("tessera", nodes, inv, vec![]);
    learn_a_new_shape(&live);
    let mut m = live.lock();
    let copy = m.policy_copy();
    let cluster = m.shared_cluster();
    let learned = policy::by_name(
        "tessera",
        &PolicyArgs {
            workload: Some(m.target_workload()),
            model_supply: m.model_supply(),
        },
    )
    .unwrap();
    let built_in = policy::by_name("tessera", &PolicyArgs::default()).unwrap();
    let ledger = m.ledger().clone();
    let req = tessera_core::request::Request::share_milli(300, 1_000, 1 << 10);
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
    let mut differs = false;
    for i in 0..cluster.len() {
        let view = tessera_core::fit::NodeView::of(
            &cluster,
            &ledger,
            tessera_core::model::NodeId(i as u32),
        );
        let Ok(fit) = tessera_core::fit::check(view, &req) else {
            continue;
        };
        let score = |p: &dyn policy::Policy, rng: &mut rand::rngs::SmallRng| {
            p.score(view, &req, &fit, rng).map(|s| s.score)
        };
        assert_eq!(
            score(copy.as_ref(), &mut rng),
            score(learned.as_ref(), &mut rng),
            "node {i}"
        );
        differs |= score(copy.as_ref(), &mut rng) != score(built_in.as_ref(), &mut rng);
    }
    assert!(differs, "the learned target changes some node's score");
}

/// The model pressure is weighed against the GPU compute still free per model, as
/// in the simulator: once A100-only pods have been learned, two binds that use up
/// the A100s rebuild the mirror's policy from a supply that holds none of them.
#[test]
fn the_policy_follows_the_free_gpu_supply() {
    let nodes = vec![kube_node("a", "32", "128Gi"), kube_node("h", "32", "128Gi")];
    let inv = vec![
        gpu_node("a", "A100-80GB", 81_920, 2),
        gpu_node("h", "H100-80GB", 81_920, 2),
    ];
    let m = mirror("tessera", nodes, inv, vec![]);
    // 600 pending pods that may run on A100s only: the learned target gives A100 a
    // pressure, which is what the supply is followed for (without one the policy
    // has nothing to follow and is not rebuilt for it).
    for i in 0..600 {
        let mut p = pod(
            "default",
            &format!("p-{i}"),
            &format!("uid-p-{i}"),
            &[("tessera.io/gpu", "1")],
        );
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                tessera_core::request::ANN_GPU_MODEL.to_string(),
                "A100-80GB".to_string(),
            );
        m.lock().upsert_pod(p);
    }
    let mut mm = m.lock();
    let cat = mm.cluster().catalog.clone();
    let supply_of = |supply: &[u32], model: &str| {
        let id = cat.find(model).unwrap();
        supply.get(id.0 as usize).copied().unwrap_or(0)
    };
    let ask = [("cpu", "1"), ("tessera.io/gpu", "1")];
    let first = pod("ml", "probe", "uid-probe", &ask);
    mm.filter(&first, &["a", "h"]).unwrap();
    let before = mm.model_supply();
    assert_eq!(supply_of(&before, "A100-80GB"), 2_000);
    assert_eq!(supply_of(&before, "H100-80GB"), 2_000);
    for i in 0..2 {
        let p = pod("ml", &format!("w-{i}"), &format!("uid-w-{i}"), &ask);
        assert_eq!(mm.filter(&p, &["a"]).unwrap().passed, vec!["a"]);
        assert!(matches!(
            mm.reserve(&p, "a").unwrap(),
            Reservation::Write {
                annotation: Some(_)
            }
        ));
    }
    mm.filter(&first, &["a", "h"]).unwrap();
    let after = mm.model_supply();
    assert_eq!(supply_of(&after, "A100-80GB"), 0, "{after:?}");
    assert_eq!(supply_of(&after, "H100-80GB"), 2_000, "{after:?}");
}

// ---- the scheduler's view of grants (issues 27 and 28) ------------------------------------

/// The allocation the pod's annotation carries (as signed by the test key).
fn grant_of(p: &Pod) -> Allocation {
    let v = &p.metadata.annotations.as_ref().expect("annotations")[ANNOTATION];
    Allocation::decode_verified(v, KEY, p.metadata.uid.as_deref().unwrap(), {
        p.spec.as_ref().unwrap().node_name.as_deref().unwrap()
    })
    .expect("a valid grant")
}

/// Reserves `p` on `node` and returns it as the API server holds it once bound.
fn reserve_bound(m: &tessera_k8s::mirror::SharedMirror, p: Pod, node: &str) -> Pod {
    let r = m.lock().reserve(&p, node).expect("fits");
    let Reservation::Write { annotation } = r else {
        panic!("fresh pod")
    };
    let bound = as_bound(p, node, annotation);
    m.lock().upsert_pod(bound.clone());
    bound
}

/// Which GPUs of `node` the ledger holds whole, by UUID.
fn whole_gpus(m: &tessera_k8s::mirror::SharedMirror, node: &str) -> Vec<String> {
    let mut m = m.lock();
    let usage = m.usage();
    let id = m.cluster().node_id(node).expect("known node");
    let gpus = m.cluster().node(id).gpus.clone();
    usage[node]
        .gpus
        .iter()
        .zip(&gpus)
        .filter(|(u, _)| u.exclusive)
        .map(|(_, g)| g.uuid.clone())
        .collect()
}

/// Why the filter rejects `node` for a pod asking `gpus` whole GPUs (`None`: it passes).
fn rejection(m: &tessera_k8s::mirror::SharedMirror, node: &str, gpus: &str) -> Option<String> {
    let probe = pod("default", "probe", "uid-probe", &[("tessera.io/gpu", gpus)]);
    let mut m = m.lock();
    let out = m.filter(&probe, &[node]).expect("request parses");
    out.reason(node).map(str::to_string)
}

/// Issue 28 item 2: NVML renumbers GPUs when one disappears; the grant stays on
/// the GPU with its UUID, and a grant whose GPU is gone blocks the node.
#[test]
fn grants_are_replayed_on_the_gpu_with_their_uuid_after_renumbering() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 2);
    let live = mirror("bestfit", nodes, vec![inv.clone()], vec![]);
    let a = reserve_bound(
        &live,
        pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]),
        "n",
    );
    let b = reserve_bound(
        &live,
        pod("ml", "b", "uid-b", &[("tessera.io/gpu", "1")]),
        "n",
    );
    // The pod on index 1 stays; the other leaves and its GPU (index 0) falls off the bus.
    let (stay, leave) = if grant_of(&a).gpus[0].index == 1 {
        (a, b)
    } else {
        (b, a)
    };
    let kept = grant_of(&stay).gpus[0].uuid.clone();
    live.lock()
        .remove_pod(leave.metadata.uid.as_deref().unwrap());
    let mut renumbered = inv.clone();
    renumbered.spec.gpus.retain(|g| g.uuid == kept);
    renumbered.spec.gpus[0].index = 0;
    live.lock().upsert_inventory(renumbered.clone());
    // Index 1 no longer exists; the GPU the pod holds is index 0 now, by its UUID.
    assert_eq!(whole_gpus(&live, "n"), vec![kept.clone()]);
    assert!(
        live.lock().problems().is_empty(),
        "{:?}",
        live.lock().problems()
    );
    assert!(rejection(&live, "n", "1").is_some(), "its only GPU is held");
    // A grant naming a GPU the node no longer lists blocks the node, saying which.
    let mut other = renumbered;
    other.spec.gpus[0].uuid = "GPU-replacement".into();
    live.lock().upsert_inventory(other);
    let why = rejection(&live, "n", "1").expect("blocked");
    assert!(
        why.contains(&kept) && why.contains("no longer lists"),
        "{why}"
    );
}

/// Issue 28 item 7: a GPU turning unhealthy under a running pod takes only that
/// GPU out of new grants; the pod keeps holding it and its CPU and memory.
#[test]
fn a_gpu_turning_unhealthy_under_a_pod_leaves_the_other_gpus_schedulable() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 4);
    let live = mirror("bestfit", nodes, vec![inv.clone()], vec![]);
    let p = reserve_bound(
        &live,
        pod("ml", "a", "uid-a", &[("cpu", "4"), ("tessera.io/gpu", "1")]),
        "n",
    );
    let granted = grant_of(&p).gpus[0].clone();
    let mut sick = inv;
    sick.status = Some(tessera_api::GpuNodeStatus {
        gpus: vec![tessera_api::GpuCondition {
            index: granted.index,
            health: tessera_api::GpuHealth::Unhealthy,
            reason: "XID 79".into(),
        }],
        ..Default::default()
    });
    live.lock().upsert_inventory(sick);
    assert_eq!(whole_gpus(&live, "n"), vec![granted.uuid.clone()]);
    // 64 cores - 4 held by the pod.
    assert_eq!(live.lock().usage()["n"].free_cpu_milli, 60_000);
    // The three healthy GPUs take new pods; all four never again.
    assert_eq!(rejection(&live, "n", "3"), None);
    assert!(rejection(&live, "n", "4").is_some());
}

/// A GpuNode for `node` whose status carries the kubelet's PodResources list.
fn reported(
    mut gn: tessera_api::GpuNode,
    held: &[(&str, &str, &str, &[&str])],
) -> tessera_api::GpuNode {
    gn.status = Some(tessera_api::GpuNodeStatus {
        pod_resources: Some(tessera_api::PodResourcesReport {
            observed_at: "2026-12-03T08:00:00Z".into(),
            containers: held
                .iter()
                .map(
                    |(ns, pod, resource, uuids)| tessera_api::gpunode::ContainerDevices {
                        namespace: ns.to_string(),
                        pod: pod.to_string(),
                        container: "c".into(),
                        resource: resource.to_string(),
                        device_ids: uuids.iter().map(|u| u.to_string()).collect(),
                        gpu_uuids: uuids.iter().map(|u| u.to_string()).collect(),
                    },
                )
                .collect(),
        }),
        ..Default::default()
    });
    gn
}

/// Issue 27 item 4: a pod holding GPUs through another device plugin blocks its
/// node until the node agent reports which; then exactly those GPUs are held.
#[test]
fn gpus_held_through_another_plugin_are_counted_from_the_agents_report() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 4);
    let mut old = as_bound(
        pod("ml", "old", "uid-old", &[("nvidia.com/gpu", "1")]),
        "n",
        None,
    );
    let live = mirror(
        "bestfit",
        nodes.clone(),
        vec![inv.clone()],
        vec![old.clone()],
    );
    // No report yet: the node takes nothing new.
    let why = rejection(&live, "n", "1").expect("blocked");
    assert!(
        why.contains("pod ml/old holds GPUs through another device plugin; waiting for the node agent to report which"),
        "{why}"
    );
    // A report that does not list it yet changes nothing.
    live.lock().upsert_inventory(reported(inv.clone(), &[]));
    assert!(rejection(&live, "n", "1").is_some());
    // Listed on GPU 2: that GPU is held whole, the other three are free.
    live.lock().upsert_inventory(reported(
        inv.clone(),
        &[("ml", "old", "nvidia.com/gpu", &["GPU-n-2"])],
    ));
    assert_eq!(whole_gpus(&live, "n"), vec!["GPU-n-2".to_string()]);
    assert_eq!(rejection(&live, "n", "3"), None);
    assert!(rejection(&live, "n", "4").is_some());
    // A pod we do not know as a GPU pod (a resource we do not parse) counts too:
    // the report is the kubelet's truth.
    live.lock().upsert_inventory(reported(
        inv.clone(),
        &[
            ("ml", "old", "nvidia.com/gpu", &["GPU-n-2"]),
            ("other", "x", "example.com/accelerator", &["GPU-n-0"]),
        ],
    ));
    assert_eq!(
        whole_gpus(&live, "n"),
        vec!["GPU-n-0".to_string(), "GPU-n-2".to_string()]
    );
    // A device the agent could not place on a GPU blocks the node.
    live.lock().upsert_inventory(reported(
        inv.clone(),
        &[("ml", "old", "nvidia.com/gpu", &[])],
    ));
    let mut gn = reported(inv.clone(), &[]);
    gn.status
        .as_mut()
        .unwrap()
        .pod_resources
        .as_mut()
        .unwrap()
        .containers = vec![tessera_api::gpunode::ContainerDevices {
        namespace: "ml".into(),
        pod: "old".into(),
        container: "c".into(),
        resource: "nvidia.com/gpu".into(),
        device_ids: vec!["GPU-n-2::1".into()],
        gpu_uuids: vec![],
    }];
    live.lock().upsert_inventory(gn);
    let why = rejection(&live, "n", "1").expect("blocked");
    assert!(why.contains("could not place on a GPU"), "{why}");
    // Once the pod has finished, what the report still lists for it counts nothing.
    live.lock().upsert_inventory(reported(
        inv.clone(),
        &[("ml", "old", "nvidia.com/gpu", &["GPU-n-2"])],
    ));
    old.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    live.lock().upsert_pod(old);
    assert!(whole_gpus(&live, "n").is_empty());
    assert_eq!(rejection(&live, "n", "4"), None);
}

/// The report lists Tessera's own grants too: they are counted once, by the grant.
#[test]
fn a_granted_pod_in_the_report_is_not_counted_twice() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 2);
    let live = mirror("bestfit", nodes, vec![inv.clone()], vec![]);
    let p = reserve_bound(
        &live,
        pod(
            "ml",
            "share",
            "uid-share",
            &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "500")],
        ),
        "n",
    );
    let uuid = grant_of(&p).gpus[0].uuid.clone();
    live.lock().upsert_inventory(reported(
        inv,
        &[("ml", "share", "tessera.io/gpu", &[uuid.as_str()])],
    ));
    // Half of one GPU is held, not the whole of it: both GPUs still take a whole one... only one.
    assert!(whole_gpus(&live, "n").is_empty());
    assert_eq!(rejection(&live, "n", "1"), None);
    assert!(
        live.lock().problems().is_empty(),
        "{:?}",
        live.lock().problems()
    );
}

/// Issue 28 item 3: a bound GPU pod whose grant does not verify (signed with an
/// old key) may hold GPUs: its node is blocked until the report says which.
#[test]
fn a_bound_pod_whose_grant_does_not_verify_blocks_its_node() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 2);
    let p = pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]);
    let old_key =
        tessera_k8s::mirror::SharedMirror::new(tessera_k8s::mirror::Mirror::from_objects(
            tessera_core::policy::by_name("bestfit", &Default::default()).unwrap(),
            b"the-old-key".to_vec(),
            nodes.clone(),
            vec![inv.clone()],
            vec![],
        ));
    let bound = reserve_bound(&old_key, p, "n");
    let uuid =
        Allocation::decode_unverified(&bound.metadata.annotations.as_ref().unwrap()[ANNOTATION])
            .unwrap()
            .gpus[0]
            .uuid
            .clone();
    // Restarted with a new key: the grant does not verify.
    let live = mirror("bestfit", nodes, vec![inv.clone()], vec![bound]);
    let why = rejection(&live, "n", "1").expect("blocked");
    assert!(
        why.contains("pod ml/a holds GPUs under a grant that cannot be read"),
        "{why}"
    );
    // Once the agent reports it, the GPU it holds is counted and the other one is free.
    live.lock().upsert_inventory(reported(
        inv,
        &[("ml", "a", "tessera.io/gpu", &[uuid.as_str()])],
    ));
    assert_eq!(whole_gpus(&live, "n"), vec![uuid]);
    assert_eq!(rejection(&live, "n", "1"), None);
    assert!(rejection(&live, "n", "2").is_some());
}

/// Issue 28 item 4: the grant that landed on the server wins over the reservation's.
#[test]
fn the_grant_on_the_server_wins_over_the_reservation() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 2);
    let live = mirror("bestfit", nodes, vec![inv], vec![]);
    let p = pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]);
    let Reservation::Write {
        annotation: Some(ours),
    } = live.lock().reserve(&p, "n").unwrap()
    else {
        panic!("a GPU grant")
    };
    // An earlier bind of ours (decided on the other GPU) is what landed.
    let mut landed = Allocation::decode_unverified(&ours).unwrap();
    let other = if landed.gpus[0].index == 0 { 1 } else { 0 };
    landed.gpus[0].index = other;
    landed.gpus[0].uuid = format!("GPU-n-{other}");
    let bound = as_bound(p, "n", Some(landed.encode_signed(KEY)));
    live.lock().upsert_pod(bound);
    assert_eq!(whole_gpus(&live, "n"), vec![format!("GPU-n-{other}")]);
}

/// Issue 28 item 4: a reservation whose Binding was sent with an unknown outcome
/// is not freed at its deadline; the pod read back decides.
#[tokio::test(start_paused = true)]
async fn an_unsettled_bind_is_read_back_before_its_gpus_are_freed() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 1);
    let live = mirror("bestfit", nodes, vec![inv], vec![]);
    let p = pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]);
    let Reservation::Write { annotation } = live.lock().reserve(&p, "n").unwrap() else {
        panic!("fresh")
    };
    live.lock().mark_sent("uid-a");
    tokio::time::advance(tessera_k8s::mirror::RESERVATION_TTL * 2).await;
    live.lock().expire_reservations();
    // The watch has not shown it bound: still held, and due for a read.
    assert_eq!(whole_gpus(&live, "n"), vec!["GPU-n-0".to_string()]);
    let due = live.lock().due_for_reread();
    assert_eq!(due, vec![("uid-a".into(), "ml".into(), "a".into())]);
    // The server has it bound with our grant: kept, as bound.
    live.lock()
        .settle("uid-a", Some(as_bound(p.clone(), "n", annotation)));
    assert!(live.lock().due_for_reread().is_empty());
    assert!(live.lock().held("uid-a").is_some_and(|h| h.bound));
    assert_eq!(whole_gpus(&live, "n"), vec!["GPU-n-0".to_string()]);

    // Another whose Binding did not land: read back unbound, its GPU is free again.
    live.lock().remove_pod("uid-a");
    let q = pod("ml", "b", "uid-b", &[("tessera.io/gpu", "1")]);
    live.lock().reserve(&q, "n").unwrap();
    live.lock().mark_sent("uid-b");
    tokio::time::advance(tessera_k8s::mirror::RESERVATION_TTL * 2).await;
    live.lock().expire_reservations();
    assert_eq!(whole_gpus(&live, "n").len(), 1);
    live.lock().settle("uid-b", Some(q));
    assert!(live.lock().held("uid-b").is_none());
    assert!(whole_gpus(&live, "n").is_empty());
}

/// Issue 28 item 5: holding a pod that is held already is refused (it used to
/// overwrite the hold and leak its ledger entry).
#[test]
fn holding_a_held_pod_again_is_refused_and_leaks_nothing() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 2);
    let live = mirror("bestfit", nodes, vec![inv], vec![]);
    let p = pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]);
    let mut m = live.lock();
    let catalog = m.cluster().catalog.clone();
    let req = tessera_k8s::convert::pod_request(&p, &catalog).unwrap();
    let host = tessera_k8s::hostfit::host_ask(&p).unwrap();
    let (first, _) = m.decide(&req, &host, |_| Ok(())).unwrap();
    m.hold(&p, first, req.clone(), host.clone()).unwrap();
    let (second, _) = m.decide(&req, &host, |_| Ok(())).unwrap();
    assert!(m.hold(&p, second, req, host).is_err());
    assert_eq!(m.ledger().allocation_count(), 1);
    m.unreserve("uid-a");
    assert_eq!(m.ledger().allocation_count(), 0);
}

/// Issue 28 item 5: a relist does not learn finished pods again.
#[test]
fn a_relist_does_not_learn_finished_pods_again() {
    let (nodes, inv) = cluster();
    let live = mirror("tessera", nodes, inv, vec![]);
    let mut done = pod("ml", "done", "uid-done", &[("tessera.io/gpu", "1")]);
    done.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    let done = as_bound(done, "a100-1", None);
    live.lock().replace_pods(vec![done.clone()]);
    let once = live.lock().learned().0;
    for _ in 0..3 {
        live.lock().replace_pods(vec![done.clone()]);
    }
    assert_eq!(live.lock().learned().0, once);
}

/// A GPU in MIG mode held through another plugin (NVIDIA's `nvidia.com/mig-*`)
/// is held whole too: the device may be any of its instances.
#[test]
fn a_mig_gpu_held_through_another_plugin_takes_no_instance() {
    let (nodes, inv) = cluster();
    let live = mirror("bestfit", nodes, inv.clone(), vec![]);
    let mig = pod("ml", "m", "uid-m", &[("tessera.io/mig-3g.40gb", "1")]);
    let fits = |m: &tessera_k8s::mirror::SharedMirror| {
        let mut m = m.lock();
        let out = m.filter(&mig, &["a100-2"]).expect("request parses");
        out.reason("a100-2").map(str::to_string)
    };
    assert_eq!(fits(&live), None, "its 3g.40gb instance is free");
    live.lock().upsert_inventory(reported(
        inv[1].clone(),
        &[("other", "x", "nvidia.com/mig-1g.10gb", &["GPU-a100-2-1"])],
    ));
    assert!(fits(&live).is_some());
    // Every memory slice of the MIG GPU is taken.
    assert_eq!(
        live.lock().usage()["a100-2"].gpus[1].mig_memory_slices,
        0xff
    );
    assert!(
        live.lock().problems().is_empty(),
        "{:?}",
        live.lock().problems()
    );
}

/// Issue 27 item 7: rotating the signing key must not make the scheduler forget the
/// GPUs of pods granted under the old key (it would grant them again). A scheduler
/// that signs with a new key and keeps the old one verify-only counts them; one that
/// was given only the new key does not (the failure the rotation procedure avoids),
/// and a grant under a key it never held is refused either way.
#[test]
fn after_a_key_rotation_grants_signed_with_the_old_key_still_hold_their_gpus() {
    use tessera_core::allocation::KeyRing;
    use tessera_core::policy::{PolicyArgs, by_name};
    use tessera_k8s::mirror::{Mirror, SharedMirror};

    let (nodes, inv) = cluster();
    // Before the rotation: the scheduler signs with KEY.
    let before = mirror("tessera", nodes.clone(), inv.clone(), vec![]);
    let p = pod("ml", "running", "uid-running", &[("tessera.io/gpu", "2")]);
    let Reservation::Write { annotation } = before.lock().reserve(&p, "a100-1").unwrap() else {
        panic!("fresh pod")
    };
    let running = as_bound(p, "a100-1", annotation);
    let mut forged = Allocation::decode_unverified(
        running.metadata.annotations.as_ref().unwrap()[ANNOTATION].as_str(),
    )
    .unwrap();
    forged.pod_uid = "uid-forged".into();
    let forged = as_bound(
        pod("ml", "forged", "uid-forged", &[("tessera.io/gpu", "2")]),
        "a100-1",
        Some(forged.encode_signed(b"a-key-nobody-holds-0")),
    );

    let restarted = |keys: KeyRing| {
        let policy = by_name("tessera", &PolicyArgs::default()).unwrap();
        SharedMirror::new(Mirror::from_objects(
            policy,
            keys,
            nodes.clone(),
            inv.clone(),
            vec![running.clone(), forged.clone()],
        ))
    };
    let exclusive = |m: &SharedMirror| {
        m.lock().usage()["a100-1"]
            .gpus
            .iter()
            .filter(|g| g.exclusive)
            .count()
    };
    let new_key = b"the-new-signing-key-2026".to_vec();

    let rotated = restarted(KeyRing::new(new_key.clone()).with_verify_only([KEY.to_vec()]));
    assert_eq!(
        exclusive(&rotated),
        2,
        "the old-key grant holds its two GPUs"
    );
    assert_eq!(
        rotated.lock().key(),
        new_key.as_slice(),
        "new decisions use the new key"
    );
    assert!(
        rotated
            .lock()
            .problems()
            .iter()
            .any(|p| p.contains("ml/forged") && p.contains("signature does not match")),
        "{:?}",
        rotated.lock().problems()
    );

    let old_key_dropped = restarted(KeyRing::new(new_key));
    assert_eq!(
        exclusive(&old_key_dropped),
        0,
        "without the old key its grant is not counted"
    );
}

/// Issue 28 item 9: the agents republish their GpuNode status every minute
/// (83 a second at 5,000 nodes); only a change placement reads (spec, health,
/// the kubelet's report) is worth a scheduling pass.
#[test]
fn only_a_placement_change_to_a_gpunode_is_worth_a_pass() {
    let policy = tessera_core::policy::by_name("tessera", &Default::default()).unwrap();
    let mut m = tessera_k8s::mirror::Mirror::from_objects(
        policy,
        b"k".to_vec(),
        vec![common::kube_node("n1", "32", "64Gi")],
        Vec::new(),
        Vec::new(),
    );
    let gn = common::gpu_node("n1", "A100-80GB", 81_920, 2);
    assert!(m.upsert_inventory(gn.clone()), "a new GpuNode");
    let mut republished = gn.clone();
    republished.status = Some(tessera_api::GpuNodeStatus {
        free_memory_mib: 12_345,
        last_update: Some("2026-12-04T00:01:00Z".into()),
        ..Default::default()
    });
    assert!(
        !m.upsert_inventory(republished.clone()),
        "status figures only"
    );
    let mut bigger = republished;
    bigger.spec.gpus.pop();
    assert!(m.upsert_inventory(bigger), "a GPU gone");
}

/// Real 1.36, standalone: a pod waiting for two GPUs slept out its 60 s
/// backoff after the pod holding them was deleted, because the GPUs were
/// freed only by the node agent's next PodResources report, later than the
/// deletion, and only a released holding woke waiting pods. A report that
/// drops a container holding GPUs counts as room freed ([`Mirror::released`]);
/// a heartbeat or a report that only adds a holder does not.
#[test]
fn a_report_that_frees_gpus_counts_as_room_given_back() {
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 4);
    let held = [("ml", "old", "nvidia.com/gpu", &["GPU-n-2"][..])];
    let live = mirror("bestfit", nodes, vec![reported(inv.clone(), &held)], vec![]);
    let before = live.lock().released();
    // The same report again (a heartbeat) and one more holder: nothing freed.
    live.lock().upsert_inventory(reported(inv.clone(), &held));
    let more = [held[0], ("ml", "new", "nvidia.com/gpu", &["GPU-n-0"][..])];
    live.lock().upsert_inventory(reported(inv.clone(), &more));
    assert_eq!(live.lock().released(), before, "nothing was freed");
    // The old pod's container is no longer listed: room given back.
    live.lock()
        .upsert_inventory(reported(inv.clone(), &[more[1]]));
    assert_eq!(live.lock().released(), before + 1, "GPU-n-2 freed");
    assert_eq!(whole_gpus(&live, "n"), vec!["GPU-n-0".to_string()]);
}

/// Issue 41, one ledger for grants and claims: what allocated claims hold of
/// GPUs the `GpuNode` lists is counted in the ledger (whole GPUs whole,
/// shares by their memory and compute), is left out of the grants the DRA
/// side reads, is freed when the claims go, and a claim on a GPU a grant holds
/// already blocks the node instead of being counted twice.
#[test]
fn gpus_claims_hold_are_counted_in_the_ledger_and_conflicts_block_the_node() {
    use tessera_core::holdings::GpuHold;
    let nodes = vec![kube_node("n", "64", "512Gi")];
    let inv = gpu_node("n", "A100-80GB", 81_920, 3);
    let live = mirror("bestfit", nodes, vec![inv], vec![]);
    let on = |uuid: &str, consumer: &str, share| GpuHold {
        node: "n".into(),
        uuid: uuid.into(),
        consumer: consumer.into(),
        share,
    };
    // A whole claim on GPU 0, and a 40 GiB, 500 ‰ share of GPU 1; a claim on
    // a node the mirror does not know counts nothing.
    live.lock().set_claims_on_gpus(vec![
        on("GPU-n-0", "c0", None),
        on("GPU-n-1", "c1", Some((40_960, 500))),
        GpuHold {
            node: "elsewhere".into(),
            ..on("GPU-n-2", "c2", None)
        },
    ]);
    assert_eq!(whole_gpus(&live, "n"), ["GPU-n-0"]);
    {
        let mut m = live.lock();
        let use1 = m.usage()["n"].gpus[1];
        assert_eq!(use1.free_memory_mib, 81_920 - 40_960, "{use1:?}");
        let (_, grants) = m.grants();
        assert_eq!(grants.count(), 0, "claims are not grants");
    }
    // Three whole GPUs do not fit; one does, on GPU 2.
    assert!(rejection(&live, "n", "3").is_some());
    assert!(rejection(&live, "n", "2").is_some());
    assert_eq!(rejection(&live, "n", "1"), None);
    let p = reserve_bound(
        &live,
        pod("ml", "a", "uid-a", &[("tessera.io/gpu", "1")]),
        "n",
    );
    assert_eq!(grant_of(&p).gpus[0].uuid, "GPU-n-2");

    // The claims go: their GPUs are free again, the grant stays.
    let released = live.lock().released();
    live.lock().set_claims_on_gpus(vec![]);
    assert!(live.lock().released() > released, "room was given back");
    assert_eq!(whole_gpus(&live, "n"), ["GPU-n-2"]);
    assert_eq!(rejection(&live, "n", "2"), None);

    // A claim on the granted GPU (two allocators raced): not counted twice,
    // the node takes nothing more until it is resolved.
    live.lock()
        .set_claims_on_gpus(vec![on("GPU-n-2", "late", Some((1024, 100)))]);
    let why = rejection(&live, "n", "1").expect("blocked");
    assert!(why.contains("claim late"), "{why}");
}

/// A claim on a GPU in MIG mode (a MIG device of it, or the GPU) holds it
/// whole in the ledger: every memory slice taken, no instance granted there.
#[test]
fn a_claim_on_a_mig_gpu_takes_every_instance_of_it() {
    use tessera_core::holdings::GpuHold;
    let (nodes, inv) = cluster();
    let live = mirror("bestfit", nodes, inv, vec![]);
    let mig = pod("ml", "m", "uid-m", &[("tessera.io/mig-3g.40gb", "1")]);
    let fits = |m: &tessera_k8s::mirror::SharedMirror| {
        let mut m = m.lock();
        let out = m.filter(&mig, &["a100-2"]).expect("request parses");
        out.reason("a100-2").map(str::to_string)
    };
    assert_eq!(fits(&live), None);
    live.lock().set_claims_on_gpus(vec![GpuHold {
        node: "a100-2".into(),
        uuid: "GPU-a100-2-1".into(),
        consumer: "mig-claim".into(),
        share: Some((10_240, 140)),
    }]);
    assert!(fits(&live).is_some());
    assert_eq!(
        live.lock().usage()["a100-2"].gpus[1].mig_memory_slices,
        0xff
    );
}
