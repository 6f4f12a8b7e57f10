//! `ftkv-bench compression --targets ftkv,ftkv-sled,etcd --rows N --runs R --out DIR`: the same
//! `timeline_1009` rows ([`super::timeline`]) written through each three-node cluster, then the
//! raw bytes (keys + values acknowledged) against the bytes on disk of each node.
//!
//! Each run of each target starts a fresh cluster, writes `--rows` rows in random uid order in
//! batches of `--batch-rows` from `--clients` concurrent writers (ftkv `Kv.Write`, etcd `Txn`),
//! checks that every node holds exactly `--rows` keys under the table prefix, and measures every
//! node's data dir by walking it (allocated blocks, `st_blocks * 512`, and file lengths), the
//! store (ftkv `node-i/engine`, etcd `member/snap`) and the log (ftkv `node-i/log`, the Raft
//! log; etcd `member/wal`) apart:
//!
//! - ftkv: once running, and once at rest after a clean stop (SIGTERM: every node checkpoints its
//!   engine; until its first checkpoint a small load lives in the Raft log only) — the figure;
//! - etcd: once running, and once after `Compact` (physical, at the current revision) and
//!   `Defragment` of every member, so the bbolt file holds the live keys only — the figure.
//!
//! The figure per target is the median over the runs of the largest node's store, its log and
//! its whole data dir, each against the raw bytes; ratios are every target's store over the
//! first target's. `DIR/compression.svg` is a bar chart of the store per node beside the raw
//! bytes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use super::targets::{self, DiskSize, Kind, LoadOutcome, LoadShape, Running};
use super::timeline::{self, Timeline};
use super::{bar, mb, spread, target_port};
use crate::summary::{command_line, Summary, SummaryRow};

/// `ftkv-bench compression` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct CompressionArgs {
    /// Comma-separated targets: ftkv, ftkv-sled, etcd.
    #[arg(long, default_value = "ftkv,ftkv-sled,etcd")]
    pub targets: String,
    /// Rows of `timeline_1009` written to each target.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Rounds; each runs every target once.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Rows per batch (at most 128: etcd's default `--max-txn-ops`).
    #[arg(long, default_value_t = 100)]
    pub batch_rows: u64,
    /// Concurrent writers (one batch in flight each).
    #[arg(long, default_value_t = 8)]
    pub clients: u64,
    /// Output directory.
    #[arg(long, default_value = "store/bench-compression")]
    pub out: PathBuf,
    /// First port (each target takes 20 from here).
    #[arg(long, default_value_t = 31000)]
    pub base_port: u16,
}

/// One run of one target.
#[derive(Debug, Clone, Serialize)]
pub struct CompressionRun {
    /// Target.
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// The load.
    pub load: LoadOutcome,
    /// Keys under the table prefix on each node (each equal to the rows written).
    pub keys_per_node: Vec<u64>,
    /// Sizes with the cluster running, right after the load.
    pub sizes_running: Vec<DiskSize>,
    /// The figure: ftkv at rest after a clean stop; etcd after compaction and defragmentation.
    pub sizes: Vec<DiskSize>,
    /// ftkv: whether the playground stopped within 15 s of SIGTERM; etcd: always true.
    pub stopped_cleanly: bool,
    /// Raw bytes (keys + values) over the largest node's store.
    pub raw_over_engine: f64,
}

/// Medians of one target.
#[derive(Debug, Clone, Serialize)]
pub struct CompressionSummary {
    /// Target.
    pub target: String,
    /// Raw bytes written (keys + values), the same for every run.
    pub raw_bytes: u64,
    /// Largest node's store, allocated bytes: median, min, max.
    pub engine_allocated_bytes: crate::bulk::Spread,
    /// Largest node's log, allocated bytes.
    pub log_allocated_bytes: crate::bulk::Spread,
    /// Largest node's whole data dir, allocated bytes.
    pub total_allocated_bytes: crate::bulk::Spread,
    /// `raw_bytes / median store`: the compression ratio of the store.
    pub raw_over_engine: f64,
    /// `median store / raw_bytes`.
    pub engine_over_raw: f64,
    /// `median data dir / raw_bytes`.
    pub total_over_raw: f64,
    /// Median load rows/s (not the figure; writes are batched).
    pub rows_per_sec: f64,
}

