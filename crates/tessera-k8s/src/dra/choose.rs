//! Which of the feasible devices a request takes: Tessera's policy, not first fit.
//!
//! The same mapping as the simulator's `dra` experiment: the node's whole GPUs
//! of `gpu.tessera.io` become a core [`Node`], what claims hold of them its
//! [`NodeUse`] (a dedicated allocation or an allocated MIG partition holds the
//! GPU whole; shares take the memory and compute they consumed), and the
//! request a core [`Request`] (whole GPUs, or shares of the consumed memory and
//! compute). The allocator has already decided which devices may be taken
//! (selectors, availability, constraints): those are the [`Fit`]'s usable GPUs,
//! and the policy picks among them and scores the node, as it does for pods.
//!
//! Partitionable MIG placements go through the core's MIG layout instead
//! ([`super::mig`]): the placement the device-plugin path would pick for the
//! profile, scored by its rank there (an existing instance before one to
//! create, one [`TIER_SCORE`] apart as on the device-plugin path; then the
//! compute the layout strands and leaves free, in milli-GPU), so that nodes
//! rank by MIG layout as GPUs do. Only devices the core cannot model (other
//! drivers' devices, MIG devices of unknown models or without counters) are
//! packed: the candidate whose counter set has least left first, so they fill
//! one counter set before touching the next. A packed pick's layout is
//! unknown: it scores only its tier (a MIG device of ours without a `uuid` is
//! an instance to create), other drivers' devices 0. Neither asks the policy.

use std::collections::BTreeMap;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use smallvec::SmallVec;
use tessera_core::fit::mig_layout::TIER_SCORE;
use tessera_core::fit::{Fit, GpuSet, NodeView};
use tessera_core::ledger::{GpuSummary, GpuUse, NodeUse};
use tessera_core::model::{Architecture, Catalog, GpuSpec, Link, ModelId, Node};
use tessera_core::policy::Policy;
use tessera_core::request::{GpuAsk, GpuMemory, Request};

use super::DRIVER;
use super::cel::AttrValue;
use super::inventory::{NodeDevice, NodeInventory, UseOf};
use super::quantity::Quantity;

const MIB_NANO: i128 = (1 << 20) * 1_000_000_000;
/// Host resources of a node nobody told us about: plenty, asked none.
const HOST_PLENTY: u64 = 1 << 40;

/// The node's CPU and memory (capacity, and what is left before the pod) and
/// what the pod asks of them, for the policy's view of the node: the
/// fragmentation Tessera's policy measures counts the GPUs a node's CPU or
/// memory strands, as FGD's does, so a node's score depends on them. The
/// allocator does not check them (the host fit did).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub free_cpu_milli: u64,
    pub free_memory_mib: u64,
    /// What the pod asks (its first claim to allocate carries it; later ones
    /// see it taken).
    pub ask_cpu_milli: u64,
    pub ask_memory_mib: u64,
}

impl Host {
    /// Nothing known of the node's host resources: plenty, and the pod asks none.
    pub const PLENTY: Host = Host {
        cpu_milli: HOST_PLENTY,
        memory_mib: HOST_PLENTY,
        free_cpu_milli: HOST_PLENTY,
        free_memory_mib: HOST_PLENTY,
        ask_cpu_milli: 0,
        ask_memory_mib: 0,
    };

    /// The same node once the pod's ask is taken (for its later claims).
    pub fn after_ask(self) -> Host {
        Host {
            free_cpu_milli: self.free_cpu_milli.saturating_sub(self.ask_cpu_milli),
            free_memory_mib: self.free_memory_mib.saturating_sub(self.ask_memory_mib),
            ask_cpu_milli: 0,
            ask_memory_mib: 0,
            ..self
        }
    }
}

/// A whole GPU of our driver: the core can model it.
fn is_whole_gpu(d: &NodeDevice) -> bool {
    d.key.driver == DRIVER
        && d.attributes.get("type") == Some(&AttrValue::String("gpu".into()))
        && d.capacity.contains_key("memory")
}

/// A quantity in whole MiB (rounded down; 0 when negative or too large).
pub(super) fn mib(q: Quantity) -> u64 {
    u64::try_from(q.nano() / MIB_NANO).unwrap_or(0)
}

fn int_attr(d: &NodeDevice, name: &str) -> Option<i64> {
    match d.attributes.get(name) {
        Some(AttrValue::Int(i)) => Some(*i),
        _ => None,
    }
}

