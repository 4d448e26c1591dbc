//! MPS control daemons run by the agent (issue 13, `--mps-daemons per-gpu`), through
//! the real device-plugin gRPC over a unix socket. A shell script stands in for
//! `nvidia-cuda-mps-control`: with `-f` it serves a control FIFO in the pipe
//! directory, as the real daemon serves its pipe, and records its environment, its
//! PID and every command; without arguments it sends its stdin to that FIFO, as the
//! real client does.

mod common;
mod fake_mps;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use fake_mps::{FAKE_CONTROL, write_script};
use tessera_core::request::Isolation;

fn start(dir: &Path, root: &Path, binary: PathBuf) -> Agent {
    let root = root.display().to_string();
    start_agent_tweaked(dir, Duration::from_secs(3600), "volume-mounts", move |c| {
        c.mps.host_root = root;
        c.mps.per_gpu_daemons = true;
        c.mps_binary = binary;
        c.mig_grace = Duration::from_millis(300);
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn alive(pid: &str) -> bool {
    !pid.trim().is_empty() && Path::new(&format!("/proc/{}", pid.trim())).exists()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A one-GPU MPS share is answered with the pipe of its GPU's own daemon, started
/// before the answer with only that GPU visible; a two-GPU share gets a daemon of
/// its own for exactly those GPUs. A daemon that dies while its pod runs is started
/// again; once no pod holds it, it is told to quit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_shares_get_per_gpu_daemons_that_are_supervised() {
    let dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let binary = write_script(root.path(), FAKE_CONTROL);
    let mut kubelet = start_kubelet(dir.path());
    let agent = start(dir.path(), root.path(), binary);
    registered(&mut kubelet, 4).await;
    let one = decision(
        "uid-one",
        NODE,
        Isolation::Mps,
        vec![grant(0, GPU0, 16_384, 200)],
    );
    let two = decision(
        "uid-two",
        NODE,
        Isolation::Mps,
        vec![grant(0, GPU0, 8_192, 300), grant(1, GPU1, 8_192, 300)],
    );
    let res = "tessera.io/gpu";
    let pods = vec![
        pod("uid-one", "one", 1, res, 1, Some(one.encode_signed(KEY))),
        pod("uid-two", "two", 2, res, 2, Some(two.encode_signed(KEY))),
    ];
    agent.pods.set(pods.clone());
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();

    let r = allocate(&mut gpu, &[&format!("{GPU0}::0")]).await.unwrap();
    let gpu0 = root.path().join(GPU0);
    let pipe = r
        .mounts
        .iter()
        .find(|m| m.container_path == "/tessera/mps/pipe")
        .expect("the pipe is mounted");
    assert_eq!(pipe.host_path, gpu0.join("pipe").display().to_string());
    assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tessera/mps/pipe");
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "20");
    // The daemon was serving before the answer came back.
    assert!(gpu0.join("pipe/control").exists());
    assert_eq!(
        read(&gpu0.join("log/env")),
        format!(
            "CUDA_MPS_PIPE_DIRECTORY={}\nCUDA_VISIBLE_DEVICES={GPU0}\n",
            gpu0.join("pipe").display()
        )
    );

    let r = allocate(&mut gpu, &[&format!("{GPU0}::1"), &format!("{GPU1}::0")])
        .await
        .unwrap();
    let pipe = r
        .mounts
        .iter()
        .find(|m| m.container_path == "/tessera/mps/pipe")
        .unwrap();
    let key = tessera_node::mps::daemon_key(&[GPU0.to_string(), GPU1.to_string()]);
    assert!(key.starts_with("set-"), "{key}");
    let set = root.path().join(&key);
    assert_eq!(pipe.host_path, set.join("pipe").display().to_string());
    assert!(read(&set.join("log/env")).contains(&format!("CUDA_VISIBLE_DEVICES={GPU0},{GPU1}\n")));

    // The pods run; GPU 0's daemon dies and is started again (a new process).
    let mut running = pods;
    for p in &mut running {
        p.phase = "Running".into();
    }
    agent.pods.set(running);
    let first = read(&gpu0.join("log/pid"));
    assert!(alive(&first), "daemon pid {first}");
    let killed = std::process::Command::new("kill")
        .args(["-9", first.trim()])
        .status()
        .unwrap();
    assert!(killed.success());
    until("a restarted daemon", || {
        let now = read(&gpu0.join("log/pid"));
        now != first && alive(&now) && gpu0.join("pipe/control").exists()
    })
    .await;

    // Nothing holds them any more: both daemons are told to quit.
    agent.pods.set(Vec::new());
    until("both daemons to quit", || {
        read(&gpu0.join("log/commands")).contains("quit")
            && read(&set.join("log/commands")).contains("quit")
    })
    .await;
    let last = read(&gpu0.join("log/pid"));
    until("the daemon process to exit", || !alive(&last)).await;

    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}

/// Without a daemon an MPS share would run unlimited, so a daemon that cannot start
/// fails the MPS pod's admission with the reason; a whole-GPU pod is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_share_is_refused_when_its_daemon_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let binary = write_script(
        root.path(),
        "#!/bin/sh\necho 'no NVIDIA driver found' >&2\nexit 3\n",
    );
    let mut kubelet = start_kubelet(dir.path());
    let agent = start(dir.path(), root.path(), binary);
    registered(&mut kubelet, 4).await;
    let share = decision(
        "uid-share",
        NODE,
        Isolation::Mps,
        vec![grant(0, GPU0, 16_384, 200)],
    );
    let whole = decision(
        "uid-whole",
        NODE,
        Isolation::Exclusive,
        vec![grant(1, GPU1, 81_920, 1000)],
    );
    agent.pods.set(vec![
        pod(
            "uid-share",
            "share",
            1,
            "tessera.io/gpu",
            1,
            Some(share.encode_signed(KEY)),
        ),
        pod(
            "uid-whole",
            "whole",
            2,
            "nvidia.com/gpu",
            1,
            Some(whole.encode_signed(KEY)),
        ),
    ]);
    let mut gpu = dial(&dir.path().join("tessera-gpu.sock")).await.unwrap();
    let err = allocate(&mut gpu, &[&format!("{GPU0}::0")])
        .await
        .unwrap_err();
    assert!(
        err.message().contains("MPS control daemon")
            && err.message().contains("no NVIDIA driver found"),
        "{}",
        err.message()
    );
    let mut nvidia = dial(&dir.path().join("tessera-nvidia-gpu.sock"))
        .await
        .unwrap();
    let r = allocate(&mut nvidia, &[GPU1]).await.unwrap();
    assert_eq!(mounted_devices(&r), [GPU1]);

    stop_agent(agent).await;
    let _ = kubelet.stop.send(());
}
