//! Shares asked at an isolation level (issue 13), through the real device-plugin
//! gRPC over a unix socket: a `hard` share the scheduler gave a MIG instance is
//! answered with that instance although the pod took `tessera.io/gpu` tokens, and
//! `soft` shares on one GPU get their own, unequal MPS per-client limits.

mod common;

use std::time::Duration;

use common::*;
use tessera_core::allocation::MigGrant;
use tessera_core::request::Isolation;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_share_gets_its_mig_instance_and_soft_shares_their_mps_limits() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;
    // The hard share: a 1g.10gb instance (the smallest covering a 10 % share) on GPU 2.
    let mut m = grant(2, GPU2, 9_728, 142);
    m.mig = Some(MigGrant {
        profile: "1g.10gb".into(),
        start: 1,
        size: 1,
        uuid: MIG2.into(),
        create: false,
        enable_mig_mode: false,
    });
    let hard = decision("uid-hard", NODE, Isolation::Mig, vec![m]);
    // Two soft shares of GPU 0 with different limits.
    let small = decision(
        "uid-small",
        NODE,
        Isolation::Mps,
        vec![grant(0, GPU0, 16_384, 200)],
    );
    let large = decision(
        "uid-large",
        NODE,
        Isolation::Mps,
        vec![grant(0, GPU0, 49_152, 600)],
    );
    let res = "tessera.io/gpu";
    agent.pods.set(vec![
        pod("uid-hard", "hard", 1, res, 1, Some(hard.encode_signed(KEY))),
        pod(
            "uid-small",
            "small",
            2,
            res,
            1,
            Some(small.encode_signed(KEY)),
        ),
        pod(
            "uid-large",
            "large",
            3,
            res,
            1,
            Some(large.encode_signed(KEY)),
        ),
    ]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();

    // The kubelet picked a GPU 0 token; the decision says the MIG instance.
    agent.admitting("hard", &[]);
    let r = allocate(&mut gpu, &[&format!("{GPU0}::0")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [MIG2]);
    assert_eq!(r.envs["TESSERA_ISOLATION"], "mig");
    assert!(!r.envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));

    agent.admitting("small", &["hard"]);
    let r = allocate(&mut gpu, &[&format!("{GPU0}::1")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU0]);
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "20");
    assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=16384M");

    agent.admitting("large", &["hard", "small"]);
    let r = allocate(&mut gpu, &[&format!("{GPU0}::2")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU0]);
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "60");
    assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=49152M");

    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// Dynamic MIG on the fake backend: a decision that plans an instance on a plain
