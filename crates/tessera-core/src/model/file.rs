//! The cluster file: a small YAML/JSON description of nodes for `tessera place`
//! and demos. Raw (serde, permissive) → validated [`Cluster`], with errors that
//! name the node and field.
//!
//! ```yaml
//! nodes:
//!   - name: dgx-1
//!     cpuMilli: 224000
//!     memoryMib: 2097152
//!     gpus: { model: H100-80GB, count: 8, topology: nvswitch, nvlinks: 18,
//!             migEnabled: [0, 1], migInstances: [3g.40gb, 3g.40gb] }
//!   - name: l4-1
//!     cpuMilli: 64000
//!     memoryMib: 262144
//!     gpus: { model: L4, count: 4, topology: pcie }
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Catalog, Cluster, Gpu, Health, Link, MigInstance, ModelId, Node};

/// The file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterFile {
    pub nodes: Vec<NodeEntry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeEntry {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub gpus: Option<GpuEntry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuEntry {
    pub model: String,
    pub count: u32,
    /// `nvswitch` (all pairs NVLink), `pcie` (pairs on a switch, halves per socket) or `unknown`.
    #[serde(default)]
    pub topology: Option<String>,
    /// NVLink links per pair for `nvswitch` (default 12).
    #[serde(default)]
    pub nvlinks: Option<u8>,
    /// GPU indices in MIG mode.
    #[serde(default)]
    pub mig_enabled: Vec<u32>,
    /// MIG instances (profile names) that exist on each GPU in MIG mode, placed in
    /// order at the first free start. Tessera grants only existing instances.
    #[serde(default)]
    pub mig_instances: Vec<String>,
    /// GPU indices marked unhealthy.
    #[serde(default)]
    pub unhealthy: Vec<u32>,
}

/// A cluster file that parsed but does not describe a valid cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node:?}: {field}: {problem}")]
pub struct ClusterFileError {
    pub node: String,
    pub field: String,
    pub problem: String,
}

/// The MIG instances `profiles` laid out on one empty GPU of `model` (see
/// [`super::MigGeometry::layout`]), with UUIDs derived from the GPU's.
pub fn mig_instances(
    catalog: &Catalog,
    model: ModelId,
    gpu_uuid: &str,
    profiles: &[&str],
) -> Result<Vec<MigInstance>, String> {
    let spec = catalog.spec(model);
    let geo = spec
        .mig
        .as_ref()
        .ok_or_else(|| format!("{} does not support MIG", spec.name))?;
    let id = gpu_uuid.strip_prefix("GPU-").unwrap_or(gpu_uuid);
    Ok(geo
        .layout(profiles)?
        .into_iter()
        .enumerate()
        .map(|(k, (profile, start))| MigInstance {
            profile,
            start,
            uuid: format!("MIG-{id}-{k}"),
        })
        .collect())
}

/// Links for `n` GPUs all on one NVSwitch with `links` links per pair.
pub fn nvswitch_links(n: usize, links: u8) -> Vec<Link> {
    (0..n * n)
        .map(|i| {
            if i / n == i % n {
                Link::Unknown
            } else {
                Link::NvLink(links)
            }
        })
        .collect()
}

/// Links for `n` PCIe GPUs: pairs share a switch, each half of the GPUs shares a socket.
pub fn pcie_links(n: usize) -> Vec<Link> {
    let half = n.div_ceil(2);
    (0..n * n)
        .map(|i| {
            let (a, b) = (i / n, i % n);
            if a == b {
                Link::Unknown
            } else if a / 2 == b / 2 {
                Link::PcieSwitch
            } else if (a < half) == (b < half) {
                Link::SameSocket
            } else {
                Link::CrossSocket
            }
        })
        .collect()
}

impl ClusterFile {
    /// Validates the file into a cluster over the built-in catalog.
    pub fn into_cluster(self) -> Result<Cluster, ClusterFileError> {
        let catalog = Catalog::default();
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for entry in self.nodes {
            let fail = |field: &str, problem: String| ClusterFileError {
                node: entry.name.clone(),
                field: field.to_string(),
                problem,
            };
            if entry.name.trim().is_empty() {
                return Err(fail("name", "must not be empty".into()));
            }
            let mut node = Node {
                name: entry.name.clone(),
                cpu_milli: entry.cpu_milli,
                memory_mib: entry.memory_mib,
                labels: entry.labels.clone(),
                gpus: Vec::new(),
                links: Vec::new(),
            };
            if let Some(g) = &entry.gpus {
                let model = catalog.find(&g.model).ok_or_else(|| {
                    fail(
                        "gpus.model",
                        format!(
                            "unknown GPU model {:?} (known: {})",
                            g.model,
                            catalog.names().join(", ")
                        ),
                    )
                })?;
                if g.count > 64 {
                    return Err(fail("gpus.count", format!("{} is more than 64", g.count)));
                }
                for (field, list) in [
                    ("gpus.migEnabled", &g.mig_enabled),
                    ("gpus.unhealthy", &g.unhealthy),
                ] {
                    if let Some(bad) = list.iter().find(|&&i| i >= g.count) {
                        return Err(fail(
                            field,
                            format!("GPU index {bad} is out of range (count {})", g.count),
                        ));
                    }
                }
                if !g.mig_enabled.is_empty() && catalog.spec(model).mig.is_none() {
                    return Err(fail(
                        "gpus.migEnabled",
                        format!("{} does not support MIG", g.model),
                    ));
                }
                if !g.mig_instances.is_empty() && g.mig_enabled.is_empty() {
                    return Err(fail(
                        "gpus.migInstances",
                        "needs GPUs in MIG mode (gpus.migEnabled)".into(),
                    ));
                }
                let half = g.count.div_ceil(2);
                let profiles: Vec<&str> = g.mig_instances.iter().map(String::as_str).collect();
                let mut gpus = Vec::with_capacity(g.count as usize);
                for index in 0..g.count {
                    let uuid = format!("GPU-{}-{index}", entry.name);
                    let mig_enabled = g.mig_enabled.contains(&index);
                    let mig_instances = if mig_enabled {
                        mig_instances(&catalog, model, &uuid, &profiles)
                            .map_err(|e| fail("gpus.migInstances", e))?
                    } else {
                        Vec::new()
                    };
                    gpus.push(Gpu {
                        index,
                        uuid,
                        model,
                        health: if g.unhealthy.contains(&index) {
                            Health::Unhealthy
                        } else {
                            Health::Healthy
                        },
                        numa: Some(if index < half { 0 } else { 1 }),
                        mig_enabled,
                        mig_instances,
                        mig_instance: false,
                    });
                }
                node.gpus = gpus;
                let n = g.count as usize;
                node.links = match g.topology.as_deref().unwrap_or("unknown") {
                    "nvswitch" | "nvlink" => nvswitch_links(n, g.nvlinks.unwrap_or(12)),
                    "pcie" => pcie_links(n),
                    "unknown" => Vec::new(),
                    other => {
                        return Err(fail(
                            "gpus.topology",
                            format!(
                                "unknown topology {other:?} (expected nvswitch, pcie or unknown)"
                            ),
                        ));
                    }
                };
            }
            nodes.push(node);
        }
        Cluster::new(catalog, nodes).map_err(|e| ClusterFileError {
            node: String::new(),
            field: "nodes".into(),
            problem: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(model: &str, topology: Option<&str>) -> ClusterFile {
        ClusterFile {
            nodes: vec![NodeEntry {
                name: "n".into(),
                cpu_milli: 1000,
                memory_mib: 1000,
                labels: BTreeMap::new(),
                gpus: Some(GpuEntry {
                    model: model.into(),
                    count: 4,
                    topology: topology.map(str::to_string),
                    nvlinks: None,
                    mig_enabled: vec![],
                    mig_instances: vec![],
                    unhealthy: vec![3],
                }),
            }],
        }
    }

    #[test]
    fn validates_models_and_topology() {
        let c = entry("L4", Some("pcie")).into_cluster().unwrap();
        let n = &c.nodes()[0];
        assert_eq!(n.link(0, 1), Link::PcieSwitch);
        assert_eq!(n.link(0, 2), Link::CrossSocket);
        assert_eq!(n.gpus[3].health, Health::Unhealthy);
        let e = entry("RTX-9999", None).into_cluster().unwrap_err();
        assert_eq!(e.field, "gpus.model");
        assert!(e.problem.contains("RTX-9999"));
        assert_eq!(
            entry("L4", Some("mesh")).into_cluster().unwrap_err().field,
            "gpus.topology"
        );
    }

    #[test]
    fn mig_instances_are_laid_out_on_mig_gpus() {
        let mut f = entry("A100-80GB", None);
        let g = f.nodes[0].gpus.as_mut().unwrap();
        g.mig_enabled = vec![1];
        g.mig_instances = vec!["3g.40gb".into(), "3g.40gb".into()];
        let c = f.clone().into_cluster().unwrap();
        let gpu = &c.nodes()[0].gpus[1];
        let starts: Vec<u8> = gpu.mig_instances.iter().map(|m| m.start).collect();
        assert_eq!(starts, [0, 4]);
        assert_eq!(gpu.mig_instances[1].uuid, "MIG-n-1-1");
        assert!(c.nodes()[0].gpus[0].mig_instances.is_empty());
        // A third 3g.40gb has no placement left.
        f.nodes[0]
            .gpus
            .as_mut()
            .unwrap()
            .mig_instances
            .push("3g.40gb".into());
        let e = f.into_cluster().unwrap_err();
        assert_eq!(e.field, "gpus.migInstances");
        assert!(e.problem.contains("3g.40gb"), "{}", e.problem);
    }
}
