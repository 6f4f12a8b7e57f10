//! Medians, ratios, `results.json`, the charts and the printed summary of `sysbench-insert`.

use std::path::Path;

use serde::Serialize;

use super::{InsertRun, SysbenchArgs};
use crate::{median, plot};

/// Medians of one target over its valid runs.
#[derive(Debug, Clone, Serialize)]
pub struct TargetSummary {
    /// Target name.
    pub target: String,
    /// Valid runs / all runs.
    pub valid_runs: usize,
    /// All runs.
    pub runs: usize,
    /// Median acknowledged writes.
    pub writes: f64,
    /// Median writes/s.
    pub writes_per_sec: f64,
    /// Slowest valid run, writes/s.
    pub writes_per_sec_min: f64,
    /// Fastest valid run, writes/s.
    pub writes_per_sec_max: f64,
    /// Median latency figures, ms.
    pub latency_min_ms: f64,
    /// Median of the runs' averages.
    pub latency_avg_ms: f64,
    /// Median of the runs' maxima.
    pub latency_max_ms: f64,
    /// Median 95th percentile.
    pub latency_p95_ms: f64,
    /// Median 99th percentile.
    pub latency_p99_ms: f64,
    /// Median CPU per acknowledged write, all processes, µs.
    pub cpu_per_write_us: f64,
    /// Median CPU per write of the server processes, µs.
    pub cpu_servers_per_write_us: f64,
    /// Median CPU per write of the load generator, µs.
    pub cpu_load_generator_per_write_us: f64,
    /// Errors over all its runs.
    pub errors: u64,
}

/// The reference target (the first ftkv one) against another.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// `"ftkv / etcd"`.
    pub name: String,
    /// Median writes/s of the reference over the other's.
    pub writes_per_sec: f64,
    /// The other's median p99 over the reference's (how many times lower the reference's is).
    pub p99_other_over_reference: f64,
    /// The other's median CPU per write over the reference's.
    pub cpu_per_write_other_over_reference: f64,
}

/// `results.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `sysbench-insert`.
    pub workload: String,
    /// The machine (cores, memory, kernel).
    pub machine: String,
    /// Date of the run (UTC, RFC 3339).
    pub date: String,
    /// Flags of the run.
    pub clients: u64,
    /// Seconds per run.
    pub duration_s: f64,
    /// Rounds.
    pub rounds: u64,
    /// Tables.
    pub tables: u32,
    /// Rows per table prepared (MariaDB) and range of `k`.
    pub table_size: u64,
    /// Every run.
    pub runs: Vec<InsertRun>,
    /// Per target, in `--targets` order.
    pub summary: Vec<TargetSummary>,
    /// The first ftkv target (or the first target) over each other.
    pub ratios: Vec<Ratio>,
}

pub use crate::summary::machine_line;
use crate::summary::{command_line, Summary, SummaryRow};

fn summarize(target: &str, runs: &[InsertRun]) -> TargetSummary {
    let all: Vec<&InsertRun> = runs.iter().filter(|r| r.target == target).collect();
    let valid: Vec<&InsertRun> = all.iter().copied().filter(|r| r.valid).collect();
    let med = |f: &dyn Fn(&InsertRun) -> f64| median(&valid.iter().map(|r| f(r)).collect::<Vec<_>>());
    let rates: Vec<f64> = valid.iter().map(|r| r.writes_per_sec).collect();
    TargetSummary {
        target: target.to_string(),
        valid_runs: valid.len(),
        runs: all.len(),
        writes: med(&|r| r.writes as f64),
        writes_per_sec: median(&rates),
        writes_per_sec_min: rates.iter().copied().reduce(f64::min).unwrap_or(0.0),
        writes_per_sec_max: rates.iter().copied().reduce(f64::max).unwrap_or(0.0),
        latency_min_ms: med(&|r| r.latency_ms.min),
        latency_avg_ms: med(&|r| r.latency_ms.avg),
        latency_max_ms: med(&|r| r.latency_ms.max),
        latency_p95_ms: med(&|r| r.latency_ms.p95),
        latency_p99_ms: med(&|r| r.latency_ms.p99),
        cpu_per_write_us: med(&|r| r.cpu.per_write_us),
        cpu_servers_per_write_us: med(&|r| r.cpu.servers_per_write_us),
        cpu_load_generator_per_write_us: med(&|r| r.cpu.load_generator_per_write_us),
        errors: all.iter().map(|r| r.errors).sum(),
    }
}

