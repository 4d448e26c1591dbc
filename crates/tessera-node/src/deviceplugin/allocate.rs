//! `Allocate` and `GetPreferredAllocation`: from the scheduler's decision to the
//! container's environment.
//!
//! The kubelet's `Allocate` call does not say which pod it is admitting. The
//! kubelet admits pods one at a time, oldest first, so the agent picks the
//! oldest pending pod on this node that asks for the same number of devices of
//! this resource and has not been answered yet, then checks that pod's
//! decision with [`Allocation::decode_verified`]: a decision that is missing,
//! not signed by the scheduler, copied from another pod or meant for another
//! node is refused with an error naming the reason (the kubelet then fails the
//! pod's admission with that message).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tessera_core::allocation::{ANNOTATION, AllocatedGpu, Allocation, AllocationError};
use tessera_core::request::Isolation;

use super::{NodeView, Resource, device_gpu};
use crate::backend::{GpuInfo, LinkKind};
use crate::proto::deviceplugin as pb;

/// A pod as the device plugin needs to see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `Pending`, `Running`, ...
    pub phase: String,
    /// Creation time, seconds since the epoch (orders admission).
    pub created_unix: i64,
    pub annotations: BTreeMap<String, String>,
    /// Per container: extended resource name → count (limits, else requests).
    pub containers: Vec<ContainerInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    pub name: String,
    pub resources: BTreeMap<String, u64>,
}

impl PodInfo {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Failure to list pods.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("cannot list pods on this node: {0}")]
pub struct PodSourceError(pub String);

/// Where pods come from: the Kubernetes API in production, a list in tests.
pub trait PodSource: Send + Sync {
    /// Pods bound to `node` (any phase).
    fn pods_on_node<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodInfo>, PodSourceError>>;
}

/// A fixed, changeable list of pods (tests and the fake mode).
#[derive(Debug, Clone, Default)]
pub struct StaticPods(pub Arc<Mutex<Vec<PodInfo>>>);

impl StaticPods {
    pub fn set(&self, pods: Vec<PodInfo>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = pods;
    }
    pub fn push(&self, pod: PodInfo) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(pod);
    }
}

impl PodSource for StaticPods {
    fn pods_on_node<'a>(
        &'a self,
        _node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodInfo>, PodSourceError>> {
        let pods = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move { Ok(pods) })
    }
}

/// No pod source (the agent runs without an API server): every lookup fails with
/// the given reason, so Allocate refuses clearly and metrics skip leak detection.
#[derive(Debug, Clone)]
pub struct NoPods(pub String);

impl PodSource for NoPods {
    fn pods_on_node<'a>(
        &'a self,
        _node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodInfo>, PodSourceError>> {
        let reason = self.0.clone();
        Box::pin(async move { Err(PodSourceError(reason)) })
    }
}

/// Where the MPS control daemon's directories are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsConfig {
    /// Host directory holding `pipe/` and `shm/` of the MPS control daemon.
    pub host_root: String,
    /// Where the pipe directory appears in the container.
    pub container_pipe_dir: String,
}

impl Default for MpsConfig {
    fn default() -> Self {
        MpsConfig {
            host_root: "/run/tessera/mps".into(),
            container_pipe_dir: "/tessera/mps/pipe".into(),
        }
    }
}

