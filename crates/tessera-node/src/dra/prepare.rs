//! `NodePrepareResources` for real: read the claim, find the devices this
//! driver was allocated on this node, and write a CDI spec for exactly those
//! (protocols.md §3.5, §3.11).
//!
//! For each claim the kubelet names, the claim is read from the API server
//! ([`ClaimSource`], a trait so tests give a fake). Its UID must be the one the
//! kubelet sent (a claim deleted and recreated under the same name is another
//! claim). Every result of `status.allocation.devices.results` with driver
//! `gpu.tessera.io` must name this node's pool and a device the node has and
//! that is healthy; anything else fails the claim, with the reason, and writes
//! nothing.
//!
//! The CDI spec `<cdi dir>/gpu.tessera.io-claim_<uid>.json` has kind
//! `gpu.tessera.io/claim` and one device `<uid>-<device>` per allocated
//! device, carrying the claim's environment (`NVIDIA_VISIBLE_DEVICES=void`, as
//! the device plugin's `cdi-cri` strategy sets, the isolation and, for a share,
//! its limits). The GPU itself comes from NVIDIA's node CDI spec, named by UUID
//! as the `cdi-cri` strategy names it (`nvidia.com/gpu=<GPU- or MIG-UUID>`), so
//! each prepared device answers both names. Unprepare removes the file.
//! Both are idempotent; the file is written whole (temporary file, rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use super::DRIVER_NAME;
use super::service::{ClaimPreparer, ClaimRef, PreparedDevice};
use super::slice::{gpu_device_name, mig_device_name};
use crate::backend::GpuInfo;
use crate::deviceplugin::NodeView;
use crate::deviceplugin::handover::CDI_KIND;

/// The CDI kind of the per-claim specs.
pub const CDI_CLAIM_KIND: &str = "gpu.tessera.io/claim";
/// The CDI spec version written.
pub const CDI_VERSION: &str = "0.6.0";

/// The parts of a `ResourceClaim` the driver reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    pub metadata: ClaimMeta,
    #[serde(default)]
    pub status: ClaimStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimStatus {
    #[serde(default)]
    pub allocation: Option<Allocation>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Allocation {
    #[serde(default)]
    pub devices: DeviceAllocation,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeviceAllocation {
    #[serde(default)]
    pub results: Vec<AllocationResult>,
}

/// `DeviceRequestAllocationResult`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationResult {
    #[serde(default)]
    pub request: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub device: String,
    #[serde(default, rename = "shareID")]
    pub share_id: Option<String>,
    /// Quantities by capacity name.
    #[serde(default)]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// Reads claims from the API server (or a fake).
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String>;
}

/// A physical GPU, or one MIG instance of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub gpu_uuid: String,
    pub mig_uuid: Option<String>,
}

impl Target {
    /// The UUID NVIDIA's CDI spec names the device by.
    pub fn uuid(&self) -> &str {
        self.mig_uuid.as_deref().unwrap_or(&self.gpu_uuid)
    }
}

/// The device of the node's pool named `name` (as [`super::slice`] names them).
pub fn find_device(gpus: &[GpuInfo], name: &str) -> Option<Target> {
    for gpu in gpus {
        if !gpu.mig_enabled && gpu_device_name(gpu) == name {
            return Some(Target {
                gpu_uuid: gpu.uuid.clone(),
                mig_uuid: None,
            });
        }
        for (k, m) in gpu.mig_instances.iter().enumerate() {
            let place = m.start.map_or_else(|| format!("i{k}"), |s| s.to_string());
            if mig_device_name(gpu, &m.profile, &place) == name {
                return Some(Target {
                    gpu_uuid: gpu.uuid.clone(),
                    mig_uuid: Some(m.uuid.clone()),
                });
            }
        }
    }
    None
}

/// A quantity of bytes (`10Gi`, `512Mi`, `1G`, `1073741824`) in MiB, rounded up.
pub fn quantity_mib(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: u128 = num.parse().ok()?;
    let bytes = n.checked_mul(match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    })?;
    u64::try_from(bytes.div_ceil(1 << 20)).ok()
}

/// A UID the kubelet sent, safe as part of a file name.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Prepares claims from the node's inventory and writes CDI specs.
pub struct Preparer {
    source: Arc<dyn ClaimSource>,
    view: watch::Receiver<NodeView>,
    /// The pool name: the node's name.
    node: String,
    cdi_dir: PathBuf,
}

impl Preparer {
    pub fn new(
        source: Arc<dyn ClaimSource>,
        view: watch::Receiver<NodeView>,
        node: String,
        cdi_dir: PathBuf,
    ) -> Self {
        Preparer {
            source,
            view,
            node,
            cdi_dir,
        }
    }

