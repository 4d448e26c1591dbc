//! A DRA node on a real control plane: `tessera node-agent --dra --backend
//! fake` as the chart's DRA driver service account, registered by a
//! plugin-watcher stand-in as the kubelet does it (the registration socket's
//! `GetInfo`, then `NotifyRegistrationStatus`), and the kubelet's
//! `NodePrepareResources`/`NodeUnprepareResources` calls over the driver's
//! `dra.sock`. The kubelet stand-in of [`crate::kubelet`] still marks bound
//! pods Running and completes deletions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tessera_node::dra::proto::pluginregistration as reg;
use tessera_node::dra::proto::v1;
use tonic::transport::{Channel, Endpoint};

use crate::kubelet::Kubelet;
use crate::plane::{ControlPlane, Identity, free_port};
use crate::tessera::tessera_bin;

/// One DRA node: its directories, its kubelet stand-in and the driver's sockets.
pub struct DraNode {
    pub name: String,
    pub kubelet: Kubelet,
    pub registry_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub cdi_dir: PathBuf,
    /// The `dra.sock` `GetInfo` named.
    pub endpoint: PathBuf,
    /// The node's directory (fake GPUs, MPS root).
    dir: PathBuf,
    /// `--dra-features`.
    features: String,
}

async fn dial(path: &Path) -> Result<Channel> {
    Ok(Endpoint::from_shared(format!("unix://{}", path.display()))?
        .connect()
        .await?)
}

/// Creates Node `name` and its kubelet stand-in, starts the DRA driver with
/// `gpus_yaml` (fake backend) and `features` (`--dra-features`), registers it
/// as the plugin watcher would and waits for its ResourceSlices.
pub async fn start_dra_node(
    plane: &mut ControlPlane,
    name: &str,
    gpus_yaml: &str,
    features: &str,
) -> Result<DraNode> {
    let admin = plane.client(Identity::Admin).await?;
    crate::kubelet::create_node(&admin, name, &[("tessera.io/dra", "true")]).await?;
    let dir = plane.dir.path().join(format!("node-{name}"));
    std::fs::create_dir_all(&dir)?;
    let kubelet = Kubelet::start(admin.clone(), name, &dir)?;
    let start = Instant::now();
    let node = start_driver(plane, name, dir, kubelet, gpus_yaml, features).await?;
    node.wait_slices(plane, start, Duration::from_secs(60))
        .await?;
    Ok(node)
}

/// Starts the DRA driver on a node the device-plugin agent of `gpu` serves
/// already: the same GPUs (`gpus_yaml`), the same kubelet stand-in (whose
/// PodResources name the pods the device plugin served), what labelling a node
/// for DRA does. Registers it; does not wait for slices (while device-plugin
/// pods run there are none).
pub async fn start_dra_beside(
    plane: &mut ControlPlane,
    gpu: crate::tessera::GpuNode,
    gpus_yaml: &str,
    features: &str,
) -> Result<DraNode> {
    let dir = plane.dir.path().join(format!("node-{}/dra", gpu.name));
    std::fs::create_dir_all(&dir)?;
    start_driver(plane, &gpu.name, dir, gpu.kubelet, gpus_yaml, features).await
}

/// Spawns and registers the driver of node `name` in `dir` beside `kubelet`.
async fn start_driver(
    plane: &mut ControlPlane,
    name: &str,
    dir: PathBuf,
    kubelet: Kubelet,
    gpus_yaml: &str,
    features: &str,
) -> Result<DraNode> {
    std::fs::write(dir.join("gpus.yaml"), gpus_yaml)?;
    let (registry_dir, plugin_dir, cdi_dir) = (
        dir.join("plugins_registry"),
        dir.join("plugins/gpu.tessera.io"),
        dir.join("cdi"),
    );
    for d in [&registry_dir, &plugin_dir, &cdi_dir] {
        std::fs::create_dir_all(d)?;
    }
    let mut node = DraNode {
        name: name.to_string(),
        kubelet,
        registry_dir,
        plugin_dir,
        cdi_dir,
        endpoint: PathBuf::new(),
        dir,
        features: features.to_string(),
    };
    let start = Instant::now();
    node.spawn_driver(plane)?;
    node.register(plane, start).await?;
    Ok(node)
}

/// `(namespace, uid, name)` claims as the kubelet sends them.
fn wire(claims: &[(String, String, String)]) -> Vec<v1::Claim> {
    claims
        .iter()
        .map(|(namespace, uid, name)| v1::Claim {
            namespace: namespace.clone(),
            uid: uid.clone(),
            name: name.clone(),
        })
        .collect()
}

