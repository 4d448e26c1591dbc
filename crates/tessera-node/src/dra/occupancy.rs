//! The last line against two allocators (issue 41, defect 2): what each claim
//! prepared on this node holds of its GPUs, and the refusal to prepare a claim
//! whose devices are already held beyond what they allow.
//!
//! Allocation is the scheduler's business, but when two allocators write claims
//! for the same devices (kube-scheduler's DRA plugin and Tessera `--dra`, each
//! blind to the other's in-flight writes), the API server accepts both claims.
//! The driver is the one place both meet, so before it sets anything up it
//! checks the claim against every other claim it prepared and has not
//! unprepared: a whole GPU is held by one claim, MIG placements by one claim
//! each and never overlapping memory slices, and the shares of a GPU together
//! within its memory and its 1000 per-mille of compute. A claim that breaks
//! that fails `NodePrepareResources` with the holder named, so its pod never
//! starts on a device another pod was given.
//!
//! Pure: [`holds`] reads a claim's resolved results, [`check`] the records.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use tessera_core::model::spec::Catalog;

use super::plan::Want;
use super::prepare::{AllocationResult, find_device, quantity_count, quantity_mib};
use super::records::{PreparedClaim, Records};
use crate::backend::GpuInfo;
use crate::deviceplugin::NodeView;

/// Per-mille of a GPU's compute: the whole GPU.
pub const FULL_COMPUTE: u64 = 1000;

/// What one prepared device holds of its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Footprint {
    /// The whole GPU, exclusively.
    Whole,
    /// A MIG placement's memory slices (bit `i`: slice `i`).
    Slices { mask: u8 },
    /// A MIG instance whose placement is not known: held exclusively.
    Instance { uuid: String },
    /// A share: memory and per-mille of compute, beside other shares.
    #[serde(rename_all = "camelCase")]
    Share { memory_mib: u64, compute: u64 },
}

/// A device of a prepared claim and what it holds of which GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    pub device: String,
    /// The GPU's UUID.
    pub gpu: String,
    pub footprint: Footprint,
}

/// The memory slices of `profile` at `start` on `gpu`, if the catalog knows them.
fn slices(gpu: &GpuInfo, profile: &str, start: u8, catalog: &Catalog) -> Option<u8> {
    let id = catalog.find(gpu.model.as_deref()?)?;
    let geo = catalog.spec(id).mig.as_ref()?;
    let (_, p) = geo.profile(profile)?;
    geo.placement_mask(p, start)
}

/// The footprint of an existing MIG instance of `gpu`.
fn instance(gpu: Option<&GpuInfo>, mig_uuid: &str, catalog: &Catalog) -> Footprint {
    gpu.and_then(|g| {
        let m = g.mig_instances.iter().find(|m| m.uuid == mig_uuid)?;
        slices(g, &m.profile, m.start?, catalog)
    })
    .map_or_else(
        || Footprint::Instance {
            uuid: mig_uuid.to_string(),
        },
        |mask| Footprint::Slices { mask },
    )
}

/// What each of a claim's resolved results holds. A share's consumed capacity
/// defaults to the device's (as the API server's request policy does); one that
/// does not read is an error, never a share of nothing.
pub fn holds(wants: &[(&AllocationResult, Want)], view: &NodeView) -> Result<Vec<Hold>, String> {
    let catalog = Catalog::default();
    let mut out = Vec::with_capacity(wants.len());
    for (r, want) in wants {
        let (uuid, footprint) = match want {
            Want::Create(p) => {
                let mask = view
                    .gpu(&p.gpu_uuid)
                    .and_then(|g| slices(g, &p.profile, p.start, &catalog))
                    .ok_or_else(|| {
                        format!(
                            "device {}: no MIG geometry for {} at slice {}",
                            r.device, p.profile, p.start
                        )
                    })?;
                (p.gpu_uuid.clone(), Footprint::Slices { mask })
            }
            Want::Ready(t) => {
                let g = view.gpu(&t.gpu_uuid);
                let footprint = match (&t.mig_uuid, &r.share_id) {
                    (Some(m), _) => instance(g, m, &catalog),
                    (None, Some(_)) => share(r, g)?,
                    (None, None) => Footprint::Whole,
                };
                (t.gpu_uuid.clone(), footprint)
            }
        };
        out.push(Hold {
            device: r.device.clone(),
            gpu: uuid,
            footprint,
        });
    }
    Ok(out)
}