/// Compute a share takes, in per-mille of the GPU: its `compute` capacity
/// (published as per-mille), else its memory's part of the GPU.
fn cores_milli(d: &NodeDevice, consumed: &BTreeMap<String, Quantity>) -> u32 {
    let memory = d.capacity.get("memory").map_or(Quantity::ZERO, |c| c.value);
    let milli = match (consumed.get("compute"), d.capacity.get("compute")) {
        (Some(c), Some(total)) if total.value.nano() > 0 => c.nano() * 1000 / total.value.nano(),
        _ => match consumed.get("memory") {
            Some(m) if memory.nano() > 0 => m.nano() * 1000 / memory.nano(),
            _ => 1000,
        },
    };
    u32::try_from(milli.clamp(0, 1000)).unwrap_or(1000)
}

/// The core's model of the node's whole GPUs: the node, its use, and the
/// device index of each GPU position.
fn core_node(
    inv: &NodeInventory,
    state: &dyn UseOf,
    host: Host,
) -> (Catalog, Node, NodeUse, Vec<usize>) {
    let mut catalog = Catalog::default();
    let mut whole: Vec<usize> = (0..inv.devices.len())
        .filter(|&i| is_whole_gpu(&inv.devices[i]))
        .collect();
    whole.sort_by_key(|&i| {
        (
            int_attr(&inv.devices[i], "index"),
            inv.devices[i].key.clone(),
        )
    });
    let fallback = ModelId(0);
    let mut node = Node::uniform(
        inv.node.clone(),
        host.cpu_milli,
        host.memory_mib,
        fallback,
        0,
    );
    let template = Node::uniform("", 0, 0, fallback, 1).gpus;
    let mut gpus = SmallVec::new();
    let mut allocations = 0u32;
    for &i in &whole {
        let d = &inv.devices[i];
        let memory_mib = d.capacity.get("memory").map_or(0, |c| mib(c.value));
        let name = |k: &str| match d.attributes.get(k) {
            Some(AttrValue::String(s)) => s.clone(),
            _ => String::new(),
        };
        let model = catalog
            .find_product(&name("model"), memory_mib)
            .or_else(|| catalog.find_product(&name("productName"), memory_mib))
            .or_else(|| {
                catalog
                    .add(GpuSpec {
                        name: format!("dra-{}", name("model")),
                        aliases: Vec::new(),
                        memory_mib,
                        sm_count: 0,
                        architecture: Architecture::Unknown,
                        mig: None,
                    })
                    .ok()
            })
            .unwrap_or(fallback);
        let mut g = template[0].clone();
        g.index = int_attr(d, "index")
            .and_then(|x| u32::try_from(x).ok())
            .unwrap_or(0);
        g.uuid = name("uuid");
        g.model = model;
        g.numa = int_attr(d, "numa").and_then(|x| u8::try_from(x).ok());
        node.gpus.push(g);
        let u = state.use_of(i);
        allocations += u.allocations;
        let idle = GpuUse::idle(memory_mib);
        let gu = if u.allocations == 0 && !state.counters_touched(i) {
            idle
        } else if d.shared {
            let used_mem = u.consumed.get("memory").map_or(0, |q| mib(*q));
            GpuUse {
                free_memory_mib: memory_mib.saturating_sub(used_mem),
                free_cores_milli: 1000 - cores_milli(d, &u.consumed).min(1000),
                tenants: u16::try_from(u.allocations.max(1)).unwrap_or(u16::MAX),
                ..idle
            }
        } else {
            GpuUse {
                free_memory_mib: 0,
                free_cores_milli: 0,
                tenants: 1,
                exclusive: true,
                ..idle
            }
        };
        gpus.push(gu);
    }
    // GPUs of one NVLink island (same `nvlinkDomain`) are linked.
    let n = whole.len();
    let domains: Vec<Option<i64>> = whole
        .iter()
        .map(|&i| int_attr(&inv.devices[i], "nvlinkDomain"))
        .collect();
    if domains.iter().any(Option::is_some) {
        node.links = (0..n * n)
            .map(|k| match (domains[k / n], domains[k % n]) {
                (Some(a), Some(b)) if a == b && k / n != k % n => Link::NvLink(1),
                _ => Link::Unknown,
            })
            .collect();
    }
    let summary = GpuSummary {
        idle_gpus: u8::try_from(gpus.iter().filter(|g: &&GpuUse| g.is_idle()).count())
            .unwrap_or(u8::MAX),
        max_free_cores_milli: gpus
            .iter()
            .map(|g: &GpuUse| g.free_cores_milli)
            .max()
            .unwrap_or(0),
        max_free_memory_mib: gpus
            .iter()
            .map(|g: &GpuUse| g.free_memory_mib)
            .max()
            .unwrap_or(0),
    };
    let used = NodeUse {
        free_cpu_milli: host.free_cpu_milli,
        free_memory_mib: host.free_memory_mib,
        gpus,
        classes: SmallVec::new(),
        allocations,
        summary,
    };
    (catalog, node, used, whole)
}

