//! Which partitionable MIG placement a request takes: the core's MIG layout,
//! not counter packing.
//!
//! With `partitionable-mig` the node agent publishes every placement a GPU in
//! MIG mode allows as a device `gpu-<index>-mig-<profile>-<start>` (`type`
//! `mig`, `profile`, `parentIndex`, `uuid` once the instance exists) that
//! consumes the GPU's counter set: `compute-slices` and one `memory-slice-<k>`
//! per memory slice it covers (`tessera-node`'s `dra::slice`). The counters say
//! which placements still fit, not which one to take: two free placements of a
//! profile can leave very different room behind (a `3g.40gb` at memory slice 0
//! rules out the GPU's only `4g.40gb` placement, one at slice 4 does not).
//!
//! So each placement is mapped back to (GPU, profile, start), each GPU's held
//! layout is rebuilt from the placements other claims (and this claim's picks)
//! hold, and the placement is ranked as the core ranks an explicit MIG profile
//! on the device-plugin path (`tessera_core::fit::mig_layout`): a free instance
//! that already exists first; else one to create on the GPU and at the start
//! that strand the least free compute ([`leftover`]), on the GPU with least
//! free compute left (a GPU already partly used before an untouched one), then
//! the start that keeps the largest instance possible, then the lowest start
//! (`best_start`'s order). Where the core would let the policy break a tie
//! between GPUs, the lowest `parentIndex` wins: the policies do not tell MIG
//! GPUs of one node apart beyond this rank.
//!
//! A device that does not map (another driver's, a model the catalog does not
//! know, a profile or start outside its table, counters that disagree with the
//! table, MIG instances published without counters) makes the caller fall back
//! to counter packing for that request: the layout of its GPU is then unknown.
//!
//! Between nodes the same rank decides, through the score each pick adds to
//! the node's allocation (`score`); the node with the highest sum over the
//! pod's claims wins ([`super::place`]). A pick is worth
//!
//! ```text
//! score = −(tier · TIER_SCORE + (stranded + free / (C + 1)) · 1000 / C)
//! tier  = 0 for a free instance that exists, 1 for one to create
//! ```
//!
//! with `stranded` and `free` the compute slices the core's
//! [`leftover`] leaves on the pick's GPU and `C` the GPU's compute slices.
//! The tier is weighed as the device-plugin path weighs it
//! ([`tessera_core::fit::mig_layout::hard_rank_penalty`]: reuse, then create
//! on a GPU in MIG mode, one [`TIER_SCORE`] apart), so an existing instance on
//! any node beats a creation on every other, whatever the policy says of the
//! pod's other claims. Within a tier the device-plugin path leaves nodes to
//! the policy, which sees a MIG ask as 0 milli-GPU and cannot tell layouts
//! apart; here the layout orders nodes as it orders GPUs. It is in milli-GPU
//! of the GPU's compute, the unit of Tessera's default policy's fragment
//! score: the compute the layout strands is fragment, and the free compute
//! left, at less than a slice in all, only orders GPUs that strand alike (a
//! partly used GPU before an untouched one). So the score orders placements
//! as the rank does, and a pod whose claims mix MIG placements with whole
//! GPUs or shares sums one number per node: the MIG tiers first, then the
//! layout and the policy's scores of the other picks on a common milli-GPU
//! scale (other policies score on smaller scales, where the layout weighs
//! more). The score never refuses a node: a claim that fits on one node only
//! goes there.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use tessera_core::fit::mig_layout::{Held, TIER_SCORE, leftover};
use tessera_core::model::{Catalog, MigGeometry};

use super::DRIVER;
use super::cel::AttrValue;
use super::inventory::{NodeDevice, NodeInventory, UseOf};
use super::quantity::Quantity;

/// A GPU's counter set: `(driver, pool, counter set)`. Placements consuming
/// one set are instances of one GPU.
type SetKey = (String, String, String);

/// A placement device read back as the core's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The GPU: the counter set its placements share.
    pub gpu: SetKey,
    /// `parentIndex`, for ties between GPUs.
    pub parent_index: i64,
    /// Profile index in the model's geometry.
    pub profile: usize,
    /// First memory slice.
    pub start: u8,
    /// Memory slices it covers (bit k = `memory-slice-<k>`).
    pub mask: u8,
    /// The instance exists (the device has a `uuid`).
    pub exists: bool,
}

fn string_attr<'a>(d: &'a NodeDevice, name: &str) -> Option<&'a str> {
    match d.attributes.get(name) {
        Some(AttrValue::String(s)) => Some(s),
        _ => None,
    }
}

/// The geometry of the model a MIG device's GPU is, by the same names the
/// node agent looks the model up by (`model`, else `productName`).
fn geometry<'c>(catalog: &'c Catalog, d: &NodeDevice) -> Option<&'c MigGeometry> {
    let id = string_attr(d, "model")
        .and_then(|m| catalog.find(m))
        .or_else(|| string_attr(d, "productName").and_then(|p| catalog.find(p)))?;
    catalog.spec(id).mig.as_ref()
}

