//! `summary.json` of `bulk`: the bulk load against the same rows by `Put` per target, the
//! embedded engine's rate, and each node's engine size against the text.

use super::Report;
use crate::summary::{command_line, Summary, SummaryRow};

fn row(metric: String, unit: &str, higher_is_better: bool, values: Vec<(String, f64)>) -> SummaryRow {
    SummaryRow {
        metric,
        unit: unit.to_string(),
        higher_is_better,
        values,
    }
}

/// The figures of one bulk run.
pub(super) fn summary_of(report: &Report) -> Summary {
    let mut rows = Vec::new();
    for s in &report.summary {
        rows.push(row(
            format!(
                "{} rows: ftkvctl load vs Put from {} clients",
                report.rows, report.clients
            ),
            "rows/s",
            true,
            vec![
                (format!("{} load", s.target), s.bulk_rows_per_sec.median),
                (format!("{} Put", s.target), s.put_rows_per_sec.median),
            ],
        ));
        rows.push(row(
            format!("{} rows: engine per node vs the TSV text", report.rows),
            "bytes",
            false,
            vec![
                (format!("{} engine", s.target), s.bulk_engine_bytes),
                ("TSV text".to_string(), report.text_bytes as f64),
            ],
        ));
    }
    if let Some(embedded) = report.embedded_rows_per_sec {
        rows.push(row(
            format!("{} rows: embedded engine bulk load", report.rows),
            "rows/s",
            true,
            vec![("ftkv embedded".to_string(), embedded.median)],
        ));
    }
    Summary::new("bulk", command_line(), rows)
}
