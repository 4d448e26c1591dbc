//! The GPU Operator's "single" MIG strategy: on such a node every MIG instance is
//! an `nvidia.com/gpu` of its own, and a pod asking `nvidia.com/gpu: 1` gets one
//! instance. It is the operator's default `mig.strategy`, so manifests written for
//! it ask whole GPUs and expect instances.
//!
//! Tessera serves it by rewriting the node before anything judges it
//! ([`serve_instances_whole`]): a GPU in MIG mode is replaced by one entry per
//! existing instance, of a model of the instance's own size (`A100-80GB-MIG-1g.10gb`),
//! marked [`Gpu::mig_instance`]. Fit, quota, preemption and fragmentation then
//! see plain GPUs: a whole-GPU ask takes as many instances as it asks GPUs, a
//! grant names the instance's `MIG-…` UUID, and the node agent hands over that
//! instance. Instances are never created or destroyed on such a node, shares and
//! MIG requests never land on an instance entry, and GPUs not in MIG mode stay
//! whole GPUs.

use std::collections::BTreeMap;

use super::spec::CatalogFull;
use super::{Catalog, Gpu, GpuSpec, Link, ModelId, Node};

/// Node label naming the node's MIG strategy for Tessera (`single` or `mixed`).
pub const LABEL_MIG_STRATEGY: &str = "tessera.io/mig-strategy";
/// The label GPU Feature Discovery writes with the GPU Operator's strategy
/// (`none`, `single`, `mixed`); read when [`LABEL_MIG_STRATEGY`] is absent.
pub const LABEL_GFD_MIG_STRATEGY: &str = "nvidia.com/mig.strategy";

/// How a node's MIG instances are offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigStrategy {
    /// Instances are asked by profile (`tessera.io/mig-<profile>`,
    /// `nvidia.com/mig-<profile>`); whole-GPU asks never take one.
    #[default]
    Mixed,
    /// Every instance is a GPU for whole-GPU asks (see the module doc).
    Single,
}

impl MigStrategy {
    /// The strategy of a node with these labels: [`LABEL_MIG_STRATEGY`] when
    /// set, else GFD's [`LABEL_GFD_MIG_STRATEGY`]. Only the value `single` (any
    /// case, spaces trimmed) means [`MigStrategy::Single`]; anything else is
    /// the mixed behaviour, so a typo never changes what a whole-GPU ask gets.
    pub fn of(labels: &BTreeMap<String, String>) -> MigStrategy {
        let value = labels
            .get(LABEL_MIG_STRATEGY)
            .or_else(|| labels.get(LABEL_GFD_MIG_STRATEGY));
        MigStrategy::from_label(value.map(String::as_str))
    }

    /// The strategy one label value says (`None`: no label), by [`MigStrategy::of`]'s rule.
    pub fn from_label(value: Option<&str>) -> MigStrategy {
        match value {
            Some(v) if v.trim().eq_ignore_ascii_case("single") => MigStrategy::Single,
            _ => MigStrategy::Mixed,
        }
    }
}

/// Why a node could not be rewritten.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SingleError {
    #[error(transparent)]
    CatalogFull(#[from] CatalogFull),
    #[error(
        "serves {count} GPUs and MIG instances under the single MIG strategy, at most 64 are supported"
    )]
    TooManyDevices { count: usize },
}

/// Rewrites `node` for the single strategy (see the module doc): each GPU in MIG
/// mode becomes its instances, in order, each with the parent's index, health
/// and NUMA node and the parent's links to other GPUs. An instance without a
/// UUID cannot be named in a grant and is left out. The instances' models are
/// added to `catalog`.
pub fn serve_instances_whole(node: &mut Node, catalog: &mut Catalog) -> Result<(), SingleError> {
    if !node.gpus.iter().any(|g| g.mig_enabled) {
        return Ok(());
    }
    // Each new entry with the position of the GPU it came from.
    let mut entries: Vec<(Gpu, usize)> = Vec::new();
    for (pos, gpu) in node.gpus.iter().enumerate() {
        if !gpu.mig_enabled {
            entries.push((gpu.clone(), pos));
            continue;
        }
        for m in gpu.mig_instances.iter().filter(|m| !m.uuid.is_empty()) {
            let model = instance_model(catalog, gpu.model, m.profile)?;
            entries.push((
                Gpu {
                    index: gpu.index,
                    uuid: m.uuid.clone(),
                    model,
                    health: gpu.health,
                    numa: gpu.numa,
                    mig_enabled: false,
                    mig_instances: Vec::new(),
                    mig_instance: true,
                },
                pos,
            ));
        }
    }
    if entries.len() > 64 {
        return Err(SingleError::TooManyDevices {
            count: entries.len(),
        });
    }
    if !node.links.is_empty() {
        let n = entries.len();
        let mut links = vec![Link::Unknown; n * n];
        for (a, (_, pa)) in entries.iter().enumerate() {
            for (b, (_, pb)) in entries.iter().enumerate() {
                // Two instances of one GPU share its chip: no link to rank.
                if pa != pb {
                    links[a * n + b] = node.link(*pa, *pb);
                }
            }
        }
        node.links = links;
    }
    node.gpus = entries.into_iter().map(|(g, _)| g).collect();
    Ok(())
}