/// The first target whose name starts with `ftkv`, else the first target, over every other.
pub fn ratios(summary: &[TargetSummary]) -> Vec<Ratio> {
    let Some(reference) = summary
        .iter()
        .find(|s| s.target.starts_with("ftkv"))
        .or_else(|| summary.first())
    else {
        return Vec::new();
    };
    let over = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    summary
        .iter()
        .filter(|s| s.target != reference.target)
        .map(|s| Ratio {
            name: format!("{} / {}", reference.target, s.target),
            writes_per_sec: over(reference.writes_per_sec, s.writes_per_sec),
            p99_other_over_reference: over(s.latency_p99_ms, reference.latency_p99_ms),
            cpu_per_write_other_over_reference: over(s.cpu_per_write_us, reference.cpu_per_write_us),
        })
        .collect()
}

impl Report {
    /// Summarizes `runs` of the `names` targets.
    pub fn new(args: &SysbenchArgs, names: &[String], runs: Vec<InsertRun>) -> Self {
        let summary: Vec<TargetSummary> = names.iter().map(|n| summarize(n, &runs)).collect();
        let ratios = ratios(&summary);
        Self {
            workload: "sysbench-insert".to_string(),
            machine: machine_line(),
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            clients: args.clients,
            duration_s: args.duration.as_secs_f64(),
            rounds: args.runs,
            tables: args.tables,
            table_size: args.table_size,
            runs,
            summary,
            ratios,
        }
    }

    /// The figures of `summary.json`: writes/s, p99 and CPU per write, medians per target.
    pub fn summary(&self) -> Summary {
        let shape = format!("{} clients, {} tables", self.clients, self.tables);
        let row = |metric: String, unit: &str, higher_is_better: bool, f: &dyn Fn(&TargetSummary) -> f64| {
            SummaryRow {
                metric,
                unit: unit.to_string(),
                higher_is_better,
                values: self.summary.iter().map(|s| (s.target.clone(), f(s))).collect(),
            }
        };
        Summary::new(
            "sysbench-insert",
            command_line(),
            vec![
                row(format!("writes/s, {shape}"), "writes/s", true, &|s| {
                    s.writes_per_sec
                }),
                row(format!("p99 latency, {shape}"), "ms", false, &|s| {
                    s.latency_p99_ms
                }),
                row(format!("CPU per write, {shape}"), "µs", false, &|s| {
                    s.cpu_per_write_us
                }),
            ],
        )
    }

