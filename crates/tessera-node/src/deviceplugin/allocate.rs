//! `Allocate`: from the scheduler's decision to one container's devices.
//!
//! The kubelet's `Allocate` call does not say which pod or container it is
//! admitting, only the device IDs it picked. It admits pods one at a time, and
//! within a pod calls once per container that asks the resource: init
//! containers (sidecars included) in spec order, then app containers
//! ([`containers::kubelet_order`]). So the call belongs to the next asking
//! container of the one pod that is pending and that the kubelet has reached
//! but not finished. The agent tells which that is from what the kubelet and
//! the agent itself have said, never from age:
//!
//! - the kubelet's PodResources API ([`crate::podresources`]) lists the pods
//!   the kubelet knows (it adds a pod before admitting it, so a pod it has not
//!   reached is not a candidate) and the containers already holding devices
//!   (those are answered, whatever the agent remembers);
//! - the answers the agent gave, with the device IDs the kubelet passed, are
//!   kept in a state file ([`Allocator::with_state`]), so an agent restart
//!   does not make an answered pod look unanswered;
//! - when more than one pod could still be asking, or the kubelet knows a pod
//!   the agent cannot read yet, the call is refused with an error naming the
//!   pods (the kubelet shows it on the pod it was admitting): a wrong guess
//!   would hand one pod another pod's GPUs.
//!
//! It then checks the pod's decision with [`Allocation::decode_verified`]: a
//! decision that is missing, not signed by the scheduler, copied from another
//! pod or meant for another node is refused with an error naming the reason
//! (the kubelet then fails the pod's admission with that message), and hands
//! the container only its own GPUs ([`Allocation::gpus_of`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tessera_core::allocation::{ANNOTATION, Allocation, AllocationError, KeyRing, VerifyingKeys};
use tessera_core::containers;
pub use tessera_core::containers::{Container, ContainerKind};
use tessera_core::request::{Isolation, RequestError};

use super::Resource;
use super::handover::DeviceList;
use super::response::{container_response, find_gpu};
use crate::deviceplugin::NodeView;
use crate::podresources::{KubeletPod, KubeletPods};
use crate::proto::deviceplugin as pb;

/// How long `Allocate` waits for the pod source to show a pod the kubelet
/// already knows (the watch lags the kubelet's own by a moment).
pub const STORE_WAIT: Duration = Duration::from_secs(2);

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
    #[error(
        "cannot tell which pod this call is for: {pods} on node {node} could each be the one asking {count} {resource}; refusing rather than handing one pod another pod's GPUs (recreate the pod)"
    )]
    Ambiguous {
        node: String,
        count: usize,
        resource: String,
        /// The pods that could be asking, `namespace/name`, comma-separated.
        pods: String,
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
    key: KeyRing,
    pods: Arc<dyn PodSource>,
    pub handover: Handover,
    state: Mutex<Answered>,
    /// Where the answers are kept across restarts (none: memory only).
    state_path: Option<PathBuf>,
    /// The kubelet's PodResources API (none: every pending pod is a candidate).
    kubelet: Option<Arc<dyn KubeletPods>>,
    store_wait: Duration,
    /// Counts answered calls, so the PodResources report is read again after one.
    answered_tx: tokio::sync::watch::Sender<u64>,
    /// Creates the MIG instances decisions plan (none: planned instances are refused
    /// as missing).
    mig: Option<Arc<crate::migplan::MigPlanner>>,
    /// Starts the MPS control daemon an MPS share needs before answering (none: the
    /// daemon is someone else's, [`MpsConfig::per_gpu_daemons`] off).
    mps: Option<Arc<crate::mps::MpsDaemons>>,
}

/// One call the agent answered for a known pod, as kept in the state file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    pub pod_uid: String,
    /// `namespace/name`.
    pub pod: String,
    pub resource: String,
    pub container: String,
    /// The device IDs the kubelet passed (and records in its PodResources API).
    #[serde(default)]
    pub device_ids: Vec<String>,
    /// Refused: the kubelet fails the pod's admission, so no further call
    /// belongs to it even while the API still shows it pending.
    #[serde(default)]
    pub refused: bool,
}

