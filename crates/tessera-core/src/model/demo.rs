//! A small built-in cluster for demos and the README's first command: a mix of
//! generations, NVLink and PCIe topologies, and one GPU in MIG mode.

use super::file::{nvswitch_links as nvswitch, pcie_links as pcie_pairs};
use super::{Catalog, Cluster, Gpu, Health, Link, ModelId, Node};

fn node(
    name: &str,
    cpu: u64,
    mem_gib: u64,
    model: ModelId,
    count: u32,
    links: Vec<Link>,
    mig: &[u32],
) -> Node {
    let half = count.div_ceil(2);
    let mut n = Node::uniform(name, cpu * 1000, mem_gib * 1024, model, count);
    n.gpus = (0..count)
        .map(|index| Gpu {
            index,
            uuid: format!("GPU-{name}-{index}"),
            model,
            health: Health::Healthy,
            numa: Some(if index < half { 0 } else { 1 }),
            mig_enabled: mig.contains(&index),
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
    let nodes = vec![
        node("dgx-h100-1", 224, 2048, h100, 8, nvswitch(8, 18), &[]),
        node("dgx-h100-2", 224, 2048, h100, 8, nvswitch(8, 18), &[]),
        node("hgx-h200-1", 192, 2048, h200, 8, nvswitch(8, 18), &[]),
        node("dgx-a100-1", 256, 1024, a100, 8, nvswitch(8, 12), &[]),
        node("dgx-a100-2", 256, 1024, a100, 8, nvswitch(8, 12), &[0, 1]),
        node("l4-1", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node("l4-2", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node("l4-3", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node("l4-4", 64, 256, l4, 4, pcie_pairs(4), &[]),
        node("t4-1", 32, 128, t4, 2, pcie_pairs(2), &[]),
        node("t4-2", 32, 128, t4, 2, pcie_pairs(2), &[]),
        node("v100-1", 64, 512, v100, 8, pcie_pairs(8), &[]),
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
    }
}
