//! The clusters the scenarios run on, pods to submit and what to check.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tessera_core::allocation::{ANNOTATION, Allocation};

use crate::plane::{ControlPlane, Env, Identity, Options, free_port, repo_root};
use crate::tessera::{
    GpuNode, Scheduler, start_gpu_node, start_scheduler, start_scheduler_on, write_key,
};

/// The chart's example KubeSchedulerConfiguration (deploy/examples), with the
/// extender at `url` and a `default-scheduler` profile beside `tessera` (the
/// shared kube-scheduler: stock pods go through the same extender).
pub fn kube_scheduler_config(url: &str) -> Result<String> {
    let text =
        std::fs::read_to_string(repo_root().join("deploy/examples/kube-scheduler-config.yaml"))?;
    let profiles = "profiles:\n  - schedulerName: tessera\n";
    if !text.contains(profiles) || !text.contains("http://127.0.0.1:8888") {
        bail!(
            "deploy/examples/kube-scheduler-config.yaml changed shape: no tessera profile or extender URL"
        );
    }
    Ok(text
        .replace(
            profiles,
            "leaderElection:\n  leaderElect: false\nprofiles:\n  - schedulerName: default-scheduler\n  - schedulerName: tessera\n",
        )
        .replace("http://127.0.0.1:8888", url))
}

/// A control plane with kube-scheduler calling Tessera as its extender, the
/// chart's RBAC, and GPU nodes each with a kubelet stand-in and a node agent.
pub struct Cluster {
    pub nodes: Vec<GpuNode>,
    /// Nodes with NVIDIA's stock plugin and no Tessera agent ([`Cluster::add_stock_node`]).
    pub stock: Vec<crate::stock::StockNode>,
    pub scheduler: Scheduler,
    /// Every replica, when several run behind [`Cluster::service`]
    /// ([`Cluster::extender_replicas`]); empty with one.
    pub replicas: Vec<(String, Scheduler)>,
    /// The Service kube-scheduler calls when several replicas run.
    pub service: Option<crate::service::Service>,
    pub mode: String,
    /// The scheduler's arguments beyond mode, ports and key (kept on restart).
    pub scheduler_args: Vec<String>,
    pub key: std::path::PathBuf,
    pub admin: Client,
    // Last: dropping it stops every process.
    pub plane: ControlPlane,
}

impl Cluster {
    /// kube-scheduler with Tessera as its extender; `nodes`: (name, fake GPUs
    /// YAML) per node.
    pub async fn extender(env: &Env, nodes: &[(String, String)]) -> Result<Cluster> {
        Cluster::start(env, "extender", nodes, 1).await
    }

    /// `n` extender replicas electing a leader on their Lease
    /// (`--lease-role=elect`, each advertising its metrics port for forwarded
    /// binds) behind one Service address that kube-scheduler calls, as
    /// docs/kubernetes.md's "Existing kube-scheduler" wires them.
    pub async fn extender_replicas(
        env: &Env,
        nodes: &[(String, String)],
        n: usize,
    ) -> Result<Cluster> {
        Cluster::start(env, "extender", nodes, n).await
    }

    /// Tessera alone (`--mode standalone`), no kube-scheduler.
    pub async fn standalone(env: &Env, nodes: &[(String, String)]) -> Result<Cluster> {
        Cluster::start(env, "standalone", nodes, 1).await
    }

    /// Standalone with the admission webhooks served over TLS on loopback as
    /// the chart configures them ([`crate::webhook`]): the chart's
    /// scheduler arguments for them, its webhook configurations applied.
    pub async fn standalone_with_webhooks(
        env: &Env,
        nodes: &[(String, String)],
    ) -> Result<Cluster> {
        Cluster::start(env, "standalone-webhooks", nodes, 1).await
    }

