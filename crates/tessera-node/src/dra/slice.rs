//! The node's `ResourceSlice`s (`resource.k8s.io/v1`, protocols.md §3.3). Pure.
//!
//! One pool per node, named after the node. The devices:
//!
//! - a GPU without MIG mode is device `gpu-<index>`: attributes `type`="gpu",
//!   `uuid`, `index`, `productName`, `model` (Tessera's catalog name), `numa`,
//!   `smCount`, `nvlinkDomain` (the lowest index of the GPUs its NVLinks reach,
//!   so `matchAttribute: gpu.tessera.io/nvlinkDomain` keeps a claim on one
//!   NVLink island), `nvlinkPeers` (the peers' device names), `driverVersion`,
//!   `cudaDriverVersion`, `cudaComputeCapability` (versions) and the standard
//!   `resource.kubernetes.io/pciBusID`; capacity `memory`.
//! - with [`SliceOptions::consumable_capacity`] (KEP-5075, Kubernetes ≥1.34 with
//!   `DRAConsumableCapacity`), such a GPU also allows several allocations, each
//!   a share with capacity `memory` (MiB steps) and `compute` (per-mille of the
//!   GPU). Both default to the whole GPU, so a claim that asks for no capacity
//!   gets the GPU alone.
//! - an existing MIG instance is device `gpu-<index>-mig-<profile>-<start>`
//!   (`type`="mig", `uuid`, `parentUUID`, `parentIndex`, `profile`, ...).
//! - with [`SliceOptions::partitionable_mig`] (KEP-4815, `DRAPartitionableDevices`)
//!   a MIG-capable GPU of a known model that is in MIG mode gets a counter set
//!   `gpu-<index>-counter-set` (`compute-slices`, `memory-slice-<k>`) and every
//!   possible placement is a device that consumes its slices, so overlapping
//!   placements exclude each other; the driver creates a placement's instance
//!   at prepare ([`super::mig`]). A GPU out of MIG mode stays a whole GPU: the
//!   driver never switches MIG mode ([`super::placement`] says why). Counter
//!   sets go in a slice of their own, as the 1.35 API requires.
//!
//! An unhealthy GPU's devices carry a taint (`gpu.tessera.io/xid=<xid>` or
//! `gpu.tessera.io/unhealthy`, `NoSchedule`) when [`SliceOptions::device_taints`]
//! is on; without taint support they are left out of the pool, so they cannot
//! be allocated either way.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use tessera_core::model::spec::Catalog;

use super::DRIVER_NAME;
use crate::backend::{GpuInfo, LinkKind};
use crate::deviceplugin::NodeView;
use crate::health::GpuHealth;

