//! `ftkv-bench beyond-memory --targets ftkv,ftkv-sled --cache-size 64MiB --data-multiple 16
//! --runs R --out DIR`: random inserts into a three-node cluster whose nodes run with the
//! engine cache at `--cache-size` (`ftkv-node run --cache-size`, the node's `engine.cache_size`;
//! sled's `cache_capacity` for `ftkv-sled`), each node process in its own memory cgroup
//! (`--memory-limit`, page cache included; [`crate::engine::cgroup`]), until the logical data
//! (keys + values acknowledged) is `--data-multiple` times the cache.
//!
//! Rows: 3-byte prefix `bm/` + a random 16-byte key and a 100-byte half-compressible value
//! ([`crate::engine::data`]), written in batches of `--batch-rows` from `--clients` writers.
//! Rows/s is recorded per second (the line chart `DIR/beyond_memory.svg`, one line per run);
//! the figures are the median over the runs of each run's rows/s (rows over the time to the last
//! acknowledgement) and of each run's median per-second rate. A run where nothing is
//! acknowledged for `--stall-secs` (nodes killed by the cgroup's OOM killer) stops there and is
//! marked `completed: false`, with the rows it reached; each node's cgroup peak, limit hits and
//! OOM kills are in `results.json`. After a completed run every node must hold every row.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use super::targets::{self, DiskSize, Kind, LoadOutcome, LoadShape, Running};
use super::{bar, mb, spread, target_port};
use crate::engine::cgroup::MemoryCgroup;
use crate::engine::data;
use crate::summary::{command_line, Summary, SummaryRow};

/// Key prefix of the rows.
const PREFIX: &[u8] = b"bm/";
/// Logical bytes of one row (key + value).
const ROW_BYTES: u64 = (3 + data::KEY_LEN_BYTES + data::VALUE_LEN_BYTES) as u64;

/// `ftkv-bench beyond-memory` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BeyondMemoryArgs {
    /// Comma-separated targets: ftkv, ftkv-sled.
    #[arg(long, default_value = "ftkv,ftkv-sled")]
    pub targets: String,
    /// Engine cache of every node (e.g. 64MiB; whole KiB).
    #[arg(long, default_value = "64MiB", value_parser = crate::engine::parse_size)]
    pub cache_size: u64,
    /// Insert until keys + values reach this many times the cache.
    #[arg(long, default_value_t = 16)]
    pub data_multiple: u64,
    /// Memory cgroup limit of each node process, page cache included. Default: 4x the cache,
    /// at least 128MiB.
    #[arg(long, value_parser = crate::engine::parse_size)]
    pub memory_limit: Option<u64>,
    /// Rounds; each runs every target once.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Rows per `Kv.Write` batch.
    #[arg(long, default_value_t = 100)]
    pub batch_rows: u64,
    /// Concurrent writers (one batch in flight each).
    #[arg(long, default_value_t = 16)]
    pub clients: u64,
    /// Stop a run after this long without an acknowledged batch.
    #[arg(long, default_value_t = 60)]
    pub stall_secs: u64,
    /// Output directory.
    #[arg(long, default_value = "store/bench-beyond-memory")]
    pub out: PathBuf,
    /// First port (each target takes 20 from here).
    #[arg(long, default_value_t = 31200)]
    pub base_port: u16,
}

/// One node's memory cgroup after a run.
#[derive(Debug, Clone, Serialize)]
pub struct NodeMemory {
    /// Node (1-based, in start order).
    pub node: u64,
    /// Process id.
    pub pid: u32,
    /// Peak memory charged to its cgroup, bytes.
    pub cgroup_peak_bytes: Option<u64>,
    /// Times the limit was hit.
    pub limit_hits: Option<u64>,
    /// OOM kills in the group.
    pub oom_kills: Option<u64>,
    /// Whether the process was still running at the end of the load.
    pub alive: bool,
    /// The node's own `ftkv_engine_cache_capacity_bytes` (its status port's `/metrics`) at the
    /// start: the cache setting as the node took it.
    pub cache_capacity_bytes: Option<u64>,
}

