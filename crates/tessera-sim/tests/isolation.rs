//! The isolation experiment (issue 13), small deterministic runs.
//!
//! On the workload derived from openb `default` (`../shared/data/openb`; under
//! `CI=true` the trace must be there) Tessera's per-request choice with dynamic MIG
//! leaves at least 25 % fewer unserved GPUs (capacity serving no pod's request)
//! than the best static MIG layout and than MPS only, and rejects fewer
//! hard-isolation pods. Without the trace the built-in synthetic workload runs;
//! there the margin over MPS only is smaller (22.6 % measured), so that run checks
//! only that dynamic is best on both counts.

use std::path::{Path, PathBuf};

use tessera_sim::experiment::isolation::{
    Arm, IsolationConfig, IsolationResult, builtin_cluster, derive_workload, run_isolation, table,
};
use tessera_sim::trace::openb::load_pods;

fn openb_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb");
    if dir.join("openb_pod_list_default.csv").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{} is missing under CI",
        dir.display()
    );
    None
}

/// `margin`: the least fraction by which dynamic must undercut the others' unserved GPUs.
fn check(r: &IsolationResult, margin: f64) {
    println!("{}", table(r));
    let get = |a| r.arm(a).unwrap();
    let dynamic = get(Arm::TesseraDynamic);
    let best_static = [Arm::StaticAll1g, Arm::StaticBalanced]
        .into_iter()
        .map(|a| get(a).fill.unserved_gpus)
        .fold(f64::INFINITY, f64::min);
    let mps = get(Arm::MpsOnly).fill.unserved_gpus;
    let d = dynamic.fill.unserved_gpus;
    assert!(
        d <= (1.0 - margin) * best_static,
        "dynamic {d} vs best static {best_static}"
    );
    assert!(d <= (1.0 - margin) * mps, "dynamic {d} vs MPS only {mps}");
    for a in [Arm::StaticAll1g, Arm::StaticBalanced, Arm::MpsOnly] {
        assert!(
            dynamic.fill.hard_rejected < get(a).fill.hard_rejected,
            "hard rejections: dynamic {} vs {:?} {}",
            dynamic.fill.hard_rejected,
            a,
            get(a).fill.hard_rejected
        );
        // Static arms never re-partition.
        assert_eq!(get(a).replay.repartitions, 0);
    }
    assert!(dynamic.replay.repartitions > 0);
    // The capacity is accounted for: what the grants hold beyond the requests (summed
    // over placements) plus the requests served plus the ledger's free capacity.
    for a in &r.arms {
        let f = &a.fill;
        let total = f.served_gpus + f.granted_beyond_request_gpus + f.unallocated_gpus;
        assert!(
            (total - f64::from(r.gpus)).abs() < 1e-6,
            "{}: {total} GPUs accounted for of {}",
            a.name,
            r.gpus
        );
        assert!(f.unallocated_on_mig_gpus <= f.unallocated_gpus + 1e-9);
    }
    assert_eq!(get(Arm::MpsOnly).fill.unallocated_on_mig_gpus, 0.0);
}

#[test]
fn dynamic_choice_beats_static_layouts_and_mps_on_synthetic() {
    let syn = tessera_sim::workload::generate(42);
    let pods = derive_workload(&syn.pods, 42, 50);
    let config = IsolationConfig {
        replay_pods: 600,
        ..IsolationConfig::default()
    };
    let r = run_isolation(&builtin_cluster(), "synthetic-default", &pods, &config).unwrap();
    check(&r, 0.0);
    assert!(
        r.arm(Arm::TesseraDynamic).unwrap().fill.unserved_gpus
            < r.arm(Arm::MpsOnly).unwrap().fill.unserved_gpus
    );
    // Deterministic: the same inputs give the same result.
    let again = run_isolation(&builtin_cluster(), "synthetic-default", &pods, &config).unwrap();
    assert_eq!(r, again);
}

#[test]
fn dynamic_choice_beats_static_layouts_and_mps_on_openb_default() {
    let Some(dir) = openb_dir() else { return };
    let catalog = tessera_core::model::Catalog::default();
    let trace = load_pods(&dir.join("openb_pod_list_default.csv"), &catalog).unwrap();
    let pods = derive_workload(&trace, 42, 50);
    let config = IsolationConfig {
        replay_pods: 1_000,
        ..IsolationConfig::default()
    };
    check(
        &run_isolation(&builtin_cluster(), "openb default", &pods, &config).unwrap(),
        0.25,
    );
}
