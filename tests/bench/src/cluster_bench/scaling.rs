//! `ftkv-bench scaling`: put throughput and latency over a grid of client counts and value
//! sizes, a curve per target (issue 19, workload 2).
//!
//! `ftkv-bench scaling --targets ftkv,ftkv-sled,etcd --clients 1,8,32,128,512 --value-sizes
//! 100,1024,16384 --duration 10s --runs 3 --out DIR`
//!
//! Each round starts every target once, in the order given (A B C, A B C, ...), as a three-node
//! cluster, and runs every point of the grid against that one cluster: for each value size, for
//! each client count, [`crate::run_load`] for `duration` (random keys from `key-space`, values
//! half random). Beside each point: CPU seconds per acknowledged put, summed over the server
//! processes and this process (the load generator), as `sysbench-insert` counts them
//! ([`crate::sysbench::CpuUse`]). Results: `DIR/results.json` (every point of every run, the
//! medians per target and point, the ratios of the first target over each other one per point),
//! `DIR/summary.json` (puts/s and CPU per put at 128 clients, per value size), and per value
//! size `DIR/scaling_<size>B.svg` (x = clients, y = median puts/s, a line per target) and
//! `DIR/latency_p99_<size>B.svg`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::{measure_cpu, ratios_over_first, Started};
use crate::summary::{command_line, machine_line, Summary, SummaryRow};
use crate::sysbench::CpuUse;
use crate::{plot, Load, RunResult};

/// `ftkv-bench scaling` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ScalingArgs {
    /// Comma-separated targets: ftkv, ftkv-sled, etcd, ftkv@DIR, ftkv-sled@DIR.
    #[arg(long, default_value = "ftkv,ftkv-sled,etcd")]
    pub targets: String,
    /// Comma-separated client counts.
    #[arg(long, default_value = "1,8,32,128,512")]
    pub clients: String,
    /// Comma-separated value sizes in bytes.
    #[arg(long, default_value = "100,1024,16384")]
    pub value_sizes: String,
    /// Length of each point's run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Rounds; each round starts every target once and runs every point against it.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 1_000_000)]
    pub key_space: u64,
    /// Output directory.
    #[arg(long, default_value = "store/bench-scaling")]
    pub out: PathBuf,
    /// First port; target i of a round uses 20 ports from base + 20 i.
    #[arg(long, default_value_t = 24100)]
    pub base_port: u16,
    /// RNG seed of the load generator.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// One point of one run.
#[derive(Debug, Clone, Serialize)]
pub struct PointRun {
    /// Target name as given.
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// Concurrent clients.
    pub clients: u64,
    /// Value size, bytes.
    pub value_size_bytes: usize,
    /// Puts, latency and the per-second series.
    pub result: RunResult,
    /// CPU over the point's window.
    pub cpu: CpuUse,
}

/// Medians over the rounds of one target at one point.
#[derive(Debug, Clone, Serialize)]
pub struct PointMedian {
    /// Target name as given.
    pub target: String,
    /// Concurrent clients.
    pub clients: u64,
    /// Value size, bytes.
    pub value_size_bytes: usize,
    /// Rounds the median is over.
    pub runs: usize,
    /// Acknowledged puts per second.
    pub puts_per_sec: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// CPU per acknowledged put, servers plus load generator, µs.
    pub cpu_per_write_us: f64,
    /// CPU per acknowledged put of the server processes, µs.
    pub cpu_servers_per_write_us: f64,
    /// Failed requests, summed over the rounds.
    pub errors: u64,
}

/// The first target's median puts/s over each other one's, at one point.
#[derive(Debug, Clone, Serialize)]
pub struct PointRatios {
    /// Concurrent clients.
    pub clients: u64,
    /// Value size, bytes.
    pub value_size_bytes: usize,
    /// `("first / other", ratio)`.
    pub puts_per_sec: Vec<(String, f64)>,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    command: String,
    duration_s: f64,
    key_space: u64,
    targets: Vec<String>,
    clients: Vec<u64>,
    value_sizes_bytes: Vec<usize>,
    runs: Vec<PointRun>,
    medians: Vec<PointMedian>,
    ratios: Vec<PointRatios>,
}

