//! The HTML report's structure: self-contained, one chart of each kind, SVG that parses
//! as balanced XML-ish markup, and the same bytes for the same report.

use tessera_sim::experiment::replay::{DelayStats, ReplayOptions, ReplayResult, SeriesPoint};
use tessera_sim::grid::{Comparison, CurvePoint, FillSummary, ReplayGrid, ReplayPlan};
use tessera_sim::report::{Report, html, json, table};

fn fill(w: &str, p: &str, un: f64) -> FillSummary {
    FillSummary {
        workload: w.into(),
        policy: p.into(),
        seeds: vec![42, 43],
        unallocated_pct_mean: un,
        unallocated_pct_sd: 0.25,
        unallocated_pct_median: un,
        unallocated_gpus_mean: un * 62.12,
        capacity_gpus: 6212.0,
        pods_failed_mean: 10.0,
        curve: (50..=130)
            .map(|x| CurvePoint {
                arrived_pct: f64::from(x),
                unallocated_pct_median: (100.0 - f64::from(x)).max(un),
                unallocated_pct_mean: (100.0 - f64::from(x)).max(un),
                frag_rate_pct_median: 0.0,
                frag_amount_pct_median: 0.0,
            })
            .collect(),
    }
}

fn replay(p: &str, delay: f64) -> ReplayResult {
    ReplayResult {
        cost: Default::default(),
        workload: "default".into(),
        policy: p.into(),
        seed: 42,
        time_scale: 100.0,
        cycles: 1,
        start_s: 0,
        capacity_gpus: 10,
        pods: 3,
        placed: 3,
        rejected: 0,
        never_placed: 0,
        completed_in_window: 1,
        completed: 3,
        window_s: 100,
        makespan_s: 200,
        delay: DelayStats {
            mean_s: delay,
            p50_s: 0,
            p95_s: 5,
            p99_s: 9,
            max_s: 9,
            waited: 1,
        },
        util_mean_pct: 40.0,
        alloc_share_mean_pct: 50.0,
        util_peak_pct: 80.0,
        alloc_share_peak_pct: 90.0,
        queue_peak: 1,
        series: (0..=10)
            .map(|i| SeriesPoint {
                t_s: i * 10,
                util_pct: i as f64 * 5.0,
                alloc_share_pct: i as f64 * 6.0,
                queued: 0,
            })
            .collect(),
        delay_cdf: vec![(0, 0.0), (0, 0.5), (9, 1.0)],
        policy_rebuilds: 0,
    }
}

fn sample() -> Report {
    let policies = vec!["bestfit".to_string(), "tessera".to_string()];
    Report {
        experiment: "fill+replay".into(),
        workloads: vec!["default".into(), "gpushare40".into()],
        source: "test".into(),
        seeds: vec![42, 43],
        fill_policies: policies,
        fill: vec![
            fill("default", "bestfit", 7.1),
            fill("default", "tessera", 4.0),
            fill("gpushare40", "bestfit", 8.5),
            fill("gpushare40", "tessera", 5.0),
        ],
        replay_policies: vec!["k8s-default".into(), "tessera".into()],
        replay_plan: Some(ReplayPlan {
            options: ReplayOptions::default(),
            delay_bound_s: None,
            search_cycles: 1,
            search_max: 10.0,
        }),
        replay: Some(ReplayGrid {
            runs: vec![replay("k8s-default", 10.0), replay("tessera", 2.0)],
            sustainable: vec![],
            comparisons: vec![Comparison {
                workload: "default".into(),
                baseline: "k8s-default".into(),
                policy: "tessera".into(),
                time_scale: 100.0,
                baseline_mean_delay_s: 10.0,
                policy_mean_delay_s: 2.0,
                delay_ratio: Some(0.2),
                baseline_util_pct: 40.0,
                policy_util_pct: 40.0,
                baseline_alloc_share_pct: 50.0,
                policy_alloc_share_pct: 45.0,
                sustainable_ratio: None,
                baseline_cost: Default::default(),
                policy_cost: Default::default(),
            }],
        }),
        notes: vec!["a <note>".into()],
        mosaic: None,
    }
}

#[test]
fn html_is_self_contained_with_every_chart() {
    let page = html::render(&sample());
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.trim_end().ends_with("</html>"));
    assert!(!page.contains("<script"), "no scripts");
    assert!(!page.contains("src="), "no external resources");
    assert!(!page.contains("href="), "no external resources");
    // One bar chart, two fill curves (one per workload), utilisation + CDF for the
    // replay's workloads (two listed, one with runs: both still get a chart).
    assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
    assert_eq!(page.matches("<svg").count(), 1 + 2 + 2 * 2);
    assert!(page.contains("Unallocated GPU at arrived = 100 % per workload"));
    assert!(page.contains("default: unallocated GPU vs arrived workload"));
    assert!(page.contains("GPU utilisation"));
    assert!(page.contains("queueing-delay CDF"));
    // Bars: 2 workloads × 2 policies.
    assert_eq!(
        page.matches("<rect x=").count() - page.matches("fill=\"#fff\"").count(),
        4
    );
    assert!(page.contains("a &lt;note&gt;"), "text is escaped");
    assert_eq!(page, html::render(&sample()), "same report, same bytes");
}

#[test]
fn table_and_json_carry_the_numbers() {
    let r = sample();
    let t = table::render(&r);
    assert!(t.contains("4.00±0.25*"), "{t}");
    assert!(t.contains("ratio 0.200"), "{t}");
    let j: serde_json::Value = serde_json::from_str(&json::render(&r)).unwrap();
    let f = &j["fill"][1];
    assert_eq!(f["workload"], "default");
    assert_eq!(f["policy"], "tessera");
    assert_eq!(f["unallocated_pct_mean"], 4.0);
    assert_eq!(f["unallocated_pct_sd"], 0.25);
    assert_eq!(f["seeds"], serde_json::json!([42, 43]));
    assert_eq!(f["curve"].as_array().unwrap().len(), 81);
    assert_eq!(j["replay"]["runs"][0]["delay"]["mean_s"], 10.0);
}