/// The model of an instance of profile `profile` (an index into the parent
/// model's MIG table) on a GPU of model `parent`: named `<parent>-MIG-<profile>`,
/// with the profile's memory and its share of the parent's SMs; added to the
/// catalog once.
pub fn instance_model(
    catalog: &mut Catalog,
    parent: ModelId,
    profile: u8,
) -> Result<ModelId, CatalogFull> {
    let spec = catalog.spec(parent);
    let Some((geo, p)) = spec
        .mig
        .as_ref()
        .and_then(|geo| Some((geo, geo.profiles.get(profile as usize)?)))
    else {
        return Ok(parent);
    };
    let name = format!("{}-MIG-{}", spec.name, p.name);
    if let Some(i) = catalog.specs().iter().position(|s| s.name == name) {
        return Ok(ModelId(i as u8));
    }
    let sm_count =
        spec.sm_count * u32::from(p.compute_slices) / u32::from(geo.compute_slices.max(1));
    let instance = GpuSpec {
        // GFD's product label under the single strategy, e.g.
        // `NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`, names this model too.
        aliases: spec
            .aliases
            .iter()
            .map(|a| format!("{a}-MIG-{}", p.name))
            .collect(),
        name,
        memory_mib: p.memory_mib,
        sm_count,
        architecture: spec.architecture,
        mig: None,
    };
    catalog.push_exact(instance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Health, MigInstance};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_tessera_label_wins_over_gfds_and_only_single_means_single() {
        assert_eq!(MigStrategy::of(&labels(&[])), MigStrategy::Mixed);
        assert_eq!(
            MigStrategy::of(&labels(&[(LABEL_GFD_MIG_STRATEGY, "single")])),
            MigStrategy::Single
        );
        assert_eq!(
            MigStrategy::of(&labels(&[
                (LABEL_GFD_MIG_STRATEGY, "single"),
                (LABEL_MIG_STRATEGY, "mixed")
            ])),
            MigStrategy::Mixed
        );
        assert_eq!(
            MigStrategy::of(&labels(&[(LABEL_MIG_STRATEGY, " Single ")])),
            MigStrategy::Single
        );
        assert_eq!(
            MigStrategy::of(&labels(&[(LABEL_MIG_STRATEGY, "singel")])),
            MigStrategy::Mixed
        );
    }

    /// Two A100-80GBs with NVLink, the second in MIG mode with two `3g.40gb`
    /// instances (one without a UUID) and a `1g.10gb`.
    fn node(catalog: &Catalog) -> Node {
        let model = catalog.find("A100-80GB").unwrap();
        let geo = catalog.spec(model).mig.clone().unwrap();
        let pi = |name: &str| geo.profile(name).unwrap().0 as u8;
        let mut n = Node::uniform("n", 8_000, 64_000, model, 2);
        n.gpus[0].uuid = "GPU-0".into();
        n.gpus[1].uuid = "GPU-1".into();
        n.gpus[1].health = Health::Unhealthy;
        n.gpus[1].numa = Some(1);
        n.gpus[1].mig_enabled = true;
        n.gpus[1].mig_instances = vec![
            MigInstance {
                profile: pi("3g.40gb"),
                start: 0,
                uuid: "MIG-a".into(),
            },
            MigInstance {
                profile: pi("3g.40gb"),
                start: 4,
                uuid: String::new(),
            },
            MigInstance {
                profile: pi("1g.10gb"),
                start: 6,
                uuid: "MIG-b".into(),
            },
        ];
        n.links = vec![
            Link::Unknown,
            Link::NvLink(12),
            Link::NvLink(12),
            Link::Unknown,
        ];
        n
    }

    #[test]
    fn a_gpu_in_mig_mode_becomes_its_named_instances() {
        let mut catalog = Catalog::default();
        let mut n = node(&catalog);
        serve_instances_whole(&mut n, &mut catalog).unwrap();
        let uuids: Vec<&str> = n.gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-0", "MIG-a", "MIG-b"]);
        let a = &n.gpus[1];
        assert!(a.mig_instance);
        assert!(!a.mig_enabled && a.mig_instances.is_empty());
        assert_eq!((a.index, a.health, a.numa), (1, Health::Unhealthy, Some(1)));
        let spec = catalog.spec(a.model);
        assert_eq!(spec.name, "A100-80GB-MIG-3g.40gb");
        assert!(spec.memory_mib > 39_000 && spec.memory_mib < 41_000);
        assert_eq!(spec.sm_count, 108 * 3 / 7);
        assert!(spec.mig.is_none());
        // GFD's product label under the single strategy names the instance model.
        let b = catalog.spec(n.gpus[2].model);
        assert_eq!(b.name, "A100-80GB-MIG-1g.10gb");
        assert!(b.answers_to("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"), "{b:?}");
        // The parent's links, none between instances of one GPU.
        assert_eq!(n.link(0, 1), Link::NvLink(12));
        assert_eq!(n.link(2, 0), Link::NvLink(12));
        assert_eq!(n.link(1, 2), Link::Unknown);
        assert!(!n.gpus[0].mig_instance);
        // Once per profile in the catalog.
        let before = catalog.specs().len();
        let mut again = node(&catalog);
        serve_instances_whole(&mut again, &mut catalog).unwrap();
        assert_eq!(catalog.specs().len(), before);
        assert_eq!(again, n);
    }

    #[test]
    fn whole_asks_take_instances_and_shares_never_do() {
        use crate::fit::{self, NodeView};
        use crate::ledger::Ledger;
        use crate::model::{Cluster, NodeId};
        use crate::placement::{GpuGrant, Placement};
        use crate::request::{IsolationLevel, Request};
        let mut catalog = Catalog::default();
        let mut n = node(&catalog);
        n.gpus[1].health = Health::Healthy;
        serve_instances_whole(&mut n, &mut catalog).unwrap();
        let cluster = Cluster::new(catalog, vec![n]).unwrap();
        let mut ledger = Ledger::new(&cluster);
        let check = |ledger: &Ledger, req: &Request| {
            fit::check(NodeView::of(&cluster, ledger, NodeId(0)), req).map(|f| f.usable.to_vec())
        };
        // The plain GPU and both named instances take whole asks.
        assert_eq!(check(&ledger, &Request::whole(1, 0, 0)), Ok(vec![0, 1, 2]));
        assert_eq!(check(&ledger, &Request::whole(3, 0, 0)), Ok(vec![0, 1, 2]));
        assert!(check(&ledger, &Request::whole(4, 0, 0)).is_err());
        // Shares, at a level or not, only on the plain GPU.
        assert_eq!(
            check(&ledger, &Request::share_milli(500, 0, 0)),
            Ok(vec![0])
        );
        let hard = Request::share_level(300, IsolationLevel::Any, 0, 0);
        assert_eq!(check(&ledger, &hard), Ok(vec![0]));
        // With an instance taken whole, the next whole ask gets the rest.
        let mem = cluster
            .catalog
            .spec(cluster.node(NodeId(0)).gpus[1].model)
            .memory_mib;
        let take = |gpu: u8, g: GpuGrant| Placement {
            node: NodeId(0),
            grants: [GpuGrant { gpu, ..g }].into_iter().collect(),
            ..Placement::default()
        };
        ledger
            .apply(&cluster, &take(1, GpuGrant::whole(1, mem)))
            .unwrap();
        assert_eq!(check(&ledger, &Request::whole(1, 0, 0)), Ok(vec![0, 2]));
        // The ledger refuses a share on an instance, whoever asks.
        let share = GpuGrant {
            exclusive: false,
            memory_mib: 1_000,
            cores_milli: 100,
            ..GpuGrant::whole(2, mem)
        };
        assert!(ledger.apply(&cluster, &take(2, share)).is_err());
    }

    #[test]
    fn a_node_without_mig_is_left_alone() {
        let mut catalog = Catalog::default();
        let mut n = node(&catalog);
        n.gpus[1].mig_enabled = false;
        n.gpus[1].mig_instances.clear();
        let before = n.clone();
        serve_instances_whole(&mut n, &mut catalog).unwrap();
        assert_eq!(n, before);
    }
}
