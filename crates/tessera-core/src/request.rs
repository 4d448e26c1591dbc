//! What one pod asks for, and the parser that turns Kubernetes-style resource
//! maps and annotations (plain strings) into a typed [`Request`].
//!
//! Every error names the offending field and value, so the scheduler can put it
//! in an event and the webhook in its denial verbatim.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::{Catalog, ModelSet};

/// Resource: GPUs per pod (whole GPUs unless a share is also asked for).
pub const RES_GPU: &str = "tessera.io/gpu";
/// Resource: GPU memory per GPU, in MiB (or a quantity such as `20Gi`).
pub const RES_GPU_MEMORY: &str = "tessera.io/gpu-memory";
/// Resource: GPU memory per GPU, in per cent of the GPU's memory.
pub const RES_GPU_MEMORY_PERCENT: &str = "tessera.io/gpu-memory-percent";
/// Resource: compute per GPU, in per cent of the GPU's SMs.
pub const RES_GPU_CORES: &str = "tessera.io/gpu-cores";
/// Resource: a share of each GPU (memory and compute alike) in per-mille, as the openb trace writes it.
pub const RES_GPU_MILLI: &str = "tessera.io/gpu-milli";
/// Resource prefix for MIG instances: `tessera.io/mig-1g.10gb`.
pub const RES_MIG_PREFIX: &str = "tessera.io/mig-";
/// The stock device plugin's whole-GPU resource.
pub const RES_NVIDIA_GPU: &str = "nvidia.com/gpu";
/// The stock device plugin's MIG resources (`mixed` strategy): `nvidia.com/mig-1g.10gb`.
pub const RES_NVIDIA_MIG_PREFIX: &str = "nvidia.com/mig-";
/// Annotation: allowed GPU models joined with `|`.
pub const ANN_GPU_MODEL: &str = "tessera.io/gpu-model";
/// Annotation: GPU UUIDs the pod is pinned to, comma separated.
pub const ANN_GPU_UUIDS: &str = "tessera.io/gpu-uuids";
/// Annotation: isolation mode.
pub const ANN_ISOLATION: &str = "tessera.io/isolation";
/// Annotation: topology wishes, comma separated (`nvlink-required`, `nvlink-preferred`, `numa-preferred`).
pub const ANN_TOPOLOGY: &str = "tessera.io/topology";
/// Annotation: `false` allows a pod to mix GPU architectures (default `true`: one generation).
pub const ANN_SINGLE_ARCH: &str = "tessera.io/single-architecture";

/// How a pod's GPUs are shared with others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// Whole GPUs, nobody else on them.
    #[default]
    Exclusive,
    /// A share enforced by CUDA MPS (thread percentage and pinned memory limit).
    Mps,
    /// A share by time slicing (memory is the only guarantee).
    TimeSlice,
    /// A MIG instance: hardware partition.
    Mig,
}

impl Isolation {
    pub fn name(self) -> &'static str {
        match self {
            Isolation::Exclusive => "exclusive",
            Isolation::Mps => "mps",
            Isolation::TimeSlice => "time-slice",
            Isolation::Mig => "mig",
        }
    }
}

/// How strongly a GPU share must be isolated when the pod leaves the mechanism to
/// the scheduler (`tessera.io/isolation: hard | soft | any`).
///
/// The request's [`Isolation`] stays the mechanism the pod would get on a plain
/// GPU, so every reader of it keeps working; the scheduler chooses the actual
/// mechanism per GPU ([`crate::fit::mig_layout::choose`]) and the grant records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationLevel {
    /// Hardware isolation: a MIG instance (the smallest profile whose memory and
    /// compute cover the share) or a whole GPU.
    Hard,
    /// Software isolation: MPS with per-client limits, or time slicing.
    Soft,
    /// Whichever the scheduler finds leaves the cluster less fragmented.
    Any,
}

impl IsolationLevel {
    pub fn name(self) -> &'static str {
        match self {
            IsolationLevel::Hard => "hard",
            IsolationLevel::Soft => "soft",
            IsolationLevel::Any => "any",
        }
    }
}

