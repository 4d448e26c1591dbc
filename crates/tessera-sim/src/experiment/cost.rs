//! What a replay costs, measured three ways, so that the TCO claim can be
//! checked on the same runs as the queueing delay:
//!
//! - **billed**: GPU-hours the pods were granted (a share counts its fraction,
//!   a MIG instance its compute slices): what chargeback would bill the
//!   teams; the same for every policy that places every pod, unless the
//!   dynamic price (the core's default curve, per model) makes busy hours dearer;
//! - **occupied**: GPU-hours of GPUs with any tenant (an idle GPU could be
//!   powered down or given back);
//! - **powered**: GPU-hours of nodes with any tenant (a cloud autoscaler
//!   removes empty nodes, and nodes are rented whole): the TCO a packing
//!   policy lowers.
//!
//! Every figure is an exact integral: the replay changes its state only at
//! events, and [`CostMeter::advance`] is called before each.

use serde::Serialize;
use tessera_core::chargeback::{
    Account, DynamicPrice, Holding, MILLI_MS_PER_GPU_SECOND, Meter, Mode, PriceTable, bill,
};
use tessera_core::model::{Cluster, Health};
use tessera_core::{Ledger, Placement};

/// The cost of one replay, in GPU-hours (price 1 per GPU-hour for every model).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct ReplayCost {
    pub billed_gpu_hours: f64,
    /// `billed` with the dynamic price of each hour's utilisation.
    pub billed_dynamic: f64,
    pub occupied_gpu_hours: f64,
    pub powered_gpu_hours: f64,
}

/// Integrates a replay's cost over its events.
pub struct CostMeter {
    meter: Meter,
    holding: Holding,
    occupied_gpus: u64,
    powered_gpus: u64,
    occupied_gpu_s: u64,
    powered_gpu_s: u64,
    last_s: u64,
}

const NAMESPACE: &str = "replay";

impl CostMeter {
    pub fn new(cluster: &Cluster) -> CostMeter {
        let mut holding = Holding::default();
        for n in cluster.nodes() {
            for g in &n.gpus {
                if g.health == Health::Healthy {
                    *holding
                        .capacity_milli
                        .entry(cluster.catalog.spec(g.model).name.clone())
                        .or_default() += 1000;
                }
            }
        }
        // Hour-long buckets, all kept: the dynamic price follows each hour's load.
        let mut meter = Meter::new(3_600_000, usize::MAX);
        meter.observe(0, holding.clone());
        CostMeter {
            meter,
            holding,
            occupied_gpus: 0,
            powered_gpus: 0,
            occupied_gpu_s: 0,
            powered_gpu_s: 0,
            last_s: 0,
        }
    }

    /// Charges the state in force since the last call up to `t_s`.
    pub fn advance(&mut self, t_s: u64) {
        if t_s <= self.last_s {
            return;
        }
        let dt = t_s - self.last_s;
        self.occupied_gpu_s += self.occupied_gpus * dt;
        self.powered_gpu_s += self.powered_gpus * dt;
        self.meter.observe(t_s * 1000, self.holding.clone());
        self.last_s = t_s;
    }

    /// Accounts for `p` being placed (`sign` = 1) or released (`sign` = -1)
    /// on its node, given the node's occupancy before and after.
    pub fn change(
        &mut self,
        cluster: &Cluster,
        p: &Placement,
        sign: i64,
        before: (u64, bool),
        after: (u64, bool),
    ) {
        let node = cluster.node(p.node);
        for g in &p.grants {
            let Some(gpu) = node.gpus.get(usize::from(g.gpu)) else {
                continue;
            };
            let acct = Account {
                queue: String::new(),
                namespace: NAMESPACE.to_string(),
                model: cluster.catalog.spec(gpu.model).name.clone(),
                mode: Mode::of_grant(g.cores_milli, g.mig.is_some()),
            };
            let m = self.holding.milli.entry(acct).or_default();
            *m = if sign > 0 {
                *m + u64::from(g.cores_milli)
            } else {
                m.saturating_sub(u64::from(g.cores_milli))
            };
        }
        self.holding.milli.retain(|_, m| *m > 0);
        // In force from now: an empty interval charges nothing and replaces the holding.
        self.meter.observe(self.last_s * 1000, self.holding.clone());
        self.occupied_gpus = (self.occupied_gpus + after.0).saturating_sub(before.0);
        let gpus = node.gpus.len() as u64;
        match (before.1, after.1) {
            (false, true) => self.powered_gpus += gpus,
            (true, false) => self.powered_gpus = self.powered_gpus.saturating_sub(gpus),
            _ => {}
        }
    }