/// Runs every point of the grid against one started target.
async fn run_points(started: &Started, args: &ScalingArgs, grid: &[(usize, u64)], run: u64) -> Vec<PointRun> {
    let mut points = Vec::new();
    for &(value_size, clients) in grid {
        let load = Load {
            clients,
            duration: args.duration,
            value_size,
            key_space: args.key_space,
            seed: args.seed.wrapping_add(run),
            idle_sessions: 0,
        };
        let (mut result, cpu) = measure_cpu(
            &started.server_pids,
            crate::run_load(&started.target, &load, run),
            |r: &RunResult| r.ops,
        )
        .await;
        result.target = started.name.clone();
        eprintln!(
            "   {} {clients} clients, {value_size} B: {:.0} puts/s, p50 {:.2} ms, p99 {:.2} ms, \
             CPU {:.1} µs/put, errors {}",
            started.name,
            result.ops_per_sec,
            result.latency_ms.p50,
            result.latency_ms.p99,
            cpu.per_write_us,
            result.errors
        );
        points.push(PointRun {
            target: started.name.clone(),
            run,
            clients,
            value_size_bytes: value_size,
            result,
            cpu,
        });
    }
    points
}

fn medians(targets: &[String], grid: &[(usize, u64)], runs: &[PointRun]) -> Vec<PointMedian> {
    let mut out = Vec::new();
    for &(value_size, clients) in grid {
        for t in targets {
            let rs: Vec<&PointRun> = runs
                .iter()
                .filter(|r| &r.target == t && r.clients == clients && r.value_size_bytes == value_size)
                .collect();
            let med =
                |f: &dyn Fn(&PointRun) -> f64| crate::median(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
            out.push(PointMedian {
                target: t.clone(),
                clients,
                value_size_bytes: value_size,
                runs: rs.len(),
                puts_per_sec: med(&|r| r.result.ops_per_sec),
                p50_ms: med(&|r| r.result.latency_ms.p50),
                p99_ms: med(&|r| r.result.latency_ms.p99),
                cpu_per_write_us: med(&|r| r.cpu.per_write_us),
                cpu_servers_per_write_us: med(&|r| r.cpu.servers_per_write_us),
                errors: rs.iter().map(|r| r.result.errors).sum(),
            });
        }
    }
    out
}

fn ratios(grid: &[(usize, u64)], medians: &[PointMedian]) -> Vec<PointRatios> {
    grid.iter()
        .map(|&(value_size, clients)| {
            let values: Vec<(String, f64)> = medians
                .iter()
                .filter(|m| m.clients == clients && m.value_size_bytes == value_size)
                .map(|m| (m.target.clone(), m.puts_per_sec))
                .collect();
            PointRatios {
                clients,
                value_size_bytes: value_size,
                puts_per_sec: ratios_over_first(&values),
            }
        })
        .collect()
}

/// Runs `ftkv-bench scaling` (see the module docs).
pub async fn run(args: &ScalingArgs) -> anyhow::Result<()> {
    let targets = super::parse_targets(&args.targets)?;
    let clients: Vec<u64> = super::parse_list(&args.clients, "--clients")?;
    let value_sizes: Vec<usize> = super::parse_list(&args.value_sizes, "--value-sizes")?;
    anyhow::ensure!(
        clients.iter().all(|&c| c > 0),
        "--clients: every count must be at least 1"
    );
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    let grid: Vec<(usize, u64)> = value_sizes
        .iter()
        .flat_map(|&v| clients.iter().map(move |&c| (v, c)))
        .collect();
    std::fs::create_dir_all(&args.out)?;
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for (i, (name, kind)) in targets.iter().enumerate() {
            eprintln!(
                "== round {run}/{}: {name} ({} points of {:?})",
                args.runs,
                grid.len(),
                args.duration
            );
            let port = args.base_port + super::PORTS_PER_TARGET * i as u16;
            let started = super::start(name, kind, port).await?;
            runs.extend(run_points(&started, args, &grid, run).await);
        }
    }
    let names: Vec<String> = targets.iter().map(|(n, _)| n.clone()).collect();
    let medians = medians(&names, &grid, &runs);
    let report = Report {
        machine: machine_line(),
        command: command_line(),
        duration_s: args.duration.as_secs_f64(),
        key_space: args.key_space,
        targets: names,
        clients,
        value_sizes_bytes: value_sizes,
        ratios: ratios(&grid, &medians),
        medians,
        runs,
    };
    super::write_json(&args.out, "results.json", &report)?;
    summary(&report).write(&args.out)?;
    charts(&report, &args.out)?;
    print(&report);
    println!("report: {}", args.out.join("results.json").display());
    Ok(())
}

