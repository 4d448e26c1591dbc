//! The state of a fill when the arrived workload reaches a share of the
//! cluster's GPU capacity (100 %: the fill experiment's headline point): the
//! cluster as permuted for that seed, its ledger, and a label per allocation,
//! for the report's mosaic. Same arrival order, node permutation and policy as
//! [`super::fill::run_fill`] with that seed, so the picture is of the run the
//! report's numbers come from.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use tessera_core::request::GpuAsk;
use tessera_core::{AllocId, Cluster, Ledger, Scheduler};

use super::fill::{FillConfig, FillError, arrival_order, fill_policy, permute_nodes, typical_pods};
use crate::trace::TracePod;

/// A fill stopped at a share of capacity.
pub struct FillSnapshot {
    pub cluster: Cluster,
    pub ledger: Ledger,
    /// Per allocation: its group (the kind of request, standing in for a
    /// namespace: traces have none) and the pod's name.
    pub labels: FxHashMap<AllocId, (String, String)>,
}

/// The kind of GPU request, the mosaic's colour for trace pods.
fn group(ask: &GpuAsk) -> String {
    match ask {
        GpuAsk::None => "cpu-only".into(),
        GpuAsk::Mig { .. } => "mig".into(),
        _ if ask.gpu_count() > 1 => "multi-gpu".into(),
        _ if ask.milli_per_gpu() >= 1000 => "one-gpu".into(),
        _ if ask.milli_per_gpu() > 500 => "share>0.5".into(),
        _ => "share<=0.5".into(),
    }
}

/// Fills as [`super::fill::run_fill`] does until `pct` % of the GPU capacity has arrived.
pub fn fill_until(
    cluster: &Cluster,
    pods: &[TracePod],
    policy_name: &str,
    seed: u64,
    config: &FillConfig,
    pct: f64,
) -> Result<FillSnapshot, FillError> {
    let capacity = cluster.gpu_count() as u64 * 1000;
    if capacity == 0 {
        return Err(FillError::NoGpus);
    }
    if pods.is_empty() {
        return Err(FillError::NoPods);
    }
    let workload = typical_pods(pods, config.typical_coverage);
    let mut scheduler = Scheduler::new(fill_policy(cluster, policy_name, Arc::new(workload))?);
    let mut rng = SmallRng::seed_from_u64(seed);
    let order = arrival_order(pods, capacity, config, &mut rng);
    let cluster = if config.permute_nodes {
        permute_nodes(cluster, &mut rng)?
    } else {
        cluster.clone()
    };
    let mut ledger = Ledger::new(&cluster);
    let mut labels = FxHashMap::default();
    let stop = (capacity as f64 * pct / 100.0) as u64;
    let mut arrived = 0u64;
    for &i in &order {
        let pod = &pods[i];
        if arrived + pod.request.gpu.total_milli() > stop {
            break;
        }
        arrived += pod.request.gpu.total_milli();
        if let Some(p) = scheduler.place(&cluster, &ledger, &pod.request, &mut rng) {
            let id = ledger
                .apply(&cluster, &p)
                .map_err(|source| FillError::Ledger {
                    pod: pod.name.clone(),
                    source,
                })?;
            labels.insert(id, (group(&pod.request.gpu), pod.name.clone()));
        }
    }
    Ok(FillSnapshot {
        cluster,
        ledger,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload;

    #[test]
    fn the_snapshot_holds_about_the_arrived_share_and_no_more() {
        let s = workload::generate(42);
        let config = FillConfig::for_workload(workload::NAME);
        let cap = s.cluster.gpu_count() as u64 * 1000;
        let half = fill_until(&s.cluster, &s.pods, "tessera", 42, &config, 50.0).unwrap();
        let full = fill_until(&s.cluster, &s.pods, "tessera", 42, &config, 100.0).unwrap();
        let used = |f: &FillSnapshot| f.ledger.used_milli();
        // Allocated never exceeds what arrived, and more arrived at 100 % than at 50 %.
        assert!(used(&half) <= cap / 2, "{} > {}", used(&half), cap / 2);
        assert!(used(&full) > used(&half));
        assert_eq!(full.labels.len(), full.ledger.allocation_count());
    }
}
