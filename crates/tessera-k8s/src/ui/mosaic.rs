//! The mosaic: every node a tile, every GPU a cell holding its tenants' shares,
//! in a compact JSON form the page renders (about 50 bytes per share, so a
//! 1,000-node cluster is a few hundred kB). Built from a [`Mirror`] (the live
//! view) or from a core [`Cluster`] and [`Ledger`] (the simulator's snapshot),
//! with the same types so one page renders both.
//!
//! Namespace and model names are interned into tables that only grow, so a
//! delta can refer to them by index without resending the tables' old rows.

use std::collections::HashMap;

use serde::Serialize;
use tessera_core::frag::{FragNode, TargetWorkload, node_frag};
use tessera_core::ledger::NodeUse;
use tessera_core::model::Health;
use tessera_core::{Cluster, Ledger};

use crate::mirror::Mirror;

/// Names interned into a table whose indices never change.
#[derive(Debug, Clone, Default)]
pub struct Names {
    pub table: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.table.len() as u32;
        self.table.push(name.to_string());
        self.index.insert(name.to_string(), i);
        i
    }
}

/// One tenant's part of a GPU: `[namespace index, milli-GPU, pod name, MIG profile or ""]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Share(pub u32, pub u32, pub String, pub String);

/// Cell flag: the GPU is not healthy.
pub const UNHEALTHY: u8 = 1;
/// Cell flag: the GPU is in MIG mode.
pub const MIG: u8 = 2;

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cell {
    /// [`UNHEALTHY`] | [`MIG`].
    #[serde(rename = "x", skip_serializing_if = "is_zero")]
    pub flags: u8,
    #[serde(rename = "s", skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Share>,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tile {
    #[serde(rename = "n")]
    pub name: String,
    /// Index into the model table; -1 without GPUs.
    #[serde(rename = "m")]
    pub model: i32,
    /// 0 when the Kubernetes node is not Ready.
    #[serde(rename = "r")]
    pub ready: u8,
    /// FGD fragmentation against the target workload, milli-GPU (rounded).
    #[serde(rename = "f")]
    pub frag_milli: u32,
    #[serde(rename = "g")]
    pub gpus: Vec<Cell>,
}

/// A tenant placed on a GPU, before interning.
pub struct Tenant<'a> {
    pub node: usize,
    /// Position in the node's GPU list.
    pub gpu: usize,
    pub namespace: &'a str,
    pub pod: &'a str,
    pub milli: u32,
    pub mig_profile: &'a str,
}

/// Tiles for `cluster` with per-node `usage` (same order) and `tenants`;
/// `ready(i)` says whether node `i` is Ready. Also returns each node's GPU
/// UUIDs, for search (they are not sent to the page: 42 bytes × every GPU).
pub fn tiles<'a>(
    cluster: &Cluster,
    usage: &[Option<&NodeUse>],
    tenants: impl IntoIterator<Item = Tenant<'a>>,
    ready: impl Fn(usize) -> bool,
    namespaces: &mut Names,
    models: &mut Names,
    workload: &TargetWorkload,
) -> (Vec<Tile>, Vec<Vec<String>>) {
    let mut out = Vec::with_capacity(cluster.len());
    let mut uuids = Vec::with_capacity(cluster.len());
    for (i, node) in cluster.nodes().iter().enumerate() {
        let model = node
            .primary_model()
            .map_or(-1, |m| models.intern(&cluster.catalog.spec(m).name) as i32);
        let gpus = node
            .gpus
            .iter()
            .map(|g| Cell {
                flags: if g.health == Health::Healthy {
                    0
                } else {
                    UNHEALTHY
                } | if g.mig_enabled { MIG } else { 0 },
                shares: Vec::new(),
            })
            .collect();
        let frag_milli = match (node.primary_model(), usage.get(i).copied().flatten()) {
            (Some(m), Some(u)) => {
                let free: Vec<u32> = node
                    .gpus
                    .iter()
                    .zip(u.gpus.iter())
                    .map(|(g, u)| {
                        if g.health == Health::Healthy {
                            u.free_cores_milli
                        } else {
                            0
                        }
                    })
                    .collect();
                node_frag(
                    &FragNode {
                        free_milli: &free,
                        free_cpu_milli: u.free_cpu_milli,
                        model: Some(m),
                    },
                    workload,
                )
                .round()
                .clamp(0.0, f64::from(u32::MAX)) as u32
            }
            _ => 0,
        };
        out.push(Tile {
            name: node.name.clone(),
            model,
            ready: u8::from(ready(i)),
            frag_milli,
            gpus,
        });
        uuids.push(node.gpus.iter().map(|g| g.uuid.clone()).collect());
    }
    for t in tenants {
        if let Some(cell) = out.get_mut(t.node).and_then(|n| n.gpus.get_mut(t.gpu)) {
            cell.shares.push(Share(
                namespaces.intern(t.namespace),
                t.milli,
                t.pod.to_string(),
                t.mig_profile.to_string(),
            ));
        }
    }
    for tile in &mut out {
        for cell in &mut tile.gpus {
            // Equal holdings give equal tiles, whatever order the pods were listed in.
            cell.shares.sort_by(|a, b| (&a.2, a.0).cmp(&(&b.2, b.0)));
        }
    }
    (out, uuids)
}

