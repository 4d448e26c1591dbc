//! The state of a fill when the arrived workload reaches a share of the
//! cluster's GPU capacity (100 %: the fill experiment's headline point): the
//! cluster as permuted for that seed, its ledger, and a label per allocation,
//! for the report's mosaic. Same arrival order, node permutation and policy as
//! [`super::fill::run_fill`] with that seed, so the picture is of the run the
//! report's numbers come from.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use tessera_core::frag::TargetWorkload;
use tessera_core::policy;
use tessera_core::request::GpuAsk;
use tessera_core::{AllocId, Cluster, Ledger};

use super::fill::{Event, FillConfig, FillError, drive};
use crate::trace::TracePod;

/// A fill stopped at a share of capacity.
pub struct FillSnapshot {
    pub cluster: Cluster,
    pub ledger: Ledger,
    /// Per allocation: its group (the kind of request, standing in for a
    /// namespace: traces have none) and the pod's name.
    pub labels: FxHashMap<AllocId, (String, String)>,
    /// The workload the policy measured fragment against at that point (the learned
    /// target for `tessera`, the trace's typical pods otherwise): what a picture of
    /// this state should measure fragment against too.
    pub target: Arc<TargetWorkload>,
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

/// Fills as [`super::fill::run_fill`] does (the same fill, policy and information)
/// until `pct` % of the GPU capacity has arrived: stops before the pod that would
/// take the arrived demand past it.
pub fn fill_until(
    cluster: &Cluster,
    pods: &[TracePod],
    policy_name: &str,
    seed: u64,
    config: &FillConfig,
    pct: f64,
) -> Result<FillSnapshot, FillError> {
    let stop = (cluster.gpu_count() as f64 * 1000.0 * pct / 100.0) as u64;
    let mut labels = FxHashMap::default();
    let run = drive(
        cluster,
        pods,
        |args| policy::by_name(policy_name, &args),
        seed,
        config,
        Some(stop),
        |event| {
            if let Event::Arrived {
                pod,
                placed: Some((_, id)),
                ..
            } = event
            {
                labels.insert(id, (group(&pod.request.gpu), pod.name.clone()));
            }
        },
    )?;
    Ok(FillSnapshot {
        cluster: run.cluster,
        ledger: run.ledger,
        labels,
        target: run.target,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fill::{Knowledge, run_fill, typical_pods};
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

    /// Without a stop the snapshot is the fill run itself: the same pods placed,
    /// for a policy that learns its target as for one that does not.
    #[test]
    fn the_snapshot_is_the_run_the_report_measures() {
        let s = workload::generate(42);
        let mut config = FillConfig::for_workload(workload::NAME);
        for knowledge in [Knowledge::Typical, Knowledge::Online] {
            config.knowledge = knowledge;
            for policy in ["tessera", "fgd"] {
                let run = run_fill(&s.cluster, &s.pods, policy, 42, &config).unwrap();
                let snap = fill_until(&s.cluster, &s.pods, policy, 42, &config, 1e9).unwrap();
                assert_eq!(
                    snap.ledger.allocation_count(),
                    run.pods_placed,
                    "{policy} {knowledge:?}"
                );
                let alloc = snap.ledger.used_milli() as f64 / run.capacity_gpu_milli as f64 * 100.0;
                let last = run.curve.last().unwrap();
                assert!(
                    alloc >= last.alloc_pct - 1e-9,
                    "{policy}: {alloc} < {}",
                    last.alloc_pct
                );
            }
        }
        // What `tessera` measured against is its learned target, not the typical pods.
        let snap = fill_until(&s.cluster, &s.pods, "tessera", 42, &config, 100.0).unwrap();
        let typical = typical_pods(&s.pods, config.typical_coverage);
        assert_ne!(*snap.target, typical);
    }
}