/// GPU gets it created at Allocate (MIG mode switched on first), the device
/// plugin stops advertising that GPU's share tokens and the node's GpuNode spec
/// shows the layout; a plan at an invalid placement is refused with the driver's
/// error and changes nothing; once no pod holds the instance it is destroyed after
/// the grace period and the GPU leaves MIG mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_instance_is_created_advertised_allocated_and_destroyed() {
    use tessera_node::backend::GpuBackend;
    use tessera_node::deviceplugin::NodeView;
    use tessera_node::proto::deviceplugin as pb;

    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;
    let planned = |start: u8| {
        let mut m = grant(1, GPU1, 40_192, 428);
        m.mig = Some(MigGrant {
            profile: "3g.40gb".into(),
            start,
            size: 4,
            uuid: String::new(),
            create: true,
            enable_mig_mode: true,
        });
        m
    };
    let hard = decision("uid-hard", NODE, Isolation::Mig, vec![planned(4)]);
    let bad = decision("uid-bad", NODE, Isolation::Mig, vec![planned(2)]);
    let res = "tessera.io/gpu";
    let hard_pod = pod("uid-hard", "hard", 1, res, 1, Some(hard.encode_signed(KEY)));
    let bad_pod = pod("uid-bad", "bad", 2, res, 1, Some(bad.encode_signed(KEY)));
    agent.pods.set(vec![hard_pod.clone(), bad_pod.clone()]);

    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let mut stream = gpu.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let tokens = |m: pb::ListAndWatchResponse| -> Vec<String> {
        m.devices.into_iter().map(|d| d.id).collect()
    };
    let first = tokens(stream.message().await.unwrap().unwrap());
    assert!(first.iter().any(|id| id.starts_with(GPU1)), "{first:?}");

    // Allocate creates the instance and answers with it.
    agent.admitting("hard", &[]);
    let r = allocate(&mut gpu, &[&format!("{GPU0}::0")]).await.unwrap();
    let gpus = agent.fake.discover().unwrap();
    assert!(gpus[1].mig_enabled);
    assert_eq!(gpus[1].mig_instances.len(), 1);
    let inst = gpus[1].mig_instances[0].clone();
    assert_eq!((inst.profile.as_str(), inst.start), ("3g.40gb", Some(4)));
    assert_eq!(mounted_devices(&r), [inst.uuid.as_str()]);
    // Plugins for the new profile (Tessera's name and the stock one) are started
    // and registered, the others untouched.
    let mut names = Vec::new();
    for _ in 0..2 {
        let reg = tokio::time::timeout(WAIT, next_register(&mut kubelet))
            .await
            .unwrap();
        names.push(reg.resource_name);
    }
    names.sort();
    assert_eq!(names, ["nvidia.com/mig-3g.40gb", "tessera.io/mig-3g.40gb"]);
    let mut mig = dial(&dir.path().join("tessera-mig-3g.40gb.sock"))
        .await
        .unwrap();
    let mut mig_stream = mig.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let listed = tokens(mig_stream.message().await.unwrap().unwrap());
    assert_eq!(listed, std::slice::from_ref(&inst.uuid));
    // Advertised without a restart: GPU 1 left the share tokens.
    let next = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let next = tokens(next);
    assert!(!next.iter().any(|id| id.starts_with(GPU1)), "{next:?}");
    assert!(next.iter().any(|id| id.starts_with(GPU0)), "{next:?}");
    // The GpuNode spec the agent publishes from that view shows the layout.
    let spec = tessera_node::inventory::gpu_node_spec(
        NODE,
        &NodeView {
            settings: Default::default(),
            gpus: gpus.clone(),
            health: Default::default(),
        },
    );
    let shown = serde_json::to_string(&spec).unwrap();
    assert!(
        shown.contains(&inst.uuid) && shown.contains("3g.40gb"),
        "{shown}"
    );

    // An invalid placement: refused with the driver's reason, nothing changes.
    agent.admitting("bad", &["hard"]);
    let e = allocate(&mut gpu, &[&format!("{GPU0}::1")])
        .await
        .unwrap_err();
    assert!(
        e.message().contains("ml/bad") && e.message().contains("NVML_ERROR_INVALID_ARGUMENT"),
        "{}",
        e.message()
    );
    assert_eq!(agent.fake.discover().unwrap(), gpus);

    // The pod finishes: after the grace period the instance goes, and MIG mode with it.
    let mut done = hard_pod;
    done.phase = "Succeeded".into();
    agent.pods.set(vec![done, bad_pod]);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let g = &agent.fake.discover().unwrap()[1];
        if !g.mig_enabled && g.mig_instances.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "instance not reaped: {g:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The plugin stays registered with nothing to offer.
    let emptied = tokio::time::timeout(WAIT, mig_stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(emptied.devices.is_empty(), "{:?}", emptied.devices);
    drop(stream);
    drop(mig_stream);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// Issue 27 item 9, the node side: on a node labelled `tessera.io/mig-dynamic`,
/// a pod that names a MIG profile with no instance on the node
/// (`tessera.io/mig-3g.40gb: 1`) must be admitted by the kubelet, so the agent
/// advertises every profile the GPU may get as tokens; `Allocate` then creates
/// the instance the decision planned and answers with it. Before, the agent
/// advertised only existing instances: no `tessera.io/mig-3g.40gb` plugin ever
/// registered and the kubelet refused the pod (`OutOftessera.io/mig-3g.40gb`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_profile_without_an_instance_is_advertised_and_created_on_a_dynamic_node() {
    use tessera_core::fit::mig_layout::MigDynamic;
    use tessera_node::backend::GpuBackend;
    use tessera_node::proto::deviceplugin as pb;

    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    let before: Vec<String> = registered(&mut kubelet, 4)
        .await
        .into_iter()
        .map(|r| r.resource_name)
        .collect();
    assert!(!before.iter().any(|r| r.ends_with("3g.40gb")), "{before:?}");

    // The operator labels the node; the agent's Node watch reports it.
    agent
        .settings
        .send(tessera_node::nodesettings::NodeSettings {
            mig_dynamic: MigDynamic::Instances,
            ..Default::default()
        })
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seen = Vec::new();
    while !seen.iter().any(|r: &String| r == "tessera.io/mig-3g.40gb") {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let reg = tokio::time::timeout(left, next_register(&mut kubelet))
            .await
            .unwrap_or_else(|_| panic!("no tessera.io/mig-3g.40gb plugin registered: {seen:?}"));
        seen.push(reg.resource_name);
    }
    let mut mig = dial(&dir.path().join("tessera-mig-3g.40gb.sock"))
        .await
        .unwrap();
    let mut listed = mig.list_and_watch(pb::Empty {}).await.unwrap().into_inner();
    let devices = listed.message().await.unwrap().unwrap().devices;
    // GPU 2 is the one in MIG mode: an A100-80GB holds at most two 3g.40gb.
    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [format!("{GPU2}::3g.40gb-0"), format!("{GPU2}::3g.40gb-1")]
    );
    assert!(devices.iter().all(|d| d.health == "Healthy"));

    // The scheduler planned a 3g.40gb at slice 4 of GPU 2 (beside its two 1g.10gb).
    let mut g = grant(2, GPU2, 40_192, 428);
    g.mig = Some(MigGrant {
        profile: "3g.40gb".into(),
        start: 4,
        size: 4,
        uuid: String::new(),
        create: true,
        enable_mig_mode: false,
    });
    let d = decision("uid-3g", NODE, Isolation::Mig, vec![g]);
    let res = "tessera.io/mig-3g.40gb";
    agent.pods.set(vec![pod(
        "uid-3g",
        "three",
        1,
        res,
        1,
        Some(d.encode_signed(KEY)),
    )]);
    agent.admitting("three", &[]);
    let r = allocate(&mut mig, &[ids[1]]).await.unwrap();
    let gpu2 = agent.fake.discover().unwrap()[2].clone();
    let made = gpu2
        .mig_instances
        .iter()
        .find(|m| m.profile == "3g.40gb")
        .unwrap_or_else(|| panic!("no 3g.40gb created: {gpu2:?}"));
    assert_eq!(made.start, Some(4));
    assert_eq!(mounted_devices(&r), [made.uuid.as_str()]);
    // The list stays the same tokens with the instance in place.
    let again = tokio::time::timeout(Duration::from_millis(500), listed.message()).await;
    if let Ok(Ok(Some(m))) = again {
        let now: Vec<String> = m.devices.into_iter().map(|d| d.id).collect();
        assert_eq!(now, ids, "the token list changed with the layout");
    }
    drop(listed);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// Issue 27 item 8, the node side: under the GPU Operator's single MIG strategy