/// One run of one target.
#[derive(Debug, Clone, Serialize)]
pub struct BeyondMemoryRun {
    /// Target.
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// Rows the run set out to insert.
    pub rows_requested: u64,
    /// The load, with rows acknowledged per second.
    pub load: LoadOutcome,
    /// Median of the per-second rates (the last, partial second and a stalled run's final
    /// seconds without an acknowledgement left out).
    pub median_rows_per_second: f64,
    /// True when every row was acknowledged.
    pub completed: bool,
    /// Each node's cgroup.
    pub nodes: Vec<NodeMemory>,
    /// Keys under the prefix on each node after a completed run (each equal to the rows).
    pub keys_per_node: Vec<u64>,
    /// Data dir sizes at the end, the cluster running.
    pub sizes: Vec<DiskSize>,
}

/// Medians of one target.
#[derive(Debug, Clone, Serialize)]
pub struct BeyondMemorySummary {
    /// Target.
    pub target: String,
    /// Rows/s of each run: median, min, max.
    pub rows_per_sec: crate::bulk::Spread,
    /// Median over runs of the median per-second rate.
    pub median_rows_per_second: f64,
    /// Runs that acknowledged every row.
    pub completed_runs: u64,
    /// Highest cgroup peak of any node in any run, bytes.
    pub max_cgroup_peak_bytes: u64,
}

#[derive(Serialize)]
struct Report {
    workload: &'static str,
    machine: String,
    cache_size_bytes: u64,
    memory_limit_bytes: u64,
    data_multiple: u64,
    rows: u64,
    row_bytes: u64,
    batch_rows: u64,
    clients: u64,
    runs: Vec<BeyondMemoryRun>,
    summary: Vec<BeyondMemorySummary>,
    /// `a / b` of the median rows/s, every pair.
    ratios: Vec<(String, f64)>,
}

/// Runs `ftkv-bench beyond-memory`.
pub async fn run(args: &BeyondMemoryArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.cache_size >= 1 << 20, "--cache-size must be at least 1MiB");
    anyhow::ensure!(args.data_multiple > 0, "--data-multiple must be > 0");
    anyhow::ensure!(args.runs > 0, "--runs must be > 0");
    let targets = targets::parse_targets(&args.targets, &["ftkv", "ftkv-sled"])?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let memory_limit = args.memory_limit.unwrap_or((4 * args.cache_size).max(128 << 20));
    let rows = (args.data_multiple * args.cache_size).div_ceil(ROW_BYTES);
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for (i, (name, kind)) in targets.iter().enumerate() {
            eprintln!(
                "== round {run}/{}: {name}: {rows} rows ({:.1} MB), cache {} MiB, cgroup {} MiB per node",
                args.runs,
                mb(rows * ROW_BYTES),
                args.cache_size >> 20,
                memory_limit >> 20
            );
            let port = target_port(args.base_port, i)?;
            let r = one_run(args, name, *kind, port, rows, memory_limit, run).await?;
            eprintln!(
                "   {name}: {:.0} rows/s (median per second {:.0}), {} of {rows} rows{}; cgroup peaks {:?} MiB",
                r.load.rows_per_sec,
                r.median_rows_per_second,
                r.load.rows_acknowledged,
                if r.completed { "" } else { ", STALLED" },
                r.nodes
                    .iter()
                    .map(|n| n.cgroup_peak_bytes.unwrap_or(0) >> 20)
                    .collect::<Vec<_>>()
            );
            runs.push(r);
        }
    }
    let summary = targets.iter().map(|(t, _)| summarize(t, &runs)).collect();
    write_report(args, memory_limit, rows, runs, summary)
}

/// The node processes of the playground `pid` (its children), in pid order.
fn node_pids(playground_pid: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid ...`; comm may hold spaces, so split after the `)`.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(playground_pid)
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// One cgroup per node process of `target`, each limited to `limit_bytes`.
fn confine_nodes(
    target: &Running,
    name: &str,
    run: u64,
    limit_bytes: u64,
) -> anyhow::Result<Vec<(u32, MemoryCgroup)>> {
    let Running::Ftkv(cluster, _) = target else {
        anyhow::bail!("beyond-memory runs ftkv targets only");
    };
    let pids = node_pids(cluster.pid());
    anyhow::ensure!(pids.len() == 3, "expected 3 node processes, found {pids:?}");
    pids.into_iter()
        .enumerate()
        .map(|(i, pid)| {
            let group = format!("ftkv-bench-bm-{}-{name}-{run}-{}", std::process::id(), i + 1);
            let cg = MemoryCgroup::create(&group, limit_bytes)?;
            cg.add_process(pid)?;
            Ok((pid, cg))
        })
        .collect()
}

/// The `ftkv_engine_cache_capacity_bytes` gauge of the playground node whose client endpoint is
/// `client_endpoint` (its status port is the client port + 2), by a plain HTTP/1.0 `GET
/// /metrics`; `None` when it cannot be read within 5 s.
async fn cache_capacity_bytes(client_endpoint: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (host, port) = client_endpoint.rsplit_once(':')?;
    let status_port = port.parse::<u16>().ok()?.checked_add(2)?;
    let read = async {
        let mut stream = tokio::net::TcpStream::connect((host, status_port)).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix("ftkv_engine_cache_capacity_bytes "))?;
        value.trim().parse::<f64>().ok().map(|v| v as u64)
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.ok()?
}

