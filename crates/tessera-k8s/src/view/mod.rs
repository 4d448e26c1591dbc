//! Read-only views of the cluster for operators: `kubectl tessera top` (nodes
//! and GPUs with their shares, models, health and fragmentation), `kubectl
//! tessera pods` (GPU pods with their exact grants) and the facts behind
//! `tessera doctor pod`.
//!
//! Each view is a pure function of listed objects (tests build them by hand)
//! plus a thin async reader that lists them with a [`kube::Client`]. Usage and
//! fragmentation come from the same [`Mirror`] and FGD code the scheduler and
//! its metrics use, so `top` shows what the scheduler sees; per-GPU tenants
//! come from the pods' allocation annotations, which are the grants.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;
use tessera_api::{GpuHealth, GpuNode, GpuQueue, PodGroup};
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_core::frag::{FragNode, node_frag};
use tessera_core::policy::{PolicyArgs, by_name};

use crate::convert;
use crate::mirror::Mirror;

mod pod;
pub use pod::{ContainerFacts, EventFacts, MpsFacts, PodFacts, pod_facts, pod_facts_from};

/// Why a view could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("reading {what} from the cluster: {source}")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("pod {0} not found")]
    NotFound(String),
}

/// Where to connect, as kubectl's `--kubeconfig` and `--context` say.
#[derive(Debug, Clone, Default)]
pub struct Connect {
    pub kubeconfig: Option<std::path::PathBuf>,
    pub context: Option<String>,
}

impl Connect {
    /// A client and the namespace the kubeconfig context names (`default` when none).
    /// Without flags: `$KUBECONFIG`, `~/.kube/config`, then the in-cluster service account.
    pub async fn client(&self) -> Result<(kube::Client, String), ViewError> {
        use kube::config::{Config, KubeConfigOptions, Kubeconfig};
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kc = Kubeconfig::read_from(path)
                    .map_err(|e| ViewError::Config(format!("{}: {e}", path.display())))?;
                Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| ViewError::Config(format!("{}: {e}", path.display())))?
            }
            (None, Some(_)) => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| ViewError::Config(e.to_string()))?,
            (None, None) => Config::infer()
                .await
                .map_err(|e| ViewError::Config(e.to_string()))?,
        };
        let namespace = config.default_namespace.clone();
        let client =
            kube::Client::try_from(config).map_err(|e| ViewError::Config(e.to_string()))?;
        Ok((client, namespace))
    }
}

/// One node in `top`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    pub name: String,
    pub ready: bool,
    /// Catalog name of the node's GPU model; empty without inventory.
    pub model: String,
    /// `Healthy`, `Degraded`, `Unhealthy`, or `NoInventory` (no `GpuNode`).
    pub health: String,
    /// Compute granted, in milli-GPU (1000 = one whole GPU).
    pub allocated_milli: u64,
    /// Compute of the node's GPUs, in milli-GPU.
    pub capacity_milli: u64,
    /// FGD fragmentation against the built-in target workload, in milli-GPU.
    pub fragmentation_milli: f64,
    pub gpu_pods: usize,
    pub gpus: Vec<GpuRow>,
}

/// One GPU in `top`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuRow {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub memory_mib: u64,
    pub allocated_memory_mib: u64,
    pub allocated_milli: u32,
    pub healthy: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    pub mig: bool,
    /// `namespace/name` of each pod holding part of this GPU.
    pub pods: Vec<String>,
}

