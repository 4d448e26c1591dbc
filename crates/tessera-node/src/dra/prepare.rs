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
//!
//! Before the spec is written, prepare sets up what the devices need: the MIG
//! instance of an allocated partitionable placement that does not exist yet
//! ([`super::mig`]; destroyed at unprepare once no claim uses it), and for a
//! share the MPS daemon and the client's limits and mounts as device edits
//! ([`super::share`]). What it set up for which claim is recorded
//! ([`super::records`]); a prepare that fails part-way undoes what it did, so
//! a failed claim leaves no instance behind.
//!
//! Unprepare is [`Preparer::release`]; the sweep of claims whose unprepare
//! never comes ([`super::sweep`]) calls that same function.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tessera_core::quantity::Quantity;
use tokio::sync::watch;

use super::DRIVER_NAME;
use super::mig::MigCreator;
use super::occupancy;
use super::plan::{Want, cdi_spec, resolve, share_gpus};
use super::records::{self, Disposal, PreparedClaim, Records};
use super::service::{ClaimPreparer, ClaimRef, PreparedDevice};
use super::share::ShareMps;
use super::slice::{SliceOptions, gpu_device_name, mig_device_name};
use crate::backend::GpuInfo;
use crate::deviceplugin::NodeView;

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

/// Why a claim could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The API server answered that no claim of that name exists: a 404 for
    /// the object itself, not for a path or version it does not serve.
    #[error("resourceclaim {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    /// Anything else (unreachable, refused, timed out, not understood): it
    /// says nothing about whether the claim exists.
    #[error("{0}")]
    Unreadable(String),
}

/// Reads claims from the API server (or a fake).
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError>;
}

/// What [`Preparer::release`] freed, for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// The claim was recorded as prepared.
    pub recorded: bool,
    /// Its CDI spec was there and is removed.
    pub spec: bool,
    /// The MIG instances destroyed (UUIDs): those no other prepared claim uses.
    pub instances: Vec<String>,
    /// The GPUs whose MPS daemon it no longer holds.
    pub mps: Option<Vec<String>>,
}