/// What the tiles are made of, copied out of the mirror in O(nodes + holds)
/// so that the tiles (fragmentation above all) are computed without the lock.
pub(crate) struct Parts {
    pub cluster: std::sync::Arc<Cluster>,
    /// The ledger's per-node use, in the cluster's node order.
    pub usage: Vec<NodeUse>,
    pub held: Vec<std::sync::Arc<crate::accounting::HeldGrants>>,
    pub ready: Vec<bool>,
}

impl Parts {
    /// Copies the parts, the holds' grants only where they changed since
    /// `copies` last read (under the mirror's lock).
    pub fn take(mirror: &mut Mirror, copies: &mut crate::accounting::GrantCopies) -> Parts {
        // The queue tree as of now, for the holds' queues in the accounting.
        mirror.queue_tree();
        let cluster = mirror.shared_cluster();
        let ready = (0..cluster.len())
            .map(|i| mirror.facts(tessera_core::NodeId(i as u32)).ready)
            .collect();
        Parts {
            held: copies.read(mirror),
            usage: mirror.ledger().nodes().to_vec(),
            cluster,
            ready,
        }
    }
}

/// Tiles from [`Parts`].
pub(crate) fn from_parts(
    parts: &Parts,
    namespaces: &mut Names,
    models: &mut Names,
    workload: &TargetWorkload,
) -> (Vec<Tile>, Vec<Vec<String>>) {
    let cluster = &*parts.cluster;
    let usage: Vec<Option<&NodeUse>> = parts.usage.iter().map(Some).collect();
    let mut tenants = Vec::new();
    for h in &parts.held {
        let Some(node) = cluster.node_id(&h.node) else {
            continue;
        };
        let gpus = &cluster.node(node).gpus;
        let (namespace, pod) = h.pod.split_once('/').unwrap_or(("", &h.pod));
        for g in &h.gpus {
            let Some(pos) = gpus.iter().position(|x| x.index == g.index) else {
                continue;
            };
            tenants.push(Tenant {
                node: node.0 as usize,
                gpu: pos,
                namespace,
                pod,
                milli: g.cores_milli,
                mig_profile: g.mig_profile.as_deref().unwrap_or(""),
            });
        }
    }
    tiles(
        cluster,
        &usage,
        tenants,
        |i| parts.ready.get(i).copied().unwrap_or(true),
        namespaces,
        models,
        workload,
    )
}

