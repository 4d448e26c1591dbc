//! `Allocate`: from the scheduler's decision to one container's devices.
//!
//! The kubelet's `Allocate` call does not say which pod or container it is
//! admitting. It admits pods one at a time, oldest first, and within a pod calls
//! once per container that asks the resource: init containers (sidecars
//! included) in spec order, then app containers ([`containers::kubelet_order`]).
//! So the agent keeps, per pod and resource, how many calls it has answered:
//! the next call belongs to the next asking container of the pod being
//! admitted, or else of the oldest pending pod whose next asking container asks
//! that many devices. It then checks the pod's decision with
//! [`Allocation::decode_verified`]: a decision that is missing, not signed by
//! the scheduler, copied from another pod or meant for another node is refused
//! with an error naming the reason (the kubelet then fails the pod's admission
//! with that message), and hands the container only its own GPUs
//! ([`Allocation::gpus_of`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tessera_core::allocation::{ANNOTATION, Allocation, AllocationError, KeyRing, VerifyingKeys};
use tessera_core::containers;
pub use tessera_core::containers::{Container, ContainerKind};
use tessera_core::request::{Isolation, RequestError};

use super::Resource;
use super::handover::DeviceList;
use super::response::{container_response, find_gpu};
use crate::deviceplugin::NodeView;
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
    /// Init containers (sidecars included) in spec order, then app containers.
    pub containers: Vec<Container>,
}

impl PodInfo {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The decisions (verified with `key` for this pod and `node`) of the pods in
    /// `pods` that still hold their GPUs: every phase but Succeeded and Failed.
    pub fn live_decisions<'a, K: VerifyingKeys + ?Sized>(
        pods: &'a [PodInfo],
        key: &'a K,
        node: &'a str,
    ) -> impl Iterator<Item = Allocation> + 'a {
        pods.iter()
            .filter(|p| p.phase != "Succeeded" && p.phase != "Failed")
            .filter_map(move |p| {
                let v = p.annotations.get(ANNOTATION)?;
                Allocation::decode_verified(v, key, &p.uid, node).ok()
            })
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
    /// Host directory holding the daemons' pipe directories and `shm/`.
    pub host_root: String,
    /// Where the pipe directory appears in the container.
    pub container_pipe_dir: String,
    /// The agent runs one control daemon per GPU set ([`crate::mps`]), whose pipe is
    /// `<host_root>/<key>/pipe`; otherwise one daemon someone else runs serves the
    /// node at `<host_root>/pipe`.
    pub per_gpu_daemons: bool,
}

impl Default for MpsConfig {
    fn default() -> Self {
        MpsConfig {
            host_root: "/run/tessera/mps".into(),
            container_pipe_dir: "/tessera/mps/pipe".into(),
            per_gpu_daemons: false,
        }
    }
}

/// How devices are handed to containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handover {
    pub mps: MpsConfig,
    pub device_list: DeviceList,
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
        isolation: String,
        resource: String,
    },
    #[error(
        "pod {pod}: {containers} containers ask GPUs but the decision does not say which container gets which GPU (was it written by an older scheduler?); the pod must be rescheduled"
    )]
    NoContainerList { pod: String, containers: usize },
    #[error("pod {pod}: the decision gives container {container} no GPU")]
    NotInDecision { pod: String, container: String },
    #[error(
        "pod {pod}: the kubelet asks {asked} {resource} for container {container}, but the decision gives it {granted} GPUs"
    )]
    CountMismatch {
        pod: String,
        container: String,
        resource: String,
        asked: usize,
        granted: usize,
    },
    #[error("pod {pod}: its containers' GPU requests are not valid: {source}")]
    BadSpec { pod: String, source: RequestError },
    #[error(
        "pod {pod}: decision names MIG instance {uuid} as {profile} at start {start}, but on GPU {gpu} that instance is {found}"
    )]
    MigMismatch {
        pod: String,
        gpu: String,
        uuid: String,
        profile: String,
        start: u8,
        found: String,
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
    #[error("pod {pod}: the MIG instance its decision plans could not be created: {message}")]
    MigCreate { pod: String, message: String },
    #[error("pod {pod}: its MPS share has no MPS control daemon to enforce it: {message}")]
    MpsDaemon { pod: String, message: String },
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
    key: KeyRing,
    pods: Arc<dyn PodSource>,
    pub handover: Handover,
    state: Mutex<Answered>,
    /// Creates the MIG instances decisions plan (none: planned instances are refused
    /// as missing).
    mig: Option<Arc<crate::migplan::MigPlanner>>,
    /// Starts the MPS control daemon an MPS share needs before answering (none: the
    /// daemon is someone else's, [`MpsConfig::per_gpu_daemons`] off).
    mps: Option<Arc<crate::mps::MpsDaemons>>,
}

