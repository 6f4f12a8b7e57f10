//! `ftkv-bench`: side-by-side benchmarks.
//!
//! `ftkv-bench cluster --targets ftkv,etcd --clients 128 --duration 30s --runs 3 --out DIR`
//! starts each target as a three-node cluster on loopback, runs the same put load against the
//! targets alternately (`runs` rounds), and writes `DIR/results.json` (every run plus medians and
//! ratios) and `DIR/throughput.svg`, `DIR/latency_p99.svg`. A target `ftkv@DIR` (or
//! `ftkv-sled@DIR`) runs the `ftkv-node` in `DIR`, so two builds compare side by side in one
//! run: `--targets ftkv@/tmp/before,ftkv@/tmp/after,etcd` runs before, after, etcd, before, ...
//! The cost of security: `--targets ftkv,ftkv-tls,ftkv-tls-auth` runs the same cluster with
//! nothing, TLS (client certificates, authenticated peers), and TLS plus users and tokens
//! (`ftkv_bench::ftkv::Security`), alternately, and prints the ratios.
//!
//! `ftkv-bench engine --workload random-insert|beyond-memory|point-read|scan|compression|instant-ddl
//! --engines fractal,sled,fjall [--rows N] [--memory-limit SIZE] [--runs 3] --json FILE` compares
//! the storage engines, each run in a child process (see `ftkv_bench::engine`).
//!
//! `ftkv-bench restart [--clients 32] [--runs 3] --out DIR` measures the write pause of a rolling
//! restart against a leader crash (see `ftkv_bench::restart`).
//!
//! `ftkv-bench bulk --rows 2000000 --runs 3 --put-rows 200000 --out DIR [--base-port P]
//! [--targets ftkv,ftkv@DIR]` generates the seed's `user_summary` table as TSV (`DIR/
//! user_summary-ROWS.tsv`, once), then each run times the real `ftkvctl load` of the whole file
//! into a fresh three-node cluster and, on another fresh cluster, the first `put-rows` rows by
//! `Put` from 128 concurrent clients; it checks every node holds every row, measures each node's
//! engine and Raft log on disk, and writes `DIR/results.json` (every run, medians, the ratio bulk
//! rows/s ÷ row-by-row rows/s, sizes against the text) and `DIR/bulk.svg` (see
//! `ftkv_bench::bulk`).
//!
//! `ftkv-bench all --out DIR` runs every workload at full size into `DIR/<workload>/` and
//! prints the table of their figures (see `ftkv_bench::all`).
//!
//! `ftkv-bench table --results tests/bench/results --update BENCHMARKS.md` rewrites the table
//! of current figures that opens BENCHMARKS.md from each result folder's `summary.json` (see
//! `ftkv_bench::table`); `--check` fails when they differ.
//!
//! `ftkv-bench sysbench-insert --targets ftkv,etcd,mariadb-semisync,mariadb-semisync-durable
//! --clients 128 --duration 60s --runs 3 --out DIR` runs the seed's sysbench random inserts
//! (8 tables of `sbtest` rows, random ids) against each target, MariaDB semi-sync through
//! Debian's `sysbench oltp_insert`, and writes `DIR/results.json` and charts (see
//! `ftkv_bench::sysbench`).

use std::path::PathBuf;
use std::time::Duration;

// The same allocator as `ftkv-node` (every engine in the bench runs on it), so engine figures
// describe the engines as deployed, not glibc malloc. The `system-alloc` feature leaves the
// system allocator in place, so heap profilers that wrap malloc (heaptrack) see every allocation.
#[cfg(all(not(feature = "system-alloc"), not(feature = "count-alloc")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc with a count of live bytes ([`ftkv_bench::LIVE_HEAP_BYTES`]), for telling live
/// data from allocator pages in `RssAnon`.
#[cfg(all(not(feature = "system-alloc"), feature = "count-alloc"))]
#[global_allocator]
static GLOBAL: Counting = Counting;

#[cfg(all(not(feature = "system-alloc"), feature = "count-alloc"))]
struct Counting;