/// The client count of the summary's figures: 128 (the standard concurrency) when the
/// grid has it, else the largest count.
pub fn summary_clients(clients: &[u64]) -> u64 {
    if clients.contains(&128) {
        128
    } else {
        clients.iter().copied().max().unwrap_or(0)
    }
}

/// `summary.json`: puts/s and CPU per put at [`summary_clients`] for each value size (the whole
/// curve is in `results.json` and the charts; BENCHMARKS.md's opening table takes every row).
fn summary(report: &Report) -> Summary {
    let c = summary_clients(&report.clients);
    let mut rows = Vec::new();
    for &v in &report.value_sizes_bytes {
        let at: Vec<&PointMedian> = report
            .medians
            .iter()
            .filter(|m| m.clients == c && m.value_size_bytes == v)
            .collect();
        let row = |metric: &str, unit: &str, higher: bool, f: &dyn Fn(&PointMedian) -> f64| SummaryRow {
            metric: format!("{metric}, {c} clients, {v} B values"),
            unit: unit.to_string(),
            higher_is_better: higher,
            values: at.iter().map(|m| (m.target.clone(), f(m))).collect(),
        };
        rows.push(row("puts/s", "ops/s", true, &|m| m.puts_per_sec));
        rows.push(row("CPU per put", "µs", false, &|m| m.cpu_per_write_us));
    }
    Summary::new("scaling", report.command.clone(), rows)
}

fn charts(report: &Report, out: &std::path::Path) -> anyhow::Result<()> {
    for &v in &report.value_sizes_bytes {
        let series = |f: &dyn Fn(&PointMedian) -> f64| -> Vec<plot::Series> {
            report
                .targets
                .iter()
                .map(|t| plot::Series {
                    label: t.clone(),
                    points: report
                        .medians
                        .iter()
                        .filter(|m| &m.target == t && m.value_size_bytes == v)
                        .map(|m| (m.clients as f64, f(m)))
                        .collect(),
                })
                .collect()
        };
        std::fs::write(
            out.join(format!("scaling_{v}B.svg")),
            plot::line_chart(
                &format!("puts/s by clients, {v} B values (median of rounds)"),
                "clients",
                "puts/s",
                &series(&|m| m.puts_per_sec),
            ),
        )?;
        std::fs::write(
            out.join(format!("latency_p99_{v}B.svg")),
            plot::line_chart(
                &format!("put latency p99 by clients, {v} B values (median of rounds)"),
                "clients",
                "ms",
                &series(&|m| m.p99_ms),
            ),
        )?;
    }
    Ok(())
}

fn print(report: &Report) {
    let w = report.targets.iter().map(String::len).max().unwrap_or(0).max(8);
    println!(
        "{:<w$} {:>8} {:>8} {:>12} {:>9} {:>9} {:>11} {:>7}",
        "target", "clients", "value B", "puts/s(med)", "p50 ms", "p99 ms", "CPU µs/put", "errors"
    );
    for m in &report.medians {
        println!(
            "{:<w$} {:>8} {:>8} {:>12.0} {:>9.2} {:>9.2} {:>11.1} {:>7}",
            m.target,
            m.clients,
            m.value_size_bytes,
            m.puts_per_sec,
            m.p50_ms,
            m.p99_ms,
            m.cpu_per_write_us,
            m.errors
        );
    }
    for r in &report.ratios {
        for (name, ratio) in &r.puts_per_sec {
            println!(
                "ratio {name} at {} clients, {} B: {ratio:.2}x",
                r.clients, r.value_size_bytes
            );
        }
    }
}