/// `top` from listed objects.
pub fn top_from(nodes: Vec<Node>, inventory: Vec<GpuNode>, pods: Vec<Pod>) -> Vec<NodeRow> {
    let ready: BTreeMap<String, bool> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, node_ready(n))))
        .collect();
    let inv: BTreeMap<String, GpuNode> = inventory
        .iter()
        .filter_map(|g| Some((g.metadata.name.clone()?, g.clone())))
        .collect();
    let tenants = tenants_by_gpu(&pods);
    let mut m = mirror(nodes, inventory, pods);
    // Learned from the pods listed, as the scheduler rebuilds it after a restart.
    let workload = m.target_workload();
    let usage = m.usage();
    let cluster = m.cluster();
    let mut rows = Vec::new();
    for node in cluster.nodes() {
        let used = usage.get(&node.name);
        let gn = inv.get(&node.name);
        let status = gn.and_then(|g| g.status.as_ref());
        let model = node
            .primary_model()
            .map(|m| cluster.catalog.spec(m).name.clone())
            .unwrap_or_default();
        let mut gpus = Vec::new();
        let mut free_milli = Vec::new();
        for (i, g) in node.gpus.iter().enumerate() {
            let u = used.and_then(|u| u.gpus.get(i));
            let spec = cluster.catalog.spec(g.model);
            let healthy = gn
                .is_none_or(|gn| gn.spec.health_of(g.index, status) == GpuHealth::Healthy)
                && g.health == tessera_core::model::Health::Healthy;
            let free_cores = u.map(|u| u.free_cores_milli).unwrap_or(1000);
            free_milli.push(if healthy { free_cores } else { 0 });
            gpus.push(GpuRow {
                index: g.index,
                uuid: g.uuid.clone(),
                model: spec.name.clone(),
                memory_mib: spec.memory_mib,
                allocated_memory_mib: u
                    .map(|u| spec.memory_mib.saturating_sub(u.free_memory_mib))
                    .unwrap_or(0),
                allocated_milli: 1000u32.saturating_sub(free_cores),
                healthy,
                reason: status
                    .and_then(|s| s.gpus.iter().find(|c| c.index == g.index))
                    .map(|c| c.reason.clone())
                    .unwrap_or_default(),
                mig: g.mig_enabled,
                pods: tenants
                    .get(&(node.name.clone(), g.index))
                    .cloned()
                    .unwrap_or_default(),
            });
        }
        let fragmentation_milli = match (node.primary_model(), used) {
            (Some(model), Some(u)) => node_frag(
                &FragNode {
                    free_milli: &free_milli,
                    free_cpu_milli: u.free_cpu_milli,
                    model: Some(model),
                },
                &workload,
            ),
            _ => 0.0,
        };
        let health = match (gn, status) {
            (None, _) => "NoInventory".to_string(),
            (Some(_), _) if gpus.iter().all(|g| g.healthy) => "Healthy".to_string(),
            (Some(_), _) if gpus.iter().any(|g| g.healthy) => "Degraded".to_string(),
            _ => "Unhealthy".to_string(),
        };
        let mut pods_here: Vec<&String> = gpus.iter().flat_map(|g| &g.pods).collect();
        pods_here.sort();
        pods_here.dedup();
        rows.push(NodeRow {
            name: node.name.clone(),
            ready: ready.get(&node.name).copied().unwrap_or(false),
            model,
            health,
            allocated_milli: gpus.iter().map(|g| u64::from(g.allocated_milli)).sum(),
            capacity_milli: 1000 * gpus.len() as u64,
            fragmentation_milli,
            gpu_pods: pods_here.len(),
            gpus,
        });
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// One GPU pod in `pods`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRow {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub node: Option<String>,
    /// The GPU resources the pod asks, e.g. `tessera.io/gpu=1`.
    pub requests: Vec<String>,
    /// The grant from the allocation annotation, when there is one and it decodes.
    pub allocation: Option<Allocation>,
    /// Why the annotation did not decode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// GPU pods (those asking a `tessera.io/` or `nvidia.com/gpu` resource, or holding a grant).
pub fn pods_from(pods: &[Pod]) -> Vec<PodRow> {
    let mut rows: Vec<PodRow> = pods
        .iter()
        .filter_map(|p| {
            let requests = gpu_requests(p);
            let raw = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION));
            if requests.is_empty() && raw.is_none() {
                return None;
            }
            let (allocation, problem) = match raw.map(|v| Allocation::decode_unverified(v)) {
                None => (None, None),
                Some(Ok(a)) => (Some(a), None),
                Some(Err(e)) => (None, Some(e.to_string())),
            };
            Some(PodRow {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                phase: phase(p),
                node: convert::pod_node(p).map(str::to_string),
                requests,
                allocation,
                problem,
            })
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// `top` read from the cluster.
pub async fn top(client: &kube::Client) -> Result<Vec<NodeRow>, ViewError> {
    let (nodes, inventory, pods) = read_cluster(client).await?;
    Ok(top_from(nodes, inventory, pods))
}

/// `pods` read from the cluster: one namespace, or all when `namespace` is `None`.
pub async fn pods(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<Vec<PodRow>, ViewError> {
    let api: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|source| ViewError::List {
            what: "pods",
            source,
        })?;
    Ok(pods_from(&list.items))
}

/// A list that failed, by what was listed.
#[derive(Debug)]
pub(crate) struct ListFailed {
    pub what: &'static str,
    pub source: kube::Error,
}

impl From<ListFailed> for ViewError {
    fn from(e: ListFailed) -> ViewError {
        ViewError::List {
            what: e.what,
            source: e.source,
        }
    }
}

/// Every Node, GpuNode and Pod (no GpuNode CRD installed: no inventory).
pub(crate) async fn read_cluster(
    client: &kube::Client,
) -> Result<(Vec<Node>, Vec<GpuNode>, Vec<Pod>), ListFailed> {
    let lp = ListParams::default();
    let failed = |what| move |source| ListFailed { what, source };
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .map_err(failed("nodes"))?;
    // A cluster without the CRD has no inventory: every node shows NoInventory.
    let inventory = match Api::<GpuNode>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(source) => return Err(failed("gpunodes")(source)),
    };
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(failed("pods"))?;
    Ok((nodes.items, inventory, pods.items))
}

/// What decides a pending pod besides nodes, GpuNodes and pods, as the
/// scheduler's watches feed its mirror: the `GpuQueue`s, the namespaces' queue
/// label and annotation, and the gangs' `PodGroup`s.
#[derive(Debug, Default)]
pub(crate) struct QueuesAndGangs {
    pub queues: Vec<GpuQueue>,
    pub namespaces: Vec<Namespace>,
    pub groups: Vec<PodGroup>,
}

impl QueuesAndGangs {
    /// Into `m` through the same calls the scheduler's watches make on a relist.
    pub(crate) fn feed(self, m: &mut Mirror) {
        m.replace_queues(self.queues);
        m.replace_namespaces(self.namespaces);
        m.replace_pod_groups(self.groups);
    }
}

/// Every `GpuQueue` and, when there is one, every namespace (without queues a
/// namespace decides nothing). No GpuQueue CRD: no queues, as the scheduler
/// runs without quotas then.
pub(crate) async fn read_queues(
    client: &kube::Client,
) -> Result<(Vec<GpuQueue>, Vec<Namespace>), ListFailed> {
    let lp = ListParams::default();
    let queues = match Api::<GpuQueue>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok((Vec::new(), Vec::new())),
        Err(source) => {
            return Err(ListFailed {
                what: "gpuqueues",
                source,
            });
        }
    };
    if queues.is_empty() {
        return Ok((queues, Vec::new()));
    }
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|source| ListFailed {
            what: "namespaces",
            source,
        })?;
    Ok((queues, namespaces.items))
}