    async fn start(
        env: &Env,
        mode: &str,
        nodes: &[(String, String)],
        replicas: usize,
    ) -> Result<Cluster> {
        let t = Instant::now();
        let webhooks = mode == "standalone-webhooks";
        let mode = if webhooks { "standalone" } else { mode };
        let mut plane = ControlPlane::start(env, Options::default()).await?;
        let values = if mode == "extender" {
            json!({})
        } else {
            json!({"scheduler": {"mode": mode}})
        };
        plane.install_chart_rbac(&values)?;
        let key = write_key(&plane)?;
        let mut scheduler_args = vec!["--leader-elect=false".to_string()];
        let mut webhook = None;
        if webhooks {
            // As the chart's scheduler Deployment passes them.
            let (args, port, certs) = crate::webhook::scheduler_args(&plane)?;
            scheduler_args.extend(args);
            webhook = Some((port, certs));
        }
        let mut all = Vec::new();
        let mut service = None;
        let scheduler = if replicas <= 1 {
            let args: Vec<&str> = scheduler_args.iter().map(String::as_str).collect();
            start_scheduler(&mut plane, mode, &key, &args).await?
        } else {
            for i in 0..replicas {
                let ports = (free_port(), free_port());
                let identity = format!("tessera-{i}");
                let args = [
                    "--lease-role=elect".to_string(),
                    format!("--advertise-url=http://127.0.0.1:{}", ports.1),
                    format!("--identity={identity}"),
                ];
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let s = start_scheduler_on(&mut plane, mode, &key, &args, ports).await?;
                all.push((identity, s));
            }
            let endpoints = all
                .iter()
                .map(|(_, s)| crate::service::Endpoint {
                    serve: ([127, 0, 0, 1], s.listen).into(),
                    probe: ([127, 0, 0, 1], s.metrics).into(),
                })
                .collect();
            let svc = crate::service::Service::start(endpoints)?;
            let listen = svc.addr.port();
            service = Some(svc);
            // `scheduler` names the Service's address; `replicas` the processes.
            Scheduler {
                listen,
                metrics: all[0].1.metrics,
                proc_name: all[0].1.proc_name.clone(),
            }
        };
        if mode == "extender" {
            let config = kube_scheduler_config(&format!("http://127.0.0.1:{}", scheduler.listen))?;
            plane.start_kube_scheduler(&config, Identity::KubeScheduler, "")?;
        }
        if let Some((port, certs)) = &webhook {
            for cfg in crate::webhook::loopback_configs(&plane, &values, *port, &certs.ca_pem)? {
                plane.kubectl(
                    &["apply", "--validate=false", "-f", "-"],
                    Some(&cfg.to_string()),
                )?;
            }
        }
        let mut gpu_nodes = Vec::new();
        for (name, gpus) in nodes {
            gpu_nodes.push(start_gpu_node(&mut plane, name, gpus, &key, &[]).await?);
        }
        let admin = plane.client(Identity::Admin).await?;
        println!(
            "cluster up ({mode}, {} nodes, Kubernetes {}) in {:.1} s",
            nodes.len(),
            env.version,
            t.elapsed().as_secs_f64()
        );
        Ok(Cluster {
            nodes: gpu_nodes,
            stock: Vec::new(),
            scheduler,
            replicas: all,
            service,
            mode: mode.to_string(),
            scheduler_args,
            key,
            admin,
            plane,
        })
    }

    /// Adds a GPU node with `gpus` devices of NVIDIA's stock plugin and no
    /// Tessera agent (a mixed cluster).
    pub async fn add_stock_node(&mut self, name: &str, gpus: usize) -> Result<()> {
        let dir = self.plane.dir.path().join(format!("node-{name}"));
        let node = crate::stock::start_stock_node(&self.admin, name, &dir, gpus).await?;
        self.stock.push(node);
        Ok(())
    }

    /// `kill -9` of the Tessera scheduler; returns whether it was running.
    pub fn kill_scheduler(&mut self) -> bool {
        self.plane.kill(&self.scheduler.proc_name) > 0
    }