/// What has been answered so far (the state file's content).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Answered {
    #[serde(default)]
    answers: Vec<Answer>,
}

impl Answered {
    /// Calls answered (accepted or refused) for `uid`'s `resource`.
    fn calls(&self, uid: &str, resource: &str) -> usize {
        self.answers
            .iter()
            .filter(|a| a.pod_uid == uid && a.resource == resource)
            .count()
    }

    fn refused(&self, uid: &str) -> bool {
        self.answers.iter().any(|a| a.pod_uid == uid && a.refused)
    }
}

/// Failure to read or write the answers' state file.
#[derive(Debug, thiserror::Error)]
#[error("allocate state file {path}: {source}")]
pub struct StateError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

fn load_state(path: &std::path::Path) -> Result<Answered, StateError> {
    let err = |source| StateError {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidData, e))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Answered::default()),
        Err(e) => Err(err(e)),
    }
}

/// Writes the whole file next to `path` and renames it over, so a crash leaves
/// the old or the new record, never half of one.
fn save_state(path: &std::path::Path, state: &Answered) -> Result<(), StateError> {
    let err = |source| StateError {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let bytes = serde_json::to_vec_pretty(state)
        .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
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
            state_path: None,
            kubelet: None,
            store_wait: STORE_WAIT,
            answered_tx: tokio::sync::watch::channel(0).0,
            mig: None,
            mps: None,
        }
    }

    /// Keeps the answers in `path` and starts from the ones already there, so a
    /// pod answered before an agent restart is still answered after it. An
    /// unreadable file is an error: starting blank could hand a later pod an
    /// earlier pod's GPUs.
    pub fn with_state(mut self, path: PathBuf) -> Result<Self, StateError> {
        self.state = Mutex::new(load_state(&path)?);
        self.state_path = Some(path);
        Ok(self)
    }

    /// Asks the kubelet's PodResources API which pods it knows and which of
    /// their containers hold devices before answering.
    pub fn with_kubelet(mut self, kubelet: Arc<dyn KubeletPods>) -> Self {
        self.kubelet = Some(kubelet);
        self
    }

    /// How long to wait for the pod source to show pods the kubelet knows.
    pub fn with_store_wait(mut self, wait: Duration) -> Self {
        self.store_wait = wait;
        self
    }

    /// Changes after every answered call (accepted or refused).
    pub fn answered(&self) -> tokio::sync::watch::Receiver<u64> {
        self.answered_tx.subscribe()
    }

    /// What the kubelet says, or `None` without a PodResources API or when it
    /// cannot be read (then every pending pod is a candidate).
    async fn kubelet_pods(&self) -> Option<Vec<KubeletPod>> {
        let kubelet = self.kubelet.as_ref()?;
        match kubelet.list().await {
            Ok(pods) => Some(pods),
            Err(e) => {
                tracing::warn!(error = %e, "Allocate: PodResources unavailable; every pending pod is a candidate");
                None
            }
        }
    }

    /// Saves the answers (a failure is logged: the PodResources API still tells
    /// admitted pods apart after a restart).
    fn save(&self, state: &Answered) {
        if let Some(path) = &self.state_path
            && let Err(e) = save_state(path, state)
        {
            tracing::error!(error = %e, "Allocate: answers not saved");
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

    /// The pods on this node and the kubelet's list of what each holds. The
    /// kubelet knows a pod before the watch delivers it: this waits a moment
    /// for the pods it knows and the agent cannot read yet.
    async fn pods_now(&self) -> Result<(Vec<PodInfo>, Option<Vec<KubeletPod>>), AllocateError> {
        let mut pods = self.pods.pods_on_node(&self.node).await?;
        let kubelet = self.kubelet_pods().await;
        if let Some(k) = &kubelet {
            let deadline = tokio::time::Instant::now() + self.store_wait;
            while unknown(k, &pods).next().is_some() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
                pods = self.pods.pods_on_node(&self.node).await?;
            }
        }
        Ok((pods, kubelet))
    }

    /// `GetPreferredAllocation`'s answer when the asking container can be told
    /// (the same rule as `Allocate`): the devices of `available` on the GPUs its
    /// verified decision grants it. `Allocate` hands the decision's GPUs
    /// whatever the kubelet picked, so steering the kubelet to them keeps its
    /// own record (PodResources, which the node report, DCGM's per-pod metrics
    /// and the kubelet's device accounting read) equal to what the container
    /// reaches. `None` when no single container is asking or a granted GPU has
    /// no free device of this resource: the kubelet then picks by topology.
    pub async fn granted_preference(
        &self,
        resource: &Resource,
        size: usize,
        available: &[String],
        view: &NodeView,
    ) -> Option<Vec<String>> {
        let (pods, kubelet) = self.pods_now().await.ok()?;
        let picked = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            pick(&pods, kubelet.as_deref(), &resource.name(), size, &state)
        };
        let Pick::Pod(pod, container) = picked else {
            return None;
        };
        let value = pod.annotations.get(ANNOTATION)?;
        let alloc = Allocation::decode_verified(value, &self.key, &pod.uid, &self.node).ok()?;
        let gpus = alloc.gpus_of(&container)?;
        if gpus.len() != size {
            return None;
        }
        granted_devices(&gpus, available, view)
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
        let (pods, kubelet) = self.pods_now().await?;
        let picked = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            // Forget pods that are gone, so the record does not grow for ever.
            let before = state.answers.len();
            state
                .answers
                .retain(|a| pods.iter().any(|p| p.uid == a.pod_uid));
            if state.answers.len() != before {
                self.save(&state);
            }
            let picked = pick(&pods, kubelet.as_deref(), &resource_name, count, &state);
            if let Pick::Pod(pod, container) = &picked {
                state.answers.push(Answer {
                    pod_uid: pod.uid.clone(),
                    pod: pod.key(),
                    resource: resource_name.clone(),
                    container: container.clone(),
                    device_ids: request.devices_ids.clone(),
                    refused: false,
                });
            }
            picked
        };
        let (pod, container) = match picked {
            Pick::Pod(pod, container) => (pod, container),
            Pick::NoPod => {
                self.answered_tx.send_modify(|n| *n += 1);
                return Err(AllocateError::NoPod {
                    node: self.node.clone(),
                    count,
                    resource: resource_name,
                });
            }
            Pick::Ambiguous(pods) => {
                self.answered_tx.send_modify(|n| *n += 1);
                let e = AllocateError::Ambiguous {
                    node: self.node.clone(),
                    count,
                    resource: resource_name,
                    pods: pods.join(", "),
                };
                tracing::warn!(error = %e, "allocate refused");
                return Err(e);
            }
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
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(a) = state.answers.iter_mut().rev().find(|a| {
                    a.pod_uid == pod.uid && a.resource == resource_name && a.container == container
                }) {
                    a.refused = true;
                }
                tracing::warn!(pod = %pod.key(), container = %container, resource = %resource_name, error = %e, "allocate refused")
            }
        }
        // Saved before the kubelet hears the answer: after a restart the agent
        // must know this call was answered.
        self.save(&self.state.lock().unwrap_or_else(|p| p.into_inner()));
        self.answered_tx.send_modify(|n| *n += 1);
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

