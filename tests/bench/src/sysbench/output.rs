//! Parsing the report of `sysbench oltp_insert ... --report-interval=1 --histogram=on run`
//! (sysbench 1.0): the per-second lines, the latency histogram and the final statistics.

use anyhow::Context;

use crate::LatencyMs;

/// One `[ Ns ] thds: ... tps: ... lat (ms,95%): ...` line.
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalLine {
    /// Seconds since the start (the end of the interval).
    pub t: u64,
    /// Transactions (here: inserts) per second in the interval.
    pub tps: f64,
    /// The interval's latency percentile (`--percentile`, 95 by default), ms.
    pub latency_pct_ms: f64,
}

/// What a sysbench run reported.
#[derive(Debug, Clone)]
pub struct SysbenchReport {
    /// `queries performed: write:`.
    pub writes: u64,
    /// `transactions:` (each `oltp_insert` event is one autocommit INSERT).
    pub transactions: u64,
    /// `ignored errors:` (failed statements sysbench was told to skip, e.g. duplicate keys).
    pub ignored_errors: u64,
    /// `total time:` seconds.
    pub total_time_s: f64,
    /// `Latency (ms): min / avg / max / 95th percentile`, and p50 / p99 from the histogram.
    pub latency_ms: LatencyMs,
    /// The per-second lines.
    pub intervals: Vec<IntervalLine>,
}

fn after<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    line.trim_start().strip_prefix(label).map(str::trim)
}

fn first_number(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.trim_end_matches('s').parse().ok()
}

/// Parses one `[ 1s ] thds: 128 tps: 3398.19 qps: ... lat (ms,95%): 70.55 err/s: ...` line.
fn interval(line: &str) -> Option<IntervalLine> {
    let rest = line.trim_start().strip_prefix('[')?;
    let (t, rest) = rest.split_once(']')?;
    let t = t.trim().strip_suffix('s')?.parse().ok()?;
    let tps = first_number(rest.split_once("tps:")?.1)?;
    let latency_pct_ms = first_number(rest.split_once("%):")?.1)?;
    Some(IntervalLine {
        t,
        tps,
        latency_pct_ms,
    })
}

/// `value |**** count` lines of the latency histogram: (bucket value ms, count).
fn histogram_line(line: &str) -> Option<(f64, u64)> {
    let (value, rest) = line.split_once('|')?;
    let value = value.trim().parse().ok()?;
    let count = rest.split_whitespace().last()?.parse().ok()?;
    Some((value, count))
}

/// The smallest bucket value at or below which `q` of the samples fall, as sysbench computes
/// its own percentile from the same buckets.
fn histogram_quantile(buckets: &[(f64, u64)], q: f64) -> f64 {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    let want = (total as f64 * q).ceil() as u64;
    let mut seen = 0;
    for &(value, count) in buckets {
        seen += count;
        if seen >= want.max(1) {
            return value;
        }
    }
    buckets.last().map_or(0.0, |b| b.0)
}

/// Parses sysbench's whole standard output.
pub fn parse(text: &str) -> anyhow::Result<SysbenchReport> {
    let mut writes = None;
    let mut transactions = None;
    let mut ignored_errors = None;
    let mut total_time_s = None;
    let (mut min, mut avg, mut max, mut p95) = (None, None, None, None);
    let mut intervals = Vec::new();
    let mut buckets = Vec::new();
    let mut in_histogram = false;
    for line in text.lines() {
        if line.contains("Latency histogram") {
            in_histogram = true;
            continue;
        }
        if in_histogram {
            if let Some(b) = histogram_line(line) {
                buckets.push(b);
                continue;
            }
            if line.trim().starts_with("value") || line.trim().is_empty() {
                continue;
            }
            in_histogram = false;
        }
        if let Some(i) = interval(line) {
            intervals.push(i);
        } else if let Some(v) = after(line, "write:") {
            writes = first_number(v).map(|n| n as u64);
        } else if let Some(v) = after(line, "transactions:") {
            transactions = first_number(v).map(|n| n as u64);
        } else if let Some(v) = after(line, "ignored errors:") {
            ignored_errors = first_number(v).map(|n| n as u64);
        } else if let Some(v) = after(line, "total time:") {
            total_time_s = first_number(v);
        } else if let Some(v) = after(line, "min:") {
            min = first_number(v);
        } else if let Some(v) = after(line, "avg:") {
            avg = first_number(v);
        } else if let Some(v) = after(line, "max:") {
            max = first_number(v);
        } else if let Some(v) = after(line, "95th percentile:") {
            p95 = first_number(v);
        }
    }
    let missing = |what: &str| format!("sysbench output has no {what:?} line");
    anyhow::ensure!(
        !buckets.is_empty(),
        "sysbench output has no latency histogram (--histogram=on)"
    );
    Ok(SysbenchReport {
        writes: writes.with_context(|| missing("write:"))?,
        transactions: transactions.with_context(|| missing("transactions:"))?,
        ignored_errors: ignored_errors.with_context(|| missing("ignored errors:"))?,
        total_time_s: total_time_s.with_context(|| missing("total time:"))?,
        latency_ms: LatencyMs {
            min: min.with_context(|| missing("min:"))?,
            avg: avg.with_context(|| missing("avg:"))?,
            p50: histogram_quantile(&buckets, 0.50),
            p95: p95.with_context(|| missing("95th percentile:"))?,
            p99: histogram_quantile(&buckets, 0.99),
            max: max.with_context(|| missing("max:"))?,
        },
        intervals,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A real `sysbench 1.0.20 oltp_insert --tables=8 --threads=128 --time=8
    /// --report-interval=1 --histogram=on` run against this target's MariaDB.
    const REAL: &str = include_str!("../../testdata/sysbench-oltp_insert-run.txt");

    #[test]
    fn parses_a_real_run() {
        let r = parse(REAL).unwrap();
        assert_eq!(r.writes, 25512);
        assert_eq!(r.transactions, 25512);
        assert_eq!(r.ignored_errors, 0);
        assert!((r.total_time_s - 8.0748).abs() < 1e-9);
        assert!((r.latency_ms.min - 0.12).abs() < 1e-9);
        assert!((r.latency_ms.avg - 40.22).abs() < 1e-9);
        assert!((r.latency_ms.max - 327.55).abs() < 1e-9);
        assert!((r.latency_ms.p95 - 78.60).abs() < 1e-9);
        assert_eq!(r.intervals.len(), 8);
        assert_eq!(
            r.intervals.first(),
            Some(&IntervalLine {
                t: 1,
                tps: 3398.19,
                latency_pct_ms: 70.55
            })
        );
        // Percentiles from the histogram: ordered, and the 95th the same bucket sysbench chose.
        let l = &r.latency_ms;
        assert!(l.min <= l.p50 && l.p50 <= l.p95 && l.p95 <= l.p99 && l.p99 <= l.max);
        let buckets: Vec<(f64, u64)> = REAL.lines().filter_map(histogram_line).collect();
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 25512);
        // sysbench prints it rounded to 0.01 ms (78.597 -> 78.60).
        assert!((histogram_quantile(&buckets, 0.95) - l.p95).abs() < 0.006);
    }

    #[test]
    fn missing_summary_is_an_error() {
        let cut = REAL.split("SQL statistics").next().unwrap();
        let err = parse(cut).unwrap_err().to_string();
        assert!(err.contains("write:"), "{err}");
        assert!(parse("no histogram").is_err());
    }
}
