//! GPUs held outside Tessera's grants (issue 27): pods admitted by another
//! device plugin before Tessera managed the node, pods bound by another
//! scheduler, pods whose grant can no longer be read. The kubelet knows what
//! each container holds; the node agent copies its PodResources list into the
//! `GpuNode`'s `status.podResources`, and each rebuild counts the GPUs listed
//! there as held whole, by UUID, except those of pods whose Tessera grant
//! already counts them. A bound pod asking GPUs without a readable grant that
//! the report does not list yet blocks its node: the scheduler cannot know
//! which GPUs it holds. The report is the kubelet's truth; a stale one only
//! counts more, never less, except for pods that have ended (the kubelet has
//! taken their devices back).

use std::collections::{BTreeMap, HashMap, HashSet};

use tessera_core::placement::{GpuGrant, MigSlot, Placement};
use tessera_core::{Cluster, NodeId, fit};

use super::{Block, Mirror};

impl Mirror {
    /// Counts the GPUs the node agents' reports list for pods without a Tessera
    /// grant, and blocks the nodes where that cannot be done. Part of a rebuild,
    /// after every hold is replayed.
    pub(super) fn count_foreign(&mut self) {
        self.reported.clear();
        // Pods with a readable grant: the GPU UUIDs it counts already.
        let mut granted: HashMap<&str, HashSet<&str>> = HashMap::new();
        for h in self.held.values() {
            if let Some(a) = &h.allocation {
                let uuids = granted.entry(h.pod.as_str()).or_default();
                uuids.extend(a.gpus.iter().map(|g| g.uuid.as_str()));
                // A MIG instance granted as a GPU (single strategy): the agent
                // reports the physical GPU it is on.
                if let Some(gn) = self.inventory.get(&h.node) {
                    uuids.extend(a.gpus.iter().filter_map(|g| parent_of(gn, &g.uuid)));
                }
            }
        }
        let live: HashSet<String> = self.pods.values().map(crate::convert::pod_key).collect();
        let ended: HashSet<&str> = self
            .finished
            .values()
            .map(String::as_str)
            .filter(|k| !live.contains(*k))
            .collect();
        let mut blocks: Vec<(NodeId, Block)> = Vec::new();
        let mut whole: Vec<(NodeId, u8, String, String)> = Vec::new();
        let mut listed: HashSet<(String, String)> = HashSet::new();
        for (name, gn) in &self.inventory {
            let Some(id) = self.cluster.node_id(name) else {
                continue;
            };
            let Some(report) = gn.status.as_ref().and_then(|s| s.pod_resources.as_ref()) else {
                continue;
            };
            let node = self.cluster.node(id);
            // Per GPU position, the first pod found holding it.
            let mut held: BTreeMap<u8, (String, String)> = BTreeMap::new();
            for c in &report.containers {
                let key = format!("{}/{}", c.namespace, c.pod);
                listed.insert((name.clone(), key.clone()));
                self.reported.insert(key.clone());
                if ended.contains(key.as_str()) {
                    continue;
                }
                if let Some(uuids) = granted.get(key.as_str()) {
                    // Served by Tessera's own plugin, or on the GPUs it was granted.
                    let within = !c.gpu_uuids.is_empty()
                        && c.gpu_uuids.iter().all(|u| uuids.contains(u.as_str()));
                    if c.resource.starts_with("tessera.io/") || within {
                        continue;
                    }
                }
                if c.gpu_uuids.is_empty() {
                    if let Some(device) = c.device_ids.first() {
                        blocks.push((
                            id,
                            Block::UnresolvedDevice {
                                pod: key,
                                resource: c.resource.clone(),
                                device: device.clone(),
                            },
                        ));
                    }
                    continue;
                }
                for (pos, u) in held_positions(node, gn, c) {
                    held.entry(pos).or_insert((key.clone(), u));
                }
            }
            whole.extend(
                held.into_iter()
                    .map(|(pos, (pod, uuid))| (id, pos, pod, uuid)),
            );
        }
        for (id, pos, pod, uuid) in whole {
            let Some(grant) = held_whole(&self.cluster, id, pos) else {
                blocks.push((
                    id,
                    Block::HeldTwice {
                        pod,
                        uuid,
                        why: "in MIG mode, with no MIG profile spanning the whole GPU".into(),
                    },
                ));
                continue;
            };
            let p = Placement {
                node: id,
                grants: [grant].into_iter().collect(),
                ..Placement::default()
            };
            if let Err(e) = self.ledger.apply_existing(&self.cluster, &p) {
                blocks.push((
                    id,
                    Block::HeldTwice {
                        pod,
                        uuid,
                        why: e.to_string(),
                    },
                ));
            }
        }
        // Pods holding GPUs we cannot read that no report lists yet.
        let mut waiting: Vec<(&String, &super::Held)> = self
            .held
            .iter()
            .filter(|(_, h)| h.unread.is_some())
            .collect();
        waiting.sort_by(|a, b| a.1.pod.cmp(&b.1.pod).then(a.0.cmp(b.0)));
        for (_, h) in waiting {
            let Some(id) = self.cluster.node_id(&h.node) else {
                continue;
            };
            if !listed.contains(&(h.node.clone(), h.pod.clone())) {
                blocks.push((
                    id,
                    Block::AwaitingReport {
                        pod: h.pod.clone(),
                        grant: h.unread.clone().unwrap_or(super::Unread::NoGrant),
                    },
                ));
            }
        }
        for (id, block) in blocks {
            self.node_problems.push(block.to_string());
            self.blocked.entry(id).or_insert(block);
        }
    }
}

