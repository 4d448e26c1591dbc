//! GPUs that allocated ResourceClaims hold, on nodes whose `GpuNode` still
//! lists them (issue 41: one ledger for grants and claims). A node moved from
//! the device plugin to DRA without draining, or one whose old `GpuNode` has
//! not expired yet, is in both worlds for a while; the DRA side already counts
//! the `tessera.io` grants there as holdings of the devices
//! ([`crate::dra::inventory::grant_holdings`]), and this is the other way
//! round: each GPU a claim holds is counted in the ledger, the whole GPU for a
//! whole (or MIG) device, the share's memory and compute for a share, so no
//! `tessera.io` pod is granted it a second time. A holding the ledger cannot
//! take (it does not fit what grants hold already) blocks the node, as a
//! foreign holding does ([`super::foreign`]). On a node serving MIG instances
//! as GPUs (the device plugin's single strategy), a claim on a physical GPU
//! holds each of its instances whole.
//!
//! The standalone loop tells the mirror what claims hold once per pass and per
//! DRA decision ([`Mirror::set_claims_on_gpus`]); a change that touches a GPU
//! the cluster lists makes the next read rebuild the ledger (rare: only nodes
//! in both worlds). These placements belong to no pod: they are never
//! preemption victims here, and the DRA side skips them when it reads grants
//! ([`Mirror::grants`]).

use tessera_core::holdings::GpuHold;
use tessera_core::ledger::AllocId;
use tessera_core::placement::{GpuGrant, Placement};
use tessera_core::{Cluster, NodeId};

use super::{Block, Mirror};

impl Mirror {
    /// What allocated claims hold of GPUs, as of now; the ledger counts it at
    /// the next read when it touches a GPU the cluster lists.
    pub fn set_claims_on_gpus(&mut self, mut holds: Vec<GpuHold>) {
        holds.sort();
        holds.dedup();
        if holds == self.claims_on_gpus {
            return;
        }
        let listed = |h: &&GpuHold| {
            !gpus_of(&self.cluster, self.inventory.get(&h.node), &h.node, &h.uuid).is_empty()
        };
        let before: Vec<&GpuHold> = self.claims_on_gpus.iter().filter(listed).collect();
        let after: Vec<&GpuHold> = holds.iter().filter(listed).collect();
        if before != after {
            self.dirty = true;
            // Room may have been freed.
            self.released += 1;
        }
        self.claims_on_gpus = holds;
    }

    /// Counts what claims hold in the ledger. Part of a rebuild, after every
    /// grant and foreign holding.
    pub(super) fn count_claims_on_gpus(&mut self) {
        self.claim_allocs.clear();
        // Per GPU: held whole by some claim, or the shares.
        let mut whole: Vec<(NodeId, u8, &GpuHold)> = Vec::new();
        let mut shares: Vec<(NodeId, u8, &GpuHold, u64, u32)> = Vec::new();
        for h in &self.claims_on_gpus {
            let at = gpus_of(&self.cluster, self.inventory.get(&h.node), &h.node, &h.uuid);
            for (id, pos) in at {
                // A share of a GPU in MIG mode, or served as MIG instances,
                // holds it whole.
                let g = &self.cluster.node(id).gpus[usize::from(pos)];
                let mig = g.mig_instance || g.mig_enabled;
                match h.share.filter(|_| !mig) {
                    Some((mib, milli)) => shares.push((id, pos, h, mib, milli)),
                    None if !whole.iter().any(|(i, p, _)| (*i, *p) == (id, pos)) => {
                        whole.push((id, pos, h))
                    }
                    None => {}
                }
            }
        }
        let mut placements: Vec<(NodeId, GpuGrant, &GpuHold)> = Vec::new();
        let mut blocks: Vec<(NodeId, Block)> = Vec::new();
        for (id, pos, h) in &whole {
            match super::foreign::held_whole(&self.cluster, *id, *pos) {
                Some(g) => placements.push((*id, g, h)),
                None => blocks.push((
                    *id,
                    Block::HeldTwice {
                        pod: format!("claim {}", h.consumer),
                        uuid: h.uuid.clone(),
                        why: "in MIG mode, with no MIG profile spanning the whole GPU".into(),
                    },
                )),
            }
        }
        for (id, pos, h, mib, milli) in shares {
            // A GPU a claim holds whole is counted whole once.
            if whole.iter().any(|(i, p, _)| (*i, *p) == (id, pos)) {
                continue;
            }
            placements.push((id, GpuGrant::shared(pos, mib, milli.clamp(1, 1000)), h));
        }
        for (id, grant, h) in placements {
            let p = Placement {
                node: id,
                grants: [grant].into_iter().collect(),
                ..Placement::default()
            };
            match self.ledger.apply_existing(&self.cluster, &p) {
                Ok(alloc) => {
                    self.claim_allocs.insert(alloc);
                }
                Err(e) => blocks.push((
                    id,
                    Block::HeldTwice {
                        pod: format!("claim {}", h.consumer),
                        uuid: h.uuid.clone(),
                        why: e.to_string(),
                    },
                )),
            }
        }
        for (id, block) in blocks {
            self.node_problems.push(block.to_string());
            self.blocked.entry(id).or_insert(block);
        }
    }

    /// The cluster and the ledger's `tessera.io` grants: every allocation but
    /// those counting what claims hold (which the DRA side reads from the
    /// claims themselves).
    pub fn grants(&mut self) -> (&Cluster, impl Iterator<Item = (AllocId, &Placement)>) {
        self.refresh();
        let skip = &self.claim_allocs;
        let grants = self
            .ledger
            .allocations()
            .filter(move |(id, _)| !skip.contains(id));
        (&self.cluster, grants)
    }
}

/// The GPUs of node `node` that the GPU of UUID `uuid` is in `cluster`: its
/// node id and position, or on a node serving MIG instances as GPUs (the
/// device plugin's single strategy) the positions of its instances, by the
/// node's inventory `gn`.
fn gpus_of(
    cluster: &Cluster,
    gn: Option<&tessera_api::GpuNode>,
    node: &str,
    uuid: &str,
) -> Vec<(NodeId, u8)> {
    let Some(id) = cluster.node_id(node) else {
        return Vec::new();
    };
    let gpus = &cluster.node(id).gpus;
    let at = |pos: usize| u8::try_from(pos).ok().map(|p| (id, p));
    if let Some(pos) = gpus.iter().position(|g| g.uuid == uuid && !g.mig_instance) {
        return at(pos).into_iter().collect();
    }
    let Some(gn) = gn else {
        return Vec::new();
    };
    gpus.iter()
        .enumerate()
        .filter(|(_, g)| g.mig_instance && super::foreign::parent_of(gn, &g.uuid) == Some(uuid))
        .filter_map(|(pos, _)| at(pos))
        .collect()
}