/// `resource.k8s.io/v1`.
pub const API_VERSION_V1: &str = "resource.k8s.io/v1";
/// Most devices in one slice (`ResourceSliceMaxDevices`).
pub const MAX_DEVICES: usize = 128;
/// Most devices in one slice that uses taints or counters
/// (`ResourceSliceMaxDevicesWithAdvancedFeatures`).
pub const MAX_DEVICES_ADVANCED: usize = 64;
/// Longest string attribute value (`DeviceAttributeMaxValueLength`).
pub const MAX_ATTRIBUTE_LEN: usize = 64;
/// The standard PCI bus ID attribute.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// What the API server can take (its version and feature gates).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SliceOptions {
    /// Publish whole GPUs as shareable (`allowMultipleAllocations`, request policies).
    pub consumable_capacity: bool,
    /// Publish every MIG placement with shared counters.
    pub partitionable_mig: bool,
    /// Publish unhealthy devices with taints (else leave them out).
    pub device_taints: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSlice {
    pub api_version: String,
    pub kind: String,
    pub metadata: SliceMeta,
    pub spec: ResourceSliceSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SliceMeta {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    pub driver: String,
    pub pool: ResourcePool,
    pub node_name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    pub name: String,
    pub generation: i64,
    pub resource_slice_count: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub attributes: BTreeMap<String, Attribute>,
    pub capacity: BTreeMap<String, Capacity>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<CounterConsumption>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
}

/// `DeviceAttribute`: exactly one of its typed values.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attribute {
    Int(i64),
    Bool(bool),
    String(String),
    Version(String),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// A `resource.Quantity`.
    pub value: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<RequestPolicy>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestPolicy {
    pub default: String,
    pub valid_range: ValidRange,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidRange {
    pub min: String,
    pub max: String,
    pub step: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CounterSet {
    pub name: String,
    pub counters: BTreeMap<String, Counter>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Counter {
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterConsumption {
    pub counter_set: String,
    pub counters: BTreeMap<String, Counter>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Taint {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

/// The driver's versions, as the backend reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverVersions {
    pub driver: Option<String>,
    pub cuda: Option<String>,
}

/// A version as semver 2.0.0 (`major.minor.patch`, no leading zeros): NVIDIA's
/// `535.104.05` becomes `535.104.5`, CUDA's `12.4` becomes `12.4.0`. `None`
/// for anything that is not one to three dot-separated numbers.
pub fn semver(v: &str) -> Option<String> {
    let parts: Vec<u64> = v
        .trim()
        .split('.')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let at = |i: usize| parts.get(i).copied().unwrap_or(0);
    Some(format!("{}.{}.{}", at(0), at(1), at(2)))
}

/// NVML's `00000000:07:00.0` as the standard attribute's `0000:07:00.0`;
/// `None` when it is not a PCI address.
pub fn pci_bus_id(nvml: &str) -> Option<String> {
    let s = nvml.trim().to_ascii_lowercase();
    let (domain, rest) = s.split_once(':')?;
    let domain = match domain.len() {
        8 if domain.starts_with("0000") => &domain[4..],
        4 => domain,
        _ => return None,
    };
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let hex = |x: &str, n: usize| x.len() == n && x.chars().all(|c| c.is_ascii_hexdigit());
    (hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1))
        .then(|| format!("{domain}:{bus}:{dev}.{func}"))
}

/// A DNS label (RFC 1123): what device, counter-set and counter names must be.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A `QualifiedName`: a C identifier of ≤32 characters, optionally after a DNS
/// subdomain of ≤63 and a `/`.
pub fn is_qualified_name(s: &str) -> bool {
    let (domain, id) = match s.split_once('/') {
        Some((d, id)) => (Some(d), id),
        None => (None, s),
    };
    let id_ok = !id.is_empty()
        && id.len() <= 32
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !id.as_bytes()[0].is_ascii_digit();
    let domain_ok =
        domain.is_none_or(|d| !d.is_empty() && d.len() <= 63 && d.split('.').all(is_dns_label));
    id_ok && domain_ok
}

/// A MIG profile as part of a device name: `1g.10gb+me` → `1g10gbme`.
fn profile_label(profile: &str) -> String {
    profile
        .to_ascii_lowercase()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect()
}

/// `gpu-<index>`: a whole GPU.
pub fn gpu_device_name(gpu: &GpuInfo) -> String {
    format!("gpu-{}", gpu.index)
}

/// `gpu-<index>-mig-<profile>-<start>`: a MIG instance or placement.
pub fn mig_device_name(gpu: &GpuInfo, profile: &str, place: &str) -> String {
    format!("gpu-{}-mig-{}-{place}", gpu.index, profile_label(profile))
}

fn counter_set_name(gpu: &GpuInfo) -> String {
    format!("gpu-{}-counter-set", gpu.index)
}

fn string_attr(s: &str) -> Attribute {
    // Values longer than the limit would make the whole slice invalid.
    Attribute::String(s.chars().take(MAX_ATTRIBUTE_LEN).collect())
}

fn mib(v: u64) -> String {
    format!("{v}Mi")
}

fn counters(pairs: impl IntoIterator<Item = (String, u64)>) -> BTreeMap<String, Counter> {
    pairs
        .into_iter()
        .map(|(k, v)| {
            (
                k,
                Counter {
                    value: v.to_string(),
                },
            )
        })
        .collect()
}

/// The NVLink island of each GPU (by UUID): the lowest index it reaches over NVLink,
/// itself included. GPUs without NVLink have none.
fn nvlink_domains(gpus: &[GpuInfo]) -> BTreeMap<&str, u32> {
    let by_uuid: BTreeMap<&str, &GpuInfo> = gpus.iter().map(|g| (g.uuid.as_str(), g)).collect();
    let mut adj: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for g in gpus {
        for l in g.links.iter().filter(|l| l.kind == LinkKind::Nvlink) {
            if by_uuid.contains_key(l.peer_uuid.as_str()) {
                adj.entry(g.uuid.as_str())
                    .or_default()
                    .insert(l.peer_uuid.as_str());
                adj.entry(l.peer_uuid.as_str())
                    .or_default()
                    .insert(g.uuid.as_str());
            }
        }
    }
    let mut out = BTreeMap::new();
    for start in adj.keys() {
        if out.contains_key(start) {
            continue;
        }
        let mut seen = BTreeSet::from([*start]);
        let mut todo = vec![*start];
        while let Some(u) = todo.pop() {
            for p in adj.get(u).into_iter().flatten() {
                if seen.insert(p) {
                    todo.push(p);
                }
            }
        }
        let min = seen
            .iter()
            .filter_map(|u| by_uuid.get(u))
            .map(|g| g.index)
            .min();
        for u in seen {
            if let Some(m) = min {
                out.insert(u, m);
            }
        }
    }
    out
}

/// Attributes every device of a GPU shares (the parent's, for MIG devices).
fn common_attributes(gpu: &GpuInfo, versions: &DriverVersions) -> BTreeMap<String, Attribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), string_attr(&gpu.product));
    if let Some(m) = &gpu.model {
        a.insert("model".into(), string_attr(m));
    }
    if let Some(n) = gpu.numa_node {
        a.insert("numa".into(), Attribute::Int(i64::from(n)));
    }
    if let Some(v) = versions.driver.as_deref().and_then(semver) {
        a.insert("driverVersion".into(), Attribute::Version(v));
    }
    if let Some(v) = versions.cuda.as_deref().and_then(semver) {
        a.insert("cudaDriverVersion".into(), Attribute::Version(v));
    }
    if let Some((major, minor)) = gpu.compute_capability {
        a.insert(
            "cudaComputeCapability".into(),
            Attribute::Version(format!("{major}.{minor}.0")),
        );
    }
    if let Some(p) = pci_bus_id(&gpu.pci_bus_id) {
        a.insert(ATTR_PCI_BUS_ID.into(), Attribute::String(p));
    }
    a
}

fn taints(health: Option<&GpuHealth>) -> Vec<Taint> {
    match health {
        Some(GpuHealth::Unhealthy { xid: Some(x), .. }) => vec![Taint {
            key: format!("{DRIVER_NAME}/xid"),
            value: Some(x.to_string()),
            effect: "NoSchedule".into(),
        }],
        Some(GpuHealth::Unhealthy { xid: None, .. }) => vec![Taint {
            key: format!("{DRIVER_NAME}/unhealthy"),
            value: None,
            effect: "NoSchedule".into(),
        }],
        _ => Vec::new(),
    }
}

/// One GPU's devices (and its counter set, when partitioned).
fn gpu_devices(
    gpu: &GpuInfo,
    gpus: &[GpuInfo],
    domains: &BTreeMap<&str, u32>,
    versions: &DriverVersions,
    options: SliceOptions,
    catalog: &Catalog,
) -> (Vec<Device>, Option<CounterSet>) {
    let common = common_attributes(gpu, versions);
    let geometry = super::placement::published_geometry(gpu, options, catalog);
    let mut devices = Vec::new();
    let mut counter_set = None;

    let whole_gpu = |consumes: Vec<CounterConsumption>| {
        let mut attributes = common.clone();
        attributes.insert("type".into(), string_attr("gpu"));
        attributes.insert("uuid".into(), string_attr(&gpu.uuid));
        attributes.insert("index".into(), Attribute::Int(i64::from(gpu.index)));
        if let Some(sm) = gpu.sm_count {
            attributes.insert("smCount".into(), Attribute::Int(i64::from(sm)));
        }
        if let Some(d) = domains.get(gpu.uuid.as_str()) {
            attributes.insert("nvlinkDomain".into(), Attribute::Int(i64::from(*d)));
        }
        let peers: Vec<String> = gpu
            .links
            .iter()
            .filter(|l| l.kind == LinkKind::Nvlink)
            .filter_map(|l| gpus.iter().find(|g| g.uuid == l.peer_uuid))
            .map(gpu_device_name)
            .collect();
        let peers = peers.join(",");
        // A list cut short would mislead a selector: leave it out instead.
        if !peers.is_empty() && peers.len() <= MAX_ATTRIBUTE_LEN {
            attributes.insert("nvlinkPeers".into(), Attribute::String(peers));
        }
        let shared = options.consumable_capacity && consumes.is_empty();
        let mut capacity = BTreeMap::new();
        capacity.insert(
            "memory".into(),
            Capacity {
                value: mib(gpu.memory_mib),
                request_policy: shared.then(|| RequestPolicy {
                    default: mib(gpu.memory_mib),
                    valid_range: ValidRange {
                        min: mib(1),
                        max: mib(gpu.memory_mib),
                        step: mib(1),
                    },
                }),
            },
        );
        if shared {
            capacity.insert(
                "compute".into(),
                Capacity {
                    value: "1000".into(),
                    request_policy: Some(RequestPolicy {
                        default: "1000".into(),
                        valid_range: ValidRange {
                            min: "1".into(),
                            max: "1000".into(),
                            step: "1".into(),
                        },
                    }),
                },
            );
        }
        Device {
            name: gpu_device_name(gpu),
            attributes,
            capacity,
            consumes_counters: consumes,
            taints: Vec::new(),
            allow_multiple_allocations: shared.then_some(true),
        }
    };
    let mig_device =
        |profile: &str, place: String, uuid: Option<&str>, memory_mib: u64, sm: Option<u32>| {
            let mut attributes = common.clone();
            attributes.insert("type".into(), string_attr("mig"));
            if let Some(u) = uuid {
                attributes.insert("uuid".into(), string_attr(u));
            }
            attributes.insert("parentUUID".into(), string_attr(&gpu.uuid));
            attributes.insert("parentIndex".into(), Attribute::Int(i64::from(gpu.index)));
            attributes.insert("profile".into(), string_attr(profile));
            let mut capacity = BTreeMap::new();
            capacity.insert(
                "memory".into(),
                Capacity {
                    value: mib(memory_mib),
                    request_policy: None,
                },
            );
            if let Some(sm) = sm {
                capacity.insert(
                    "multiprocessors".into(),
                    Capacity {
                        value: sm.to_string(),
                        request_policy: None,
                    },
                );
            }
            Device {
                name: mig_device_name(gpu, profile, &place),
                attributes,
                capacity,
                consumes_counters: Vec::new(),
                taints: Vec::new(),
                allow_multiple_allocations: None,
            }
        };

    match geometry {
        Some(geo) => {
            let set = counter_set_name(gpu);
            let slices = geo.memory_slices.min(8);
            let mut all = vec![("compute-slices".to_string(), u64::from(geo.compute_slices))];
            all.extend((0..slices).map(|k| (format!("memory-slice-{k}"), 1)));
            counter_set = Some(CounterSet {
                name: set.clone(),
                counters: counters(all),
            });
            for p in &geo.profiles {
                for &start in &p.starts {
                    let Some(mask) = geo.placement_mask(p, start) else {
                        continue;
                    };
                    let existing = gpu
                        .mig_instances
                        .iter()
                        .find(|m| m.profile == p.name && m.start == Some(start));
                    let mut d = mig_device(
                        &p.name,
                        start.to_string(),
                        existing.map(|m| m.uuid.as_str()),
                        p.memory_mib,
                        existing.and_then(|m| m.sm_count),
                    );
                    let mut used =
                        vec![("compute-slices".to_string(), u64::from(p.compute_slices))];
                    used.extend(
                        (0..slices)
                            .filter(|k| mask & (1 << k) != 0)
                            .map(|k| (format!("memory-slice-{k}"), 1)),
                    );
                    d.consumes_counters = vec![CounterConsumption {
                        counter_set: set.clone(),
                        counters: counters(used),
                    }];
                    devices.push(d);
                }
            }
        }
        None if gpu.mig_enabled => {
            for (k, m) in gpu.mig_instances.iter().enumerate() {
                let place = m.start.map_or_else(|| format!("i{k}"), |s| s.to_string());
                devices.push(mig_device(
                    &m.profile,
                    place,
                    Some(&m.uuid),
                    m.memory_mib,
                    m.sm_count,
                ));
            }
        }
        None => devices.push(whole_gpu(Vec::new())),
    }
    (devices, counter_set)
}

/// The slices of `node`'s pool at `generation`: counter sets first (their own
/// slice), then the devices, each GPU's devices kept in one slice where they fit.
pub fn resource_slices(
    node: &str,
    view: &NodeView,
    versions: &DriverVersions,
    generation: i64,
    options: SliceOptions,
) -> Vec<ResourceSlice> {
    let catalog = Catalog::default();
    let domains = nvlink_domains(&view.gpus);
    let mut counter_sets = Vec::new();
    let mut groups: Vec<Vec<Device>> = Vec::new();
    for gpu in &view.gpus {
        let health = view.health.get(&gpu.uuid);
        let healthy = health.is_none_or(GpuHealth::is_healthy);
        if !healthy && !options.device_taints {
            continue;
        }
        let (mut devices, set) =
            gpu_devices(gpu, &view.gpus, &domains, versions, options, &catalog);
        for d in &mut devices {
            d.taints = taints(health);
        }
        counter_sets.extend(set);
        groups.push(devices);
    }
    let advanced =
        !counter_sets.is_empty() || groups.iter().flatten().any(|d| !d.taints.is_empty());
    let limit = if advanced {
        MAX_DEVICES_ADVANCED
    } else {
        MAX_DEVICES
    };
    // Pack whole groups; split a group only when it alone exceeds the limit.
    let mut chunks: Vec<Vec<Device>> = Vec::new();
    for group in groups {
        for part in group.chunks(limit) {
            match chunks.last_mut() {
                Some(last) if last.len() + part.len() <= limit => last.extend_from_slice(part),
                _ => chunks.push(part.to_vec()),
            }
        }
    }
    let mut specs: Vec<(Vec<Device>, Vec<CounterSet>)> = Vec::new();
    for sets in counter_sets.chunks(8) {
        specs.push((Vec::new(), sets.to_vec()));
    }
    specs.extend(chunks.into_iter().map(|d| (d, Vec::new())));
    if specs.is_empty() {
        // An empty pool still tells the scheduler this node has nothing.
        specs.push((Vec::new(), Vec::new()));
    }
    let count = i64::try_from(specs.len()).unwrap_or(i64::MAX);
    specs
        .into_iter()
        .enumerate()
        .map(|(k, (devices, shared_counters))| ResourceSlice {
            api_version: API_VERSION_V1.into(),
            kind: "ResourceSlice".into(),
            metadata: SliceMeta {
                name: format!("{node}-{DRIVER_NAME}-{k}"),
            },
            spec: ResourceSliceSpec {
                driver: DRIVER_NAME.into(),
                pool: ResourcePool {
                    name: node.into(),
                    generation,
                    resource_slice_count: count,
                },
                node_name: node.into(),
                devices,
                shared_counters,
            },
        })
        .collect()
}