/// The positions of `node` that a reported container holds, each with the UUID
/// it holds it by. A GPU the node no longer lists holds nothing to count. On a
/// node serving MIG instances as GPUs (single strategy) a device that is such an
/// instance holds that entry; a physical GPU reported without one (the device
/// ID did not name it) holds every instance of it (`gn`, the node's inventory,
/// says which instances are on which GPU).
fn held_positions(
    node: &tessera_core::Node,
    gn: &tessera_api::GpuNode,
    c: &tessera_api::gpunode::ContainerDevices,
) -> Vec<(u8, String)> {
    let mut out = Vec::new();
    let mut by_instance: HashSet<&str> = HashSet::new();
    for d in &c.device_ids {
        let d = d.split_once("::").map_or(d.as_str(), |(u, _)| u);
        if let Some(pos) = node.gpus.iter().position(|g| g.mig_instance && g.uuid == d) {
            out.push((pos as u8, d.to_string()));
            by_instance.extend(parent_of(gn, d));
        }
    }
    for u in &c.gpu_uuids {
        if let Some(pos) = node.gpus.iter().position(|g| g.uuid == *u) {
            out.push((pos as u8, u.clone()));
        } else if !by_instance.contains(u.as_str()) {
            out.extend(
                node.gpus
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| g.mig_instance && parent_of(gn, &g.uuid) == Some(u.as_str()))
                    .map(|(pos, g)| (pos as u8, g.uuid.clone())),
            );
        }
    }
    out
}

/// The UUID of the GPU in MIG mode that has the instance `uuid`, by the node's
/// inventory.
pub(super) fn parent_of<'a>(gn: &'a tessera_api::GpuNode, uuid: &str) -> Option<&'a str> {
    gn.spec
        .gpus
        .iter()
        .find(|d| d.mig.enabled && d.mig.instances.iter().any(|m| m.uuid == uuid))
        .map(|d| d.uuid.as_str())
}

/// A grant that holds GPU `pos` of node `id` whole: the whole GPU, or on a GPU in
/// MIG mode (the device held may be any of its instances) the profile spanning
/// every memory slice, so no instance is granted there or planned in free space.
pub(super) fn held_whole(cluster: &Cluster, id: NodeId, pos: u8) -> Option<GpuGrant> {
    let gpu = &cluster.node(id).gpus[pos as usize];
    let spec = cluster.catalog.spec(gpu.model);
    if !gpu.mig_enabled {
        return Some(GpuGrant::whole(pos, spec.memory_mib));
    }
    let geo = spec.mig.as_ref()?;
    let all = u8::try_from((1u16 << geo.memory_slices.min(8)) - 1).ok()?;
    let (pi, p) = geo
        .profiles
        .iter()
        .enumerate()
        .find(|(_, p)| geo.placement_mask(p, 0) == Some(all))?;
    let slot = MigSlot {
        profile: u8::try_from(pi).ok()?,
        start: 0,
        size: p.memory_slices,
        compute: p.compute_slices,
    };
    Some(fit::mig_grant(pos, geo, p, slot))
}
