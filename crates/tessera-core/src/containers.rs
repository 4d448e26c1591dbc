//! From a pod's containers to what the pod asks for, and which container gets
//! which of the pod's GPUs.
//!
//! The scheduler needs one request per pod; the kubelet asks the device plugin
//! once per container. Both sides use this module, so they agree on what a pod
//! with init containers, sidecars and several app containers means:
//!
//! - [`effective_request`] is Kubernetes' effective request (`PodRequests` in
//!   its resource helpers, sidecars per KEP-753): for each
//!   resource, the larger of the largest init container (plus the sidecars
//!   started before it) and the sum of the app containers and sidecars.
//!   Overflowing sums are errors, never wraps.
//! - Per-GPU shares are not amounts that add up: `tessera.io/gpu-milli: 300` in
//!   two containers is two GPUs at 30 % each, not one at 60 %. So the rules are
//!   ([`gpu_demands`]): every container that asks GPUs asks the same per-GPU
//!   share (the same share resources with the same amounts, or none for whole
//!   GPUs); when more than one container asks GPUs, each names its count
//!   (`tessera.io/gpu: N`), because the kubelet only calls the device plugin for
//!   containers that ask a device resource; a pod names GPUs by one resource,
//!   `tessera.io/gpu` or `nvidia.com/gpu`, not both; and `nvidia.com/gpu`
//!   means whole GPUs (its devices are counted one pod each), so shares are
//!   asked with `tessera.io/gpu`.
//! - [`assign`] splits the pod's granted GPUs between its containers: app
//!   containers and sidecars run together and get disjoint GPUs; an init
//!   container runs alone (beside the sidecars started before it), so it may
//!   reuse GPUs a later container gets, as the kubelet reuses init containers'
//!   devices.
//!
//! The input is a small core type, [`Container`], so the core stays free of
//! Kubernetes types; the adapters build it from the pod spec.

use std::collections::BTreeMap;

use crate::request::{
    self, RES_GPU, RES_GPU_CORES, RES_GPU_MEMORY, RES_GPU_MEMORY_PERCENT, RES_GPU_MILLI,
    RES_MIG_PREFIX, RES_NVIDIA_GPU, RES_NVIDIA_MIG_PREFIX, RequestError,
};

/// When a container runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ContainerKind {
    /// An init container: runs to completion before the next one starts.
    Init,
    /// A restartable init container (`restartPolicy: Always`): starts in the
    /// init sequence and keeps running beside the app containers.
    Sidecar,
    /// An app container.
    #[default]
    App,
}

/// One container of a pod, as the rules here need it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    pub kind: ContainerKind,
    /// Resource name → quantity as written (requests, else limits).
    pub resources: BTreeMap<String, String>,
}

impl Container {
    pub fn new(name: &str, kind: ContainerKind, resources: &[(&str, &str)]) -> Container {
        Container {
            name: name.to_string(),
            kind,
            resources: resources
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

/// Resources that say how many GPUs a container gets.
const COUNT_RESOURCES: [&str; 2] = [RES_GPU, RES_NVIDIA_GPU];
/// Resources that say how much of each GPU: they describe every GPU of the pod.
const SHARE_RESOURCES: [&str; 4] = [
    RES_GPU_MEMORY,
    RES_GPU_MEMORY_PERCENT,
    RES_GPU_CORES,
    RES_GPU_MILLI,
];

/// Whether `name` is a resource Tessera manages (`tessera.io/*`,
/// `nvidia.com/gpu`, `nvidia.com/mig-*`).
pub fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("tessera.io/")
        || name == RES_NVIDIA_GPU
        || name.starts_with(RES_NVIDIA_MIG_PREFIX)
}

fn is_mig_resource(name: &str) -> bool {
    name.starts_with(RES_MIG_PREFIX) || name.starts_with(RES_NVIDIA_MIG_PREFIX)
}

/// Byte quantities (`1Gi`), added up in MiB.
fn is_bytes_resource(name: &str) -> bool {
    name == "memory" || name == "ephemeral-storage" || name.starts_with("hugepages-")
}

fn err(field: &str, value: &str, problem: impl Into<String>) -> RequestError {
    RequestError {
        field: field.to_string(),
        value: value.to_string(),
        problem: problem.into(),
    }
}

fn whole_number(field: &str, value: &str) -> Result<u64, RequestError> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| err(field, value, "not a whole number"))
}