/// One device of `available` per granted GPU: the MIG instance a MIG grant
/// names (by its UUID, or by profile and start on its GPU), else a device of
/// the granted GPU itself (its UUID, a time-slicing replica or a
/// `tessera.io/gpu` token of it). `None` when one has none free.
fn granted_devices(
    gpus: &[&tessera_core::allocation::AllocatedGpu],
    available: &[String],
    view: &NodeView,
) -> Option<Vec<String>> {
    let mut chosen: Vec<String> = Vec::with_capacity(gpus.len());
    for g in gpus {
        let gpu = view.grant_gpu(g)?;
        let instance = match &g.mig {
            _ if g.uuid.starts_with("MIG-") => Some(g.uuid.as_str()),
            Some(m) => gpu
                .mig_instances
                .iter()
                .find(|i| i.profile == m.profile && i.start == Some(m.start))
                .map(|i| i.uuid.as_str()),
            None => None,
        };
        let fits = |id: &String| match instance {
            Some(uuid) => super::device_gpu(id) == uuid,
            None => super::device_gpu(id) == gpu.uuid,
        };
        let id = available
            .iter()
            .find(|id| fits(id) && !chosen.contains(id))?;
        chosen.push(id.clone());
    }
    Some(chosen)
}

/// Which pod a call is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pick {
    /// The pod and the container the call belongs to.
    Pod(PodInfo, String),
    /// No pod could be asking.
    NoPod,
    /// More than one could (`namespace/name`, sorted).
    Ambiguous(Vec<String>),
}