/// Why `Allocate` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocateError {
    #[error(
        "no scheduling decision: no pending pod on node {node} asks for {count} {resource} (was the pod placed by the Tessera scheduler?)"
    )]
    NoPod {
        node: String,
        count: usize,
        resource: String,
    },
    #[error(
        "no scheduling decision for pod {pod}: it has no {ANNOTATION} annotation (it was not placed by the Tessera scheduler)"
    )]
    NoDecision { pod: String },
    #[error("refusing pod {pod}: its decision was not written by the scheduler ({source})")]
    NotFromScheduler {
        pod: String,
        source: AllocationError,
    },
    #[error("refusing pod {pod}: its decision is for node {found}, this is node {expected}")]
    OtherNode {
        pod: String,
        expected: String,
        found: String,
    },
    #[error(
        "refusing pod {pod}: its decision was written for another pod (UID {found}, this pod is {expected})"
    )]
    OtherPod {
        pod: String,
        expected: String,
        found: String,
    },
    #[error("refusing pod {pod}: unreadable decision: {source}")]
    Unreadable {
        pod: String,
        source: AllocationError,
    },
    #[error("pod {pod}: decision grants {isolation} GPUs but the kubelet asked for {resource}")]
    WrongResource {
        pod: String,
        isolation: &'static str,
        resource: String,
    },
    #[error("pod {pod}: decision names GPU {gpu}, which this node does not have")]
    UnknownGpu { pod: String, gpu: String },
    #[error("pod {pod}: GPU {gpu} is unhealthy ({reason}); the pod must be rescheduled")]
    UnhealthyGpu {
        pod: String,
        gpu: String,
        reason: String,
    },
    #[error("pod {pod}: no MIG instance {profile} (start {start}) exists on GPU {gpu}")]
    NoMigInstance {
        pod: String,
        gpu: String,
        profile: String,
        start: u8,
    },
    #[error(transparent)]
    Pods(#[from] PodSourceError),
}

impl AllocateError {
    pub fn to_status(&self) -> tonic::Status {
        let msg = format!("tessera: {self}");
        match self {
            AllocateError::NotFromScheduler { .. }
            | AllocateError::OtherNode { .. }
            | AllocateError::OtherPod { .. } => tonic::Status::permission_denied(msg),
            AllocateError::Pods(_) => tonic::Status::unavailable(msg),
            _ => tonic::Status::failed_precondition(msg),
        }
    }
}