#[cfg(all(not(feature = "system-alloc"), feature = "count-alloc"))]
#[allow(unsafe_code)] // A global allocator is an unsafe trait; this one only forwards to mimalloc.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        let p = unsafe { mimalloc::MiMalloc.alloc(l) };
        if !p.is_null() {
            ftkv_bench::LIVE_HEAP_BYTES.fetch_add(l.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        ftkv_bench::LIVE_HEAP_BYTES.fetch_sub(l.size(), std::sync::atomic::Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        let q = unsafe { mimalloc::MiMalloc.realloc(p, l, n) };
        if !q.is_null() {
            ftkv_bench::LIVE_HEAP_BYTES.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            ftkv_bench::LIVE_HEAP_BYTES.fetch_sub(l.size(), std::sync::atomic::Ordering::Relaxed);
        }
        q
    }
}

use clap::{Parser, Subcommand};
use ftkv_bench::{self as bench, plot, Load, RunResult, Target};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "ftkv-bench",
    about = "Side-by-side benchmarks of ftkv against other systems"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Put throughput and latency of three-node clusters (ftkv, etcd), alternately.
    Cluster {
        /// Comma-separated targets: ftkv, ftkv-sled, etcd; `-tls`, `-auth` or `-tls-auth` after
        /// the ftkv name turn on TLS with client certificates and users with tokens (the cost
        /// of security: `ftkv,ftkv-tls,ftkv-tls-auth`); `ftkv@DIR` / `ftkv-sled@DIR` run the
        /// `ftkv-node` in DIR (two builds side by side), plain `ftkv` the one in
        /// `FTKV_BIN_DIR` or beside this executable.
        #[arg(long, default_value = "ftkv,etcd")]
        targets: String,
        /// Concurrent clients.
        #[arg(long, default_value_t = 128)]
        clients: u64,
        /// Length of each run (e.g. 30s).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Rounds; each round runs every target once.
        #[arg(long, default_value_t = 3)]
        runs: u64,
        /// Value size in bytes.
        #[arg(long, default_value_t = 100)]
        value_size: usize,
        /// Distinct keys.
        #[arg(long, default_value_t = 1_000_000)]
        key_space: u64,
        /// Output directory.
        #[arg(long, default_value = "store/bench")]
        out: PathBuf,
        /// First port used by the clusters.
        #[arg(long, default_value_t = 24000)]
        base_port: u16,
        /// ftkv targets: before each run, leave this many idle client sessions in the
        /// session table (one write each under its own client id).
        #[arg(long, default_value_t = 0)]
        idle_sessions: u64,
    },
    /// Storage engines side by side (fractal, sled, fjall), each run in a child process.
    Engine(bench::engine::EngineArgs),
    /// Write pause of a rolling restart (SIGTERM, drain, hand-off) vs a leader crash (SIGKILL).
    Restart(bench::restart::RestartArgs),
    /// `timeline_1009` rows through each cluster: raw bytes vs bytes on disk per node.
    Compression(bench::storage::compression::CompressionArgs),
    /// Random inserts into a cluster with small node caches in memory cgroups: rows/s over time.
    BeyondMemory(bench::storage::beyond_memory::BeyondMemoryArgs),
    /// DeleteRange and broadcast upsert over N keys vs one by one, through the cluster.
    InstantDdl(bench::storage::instant_ddl::InstantDdlArgs),
    /// Bulk load (`ftkvctl load`) vs the same rows by `Put`, through three-node clusters.
    Bulk(bench::bulk::BulkArgs),
    /// The seed's sysbench random inserts: ftkv, etcd and MariaDB semi-sync (via `sysbench`).
    SysbenchInsert(bench::sysbench::SysbenchArgs),
    /// Puts at each client count and value size, a scaling curve per target.
    Scaling(bench::cluster_bench::scaling::ScalingArgs),
    /// Linearizable and serializable point reads and range scans.
    Reads(bench::cluster_bench::reads::ReadsArgs),
    /// Kill -9 of the leader under put load: write pause and the killed node's catch-up.
    Failover(bench::cluster_bench::failover::FailoverArgs),
    /// Every workload at full size, one after another, into `--out DIR/<workload>/`.
    All(bench::all::AllArgs),
    /// The table of current figures that opens BENCHMARKS.md, from the results' summary.json.
    Table(bench::table::TableArgs),
    /// Internal: one engine run, started by `engine` (not for direct use).
    #[command(hide = true)]
    EngineChild {
        /// The run, as JSON.
        #[arg(long)]
        spec: String,
    },
}

#[derive(Serialize)]
struct Summary {
    target: String,
    median_ops_per_sec: f64,
    median_p50_ms: f64,
    median_p95_ms: f64,
    median_p99_ms: f64,
    median_ops_per_entry: Option<f64>,
    total_errors: u64,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    load: Load,
    runs: Vec<RunResult>,
    summary: Vec<Summary>,
    ratios_vs_first: Vec<(String, f64)>,
    /// Median put rate of every target over every other ("a / b").
    ratios: Vec<(String, f64)>,
}

