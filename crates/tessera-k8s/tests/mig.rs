//! MIG grants name instances that exist in the `GpuNode` inventory (issue 9, finding 7).
//!
//! The node agent hands a container only a MIG instance that exists, so the
//! scheduler may grant only the instances the inventory lists, by UUID and
//! placement, each at most once, and must say so when none exists.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use tessera_api::{GpuNode, MigInstance};
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_k8s::mirror::{Reservation, ReserveError, SharedMirror};

const MIG_UUID: &str = "MIG-8a2f0c1e-5b7d-5e2a-9c3f-1d2e3f4a5b6c";

/// An A100-80GB node whose GPU 0 is in MIG mode with `instances`; GPU 1 is a plain GPU.
fn mig_node(name: &str, instances: Vec<MigInstance>) -> GpuNode {
    let mut gn = gpu_node(name, "A100-80GB", 81_920, 2);
    gn.spec.gpus[0].mig.enabled = true;
    gn.spec.gpus[0].mig.instances = instances;
    gn
}

fn instance(profile: &str, start: u8, size: u8, uuid: &str) -> MigInstance {
    MigInstance {
        profile: profile.into(),
        start,
        size,
        uuid: uuid.into(),
    }
}

fn mig_pod(name: &str) -> Pod {
    pod(
        "ml",
        name,
        &format!("uid-{name}"),
        &[("tessera.io/mig-3g.40gb", "1")],
    )
}

fn bound(mut p: Pod, node: &str, annotation: String) -> Pod {
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION.to_string(), annotation);
    p.spec.as_mut().unwrap().node_name = Some(node.to_string());
    p
}

fn reserve(m: &SharedMirror, p: &Pod, node: &str) -> String {
    match m.lock().reserve(p, node) {
        Ok(Reservation::Write {
            annotation: Some(a),
        }) => a,
        other => panic!("expected a written allocation, got {other:?}"),
    }
}

#[test]
fn the_grant_names_the_existing_instance_at_its_placement_once() {
    let inv = vec![mig_node("a100", vec![instance("3g.40gb", 4, 4, MIG_UUID)])];
    let nodes = vec![kube_node("a100", "32", "256Gi")];
    let m = mirror("tessera", nodes.clone(), inv.clone(), vec![]);

    let first = mig_pod("first");
    let annotation = reserve(&m, &first, "a100");
    let a = Allocation::decode_unverified(&annotation).unwrap();
    assert_eq!(a.gpus.len(), 1);
    let g = &a.gpus[0];
    assert_eq!(g.index, 0, "the MIG GPU, not the plain one");
    let grant = g.mig.as_ref().expect("a MIG grant");
    // The instance the inventory lists: start 4 (not the first free placement, 0), by UUID.
    assert_eq!(
        (
            grant.profile.as_str(),
            grant.start,
            grant.size,
            grant.uuid.as_str()
        ),
        ("3g.40gb", 4, 4, MIG_UUID)
    );
    // 3 of the A100's 7 compute slices, rounded down to per-mille: 3000 / 7 = 428.
    assert_eq!((g.memory_mib, g.cores_milli), (40_192, 428));

    // The one instance is now taken: a second pod is refused, not given it again.
    let second = mig_pod("second");
    match m.lock().reserve(&second, "a100") {
        Err(ReserveError::DoesNotFit { reason, .. }) => {
            assert_eq!(reason, "every 3g.40gb MIG instance is in use")
        }
        other => panic!("expected no fit, got {other:?}"),
    }

    // A restart replays the annotation into the same ledger, and still refuses the second pod.
    m.lock()
        .upsert_pod(bound(first.clone(), "a100", annotation.clone()));
    let before = m.lock().usage();
    let restarted = mirror(
        "tessera",
        nodes,
        inv,
        vec![bound(first, "a100", annotation)],
    );
    assert_eq!(restarted.lock().usage(), before);
    assert!(
        restarted.lock().problems().is_empty(),
        "{:?}",
        restarted.lock().problems()
    );
    assert!(matches!(
        restarted.lock().reserve(&second, "a100"),
        Err(ReserveError::DoesNotFit { .. })
    ));
}