async fn one_run(
    args: &BeyondMemoryArgs,
    name: &str,
    kind: Kind,
    port: u16,
    rows: u64,
    memory_limit: u64,
    run: u64,
) -> anyhow::Result<BeyondMemoryRun> {
    let node_args = vec![format!("--cache-size={}KiB", args.cache_size >> 10)];
    let target = Arc::new(Running::start(kind, port, &node_args).await?);
    let groups = confine_nodes(&target, name, run, memory_limit)?;
    let mut capacities = Vec::new();
    for e in target.endpoints() {
        capacities.push(cache_capacity_bytes(e).await);
    }
    let shape = LoadShape {
        rows,
        batch_rows: args.batch_rows,
        clients: args.clients,
        stall_secs: args.stall_secs,
    };
    let seed = 0xB0_u64 ^ run;
    let row = move |i: u64| {
        let mut key = PREFIX.to_vec();
        key.extend_from_slice(&data::random_key(seed, i));
        Some((key, data::half_compressible_value(seed, i)))
    };
    let load = targets::load(&target, shape, &format!("{name} run {run}"), row).await;
    let nodes = groups
        .iter()
        .enumerate()
        .map(|(i, (pid, cg))| NodeMemory {
            node: i as u64 + 1,
            pid: *pid,
            cgroup_peak_bytes: cg.peak_bytes(),
            limit_hits: cg.limit_hits(),
            oom_kills: cg.oom_kills(),
            alive: std::path::Path::new(&format!("/proc/{pid}")).exists(),
            cache_capacity_bytes: capacities.get(i).copied().flatten(),
        })
        .collect();
    let completed = !load.stalled && load.rows_acknowledged == rows;
    let keys_per_node = if completed {
        let end = super::prefix_end(PREFIX);
        super::wait_for_keys(&target, PREFIX, &end, rows, Duration::from_secs(300)).await?
    } else {
        Vec::new()
    };
    let sizes = targets::disk_sizes(&target)?;
    let mut rates: Vec<f64> = load.rows_per_second.iter().map(|r| *r as f64).collect();
    // A stalled run ends in its stall window: seconds without an acknowledgement.
    while rates.len() > 1 && rates.last() == Some(&0.0) {
        rates.pop();
    }
    if rates.len() > 1 {
        rates.pop();
    }
    drop(target);
    drop(groups);
    Ok(BeyondMemoryRun {
        target: name.to_string(),
        run,
        rows_requested: rows,
        median_rows_per_second: crate::median(&rates),
        load,
        completed,
        nodes,
        keys_per_node,
        sizes,
    })
}

fn summarize(target: &str, runs: &[BeyondMemoryRun]) -> BeyondMemorySummary {
    let rs: Vec<&BeyondMemoryRun> = runs.iter().filter(|r| r.target == target).collect();
    let values = |f: &dyn Fn(&BeyondMemoryRun) -> f64| rs.iter().map(|r| f(r)).collect::<Vec<_>>();
    BeyondMemorySummary {
        target: target.to_string(),
        rows_per_sec: spread(&values(&|r| r.load.rows_per_sec)),
        median_rows_per_second: crate::median(&values(&|r| r.median_rows_per_second)),
        completed_runs: rs.iter().filter(|r| r.completed).count() as u64,
        max_cgroup_peak_bytes: rs
            .iter()
            .flat_map(|r| r.nodes.iter().filter_map(|n| n.cgroup_peak_bytes))
            .max()
            .unwrap_or(0),
    }
}