/// Device `d` as a placement of the core's geometry, when its attributes and
/// counters say exactly that: one counter set, the profile's compute slices,
/// and the memory slices of a start the profile allows.
pub fn placement(catalog: &Catalog, d: &NodeDevice) -> Option<Placement> {
    if d.key.driver != DRIVER || string_attr(d, "type") != Some("mig") || d.consumes.len() != 1 {
        return None;
    }
    let geo = geometry(catalog, d)?;
    let (pi, p) = geo.profile(string_attr(d, "profile")?)?;
    let (set, counters) = d.consumes.iter().next()?;
    let one = Quantity::from_nano(1_000_000_000);
    let mut mask = 0u8;
    let mut compute = None;
    for (name, q) in counters {
        if name == "compute-slices" {
            compute = Some(*q);
        } else {
            let k: u8 = name.strip_prefix("memory-slice-")?.parse().ok()?;
            if k >= 8 || *q != one {
                return None;
            }
            mask |= 1 << k;
        }
    }
    let want = Quantity::from_nano(i128::from(p.compute_slices) * 1_000_000_000);
    if compute != Some(want) || mask == 0 {
        return None;
    }
    let start = u8::try_from(mask.trailing_zeros()).ok()?;
    if geo.placement_mask(p, start) != Some(mask) {
        return None;
    }
    let parent_index = match d.attributes.get("parentIndex") {
        Some(AttrValue::Int(i)) => *i,
        _ => return None,
    };
    Some(Placement {
        gpu: (d.key.driver.clone(), d.key.pool.clone(), set.clone()),
        parent_index,
        profile: pi,
        start,
        mask,
        exists: string_attr(d, "uuid").is_some(),
    })
}

fn with(mut held: Held, geo: &MigGeometry, p: &Placement) -> Held {
    held.mask |= p.mask;
    held.compute = held
        .compute
        .saturating_add(geo.profiles[p.profile].compute_slices);
    if let Some(n) = held.counts.get_mut(p.profile) {
        *n = n.saturating_add(1);
    }
    held
}

/// Lower is better (see the module doc): an existing instance; else stranded
/// free compute, free compute left, largest instance still possible, start.
type Rank = (u8, u8, u8, Reverse<u8>, u8, i64);

/// `None` when `p` does not fit on `held` (the caller filters those first).
fn rank(geo: &MigGeometry, held: Held, p: &Placement) -> Option<Rank> {
    if p.exists {
        return Some((0, 0, 0, Reverse(0), p.start, p.parent_index));
    }
    let l = leftover(geo, held, p.profile, p.start)?;
    Some((
        1,
        l.stranded,
        l.free,
        Reverse(l.largest),
        p.start,
        p.parent_index,
    ))
}

/// What a pick of rank `r` adds to its node's score (see the module doc):
/// higher for every pick the rank puts first, between GPUs and nodes.
fn score(geo: &MigGeometry, r: &Rank) -> f64 {
    let slices = f64::from(geo.compute_slices.max(1));
    let (tier, stranded, free) = (f64::from(r.0), f64::from(r.1), f64::from(r.2));
    -(tier * TIER_SCORE + (stranded + free / (slices + 1.0)) * 1000.0 / slices)
}

/// Picks up to `need` of `candidates` (feasible by the counters), one at a
/// time, each the best-ranked placement given the layouts so far, and the sum
/// of the picks' `score`s. `None` when a candidate, or a held placement on a
/// candidate's GPU, does not map: the caller packs instead. Fewer than `need`
/// when the picks would overlap.
pub fn choose_placements(
    inv: &NodeInventory,
    state: &dyn UseOf,
    candidates: &[usize],
    need: usize,
) -> Option<(Vec<usize>, f64)> {
    let catalog = Catalog::default();
    let mut cands: Vec<(usize, Placement)> = Vec::with_capacity(candidates.len());
    for &i in candidates {
        cands.push((i, placement(&catalog, &inv.devices[i])?));
    }
    let mut layouts: BTreeMap<SetKey, (&MigGeometry, Held)> = BTreeMap::new();
    for &(i, ref p) in &cands {
        let geo = geometry(&catalog, &inv.devices[i])?;
        layouts
            .entry(p.gpu.clone())
            .or_insert((geo, Held::default()));
    }
    // What is held of each candidate GPU, from the placements allocated on it.
    for (i, d) in inv.devices.iter().enumerate() {
        let on_candidate_gpu = d.consumes.keys().any(|set| {
            layouts.contains_key(&(d.key.driver.clone(), d.key.pool.clone(), set.clone()))
        });
        if !on_candidate_gpu || state.use_of(i).allocations == 0 {
            continue;
        }
        let p = placement(&catalog, d)?;
        let (geo, held) = layouts.get_mut(&p.gpu)?;
        *held = with(*held, geo, &p);
    }
    let mut picked = Vec::with_capacity(need);
    let mut total = 0.0;
    for _ in 0..need {
        let best = cands
            .iter()
            .filter(|(i, _)| !picked.contains(i))
            .filter_map(|(i, p)| {
                let (geo, held) = layouts.get(&p.gpu)?;
                held.room_for(geo, p.profile, p.start)?;
                Some((rank(geo, *held, p)?, *i, p))
            })
            .min_by_key(|(r, i, _)| (*r, *i));
        let Some((r, i, p)) = best else { break };
        if let Some((geo, held)) = layouts.get_mut(&p.gpu) {
            total += score(geo, &r);
            *held = with(*held, geo, p);
        }
        picked.push(i);
    }
    Some((picked, total))
}

#[cfg(test)]
mod tests;