#[test]
fn a_mig_gpu_without_instances_is_refused_with_a_clear_reason() {
    let nodes = vec![
        kube_node("a100", "32", "256Gi"),
        kube_node("t4", "8", "32Gi"),
    ];
    let inv = vec![
        mig_node("a100", vec![instance("1g.10gb", 0, 1, "MIG-1g")]),
        gpu_node("t4", "T4", 15_360, 1),
    ];
    let m = mirror("tessera", nodes, inv, vec![]);
    let req =
        tessera_k8s::convert::pod_request(&mig_pod("p"), &m.lock().cluster().catalog).unwrap();
    let e = m
        .lock()
        .decide(&req, &Default::default(), |_| Ok(()))
        .expect_err("no 3g.40gb instance exists");
    assert_eq!(
        e.to_string(),
        "0/2 nodes fit: 1 no MIG GPU offering 3g.40gb, 1 no 3g.40gb MIG instance exists \
         on a GPU, and Tessera may not create one here (that needs the node label \
         tessera.io/mig-dynamic and free MIG space)"
    );
    match m.lock().reserve(&mig_pod("p"), "a100") {
        Err(ReserveError::DoesNotFit { reason, .. }) => {
            assert!(reason.contains("may not create one here"), "{reason}")
        }
        other => panic!("expected no fit, got {other:?}"),
    }
}

#[test]
fn whole_and_shared_gpus_stay_off_a_gpu_in_mig_mode() {
    let nodes = vec![kube_node("a100", "32", "256Gi")];
    let inv = vec![mig_node("a100", vec![instance("3g.40gb", 4, 4, MIG_UUID)])];
    let m = mirror("tessera", nodes, inv, vec![]);
    for (name, res) in [
        ("whole", vec![("tessera.io/gpu", "1")]),
        ("share", vec![("tessera.io/gpu-milli", "300")]),
    ] {
        let p = pod("ml", name, &format!("uid-{name}"), &res);
        let a = Allocation::decode_unverified(&reserve(&m, &p, "a100")).unwrap();
        assert_eq!(
            a.gpus
                .iter()
                .map(|g| (g.index, g.mig.is_some()))
                .collect::<Vec<_>>(),
            [(1, false)],
            "{name}: the plain GPU only"
        );
        m.lock().unreserve(&format!("uid-{name}"));
    }
    // Two whole GPUs do not fit: one of the two is in MIG mode.
    let two = pod("ml", "two", "uid-two", &[("tessera.io/gpu", "2")]);
    assert!(matches!(
        m.lock().reserve(&two, "a100"),
        Err(ReserveError::DoesNotFit { .. })
    ));
}

#[test]
fn only_instances_that_can_exist_are_taken_from_the_inventory() {
    use tessera_core::model::Catalog;
    let mut gn = mig_node(
        "a100",
        vec![
            instance("3g.40gb", 4, 4, "MIG-ok"),
            // Overlaps MIG-ok's slices 4..7: a hand-written mistake, never granted.
            instance("1g.10gb", 5, 1, "MIG-overlap"),
            // A profile this build does not know (left out, the node stays usable).
            instance("1g.12gb", 0, 1, "MIG-unknown"),
            // 3g.40gb cannot start at slice 2.
            instance("3g.40gb", 2, 4, "MIG-bad-start"),
            instance("1g.10gb", 0, 1, "MIG-1g"),
        ],
    );
    // Instances on a GPU that is not in MIG mode are not grantable either.
    gn.spec.gpus[1].mig.instances = vec![instance("1g.10gb", 0, 1, "MIG-stray")];
    let mut catalog = Catalog::default();
    let node =
        tessera_k8s::convert::core_node(&kube_node("a100", "32", "256Gi"), Some(&gn), &mut catalog)
            .unwrap();
    let uuids: Vec<&str> = node.gpus[0]
        .mig_instances
        .iter()
        .map(|m| m.uuid.as_str())
        .collect();
    assert_eq!(uuids, ["MIG-ok", "MIG-1g"]);
    assert!(node.gpus[1].mig_instances.is_empty());
    // What is kept always makes a valid cluster (a refused cluster would stop all scheduling).
    tessera_core::Cluster::new(catalog, vec![node]).unwrap();
}

#[test]
fn an_annotation_without_uuid_replays_at_its_placement() {
    // An allocation written before grants named the instance: it replays at the start it
    // gives, so those slices stay taken and the instance is not handed out again.
    let inv = vec![mig_node("a100", vec![instance("3g.40gb", 0, 4, "MIG-a")])];
    let nodes = vec![kube_node("a100", "32", "256Gi")];
    let m = mirror("tessera", nodes.clone(), inv.clone(), vec![]);
    let first = mig_pod("first");
    let annotation = reserve(&m, &first, "a100");
    let mut a = Allocation::decode_unverified(&annotation).unwrap();
    a.gpus[0].mig.as_mut().unwrap().uuid.clear();
    let old = a.encode_signed(KEY);
    let restarted = mirror("tessera", nodes, inv, vec![bound(first, "a100", old)]);
    assert!(
        restarted.lock().problems().is_empty(),
        "{:?}",
        restarted.lock().problems()
    );
    assert!(matches!(
        restarted.lock().reserve(&mig_pod("second"), "a100"),
        Err(ReserveError::DoesNotFit { .. })
    ));
}