/// The containers in the order the kubelet admits them: init containers and
/// sidecars in spec order, then app containers in spec order.
pub fn kubelet_order(containers: &[Container]) -> impl Iterator<Item = &Container> {
    let init = containers.iter().filter(|c| c.kind != ContainerKind::App);
    init.chain(containers.iter().filter(|c| c.kind == ContainerKind::App))
}

/// The containers the kubelet calls `Allocate` for on `resource`, in its order,
/// with how many devices each asks.
pub fn askers<'a>(containers: &'a [Container], resource: &str) -> Vec<(&'a str, u64)> {
    kubelet_order(containers)
        .filter_map(|c| {
            let n = c.resources.get(resource)?.trim().parse::<u64>().ok()?;
            (n > 0).then_some((c.name.as_str(), n))
        })
        .collect()
}

/// A container that asks GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDemand {
    pub name: String,
    pub kind: ContainerKind,
    /// GPUs (or MIG instances) the container gets.
    pub gpus: u32,
}

/// One container's GPU resources, before the pod-wide rules.
struct GpuAsk<'a> {
    container: &'a Container,
    /// `tessera.io/gpu` or `nvidia.com/gpu`, if given: (resource, count).
    count: Option<(&'a str, u64)>,
    /// MIG instances asked, over all MIG resources.
    mig: u64,
    /// The share resources, normalised so `20Gi` and `20480` compare equal.
    shares: BTreeMap<&'a str, (&'a str, Option<u64>)>,
}

impl<'a> GpuAsk<'a> {
    fn gpus(&self) -> u64 {
        match self.count {
            Some((_, n)) => n,
            None if self.mig > 0 => self.mig,
            // A share without a count is one GPU, as the request parser reads it.
            None if !self.shares.is_empty() => 1,
            None => 0,
        }
    }

    fn describe_share(&self) -> String {
        if self.shares.is_empty() {
            return if self.mig > 0 {
                "a MIG instance"
            } else {
                "whole GPUs"
            }
            .into();
        }
        let parts: Vec<String> = self
            .shares
            .iter()
            .map(|(k, (v, _))| format!("{k}={}", v.trim()))
            .collect();
        parts.join(", ")
    }

    /// The first share resource on which the two differ, with the value `self` gives it.
    fn share_difference(&self, other: &GpuAsk<'a>) -> Option<(&'a str, &'a str)> {
        let same = |a: Option<&(&str, Option<u64>)>, b: Option<&(&str, Option<u64>)>| match (a, b) {
            (Some((_, Some(x))), Some((_, Some(y)))) => x == y,
            (Some((x, _)), Some((y, _))) => x.trim() == y.trim(),
            (None, None) => true,
            _ => false,
        };
        let mut keys: Vec<&'a str> = self
            .shares
            .keys()
            .chain(other.shares.keys())
            .copied()
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .find(|k| !same(self.shares.get(k), other.shares.get(k)))
            .map(|k| (k, self.shares.get(k).map_or("", |(v, _)| *v)))
    }
}

fn share_amount(key: &str, value: &str) -> Option<u64> {
    let v = value.trim();
    if key == RES_GPU_MEMORY && !v.chars().all(|c| c.is_ascii_digit()) {
        return request::parse_memory_mib(key, value).ok();
    }
    v.parse().ok()
}

fn gpu_asks(containers: &[Container]) -> Result<Vec<GpuAsk<'_>>, RequestError> {
    let mut out = Vec::new();
    for c in kubelet_order(containers) {
        let mut count = None;
        for key in COUNT_RESOURCES {
            if let Some(v) = c.resources.get(key) {
                count = Some((key, whole_number(key, v)?));
            }
        }
        let mut mig = 0u64;
        for (key, v) in c.resources.iter().filter(|(k, _)| is_mig_resource(k)) {
            mig = mig
                .checked_add(whole_number(key, v)?)
                .ok_or_else(|| err(key, v, "too large"))?;
        }
        let shares: BTreeMap<&str, (&str, Option<u64>)> = SHARE_RESOURCES
            .iter()
            .filter_map(|k| {
                let v = c.resources.get(*k)?;
                Some((*k, (v.as_str(), share_amount(k, v))))
            })
            .collect();
        if count.is_some() || mig > 0 || !shares.is_empty() {
            out.push(GpuAsk {
                container: c,
                count,
                mig,
                shares,
            });
        }
    }
    Ok(out)
}