async fn start_and_run(name: &str, base_port: u16, load: &Load, run: u64) -> anyhow::Result<RunResult> {
    // `ftkv@DIR`: the same target, from the build in DIR.
    let (kind, bin_dir) = match name.split_once('@') {
        Some((kind, dir)) if !dir.is_empty() => (kind, Some(std::path::Path::new(dir))),
        Some(_) => anyhow::bail!("target {name:?}: `@` must be followed by a directory"),
        None => (name, None),
    };
    if let Some((engine, security)) = bench::ftkv::parse_target_kind(kind) {
        anyhow::ensure!(
            load.idle_sessions == 0 || security == bench::ftkv::Security::default(),
            "target {name:?}: --idle-sessions needs a target without TLS and auth"
        );
        let cluster =
            bench::ftkv::FtkvCluster::start_secured(base_port, engine, &[], bin_dir, security).await?;
        bench::ftkv::seed_idle_sessions(&cluster.endpoints, load.idle_sessions).await?;
        let client = cluster.client().await?;
        let target = Target::Ftkv(client.clone());
        let mut r = bench::run_load(&target, load, run).await;
        r.target = name.to_string();
        let statuses = client.status_all().await;
        r.ops_per_entry = statuses
            .into_iter()
            .filter_map(|(_, s)| s.ok())
            .find(|s| s.is_leader)
            .map(|s| s.ops_per_entry);
        return Ok(r);
    }
    match kind {
        "etcd" if bin_dir.is_none() => {
            let cluster = bench::etcd::EtcdCluster::start(base_port).await?;
            let target = Target::Etcd(bench::etcd::EtcdClient::connect(&cluster.endpoints)?);
            Ok(bench::run_load(&target, load, run).await)
        }
        _ => anyhow::bail!(
            "unknown target {name:?} (ftkv, ftkv-sled, ftkv-tls, ftkv-auth, ftkv-tls-auth, etcd, ftkv@DIR, \
             ftkv-tls-auth@DIR, ...)"
        ),
    }
}

/// Engine children run with transparent huge pages off, as `ftkv-node` does (see
/// `ftkv_vfs::disable_transparent_huge_pages`), so every engine in the comparison runs under the
/// deployed setting. Cluster runs leave it alone: etcd's processes would inherit it.
fn engine_memory_setup() {
    if let Err(e) = ftkv_vfs::disable_transparent_huge_pages() {
        eprintln!("ftkv-bench: warning: could not turn transparent huge pages off: {e}");
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Engine(args) => bench::engine::run(&args),
        Cmd::EngineChild { spec } => {
            engine_memory_setup();
            bench::engine::child::run_child(&spec)
        }
        Cmd::Compression(args) => {
            tokio::runtime::Runtime::new()?.block_on(bench::storage::compression::run(&args))
        }
        Cmd::BeyondMemory(args) => {
            tokio::runtime::Runtime::new()?.block_on(bench::storage::beyond_memory::run(&args))
        }
        Cmd::InstantDdl(args) => {
            tokio::runtime::Runtime::new()?.block_on(bench::storage::instant_ddl::run(&args))
        }
        Cmd::Restart(args) => tokio::runtime::Runtime::new()?.block_on(bench::restart::run(&args)),
        Cmd::Bulk(args) => tokio::runtime::Runtime::new()?.block_on(bench::bulk::run(&args)),
        Cmd::All(args) => bench::all::run(&args),
        Cmd::Table(args) => bench::table::run(&args),
        Cmd::SysbenchInsert(args) => tokio::runtime::Runtime::new()?.block_on(bench::sysbench::run(&args)),
        Cmd::Scaling(args) => {
            tokio::runtime::Runtime::new()?.block_on(bench::cluster_bench::scaling::run(&args))
        }
        Cmd::Reads(args) => tokio::runtime::Runtime::new()?.block_on(bench::cluster_bench::reads::run(&args)),
        Cmd::Failover(args) => {
            tokio::runtime::Runtime::new()?.block_on(bench::cluster_bench::failover::run(&args))
        }
        cluster @ Cmd::Cluster { .. } => tokio::runtime::Runtime::new()?.block_on(run_cluster(cluster)),
    }
}

/// `summary.json` of `cluster`: median puts/s and p99 per target.
fn cluster_summary(report: &Report) -> bench::summary::Summary {
    let shape = format!(
        "puts, {} clients, {} B values",
        report.load.clients, report.load.value_size
    );
    let row = |metric: String, unit: &str, higher_is_better: bool, f: &dyn Fn(&Summary) -> f64| {
        bench::summary::SummaryRow {
            metric,
            unit: unit.to_string(),
            higher_is_better,
            values: report.summary.iter().map(|s| (s.target.clone(), f(s))).collect(),
        }
    };
    bench::summary::Summary::new(
        "cluster",
        bench::summary::command_line(),
        vec![
            row(format!("{shape}: ops/s"), "ops/s", true, &|s| {
                s.median_ops_per_sec
            }),
            row(format!("{shape}: p99"), "ms", false, &|s| s.median_p99_ms),
        ],
    )
}