impl DraNode {
    /// The driver's process name in the plane.
    pub fn proc_name(&self) -> String {
        format!("node-agent-dra-{}", self.name)
    }

    /// Starts `tessera node-agent --dra` for this node (the state it keeps
    /// across restarts lives beside `dra.sock`, in `plugin_dir`).
    fn spawn_driver(&self, plane: &mut ControlPlane) -> Result<()> {
        let mut cmd = Command::new(tessera_bin());
        cmd.env("KUBECONFIG", plane.kubeconfig(Identity::NodeAgentDra))
            .env(
                "RUST_LOG",
                std::env::var("TESSERA_E2E_LOG").unwrap_or_else(|_| "info".into()),
            )
            .args([
                "node-agent",
                "--dra",
                "--backend",
                "fake",
                "--node-name",
                &self.name,
            ])
            .arg("--fake-config")
            .arg(self.dir.join("gpus.yaml"))
            .arg("--dra-registry-dir")
            .arg(&self.registry_dir)
            .arg("--dra-plugin-dir")
            .arg(&self.plugin_dir)
            .arg("--cdi-dir")
            .arg(&self.cdi_dir)
            // The kubelet stand-in's PodResources: no slice while device-plugin pods run.
            .arg("--pod-resources-socket")
            .arg(self.kubelet.pod_resources_socket())
            .arg(format!("--dra-features={}", self.features))
            .arg(format!("--metrics-addr=127.0.0.1:{}", free_port()))
            .arg("--mps-root")
            .arg(self.dir.join("mps"))
            .arg("--mps-daemons=external");
        plane.spawn(&self.proc_name(), &mut cmd)?;
        Ok(())
    }

    /// The plugin watcher: once the registration socket answers, `GetInfo`,
    /// then the verdict; keeps the `dra.sock` it names.
    async fn register(&mut self, plane: &ControlPlane, start: Instant) -> Result<()> {
        let socket = self.registry_dir.join("gpu.tessera.io-reg.sock");
        let channel = loop {
            // A socket left by a killed driver exists but refuses connections.
            if socket.exists()
                && let Ok(c) = dial(&socket).await
            {
                break c;
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!(
                    "node {}: no registration socket answering within 60 s; log:\n{}",
                    self.name,
                    plane.log(&self.proc_name())
                );
            }
            plane.check_alive()?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut r = reg::registration_client::RegistrationClient::new(channel);
        let info = r.get_info(reg::InfoRequest {}).await?.into_inner();
        if info.name != "gpu.tessera.io"
            || !info.supported_versions.iter().any(|v| v.contains("v1"))
        {
            bail!("node {}: GetInfo answered {info:?}", self.name);
        }
        r.notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await?;
        self.endpoint = PathBuf::from(&info.endpoint);
        Ok(())
    }

    /// The names of the node's ResourceSlices the API server holds.
    pub fn slices(&self, plane: &ControlPlane) -> Result<Vec<String>> {
        let out = plane.kubectl(
            &[
                "get",
                "resourceslices",
                "--field-selector",
                &format!("spec.nodeName={}", self.name),
                "-o",
                "name",
            ],
            None,
        )?;
        Ok(out.split_whitespace().map(str::to_string).collect())
    }

    /// Waits until the node has a ResourceSlice, `within` of `start`.
    pub async fn wait_slices(
        &self,
        plane: &ControlPlane,
        start: Instant,
        within: Duration,
    ) -> Result<()> {
        loop {
            let slices = self.slices(plane)?;
            if !slices.is_empty() {
                println!(
                    "node {}: DRA driver registered, slices {} after {:.1} s",
                    self.name,
                    slices.join(" "),
                    start.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            if start.elapsed() > within {
                bail!(
                    "node {}: no ResourceSlice within {} s; log:\n{}",
                    self.name,
                    within.as_secs(),
                    plane.log(&self.proc_name())
                );
            }
            plane.check_alive()?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `kill -9` of the node's DRA driver; `true` if it was running.
    pub fn kill_driver(&self, plane: &mut ControlPlane) -> bool {
        plane.kill(&self.proc_name()) > 0
    }

    /// Starts the driver again with the same flags, directories and state,
    /// and registers it as the plugin watcher does when a socket reappears;
    /// returns how long that took.
    pub async fn restart_driver(&mut self, plane: &mut ControlPlane) -> Result<Duration> {
        let start = Instant::now();
        self.spawn_driver(plane)?;
        self.register(plane, start).await?;
        Ok(start.elapsed())
    }

    /// The kubelet's `NodePrepareResources` for `(namespace, uid, name)` claims.
    pub async fn prepare(
        &self,
        claims: &[(String, String, String)],
    ) -> Result<v1::NodePrepareResourcesResponse> {
        let mut c = v1::dra_plugin_client::DraPluginClient::new(
            dial(&self.endpoint)
                .await
                .with_context(|| format!("dialing {}", self.endpoint.display()))?,
        );
        Ok(c.node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: wire(claims),
        })
        .await?
        .into_inner())
    }

    /// The kubelet's `NodeUnprepareResources`.
    pub async fn unprepare(
        &self,
        claims: &[(String, String, String)],
    ) -> Result<v1::NodeUnprepareResourcesResponse> {
        let mut c = v1::dra_plugin_client::DraPluginClient::new(dial(&self.endpoint).await?);
        Ok(
            c.node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                claims: wire(claims),
            })
            .await?
            .into_inner(),
        )
    }

    /// The CDI spec files the driver wrote, with their text.
    pub fn cdi_specs(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = std::fs::read_dir(&self.cdi_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let text = std::fs::read_to_string(e.path()).ok()?;
                Some((e.file_name().to_string_lossy().into_owned(), text))
            })
            .collect();
        out.sort();
        out
    }
}