/// Picks `need` of `candidates` (device indices, all feasible) and scores the
/// pick; `consumed` is what one device would consume (empty: taken whole),
/// `host` the node's CPU and memory and the pod's ask of them.
/// `None` when the policy declines the node.
pub fn choose(
    policy: &dyn Policy,
    inv: &NodeInventory,
    state: &dyn UseOf,
    candidates: &[usize],
    need: u32,
    consumed: &BTreeMap<String, Quantity>,
    host: Host,
) -> Option<(Vec<usize>, f64)> {
    let need_n = need as usize;
    if candidates.len() < need_n {
        return None;
    }
    if !candidates.iter().all(|&i| is_whole_gpu(&inv.devices[i])) {
        let (picked, score) = super::mig::choose_placements(inv, state, candidates, need_n)
            .unwrap_or_else(|| {
                let picked = pack(state, candidates, need_n);
                let score = picked.iter().map(|&i| packed_score(&inv.devices[i])).sum();
                (picked, score)
            });
        return (picked.len() == need_n).then_some((picked, score));
    }
    let (catalog, node, used, whole) = core_node(inv, state, host);
    let pos = |i: usize| whole.iter().position(|&w| w == i);
    let usable: GpuSet = candidates
        .iter()
        .filter_map(|&i| pos(i))
        .filter_map(|p| u8::try_from(p).ok())
        .collect();
    let first = &inv.devices[candidates[0]];
    let memory = first
        .capacity
        .get("memory")
        .map_or(Quantity::ZERO, |c| c.value);
    let share_memory = consumed.get("memory").copied();
    let cores = cores_milli(first, consumed);
    let gpu = if consumed.is_empty() || (cores >= 1000 && share_memory.is_none_or(|m| m >= memory))
    {
        GpuAsk::Whole { count: need }
    } else {
        GpuAsk::Shared {
            count: need,
            memory: GpuMemory::Mib(share_memory.map_or(0, mib)),
            cores_milli: cores,
        }
    };
    let req = Request {
        gpu,
        cpu_milli: host.ask_cpu_milli,
        memory_mib: host.ask_memory_mib,
        ..Request::default()
    };
    let view = NodeView {
        node: &node,
        used: &used,
        catalog: &catalog,
    };
    let fit = Fit { usable, need };
    // Policies that draw (random) get a fixed seed: the same snapshot, the same pick.
    let mut rng = SmallRng::seed_from_u64(0);
    let scored = policy.score(view, &req, &fit, &mut rng)?;
    let mut picked: Vec<usize> = scored
        .gpus
        .iter()
        .filter(|p| fit.usable.contains(p))
        .map(|&p| whole[p as usize])
        .collect();
    picked.sort_unstable();
    picked.dedup();
    // A policy answer outside the usable set would break the allocator's checks.
    (picked.len() == need_n).then_some((picked, scored.score))
}

/// A packed pick's score: the tier of a MIG device of ours (an instance exists
/// once it has a `uuid`), as [`super::mig`] scores it, without the layout it
/// cannot read; 0 for other drivers' devices.
fn packed_score(d: &NodeDevice) -> f64 {
    let ours_to_create = d.key.driver == DRIVER
        && d.attributes.get("type") == Some(&AttrValue::String("mig".into()))
        && !d.attributes.contains_key("uuid");
    if ours_to_create { -TIER_SCORE } else { 0.0 }
}

/// Packing for devices the core does not model: least counter room left first,
/// then publication order.
fn pack(state: &dyn UseOf, candidates: &[usize], need: usize) -> Vec<usize> {
    let mut c = candidates.to_vec();
    c.sort_by_key(|&i| (state.counters_left(i), i));
    c.truncate(need);
    c
}