/// Answers `Allocate` for one node.
pub struct Allocator {
    pub node: String,
    key: Vec<u8>,
    pods: Arc<dyn PodSource>,
    pub mps: MpsConfig,
    /// Pod UID → number of containers answered (accepted or refused).
    answered: Mutex<BTreeMap<String, usize>>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Allocator {
    pub fn new(node: String, key: Vec<u8>, pods: Arc<dyn PodSource>, mps: MpsConfig) -> Self {
        Allocator {
            node,
            key,
            pods,
            mps,
            answered: Mutex::new(BTreeMap::new()),
        }
    }

    /// Answers one `ContainerAllocateRequest` for `resource`.
    pub async fn allocate_container(
        &self,
        resource: &Resource,
        request: &pb::ContainerAllocateRequest,
        view: &NodeView,
    ) -> Result<pb::ContainerAllocateResponse, AllocateError> {
        let resource_name = resource.name();
        let count = request.devices_ids.len();
        let pods = self.pods.pods_on_node(&self.node).await?;
        let pod = {
            let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
            // Forget pods that are gone, so the map does not grow for ever.
            answered.retain(|uid, _| pods.iter().any(|p| &p.uid == uid));
            pick_pod(&pods, &resource_name, count, &answered)
        };
        let Some(pod) = pod else {
            return Err(AllocateError::NoPod {
                node: self.node.clone(),
                count,
                resource: resource_name,
            });
        };
        *self
            .answered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(pod.uid.clone())
            .or_default() += 1;
        let result = self.decide(&pod, resource, view);
        match &result {
            Ok(r) => {
                tracing::info!(pod = %pod.key(), resource = %resource_name, envs = ?r.envs, "allocated")
            }
            Err(e) => {
                tracing::warn!(pod = %pod.key(), resource = %resource_name, error = %e, "allocate refused")
            }
        }
        result
    }

    fn decide(
        &self,
        pod: &PodInfo,
        resource: &Resource,
        view: &NodeView,
    ) -> Result<pb::ContainerAllocateResponse, AllocateError> {
        let key = pod.key();
        let Some(value) = pod.annotations.get(ANNOTATION) else {
            return Err(AllocateError::NoDecision { pod: key });
        };
        let alloc = Allocation::decode_verified(value, &self.key, &pod.uid, &self.node).map_err(
            |e| match e {
                AllocationError::Unsigned | AllocationError::BadSignature => {
                    AllocateError::NotFromScheduler {
                        pod: key.clone(),
                        source: e,
                    }
                }
                AllocationError::WrongNode { expected, found } => AllocateError::OtherNode {
                    pod: key.clone(),
                    expected,
                    found,
                },
                AllocationError::WrongPod { expected, found } => AllocateError::OtherPod {
                    pod: key.clone(),
                    expected,
                    found,
                },
                other => AllocateError::Unreadable {
                    pod: key.clone(),
                    source: other,
                },
            },
        )?;
        container_response(&key, &alloc, resource, view, &self.mps)
    }
}

/// The oldest pending pod asking `count` of `resource` in a container not yet answered.
fn pick_pod(
    pods: &[PodInfo],
    resource: &str,
    count: usize,
    answered: &BTreeMap<String, usize>,
) -> Option<PodInfo> {
    pods.iter()
        .filter(|p| p.phase.is_empty() || p.phase == "Pending")
        .filter(|p| {
            let asking: Vec<u64> = p
                .containers
                .iter()
                .filter_map(|c| c.resources.get(resource).copied())
                .filter(|n| *n > 0)
                .collect();
            let done = answered.get(&p.uid).copied().unwrap_or(0);
            done < asking.len() && asking.contains(&(count as u64))
        })
        .min_by(|a, b| {
            (a.created_unix, &a.namespace, &a.name).cmp(&(b.created_unix, &b.namespace, &b.name))
        })
        .cloned()
}

fn find_gpu<'a>(
    pod: &str,
    g: &AllocatedGpu,
    view: &'a NodeView,
) -> Result<&'a GpuInfo, AllocateError> {
    let found = if g.uuid.is_empty() {
        view.gpus.iter().find(|x| x.index == g.index)
    } else {
        view.gpu(&g.uuid)
    };
    let gpu = found.ok_or_else(|| AllocateError::UnknownGpu {
        pod: pod.to_string(),
        gpu: if g.uuid.is_empty() {
            format!("index {}", g.index)
        } else {
            g.uuid.clone()
        },
    })?;
    if let Some(crate::health::GpuHealth::Unhealthy { reason, .. }) = view.health.get(&gpu.uuid) {
        return Err(AllocateError::UnhealthyGpu {
            pod: pod.to_string(),
            gpu: gpu.uuid.clone(),
            reason: reason.clone(),
        });
    }
    Ok(gpu)
}