    /// The identity holding Tessera's Lease (`tessera-system/tessera-scheduler`), if any.
    pub fn lease_holder(&self) -> Option<String> {
        self.plane
            .kubectl(
                &[
                    "-n",
                    "tessera-system",
                    "get",
                    "lease",
                    "tessera-scheduler",
                    "-o",
                    "jsonpath={.spec.holderIdentity}",
                ],
                None,
            )
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// The process name of the replica holding the Lease, with its identity.
    fn leader_proc(&self) -> Option<(String, String)> {
        let holder = self.lease_holder()?;
        self.replicas
            .iter()
            .find(|(id, _)| *id == holder)
            .map(|(_, s)| (holder, s.proc_name.clone()))
    }

    /// `kill -9` of the replica holding the Lease; returns its identity.
    pub fn kill_leader(&mut self) -> Option<String> {
        let (holder, proc_name) = self.leader_proc()?;
        (self.plane.kill(&proc_name) > 0).then_some(holder)
    }

    /// `SIGSTOP` of the replica holding the Lease (a hung pod: connections to
    /// it are accepted and never answered); returns its identity.
    pub fn freeze_leader(&mut self) -> Option<String> {
        let (holder, proc_name) = self.leader_proc()?;
        (self.plane.signal(&proc_name, "STOP") > 0).then_some(holder)
    }

    /// `SIGCONT` of the replica `identity`: it resumes where it was frozen,
    /// with whatever it had read, decided or been sent meanwhile.
    pub fn thaw(&mut self, identity: &str) -> bool {
        let Some(proc_name) = self
            .replicas
            .iter()
            .find(|(id, _)| id == identity)
            .map(|(_, s)| s.proc_name.clone())
        else {
            return false;
        };
        self.plane.signal(&proc_name, "CONT") > 0
    }

    /// Starts the Tessera scheduler again on the same ports and waits for its
    /// /readyz (its initial lists done).
    pub async fn restart_scheduler(&mut self) -> Result<()> {
        let ports = (self.scheduler.listen, self.scheduler.metrics);
        let args = self.scheduler_args.clone();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.scheduler = start_scheduler_on(
            &mut self.plane,
            &self.mode.clone(),
            &self.key.clone(),
            &args,
            ports,
        )
        .await?;
        Ok(())
    }

    /// `tessera explain default/<pod>` as the admin (an operator); its stdout.
    pub fn explain(&self, pod: &str) -> Result<String> {
        let out = std::process::Command::new(crate::tessera::tessera_bin())
            .env("KUBECONFIG", self.plane.kubeconfig(Identity::Admin))
            .args(["explain", &format!("default/{pod}")])
            .output()?;
        if !out.status.success() {
            bail!(
                "tessera explain default/{pod}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), "default")
    }

    /// Creates `pod` in `default`, with the API server's error as it is.
    pub async fn try_create(&self, pod: serde_json::Value) -> Result<Pod, kube::Error> {
        let pod: Pod = serde_json::from_value(pod).expect("a Pod manifest");
        self.pods().create(&PostParams::default(), &pod).await
    }

    /// Creates `pod` in `default`.
    pub async fn create(&self, pod: serde_json::Value) -> Result<Pod> {
        let pod: Pod = serde_json::from_value(pod)?;
        Ok(self.pods().create(&PostParams::default(), &pod).await?)
    }

    /// Waits until `f` holds for pod `name`; returns it and the time taken.
    pub async fn wait_pod(
        &self,
        name: &str,
        within: Duration,
        what: &str,
        f: impl Fn(&Pod) -> bool,
    ) -> Result<(Pod, Duration)> {
        let start = Instant::now();
        loop {
            if let Some(p) = self.pods().get_opt(name).await?
                && f(&p)
            {
                return Ok((p, start.elapsed()));
            }
            if start.elapsed() > within {
                let p = self.pods().get_opt(name).await?;
                bail!(
                    "pod {name}: not {what} within {} s; now {}\n{}",
                    within.as_secs(),
                    p.map(|p| serde_json::to_string(&p.status).unwrap_or_default())
                        .unwrap_or_else(|| "gone".into()),
                    self.events(name)
                );
            }
            self.plane.check_alive()?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until pod `name` is Running on a node; returns the node.
    pub async fn wait_running(&self, name: &str, within: Duration) -> Result<(String, Duration)> {
        let (p, d) = self
            .wait_pod(name, within, "Running", |p| phase(p) == "Running")
            .await?;
        Ok((node_of(&p).unwrap_or_default(), d))
    }

    /// The events about `name`, one a line.
    pub fn events(&self, name: &str) -> String {
        self.plane
            .kubectl(
                &[
                    "get",
                    "events",
                    "-A",
                    "--field-selector",
                    &format!("involvedObject.name={name}"),
                ],
                None,
            )
            .unwrap_or_else(|e| e.to_string())
    }

    /// Every Tessera decision of a pod that still holds its GPUs, checked for
    /// over-commitment: per GPU, the compute per-mille granted sums to at most
    /// 1000 and the memory to at most `gpu_mib`; a MIG instance is granted once.
    pub async fn audit(&self, gpu_mib: u64) -> Result<Vec<Allocation>> {
        let pods = Api::<Pod>::all(self.admin.clone())
            .list(&ListParams::default())
            .await?;
        let mut decisions = Vec::new();
        for p in &pods.items {
            let ph = phase(p);
            if ph == "Succeeded" || ph == "Failed" {
                continue;
            }
            if let Some(a) = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION))
            {
                decisions.push(Allocation::decode_unverified(a)?);
            }
        }
        let mut cores: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut mem: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut migs: BTreeMap<String, usize> = BTreeMap::new();
        for d in &decisions {
            for g in &d.gpus {
                if let Some(m) = &g.mig {
                    *migs.entry(m.uuid.clone()).or_default() += 1;
                    continue;
                }
                *cores.entry((d.node.clone(), g.uuid.clone())).or_default() +=
                    u64::from(g.cores_milli);
                *mem.entry((d.node.clone(), g.uuid.clone())).or_default() += g.memory_mib;
            }
        }
        for (gpu, c) in &cores {
            if *c > 1000 {
                bail!("GPU {gpu:?} over-committed: {c} per-mille of compute granted");
            }
        }
        for (gpu, m) in &mem {
            if *m > gpu_mib {
                bail!("GPU {gpu:?} over-committed: {m} MiB of {gpu_mib} granted");
            }
        }
        for (mig, n) in &migs {
            if *n > 1 {
                bail!("MIG instance {mig} granted to {n} pods");
            }
        }
        Ok(decisions)
    }
}

pub fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

pub fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// The decision Tessera wrote on `p`, if any.
pub fn decision(p: &Pod) -> Option<Allocation> {
    let a = p.metadata.annotations.as_ref()?.get(ANNOTATION)?;
    Allocation::decode_unverified(a).ok()
}

/// A pod of `scheduler` whose one container has `limits`, with `priority_class`.
pub fn gpu_pod(
    name: &str,
    scheduler: &str,
    limits: serde_json::Value,
    priority_class: Option<&str>,
) -> serde_json::Value {
    let mut spec = json!({
        "schedulerName": scheduler,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [{
            "name": "cuda",
            "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": limits},
        }],
    });
    if let Some(pc) = priority_class {
        spec["priorityClassName"] = json!(pc);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}