    /// Writes `results.json`, `summary.json`, `writes_per_sec.svg`, `latency_p99.svg`,
    /// `writes_over_time.svg`.
    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        std::fs::write(out.join("results.json"), serde_json::to_string_pretty(self)?)?;
        self.summary().write(out)?;
        let note = format!(
            "sysbench oltp_insert shape: {} clients, {} tables, {:.0} s per run, median of the valid runs of {} rounds, whiskers min..max; {}",
            self.clients, self.tables, self.duration_s, self.rounds, self.machine
        );
        let bars = |f: &dyn Fn(&TargetSummary) -> (f64, f64, f64)| -> Vec<plot::Bar> {
            self.summary
                .iter()
                .map(|s| {
                    let (median, min, max) = f(s);
                    plot::Bar {
                        label: s.target.clone(),
                        median,
                        min,
                        max,
                    }
                })
                .collect()
        };
        std::fs::write(
            out.join("writes_per_sec.svg"),
            plot::bar_chart(
                "sysbench-insert: acknowledged writes per second",
                &note,
                "writes/s",
                &bars(&|s| (s.writes_per_sec, s.writes_per_sec_min, s.writes_per_sec_max)),
            ),
        )?;
        let p99 = |s: &TargetSummary| -> (f64, f64, f64) {
            let v: Vec<f64> = self
                .runs
                .iter()
                .filter(|r| r.target == s.target && r.valid)
                .map(|r| r.latency_ms.p99)
                .collect();
            (
                s.latency_p99_ms,
                v.iter().copied().reduce(f64::min).unwrap_or(0.0),
                v.iter().copied().reduce(f64::max).unwrap_or(0.0),
            )
        };
        std::fs::write(
            out.join("latency_p99.svg"),
            plot::bar_chart("sysbench-insert: write latency p99", &note, "ms", &bars(&p99)),
        )?;
        let series: Vec<plot::Series> = self
            .runs
            .iter()
            .map(|r| plot::Series {
                label: format!("{} run {}", r.target, r.run),
                points: r
                    .per_second
                    .iter()
                    .map(|s| (s.t as f64, s.writes as f64))
                    .collect(),
            })
            .collect();
        std::fs::write(
            out.join("writes_over_time.svg"),
            plot::line_chart(
                "sysbench-insert: acknowledged writes per second",
                "seconds",
                "writes/s",
                &series,
            ),
        )?;
        Ok(())
    }

    /// Prints a summary per target in sysbench's layout, then the ratios.
    pub fn print(&self) {
        println!("sysbench-insert: {} ({})", self.machine, self.date);
        for s in &self.summary {
            println!(
                "\n== {} (median of {} valid of {} runs)",
                s.target, s.valid_runs, s.runs
            );
            println!("SQL statistics:");
            println!(
                "    writes:                              {:.0}  ({:.2} per sec.)",
                s.writes, s.writes_per_sec
            );
            println!("    errors:                              {}", s.errors);
            println!("Latency (ms):");
            println!(
                "         min:                          {:>10.2}",
                s.latency_min_ms
            );
            println!(
                "         avg:                          {:>10.2}",
                s.latency_avg_ms
            );
            println!(
                "         max:                          {:>10.2}",
                s.latency_max_ms
            );
            println!(
                "         95th percentile:              {:>10.2}",
                s.latency_p95_ms
            );
            println!(
                "         99th percentile:              {:>10.2}",
                s.latency_p99_ms
            );
            println!("CPU per acknowledged write (µs):");
            println!(
                "         all processes:                {:>10.1}",
                s.cpu_per_write_us
            );
            println!(
                "         servers:                      {:>10.1}",
                s.cpu_servers_per_write_us
            );
            println!(
                "         load generator:               {:>10.1}",
                s.cpu_load_generator_per_write_us
            );
        }
        println!();
        for r in &self.ratios {
            println!(
                "ratio {}: writes/s {:.2}x, p99 {:.2}x lower, CPU per write {:.2}x less",
                r.name, r.writes_per_sec, r.p99_other_over_reference, r.cpu_per_write_other_over_reference
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysbench::CpuUse;
    use crate::LatencyMs;

    fn run(target: &str, n: u64, rate: f64, p99: f64, valid: bool) -> InsertRun {
        InsertRun {
            target: target.into(),
            run: n,
            load_generator: String::new(),
            writes: (rate * 10.0) as u64,
            writes_per_sec: rate,
            seconds: 10.0,
            errors: 0,
            latency_ms: LatencyMs {
                p99,
                ..Default::default()
            },
            per_second: Vec::new(),
            cpu: CpuUse::new(rate * 10.0 * 50e-6, 0.0, (rate * 10.0) as u64),
            valid,
            problems: Vec::new(),
            mariadb: None,
        }
    }

    #[test]
    fn medians_leave_out_invalid_runs_and_ratios_use_the_ftkv_target() {
        let runs = vec![
            run("etcd", 1, 5_000.0, 60.0, true),
            run("ftkv", 1, 20_000.0, 10.0, true),
            run("etcd", 2, 4_000.0, 50.0, true),
            run("ftkv", 2, 18_000.0, 12.0, true),
            run("etcd", 3, 99_000.0, 1.0, false),
            run("ftkv", 3, 22_000.0, 11.0, true),
        ];
        let names = ["etcd".to_string(), "ftkv".to_string()];
        let summary: Vec<TargetSummary> = names.iter().map(|n| summarize(n, &runs)).collect();
        let etcd = &summary[0];
        assert_eq!((etcd.valid_runs, etcd.runs), (2, 3));
        assert_eq!(etcd.writes_per_sec, 4_500.0);
        assert_eq!(
            (etcd.writes_per_sec_min, etcd.writes_per_sec_max),
            (4_000.0, 5_000.0)
        );
        assert_eq!(etcd.latency_p99_ms, 55.0);
        let ftkv = &summary[1];
        assert_eq!(ftkv.writes_per_sec, 20_000.0);
        assert!((ftkv.cpu_per_write_us - 50.0).abs() < 1e-6);
        let r = ratios(&summary);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "ftkv / etcd");
        assert!((r[0].writes_per_sec - 20_000.0 / 4_500.0).abs() < 1e-9);
        assert!((r[0].p99_other_over_reference - 5.0).abs() < 1e-9);
    }

    #[test]
    fn a_target_without_valid_runs_has_zero_medians() {
        let runs = vec![run("mariadb-semisync", 1, 9_000.0, 30.0, false)];
        let s = summarize("mariadb-semisync", &runs);
        assert_eq!(s.valid_runs, 0);
        assert_eq!(s.writes_per_sec, 0.0);
        let r = ratios(&[summarize("ftkv", &[run("ftkv", 1, 1.0, 1.0, true)]), s]);
        assert_eq!(r[0].writes_per_sec, 0.0);
    }
}