/// The containers that ask GPUs, in the kubelet's order, after checking the
/// pod-wide rules (module docs). Containers asking zero GPUs are left out.
pub fn gpu_demands(containers: &[Container]) -> Result<Vec<GpuDemand>, RequestError> {
    let asks = gpu_asks(containers)?;
    check_gpu_rules(&asks)?;
    asks.iter()
        .filter(|a| a.gpus() > 0)
        .map(|a| {
            let gpus = u32::try_from(a.gpus()).map_err(|_| {
                let (key, _) = a.count.unwrap_or((RES_GPU, 0));
                err(key, &a.gpus().to_string(), "too many GPUs")
            })?;
            Ok(GpuDemand {
                name: a.container.name.clone(),
                kind: a.container.kind,
                gpus,
            })
        })
        .collect()
}

fn check_gpu_rules(asks: &[GpuAsk<'_>]) -> Result<(), RequestError> {
    // One resource name for GPU counts in the whole pod.
    let named: Vec<&GpuAsk<'_>> = asks.iter().filter(|a| a.count.is_some()).collect();
    for pair in named.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let ((ka, _), (kb, vb)) = (a.count.unwrap_or_default(), b.count.unwrap_or_default());
        if ka != kb {
            return Err(err(
                kb,
                &vb.to_string(),
                format!(
                    "container {} asks {kb} but container {} asks {ka}: a pod names its GPUs with one resource",
                    b.container.name, a.container.name
                ),
            ));
        }
    }
    for a in asks {
        let both = COUNT_RESOURCES
            .iter()
            .filter(|k| a.container.resources.contains_key(**k))
            .count();
        if both > 1 {
            let v = a
                .container
                .resources
                .get(RES_NVIDIA_GPU)
                .map_or("", String::as_str);
            return Err(err(
                RES_NVIDIA_GPU,
                v,
                format!(
                    "container {} asks both {RES_GPU} and {RES_NVIDIA_GPU}: a pod names its GPUs with one resource",
                    a.container.name
                ),
            ));
        }
    }
    // nvidia.com/gpu devices are whole GPUs: the kubelet counts one pod per device.
    if let Some(a) = asks
        .iter()
        .find(|a| a.count.is_some_and(|(k, _)| k == RES_NVIDIA_GPU) && !a.shares.is_empty())
    {
        let (field, (value, _)) = a
            .shares
            .iter()
            .next()
            .map_or((RES_GPU, ("", None)), |(k, v)| (*k, *v));
        return Err(err(
            field,
            value,
            format!(
                "container {} asks a GPU share of {RES_NVIDIA_GPU}, which stands for whole GPUs: ask {RES_GPU} for a share",
                a.container.name
            ),
        ));
    }
    // Every GPU the pod gets is alike: one per-GPU share for all containers.
    if let Some(first) = asks.first() {
        for other in &asks[1..] {
            if let Some((field, value)) = other.share_difference(first) {
                return Err(err(
                    field,
                    value,
                    format!(
                        "container {} asks {} but container {} asks {}: every container that asks GPUs must ask the same per-GPU share (per-GPU memory and compute cannot be added up)",
                        other.container.name,
                        other.describe_share(),
                        first.container.name,
                        first.describe_share()
                    ),
                ));
            }
        }
    }
    // The kubelet hands GPUs only to containers that ask a device resource.
    let asking: Vec<&GpuAsk<'_>> = asks.iter().filter(|a| a.gpus() > 0).collect();
    if asking.len() > 1
        && let Some(a) = asking.iter().find(|a| a.count.is_none() && a.mig == 0)
    {
        let (field, (value, _)) = a
            .shares
            .iter()
            .next()
            .map_or((RES_GPU, ("", None)), |(k, v)| (*k, *v));
        return Err(err(
            field,
            value,
            format!(
                "container {} asks a GPU share without {RES_GPU}: when several containers ask GPUs, each names how many ({RES_GPU}: N)",
                a.container.name
            ),
        ));
    }
    Ok(())
}

