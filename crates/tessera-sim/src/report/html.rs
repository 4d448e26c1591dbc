//! `--report FILE.html`: one self-contained page (inline CSS, hand-written SVG,
//! no scripts, no external files) that a person opens in a browser.
//!
//! Charts: unallocated GPU vs arrived workload per policy (one per workload,
//! median over seeds), grouped bars of unallocated GPU at arrived = 100 % per
//! workload (mean ± sd), GPU utilisation and allocated share over time, and the
//! queueing-delay CDF (on a log10(1 + s) axis: most pods wait 0 s, a few wait hours).

use std::fmt::Write;

use super::{Report, num};

const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

const W: f64 = 640.0;
const H: f64 = 340.0;
const ML: f64 = 60.0;
const MR: f64 = 150.0;
const MT: f64 = 30.0;
const MB: f64 = 45.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step for axis ticks: about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f < 1.5 {
        1.0
    } else if f < 3.5 {
        2.0
    } else if f < 7.5 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// One line of a line chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
    pub color: usize,
}

fn axes(out: &mut String, title: &str, xl: &str, yl: &str, x: (f64, f64), y: (f64, f64)) {
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    let _ = write!(
        out,
        r##"<text x="{ML}" y="18" class="t">{}</text><rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>"##,
        esc(title)
    );
    let sx = |v: f64| ML + (v - x.0) / (x.1 - x.0) * pw;
    let sy = |v: f64| MT + ph - (v - y.0) / (y.1 - y.0) * ph;
    let xs = nice_step(x.1 - x.0, 6.0);
    let mut v = (x.0 / xs).ceil() * xs;
    while v <= x.1 + xs * 1e-9 {
        let px = sx(v);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{MT}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" class="xt">{}</text>"##,
            MT + ph,
            MT + ph + 16.0,
            trim(v)
        );
        v += xs;
    }
    let ys = nice_step(y.1 - y.0, 5.0);
    let mut v = (y.0 / ys).ceil() * ys;
    while v <= y.1 + ys * 1e-9 {
        let py = sy(v);
        let _ = write!(
            out,
            r##"<line x1="{ML}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" class="yt">{}</text>"##,
            ML + pw,
            ML - 6.0,
            py + 4.0,
            trim(v)
        );
        v += ys;
    }
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{:.1}" class="xl">{}</text><text transform="translate(16,{:.1}) rotate(-90)" class="xl">{}</text>"##,
        ML + pw / 2.0,
        H - 6.0,
        esc(xl),
        MT + ph / 2.0,
        esc(yl)
    );
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_string() }
}

fn legend(out: &mut String, names: &[(String, usize, bool)]) {
    for (i, (n, c, dashed)) in names.iter().enumerate() {
        let y = MT + 10.0 + i as f64 * 18.0;
        let dash = if *dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2.5"{dash}/><text x="{:.1}" y="{:.1}" class="lg">{}</text>"##,
            W - MR + 10.0,
            W - MR + 34.0,
            PALETTE[c % PALETTE.len()],
            W - MR + 40.0,
            y + 4.0,
            esc(n)
        );
    }
}

/// A line chart as an `<svg>` element.
pub fn line_chart(title: &str, xl: &str, yl: &str, series: &[Series], y_from_zero: bool) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &(x, y) in all {
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if y_from_zero {
        y0 = y0.min(0.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let pad = (y1 - y0) * 0.05;
    let (y0, y1) = (if y_from_zero { y0 } else { y0 - pad }, y1 + pad);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">"#
    );
    axes(&mut out, title, xl, yl, (x0, x1), (y0, y1));
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    for s in series {
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    ML + (x - x0) / (x1 - x0) * pw,
                    MT + ph - (y - y0) / (y1 - y0) * ph
                )
            })
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"{dash}/>"#,
            PALETTE[s.color % PALETTE.len()],
            pts.join(" ")
        );
    }
    let names: Vec<(String, usize, bool)> = series
        .iter()
        .map(|s| (s.name.clone(), s.color, s.dashed))
        .collect();
    legend(&mut out, &names);
    out.push_str("</svg>");
    out
}

