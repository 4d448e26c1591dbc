//! The *dra* experiment: kube-scheduler's first-fit DRA allocation against Tessera's
//! device choice, on the fill protocol.

use std::sync::Arc;

use tessera_core::model::{Catalog, Cluster, Node};
use tessera_core::request::Request;
use tessera_sim::experiment::dra::{Arm, run_arm, run_dra};
use tessera_sim::experiment::fill::{FillConfig, Knowledge};
use tessera_sim::grid::Workload;
use tessera_sim::trace::TracePod;
use tessera_sim::workload as synthetic;

fn pod(name: &str, request: Request) -> TracePod {
    TracePod {
        name: name.into(),
        request,
        creation_s: None,
        deletion_s: None,
        scheduled_s: None,
    }
}

/// One node of two T4s; four shares arrive in name order: 0.5, 0.7, 0.3, 0.5 (2.0 GPUs,
/// exactly the capacity, so the fourth arrival is the arrived = 100 % sample).
///
/// First fit: 0.5 -> GPU 0 (0.5 left); 0.7 does not fit GPU 0 -> GPU 1 (0.3 left);
/// 0.3 -> GPU 0, the first with room (0.2 left), although it fills GPU 1 exactly;
/// 0.5 then fits neither GPU (0.2 and 0.3 left) and fails: 1.5 of 2 GPUs allocated,
/// 25 % unallocated.
/// Tessera: 0.3 -> GPU 1 (no leftover), so 0.5 fits GPU 0: 2.0 of 2, 0 % unallocated.
#[test]
fn first_fit_strands_a_half_gpu_that_tessera_keeps() {
    let cat = Catalog::default();
    let t4 = cat.find("T4").unwrap();
    let cluster = Cluster::new(cat, vec![Node::uniform("a", 32_000, 128_000, t4, 2)]).unwrap();
    let pods: Vec<TracePod> = [500, 700, 300, 500]
        .iter()
        .enumerate()
        .map(|(i, &m)| pod(&format!("p{i}"), Request::share_milli(m, 1000, 1000)))
        .collect();
    // Name order, no node permutation: the arrival order is the one above. Inflation to
    // 1.3 × 2000 = 2600 milli appends copies after the fourth pod only.
    let config = FillConfig {
        shuffle: false,
        permute_nodes: false,
        ..FillConfig::for_workload("strand")
    };
    let at_100 = |arm| {
        let r = run_arm(&cluster, &pods, arm, 42, &config).unwrap();
        let p = r.at_100.expect("the fourth arrival is at 100 %");
        assert_eq!(p.arrived_pct, 100.0);
        p.unallocated_pct
    };
    assert_eq!(at_100(Arm::FirstFit), 25.0);
    assert_eq!(at_100(Arm::Tessera), 0.0);
    // One node: kube's node is Tessera's node, and Tessera's devices suffice.
    assert_eq!(at_100(Arm::KubeNodeTesseraDevices), 0.0);
}

/// Same inputs, same report, byte for byte, whatever the number of threads; and the
/// arms are really different policies (Tessera leaves fewer GPUs unallocated than
/// first fit on the synthetic openb-shaped workload).
#[test]
fn the_report_is_deterministic() {
    let s = synthetic::generate(42);
    let w = Workload {
        name: synthetic::NAME.into(),
        cluster: Arc::new(s.cluster),
        pods: Arc::new(s.pods),
    };
    let seeds = [42, 43];
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let r = pool
            .install(|| run_dra(&w, &seeds, Knowledge::Typical, &|| {}))
            .unwrap();
        serde_json::to_string(&r).unwrap()
    };
    let one = run(1);
    assert_eq!(one, run(3));
    let r: serde_json::Value = serde_json::from_str(&one).unwrap();
    let arms = r["arms"].as_array().unwrap();
    assert_eq!(arms.len(), Arm::ALL.len());
    assert_eq!(arms[0]["arm"], "first-fit");
    let unalloc = |i: usize| arms[i]["summary"]["unallocated_pct_mean"].as_f64().unwrap();
    assert!(unalloc(1) < unalloc(0), "{} vs {}", unalloc(1), unalloc(0));
}