#[derive(Serialize)]
struct Report {
    workload: &'static str,
    machine: String,
    rows: u64,
    batch_rows: u64,
    clients: u64,
    row_shape: &'static str,
    runs: Vec<CompressionRun>,
    summary: Vec<CompressionSummary>,
    /// `a / b` of the median store per node, every pair.
    ratios: Vec<(String, f64)>,
}

fn largest(sizes: &[DiskSize], f: impl Fn(&DiskSize) -> u64) -> u64 {
    sizes.iter().map(f).max().unwrap_or(0)
}

/// Runs `ftkv-bench compression`.
pub async fn run(args: &CompressionArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rows > 0, "--rows must be > 0");
    anyhow::ensure!(args.runs > 0, "--runs must be > 0");
    anyhow::ensure!(
        (1..=targets::ETCD_MAX_TXN_OPS as u64).contains(&args.batch_rows),
        "--batch-rows must be 1..=128"
    );
    let targets = targets::parse_targets(&args.targets, &["ftkv", "ftkv-sled", "etcd"])?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    eprintln!("== generating {} timeline_1009 rows", args.rows);
    let table = Arc::new(Timeline::new(args.rows, 1009));
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for (i, (name, kind)) in targets.iter().enumerate() {
            eprintln!("== round {run}/{}: {name}: {} rows", args.runs, args.rows);
            let r = one_run(args, name, *kind, target_port(args.base_port, i)?, &table, run).await?;
            eprintln!(
                "   {name}: raw {:.1} MB; largest node: store {:.1} MB ({:.2}x), log {:.1} MB, data dir {:.1} MB",
                mb(r.load.raw_key_bytes + r.load.raw_value_bytes),
                mb(largest(&r.sizes, |s| s.engine_allocated_bytes)),
                r.raw_over_engine,
                mb(largest(&r.sizes, |s| s.log_allocated_bytes)),
                mb(largest(&r.sizes, |s| s.total_allocated_bytes)),
            );
            runs.push(r);
        }
    }
    let summary: Vec<CompressionSummary> = targets.iter().map(|(t, _)| summarize(t, &runs)).collect();
    write_report(args, runs, summary)
}

async fn one_run(
    args: &CompressionArgs,
    name: &str,
    kind: Kind,
    port: u16,
    table: &Arc<Timeline>,
    run: u64,
) -> anyhow::Result<CompressionRun> {
    let target = Arc::new(Running::start(kind, port, &[]).await?);
    let shape = LoadShape {
        rows: args.rows,
        batch_rows: args.batch_rows,
        clients: args.clients,
        stall_secs: 120,
    };
    let rows = Arc::clone(table);
    let load = targets::load(&target, shape, &format!("{name} run {run}"), move |i| rows.row(i)).await;
    anyhow::ensure!(
        !load.stalled && load.rows_acknowledged == args.rows,
        "{name}: {} of {} rows acknowledged (stalled: {})",
        load.rows_acknowledged,
        args.rows,
        load.stalled
    );
    let end = super::prefix_end(timeline::PREFIX);
    let keys_per_node = super::wait_for_keys(
        &target,
        timeline::PREFIX,
        &end,
        args.rows,
        Duration::from_secs(120),
    )
    .await?;
    let sizes_running = targets::disk_sizes(&target)?;
    let mut target = Arc::into_inner(target).context("the load still holds the cluster")?;
    let stopped_cleanly = match &mut target {
        Running::Ftkv(cluster, _) => cluster.stop(),
        Running::Etcd(cluster, _) => {
            targets::etcd_compact_and_defragment(cluster).await?;
            true
        }
    };
    let sizes = targets::disk_sizes(&target)?;
    drop(target);
    let raw = load.raw_key_bytes + load.raw_value_bytes;
    Ok(CompressionRun {
        target: name.to_string(),
        run,
        raw_over_engine: raw as f64 / (largest(&sizes, |s| s.engine_allocated_bytes) as f64).max(1.0),
        load,
        keys_per_node,
        sizes_running,
        sizes,
        stopped_cleanly,
    })
}

