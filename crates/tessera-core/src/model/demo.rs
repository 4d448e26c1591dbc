//! A small built-in cluster for demos and the README's first command: a mix of
//! generations, NVLink and PCIe topologies, and two GPUs in MIG mode with instances.

use super::file::{mig_instances, nvswitch_links as nvswitch, pcie_links as pcie_pairs};
use super::{Catalog, Cluster, Gpu, Health, Link, ModelId, Node};

/// MIG GPUs of a demo node: GPU index and the instances that exist on it.
type MigLayout<'a> = &'a [(u32, &'a [&'a str])];

#[allow(
    clippy::too_many_arguments,
    reason = "one line per demo node reads best"
)]
fn node(
    catalog: &Catalog,
    name: &str,
    cpu: u64,
    mem_gib: u64,
    model: ModelId,
    count: u32,
    links: Vec<Link>,
    mig: MigLayout<'_>,
) -> Node {
    let half = count.div_ceil(2);
    let mut n = Node::uniform(name, cpu * 1000, mem_gib * 1024, model, count);
    n.gpus = (0..count)
        .map(|index| {
            let uuid = format!("GPU-{name}-{index}");
            let layout = mig.iter().find(|(i, _)| *i == index).map(|(_, l)| *l);
            Gpu {
                index,
                mig_instances: layout
                    .and_then(|l| mig_instances(catalog, model, &uuid, l).ok())
                    .unwrap_or_default(),
                uuid,
                model,
                health: Health::Healthy,
                numa: Some(if index < half { 0 } else { 1 }),
                mig_enabled: layout.is_some(),
                mig_instance: false,
            }
        })
        .collect();
    n.links = links;
    n
}

/// The demo cluster: 12 nodes, 68 GPUs of six models.
pub fn demo_cluster() -> Cluster {
    let catalog = Catalog::default();
    let id = |name: &str| catalog.find(name).unwrap_or(ModelId(0));
    let (h100, h200, a100, l4, t4, v100) = (
        id("H100-80GB"),
        id("H200-141GB"),
        id("A100-80GB"),
        id("L4"),
        id("T4"),
        id("V100-32GB"),
    );
    let c = &catalog;
    // dgx-a100-2: GPU 0 as two 3g.40gb, GPU 1 in the mixed 2g + 1g + 1g + 3g layout.
    let a100_mig: MigLayout<'_> = &[
        (0, &["3g.40gb", "3g.40gb"]),
        (1, &["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"]),
    ];
    let nodes = vec![
        node(c, "dgx-h100-1", 224, 2048, h100, 8, nvswitch(8, 18), &[]),
        node(c, "dgx-h100-2", 224, 2048, h100, 8, nvswitch(8, 18), &[]),
        node(c, "hgx-h200-1", 192, 2048, h200, 8, nvswitch(8, 18), &[]),
        node(c, "dgx-a100-1", 256, 1024, a100, 8, nvswitch(8, 12), &[]),
        node(
            c,
            "dgx-a100-2",
            256,
            1024,
            a100,
            8,
            nvswitch(8, 12),
            a100_mig,
        ),
        node(c, "l4-1", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node(c, "l4-2", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node(c, "l4-3", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node(c, "l4-4", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node(c, "t4-1", 32, 128, t4, 2, pcie_pairs(2), &[]),
        node(c, "t4-2", 32, 128, t4, 2, pcie_pairs(2), &[]),
        node(c, "v100-1", 64, 512, v100, 8, pcie_pairs(8), &[]),
    ];
    // The demo is built from constants; a failure here is a bug in this file.
    Cluster::new(catalog, nodes).unwrap_or_else(|e| panic!("built-in demo cluster is invalid: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn demo_cluster_is_valid() {
        let c = super::demo_cluster();
        assert_eq!(c.len(), 12);
        assert_eq!(c.gpu_count(), 68);
        assert!(
            c.node(c.node_id("dgx-h100-1").unwrap())
                .link(0, 7)
                .is_nvlink()
        );
        let a100 = c.node(c.node_id("dgx-a100-2").unwrap());
        assert_eq!(
            a100.gpus
                .iter()
                .map(|g| g.mig_instances.len())
                .collect::<Vec<_>>(),
            [2, 4, 0, 0, 0, 0, 0, 0]
        );
    }
}