    /// `<cdi dir>/gpu.tessera.io-claim_<uid>.json`.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(format!("{DRIVER_NAME}-claim_{uid}.json"))
    }

    /// The CDI spec and the answer for a claim, or why it cannot be prepared. Pure.
    fn plan(
        &self,
        claim: &ClaimRef,
        rc: &ResourceClaim,
        view: &NodeView,
    ) -> Result<(serde_json::Value, Vec<PreparedDevice>), String> {
        let who = format!("claim {}/{}", claim.namespace, claim.name);
        if rc.metadata.uid != claim.uid {
            return Err(format!(
                "{who} has UID {:?}, not {:?} as the kubelet asked (recreated?)",
                rc.metadata.uid, claim.uid
            ));
        }
        let alloc = rc
            .status
            .allocation
            .as_ref()
            .ok_or_else(|| format!("{who} is not allocated"))?;
        let mine: Vec<&AllocationResult> = alloc
            .devices
            .results
            .iter()
            .filter(|r| r.driver == DRIVER_NAME)
            .collect();
        let mut devices = Vec::new();
        let mut answer = Vec::new();
        let mut limits = Vec::new();
        let mut memory = Vec::new();
        let mut shared = false;
        for (i, r) in mine.iter().enumerate() {
            if r.pool != self.node {
                return Err(format!(
                    "{who}: device {}/{} is in pool {:?}, not this node's ({:?})",
                    r.pool, r.device, r.pool, self.node
                ));
            }
            let target = find_device(&view.gpus, &r.device)
                .ok_or_else(|| format!("{who}: this node has no device {:?}", r.device))?;
            if !view.is_healthy(&target.gpu_uuid) {
                return Err(format!(
                    "{who}: device {} (GPU {}) is unhealthy",
                    r.device, target.gpu_uuid
                ));
            }
            // The memory of what the container gets: the MIG instance's, or the GPU's.
            let gpu_memory = view
                .gpu(&target.gpu_uuid)
                .map_or(0, |g| match &target.mig_uuid {
                    Some(m) => g
                        .mig_instances
                        .iter()
                        .find(|i| &i.uuid == m)
                        .map_or(0, |i| i.memory_mib),
                    None => g.memory_mib,
                });
            if r.share_id.is_some() {
                shared = true;
                let mem = match r.consumed_capacity.get("memory") {
                    Some(q) => quantity_mib(q).ok_or_else(|| {
                        format!("{who}: device {}: memory {q:?} is not a quantity", r.device)
                    })?,
                    None => gpu_memory,
                };
                let compute: u32 = match r.consumed_capacity.get("compute") {
                    Some(q) => q
                        .parse::<u32>()
                        .ok()
                        .filter(|c| (1..=1000).contains(c))
                        .ok_or_else(|| {
                            format!(
                                "{who}: device {}: compute {q:?} is not a per-mille in 1..=1000",
                                r.device
                            )
                        })?,
                    None => 1000,
                };
                limits.push((i, mem, compute));
                memory.push(mem.to_string());
            } else {
                memory.push(gpu_memory.to_string());
            }
            let cdi_name = format!("{}-{}", claim.uid, r.device);
            devices.push(json!({
                "name": cdi_name,
                "containerEdits": {
                    "env": [format!("TESSERA_DRA_DEVICE_{i}={}", target.uuid())]
                }
            }));
            answer.push(PreparedDevice {
                request_names: vec![r.request.clone()],
                pool_name: r.pool.clone(),
                device_name: r.device.clone(),
                cdi_device_ids: vec![
                    format!("{CDI_CLAIM_KIND}={cdi_name}"),
                    format!("{CDI_KIND}={}", target.uuid()),
                ],
                share_id: r.share_id.clone(),
            });
        }
        let mut env = vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()];
        if shared {
            // The share's limits, numbered as the client sees its devices.
            let pct = limits
                .iter()
                .map(|(_, _, c)| c.div_ceil(10).clamp(1, 100))
                .max()
                .unwrap_or(100);
            let mem: Vec<String> = limits.iter().map(|(i, m, _)| format!("{i}={m}M")).collect();
            env.push("TESSERA_ISOLATION=mps".into());
            env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}"));
            env.push(format!(
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={}",
                mem.join(",")
            ));
        } else {
            env.push("TESSERA_ISOLATION=exclusive".into());
        }
        env.push(format!("TESSERA_GPU_MEMORY_MIB={}", memory.join(",")));
        let spec = json!({
            "cdiVersion": CDI_VERSION,
            "kind": CDI_CLAIM_KIND,
            "containerEdits": {"env": env},
            "devices": devices,
        });
        Ok((spec, answer))
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[tonic::async_trait]
impl ClaimPreparer for Preparer {
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        if !valid_uid(&claim.uid) {
            return Err(format!("claim UID {:?} is not a Kubernetes UID", claim.uid));
        }
        let rc = self.source.get(&claim.namespace, &claim.name).await?;
        let view = self.view.borrow().clone();
        let (spec, answer) = self.plan(claim, &rc, &view)?;
        let path = self.spec_path(&claim.uid);
        let bytes = serde_json::to_vec_pretty(&spec).map_err(|e| e.to_string())?;
        write_atomic(&path, &bytes)
            .map_err(|e| format!("cannot write CDI spec {}: {e}", path.display()))?;
        Ok(answer)
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        if !valid_uid(&claim.uid) {
            return Err(format!("claim UID {:?} is not a Kubernetes UID", claim.uid));
        }
        let path = self.spec_path(&claim.uid);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("cannot remove CDI spec {}: {e}", path.display())),
        }
    }
}