/// (GFD's `nvidia.com/mig.strategy=single` on the Node) the agent lists each MIG
/// instance as an `nvidia.com/gpu` device, and a whole-GPU decision naming an
/// instance's UUID is answered with exactly that instance, never its parent.
/// Before, the agent listed GPUs without MIG mode only, so the kubelet could
/// admit no `nvidia.com/gpu` pod to an instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_single_strategy_an_instance_is_an_nvidia_gpu() {
    use tessera_core::model::single::MigStrategy;
    use tessera_node::proto::deviceplugin as pb;

    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 4).await;
    let mut nvidia = dial(&dir.path().join("tessera-nvidia-gpu.sock"))
        .await
        .unwrap();
    let mut listed = nvidia
        .list_and_watch(pb::Empty {})
        .await
        .unwrap()
        .into_inner();
    let first: Vec<String> = listed
        .message()
        .await
        .unwrap()
        .unwrap()
        .devices
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(first, [GPU0, GPU1], "mixed: GPU 2 is in MIG mode");

    agent
        .settings
        .send(tessera_node::nodesettings::NodeSettings {
            mig_strategy: MigStrategy::Single,
            ..Default::default()
        })
        .unwrap();
    let mig1 = "MIG-11111111-1111-1111-1111-111111111111";
    let ids: Vec<String> = tokio::time::timeout(WAIT, async {
        loop {
            let m = listed.message().await.unwrap().unwrap();
            let ids: Vec<String> = m.devices.into_iter().map(|d| d.id).collect();
            if ids.len() > 2 {
                return ids;
            }
        }
    })
    .await
    .expect("the instances are listed once the node is single");
    assert_eq!(ids, [GPU0, GPU1, mig1, MIG2]);

    // The scheduler granted the second instance as a whole GPU.
    let d = decision(
        "uid-single",
        NODE,
        Isolation::Exclusive,
        vec![grant(2, MIG2, 9_984, 1000)],
    );
    agent.pods.set(vec![pod(
        "uid-single",
        "single",
        1,
        "nvidia.com/gpu",
        1,
        Some(d.encode_signed(KEY)),
    )]);
    agent.admitting("single", &[]);
    // The kubelet picked the other instance's device: the decision rules.
    let r = allocate(&mut nvidia, &[mig1]).await.unwrap();
    assert_eq!(mounted_devices(&r), [MIG2]);
    drop(listed);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}