/// Memory asked of each GPU in a shared request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GpuMemory {
    /// An absolute amount.
    Mib(u64),
    /// A fraction of whatever GPU the pod lands on, in per-mille.
    PerMille(u32),
}

impl GpuMemory {
    /// The MiB this asks of a GPU with `total_mib` of memory. Rounds down, so shares that
    /// add up to 1000 per-mille never add up to more than the GPU has.
    pub fn resolve(self, total_mib: u64) -> u64 {
        match self {
            GpuMemory::Mib(m) => m,
            GpuMemory::PerMille(p) => total_mib * u64::from(p) / 1000,
        }
    }
}

/// What a pod asks of GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum GpuAsk {
    /// A CPU-only pod.
    #[default]
    None,
    /// `count` whole GPUs.
    Whole { count: u32 },
    /// `count` GPUs, each shared: this much memory and compute of each.
    Shared {
        count: u32,
        memory: GpuMemory,
        cores_milli: u32,
    },
    /// One MIG instance of this profile.
    Mig { profile: String },
}

impl GpuAsk {
    /// GPUs the pod touches.
    pub fn gpu_count(&self) -> u32 {
        match self {
            GpuAsk::None => 0,
            GpuAsk::Whole { count } | GpuAsk::Shared { count, .. } => *count,
            GpuAsk::Mig { .. } => 1,
        }
    }
    /// Per-mille of each GPU the pod takes (1000 for whole GPUs; MIG counts as 0 here).
    pub fn milli_per_gpu(&self) -> u32 {
        match self {
            GpuAsk::Whole { .. } => 1000,
            GpuAsk::Shared { cores_milli, .. } => *cores_milli,
            GpuAsk::None | GpuAsk::Mig { .. } => 0,
        }
    }
    /// Total GPU demand in milli-GPU.
    pub fn total_milli(&self) -> u64 {
        u64::from(self.gpu_count()) * u64::from(self.milli_per_gpu())
    }
}

/// Whether a topology wish must hold or only scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Wish {
    #[default]
    Off,
    Preferred,
    Required,
}

/// Constraints beyond amounts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Constraints {
    /// Allowed GPU models (canonical names); empty means any.
    #[serde(default)]
    pub models: Vec<String>,
    /// The same set as a bitmask over the catalog it was parsed against.
    #[serde(skip, default = "all_models")]
    pub model_set: ModelSet,
    /// All GPUs of one architecture.
    #[serde(default = "yes")]
    pub single_architecture: bool,
    /// All GPUs pairwise NVLink-connected.
    #[serde(default)]
    pub nvlink: Wish,
    /// All GPUs on one NUMA node (a preference only).
    #[serde(default)]
    pub same_numa: bool,
    /// GPU UUIDs the pod must use.
    #[serde(default)]
    pub pinned_uuids: Vec<String>,
}

fn all_models() -> ModelSet {
    ModelSet::ALL
}
fn yes() -> bool {
    true
}

impl Default for Constraints {
    fn default() -> Self {
        Constraints {
            models: Vec::new(),
            model_set: ModelSet::ALL,
            single_architecture: true,
            nvlink: Wish::Off,
            same_numa: false,
            pinned_uuids: Vec::new(),
        }
    }
}

/// What one pod asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: GpuAsk,
    pub constraints: Constraints,
    pub isolation: Isolation,
    /// Set when the pod asked for `hard`, `soft` or `any` isolation instead of a mechanism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<IsolationLevel>,
}