/// Builds a container's answer from a verified decision. Pure.
pub fn container_response(
    pod: &str,
    alloc: &Allocation,
    resource: &Resource,
    view: &NodeView,
    mps: &MpsConfig,
) -> Result<pb::ContainerAllocateResponse, AllocateError> {
    let is_mig = alloc.isolation == Isolation::Mig;
    if is_mig != matches!(resource, Resource::Mig { .. }) {
        return Err(AllocateError::WrongResource {
            pod: pod.to_string(),
            isolation: alloc.isolation.name(),
            resource: resource.name(),
        });
    }
    let mut resp = pb::ContainerAllocateResponse::default();
    let mut visible = Vec::new();
    for g in &alloc.gpus {
        let gpu = find_gpu(pod, g, view)?;
        if is_mig {
            let grant = g.mig.as_ref().ok_or_else(|| AllocateError::NoMigInstance {
                pod: pod.to_string(),
                gpu: gpu.uuid.clone(),
                profile: "(none in decision)".into(),
                start: 0,
            })?;
            let inst = gpu
                .mig_instances
                .iter()
                .find(|m| {
                    if grant.uuid.is_empty() {
                        m.profile == grant.profile && m.start.is_none_or(|s| s == grant.start)
                    } else {
                        m.uuid == grant.uuid
                    }
                })
                .ok_or_else(|| AllocateError::NoMigInstance {
                    pod: pod.to_string(),
                    gpu: gpu.uuid.clone(),
                    profile: grant.profile.clone(),
                    start: grant.start,
                })?;
            visible.push(inst.uuid.clone());
        } else {
            visible.push(gpu.uuid.clone());
        }
    }
    resp.envs
        .insert("NVIDIA_VISIBLE_DEVICES".into(), visible.join(","));
    resp.envs
        .insert("TESSERA_ISOLATION".into(), alloc.isolation.name().into());
    match alloc.isolation {
        Isolation::Mps => {
            let max_milli = alloc
                .gpus
                .iter()
                .map(|g| g.cores_milli)
                .max()
                .unwrap_or(1000);
            let pct = max_milli.div_ceil(10).clamp(1, 100);
            resp.envs
                .insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), pct.to_string());
            // Devices are numbered as the client sees them: by position in the visible list.
            let limits: Vec<String> = alloc
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| format!("{i}={}M", g.memory_mib))
                .collect();
            resp.envs
                .insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(","));
            resp.envs.insert(
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                mps.container_pipe_dir.clone(),
            );
            resp.mounts.push(pb::Mount {
                container_path: mps.container_pipe_dir.clone(),
                host_path: format!("{}/pipe", mps.host_root),
                read_only: false,
            });
            resp.mounts.push(pb::Mount {
                container_path: "/dev/shm".into(),
                host_path: format!("{}/shm", mps.host_root),
                read_only: false,
            });
        }
        Isolation::TimeSlice => {
            // Time slicing enforces nothing; tell the workload its memory budget.
            let mem: Vec<String> = alloc
                .gpus
                .iter()
                .map(|g| g.memory_mib.to_string())
                .collect();
            resp.envs
                .insert("TESSERA_GPU_MEMORY_MIB".into(), mem.join(","));
        }
        Isolation::Exclusive | Isolation::Mig => {}
    }
    Ok(resp)
}

