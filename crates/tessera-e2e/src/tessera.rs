//! Tessera's own processes on a [`ControlPlane`]: the `tessera` binary of this
//! workspace, run as the chart's service accounts.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::kubelet::Kubelet;
use crate::plane::{ControlPlane, Identity, free_port, repo_root};

/// The `tessera` binary next to this test executable (`target/<profile>/`),
/// built with cargo first when it is not there yet.
pub fn tessera_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf();
    let bin = profile_dir.join("tessera");
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo_root())
            .args(["build", "-p", "tessera"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("cargo build -p tessera runs");
        assert!(st.success(), "cargo build -p tessera failed");
    }
    bin
}

/// The HMAC key shared by the scheduler and the node agents (the chart's Secret).
pub fn write_key(plane: &ControlPlane) -> Result<PathBuf> {
    let p = plane.dir.path().join("allocation.key");
    let out = Command::new("openssl")
        .args(["rand", "-hex", "32"])
        .output()?;
    if !out.status.success() {
        bail!("openssl rand: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::write(&p, out.stdout.trim_ascii())?;
    Ok(p)
}

/// A fake GPU node: `gpus` YAML entries for the fake backend, `n` A100-80GB
/// GPUs when built by [`a100s`].
pub fn fake_gpus_yaml(gpus: &str) -> String {
    format!("driverVersion: \"550.54.15\"\ncudaVersion: \"12.4\"\ngpus:\n{gpus}")
}

/// `n` NVLinked A100-SXM4-80GB GPUs of node `node` (UUIDs unique per node).
pub fn a100s(node: &str, n: usize) -> String {
    let tag: u64 = node
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    (0..n)
        .map(|i| {
            format!(
                "  - uuid: GPU-{:08x}-0000-4000-8000-{:012x}\n    product: NVIDIA A100-SXM4-80GB\n    numaNode: {}\n    computeCapability: \"8.0\"\n",
                tag as u32,
                i,
                i / 4
            )
        })
        .collect()
}

/// One fake GPU node: its kubelet stand-in and its node agent.
pub struct GpuNode {
    pub name: String,
    pub kubelet: Kubelet,
    pub metrics: u16,
}

/// Creates the Node `name`, its kubelet stand-in and `tessera node-agent
/// --backend fake` as the node agent's service account; waits until the agent
/// has registered its resources and the Node shows `tessera.io/gpu`.
pub async fn start_gpu_node(
    plane: &mut ControlPlane,
    name: &str,
    gpus_yaml: &str,
    key: &std::path::Path,
    extra: &[&str],
) -> Result<GpuNode> {
    let admin = plane.client(Identity::Admin).await?;
    crate::kubelet::create_node(&admin, name, &[]).await?;
    let dir = plane.dir.path().join(format!("node-{name}"));
    std::fs::create_dir_all(&dir)?;
    let kubelet = Kubelet::start(admin.clone(), name, &dir)?;
    std::fs::write(dir.join("gpus.yaml"), gpus_yaml)?;
    let metrics = spawn_gpu_agent(plane, name, &kubelet, key, extra)?;
    let start = Instant::now();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin);
    loop {
        let n = nodes.get(name).await?;
        // Every resource the agent registered is on the Node (a MIG-only node
        // serves no tessera.io/gpu).
        let registered = kubelet.resources();
        let has = !registered.is_empty()
            && n.status
                .and_then(|s| s.allocatable)
                .is_some_and(|a| registered.keys().all(|r| a.contains_key(r)));
        let published = has && has_gpunode(plane, name);
        if published {
            println!(
                "node {name}: agent registered {:?} after {:.1} s",
                kubelet.resources(),
                start.elapsed().as_secs_f64()
            );
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "node {name}: the agent's resources are not on the Node within 60 s; agent log:\n{}",
                plane.log(&format!("node-agent-{name}"))
            );
        }
        plane.check_alive()?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(GpuNode {
        name: name.to_string(),
        kubelet,
        metrics,
    })
}

/// Whether the node `name` has a `GpuNode` (its agent published its GPUs).
pub fn has_gpunode(plane: &ControlPlane, name: &str) -> bool {
    plane
        .kubectl(&["get", "gpunodes.tessera.io", name, "-o", "name"], None)
        .is_ok()
}

/// Spawns `tessera node-agent --backend fake` for node `name` beside
/// `kubelet` (its fake GPUs in `gpus.yaml` of the node's directory), as the
/// node agent's service account: what [`start_gpu_node`] starts, and what a
/// restart of the agent starts again. Returns its metrics port.
pub fn spawn_gpu_agent(
    plane: &mut ControlPlane,
    name: &str,
    kubelet: &Kubelet,
    key: &std::path::Path,
    extra: &[&str],
) -> Result<u16> {
    let dir = plane.dir.path().join(format!("node-{name}"));
    let cfg = dir.join("gpus.yaml");
    let metrics = free_port();
    let mut cmd = Command::new(tessera_bin());
    cmd.env("KUBECONFIG", plane.kubeconfig(Identity::NodeAgent))
        .env("RUST_LOG", log_filter())
        .args(["node-agent", "--backend", "fake", "--node-name", name])
        .arg("--fake-config")
        .arg(&cfg)
        .arg("--device-plugin-dir")
        .arg(kubelet.device_plugin_dir())
        .arg("--pod-resources-socket")
        .arg(kubelet.pod_resources_socket())
        .arg(format!("--metrics-addr=127.0.0.1:{metrics}"))
        .arg("--allocation-key-file")
        .arg(key)
        .arg("--mig-state")
        .arg(dir.join("mig.json"))
        .arg("--allocate-state")
        .arg(dir.join("allocate.json"))
        .arg("--mps-root")
        .arg(dir.join("mps"))
        .args(extra);
    plane.spawn(&format!("node-agent-{name}"), &mut cmd)?;
    Ok(metrics)
}

/// A running `tessera scheduler`.
pub struct Scheduler {
    pub listen: u16,
    pub metrics: u16,
    pub proc_name: String,
}

/// Starts `tessera scheduler --mode <mode>` as the scheduler's service account
/// and waits for its /readyz (the initial sync done).
pub async fn start_scheduler(
    plane: &mut ControlPlane,
    mode: &str,
    key: &std::path::Path,
    extra: &[&str],
) -> Result<Scheduler> {
    start_scheduler_on(plane, mode, key, extra, (free_port(), free_port())).await
}

/// [`start_scheduler`] on given (extender, metrics) ports: a restart keeps the
/// address kube-scheduler calls.
pub async fn start_scheduler_on(
    plane: &mut ControlPlane,
    mode: &str,
    key: &std::path::Path,
    extra: &[&str],
    (listen, metrics): (u16, u16),
) -> Result<Scheduler> {
    let n = plane.count("tessera-scheduler");
    let proc_name = format!("tessera-scheduler-{n}");
    let mut cmd = Command::new(tessera_bin());
    cmd.env("KUBECONFIG", plane.kubeconfig(Identity::Scheduler))
        .env("RUST_LOG", log_filter())
        .args(["scheduler", "--mode", mode])
        .arg(format!("--listen=127.0.0.1:{listen}"))
        .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
        .arg("--signing-key-file")
        .arg(key)
        .args(extra);
    plane.spawn(&proc_name, &mut cmd)?;
    let start = Instant::now();
    let url = format!("http://127.0.0.1:{metrics}/readyz");
    loop {
        let ok = Command::new("curl")
            .args(["-sf", "--max-time", "2", &url])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            println!(
                "tessera scheduler ({mode}) ready after {:.1} s",
                start.elapsed().as_secs_f64()
            );
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "tessera scheduler not ready within 60 s; log:\n{}",
                plane.log(&proc_name)
            );
        }
        plane.check_alive().with_context(|| plane.log(&proc_name))?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(Scheduler {
        listen,
        metrics,
        proc_name,
    })
}

/// The tessera processes' `RUST_LOG`: `TESSERA_E2E_LOG` when set (e.g.
/// `tessera_k8s=debug` to follow a failing scenario's passes), else `info`.
fn log_filter() -> String {
    std::env::var("TESSERA_E2E_LOG").unwrap_or_else(|_| "info".into())
}
