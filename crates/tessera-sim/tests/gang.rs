//! The gang experiment on the built-in synthetic cluster and workload: placed as
//! gangs, every distributed job completes, nothing deadlocks and no GPU is held
//! by a half-placed job; bound member by member, the same jobs hold GPUs idle
//! (and, under this load, deadlock). Same inputs → same result.

use tessera_sim::experiment::gang::{GangConfig, Mode, run_seeds};
use tessera_sim::workload;

/// The documented default: 300 jobs, a 245 s mean gap (1.2 × the built-in
/// cluster's capacity while jobs arrive).
fn config() -> GangConfig {
    GangConfig::default()
}

#[test]
fn gangs_never_deadlock_or_waste_and_member_by_member_does() {
    let s = workload::generate(42);
    let report = run_seeds(
        &s.cluster,
        &s.pods,
        workload::NAME,
        "tessera",
        &config(),
        &[42, 43],
    )
    .unwrap();
    println!("{}", report.table());
    assert_eq!(report.results.len(), 4);
    for r in &report.results {
        assert_eq!(r.jobs, 300);
        match r.mode {
            Mode::Gang => {
                assert!(!r.deadlock, "{r:?}");
                assert_eq!(r.jobs_completed + r.jobs_rejected, r.jobs, "{r:?}");
                assert_eq!(r.jobs_stuck, 0);
                assert_eq!(r.single_pods_completed, r.single_pods);
                // Members start together: nothing is held before a job starts.
                assert_eq!(r.wasted_gpu_hours, 0.0);
                assert_eq!(r.gpus_held_at_end, 0.0);
            }
            Mode::NonGang => {
                assert!(r.wasted_gpu_hours_by_cutoff > 0.0, "{r:?}");
                assert!(r.wasted_gpu_hours >= r.wasted_gpu_hours_by_cutoff);
                // A deadlocked run ends with partly bound jobs holding GPUs.
                if r.deadlock {
                    assert!(r.jobs_partly_bound_at_end > 0 && r.gpus_held_at_end > 0.0);
                    assert!(r.jobs_completed < r.jobs);
                }
            }
        }
    }
    // Under 1.2 × load, member-by-member binding deadlocks at least once.
    assert!(
        report
            .results
            .iter()
            .any(|r| r.mode == Mode::NonGang && r.deadlock)
    );
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let s = workload::generate(7);
    let c = GangConfig {
        jobs: 40,
        ..GangConfig::default()
    };
    let a = run_seeds(&s.cluster, &s.pods, workload::NAME, "tessera", &c, &[5]).unwrap();
    let b = run_seeds(&s.cluster, &s.pods, workload::NAME, "tessera", &c, &[5]).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.table(), b.table());
}
