//! `Allocate` against an in-process, kubelet-shaped peer: whole, shared and MIG
//! decisions, refusal of forged and foreign decisions, one grant per container
//! (init containers, sidecars and app containers), `nvidia.com/gpu`, and the
//! device-list strategies.

mod common;

use std::time::Duration;

use common::*;
use tessera_core::allocation::MigGrant;
use tessera_core::containers::{assign, gpu_demands};
use tessera_core::request::Isolation;
use tessera_node::deviceplugin::allocate::{Container, ContainerKind};
use tessera_node::proto::deviceplugin as pb;

/// Two app containers, one GPU each, and a decision without a container list
/// (as written before the list existed): no container may receive the GPU
/// meant for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_never_receives_another_containers_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;
    let both = decision(
        "uid-two",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000), grant(1, GPU1, 81_920, 1000)],
    );
    let mut p = pod(
        "uid-two",
        "two",
        1,
        "tessera.io/gpu",
        1,
        Some(both.encode_signed(KEY)),
    );
    let mut second = p.containers[0].clone();
    second.name = "second".into();
    p.containers.push(second);
    agent.pods.set(vec![p]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    for call in 0..2 {
        match allocate(&mut gpu, &[&format!("{GPU0}::0")]).await {
            Ok(r) => {
                let seen = format!("{:?}", r);
                assert!(
                    !(seen.contains(GPU0) && seen.contains(GPU1)),
                    "one container was handed both containers' GPUs: {seen}"
                );
            }
            // The first container is refused; the kubelet then fails the pod's
            // admission, so no later call is taken for it.
            Err(e) if call == 0 => assert!(
                e.message().contains("ml/two")
                    && e.message()
                        .contains("does not say which container gets which GPU"),
                "{}",
                e.message()
            ),
            Err(e) => assert!(e.message().contains("no pending pod"), "{}", e.message()),
        }
    }
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// An init container and two app containers asking one GPU each, placed on
/// two GPUs: the kubelet calls once per container (init first) and each app
/// container gets its own GPU; the init container reuses one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_container_gets_its_own_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;
    let one: &[(&str, &str)] = &[("tessera.io/gpu", "1")];
    let containers = vec![
        Container::new("fetch", ContainerKind::Init, one),
        Container::new("train", ContainerKind::App, one),
        Container::new("cpu-only", ContainerKind::App, &[("cpu", "1")]),
        Container::new("eval", ContainerKind::App, one),
    ];
    let mut d = decision(
        "uid-multi",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000), grant(1, GPU1, 81_920, 1000)],
    );
    // The list the scheduler writes, from the same core functions.
    let demands = gpu_demands(&containers).unwrap();
    d.containers = assign(&demands, d.gpus.len()).unwrap();
    let mut p = pod(
        "uid-multi",
        "multi",
        1,
        "tessera.io/gpu",
        1,
        Some(d.encode_signed(KEY)),
    );
    p.containers = containers;
    // An older one-container pod waits behind the pod being admitted.
    let single = decision(
        "uid-single",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000)],
    );
    let older = pod(
        "uid-single",
        "single",
        0,
        "tessera.io/gpu",
        1,
        Some(single.encode_signed(KEY)),
    );
    agent.pods.set(vec![p, older]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut seen = Vec::new();
    for call in 0..4 {
        // The kubelet admits the older pod first, then `multi`.
        match call {
            0 => agent.admitting("single", &[]),
            _ => agent.admitting("multi", &["single"]),
        }
        let r = allocate(&mut gpu, &[&format!("{GPU1}::0")]).await.unwrap();
        seen.push(mounted_devices(&r).join(","));
    }
    // Oldest first: `single`, then `multi`'s containers in the kubelet's order.
    assert_eq!(seen, [GPU0, GPU0, GPU0, GPU1]);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// `nvidia.com/gpu: N` pods get whole GPUs from their decision; a share cannot
/// be had through it (the kubelet counts one pod per device).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_gpu_is_answered_from_the_decision() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;
    let mut nv = dial(&dir.path().join("tessera-nvidia-gpu.sock"))
        .await
        .unwrap();
    let mut stream = nv.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let ids: Vec<String> = stream
        .message()
        .await
        .unwrap()
        .unwrap()
        .devices
        .into_iter()
        .map(|d| d.id)
        .collect();
    // One device per GPU without MIG mode.
    assert_eq!(ids, [GPU0, GPU1]);
    let whole = decision(
        "uid-nv",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000)],
    );
    let share = decision(
        "uid-nv-share",
        NODE,
        Isolation::Mps,
        vec![grant(1, GPU1, 20_000, 250)],
    );
    agent.pods.set(vec![
        pod(
            "uid-nv",
            "nv",
            1,
            "nvidia.com/gpu",
            1,
            Some(whole.encode_signed(KEY)),
        ),
        pod(
            "uid-nv-share",
            "nv-share",
            2,
            "nvidia.com/gpu",
            1,
            Some(share.encode_signed(KEY)),
        ),
    ]);
    agent.admitting("nv", &[]);
    // Asked first, the plugin steers the kubelet to the decision's GPU, so its
    // record (PodResources) names what the container reaches (e2e: a report
    // naming another GPU blocked the node).
    let pref = nv
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec![GPU0.into(), GPU1.into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pref.container_responses[0].device_i_ds, [GPU0]);
    // The kubelet picked GPU1 anyway; the decision says GPU0.
    let r = allocate(&mut nv, &[GPU1]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU0]);
    agent.admitting("nv-share", &["nv"]);
    let e = allocate(&mut nv, &[GPU0]).await.unwrap_err();
    assert!(
        e.message().contains("ml/nv-share")
            && e.message()
                .contains("decision grants mps GPUs but the kubelet asked for nvidia.com/gpu"),
        "{}",
        e.message()
    );
    drop(stream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// With `cdi-cri` the devices travel as CDI names, and the environment names none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_strategy_names_the_devices() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent_with(dir.path(), Duration::from_secs(3600), "cdi-cri");
    registered(&mut kubelet, 4).await;
    let mut m = grant(2, GPU2, 9_728, 142);
    m.mig = Some(MigGrant {
        profile: "1g.10gb".into(),
        start: 1,
        size: 1,
        uuid: MIG2.into(),
        create: false,
        enable_mig_mode: false,
    });
    let mig = decision("uid-mig", NODE, Isolation::Mig, vec![m]);
    let whole = decision(
        "uid-whole",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000)],
    );
    agent.pods.set(vec![
        pod(
            "uid-mig",
            "mig",
            1,
            "tessera.io/mig-1g.10gb",
            1,
            Some(mig.encode_signed(KEY)),
        ),
        pod(
            "uid-whole",
            "whole",
            2,
            "tessera.io/gpu",
            1,
            Some(whole.encode_signed(KEY)),
        ),
    ]);
    let mut migc = dial(&dir.path().join("tessera-mig-1g.10gb.sock"))
        .await
        .unwrap();
    let r = allocate(&mut migc, &["MIG-11111111-1111-1111-1111-111111111111"])
        .await
        .unwrap();
    let names: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, [format!("nvidia.com/gpu={MIG2}")]);
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "void");
    assert!(r.mounts.is_empty());
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let r = allocate(&mut gpu, &[&format!("{GPU1}::0")]).await.unwrap();
    let names: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, [format!("nvidia.com/gpu={GPU0}")]);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_answers_from_the_scheduler_decision() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;

    let gpu_res = "tessera.io/gpu";
    let mig_res = "tessera.io/mig-1g.10gb";
    let whole = decision(
        "uid-whole",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000), grant(1, GPU1, 81_920, 1000)],
    );
    let shared = decision(
        "uid-shared",
        NODE,
        Isolation::Mps,
        vec![grant(1, GPU1, 20_000, 250)],
    );
    let mut m = grant(2, GPU2, 9_728, 142);
    m.mig = Some(MigGrant {
        profile: "1g.10gb".into(),
        start: 1,
        size: 1,
        uuid: String::new(),
        create: false,
        enable_mig_mode: false,
    });
    let mig = decision("uid-mig", NODE, Isolation::Mig, vec![m]);
    let forged = decision(
        "uid-forged",
        NODE,
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000)],
    );
    let foreign = decision(
        "uid-foreign",
        "gpu-node-9",
        Isolation::Exclusive,
        vec![grant(0, GPU0, 81_920, 1000)],
    );
    agent.pods.set(vec![
        pod(
            "uid-whole",
            "whole",
            1,
            gpu_res,
            2,
            Some(whole.encode_signed(KEY)),
        ),
        pod(
            "uid-shared",
            "shared",
            2,
            gpu_res,
            1,
            Some(shared.encode_signed(KEY)),
        ),
        pod(
            "uid-mig",
            "mig",
            3,
            mig_res,
            1,
            Some(mig.encode_signed(KEY)),
        ),
        pod(
            "uid-forged",
            "forged",
            4,
            gpu_res,
            1,
            Some(forged.encode_signed(b"a-guess")),
        ),
        pod(
            "uid-foreign",
            "foreign",
            5,
            gpu_res,
            1,
            Some(foreign.encode_signed(KEY)),
        ),
        // A decision copied from the shared pod onto another pod.
        pod(
            "uid-copy",
            "copy",
            6,
            gpu_res,
            1,
            Some(shared.encode_signed(KEY)),
        ),
        pod("uid-none", "none", 7, gpu_res, 1, None),
    ]);

    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut migc = dial(&dir.path().join("tessera-mig-1g.10gb.sock"))
        .await
        .unwrap();

    // Whole GPUs: the kubelet's token choice does not matter, the decision does.
    let r = allocate(&mut gpu, &[&format!("{GPU1}::0"), &format!("{GPU1}::1")])
        .await
        .unwrap();
    // Handed over by volume mounts (the default), not by a list in the environment.
    assert_eq!(
        r.envs["NVIDIA_VISIBLE_DEVICES"],
        "/var/run/nvidia-container-devices"
    );
    assert_eq!(
        mounted_devices(&r),
        [GPU0, GPU1],
        "one /dev/null mount per granted GPU"
    );
    assert!(!r.envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));

    // An MPS share (the PodResources API tells it from the other 1-GPU pods).
    agent.admitting("shared", &["whole"]);
    let r = allocate(&mut gpu, &[&format!("{GPU0}::2")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU1]);
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20000M");
    assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tessera/mps/pipe");
    let mounts: Vec<(&str, &str)> = r
        .mounts
        .iter()
        .filter(|m| m.host_path != "/dev/null")
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/run/tessera/mps/pipe", "/tessera/mps/pipe"),
            ("/run/tessera/mps/shm", "/dev/shm")
        ]
    );

    // A MIG instance, found by profile and placement.
    agent.admitting("mig", &["whole", "shared"]);
    let r = allocate(&mut migc, &["MIG-11111111-1111-1111-1111-111111111111"])
        .await
        .unwrap();
    assert_eq!(mounted_devices(&r), [MIG2]);

    // Refusals, each naming its reason.
    agent.admitting("forged", &["whole", "shared", "mig"]);
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().contains("ml/forged") && e.message().contains("not written by the scheduler"),
        "{}",
        e.message()
    );
    agent.admitting("foreign", &["whole", "shared", "mig", "forged"]);
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert!(
        e.message().contains("ml/foreign")
            && e.message()
                .contains("for node gpu-node-9, this is node gpu-node-1"),
        "{}",
        e.message()
    );
    agent.admitting("copy", &["whole", "shared", "mig", "forged", "foreign"]);
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert!(
        e.message().contains("ml/copy") && e.message().contains("another pod"),
        "{}",
        e.message()
    );
    agent.admitting(
        "none",
        &["whole", "shared", "mig", "forged", "foreign", "copy"],
    );
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("ml/none") && e.message().contains("no scheduling decision"),
        "{}",
        e.message()
    );
    // Nobody left asking.
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert!(
        e.message().contains("no pending pod on node gpu-node-1"),
        "{}",
        e.message()
    );

    // GetPreferredAllocation: two GPUs joined by NVLink, one token each.
    let avail: Vec<String> = (0..4)
        .flat_map(|k| [format!("{GPU0}::{k}"), format!("{GPU1}::{k}")])
        .collect();
    let pref = gpu
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: avail,
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        [format!("{GPU0}::0"), format!("{GPU1}::0")]
    );

    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}
