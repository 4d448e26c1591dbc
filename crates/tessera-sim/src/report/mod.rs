//! What `tessera simulate` writes: a terminal table, JSON, and one self-contained
//! HTML page with hand-written SVG charts. All three render the same [`Report`]
//! and are pure functions of it, so the same runs give byte-identical output.

pub mod html;
pub mod json;
pub mod table;

use serde::Serialize;

use crate::grid::{FillSummary, ReplayGrid, ReplayPlan};

/// Everything one `tessera simulate` invocation measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `fill`, `replay` or `fill+replay`.
    pub experiment: String,
    pub workloads: Vec<String>,
    /// Where the workloads came from (a directory, or the built-in synthetic workload).
    pub source: String,
    pub seeds: Vec<u64>,
    pub fill_policies: Vec<String>,
    pub fill: Vec<FillSummary>,
    pub replay_policies: Vec<String>,
    pub replay_plan: Option<ReplayPlan>,
    pub replay: Option<ReplayGrid>,
    /// Plain-language notes on how the numbers were made.
    pub notes: Vec<String>,
    /// Where the mosaic of the fill at 100 % was written (relative to the HTML report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mosaic: Option<String>,
}

/// Formats a number with a fixed number of decimals, or `-` for NaN.
pub(crate) fn num(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        "-".to_string()
    }
}