/// Standalone decides through the core's judge, so a `hard` share ranks nodes
/// by isolation tier first (a free MIG instance before a whole GPU) exactly as
/// the core scheduler does: same node, same score, same score parts.
#[test]
fn a_hard_share_is_ranked_as_the_core_scheduler_ranks_it() {
    use rand::SeedableRng;
    use tessera_core::policy::{PolicyArgs, by_name};
    use tessera_core::request::{IsolationLevel, Request};
    use tessera_core::scheduler::{Decision, Scheduler};
    let nodes = vec![
        kube_node("a100", "32", "256Gi"),
        kube_node("t4", "8", "32Gi"),
    ];
    let inv = vec![
        mig_node("a100", vec![instance("3g.40gb", 4, 4, MIG_UUID)]),
        gpu_node("t4", "T4", 15_360, 1),
    ];
    let hard = Request::share_level(300, IsolationLevel::Hard, 0, 0);
    // Policies without a learned workload (the mirror builds `tessera` from the
    // pods it has seen, so its fragmentation target differs from the default).
    for policy in ["binpack", "spread", "bestfit"] {
        let m = mirror(policy, nodes.clone(), inv.clone(), vec![]);
        let mut m = m.lock();
        let (cluster, ledger) = (m.cluster().clone(), m.ledger().clone());
        let mut core = Scheduler::new(by_name(policy, &PolicyArgs::default()).unwrap());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let Decision::Place(want) = core.decide(&cluster, &ledger, &hard, &mut rng) else {
            panic!("{policy}: a hard share fits");
        };
        let (got, e) = m
            .decide(&hard, &Default::default(), |_| Ok(()))
            .expect("fits");
        assert_eq!(e.fit, 2, "{policy}: both nodes can take it");
        assert_eq!(
            (got.node, got.score, &got.terms),
            (want.node, want.score, &want.terms),
            "{policy}"
        );
        // On the T4 it would get a whole GPU: ranked below by the isolation tier.
        let (on_t4, _) = m
            .decide(&hard, &Default::default(), |f| {
                (f.name == "t4").then_some(()).ok_or("not the t4".into())
            })
            .expect("the t4 takes it");
        assert!(
            on_t4.terms.iter().any(|t| t.name == "isolation-tier"),
            "{policy}: {:?}",
            on_t4.terms
        );
        assert!(on_t4.score < got.score, "{policy}");
    }
}

/// The GPU Operator's "single" strategy node: `a100`, GPU 0 in MIG mode with two
/// `3g.40gb` instances, GPU 1 plain, labelled as GFD labels it.
fn single_node(strategy: Option<&str>) -> (k8s_openapi::api::core::v1::Node, GpuNode) {
    let mut node = kube_node("a100", "32", "256Gi");
    if let Some(s) = strategy {
        node.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("nvidia.com/mig.strategy".into(), s.into());
    }
    let inv = mig_node(
        "a100",
        vec![
            instance("3g.40gb", 0, 4, "MIG-a"),
            instance("3g.40gb", 4, 4, "MIG-b"),
        ],
    );
    (node, inv)
}

fn gpu_pod(name: &str) -> Pod {
    pod(
        "ml",
        name,
        &format!("uid-{name}"),
        &[("nvidia.com/gpu", "1")],
    )
}

