//! `--json FILE`: the [`Report`] as pretty JSON. Field order is the structs'
//! order and every collection is a `Vec`, so the bytes depend only on the results.

use super::Report;

/// The report as JSON text (ends with a newline).
pub fn render(report: &Report) -> String {
    // Serialising plain structs of numbers and strings cannot fail.
    let mut s =
        serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}