/// What has been answered so far.
#[derive(Debug, Default)]
struct Answered {
    /// (pod UID, resource) → calls answered (accepted or refused).
    calls: BTreeMap<(String, String), usize>,
    /// Pods with a refused call: the kubelet fails their admission, so no further
    /// call belongs to them even while the API still shows them pending.
    refused: BTreeSet<String>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Allocator {
    pub fn new(
        node: String,
        key: impl Into<KeyRing>,
        pods: Arc<dyn PodSource>,
        handover: Handover,
    ) -> Self {
        Allocator {
            node,
            key: key.into(),
            pods,
            handover,
            state: Mutex::new(Answered::default()),
            mig: None,
            mps: None,
        }
    }

    /// Lets the allocator start the MPS control daemon of an MPS share's GPUs before
    /// answering; an MPS share whose daemon does not start is refused.
    pub fn with_mps(mut self, daemons: Arc<crate::mps::MpsDaemons>) -> Self {
        self.mps = Some(daemons);
        self
    }

    /// `resp` once the MPS daemon for `gpus` serves (nothing to do without daemons
    /// or for a grant that is not MPS).
    async fn with_mps_daemon(
        &self,
        pod: &PodInfo,
        resp: pb::ContainerAllocateResponse,
        gpus: Vec<String>,
    ) -> Result<pb::ContainerAllocateResponse, AllocateError> {
        let Some(daemons) = self.mps.clone().filter(|_| !gpus.is_empty()) else {
            return Ok(resp);
        };
        let fail = |message: String| AllocateError::MpsDaemon {
            pod: pod.key(),
            message,
        };
        tokio::task::spawn_blocking(move || daemons.ensure(&gpus))
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))?;
        Ok(resp)
    }

    /// Lets the allocator create the MIG instances decisions plan before answering.
    pub fn with_mig(mut self, planner: Arc<crate::migplan::MigPlanner>) -> Self {
        self.mig = Some(planner);
        self
    }

    /// The view to answer `pod` from: with its planned MIG instances created first.
    async fn with_planned(
        &self,
        pod: &PodInfo,
        view: &NodeView,
    ) -> Result<NodeView, AllocateError> {
        let Some(planner) = &self.mig else {
            return Ok(view.clone());
        };
        // An unreadable or forged decision is refused by `decide` with its reason;
        // only a verified one may change the GPUs.
        let Some(alloc) = pod
            .annotations
            .get(ANNOTATION)
            .and_then(|v| Allocation::decode_verified(v, &self.key, &pod.uid, &self.node).ok())
            .filter(|a| {
                a.gpus
                    .iter()
                    .any(|g| g.mig.as_ref().is_some_and(|m| m.create))
            })
        else {
            return Ok(view.clone());
        };
        let (planner, v) = (planner.clone(), view.clone());
        let fail = |message: String| AllocateError::MigCreate {
            pod: pod.key(),
            message,
        };
        tokio::task::spawn_blocking(move || planner.apply(&alloc, &v))
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))
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
        let picked = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            // Forget pods that are gone, so the maps do not grow for ever.
            state
                .calls
                .retain(|(uid, _), _| pods.iter().any(|p| &p.uid == uid));
            state
                .refused
                .retain(|uid| pods.iter().any(|p| &p.uid == uid));
            let picked = pick(&pods, &resource_name, count, &state);
            if let Some((pod, _)) = &picked {
                *state
                    .calls
                    .entry((pod.uid.clone(), resource_name.clone()))
                    .or_default() += 1;
            }
            picked
        };
        let Some((pod, container)) = picked else {
            return Err(AllocateError::NoPod {
                node: self.node.clone(),
                count,
                resource: resource_name,
            });
        };
        let result = match self.with_planned(&pod, view).await {
            Ok(v) => match self.decide(&pod, &container, resource, count, &v) {
                Ok((resp, mps_gpus)) => self.with_mps_daemon(&pod, resp, mps_gpus).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match &result {
            Ok(r) => {
                tracing::info!(pod = %pod.key(), container = %container, resource = %resource_name, envs = ?r.envs, cdi = ?r.cdi_devices, "allocated")
            }
            Err(e) => {
                self.state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .refused
                    .insert(pod.uid.clone());
                tracing::warn!(pod = %pod.key(), container = %container, resource = %resource_name, error = %e, "allocate refused")
            }
        }
        result
    }

    /// The answer for `container`, and the GPUs (UUIDs) whose MPS daemon it needs
    /// (empty unless the grant is MPS).
    fn decide(
        &self,
        pod: &PodInfo,
        container: &str,
        resource: &Resource,
        count: usize,
        view: &NodeView,
    ) -> Result<(pb::ContainerAllocateResponse, Vec<String>), AllocateError> {
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
        if alloc.containers.is_empty() {
            // A decision without a container list is for a pod with one GPU
            // container; anything else would hand every container every GPU.
            let demands = containers::gpu_demands(&pod.containers).map_err(|source| {
                AllocateError::BadSpec {
                    pod: key.clone(),
                    source,
                }
            })?;
            if demands.len() > 1 {
                return Err(AllocateError::NoContainerList {
                    pod: key,
                    containers: demands.len(),
                });
            }
        }
        let gpus = alloc
            .gpus_of(container)
            .ok_or_else(|| AllocateError::NotInDecision {
                pod: key.clone(),
                container: container.to_string(),
            })?;
        if gpus.len() != count {
            return Err(AllocateError::CountMismatch {
                pod: key,
                container: container.to_string(),
                resource: resource.name(),
                asked: count,
                granted: gpus.len(),
            });
        }
        let resp = container_response(&key, &alloc, &gpus, resource, view, &self.handover)?;
        let mps_gpus = if alloc.isolation == Isolation::Mps {
            gpus.iter()
                .map(|g| find_gpu(&key, g, view).map(|x| x.uuid.clone()))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        Ok((resp, mps_gpus))
    }
}

/// The pod and container the next call for `count` devices of `resource`
/// belongs to: the next asking container of a pod already being admitted, else
/// of the oldest pending pod whose next asking container asks `count`.
fn pick(
    pods: &[PodInfo],
    resource: &str,
    count: usize,
    state: &Answered,
) -> Option<(PodInfo, String)> {
    pods.iter()
        .filter(|p| p.phase.is_empty() || p.phase == "Pending")
        .filter(|p| !state.refused.contains(&p.uid))
        .filter_map(|p| {
            let done = state
                .calls
                .get(&(p.uid.clone(), resource.to_string()))
                .copied()
                .unwrap_or(0);
            let askers = containers::askers(&p.containers, resource);
            let (name, asked) = askers.get(done)?;
            (*asked == count as u64).then(|| (p, name.to_string(), done > 0))
        })
        .min_by(|(a, _, a_started), (b, _, b_started)| {
            b_started.cmp(a_started).then_with(|| {
                (a.created_unix, &a.namespace, &a.name).cmp(&(
                    b.created_unix,
                    &b.namespace,
                    &b.name,
                ))
            })
        })
        .map(|(p, name, _)| (p.clone(), name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, created: i64, phase: &str, containers: Vec<Container>) -> PodInfo {
        PodInfo {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            phase: phase.into(),
            created_unix: created,
            annotations: BTreeMap::new(),
            containers,
        }
    }

    fn asking(name: &str, kind: ContainerKind, n: &str) -> Container {
        Container::new(name, kind, &[("tessera.io/gpu", n)])
    }

    fn picked(pods: &[PodInfo], count: usize, state: &Answered) -> Option<(String, String)> {
        pick(pods, "tessera.io/gpu", count, state).map(|(p, c)| (p.uid, c))
    }

    fn answer(state: &mut Answered, uid: &str) {
        *state
            .calls
            .entry((uid.into(), "tessera.io/gpu".into()))
            .or_default() += 1;
    }

    #[test]
    fn pick_takes_the_oldest_unanswered_asker() {
        let one = |uid: &str, created: i64, n: &str, phase: &str| {
            pod(
                uid,
                created,
                phase,
                vec![asking("c", ContainerKind::App, n)],
            )
        };
        let pods = vec![
            one("new", 20, "1", "Pending"),
            one("old", 10, "1", "Pending"),
            one("running", 1, "1", "Running"),
            one("two", 5, "2", "Pending"),
        ];
        let mut state = Answered::default();
        assert_eq!(picked(&pods, 1, &state).unwrap().0, "old");
        answer(&mut state, "old");
        assert_eq!(picked(&pods, 1, &state).unwrap().0, "new");
        assert_eq!(picked(&pods, 2, &state).unwrap().0, "two");
        assert!(picked(&pods, 3, &state).is_none());
        // A refused pod is out: the kubelet failed its admission.
        state.refused.insert("new".into());
        assert!(picked(&pods, 1, &state).is_none());
    }

    #[test]
    fn pick_follows_the_kubelet_through_a_pods_containers() {
        // Spec order: app `a`, init `load` (2 GPUs), sidecar `proxy`, app `b`.
        let multi = pod(
            "multi",
            20,
            "Pending",
            vec![
                asking("load", ContainerKind::Init, "2"),
                asking("proxy", ContainerKind::Sidecar, "1"),
                asking("a", ContainerKind::App, "1"),
                Container::new("cpu-only", ContainerKind::App, &[("cpu", "1")]),
                asking("b", ContainerKind::App, "1"),
            ],
        );
        let older = pod(
            "older",
            10,
            "Pending",
            vec![asking("c", ContainerKind::App, "1")],
        );
        let pods = vec![multi, older];
        let mut state = Answered::default();
        // The kubelet starts on `multi` with its init container's 2 devices.
        assert_eq!(
            picked(&pods, 2, &state),
            Some(("multi".into(), "load".into()))
        );
        answer(&mut state, "multi");
        // The next 1-device calls finish `multi` before the older pod, in order.
        for container in ["proxy", "a", "b"] {
            assert_eq!(
                picked(&pods, 1, &state),
                Some(("multi".into(), container.into()))
            );
            answer(&mut state, "multi");
        }
        assert_eq!(picked(&pods, 1, &state), Some(("older".into(), "c".into())));
    }
}
