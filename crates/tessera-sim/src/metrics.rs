//! Cluster-level measures of the fill experiment, as the FGD artifact computes them.
//!
//! - GPU allocation ratio: allocated milli-GPU over cluster capacity.
//! - Fragmentation (FGD's definition, [`tessera_core::frag`]): the expected idle
//!   GPU that the typical pods could not use, summed over nodes; as a rate of all
//!   idle GPU and as a share of capacity.
//!
//! [`FragTracker`] keeps each node's fragment cached and refreshes only the node a
//! placement changed, so a measurement after every arrival costs one node's work.
//! [`discretize`] turns the per-arrival samples into the integer-percent curve of
//! the artifact's merge scripts.

use serde::Serialize;
use tessera_core::frag::{FragNode, TargetWorkload, node_frag};
use tessera_core::ledger::Ledger;
use tessera_core::model::{Cluster, NodeId};

/// Per-node fragmentation, cached, with running cluster totals.
#[derive(Debug, Clone)]
pub struct FragTracker {
    workload: TargetWorkload,
    frag: Vec<f64>,
    idle: Vec<u64>,
    frag_sum: f64,
    idle_sum: u64,
}

impl FragTracker {
    /// Measures every node of `ledger` against `workload`.
    pub fn new(cluster: &Cluster, ledger: &Ledger, workload: TargetWorkload) -> FragTracker {
        let mut t = FragTracker {
            workload,
            frag: vec![0.0; cluster.len()],
            idle: vec![0; cluster.len()],
            frag_sum: 0.0,
            idle_sum: 0,
        };
        for id in cluster.ids() {
            t.refresh(cluster, ledger, id);
        }
        t.resum();
        t
    }

    /// Re-measures one node after it changed.
    pub fn update(&mut self, cluster: &Cluster, ledger: &Ledger, id: NodeId) {
        let i = id.0 as usize;
        self.frag_sum -= self.frag[i];
        self.idle_sum -= self.idle[i];
        self.refresh(cluster, ledger, id);
        self.frag_sum += self.frag[i];
        self.idle_sum += self.idle[i];
    }

    fn refresh(&mut self, cluster: &Cluster, ledger: &Ledger, id: NodeId) {
        let used = ledger.node(id);
        let mut buf = [0u32; 64];
        let n = used.gpus.len().min(64);
        for (b, f) in buf.iter_mut().zip(used.free_milli()) {
            *b = f;
        }
        let free = &buf[..n];
        let i = id.0 as usize;
        self.idle[i] = free.iter().map(|&f| u64::from(f)).sum();
        self.frag[i] = node_frag(
            &FragNode {
                free_milli: free,
                free_cpu_milli: used.free_cpu_milli,
                model: cluster.node(id).primary_model(),
            },
            &self.workload,
        );
    }

    /// Recomputes the totals from the per-node values (drops accumulated rounding).
    fn resum(&mut self) {
        self.frag_sum = self.frag.iter().sum();
        self.idle_sum = self.idle.iter().sum();
    }

    /// Expected fragment summed over nodes, in milli-GPU.
    pub fn frag_milli(&self) -> f64 {
        self.frag_sum.max(0.0)
    }

    /// Idle (unallocated) GPU summed over nodes, in milli-GPU.
    pub fn idle_milli(&self) -> u64 {
        self.idle_sum
    }

    /// Fragment over idle GPU, in per cent (0 when nothing is idle).
    pub fn frag_rate_pct(&self) -> f64 {
        if self.idle_sum == 0 {
            0.0
        } else {
            self.frag_milli() / self.idle_sum as f64 * 100.0
        }
    }
}

/// One sample: every measure after one arrival, in per cent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FillPoint {
    /// Submitted GPU demand (placed or not) over cluster capacity.
    pub arrived_pct: f64,
    /// Allocated milli-GPU over cluster capacity.
    pub alloc_pct: f64,
    /// `100 − alloc_pct`.
    pub unallocated_pct: f64,
    /// Fragmented idle GPU over all idle GPU.
    pub frag_rate_pct: f64,
    /// Fragmented idle GPU over cluster capacity.
    pub frag_amount_pct: f64,
}

impl FillPoint {
    fn mean(points: &[FillPoint], arrived_pct: f64) -> FillPoint {
        let n = points.len() as f64;
        let avg = |f: fn(&FillPoint) -> f64| points.iter().map(f).sum::<f64>() / n;
        FillPoint {
            arrived_pct,
            alloc_pct: avg(|p| p.alloc_pct),
            unallocated_pct: avg(|p| p.unallocated_pct),
            frag_rate_pct: avg(|p| p.frag_rate_pct),
            frag_amount_pct: avg(|p| p.frag_amount_pct),
        }
    }
}

