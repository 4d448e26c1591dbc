//! The terminal table: fill results as one row per workload and one column per
//! policy (unallocated GPU % at arrived = 100 %, mean ± sd over seeds), replay
//! results as one row per (workload, policy), then the comparisons.

use std::fmt::Write;

use super::{Report, num};

fn pad(s: &str, w: usize) -> String {
    format!("{s:>w$}")
}

/// The whole report as text for a terminal.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    if !report.fill.is_empty() {
        let _ = writeln!(
            out,
            "Fill ({}; {} seed(s)): unallocated GPU % at arrived = 100 %, mean ± sd (lower is better)",
            report.source,
            report.seeds.len()
        );
        let wl_w = report
            .workloads
            .iter()
            .map(|w| w.len())
            .max()
            .unwrap_or(8)
            .max(8);
        let col_w = 13;
        let mut header = format!("{:<wl_w$}", "workload");
        for p in &report.fill_policies {
            header.push_str(&pad(p, col_w));
        }
        let _ = writeln!(out, "{header}");
        for w in &report.workloads {
            let mut line = format!("{w:<wl_w$}");
            let row: Vec<_> = report.fill.iter().filter(|s| &s.workload == w).collect();
            let best = row
                .iter()
                .map(|s| s.unallocated_pct_mean)
                .filter(|v| v.is_finite())
                .fold(f64::INFINITY, f64::min);
            for p in &report.fill_policies {
                let cell = match row.iter().find(|s| &s.policy == p) {
                    Some(s) => {
                        let mark = if s.unallocated_pct_mean == best {
                            "*"
                        } else {
                            " "
                        };
                        format!(
                            "{}±{}{mark}",
                            num(s.unallocated_pct_mean, 2),
                            num(s.unallocated_pct_sd, 2)
                        )
                    }
                    None => "-".to_string(),
                };
                line.push_str(&pad(&cell, col_w));
            }
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "(* = fewest unallocated GPUs in the row)");
    }
    if let Some(grid) = &report.replay {
        if !out.is_empty() {
            out.push('\n');
        }
        let plan = report.replay_plan.as_ref();
        let _ = writeln!(
            out,
            "Replay ({}; time-scale {}, {} cycle(s)): queueing delay and GPU use over the arrival window",
            report.source,
            plan.map_or("-".into(), |p| num(p.options.time_scale, 0)),
            plan.map_or(1, |p| p.options.cycles)
        );
        let _ = writeln!(
            out,
            "{:<18}{:>13}{:>6}{:>10}{:>8}{:>8}{:>8}{:>8}{:>9}{:>9}{:>9}",
            "workload",
            "policy",
            "seed",
            "mean s",
            "p50 s",
            "p95 s",
            "p99 s",
            "waited",
            "util %",
            "alloc %",
            "done"
        );
        for r in &grid.runs {
            let _ = writeln!(
                out,
                "{:<18}{:>13}{:>6}{:>10}{:>8}{:>8}{:>8}{:>8}{:>9}{:>9}{:>9}",
                r.workload,
                r.policy,
                r.seed,
                num(r.delay.mean_s, 1),
                r.delay.p50_s,
                r.delay.p95_s,
                r.delay.p99_s,
                r.delay.waited,
                num(r.util_mean_pct, 1),
                num(r.alloc_share_mean_pct, 1),
                r.completed_in_window
            );
        }
        if !grid.sustainable.is_empty() {
            let _ = writeln!(
                out,
                "\nSustainable load: highest time-scale with mean queueing delay <= {} s ({} cycle(s))",
                num(grid.sustainable[0].bound_s, 0),
                grid.sustainable[0].cycles
            );
            for s in &grid.sustainable {
                let _ = writeln!(
                    out,
                    "{:<18}{:>13}  time-scale {:>8}  (mean delay {} s, {} probes)",
                    s.workload,
                    s.policy,
                    num(s.time_scale, 1),
                    num(s.mean_delay_s, 1),
                    s.probes.len()
                );
            }
        }
        for c in &grid.comparisons {
            let _ = writeln!(
                out,
                "{}: {} vs {} at time-scale {}: mean delay {} s vs {} s (ratio {}); util {} % vs {} %; alloc share {} % vs {} %; sustainable load ratio {}",
                c.workload,
                c.policy,
                c.baseline,
                num(c.time_scale, 0),
                num(c.policy_mean_delay_s, 1),
                num(c.baseline_mean_delay_s, 1),
                c.delay_ratio.map_or("-".into(), |r| num(r, 3)),
                num(c.policy_util_pct, 1),
                num(c.baseline_util_pct, 1),
                num(c.policy_alloc_share_pct, 1),
                num(c.baseline_alloc_share_pct, 1),
                c.sustainable_ratio.map_or("-".into(), |r| num(r, 2)),
            );
            let (b, p) = (&c.baseline_cost, &c.policy_cost);
            let _ = writeln!(
                out,
                "{}: cost of the replay, {} vs {} (GPU-hours): powered nodes {} vs {} ({}); occupied GPUs {} vs {}; billed {} vs {}, at dynamic prices {} vs {}",
                c.workload,
                c.policy,
                c.baseline,
                num(p.powered_gpu_hours, 1),
                num(b.powered_gpu_hours, 1),
                change_pct(p.powered_gpu_hours, b.powered_gpu_hours),
                num(p.occupied_gpu_hours, 1),
                num(b.occupied_gpu_hours, 1),
                num(p.billed_gpu_hours, 1),
                num(b.billed_gpu_hours, 1),
                num(p.billed_dynamic, 1),
                num(b.billed_dynamic, 1),
            );
        }
    }
    for n in &report.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// `-12.3 %` for `value` against `base`; `-` without a base.
fn change_pct(value: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:+.1} %", (value / base - 1.0) * 100.0)
    } else {
        "-".into()
    }
}