/// `GetPreferredAllocation` for one container: the topology-best set of `size`
/// devices from `available`, containing `must_include`.
///
/// For `tessera.io/gpu` tokens it spreads over distinct GPUs first (a pod that
/// asks for N GPUs wants N GPUs), choosing the GPU set with the strongest links
/// (NVLink count, then same PCIe switch, then same socket), and among equals the
/// GPUs with the most free tokens (the least shared). For MIG devices it keeps
/// the kubelet's order. The kubelet treats the answer as a hint.
pub fn preferred(
    available: &[String],
    must_include: &[String],
    size: usize,
    view: &NodeView,
) -> Vec<String> {
    let mut chosen: Vec<String> = must_include.to_vec();
    if chosen.len() >= size {
        chosen.truncate(size);
        return chosen;
    }
    let taken: BTreeSet<&String> = chosen.iter().collect();
    // Free tokens per GPU, in a stable order.
    let mut free: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for id in available.iter().filter(|id| !taken.contains(id)) {
        free.entry(device_gpu(id)).or_default().push(id);
    }
    let link_score = |a: &str, b: &str| -> u32 {
        let Some(ga) = view.gpu(a) else { return 0 };
        match ga.links.iter().find(|l| l.peer_uuid == b) {
            Some(l) if l.kind == LinkKind::Nvlink => 100 + l.nvlinks,
            Some(l) if l.kind == LinkKind::PcieSwitch => 30,
            Some(l) if l.kind == LinkKind::SameSocket => 10,
            _ => 0,
        }
    };
    let mut gpus: Vec<&str> = must_include.iter().map(|id| device_gpu(id)).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let wanted_gpus = size - chosen.len();
    let candidates: Vec<&str> = free.keys().copied().filter(|g| !gpus.contains(g)).collect();
    let target = gpus.len() + wanted_gpus;
    let free_tokens = |c: &str| free.get(c).map_or(0, Vec::len);
    let best_set = if gpus.is_empty() {
        candidates
            .iter()
            .map(|seed| grow_set(vec![*seed], target, &candidates, &free_tokens, &link_score))
            .max_by(|a, b| {
                a.0.cmp(&b.0).then_with(|| {
                    let fa: usize = a.1.iter().map(|g| free[g].len()).sum();
                    let fb: usize = b.1.iter().map(|g| free[g].len()).sum();
                    fa.cmp(&fb)
                })
            })
            .map(|(_, s)| s)
            .unwrap_or_default()
    } else {
        grow_set(gpus.clone(), target, &candidates, &free_tokens, &link_score).1
    };
    let mut best_set = best_set;
    best_set.sort_unstable();
    // One token from each chosen GPU, then fill round-robin if more are needed.
    let mut cursors: BTreeMap<&str, usize> = BTreeMap::new();
    'outer: loop {
        let mut progressed = false;
        for g in best_set
            .iter()
            .chain(free.keys().filter(|k| !best_set.contains(k)))
        {
            if chosen.len() >= size {
                break 'outer;
            }
            let Some(list) = free.get(g) else { continue };
            let cur = cursors.entry(g).or_default();
            if *cur < list.len() {
                chosen.push(list[*cur].clone());
                *cur += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    chosen
}

/// Grows `set` greedily to `target` GPUs: each step adds the candidate with the
/// strongest links to the set, then the most free tokens. Returns the link total.
fn grow_set<'a>(
    mut set: Vec<&'a str>,
    target: usize,
    candidates: &[&'a str],
    free_tokens: &dyn Fn(&str) -> usize,
    link_score: &dyn Fn(&str, &str) -> u32,
) -> (u64, Vec<&'a str>) {
    let mut total = 0u64;
    while set.len() < target {
        let best = candidates
            .iter()
            .filter(|c| !set.contains(c))
            .map(|c| {
                let s: u32 = set.iter().map(|g| link_score(g, c)).sum();
                (s, free_tokens(c), std::cmp::Reverse(*c), *c)
            })
            .max();
        match best {
            Some((s, _, _, c)) => {
                total += u64::from(s);
                set.push(c);
            }
            None => break,
        }
    }
    (total, set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::GpuBackend;
    use crate::backend::fake::Fake;
    use tessera_core::allocation::{MigGrant, VERSION};

    fn view() -> NodeView {
        let fake = Fake::from_yaml(
            r#"
gpus:
  - { uuid: GPU-0, product: NVIDIA A100-SXM4-80GB, numaNode: 0, nvlinks: { GPU-1: 12 } }
  - { uuid: GPU-1, product: NVIDIA A100-SXM4-80GB, numaNode: 0 }
  - { uuid: GPU-2, product: NVIDIA A100-SXM4-80GB, numaNode: 1, nvlinks: { GPU-3: 12 } }
  - { uuid: GPU-3, product: NVIDIA A100-SXM4-80GB, numaNode: 1 }
  - uuid: GPU-4
    product: NVIDIA A100-SXM4-80GB
    mig: { enabled: true, instances: [ { uuid: MIG-x, profile: 3g.40gb, start: 4 } ] }
"#,
            "t",
        )
        .unwrap();
        NodeView {
            gpus: fake.discover().unwrap(),
            health: BTreeMap::new(),
        }
    }

    fn alloc(isolation: Isolation, gpus: Vec<AllocatedGpu>) -> Allocation {
        Allocation {
            version: VERSION,
            pod_uid: "u".into(),
            pod: "ns/p".into(),
            node: "n".into(),
            policy: "tessera".into(),
            isolation,
            gpus,
            signature: String::new(),
        }
    }

    fn g(index: u32, uuid: &str, memory_mib: u64, cores_milli: u32) -> AllocatedGpu {
        AllocatedGpu {
            index,
            uuid: uuid.into(),
            memory_mib,
            cores_milli,
            mig: None,
        }
    }

    #[test]
    fn mps_share_sets_thread_percentage_memory_limit_and_pipe() {
        let a = alloc(Isolation::Mps, vec![g(2, "", 20_000, 333)]);
        let r = container_response(
            "ns/p",
            &a,
            &Resource::Gpu { slots: 4 },
            &view(),
            &MpsConfig::default(),
        )
        .unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-2");
        // 333 per-mille rounds up to 34 %.
        assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "34");
        assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20000M");
        assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/tessera/mps/pipe");
        assert_eq!(r.mounts[0].host_path, "/run/tessera/mps/pipe");
        assert_eq!(r.mounts[1].container_path, "/dev/shm");
    }

    #[test]
    fn mig_and_mismatches() {
        let mut m = g(4, "GPU-4", 40_192, 428);
        m.mig = Some(MigGrant {
            profile: "3g.40gb".into(),
            start: 4,
            size: 4,
            uuid: String::new(),
        });
        let a = alloc(Isolation::Mig, vec![m.clone()]);
        let mig = Resource::Mig {
            profile: "3g.40gb".into(),
        };
        let r = container_response("ns/p", &a, &mig, &view(), &MpsConfig::default()).unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-x");
        assert!(!r.envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
        m.mig.as_mut().unwrap().start = 0;
        let a = alloc(Isolation::Mig, vec![m]);
        let e = container_response("ns/p", &a, &mig, &view(), &MpsConfig::default()).unwrap_err();
        assert!(matches!(e, AllocateError::NoMigInstance { .. }), "{e}");
        let whole = alloc(Isolation::Exclusive, vec![g(0, "GPU-9", 0, 1000)]);
        let e = container_response(
            "ns/p",
            &whole,
            &Resource::Gpu { slots: 1 },
            &view(),
            &MpsConfig::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod ns/p: decision names GPU GPU-9, which this node does not have"
        );
        let e =
            container_response("ns/p", &whole, &mig, &view(), &MpsConfig::default()).unwrap_err();
        assert!(matches!(e, AllocateError::WrongResource { .. }));
    }

    #[test]
    fn preferred_allocation_follows_nvlink() {
        let v = view();
        let mut avail = Vec::new();
        for gpu in ["GPU-0", "GPU-1", "GPU-2", "GPU-3"] {
            for k in 0..4 {
                avail.push(super::super::slot_id(gpu, k));
            }
        }
        // GPU-0 is partly used: the pair GPU-2/GPU-3 has more free tokens.
        avail.retain(|id| id != "GPU-0::0");
        let p = preferred(&avail, &[], 2, &v);
        assert_eq!(p, ["GPU-2::0", "GPU-3::0"]);
        // Must include a GPU-1 token: its NVLink peer GPU-0 comes next.
        let p = preferred(&avail, &["GPU-1::2".to_string()], 2, &v);
        assert_eq!(p, ["GPU-1::2", "GPU-0::1"]);
        // More tokens than GPUs: one per GPU first.
        let p = preferred(&avail, &[], 5, &v);
        let gpus: BTreeSet<&str> = p.iter().map(|id| device_gpu(id)).collect();
        assert_eq!((p.len(), gpus.len()), (5, 4));
    }

    #[test]
    fn pick_pod_takes_the_oldest_unanswered_asker() {
        let pod = |uid: &str, created: i64, n: u64, phase: &str| PodInfo {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            phase: phase.into(),
            created_unix: created,
            annotations: BTreeMap::new(),
            containers: vec![ContainerInfo {
                name: "c".into(),
                resources: [("tessera.io/gpu".to_string(), n)].into(),
            }],
        };
        let pods = vec![
            pod("new", 20, 1, "Pending"),
            pod("old", 10, 1, "Pending"),
            pod("running", 1, 1, "Running"),
            pod("two", 5, 2, "Pending"),
        ];
        let mut answered = BTreeMap::new();
        assert_eq!(
            pick_pod(&pods, "tessera.io/gpu", 1, &answered).unwrap().uid,
            "old"
        );
        answered.insert("old".to_string(), 1);
        assert_eq!(
            pick_pod(&pods, "tessera.io/gpu", 1, &answered).unwrap().uid,
            "new"
        );
        assert_eq!(
            pick_pod(&pods, "tessera.io/gpu", 2, &answered).unwrap().uid,
            "two"
        );
        assert!(pick_pod(&pods, "tessera.io/gpu", 3, &answered).is_none());
    }
}