/// The integer-percent curve the artifact's `merge_*_discrete.py` scripts build:
/// column `x` (0..=`max_pct`) is the mean of the samples whose arrived % rounds to
/// `x`; if none does, the mean of those within ±1 of `x`; if none is, the column
/// is left out. `samples` must be in arrival order (arrived % never decreases).
pub fn discretize(samples: &[FillPoint], max_pct: u32) -> Vec<FillPoint> {
    let mut out = Vec::new();
    for x in 0..=max_pct {
        let xf = f64::from(x);
        let exact: Vec<FillPoint> = samples
            .iter()
            .filter(|p| p.arrived_pct.round() == xf)
            .copied()
            .collect();
        let chosen = if exact.is_empty() {
            samples
                .iter()
                .filter(|p| (p.arrived_pct - xf).abs() <= 1.0)
                .copied()
                .collect()
        } else {
            exact
        };
        if !chosen.is_empty() {
            out.push(FillPoint::mean(&chosen, xf));
        }
    }
    out
}

/// Mean and sample standard deviation (n − 1), as pandas and seaborn compute them.
pub fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, var.sqrt())
}

/// Median (mean of the two middle values for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(arrived: f64, alloc: f64) -> FillPoint {
        FillPoint {
            arrived_pct: arrived,
            alloc_pct: alloc,
            unallocated_pct: 100.0 - alloc,
            frag_rate_pct: 0.0,
            frag_amount_pct: 0.0,
        }
    }

    #[test]
    fn discretize_means_rounded_samples_and_falls_back_to_neighbours() {
        // 0.2 and 0.4 round to 0; 2.6 rounds to 3; nothing rounds to 1 or 2.
        let s = [p(0.2, 0.1), p(0.4, 0.3), p(2.6, 2.0), p(5.0, 4.0)];
        let c = discretize(&s, 6);
        let xs: Vec<f64> = c.iter().map(|p| p.arrived_pct).collect();
        // 1: none rounds to 1, within ±1: 0.2, 0.4 → mean alloc 0.2.
        // 2: within ±1 of 2: 2.6 → 2.0. 4: within ±1: 5.0. 6: within ±1: 5.0.
        assert_eq!(xs, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!((c[0].alloc_pct - 0.2).abs() < 1e-12);
        assert!((c[1].alloc_pct - 0.2).abs() < 1e-12);
        assert_eq!(c[2].alloc_pct, 2.0);
        assert_eq!(c[3].alloc_pct, 2.0);
        assert_eq!(c[4].alloc_pct, 4.0);
        assert_eq!(c[6].alloc_pct, 4.0);
    }

    /// The cached per-node values equal a full recomputation after placements.
    #[test]
    fn tracker_updates_match_full_recomputation() {
        use tessera_core::frag::TargetWorkload;
        use tessera_core::model::{Catalog, Node};
        use tessera_core::placement::{GpuGrant, Placement};
        use tessera_core::request::Request;
        let cat = Catalog::default();
        let t4 = cat.find("T4").unwrap();
        let c = Cluster::new(
            cat,
            vec![
                Node::uniform("a", 16_000, 1 << 20, t4, 2),
                Node::uniform("b", 16_000, 1 << 20, t4, 4),
            ],
        )
        .unwrap();
        let wl = TargetWorkload::from_requests(
            &[
                Request::share_milli(600, 1000, 0),
                Request::whole(1, 12_000, 0),
                Request::cpu_only(1000, 0),
            ],
            1.0,
        );
        let mut l = Ledger::new(&c);
        let mut t = FragTracker::new(&c, &l, wl.clone());
        // Idle cluster: 6000 idle milli; only the CPU-only third counts: 2000.
        assert_eq!(t.idle_milli(), 6000);
        assert!((t.frag_milli() - 2000.0).abs() < 1e-9);
        let p = Placement {
            node: NodeId(1),
            grants: [GpuGrant::shared(0, 0, 500)].into_iter().collect(),
            cpu_milli: 8000,
            ..Default::default()
        };
        l.apply(&c, &p).unwrap();
        t.update(&c, &l, NodeId(1));
        let fresh = FragTracker::new(&c, &l, wl);
        assert_eq!(t.idle_milli(), 5500);
        assert!((t.frag_milli() - fresh.frag_milli()).abs() < 1e-9);
        assert!((t.frag_rate_pct() - fresh.frag_rate_pct()).abs() < 1e-9);
    }

    #[test]
    fn statistics() {
        let (m, sd) = mean_sd(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        // Sample variance: (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3.
        assert!((sd - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
