//! The defrag experiment on the built-in synthetic workload: after a fill with a
//! policy that scatters pods (`random`) no 8-GPU node is idle, yet the planner
//! frees whole nodes, each with a bounded number of moves, never moving a
//! pinned or non-preemptible pod and never overdrawing a disruption budget.

use tessera_sim::experiment::defrag::{DefragConfig, run, run_grid};
use tessera_sim::workload;

#[test]
fn moves_free_whole_nodes_within_the_rules() {
    let s = workload::generate(42);
    let config = DefragConfig::default();
    let policies = vec!["random".to_string(), "tessera".to_string()];
    let report = run_grid(
        &s.cluster,
        &s.pods,
        workload::NAME,
        &policies,
        &config,
        &[42, 43],
    )
    .unwrap();
    println!("{}", report.table());
    for r in &report.results {
        assert_eq!(r.protected_moved, 0, "{r:?}");
        assert_eq!(r.budget_overdraws, 0, "{r:?}");
        assert_eq!(r.moves, r.moves_by_round.iter().sum::<usize>());
        assert_eq!(r.nodes_freed, r.moves_by_round.len());
        // Every round moves something (idle nodes were used up directly first) and
        // no more than the per-pod limit.
        assert!(
            r.moves_by_round
                .iter()
                .all(|m| (1..=config.max_moves_per_pod).contains(m)),
            "{r:?}"
        );
        assert!(r.direct <= r.big_nodes_idle);
    }
    // The scattering fill leaves no 8-GPU node idle, and moves free some.
    for r in report.results.iter().filter(|r| r.policy == "random") {
        assert_eq!(r.big_nodes_idle, 0, "{r:?}");
        assert!(r.nodes_freed >= 1, "{r:?}");
        let n = r.moves_per_node.unwrap();
        assert!(n >= 1.0 && n <= config.max_moves_per_pod as f64);
    }
}

#[test]
fn tighter_budgets_never_free_more_and_protecting_everything_frees_nothing() {
    let s = workload::generate(42);
    let loose = DefragConfig::default();
    let tight = DefragConfig {
        disruptions_allowed: 0,
        ..loose.clone()
    };
    let frozen = DefragConfig {
        pinned_pct: 100,
        ..loose.clone()
    };
    let run_with =
        |c: &DefragConfig| run(&s.cluster, &s.pods, workload::NAME, "random", c, 42).unwrap();
    let (l, t, f) = (run_with(&loose), run_with(&tight), run_with(&frozen));
    // With no disruptions allowed only pods outside every budget move.
    assert!(t.nodes_freed <= l.nodes_freed, "{t:?} vs {l:?}");
    assert_eq!(t.budget_overdraws, 0);
    assert_eq!((f.nodes_freed, f.moves), (0, 0), "{f:?}");
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let s = workload::generate(3);
    let c = DefragConfig {
        max_rounds: 5,
        ..DefragConfig::default()
    };
    let a = run(&s.cluster, &s.pods, workload::NAME, "random", &c, 9).unwrap();
    let b = run(&s.cluster, &s.pods, workload::NAME, "random", &c, 9).unwrap();
    assert_eq!(a, b);
}