/// The pods the kubelet knows that the pod source does not show and that
/// hold no device: one of them may be the pod being admitted.
fn unknown<'a>(
    kubelet: &'a [KubeletPod],
    pods: &'a [PodInfo],
) -> impl Iterator<Item = &'a KubeletPod> {
    kubelet.iter().filter(|k| {
        !k.holds_devices()
            && !pods
                .iter()
                .any(|p| p.namespace == k.namespace && p.name == k.name)
    })
}

/// The pod and container the next call for `count` devices of `resource`
/// belongs to: the next asking container of the one pod that is pending, not
/// refused, known to the kubelet (when `kubelet` says which pods it knows) and
/// not yet through its asking containers, whose next one asks `count`. A pod
/// the kubelet lists part-way through its containers (one of them holds
/// devices) is the one being admitted. The agent's own record of answered
/// containers does not make it so: the kubelet drops a pod between two of its
/// containers without a call when that call cannot reach the plugin (the agent
/// was restarting) or its CPU, memory or topology manager rejects a container,
/// and the next pod's call must not get the dropped pod's next grant. Any other tie,
/// or a pod the kubelet knows and the source does not show, is ambiguous.
fn pick(
    pods: &[PodInfo],
    kubelet: Option<&[KubeletPod]>,
    resource: &str,
    count: usize,
    state: &Answered,
) -> Pick {
    let candidates: Vec<(&PodInfo, &str, bool)> = pods
        .iter()
        .filter(|p| p.phase.is_empty() || p.phase == "Pending")
        .filter(|p| !state.refused(&p.uid))
        .filter_map(|p| {
            // The kubelet's word on which containers hold devices counts as
            // answered, whatever the agent remembers. It calls in its order,
            // so the containers before one that holds devices were answered
            // too: its list leaves out regular init containers.
            let askers = containers::askers(&p.containers, resource);
            let held = match kubelet {
                Some(k) => {
                    let listed = k
                        .iter()
                        .find(|k| k.namespace == p.namespace && k.name == p.name)?;
                    let holding: Vec<&str> = listed.holders(resource).collect();
                    askers
                        .iter()
                        .rposition(|(name, _)| holding.contains(name))
                        .map_or(0, |last| last + 1)
                }
                None => 0,
            };
            let done = state.calls(&p.uid, resource).max(held);
            let (name, asked) = askers.get(done)?;
            (*asked == count as u64).then_some((p, *name, held > 0))
        })
        .collect();
    let started: Vec<_> = candidates.iter().filter(|c| c.2).collect();
    if let [(p, name, _)] = started[..] {
        return Pick::Pod((*p).clone(), name.to_string());
    }
    let mut names: Vec<String> = candidates.iter().map(|c| c.0.key()).collect();
    if let Some(k) = kubelet {
        names.extend(unknown(k, pods).map(|k| format!("{} (not yet seen by the agent)", k.key())));
    }
    match (&candidates[..], names.len()) {
        ([], _) => Pick::NoPod,
        ([(p, name, _)], 1) => Pick::Pod((*p).clone(), name.to_string()),
        _ => {
            names.sort();
            Pick::Ambiguous(names)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podresources::KubeletContainer;

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

    fn one(uid: &str, created: i64, n: &str, phase: &str) -> PodInfo {
        pod(
            uid,
            created,
            phase,
            vec![asking("c", ContainerKind::App, n)],
        )
    }

    fn picked(
        pods: &[PodInfo],
        kubelet: Option<&[KubeletPod]>,
        count: usize,
        state: &Answered,
    ) -> Result<(String, String), Vec<String>> {
        match pick(pods, kubelet, "tessera.io/gpu", count, state) {
            Pick::Pod(p, c) => Ok((p.uid, c)),
            Pick::NoPod => Err(Vec::new()),
            Pick::Ambiguous(names) => Err(names),
        }
    }

    fn answer(state: &mut Answered, uid: &str, refused: bool) {
        state.answers.push(Answer {
            pod_uid: uid.into(),
            pod: format!("ns/{uid}"),
            resource: "tessera.io/gpu".into(),
            container: "c".into(),
            device_ids: vec!["GPU-0::0".into()],
            refused,
        });
    }

    /// A pod as the kubelet's PodResources List shows it; `holding`: the
    /// containers that already hold `tessera.io/gpu` devices.
    fn kubelet_pod(name: &str, holding: &[&str]) -> KubeletPod {
        KubeletPod {
            namespace: "ns".into(),
            name: name.into(),
            containers: holding
                .iter()
                .map(|c| KubeletContainer {
                    name: c.to_string(),
                    devices: vec![("tessera.io/gpu".into(), vec!["GPU-0::1".into()])],
                })
                .collect(),
        }
    }

    #[test]
    fn pick_refuses_to_guess_between_pending_pods() {
        let pods = vec![
            one("new", 20, "1", "Pending"),
            one("old", 10, "1", "Pending"),
            one("running", 1, "1", "Running"),
            one("two", 5, "2", "Pending"),
        ];
        let mut state = Answered::default();
        // Both could be the pod being admitted: the oldest is not taken on trust
        // (it may have been rejected by the kubelet without a call).
        assert_eq!(
            picked(&pods, None, 1, &state),
            Err(vec!["ns/new".to_string(), "ns/old".to_string()])
        );
        assert_eq!(
            picked(&pods, None, 2, &state),
            Ok(("two".into(), "c".into()))
        );
        assert_eq!(picked(&pods, None, 3, &state), Err(vec![]));
        answer(&mut state, "old", false);
        assert_eq!(
            picked(&pods, None, 1, &state),
            Ok(("new".into(), "c".into()))
        );
        // A refused pod is out: the kubelet failed its admission.
        let mut state = Answered::default();
        answer(&mut state, "new", true);
        assert_eq!(
            picked(&pods, None, 1, &state),
            Ok(("old".into(), "c".into()))
        );
    }

    #[test]
    fn pick_takes_the_kubelets_word_on_which_pods_it_admits() {
        let pods = vec![
            one("admitted", 1, "1", "Pending"),
            one("admitting", 2, "1", "Pending"),
            one("not-reached", 3, "1", "Pending"),
        ];
        let state = Answered::default();
        // The kubelet knows `admitted` (its container holds devices, though the
        // agent remembers no answer: it restarted) and `admitting`; it has not
        // reached `not-reached`.
        let kubelet = vec![
            kubelet_pod("admitted", &["c"]),
            kubelet_pod("admitting", &[]),
        ];
        assert_eq!(
            picked(&pods, Some(&kubelet), 1, &state),
            Ok(("admitting".into(), "c".into()))
        );
        // A pod the kubelet knows that the agent cannot read (not yet in its
        // watch, e.g. one created with spec.nodeName preset) may be the one:
        // no guess.
        let kubelet = vec![kubelet_pod("admitting", &[]), kubelet_pod("preset", &[])];
        assert_eq!(
            picked(&pods, Some(&kubelet), 1, &state),
            Err(vec![
                "ns/admitting".to_string(),
                "ns/preset (not yet seen by the agent)".to_string()
            ])
        );
        // Only the unknown one: no readable pod is asking.
        let kubelet = vec![kubelet_pod("preset", &[])];
        assert_eq!(picked(&pods, Some(&kubelet), 1, &state), Err(vec![]));
    }

    #[test]
    fn pick_follows_the_kubelet_through_a_pods_containers() {
        // Init `load` (2 GPUs), sidecar `proxy`, apps `a`, `cpu-only` and `b`.
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
        let pods = vec![multi];
        let mut state = Answered::default();
        // The kubelet starts on `multi` with its init container's 2 devices.
        assert_eq!(
            picked(&pods, None, 2, &state),
            Ok(("multi".into(), "load".into()))
        );
        answer(&mut state, "multi", false);
        // An older pod is pending too. The agent's record of `load` does not
        // say the kubelet is still on `multi`: it may have dropped `multi` (its
        // call for `proxy` could not reach the agent) and be admitting `older`.
        let mut pods = pods;
        pods.push(one("older", 10, "1", "Pending"));
        let both = Err(vec!["ns/multi".to_string(), "ns/older".to_string()]);
        assert_eq!(picked(&pods, None, 1, &state), both);
        // A kubelet that lists the pods it rejected lists both, and nothing of
        // `multi` holds devices (init containers are not listed): no guess.
        let listed = vec![kubelet_pod("multi", &[]), kubelet_pod("older", &[])];
        assert_eq!(picked(&pods, Some(&listed), 1, &state), both);
        // It lists `multi` only: the kubelet has not reached `older`.
        let listed = vec![kubelet_pod("multi", &[])];
        assert_eq!(
            picked(&pods, Some(&listed), 1, &state),
            Ok(("multi".into(), "proxy".into()))
        );
        answer(&mut state, "multi", false);
        // Once a container of `multi` holds devices, the kubelet is part-way
        // through it: its next calls are its own, in order.
        for (holding, next) in [(&["proxy"][..], "a"), (&["proxy", "a"][..], "b")] {
            let listed = vec![kubelet_pod("multi", holding), kubelet_pod("older", &[])];
            assert_eq!(
                picked(&pods, Some(&listed), 1, &state),
                Ok(("multi".into(), next.into()))
            );
            answer(&mut state, "multi", false);
        }
        let listed = vec![
            kubelet_pod("multi", &["proxy", "a", "b"]),
            kubelet_pod("older", &[]),
        ];
        assert_eq!(
            picked(&pods, Some(&listed), 1, &state),
            Ok(("older".into(), "c".into()))
        );
    }

    #[test]
    fn pick_counts_the_init_containers_the_kubelet_does_not_list() {
        // `load` (init) and `main` (app) ask one device each. The kubelet's
        // list shows `main` holding its device, not `load`; the agent has no
        // record (it restarted without its state file).
        let admitted = pod(
            "admitted",
            1,
            "Pending",
            vec![
                asking("load", ContainerKind::Init, "1"),
                asking("main", ContainerKind::App, "1"),
            ],
        );
        let pods = vec![admitted, one("next", 2, "1", "Pending")];
        let listed = vec![kubelet_pod("admitted", &["main"]), kubelet_pod("next", &[])];
        // `admitted` is through both: the call is `next`'s.
        assert_eq!(
            picked(&pods, Some(&listed), 1, &Answered::default()),
            Ok(("next".into(), "c".into()))
        );
    }

    #[test]
    fn answers_survive_in_the_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/allocate.json");
        let mut state = Answered::default();
        answer(&mut state, "a", false);
        answer(&mut state, "b", true);
        save_state(&path, &state).unwrap();
        assert_eq!(load_state(&path).unwrap(), state);
        // No file yet: nothing answered. A damaged file is an error, not a blank.
        assert_eq!(
            load_state(&dir.path().join("none.json")).unwrap(),
            Answered::default()
        );
        std::fs::write(&path, b"{ not json").unwrap();
        let e = load_state(&path).unwrap_err().to_string();
        assert!(e.contains("allocate.json"), "{e}");
    }
}
