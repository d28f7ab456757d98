//! The table `make faults` prints (and writes to `target/faults/report.md`).

use super::checker::{check, summarize, KindSummary};
use super::scenarios::RunResult;

/// Every run's rows: one per fault kind, the steady state first.
pub fn rows(result: &RunResult) -> Vec<KindSummary> {
    summarize(&check(&result.history))
}

pub fn fault_table(results: &[RunResult]) -> String {
    let mut out = String::new();
    out.push_str(
        "| run | fault | runs | acked admissions | lost (unchecked) | max over-admission per key | mean per key | keys affected | timeouts: applied (admitted / rejected) of all | not replicated (refunded) | refused | dropped |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for result in results {
        let limit = result.history.limit as f64;
        let rows = rows(result);
        for row in &rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} ({}) | {} ({:.0}%) | {:.2} ({:.1}%) | {} of {} | {} / {} of {} | {} ({}) | {} | {} |\n",
                result.label,
                row.kind,
                row.runs,
                row.acked,
                row.lost,
                row.unchecked,
                row.max_over,
                100.0 * row.max_over as f64 / limit,
                row.mean_over,
                100.0 * row.mean_over / limit,
                row.keys_affected,
                row.key_runs,
                row.late_admitted,
                row.late_rejected,
                row.timeouts,
                row.not_replicated,
                row.refunded,
                row.refused,
                row.dropped,
            ));
        }
    }
    out
}

pub fn notes(results: &[RunResult]) -> String {
    let mut out = String::new();
    for result in results {
        for note in &result.notes {
            out.push_str(&format!("- {}: {note}\n", result.label));
        }
    }
    out
}