    pub fn finish(mut self, t_s: u64) -> ReplayCost {
        self.advance(t_s);
        let prices = PriceTable {
            dynamic: Some(DynamicPrice::default()),
            ..PriceTable::default()
        };
        let lines = bill(self.meter.buckets(0, u64::MAX), &prices);
        let billed_s: u64 = self.meter.totals().values().sum();
        ReplayCost {
            billed_gpu_hours: billed_s as f64 / MILLI_MS_PER_GPU_SECOND / 3600.0,
            billed_dynamic: lines.iter().map(|l| l.cost).sum(),
            occupied_gpu_hours: self.occupied_gpu_s as f64 / 3600.0,
            powered_gpu_hours: self.powered_gpu_s as f64 / 3600.0,
        }
    }
}

/// A node's occupancy for [`CostMeter::change`]: GPUs with a tenant, and whether it holds any pod.
pub fn occupancy(ledger: &Ledger, node: tessera_core::NodeId) -> (u64, bool) {
    let n = ledger.node(node);
    ((n.gpus.len() - n.idle_gpus()) as u64, n.allocations > 0)
}

#[cfg(test)]
mod tests {
    use tessera_core::model::Catalog;
    use tessera_core::placement::GpuGrant;
    use tessera_core::{Node, NodeId};

    use super::*;

    #[test]
    fn powered_counts_whole_nodes_and_billed_counts_grants() {
        let catalog = Catalog::default();
        let a100 = catalog.find("A100-80GB").expect("built-in model");
        let cluster = Cluster::new(
            catalog,
            vec![
                Node::uniform("a", 64_000, 512 * 1024, a100, 8),
                Node::uniform("b", 64_000, 512 * 1024, a100, 8),
            ],
        )
        .unwrap();
        let mut ledger = Ledger::new(&cluster);
        let mut c = CostMeter::new(&cluster);
        let half = Placement {
            node: NodeId(0),
            grants: [GpuGrant {
                gpu: 0,
                memory_mib: 1024,
                cores_milli: 500,
                exclusive: false,
                mig: None,
            }]
            .into_iter()
            .collect(),
            cpu_milli: 1000,
            memory_mib: 1024,
            class: 0,
            score: 0.0,
            terms: Vec::new(),
        };
        c.advance(100);
        let before = occupancy(&ledger, NodeId(0));
        let id = ledger.apply(&cluster, &half).unwrap();
        c.change(&cluster, &half, 1, before, occupancy(&ledger, NodeId(0)));
        c.advance(3_700);
        let before = occupancy(&ledger, NodeId(0));
        ledger.release(id).unwrap();
        c.change(&cluster, &half, -1, before, occupancy(&ledger, NodeId(0)));
        let cost = c.finish(7_200);
        // Half a GPU for 3,600 s: 0.5 GPU-hours billed, 1 GPU occupied for 1 h,
        // the 8-GPU node powered for 1 h.
        assert!((cost.billed_gpu_hours - 0.5).abs() < 1e-12, "{cost:?}");
        assert!((cost.occupied_gpu_hours - 1.0).abs() < 1e-12, "{cost:?}");
        assert!((cost.powered_gpu_hours - 8.0).abs() < 1e-12, "{cost:?}");
        // 0.5 of 16 GPUs is 3 % utilisation: the dynamic price is below list.
        assert!(cost.billed_dynamic < cost.billed_gpu_hours, "{cost:?}");
    }
}