fn share(r: &AllocationResult, g: Option<&GpuInfo>) -> Result<Footprint, String> {
    let bad = |name: &str, q: &str| {
        format!(
            "device {}: consumed capacity {name}={q:?} does not read",
            r.device
        )
    };
    let memory_mib = match r.consumed_capacity.get("memory") {
        Some(q) => quantity_mib(q).ok_or_else(|| bad("memory", q))?,
        None => g.map_or(u64::MAX, |g| g.memory_mib),
    };
    let compute = match r.consumed_capacity.get("compute") {
        Some(q) => quantity_count(q).ok_or_else(|| bad("compute", q))?,
        None => FULL_COMPUTE,
    };
    Ok(Footprint::Share {
        memory_mib,
        compute,
    })
}

/// What a recorded claim holds. A record written before holdings were kept
/// names devices only: each is taken as the GPU or MIG instance the name means
/// now, a whole GPU held whole (so it may refuse a share beside an old share
/// until that claim is unprepared, never admit one over a whole GPU).
pub fn recorded(claim: &PreparedClaim, view: &NodeView) -> Vec<Hold> {
    if !claim.holds.is_empty() {
        return claim.holds.clone();
    }
    let catalog = Catalog::default();
    claim
        .devices
        .iter()
        .filter_map(|d| {
            let t = find_device(&view.gpus, d)?;
            let footprint = match &t.mig_uuid {
                Some(m) => instance(view.gpu(&t.gpu_uuid), m, &catalog),
                None => Footprint::Whole,
            };
            Some(Hold {
                device: d.clone(),
                gpu: t.gpu_uuid,
                footprint,
            })
        })
        .collect()
}

/// Whether two holdings of one GPU by two claims exclude each other (shares
/// beside shares are summed by [`check`] instead).
fn exclusive(a: &Footprint, b: &Footprint) -> bool {
    use Footprint::*;
    match (a, b) {
        (Share { .. }, Share { .. }) => false,
        (Slices { mask: x }, Slices { mask: y }) => x & y != 0,
        (Instance { uuid: x }, Instance { uuid: y }) => x == y,
        // A whole GPU, or a share beside a MIG instance, or placements
        // that cannot be compared: never together.
        _ => true,
    }
}

/// Refuses `new` (the holdings of claim `uid`) where another prepared claim
/// holds the same GPU beyond what it allows, naming the holder.
pub fn check(records: &Records, uid: &str, new: &[Hold], view: &NodeView) -> Result<(), String> {
    let others: Vec<(&str, &PreparedClaim, Vec<Hold>)> = records
        .claims
        .iter()
        .filter(|(u, _)| u.as_str() != uid)
        .map(|(u, c)| (u.as_str(), c, recorded(c, view)))
        .collect();
    let holder = |u: &str, c: &PreparedClaim| {
        if c.name.is_empty() {
            format!("claim UID {u}")
        } else {
            format!("claim {}/{} (UID {u})", c.namespace, c.name)
        }
    };
    for h in new {
        for (u, c, held) in &others {
            if let Some(o) = held
                .iter()
                .find(|o| o.gpu == h.gpu && exclusive(&h.footprint, &o.footprint))
            {
                return Err(format!(
                    "device {} (GPU {}) is already prepared for {} as {}: two allocations of one device",
                    h.device,
                    h.gpu,
                    holder(u, c),
                    o.device
                ));
            }
        }
    }
    // Shares of each GPU, this claim's and the others', within the GPU.
    let shared: BTreeSet<&str> = new
        .iter()
        .filter(|h| matches!(h.footprint, Footprint::Share { .. }))
        .map(|h| h.gpu.as_str())
        .collect();
    for g in shared {
        let all = new
            .iter()
            .chain(others.iter().flat_map(|(_, _, held)| held.iter()))
            .filter(|h| h.gpu == g);
        let (mut memory, mut compute) = (0u64, 0u64);
        for h in all {
            if let Footprint::Share {
                memory_mib,
                compute: c,
            } = h.footprint
            {
                memory = memory.saturating_add(memory_mib);
                compute = compute.saturating_add(c);
            }
        }
        let total = view.gpu(g).map_or(0, |g| g.memory_mib);
        if memory > total || compute > FULL_COMPUTE {
            return Err(format!(
                "the shares prepared on GPU {g} would hold {memory} MiB of {total} and {compute} of {FULL_COMPUTE} per-mille of compute with this claim: more than the GPU has"
            ));
        }
    }
    Ok(())
}