fn summarize(target: &str, runs: &[CompressionRun]) -> CompressionSummary {
    let rs: Vec<&CompressionRun> = runs.iter().filter(|r| r.target == target).collect();
    let of = |f: &dyn Fn(&CompressionRun) -> f64| spread(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
    let raw_bytes = rs
        .first()
        .map_or(0, |r| r.load.raw_key_bytes + r.load.raw_value_bytes);
    let engine = of(&|r| largest(&r.sizes, |s| s.engine_allocated_bytes) as f64);
    let log = of(&|r| largest(&r.sizes, |s| s.log_allocated_bytes) as f64);
    let total = of(&|r| largest(&r.sizes, |s| s.total_allocated_bytes) as f64);
    let raw = (raw_bytes as f64).max(1.0);
    CompressionSummary {
        target: target.to_string(),
        raw_bytes,
        raw_over_engine: raw / engine.median.max(1.0),
        engine_over_raw: engine.median / raw,
        total_over_raw: total.median / raw,
        engine_allocated_bytes: engine,
        log_allocated_bytes: log,
        total_allocated_bytes: total,
        rows_per_sec: of(&|r| r.load.rows_per_sec).median,
    }
}

fn write_report(
    args: &CompressionArgs,
    runs: Vec<CompressionRun>,
    summary: Vec<CompressionSummary>,
) -> anyhow::Result<()> {
    let ratios = summary
        .iter()
        .flat_map(|a| {
            summary.iter().filter(|b| b.target != a.target).map(move |b| {
                (
                    format!("{} / {}", a.target, b.target),
                    a.engine_allocated_bytes.median / b.engine_allocated_bytes.median.max(1.0),
                )
            })
        })
        .collect();
    let report = Report {
        workload: "compression",
        machine: super::machine(),
        rows: args.rows,
        batch_rows: args.batch_rows,
        clients: args.clients,
        row_shape: "timeline_1009: key timeline_1009/ + uid u64 BE; value vflag u8, status_id u64, source u32, fflag u32, mflag u8 (LE)",
        runs,
        summary,
        ratios,
    };
    super::write_results(&args.out, &report)?;
    let values = |f: &dyn Fn(&CompressionSummary) -> f64| {
        report
            .summary
            .iter()
            .map(|s| (s.target.clone(), f(s)))
            .collect::<Vec<_>>()
    };
    let metric = |what: &str| format!("{what} per node (largest), {} timeline_1009 rows", args.rows);
    let rows = vec![
        SummaryRow {
            metric: metric("store on disk"),
            unit: "bytes".into(),
            higher_is_better: false,
            values: values(&|s| s.engine_allocated_bytes.median),
        },
        SummaryRow {
            metric: metric("log on disk"),
            unit: "bytes".into(),
            higher_is_better: false,
            values: values(&|s| s.log_allocated_bytes.median),
        },
        SummaryRow {
            metric: metric("raw bytes over store"),
            unit: "x".into(),
            higher_is_better: true,
            values: values(&|s| s.raw_over_engine),
        },
    ];
    Summary::new("compression", command_line(), rows).write(&args.out)?;
    write_chart(args, &report)?;
    print_table(&report);
    Ok(())
}

fn write_chart(args: &CompressionArgs, report: &Report) -> anyhow::Result<()> {
    let raw = report.summary.first().map_or(0, |s| s.raw_bytes) as f64;
    let mut bars = vec![bar("raw keys+values".into(), &[raw])];
    for s in &report.summary {
        let per_run: Vec<f64> = report
            .runs
            .iter()
            .filter(|r| r.target == s.target)
            .map(|r| largest(&r.sizes, |d| d.engine_allocated_bytes) as f64)
            .collect();
        bars.push(bar(format!("{}: store", s.target), &per_run));
    }
    let chart = args.out.join("compression.svg");
    std::fs::write(
        &chart,
        crate::plot::bar_chart(
            "timeline_1009 through a three-node cluster: raw bytes vs the store on disk per node",
            &format!(
                "{} rows; largest node, allocated blocks (ftkv at rest, etcd compacted + defragmented); median, whiskers min-max of {} runs",
                args.rows, args.runs
            ),
            "bytes",
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
        "{:<w$} {:>10} {:>10} {:>9} {:>10} {:>10} {:>10}",
        "target", "raw MB", "store MB", "raw/store", "log MB", "dir MB", "rows/s"
    );
    for s in &report.summary {
        println!(
            "{:<w$} {:>10.1} {:>10.1} {:>8.2}x {:>10.1} {:>10.1} {:>10.0}",
            s.target,
            mb(s.raw_bytes),
            s.engine_allocated_bytes.median / 1e6,
            s.raw_over_engine,
            s.log_allocated_bytes.median / 1e6,
            s.total_allocated_bytes.median / 1e6,
            s.rows_per_sec
        );
    }
    for (name, ratio) in &report.ratios {
        println!("ratio of stores {name}: {ratio:.2}x");
    }
    println!("(medians; the largest node; allocated blocks)");
}