impl Request {
    /// A CPU/memory-only request.
    pub fn cpu_only(cpu_milli: u64, memory_mib: u64) -> Request {
        Request {
            cpu_milli,
            memory_mib,
            ..Request::default()
        }
    }
    /// `count` whole GPUs.
    pub fn whole(count: u32, cpu_milli: u64, memory_mib: u64) -> Request {
        Request {
            cpu_milli,
            memory_mib,
            gpu: if count == 0 {
                GpuAsk::None
            } else {
                GpuAsk::Whole { count }
            },
            ..Request::default()
        }
    }
    /// One GPU shared at `milli` per-mille of memory and compute (the openb trace's shape).
    pub fn share_milli(milli: u32, cpu_milli: u64, memory_mib: u64) -> Request {
        Request {
            cpu_milli,
            memory_mib,
            gpu: GpuAsk::Shared {
                count: 1,
                memory: GpuMemory::PerMille(milli),
                cores_milli: milli,
            },
            isolation: Isolation::Mps,
            ..Request::default()
        }
    }
    /// One GPU shared at `milli` per-mille of memory and compute, isolated at `level`
    /// (the scheduler picks the mechanism).
    pub fn share_level(
        milli: u32,
        level: IsolationLevel,
        cpu_milli: u64,
        memory_mib: u64,
    ) -> Request {
        Request {
            level: Some(level),
            ..Request::share_milli(milli, cpu_milli, memory_mib)
        }
    }
    /// Restricts the request to these models (names already validated against `catalog`).
    pub fn with_models(
        mut self,
        models: &[&str],
        catalog: &Catalog,
    ) -> Result<Request, RequestError> {
        let joined = models.join("|");
        let (names, set) = parse_models(ANN_GPU_MODEL, &joined, catalog)?;
        self.constraints.models = names;
        self.constraints.model_set = set;
        Ok(self)
    }
    /// Recomputes [`Constraints::model_set`] against another catalog (after deserialising).
    pub fn bind_catalog(&mut self, catalog: &Catalog) -> Result<(), RequestError> {
        if self.constraints.models.is_empty() {
            self.constraints.model_set = ModelSet::ALL;
            return Ok(());
        }
        let joined = self.constraints.models.join("|");
        self.constraints.model_set = parse_models(ANN_GPU_MODEL, &joined, catalog)?.1;
        Ok(())
    }
}

/// A request string that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {value:?}: {problem}")]
pub struct RequestError {
    /// The resource or annotation name.
    pub field: String,
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

fn err(field: &str, value: &str, problem: impl fmt::Display) -> RequestError {
    RequestError {
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.to_string(),
    }
}

/// Parses a Kubernetes CPU quantity (`500m`, `2`, `1.5`) into milli-cores.
pub fn parse_cpu_milli(field: &str, value: &str) -> Result<u64, RequestError> {
    let v = value.trim();
    if let Some(m) = v.strip_suffix('m') {
        return parse_u64(field, value, m);
    }
    let milli = parse_decimal_scaled(field, value, v, 1000)?;
    Ok(milli)
}

/// Parses a Kubernetes memory quantity (`512Mi`, `4Gi`, `1G`, `1000000`) into MiB, rounding up.
pub fn parse_memory_mib(field: &str, value: &str) -> Result<u64, RequestError> {
    let v = value.trim();
    const UNITS: [(&str, u128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (num, mult) = UNITS
        .iter()
        .find_map(|(suffix, mult)| v.strip_suffix(suffix).map(|n| (n, *mult)))
        .unwrap_or((v, 1));
    if num.is_empty() || num.starts_with('-') {
        return Err(err(
            field,
            value,
            "must be a non-negative quantity such as 512Mi or 4Gi",
        ));
    }
    let bytes = parse_decimal_u128(num, mult).ok_or_else(|| {
        err(
            field,
            value,
            "not a quantity (expected e.g. 512Mi, 4Gi, 1G)",
        )
    })?;
    let mib = bytes.div_ceil(1 << 20);
    u64::try_from(mib).map_err(|_| err(field, value, "too large"))
}

/// `num` × `mult`, where `num` may have a decimal point; rounds up the fraction.
fn parse_decimal_u128(num: &str, mult: u128) -> Option<u128> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let int_v: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut total = int_v.checked_mul(mult)?;
    if !frac.is_empty() {
        let frac = &frac[..frac.len().min(18)];
        let denom = 10u128.pow(frac.len() as u32);
        let f: u128 = frac.parse().ok()?;
        total = total.checked_add((f * mult).div_ceil(denom))?;
    }
    Some(total)
}

fn parse_decimal_scaled(
    field: &str,
    value: &str,
    num: &str,
    mult: u64,
) -> Result<u64, RequestError> {
    if num.starts_with('-') {
        return Err(err(field, value, "must not be negative"));
    }
    parse_decimal_u128(num, u128::from(mult))
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| err(field, value, "not a number (expected e.g. 500m or 2)"))
}

fn parse_u64(field: &str, value: &str, digits: &str) -> Result<u64, RequestError> {
    let d = digits.trim();
    if d.starts_with('-') {
        return Err(err(field, value, "must not be negative"));
    }
    d.parse::<u64>()
        .map_err(|_| err(field, value, "not a whole number"))
}

fn parse_models(
    field: &str,
    value: &str,
    catalog: &Catalog,
) -> Result<(Vec<String>, ModelSet), RequestError> {
    let mut names = Vec::new();
    let mut set = ModelSet(0);
    for part in value.split('|').map(str::trim).filter(|p| !p.is_empty()) {
        let id = catalog.find(part).ok_or_else(|| {
            err(
                field,
                value,
                format!(
                    "unknown GPU model {part:?} (known: {})",
                    catalog.names().join(", ")
                ),
            )
        })?;
        set.insert(id);
        names.push(catalog.spec(id).name.clone());
    }
    if names.is_empty() {
        return Err(err(field, value, "names no GPU model"));
    }
    names.sort();
    names.dedup();
    Ok((names, set))
}

fn parse_bool(field: &str, value: &str) -> Result<bool, RequestError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        _ => Err(err(field, value, "expected true or false")),
    }
}