/// Tiles of a core cluster and ledger (the simulator's state); each
/// allocation's tenant name and group come from `label`.
pub fn from_ledger(
    cluster: &Cluster,
    ledger: &Ledger,
    label: impl Fn(tessera_core::AllocId) -> (String, String),
    namespaces: &mut Names,
    models: &mut Names,
    workload: &TargetWorkload,
) -> Vec<Tile> {
    struct Placed {
        node: usize,
        gpu: usize,
        group: String,
        pod: String,
        milli: u32,
        profile: String,
    }
    let mut placed = Vec::new();
    for (id, p) in ledger.allocations() {
        let (group, pod) = label(id);
        let node = cluster.node(p.node);
        for g in &p.grants {
            let profile = g
                .mig
                .as_ref()
                .and_then(|m| {
                    let model = node.gpus.get(usize::from(g.gpu))?.model;
                    let geo = cluster.catalog.spec(model).mig.as_ref()?;
                    Some(geo.profiles.get(usize::from(m.profile))?.name.clone())
                })
                .unwrap_or_default();
            placed.push(Placed {
                node: p.node.0 as usize,
                gpu: usize::from(g.gpu),
                group: group.clone(),
                pod: pod.clone(),
                milli: g.cores_milli,
                profile,
            });
        }
    }
    let usage: Vec<Option<&NodeUse>> = ledger.nodes().iter().map(Some).collect();
    tiles(
        cluster,
        &usage,
        placed.iter().map(|p| Tenant {
            node: p.node,
            gpu: p.gpu,
            namespace: &p.group,
            pod: &p.pod,
            milli: p.milli,
            mig_profile: &p.profile,
        }),
        |_| true,
        namespaces,
        models,
        workload,
    )
    .0
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use tessera_api::GpuNode;
    use tessera_core::policy::{PolicyArgs, by_name};

    use super::*;
    use crate::mirror::Reservation;

    /// A MIG GPU, an unhealthy GPU and a plain one: the flags, and a MIG
    /// tenant's share named by its profile.
    #[test]
    fn cells_carry_health_mig_and_the_tenants_profile() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}
        }))
        .unwrap();
        let inv: GpuNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"nodeName": "a", "gpus": [
                {"index": 0, "uuid": "GPU-0", "model": "A100-80GB", "memoryMiB": 81920,
                 "mig": {"enabled": true, "instances": [
                     {"profile": "3g.40gb", "start": 4, "size": 4, "uuid": "MIG-1"}]}},
                {"index": 1, "uuid": "GPU-1", "model": "A100-80GB", "memoryMiB": 81920,
                 "health": "Unhealthy"},
                {"index": 2, "uuid": "GPU-2", "model": "A100-80GB", "memoryMiB": 81920}
            ]}
        }))
        .unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"tessera.io/mig-3g.40gb": "1"}}}]}
        }))
        .unwrap();
        let policy = by_name("tessera", &PolicyArgs::default()).unwrap();
        let mut m = Mirror::from_objects(policy, b"k".to_vec(), vec![node], vec![inv], vec![]);
        assert!(matches!(
            m.reserve(&pod, "a"),
            Ok(Reservation::Write { .. })
        ));
        let (mut ns, mut models) = (Names::default(), Names::default());
        let parts = Parts::take(&mut m, &mut Default::default());
        let (tiles, uuids) = from_parts(&parts, &mut ns, &mut models, &TargetWorkload::builtin());
        assert_eq!(uuids, vec![vec!["GPU-0", "GPU-1", "GPU-2"]]);
        let cells = &tiles[0].gpus;
        assert_eq!(cells[0].flags, MIG);
        assert_eq!(cells[1].flags, UNHEALTHY);
        assert_eq!(cells[2].flags, 0);
        // 3 of 7 compute slices: 3000 / 7 = 428 milli-GPU.
        assert_eq!(
            cells[0].shares,
            vec![Share(0, 428, "p".into(), "3g.40gb".into())]
        );
        assert_eq!(ns.table, vec!["ml"]);
        assert_eq!(models.table, vec!["A100-80GB"]);
        assert!(cells[1].shares.is_empty() && cells[2].shares.is_empty());
    }
}