/// Grouped bars with error whiskers: `groups` on the x axis, one bar per name.
pub fn bar_chart(
    title: &str,
    yl: &str,
    groups: &[String],
    names: &[String],
    value: &dyn Fn(usize, usize) -> Option<(f64, f64)>,
) -> String {
    let width = (ML + MR + groups.len() as f64 * (names.len() as f64 * 9.0 + 14.0)).max(W);
    let mut y1: f64 = 0.0;
    for g in 0..groups.len() {
        for n in 0..names.len() {
            if let Some((m, sd)) = value(g, n) {
                y1 = y1.max(m + sd.max(0.0));
            }
        }
    }
    let y1 = if y1 > 0.0 { y1 * 1.08 } else { 1.0 };
    let (pw, ph) = (width - ML - MR, H - MT - MB - 30.0);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{H}" viewBox="0 0 {width:.0} {H}">"#
    );
    let _ = write!(
        out,
        r##"<text x="{ML}" y="18" class="t">{}</text><rect x="{ML}" y="{MT}" width="{pw:.1}" height="{ph:.1}" fill="#fff" stroke="#999"/>"##,
        esc(title)
    );
    let sy = |v: f64| MT + ph - v / y1 * ph;
    let ys = nice_step(y1, 5.0);
    let mut v = 0.0;
    while v <= y1 {
        let _ = write!(
            out,
            r##"<line x1="{ML}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" class="yt">{}</text>"##,
            sy(v),
            ML + pw,
            sy(v),
            ML - 6.0,
            sy(v) + 4.0,
            trim(v)
        );
        v += ys;
    }
    let gw = pw / groups.len().max(1) as f64;
    let bw = (gw - 10.0) / names.len().max(1) as f64;
    for (g, gname) in groups.iter().enumerate() {
        let gx = ML + g as f64 * gw + 5.0;
        for n in 0..names.len() {
            if let Some((m, sd)) = value(g, n) {
                let x = gx + n as f64 * bw;
                let _ = write!(
                    out,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} / {}: {} ± {}</title></rect>"#,
                    sy(m),
                    (bw - 1.0).max(1.0),
                    (MT + ph - sy(m)).max(0.0),
                    PALETTE[n % PALETTE.len()],
                    esc(gname),
                    esc(&names[n]),
                    num(m, 2),
                    num(sd, 2)
                );
                if sd > 0.0 {
                    let cx = x + bw / 2.0;
                    let _ = write!(
                        out,
                        r##"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="#333"/>"##,
                        sy(m + sd),
                        sy((m - sd).max(0.0))
                    );
                }
            }
        }
        let _ = write!(
            out,
            r#"<text transform="translate({:.1},{:.1}) rotate(35)" class="gl">{}</text>"#,
            gx + gw / 2.0 - 8.0,
            MT + ph + 12.0,
            esc(gname)
        );
    }
    let _ = write!(
        out,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" class="xl">{}</text>"#,
        MT + ph / 2.0,
        esc(yl)
    );
    let leg: Vec<(String, usize, bool)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i, false))
        .collect();
    let mut l = String::new();
    legend(&mut l, &leg);
    // The legend sits right of the plot, wherever the plot ends.
    let _ = write!(
        out,
        r#"<g transform="translate({:.1},0)">{l}</g>"#,
        width - W
    );
    out.push_str("</svg>");
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px}\
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}\
.charts{display:flex;flex-wrap:wrap;gap:12px}svg{background:#fafafa;border:1px solid #ddd}\
svg .t{font-size:14px;font-weight:600;text-anchor:start}svg .xt{font-size:11px;text-anchor:middle}\
svg .yt{font-size:11px;text-anchor:end}svg .xl{font-size:12px;text-anchor:middle}\
svg .lg{font-size:12px}svg .gl{font-size:11px}.note{color:#555;font-size:13px}";

/// The whole page.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tessera simulate: {}</title><style>{STYLE}</style></head><body>\n",
        esc(&report.experiment)
    );
    let _ = writeln!(
        out,
        "<h1>tessera simulate — {}</h1><p class=\"note\">Workloads: {} ({}). Seeds: {}.</p>",
        esc(&report.experiment),
        esc(&report.workloads.join(", ")),
        esc(&report.source),
        report
            .seeds
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !report.fill.is_empty() {
        fill_section(&mut out, report);
    }
    if report.replay.is_some() {
        replay_section(&mut out, report);
    }
    if !report.notes.is_empty() {
        out.push_str("<h2>Notes</h2><ul>");
        for n in &report.notes {
            let _ = write!(out, "<li class=\"note\">{}</li>", esc(n));
        }
        out.push_str("</ul>");
    }
    out.push_str("</body></html>\n");
    out
}

fn fill_section(out: &mut String, report: &Report) {
    if let Some(href) = &report.mosaic {
        let _ = write!(
            out,
            "<p><a href=\"{}\">Mosaic of the fill at 100 %</a>: every node a tile, every GPU a cell with its pods' shares (first workload, first seed, tessera policy where it ran).</p>",
            esc(href)
        );
    }
    out.push_str("<h2>Fill: unallocated GPU at arrived workload = 100 % (mean ± sd over seeds)</h2><table><tr><th>workload</th>");
    for p in &report.fill_policies {
        let _ = write!(out, "<th>{}</th>", esc(p));
    }
    out.push_str("</tr>");
    for w in &report.workloads {
        let _ = write!(out, "<tr><td>{}</td>", esc(w));
        for p in &report.fill_policies {
            match report
                .fill
                .iter()
                .find(|s| &s.workload == w && &s.policy == p)
            {
                Some(s) => {
                    let _ = write!(
                        out,
                        "<td>{} ± {}</td>",
                        num(s.unallocated_pct_mean, 2),
                        num(s.unallocated_pct_sd, 2)
                    );
                }
                None => out.push_str("<td>-</td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    // Bars per workload.
    let groups = report.workloads.clone();
    let names = report.fill_policies.clone();
    let value = |g: usize, n: usize| {
        report
            .fill
            .iter()
            .find(|s| s.workload == groups[g] && s.policy == names[n])
            .map(|s| (s.unallocated_pct_mean, s.unallocated_pct_sd))
            .filter(|(m, _)| m.is_finite())
    };
    out.push_str("<div class=\"charts\">");
    out.push_str(&bar_chart(
        "Unallocated GPU at arrived = 100 % per workload",
        "unallocated GPU (%)",
        &groups,
        &names,
        &value,
    ));
    out.push_str("</div><div class=\"charts\">");
    for w in &report.workloads {
        let series: Vec<Series> = report
            .fill_policies
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let s = report
                    .fill
                    .iter()
                    .find(|s| &s.workload == w && &s.policy == p)?;
                Some(Series {
                    name: p.clone(),
                    points: s
                        .curve
                        .iter()
                        .filter(|c| c.arrived_pct >= 50.0)
                        .map(|c| (c.arrived_pct, c.unallocated_pct_median))
                        .collect(),
                    dashed: false,
                    color: i,
                })
            })
            .collect();
        out.push_str(&line_chart(
            &format!("{w}: unallocated GPU vs arrived workload"),
            "arrived workload (% of GPU capacity)",
            "unallocated GPU (%, median)",
            &series,
            true,
        ));
    }
    out.push_str("</div>");
}

fn replay_section(out: &mut String, report: &Report) {
    let Some(grid) = &report.replay else { return };
    let plan = report.replay_plan.as_ref();
    let _ = write!(
        out,
        "<h2>Replay at time-scale {} ({} cycle(s))</h2><table><tr><th>workload</th><th>policy</th><th>seed</th><th>mean delay s</th><th>p50</th><th>p95</th><th>p99</th><th>waited</th><th>util %</th><th>alloc share %</th><th>completed in window</th></tr>",
        plan.map_or("-".into(), |p| num(p.options.time_scale, 0)),
        plan.map_or(1, |p| p.options.cycles)
    );
    for r in &grid.runs {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.workload),
            esc(&r.policy),
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
    out.push_str("</table>");
    if !grid.sustainable.is_empty() {
        let _ = write!(
            out,
            "<p>Sustainable load: the highest time-scale with mean queueing delay ≤ {} s.</p><table><tr><th>workload</th><th>policy</th><th>time-scale</th><th>mean delay s</th></tr>",
            num(grid.sustainable[0].bound_s, 0)
        );
        for s in &grid.sustainable {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&s.workload),
                esc(&s.policy),
                num(s.time_scale, 1),
                num(s.mean_delay_s, 1)
            );
        }
        out.push_str("</table>");
    }
    if !grid.comparisons.is_empty() {
        out.push_str("<table><tr><th>workload</th><th>policy vs baseline</th><th>mean delay ratio</th><th>util %</th><th>alloc share %</th><th>sustainable load ratio</th><th>powered GPU-h</th><th>occupied GPU-h</th><th>billed GPU-h (dynamic)</th></tr>");
        for c in &grid.comparisons {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{} vs {}</td><td>{}</td><td>{} vs {}</td><td>{} vs {}</td><td>{}</td><td>{} vs {}</td><td>{} vs {}</td><td>{} ({}) vs {} ({})</td></tr>",
                esc(&c.workload),
                esc(&c.policy),
                esc(&c.baseline),
                c.delay_ratio.map_or("-".into(), |r| num(r, 3)),
                num(c.policy_util_pct, 1),
                num(c.baseline_util_pct, 1),
                num(c.policy_alloc_share_pct, 1),
                num(c.baseline_alloc_share_pct, 1),
                c.sustainable_ratio.map_or("-".into(), |r| num(r, 2)),
                num(c.policy_cost.powered_gpu_hours, 1),
                num(c.baseline_cost.powered_gpu_hours, 1),
                num(c.policy_cost.occupied_gpu_hours, 1),
                num(c.baseline_cost.occupied_gpu_hours, 1),
                num(c.policy_cost.billed_gpu_hours, 1),
                num(c.policy_cost.billed_dynamic, 1),
                num(c.baseline_cost.billed_gpu_hours, 1),
                num(c.baseline_cost.billed_dynamic, 1),
            );
        }
        out.push_str("</table>");
    }
    out.push_str("<div class=\"charts\">");
    for w in &report.workloads {
        // First seed of each policy.
        let runs: Vec<_> = report
            .replay_policies
            .iter()
            .filter_map(|p| {
                grid.runs
                    .iter()
                    .find(|r| &r.workload == w && &r.policy == p)
            })
            .collect();
        let mut series = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            series.push(Series {
                name: format!("{} util", r.policy),
                points: r
                    .series
                    .iter()
                    .map(|s| (s.t_s as f64 / 60.0, s.util_pct))
                    .collect(),
                dashed: false,
                color: i,
            });
            series.push(Series {
                name: format!("{} held", r.policy),
                points: r
                    .series
                    .iter()
                    .map(|s| (s.t_s as f64 / 60.0, s.alloc_share_pct))
                    .collect(),
                dashed: true,
                color: i,
            });
        }
        out.push_str(&line_chart(
            &format!("{w}: GPU utilisation (solid) and GPUs held (dashed)"),
            "time (minutes)",
            "% of cluster GPUs",
            &series,
            true,
        ));
        let cdf: Vec<Series> = runs
            .iter()
            .enumerate()
            .map(|(i, r)| Series {
                name: r.policy.clone(),
                points: r
                    .delay_cdf
                    .iter()
                    .map(|&(d, f)| ((1.0 + d as f64).log10(), f * 100.0))
                    .collect(),
                dashed: false,
                color: i,
            })
            .collect();
        out.push_str(&line_chart(
            &format!("{w}: queueing-delay CDF"),
            "queueing delay: log10(1 + seconds)",
            "pods placed within (%)",
            &cdf,
            true,
        ));
    }
    out.push_str("</div>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 6.0), 1.0);
        assert_eq!(trim(2.500), "2.5");
        assert_eq!(trim(-0.0), "0");
    }

    #[test]
    fn line_chart_maps_points_into_the_plot() {
        let s = Series {
            name: "a<b".into(),
            points: vec![(0.0, 0.0), (10.0, 10.0)],
            dashed: false,
            color: 0,
        };
        let svg = line_chart("t", "x", "y", &[s], true);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        // (0,0) is the plot's bottom-left corner (60, 340-45 = 295);
        // (10, 10.5 after 5 % headroom)...: x maps to 60 + 430 = 490.
        assert!(svg.contains("points=\"60.0,295.0 490.0,"), "{svg}");
        assert!(svg.contains("a&lt;b"), "names are escaped");
    }
}