async fn run_cluster(cmd: Cmd) -> anyhow::Result<()> {
    let Cmd::Cluster {
        targets,
        clients,
        duration,
        runs,
        value_size,
        key_space,
        out,
        base_port,
        idle_sessions,
    } = cmd
    else {
        anyhow::bail!("run_cluster needs the cluster command");
    };
    let targets: Vec<String> = targets
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    anyhow::ensure!(!targets.is_empty(), "--targets is empty");
    let load = Load {
        clients,
        duration,
        value_size,
        key_space,
        seed: 42,
        idle_sessions,
    };
    std::fs::create_dir_all(&out)?;
    let mut results = Vec::new();
    for run in 1..=runs {
        for (i, t) in targets.iter().enumerate() {
            eprintln!("== round {run}/{runs}: {t} ({clients} clients, {duration:?})");
            let port = base_port + 20 * i as u16;
            let r = start_and_run(t, port, &load, run).await?;
            eprintln!(
                "   {t}: {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms, errors {}{}",
                r.ops_per_sec,
                r.latency_ms.p50,
                r.latency_ms.p99,
                r.errors,
                r.ops_per_entry
                    .map(|o| format!(", ops/entry {o:.1}"))
                    .unwrap_or_default()
            );
            results.push(r);
        }
    }
    let summary: Vec<Summary> = targets
        .iter()
        .map(|t| {
            let rs: Vec<&RunResult> = results.iter().filter(|r| &r.target == t).collect();
            let med =
                |f: &dyn Fn(&RunResult) -> f64| bench::median(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
            let ope: Vec<f64> = rs.iter().filter_map(|r| r.ops_per_entry).collect();
            Summary {
                target: t.clone(),
                median_ops_per_sec: med(&|r| r.ops_per_sec),
                median_p50_ms: med(&|r| r.latency_ms.p50),
                median_p95_ms: med(&|r| r.latency_ms.p95),
                median_p99_ms: med(&|r| r.latency_ms.p99),
                median_ops_per_entry: if ope.is_empty() {
                    None
                } else {
                    Some(bench::median(&ope))
                },
                total_errors: rs.iter().map(|r| r.errors).sum(),
            }
        })
        .collect();
    let first = summary.first().map(|s| s.median_ops_per_sec).unwrap_or(0.0);
    let ratios_vs_first = summary
        .iter()
        .skip(1)
        .map(|s| {
            (
                format!("{} / {}", targets[0], s.target),
                first / s.median_ops_per_sec.max(1e-9),
            )
        })
        .collect();
    let ratios = summary
        .iter()
        .flat_map(|a| {
            summary.iter().filter(|b| b.target != a.target).map(move |b| {
                (
                    format!("{} / {}", a.target, b.target),
                    a.median_ops_per_sec / b.median_ops_per_sec.max(1e-9),
                )
            })
        })
        .collect();
    let machine = format!(
        "{} cores",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    let report = Report {
        machine,
        load,
        runs: results,
        summary,
        ratios_vs_first,
        ratios,
    };
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&report)?)?;
    cluster_summary(&report).write(&out)?;
    let series = |f: &dyn Fn(&bench::Second) -> f64| -> Vec<plot::Series> {
        report
            .runs
            .iter()
            .map(|r| plot::Series {
                label: format!("{} run {}", r.target, r.run),
                points: r.seconds.iter().map(|s| (s.t as f64, f(s))).collect(),
            })
            .collect()
    };
    std::fs::write(
        out.join("throughput.svg"),
        plot::line_chart(
            "acknowledged puts per second",
            "seconds",
            "ops/s",
            &series(&|s| s.ops as f64),
        ),
    )?;
    std::fs::write(
        out.join("latency_p99.svg"),
        plot::line_chart(
            "put latency p99 per second",
            "seconds",
            "ms",
            &series(&|s| s.p99_ms),
        ),
    )?;
    let w = report
        .summary
        .iter()
        .map(|s| s.target.len())
        .max()
        .unwrap_or(0)
        .max(10);
    println!(
        "{:<w$} {:>12} {:>9} {:>9} {:>9} {:>10} {:>7}",
        "target", "ops/s(med)", "p50 ms", "p95 ms", "p99 ms", "ops/entry", "errors"
    );
    for s in &report.summary {
        println!(
            "{:<w$} {:>12.0} {:>9.2} {:>9.2} {:>9.2} {:>10} {:>7}",
            s.target,
            s.median_ops_per_sec,
            s.median_p50_ms,
            s.median_p95_ms,
            s.median_p99_ms,
            s.median_ops_per_entry
                .map(|o| format!("{o:.1}"))
                .unwrap_or_else(|| "-".into()),
            s.total_errors
        );
    }
    for (name, ratio) in &report.ratios {
        println!("ratio {name}: {ratio:.2}x");
    }
    println!("report: {}", out.join("results.json").display());
    Ok(())
}