/// [`read_queues`] and every `PodGroup` (no PodGroup CRD: none, and gang pods
/// wait for a group that does not exist, as the scheduler has them).
pub(crate) async fn read_queues_and_gangs(
    client: &kube::Client,
) -> Result<QueuesAndGangs, ListFailed> {
    let (queues, namespaces) = read_queues(client).await?;
    let groups = match Api::<PodGroup>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(source) => {
            return Err(ListFailed {
                what: "podgroups",
                source,
            });
        }
    };
    Ok(QueuesAndGangs {
        queues,
        namespaces,
        groups,
    })
}

pub(crate) fn mirror(nodes: Vec<Node>, inventory: Vec<GpuNode>, pods: Vec<Pod>) -> Mirror {
    // The built-in policy name always resolves; it learns the workload from `pods`
    // (the fragment shown), and does not affect usage.
    let policy = by_name("tessera", &PolicyArgs::default())
        .unwrap_or_else(|e| unreachable!("built-in policy: {e}"));
    // No key: annotations are read as the API holds them (display only).
    Mirror::from_objects(policy, Vec::new(), nodes, inventory, pods)
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Unknown".to_string())
}

fn finished(p: &Pod) -> bool {
    matches!(phase(p).as_str(), "Succeeded" | "Failed")
}

/// `(node, GPU index)` → pods whose grant holds part of that GPU (finished pods hold nothing).
fn tenants_by_gpu(pods: &[Pod]) -> BTreeMap<(String, u32), Vec<String>> {
    let mut out: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
    for p in pods.iter().filter(|p| !finished(p)) {
        let Some(node) = convert::pod_node(p) else {
            continue;
        };
        let Some(Ok(a)) = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION))
            .map(|v| Allocation::decode_unverified(v))
        else {
            continue;
        };
        for g in &a.gpus {
            out.entry((node.to_string(), g.index))
                .or_default()
                .push(convert::pod_key(p));
        }
    }
    for v in out.values_mut() {
        v.sort();
        v.dedup();
    }
    out
}

fn gpu_requests(p: &Pod) -> Vec<String> {
    let mut out = BTreeMap::new();
    let spec = p.spec.iter();
    let containers = spec.flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    for c in containers {
        let Some(r) = &c.resources else { continue };
        for map in [&r.requests, &r.limits].into_iter().flatten() {
            for (k, v) in map {
                if k.starts_with("tessera.io/") || k == "nvidia.com/gpu" {
                    out.entry(k.clone()).or_insert_with(|| v.0.clone());
                }
            }
        }
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}
