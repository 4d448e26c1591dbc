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
    registered(&mut kubelet, 3).await;
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
    let r = allocate(&mut gpu, &[&format!("{GPU0}::0")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [MIG2]);
    assert_eq!(r.envs["TESSERA_ISOLATION"], "mig");
    assert!(!r.envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));

    let r = allocate(&mut gpu, &[&format!("{GPU0}::1")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU0]);
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "20");
    assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=16384M");

    let r = allocate(&mut gpu, &[&format!("{GPU0}::2")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU0]);
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "60");
    assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=49152M");

    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}