/// Parses a pod's resource requests (summed over its containers) and annotations.
///
/// Keys that are not Tessera's or GPU-related (e.g. `ephemeral-storage`) are ignored,
/// as are annotations outside `tessera.io/`.
pub fn parse<'a>(
    resources: impl IntoIterator<Item = (&'a str, &'a str)>,
    annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
    catalog: &Catalog,
) -> Result<Request, RequestError> {
    let mut req = Request::default();
    let mut tessera_gpu: Option<(u64, &str)> = None;
    let mut nvidia_gpu: Option<u64> = None;
    let mut memory: Option<GpuMemory> = None;
    let mut cores: Option<u32> = None;
    let mut mig: Option<String> = None;

    for (key, value) in resources {
        match key {
            "cpu" => req.cpu_milli = parse_cpu_milli(key, value)?,
            "memory" => req.memory_mib = parse_memory_mib(key, value)?,
            RES_GPU => tessera_gpu = Some((parse_u64(key, value, value)?, value)),
            RES_NVIDIA_GPU => nvidia_gpu = Some(parse_u64(key, value, value)?),
            RES_GPU_MEMORY => {
                let v = value.trim();
                let mib = if v.chars().all(|c| c.is_ascii_digit()) {
                    parse_u64(key, value, v)?
                } else {
                    parse_memory_mib(key, value)?
                };
                if mib == 0 {
                    return Err(err(key, value, "must be at least 1 MiB"));
                }
                if memory.is_some() {
                    return Err(err(
                        key,
                        value,
                        "give GPU memory once: in MiB, in per cent or as gpu-milli",
                    ));
                }
                memory = Some(GpuMemory::Mib(mib));
            }
            RES_GPU_MEMORY_PERCENT => {
                let p = parse_u64(key, value, value)?;
                if p == 0 || p > 100 {
                    return Err(err(
                        key,
                        value,
                        "must be between 1 and 100 (per cent of one GPU's memory)",
                    ));
                }
                if memory.is_some() {
                    return Err(err(
                        key,
                        value,
                        "give GPU memory once: in MiB, in per cent or as gpu-milli",
                    ));
                }
                memory = Some(GpuMemory::PerMille(p as u32 * 10));
            }
            RES_GPU_CORES => {
                let p = parse_u64(key, value, value)?;
                if p == 0 || p > 100 {
                    return Err(err(
                        key,
                        value,
                        "must be between 1 and 100 (per cent of one GPU's compute)",
                    ));
                }
                cores = Some(p as u32 * 10);
            }
            RES_GPU_MILLI => {
                let m = parse_u64(key, value, value)?;
                if m == 0 || m > 1000 {
                    return Err(err(
                        key,
                        value,
                        "must be between 1 and 1000 (per-mille of one GPU)",
                    ));
                }
                if memory.is_some() || cores.is_some() {
                    return Err(err(
                        key,
                        value,
                        "gpu-milli sets memory and compute together; do not combine it with gpu-memory or gpu-cores",
                    ));
                }
                memory = Some(GpuMemory::PerMille(m as u32));
                cores = Some(m as u32);
            }
            _ => {
                let profile = key
                    .strip_prefix(RES_MIG_PREFIX)
                    .or_else(|| key.strip_prefix(RES_NVIDIA_MIG_PREFIX));
                if let Some(profile) = profile {
                    let n = parse_u64(key, value, value)?;
                    if n == 0 {
                        continue;
                    }
                    if n > 1 {
                        return Err(err(key, value, "a pod may ask for one MIG instance"));
                    }
                    // Resource names spell `+` as `.` (`mig-1g.10gb.me` is `1g.10gb+me`).
                    let plus = profile
                        .rsplit_once('.')
                        .map(|(head, tail)| format!("{head}+{tail}"));
                    let profile = if catalog.models_with_profile(profile).0 > 0 {
                        profile.to_string()
                    } else if let Some(p) = plus.filter(|p| catalog.models_with_profile(p).0 > 0) {
                        p
                    } else {
                        return Err(err(key, value, format!("unknown MIG profile {profile:?}")));
                    };
                    if mig.is_some() {
                        return Err(err(key, value, "a pod may ask for one MIG profile"));
                    }
                    mig = Some(profile);
                }
            }
        }
    }

    let mut isolation: Option<Isolation> = None;
    let mut level: Option<IsolationLevel> = None;
    for (key, value) in annotations {
        match key {
            ANN_GPU_MODEL => {
                let (names, set) = parse_models(key, value, catalog)?;
                req.constraints.models = names;
                req.constraints.model_set = set;
            }
            ANN_GPU_UUIDS => {
                let uuids: Vec<String> = value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                if uuids.is_empty() {
                    return Err(err(key, value, "names no GPU UUID"));
                }
                if let Some(bad) = uuids
                    .iter()
                    .find(|u| !(u.starts_with("GPU-") || u.starts_with("MIG-")))
                {
                    return Err(err(
                        key,
                        value,
                        format!("{bad:?} is not a GPU UUID (GPU-… or MIG-…)"),
                    ));
                }
                req.constraints.pinned_uuids = uuids;
            }
            ANN_ISOLATION => {
                isolation = Some(match value.trim() {
                    "exclusive" => Isolation::Exclusive,
                    "mps" => Isolation::Mps,
                    "time-slice" | "timeslice" => Isolation::TimeSlice,
                    "mig" => Isolation::Mig,
                    "hard" | "soft" | "any" => {
                        level = Some(match value.trim() {
                            "hard" => IsolationLevel::Hard,
                            "soft" => IsolationLevel::Soft,
                            _ => IsolationLevel::Any,
                        });
                        continue;
                    }
                    _ => {
                        return Err(err(
                            key,
                            value,
                            "expected hard, soft, any, exclusive, mps, time-slice or mig",
                        ));
                    }
                })
            }
            ANN_TOPOLOGY => {
                for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    match part {
                        "nvlink-required" => req.constraints.nvlink = Wish::Required,
                        "nvlink-preferred" => req.constraints.nvlink = Wish::Preferred,
                        "numa-preferred" => req.constraints.same_numa = true,
                        _ => {
                            return Err(err(
                                key,
                                value,
                                format!(
                                    "unknown topology wish {part:?} (expected nvlink-required, nvlink-preferred or numa-preferred)"
                                ),
                            ));
                        }
                    }
                }
            }
            ANN_SINGLE_ARCH => req.constraints.single_architecture = parse_bool(key, value)?,
            _ => {}
        }
    }

    // Reconcile the GPU resources into one ask.
    let count = match (tessera_gpu, nvidia_gpu) {
        (Some((t, tv)), Some(n)) if t != n => {
            return Err(err(
                RES_GPU,
                tv,
                format!("disagrees with {RES_NVIDIA_GPU}={n}"),
            ));
        }
        (Some((t, _)), _) => Some(t),
        (None, n) => n,
    };
    let shared = memory.is_some() || cores.is_some();
    if let Some(profile) = mig {
        if count.is_some_and(|c| c > 0) || shared {
            return Err(err(
                &format!("{RES_MIG_PREFIX}{profile}"),
                "1",
                "a MIG request cannot also ask for whole or shared GPUs",
            ));
        }
        req.gpu = GpuAsk::Mig { profile };
    } else if shared {
        let count = count.unwrap_or(1);
        if count == 0 {
            return Err(err(RES_GPU, "0", "a GPU share needs at least one GPU"));
        }
        let memory = memory.unwrap_or(GpuMemory::PerMille(cores.unwrap_or(1000)));
        req.gpu = GpuAsk::Shared {
            count: count_u32(count)?,
            memory,
            cores_milli: cores.unwrap_or(0),
        };
    } else if let Some(count) = count.filter(|c| *c > 0) {
        req.gpu = GpuAsk::Whole {
            count: count_u32(count)?,
        };
    }

    // A level names no mechanism: the share keeps its plain-GPU default (MPS, or
    // time slicing without a compute ask) and the scheduler chooses per GPU.
    match (&req.gpu, level) {
        (_, None) => {}
        // One pod gets one mechanism (the allocation records one): a share of
        // several GPUs could be given MIG on one and MPS on another, so only `soft`.
        (GpuAsk::Shared { count, .. }, Some(l @ (IsolationLevel::Hard | IsolationLevel::Any)))
            if *count > 1 =>
        {
            return Err(err(
                ANN_ISOLATION,
                l.name(),
                "hard and any isolation are for a share of one GPU; ask for whole GPUs, or soft isolation",
            ));
        }
        (GpuAsk::Shared { .. }, Some(l)) => req.level = Some(l),
        // Whole GPUs are as hard as isolation gets; any other level would share them.
        (GpuAsk::Whole { .. }, Some(IsolationLevel::Hard)) => {}
        (GpuAsk::Mig { .. }, Some(IsolationLevel::Hard | IsolationLevel::Any)) => {}
        (_, Some(l)) => {
            return Err(err(
                ANN_ISOLATION,
                l.name(),
                "hard, soft and any choose how a GPU share is isolated; ask for a share (gpu-memory, gpu-cores or gpu-milli)",
            ));
        }
    }
    req.isolation = match (&req.gpu, isolation) {
        (GpuAsk::Mig { .. }, None | Some(Isolation::Mig)) => Isolation::Mig,
        (GpuAsk::Mig { .. }, Some(other)) => {
            return Err(err(
                ANN_ISOLATION,
                other.name(),
                "a MIG request is isolated by MIG",
            ));
        }
        (_, Some(Isolation::Mig)) => {
            return Err(err(
                ANN_ISOLATION,
                "mig",
                "needs a MIG profile resource such as tessera.io/mig-1g.10gb",
            ));
        }
        (GpuAsk::Shared { .. }, Some(Isolation::Exclusive)) => {
            return Err(err(
                ANN_ISOLATION,
                "exclusive",
                "a GPU share cannot be exclusive; ask for whole GPUs instead",
            ));
        }
        (GpuAsk::Shared { cores_milli, .. }, None) => {
            if *cores_milli > 0 {
                Isolation::Mps
            } else {
                Isolation::TimeSlice
            }
        }
        (GpuAsk::Whole { .. } | GpuAsk::None, None) => Isolation::Exclusive,
        (_, Some(i)) => i,
    };
    if req.constraints.nvlink == Wish::Required && req.gpu.gpu_count() < 2 {
        req.constraints.nvlink = Wish::Off;
    }
    Ok(req)
}

