//! Which pod an `Allocate` call is for (issue 28 item 1), against a
//! kubelet-shaped peer over real unix sockets: the device plugin's client and
//! the kubelet's PodResources API. The agent never guesses: an agent restart,
//! a pod the kubelet rejected without a call, or a pod created with
//! `spec.nodeName` preset must not make one pod receive another pod's grant.

mod common;

use std::time::Duration;

use common::*;
use tessera_core::request::Isolation;

fn granted(
    uid: &str,
    name: &str,
    created: i64,
    gpu: (u32, &str),
) -> tessera_node::deviceplugin::allocate::PodInfo {
    let d = decision(
        uid,
        NODE,
        Isolation::Exclusive,
        vec![grant(gpu.0, gpu.1, 81_920, 1000)],
    );
    pod(
        uid,
        name,
        created,
        "tessera.io/gpu",
        1,
        Some(d.encode_signed(KEY)),
    )
}

/// Pod A is answered, the agent restarts before the kubelet starts A's
/// container (A still shows `Pending`), then the kubelet calls for pod B with
/// the same count: B gets B's GPU, not A's. The kubelet's PodResources API is
/// unreadable here, so only the agent's state file can tell A was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_between_two_pods_does_not_hand_b_the_grant_of_a() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state/allocate.json");
    let mut kubelet = start_kubelet(dir.path());
    let with_state = |c: &mut tessera_node::run::AgentConfig| {
        c.allocate_state = Some(state.clone());
    };
    let agent = start_agent_tweaked(
        dir.path(),
        Duration::from_secs(3600),
        "volume-mounts",
        with_state,
    );
    registered(&mut kubelet, 3).await;
    let a = granted("uid-a", "a", 1, (0, GPU0));
    let b = granted("uid-b", "b", 2, (1, GPU1));
    agent.pods.set(vec![a.clone()]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let r = allocate(&mut gpu, &[&format!("{GPU0}::0")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU0], "A gets A's GPU");
    stop_agent(agent).await;

    let agent = start_agent_tweaked(
        dir.path(),
        Duration::from_secs(3600),
        "volume-mounts",
        with_state,
    );
    registered(&mut kubelet, 3).await;
    // A is still Pending in the API; B has arrived and is older than nothing.
    agent.pods.set(vec![a, b]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let r = allocate(&mut gpu, &[&format!("{GPU0}::1")]).await.unwrap();
    assert_eq!(
        mounted_devices(&r),
        [GPU1],
        "B must get B's GPU, not the grant answered for A before the restart"
    );
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// Two pending pods ask the same count and nothing tells which one the
/// kubelet is admitting (its PodResources API is unreadable): refused, with an
/// error naming both, rather than the older one's GPUs for whichever it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pending_pods_that_could_both_match_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 3).await;
    agent.pods.set(vec![
        granted("uid-old", "old", 1, (0, GPU0)),
        granted("uid-new", "new", 2, (1, GPU1)),
    ]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let e = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("cannot tell which pod")
            && e.message().contains("ml/old")
            && e.message().contains("ml/new"),
        "{}",
        e.message()
    );
    // Once the kubelet's API says which pod it is admitting, it is answered.
    agent.admitting("new", &[]);
    let r = allocate(&mut gpu, &[&format!("{GPU0}::0")]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU1]);
    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// A pod created with `spec.nodeName` preset skips the scheduler and has no
/// grant. While an older pod with a grant waits, the kubelet admits the preset
/// pod first: it gets nothing, whether the agent can read it yet or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_with_node_name_preset_and_no_grant_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = start_kubelet(dir.path());
    let agent = start_agent(dir.path(), Duration::from_secs(3600));
    registered(&mut kubelet, 3).await;
    let waiting = granted("uid-granted", "granted", 1, (0, GPU0));
    let preset = pod("uid-preset", "preset", 2, "tessera.io/gpu", 1, None);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let never_granted_gpu = |r: &Result<_, tonic::Status>| match r {
        Ok(r) => panic!("the preset pod was answered: {r:?}"),
        Err(e) => assert!(!e.message().contains(GPU0), "{}", e.message()),
    };

    // The agent reads both pods; the kubelet lists the preset pod only.
    agent.pods.set(vec![waiting.clone(), preset.clone()]);
    agent.kubelet.admitting(&preset, &[]);
    let r = allocate(&mut gpu, &[&format!("{GPU1}::0")]).await;
    never_granted_gpu(&r);
    let e = r.unwrap_err();
    assert!(
        e.message().contains("ml/preset") && e.message().contains("no scheduling decision"),
        "{}",
        e.message()
    );

    // Its watch has not delivered the preset pod yet, and the kubelet lists the
    // granted pod too (it rejected it without a call, its Failed phase not yet
    // seen): either could be asking, so no guess.
    let dir2 = tempfile::tempdir().unwrap();
    let mut kubelet2 = start_kubelet(dir2.path());
    let agent2 = start_agent(dir2.path(), Duration::from_secs(3600));
    registered(&mut kubelet2, 3).await;
    agent2.pods.set(vec![waiting.clone()]);
    agent2.kubelet.set(vec![
        {
            let mut p = admitted(&waiting);
            p.containers[0].devices.clear();
            p
        },
        {
            let mut p = admitted(&preset);
            p.containers[0].devices.clear();
            p
        },
    ]);
    let mut gpu2 = dial(&dir2.path().join("tessera-gpu.sock")).await.unwrap();
    let r = allocate(&mut gpu2, &[&format!("{GPU1}::0")]).await;
    never_granted_gpu(&r);
    let e = r.unwrap_err();
    assert!(
        e.message().contains("cannot tell which pod")
            && e.message()
                .contains("ml/preset (not yet seen by the agent)"),
        "{}",
        e.message()
    );
    // The kubelet lists only the preset pod, which the agent cannot read: the
    // granted pod, which the kubelet has not reached, is not a candidate.
    agent2.kubelet.admitting(&preset, &[]);
    let r = allocate(&mut gpu2, &[&format!("{GPU1}::0")]).await;
    never_granted_gpu(&r);
    assert!(r.unwrap_err().message().contains("no pending pod"));

    stop_agent(agent).await;
    stop_agent(agent2).await;
    let _ = kubelet.stop.send(());
    let _ = kubelet2.stop.send(());
}