/// Issue 27 item 8: under the single strategy an `nvidia.com/gpu: 1` pod gets one
/// MIG instance, named by its UUID, each instance at most once; the grants replay
/// after a restart, and still hold their instances when the node's strategy
/// changes to mixed under them.
#[test]
fn single_strategy_serves_each_instance_as_a_gpu() {
    let (node, inv) = single_node(Some("single"));
    let m = mirror("tessera", vec![node.clone()], vec![inv.clone()], vec![]);
    let mut uuids = Vec::new();
    let mut bound_pods = Vec::new();
    for name in ["p1", "p2", "p3"] {
        let p = gpu_pod(name);
        let annotation = reserve(&m, &p, "a100");
        let a = Allocation::decode_unverified(&annotation).unwrap();
        assert_eq!(a.gpus.len(), 1);
        assert!(a.gpus[0].mig.is_none(), "a whole GPU, not a MIG grant");
        if a.gpus[0].uuid.starts_with("MIG-") {
            assert_eq!(a.gpus[0].index, 0, "the instance's parent");
            assert_eq!(a.gpus[0].memory_mib, 40_192, "the instance's memory");
        }
        uuids.push(a.gpus[0].uuid.clone());
        let b = bound(p, "a100", annotation);
        m.lock().upsert_pod(b.clone());
        bound_pods.push(b);
    }
    uuids.sort();
    assert_eq!(uuids, ["GPU-a100-1", "MIG-a", "MIG-b"]);
    // Three GPUs on the node, all taken.
    assert!(matches!(
        m.lock().reserve(&gpu_pod("p4"), "a100"),
        Err(ReserveError::DoesNotFit { .. })
    ));
    // A share never lands on an instance (the plain GPU is held whole).
    let share = pod("ml", "s", "uid-s", &[("tessera.io/gpu-memory", "1Gi")]);
    assert!(matches!(
        m.lock().reserve(&share, "a100"),
        Err(ReserveError::DoesNotFit { .. })
    ));

    // A restart replays every grant: nothing is free, nothing is wrong.
    let before = m.lock().usage();
    let restarted = mirror("tessera", vec![node], vec![inv.clone()], bound_pods.clone());
    assert_eq!(restarted.lock().usage(), before);
    assert!(
        restarted.lock().problems().is_empty(),
        "{:?}",
        restarted.lock().problems()
    );

    // The label removed: the instances are MIG instances again, still held.
    let (mixed, _) = single_node(None);
    let flipped = mirror("tessera", vec![mixed], vec![inv], bound_pods);
    assert!(
        flipped.lock().problems().is_empty(),
        "{:?}",
        flipped.lock().problems()
    );
    match flipped.lock().reserve(&mig_pod("m"), "a100") {
        Err(ReserveError::DoesNotFit { reason, .. }) => {
            assert_eq!(reason, "every 3g.40gb MIG instance is in use")
        }
        other => panic!("expected no fit, got {other:?}"),
    }
}

/// Without the label (or with `mixed`) a whole-GPU pod never gets an instance,
/// and under `single` a pod naming a profile gets none either: the instances
/// are GPUs there.
#[test]
fn only_the_single_strategy_serves_instances_to_whole_gpu_pods() {
    let (node, inv) = single_node(Some("mixed"));
    let m = mirror("tessera", vec![node], vec![inv.clone()], vec![]);
    let a = Allocation::decode_unverified(&reserve(&m, &gpu_pod("p1"), "a100")).unwrap();
    assert_eq!(a.gpus[0].uuid, "GPU-a100-1");
    assert!(matches!(
        m.lock().reserve(&gpu_pod("p2"), "a100"),
        Err(ReserveError::DoesNotFit { .. })
    ));

    let (node, inv) = single_node(Some("single"));
    let m = mirror("tessera", vec![node], vec![inv], vec![]);
    assert!(matches!(
        m.lock().reserve(&mig_pod("m"), "a100"),
        Err(ReserveError::DoesNotFit { .. })
    ));
}

/// A pod of NVIDIA's plugin holding one instance as `nvidia.com/gpu` before
/// Tessera managed the node: the agent reports the instance's device ID and its
/// parent GPU; exactly that instance is held.
#[test]
fn an_instance_held_through_another_plugin_is_held_on_a_single_node() {
    let (node, mut inv) = single_node(Some("single"));
    inv.status = Some(tessera_api::GpuNodeStatus {
        pod_resources: Some(tessera_api::PodResourcesReport {
            observed_at: "2026-12-04T08:00:00Z".into(),
            containers: vec![tessera_api::gpunode::ContainerDevices {
                namespace: "ml".into(),
                pod: "old".into(),
                container: "c".into(),
                resource: "nvidia.com/gpu".into(),
                device_ids: vec!["MIG-b".into()],
                gpu_uuids: vec!["GPU-a100-0".into()],
            }],
        }),
        ..Default::default()
    });
    let mut old = gpu_pod("old");
    old.spec.as_mut().unwrap().node_name = Some("a100".into());
    let m = mirror("tessera", vec![node], vec![inv], vec![old]);
    assert!(m.lock().problems().is_empty(), "{:?}", m.lock().problems());
    let mut uuids = Vec::new();
    for name in ["p1", "p2"] {
        let p = gpu_pod(name);
        let annotation = reserve(&m, &p, "a100");
        let a = Allocation::decode_unverified(&annotation).unwrap();
        uuids.push(a.gpus[0].uuid.clone());
        m.lock().upsert_pod(bound(p, "a100", annotation));
    }
    uuids.sort();
    assert_eq!(uuids, ["GPU-a100-1", "MIG-a"], "MIG-b is the old pod's");
}