fn count_u32(count: u64) -> Result<u32, RequestError> {
    if count > 64 {
        return Err(err(
            RES_GPU,
            &count.to_string(),
            "more GPUs than any node has (at most 64)",
        ));
    }
    Ok(count as u32)
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gpu {
            GpuAsk::None => write!(f, "no GPU")?,
            GpuAsk::Whole { count } => write!(f, "{count} whole GPU(s)")?,
            GpuAsk::Shared {
                count,
                memory,
                cores_milli,
            } => {
                write!(f, "{count} GPU share(s) of ")?;
                match memory {
                    GpuMemory::Mib(m) => write!(f, "{m} MiB")?,
                    GpuMemory::PerMille(p) => write!(f, "{}.{}% memory", p / 10, p % 10)?,
                }
                write!(f, " and {}.{}% compute", cores_milli / 10, cores_milli % 10)?;
            }
            GpuAsk::Mig { profile } => write!(f, "MIG {profile}")?,
        }
        write!(f, ", {} mCPU, {} MiB", self.cpu_milli, self.memory_mib)?;
        if !self.constraints.models.is_empty() {
            write!(f, ", model {}", self.constraints.models.join("|"))?;
        }
        if let Some(level) = self.level {
            write!(f, ", {} isolation", level.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(res: &[(&str, &str)], ann: &[(&str, &str)]) -> Result<Request, RequestError> {
        parse(
            res.iter().copied(),
            ann.iter().copied(),
            &Catalog::default(),
        )
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu_milli("cpu", "500m").unwrap(), 500);
        assert_eq!(parse_cpu_milli("cpu", "2").unwrap(), 2000);
        assert_eq!(parse_cpu_milli("cpu", "1.5").unwrap(), 1500);
        assert!(parse_cpu_milli("cpu", "-1").is_err());
        assert!(parse_cpu_milli("cpu", "two").is_err());
        assert_eq!(parse_memory_mib("memory", "4Gi").unwrap(), 4096);
        assert_eq!(parse_memory_mib("memory", "512Mi").unwrap(), 512);
        // 1G = 10^9 bytes = 953.67 MiB, rounded up.
        assert_eq!(parse_memory_mib("memory", "1G").unwrap(), 954);
        assert_eq!(parse_memory_mib("memory", "1.5Gi").unwrap(), 1536);
        assert!(parse_memory_mib("memory", "-4Gi").is_err());
        assert!(parse_memory_mib("memory", "lots").is_err());
    }

    #[test]
    fn whole_shared_and_mig() {
        let r = p(
            &[("nvidia.com/gpu", "2"), ("cpu", "4"), ("memory", "8Gi")],
            &[],
        )
        .unwrap();
        assert_eq!(r.gpu, GpuAsk::Whole { count: 2 });
        assert_eq!(
            (r.cpu_milli, r.memory_mib, r.isolation),
            (4000, 8192, Isolation::Exclusive)
        );

        let r = p(&[(RES_GPU_MEMORY, "20000"), (RES_GPU_CORES, "30")], &[]).unwrap();
        assert_eq!(
            r.gpu,
            GpuAsk::Shared {
                count: 1,
                memory: GpuMemory::Mib(20_000),
                cores_milli: 300
            }
        );
        assert_eq!(r.isolation, Isolation::Mps);

        let r = p(&[(RES_GPU_MEMORY, "8Gi")], &[]).unwrap();
        assert!(matches!(
            r.gpu,
            GpuAsk::Shared {
                memory: GpuMemory::Mib(8192),
                cores_milli: 0,
                ..
            }
        ));
        assert_eq!(r.isolation, Isolation::TimeSlice);

        let r = p(&[(RES_GPU_MILLI, "450"), (RES_GPU, "1")], &[]).unwrap();
        assert_eq!(r.gpu.total_milli(), 450);

        let r = p(&[("nvidia.com/mig-1g.10gb", "1")], &[]).unwrap();
        assert_eq!(
            r.gpu,
            GpuAsk::Mig {
                profile: "1g.10gb".into()
            }
        );
        assert_eq!(r.isolation, Isolation::Mig);

        // The node agent and NVIDIA's plugin spell `+` as `.` in resource names.
        for key in ["tessera.io/mig-1g.10gb.me", "nvidia.com/mig-1g.10gb.me"] {
            let r = p(&[(key, "1")], &[]).unwrap();
            assert_eq!(
                r.gpu,
                GpuAsk::Mig {
                    profile: "1g.10gb+me".into()
                },
                "{key}"
            );
        }
        let e = p(&[("tessera.io/mig-1g.10gb.xx", "1")], &[]).unwrap_err();
        assert!(e.to_string().contains("unknown MIG profile"), "{e}");
    }

    #[test]
    fn constraints_from_annotations() {
        let r = p(
            &[(RES_GPU, "4")],
            &[
                (ANN_GPU_MODEL, "A100-80GB|h100-80gb"),
                (ANN_TOPOLOGY, "nvlink-required,numa-preferred"),
                (ANN_GPU_UUIDS, "GPU-1, GPU-2"),
            ],
        )
        .unwrap();
        assert_eq!(r.constraints.models, vec!["A100-80GB", "H100-80GB"]);
        assert_eq!(r.constraints.nvlink, Wish::Required);
        assert!(r.constraints.same_numa);
        assert_eq!(r.constraints.pinned_uuids, vec!["GPU-1", "GPU-2"]);
        let c = Catalog::default();
        assert!(
            r.constraints
                .model_set
                .contains(c.find("A100-80GB").unwrap())
        );
        assert!(!r.constraints.model_set.contains(c.find("T4").unwrap()));
    }

    /// Resources, annotations, and a piece of the expected error.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)], &'a str);

    /// Each bad input names its field and value in the message.
    #[test]
    fn bad_inputs_name_field_and_value() {
        let cases: &[Case<'_>] = &[
            (
                &[(RES_GPU, "-1")],
                &[],
                "tessera.io/gpu: \"-1\": must not be negative",
            ),
            (
                &[(RES_GPU_CORES, "150")],
                &[],
                "tessera.io/gpu-cores: \"150\": must be between 1 and 100",
            ),
            (
                &[(RES_GPU_MEMORY_PERCENT, "101")],
                &[],
                "gpu-memory-percent: \"101\"",
            ),
            (
                &[(RES_GPU_MEMORY, "-5")],
                &[],
                "tessera.io/gpu-memory: \"-5\"",
            ),
            (
                &[("tessera.io/mig-9g.99gb", "1")],
                &[],
                "unknown MIG profile \"9g.99gb\"",
            ),
            (
                &[(RES_GPU, "1")],
                &[(ANN_GPU_MODEL, "RTX-9999")],
                "unknown GPU model \"RTX-9999\"",
            ),
            (
                &[(RES_GPU, "banana")],
                &[],
                "tessera.io/gpu: \"banana\": not a whole number",
            ),
            (&[("cpu", "lots")], &[], "cpu: \"lots\""),
            (
                &[(RES_GPU_MEMORY, "1000")],
                &[(ANN_ISOLATION, "exclusive")],
                "cannot be exclusive",
            ),
            (
                &[(RES_GPU, "1")],
                &[(ANN_ISOLATION, "shared-ish")],
                "tessera.io/isolation",
            ),
            (
                &[(RES_GPU, "2"), (RES_NVIDIA_GPU, "3")],
                &[],
                "disagrees with nvidia.com/gpu=3",
            ),
            (&[(RES_GPU, "1000")], &[], "at most 64"),
        ];
        for (res, ann, want) in cases {
            let e = p(res, ann).expect_err(want).to_string();
            assert!(e.contains(want), "error {e:?} should contain {want:?}");
        }
    }
}
