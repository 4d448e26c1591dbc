//! Device-aware preemption against the kube-scheduler-like baseline, on the same
//! high-priority arrivals into a full cluster of shared GPUs: Tessera evicts at
//! most half the victims and half the GPU-seconds, and none of its evictions is
//! useless. On the built-in cluster (always), and on the openb `default` trace from
//! `../shared/data/openb` (skipped when missing, required under CI=true).

use std::path::{Path, PathBuf};

use tessera_sim::experiment::preempt::{
    PreemptConfig, PreemptSummary, run_preempt_seeds, summarise,
};
use tessera_sim::trace::openb;
use tessera_sim::workload;

fn check(s: &PreemptSummary) {
    let (t, k) = (&s.tessera, &s.kube_like);
    assert!(k.victims > 0, "the baseline must have preempted: {k:?}");
    assert!(
        t.victims as f64 <= 0.5 * k.victims as f64,
        "victims: tessera {} vs kube-like {}",
        t.victims,
        k.victims
    );
    assert!(
        t.gpu_seconds_lost <= 0.5 * k.gpu_seconds_lost,
        "GPU-seconds lost: tessera {} vs kube-like {}",
        t.gpu_seconds_lost,
        k.gpu_seconds_lost
    );
    assert_eq!(
        t.useless_evictions, 0,
        "every Tessera eviction lets its preemptor run"
    );
    assert!(t.placed_after_preemption > 0, "tessera preempted");
    // Every arrival is accounted for once.
    for o in [t, k] {
        assert_eq!(
            o.placed_directly + o.placed_after_preemption + o.unplaced,
            o.arrivals
        );
    }
}

#[test]
fn fewer_victims_and_less_gpu_time_on_the_builtin_cluster() {
    let s = workload::generate(42);
    let config = PreemptConfig {
        workload: workload::NAME.into(),
        arrivals: 60,
        ..PreemptConfig::default()
    };
    let runs = run_preempt_seeds(&s.cluster, &s.pods, &[42, 43], &config).unwrap();
    check(&summarise(&runs));
}

fn data_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb");
    if dir.join("openb_pod_list_default.csv").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} is missing (required under CI)",
        dir.display()
    );
    eprintln!("skipping: {} not found", dir.display());
    None
}

#[test]
fn fewer_victims_and_less_gpu_time_on_openb() {
    let Some(dir) = data_dir() else { return };
    let cluster = openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = openb::load_pods(&dir.join("openb_pod_list_default.csv"), &cluster.catalog).unwrap();
    let config = PreemptConfig {
        workload: "default".into(),
        arrivals: 60,
        ..PreemptConfig::default()
    };
    let runs = run_preempt_seeds(&cluster, &pods, &[42], &config).unwrap();
    check(&summarise(&runs));
}