impl Released {
    /// Nothing was there to release (unprepared already, or never prepared).
    pub fn is_nothing(&self) -> bool {
        !self.recorded && !self.spec && self.instances.is_empty() && self.mps.is_none()
    }
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

/// A quantity of bytes (`10Gi`, `512Mi`, `1G`, `1073741824`) in MiB, rounded up,
/// as the API server serializes quantities ([`Quantity`]); none if negative or
/// not a quantity.
pub fn quantity_mib(q: &str) -> Option<u64> {
    let bytes = Quantity::parse(q).ok()?.ceil_units();
    u64::try_from(bytes).ok().map(|b| b.div_ceil(1 << 20))
}

/// A count (`300`, and `1k` as the API server writes 1000), rounded up; none if
/// negative or not a quantity. A share's `compute` per-mille comes back from
/// the server this way: a whole GPU's `1000` is stored as `1k`.
pub fn quantity_count(q: &str) -> Option<u64> {
    u64::try_from(Quantity::parse(q).ok()?.ceil_units()).ok()
}

/// A UID the kubelet sent, safe as part of a file name.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Prepares claims from the node's inventory and writes CDI specs; creates the
/// MIG instances of allocated placements and runs the MPS daemons of shares.
pub struct Preparer {
    source: Arc<dyn ClaimSource>,
    view: watch::Receiver<NodeView>,
    /// The pool name: the node's name.
    node: String,
    cdi_dir: PathBuf,
    /// What the slices publish (which placements exist to be created).
    options: SliceOptions,
    /// Creates placements' instances (none: a placement without an instance is
    /// "no device", as before the driver could create them).
    mig: Option<MigCreator>,
    mps: ShareMps,
    /// What was set up for which claim; the lock also makes prepare and
    /// unprepare one at a time, so two claims never race for one placement.
    records: tokio::sync::Mutex<Records>,
    /// Where the records are kept across restarts (none: memory only).
    state: Option<PathBuf>,
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
            options: SliceOptions::default(),
            mig: None,
            mps: ShareMps::default(),
            records: tokio::sync::Mutex::new(Records::default()),
            state: None,
        }
    }

    /// The slices' options: with `partitionable_mig`, placements are prepared.
    pub fn with_options(mut self, options: SliceOptions) -> Self {
        self.options = options;
        self
    }

    /// Lets prepare create (and unprepare destroy) placements' MIG instances.
    pub fn with_mig(mut self, mig: MigCreator) -> Self {
        self.mig = Some(mig);
        self
    }

    /// How shares reach their MPS daemon.
    pub fn with_mps(mut self, mps: ShareMps) -> Self {
        self.mps = mps;
        self
    }

    /// Keeps the records in `path` and takes over what an earlier run left there.
    /// An unreadable file is logged and replaced (as the device-plugin planner's):
    /// its instances are then never destroyed, which leaks rather than destroys.
    pub fn with_state(mut self, path: PathBuf) -> Self {
        let records = records::load(&path).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "starting without the DRA state file");
            Records::default()
        });
        if !records.instances.is_empty() || !records.mps.is_empty() || !records.claims.is_empty() {
            tracing::info!(instances = records.instances.len(), mps_claims = records.mps.len(), claims = records.claims.len(), path = %path.display(), "took over what the driver set up before a restart");
        }
        self.records = tokio::sync::Mutex::new(records);
        self.state = Some(path);
        self
    }

    /// `<cdi dir>/gpu.tessera.io-claim_<uid>.json`.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(format!("{DRIVER_NAME}-claim_{uid}.json"))
    }

    /// This node's name (the pool's).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Where claims are read.
    pub fn claim_source(&self) -> Arc<dyn ClaimSource> {
        self.source.clone()
    }

    /// A copy of the records as they are now.
    pub async fn records(&self) -> Records {
        self.records.lock().await.clone()
    }

    /// One MPS supervision pass over the daemons prepared claims use.
    pub async fn supervise_mps(&self) {
        let held = self.records.lock().await.mps_sets();
        self.mps.supervise(held).await;
    }

    fn save(&self, records: &Records) -> Result<(), String> {
        match &self.state {
            Some(path) => records::save(path, records).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Creates what the claim lacks, starts its MPS daemon and writes its CDI
    /// spec. The MIG instances created are added to `made` as they are, so a
    /// failure can undo them.
    async fn set_up(
        &self,
        claim: &ClaimRef,
        rc: &ResourceClaim,
        records: &mut Records,
        made: &mut Vec<String>,
    ) -> Result<Vec<PreparedDevice>, String> {
        let who = format!("claim {}/{}", claim.namespace, claim.name);
        let mut view = self.view.borrow().clone();
        let wants = resolve(claim, rc, &view, &self.node, self.options)?;
        // Before anything is set up: no device beyond what it allows.
        let holds = occupancy::holds(&wants, &view).map_err(|e| format!("{who}: {e}"))?;
        occupancy::check(records, &claim.uid, &holds, &view).map_err(|e| format!("{who}: {e}"))?;
        for (r, want) in &wants {
            let Want::Create(p) = want else { continue };
            let place = format!(
                "MIG instance {} at memory slice {} of GPU {}",
                p.profile, p.start, p.gpu_uuid
            );
            let Some(mig) = &self.mig else {
                return Err(format!(
                    "{who}: device {}: {place} does not exist, and this driver does not create MIG instances",
                    r.device
                ));
            };
            let gpu = view
                .gpu(&p.gpu_uuid)
                .cloned()
                .ok_or_else(|| format!("{who}: device {}: no GPU {}", r.device, p.gpu_uuid))?;
            let created = mig
                .create(gpu, p.clone())
                .await
                .map_err(|e| format!("{who}: device {}: cannot create {place}: {e}", r.device))?;
            if let Some(inst) = created {
                tracing::info!(claim = %claim.uid, device = %r.device, uuid = %inst.uuid, "created MIG instance for claim");
                records.created(&inst.uuid, &p.gpu_uuid, &p.profile, p.start, &claim.uid);
                made.push(inst.uuid);
                self.save(records).map_err(|e| format!("{who}: {e}"))?;
            }
        }
        if let Some(mig) = wants
            .iter()
            .any(|(_, w)| matches!(w, Want::Create(_)))
            .then_some(self.mig.as_ref())
            .flatten()
        {
            view = mig.refresh().await.map_err(|e| {
                format!("{who}: cannot read the GPUs after creating MIG instances: {e}")
            })?;
        }
        let mut devices = Vec::with_capacity(wants.len());
        for (r, _) in &wants {
            let target = find_device(&view.gpus, &r.device).ok_or_else(|| {
                format!(
                    "{who}: device {:?} is not there after creating it",
                    r.device
                )
            })?;
            if let Some(m) = &target.mig_uuid {
                records.hold(m, &claim.uid);
            }
            devices.push((*r, target));
        }
        let gpus = share_gpus(&devices);
        if !gpus.is_empty() {
            self.mps
                .ensure(gpus.clone())
                .await
                .map_err(|e| format!("{who}: MPS for {}: {e}", gpus.join(",")))?;
            records.mps.insert(claim.uid.clone(), gpus);
        }
        records.claims.insert(
            claim.uid.clone(),
            PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                devices: devices.iter().map(|(r, _)| r.device.clone()).collect(),
                holds,
            },
        );
        self.save(records).map_err(|e| format!("{who}: {e}"))?;
        let (spec, answer) = cdi_spec(claim, &devices, &view, &self.mps)?;
        let path = self.spec_path(&claim.uid);
        let bytes = serde_json::to_vec_pretty(&spec).map_err(|e| e.to_string())?;
        write_atomic(&path, &bytes)
            .map_err(|e| format!("cannot write CDI spec {}: {e}", path.display()))?;
        Ok(answer)
    }

    /// Undoes a failed prepare: destroys the instances it created and forgets
    /// its MPS use and the claim unless an earlier prepare of it had recorded them.
    async fn roll_back(
        &self,
        claim: &ClaimRef,
        made: &[String],
        before: Before,
        records: &mut Records,
    ) {
        if let Some(mig) = &self.mig {
            for uuid in made {
                let Some(owned) = records.instances.iter().find(|i| &i.uuid == uuid).cloned()
                else {
                    continue;
                };
                match mig.destroy(&owned).await {
                    Ok(()) => records.forget(uuid),
                    // Kept in the records: unprepare (the kubelet's cleanup) tries again.
                    Err(e) => {
                        tracing::error!(claim = %claim.uid, uuid = %uuid, error = %e, "cannot destroy the MIG instance of a failed prepare")
                    }
                }
            }
            if !made.is_empty()
                && let Err(e) = mig.refresh().await
            {
                tracing::warn!(error = %e, "cannot read the GPUs after a failed prepare");
            }
        }
        match before.mps {
            Some(set) => {
                records.mps.insert(claim.uid.clone(), set);
            }
            None => {
                records.mps.remove(&claim.uid);
            }
        }
        match before.claim {
            Some(c) => {
                records.claims.insert(claim.uid.clone(), c);
            }
            None => {
                records.claims.remove(&claim.uid);
            }
        }
        if let Err(e) = self.save(records) {
            tracing::warn!(error = %e, "after a failed prepare");
        }
    }

    /// Destroys the instances only `claim` used (unprepare): returns those
    /// destroyed and the errors. What could not be destroyed stays recorded and
    /// is tried again.
    async fn release_instances(
        &self,
        claim: &ClaimRef,
        records: &mut Records,
    ) -> (Vec<String>, Vec<String>) {
        let last = records.release(&claim.uid);
        let Some(mig) = self.mig.as_ref().filter(|_| !last.is_empty()) else {
            return (Vec::new(), Vec::new());
        };
        let gpus = match mig.discover().await {
            Ok(g) => g,
            Err(e) => {
                return (
                    Vec::new(),
                    vec![format!(
                        "cannot list the GPUs to destroy the MIG instances of claim {}/{}: {e}",
                        claim.namespace, claim.name
                    )],
                );
            }
        };
        let mut destroyed = Vec::new();
        let mut errors = Vec::new();
        for owned in &last {
            match records::disposal(owned, &gpus) {
                Disposal::Destroy => match mig.destroy(owned).await {
                    Ok(()) => {
                        tracing::info!(claim = %claim.uid, uuid = %owned.uuid, "destroyed the claim's MIG instance");
                        records.forget(&owned.uuid);
                        destroyed.push(owned.uuid.clone());
                    }
                    Err(e) => errors.push(format!(
                        "cannot destroy MIG instance {} of GPU {}: {e}",
                        owned.uuid, owned.gpu
                    )),
                },
                Disposal::Gone => records.forget(&owned.uuid),
                Disposal::Unknown => errors.push(format!(
                    "GPU {} of MIG instance {} is not listed; the instance is kept",
                    owned.gpu, owned.uuid
                )),
            }
        }
        if let Err(e) = mig.refresh().await {
            errors.push(format!("cannot read the GPUs after destroying: {e}"));
        }
        (destroyed, errors)
    }

    /// `NodeUnprepareResources` of one claim: removes its CDI spec, destroys the
    /// MIG instances no other prepared claim uses (as [`records::disposal`]
    /// allows), drops its hold on an MPS daemon and forgets it. Idempotent:
    /// releasing a claim released before frees nothing and succeeds. The claim
    /// stays recorded while anything of it could not be undone, so a repeat
    /// (the kubelet's, or the next sweep's) tries again.
    pub async fn release(&self, claim: &ClaimRef) -> Result<Released, String> {
        if !valid_uid(&claim.uid) {
            return Err(format!("claim UID {:?} is not a Kubernetes UID", claim.uid));
        }
        let mut records = self.records.lock().await;
        let path = self.spec_path(&claim.uid);
        let spec = match std::fs::remove_file(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(format!("cannot remove CDI spec {}: {e}", path.display())),
        };
        let (instances, mut errors) = self.release_instances(claim, &mut records).await;
        let mps = records.mps.remove(&claim.uid);
        let recorded = if errors.is_empty() {
            records.claims.remove(&claim.uid).is_some()
        } else {
            records.claims.contains_key(&claim.uid)
        };
        if let Err(e) = self.save(&records) {
            errors.push(e);
        }
        drop(records);
        if mps.is_some() {
            self.supervise_mps().await;
        }
        if errors.is_empty() {
            Ok(Released {
                recorded,
                spec,
                instances,
                mps,
            })
        } else {
            Err(errors.join("; "))
        }
    }
}

/// What a claim had recorded before a prepare, restored if the prepare fails.
struct Before {
    mps: Option<Vec<String>>,
    claim: Option<PreparedClaim>,
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
        let rc = self
            .source
            .get(&claim.namespace, &claim.name)
            .await
            .map_err(|e| e.to_string())?;
        let mut records = self.records.lock().await;
        let before = Before {
            mps: records.mps.get(&claim.uid).cloned(),
            claim: records.claims.get(&claim.uid).cloned(),
        };
        let mut made = Vec::new();
        match self.set_up(claim, &rc, &mut records, &mut made).await {
            Ok(answer) => Ok(answer),
            Err(e) => {
                self.roll_back(claim, &made, before, &mut records).await;
                drop(records);
                // A daemon started for this claim alone is stopped again.
                self.supervise_mps().await;
                Err(e)
            }
        }
    }

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        self.release(claim).await.map(|_| ())
    }
}