/// The chart's ClusterRoles for a standalone `--dra` Tessera and the DRA agent,
/// and its DeviceClasses, applied to `plane`.
pub fn install_dra_chart(plane: &ControlPlane) -> Result<()> {
    let values = serde_json::json!({"scheduler": {"mode": "standalone", "dra": true},
        "nodeAgent": {"dra": {"enabled": true}}});
    plane.install_chart_rbac(&values)?;
    for class in plane
        .render_chart(&values)?
        .into_iter()
        .filter(|d| d["kind"] == "DeviceClass")
    {
        plane.apply(&class)?;
    }
    Ok(())
}

/// Sets Node `name`'s CPU capacity and allocatable to `cpu` (cores).
pub async fn set_node_cpu(plane: &ControlPlane, name: &str, cpu: u32) -> Result<()> {
    use kube::api::{Api, Patch, PatchParams};
    let admin = plane.client(Identity::Admin).await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin);
    let status = serde_json::json!({"status": {"capacity": {"cpu": cpu.to_string()},
        "allocatable": {"cpu": cpu.to_string()}}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("CPU of Node {name}"))?;
    Ok(())
}

/// `n` DRA nodes `dra-0` … of `gpus` fake A100-80GB each, with `features`
/// (`--dra-features`) and `cpus` cores, each started as [`start_dra_node`] does.
pub async fn start_dra_nodes(
    plane: &mut ControlPlane,
    n: usize,
    gpus: usize,
    features: &str,
    cpus: Option<u32>,
) -> Result<Vec<DraNode>> {
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("dra-{i}");
        let yaml = crate::tessera::fake_gpus_yaml(&crate::tessera::a100s(&name, gpus));
        nodes.push(start_dra_node(plane, &name, &yaml, features).await?);
        if let Some(c) = cpus {
            set_node_cpu(plane, &name, c).await?;
        }
    }
    Ok(nodes)
}

/// The suite's environment when it runs and its Kubernetes is at least
/// 1.`minor` (`what` says what needs it), else `None` after saying why not.
pub fn env_at_least(test: &str, minor: u32, what: &str) -> Option<crate::plane::Env> {
    let env = crate::plane::env_or_skip(test)?;
    if env.minor < minor {
        println!(
            "e2e {test}: {what} needs Kubernetes 1.{minor}; {} not run",
            env.version
        );
        return None;
    }
    Some(env)
}

/// A control plane for DRA scenarios: kube-controller-manager (the real
/// resourceclaim controller), kube-scheduler with `kube_scheduler` when given,
/// the chart's DRA RBAC and DeviceClasses, and a signing key.
pub async fn dra_plane(
    env: &crate::plane::Env,
    kube_scheduler: Option<&str>,
) -> Result<(ControlPlane, PathBuf)> {
    let plane = ControlPlane::start(
        env,
        crate::plane::Options {
            kube_scheduler: kube_scheduler.map(|c| (c.to_string(), Identity::KubeScheduler)),
            controller_manager: true,
            ..crate::plane::Options::default()
        },
    )
    .await?;
    install_dra_chart(&plane)?;
    let key = crate::tessera::write_key(&plane)?;
    Ok((plane, key))
}