fn write_report(
    args: &BeyondMemoryArgs,
    memory_limit: u64,
    rows: u64,
    runs: Vec<BeyondMemoryRun>,
    summary: Vec<BeyondMemorySummary>,
) -> anyhow::Result<()> {
    let ratios = summary
        .iter()
        .flat_map(|a| {
            summary.iter().filter(|b| b.target != a.target).map(move |b| {
                (
                    format!("{} / {}", a.target, b.target),
                    a.rows_per_sec.median / b.rows_per_sec.median.max(1e-9),
                )
            })
        })
        .collect();
    let report = Report {
        workload: "beyond-memory",
        machine: super::machine(),
        cache_size_bytes: args.cache_size,
        memory_limit_bytes: memory_limit,
        data_multiple: args.data_multiple,
        rows,
        row_bytes: ROW_BYTES,
        batch_rows: args.batch_rows,
        clients: args.clients,
        runs,
        summary,
        ratios,
    };
    super::write_results(&args.out, &report)?;
    let what = format!(
        "random inserts to {}x a {} MiB cache, {} MiB cgroup per node",
        args.data_multiple,
        args.cache_size >> 20,
        memory_limit >> 20
    );
    let values = |f: &dyn Fn(&BeyondMemorySummary) -> f64| {
        report
            .summary
            .iter()
            .map(|s| (s.target.clone(), f(s)))
            .collect::<Vec<_>>()
    };
    let rows = vec![
        SummaryRow {
            metric: format!("rows/s, {what}"),
            unit: "rows/s".into(),
            higher_is_better: true,
            values: values(&|s| s.rows_per_sec.median),
        },
        SummaryRow {
            metric: format!("median of rows/s per second, {what}"),
            unit: "rows/s".into(),
            higher_is_better: true,
            values: values(&|s| s.median_rows_per_second),
        },
    ];
    Summary::new("beyond-memory", command_line(), rows).write(&args.out)?;
    write_charts(args, &report, &what)?;
    print_table(&report);
    Ok(())
}

fn write_charts(args: &BeyondMemoryArgs, report: &Report, what: &str) -> anyhow::Result<()> {
    let series: Vec<crate::plot::Series> = report
        .runs
        .iter()
        .map(|r| crate::plot::Series {
            label: format!("{} run {}", r.target, r.run),
            points: r
                .load
                .rows_per_second
                .iter()
                .enumerate()
                .map(|(t, n)| (t as f64 + 1.0, *n as f64))
                .collect(),
        })
        .collect();
    let lines = args.out.join("beyond_memory.svg");
    std::fs::write(
        &lines,
        crate::plot::line_chart(&format!("rows/s over time: {what}"), "seconds", "rows/s", &series),
    )
    .with_context(|| format!("cannot write {}", lines.display()))?;
    let bars: Vec<crate::plot::Bar> = report
        .summary
        .iter()
        .map(|s| {
            let per_run: Vec<f64> = report
                .runs
                .iter()
                .filter(|r| r.target == s.target)
                .map(|r| r.load.rows_per_sec)
                .collect();
            bar(s.target.clone(), &per_run)
        })
        .collect();
    let chart = args.out.join("beyond_memory_bars.svg");
    std::fs::write(
        &chart,
        crate::plot::bar_chart(
            &format!("rows/s: {what}"),
            &format!(
                "{} rows; median, whiskers min-max of {} runs",
                report.rows, args.runs
            ),
            "rows/s",
            &bars,
        ),
    )
    .with_context(|| format!("cannot write {}", chart.display()))
}

fn print_table(report: &Report) {
    let w = report
        .summary
        .iter()
        .map(|s| s.target.len())
        .max()
        .unwrap_or(0)
        .max(6);
    println!(
        "{:<w$} {:>12} {:>14} {:>10} {:>14}",
        "target", "rows/s(med)", "med per sec", "completed", "cgroup peak MB"
    );
    for s in &report.summary {
        println!(
            "{:<w$} {:>12.0} {:>14.0} {:>10} {:>14.1}",
            s.target,
            s.rows_per_sec.median,
            s.median_rows_per_second,
            s.completed_runs,
            mb(s.max_cgroup_peak_bytes)
        );
    }
    for (name, ratio) in &report.ratios {
        println!("ratio {name}: {ratio:.2}x");
    }
}