/// Kubernetes' effective request of `amount` over the pod (module docs); `None`
/// when no container has it.
fn effective_amount(
    containers: &[Container],
    field: &str,
    amount: impl Fn(&str) -> Result<u64, RequestError>,
) -> Result<Option<u64>, RequestError> {
    let overflow = |v: &str| err(field, v, "the pod's total is too large (it overflows)");
    let mut seen = false;
    let mut long_running = 0u64;
    let mut sidecars = 0u64;
    let mut init_peak = 0u64;
    for c in containers {
        let (v, raw) = match c.resources.get(field) {
            Some(raw) => {
                seen = true;
                (amount(raw)?, raw.as_str())
            }
            None => (0, ""),
        };
        match c.kind {
            ContainerKind::App => {
                long_running = long_running.checked_add(v).ok_or_else(|| overflow(raw))?;
            }
            ContainerKind::Sidecar => {
                long_running = long_running.checked_add(v).ok_or_else(|| overflow(raw))?;
                sidecars = sidecars.checked_add(v).ok_or_else(|| overflow(raw))?;
                init_peak = init_peak.max(sidecars);
            }
            ContainerKind::Init => {
                let with_sidecars = v.checked_add(sidecars).ok_or_else(|| overflow(raw))?;
                init_peak = init_peak.max(with_sidecars);
            }
        }
    }
    Ok(seen.then_some(long_running.max(init_peak)))
}

/// The pod's effective request as `(resource, quantity)` strings for
/// [`request::parse`]: `cpu` in milli-cores and `memory` in MiB (always
/// present), byte quantities in MiB, integer resources as integers, the per-GPU
/// share resources once (they are the same in every container). A value that
/// is not a number is passed on as written, so the parser names it.
///
/// `containers` is in spec order (init containers and sidecars in their order,
/// app containers anywhere after or among them: only the order of the init
/// sequence matters).
pub fn effective_request(containers: &[Container]) -> Result<Vec<(String, String)>, RequestError> {
    let asks = gpu_asks(containers)?;
    check_gpu_rules(&asks)?;
    let cpu = effective_amount(containers, "cpu", |v| request::parse_cpu_milli("cpu", v))?;
    let memory = effective_amount(containers, "memory", |v| {
        request::parse_memory_mib("memory", v)
    })?;
    let mut out = vec![
        ("cpu".to_string(), format!("{}m", cpu.unwrap_or(0))),
        ("memory".to_string(), format!("{}Mi", memory.unwrap_or(0))),
    ];
    let mut names: Vec<&String> = containers.iter().flat_map(|c| c.resources.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        if name == "cpu" || name == "memory" {
            continue;
        }
        if SHARE_RESOURCES.contains(&name.as_str()) {
            // Checked equal above; the first container that asks GPUs speaks for all.
            let value = asks
                .iter()
                .find_map(|a| a.shares.get(name.as_str()).map(|(v, _)| *v))
                .unwrap_or_default();
            out.push((name.clone(), value.to_string()));
            continue;
        }
        let values = containers.iter().filter_map(|c| c.resources.get(name));
        let total = if is_bytes_resource(name) {
            effective_amount(containers, name, |v| request::parse_memory_mib(name, v))?
                .map(|mib| format!("{mib}Mi"))
        } else if let Some(odd) = values.clone().find(|v| v.trim().parse::<u64>().is_err()) {
            Some(odd.clone())
        } else {
            effective_amount(containers, name, |v| whole_number(name, v))?.map(|n| n.to_string())
        };
        if let Some(total) = total {
            out.push((name.clone(), total));
        }
    }
    Ok(out)
}

mod assign;
pub use assign::{AssignError, assign};

#[cfg(test)]
mod tests;
