//! `ftkv-bench sysbench-insert`: the seed's sysbench "pure random writes" (128 threads, 8
//! tables, `sbtest` rows, random ids) against every target, side by side.
//!
//! `ftkv-bench sysbench-insert --targets ftkv,etcd,mariadb-semisync,mariadb-semisync-durable
//! --clients 128 --duration 60s --runs 3 --out DIR`
//!
//! Targets, each started fresh for every run and stopped after it, alternating within a round
//! (A B C, A B C, ...):
//! - `ftkv`, `ftkv-sled` (and `ftkv@DIR`, `ftkv-sled@DIR`: the build in DIR): the three-node
//!   playground ([`crate::ftkv`]), driven by this process's load generator ([`kv`]);
//! - `etcd`: three members of Debian's etcd 3.4 ([`crate::etcd`]), the same load generator;
//! - `mariadb-semisync` (the seed's `innodb_flush_log_at_trx_commit=2`, `sync_binlog=0`) and
//!   `mariadb-semisync-durable` (`=1`, `=1`): a master and two semi-sync slaves
//!   ([`crate::mariadb`]), driven by Debian's `sysbench` running its own `oltp_insert` script
//!   over the master's socket: `prepare` (`--tables`, `--table-size` rows each), `run`
//!   (`--threads=<clients> --time=<duration> --auto-inc=off --report-interval=1
//!   --histogram=on --mysql-ignore-errors=1062`), then the validity check (both slaves hold the
//!   master's rows, semi-sync never fell back, see [`crate::mariadb::MariaDbCluster::check`])
//!   and `cleanup`. A run that fails the check is kept, marked invalid, and left out of the
//!   medians; the command then fails after writing its results.
//!
//! Each run reports, in sysbench's own layout, writes, writes/s and latency min/avg/max/95th
//! plus p99 (sysbench's p50/p99 come from its latency histogram, the bucket it would choose),
//! and the CPU seconds per acknowledged write summed over every process of the target: the
//! server processes (`/proc/<pid>/stat` of the nodes, members or `mariadbd`s, over the measured
//! window) and the load generator (this process, or the `sysbench` child once reaped). Results:
//! `DIR/results.json` (every run, medians over the valid runs, ratios of the first ftkv target
//! over each other one), `DIR/writes_per_sec.svg` (bar chart of the medians, whiskers from the
//! slowest to the fastest run), `DIR/latency_p99.svg` and `DIR/writes_over_time.svg`.

pub mod kv;
pub mod mariadb_run;
pub mod output;
pub mod report;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::mariadb::{Checks, Durability};
use crate::LatencyMs;

/// `ftkv-bench sysbench-insert` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SysbenchArgs {
    /// Comma-separated targets: ftkv, ftkv-sled, etcd, mariadb-semisync,
    /// mariadb-semisync-durable, ftkv@DIR, ftkv-sled@DIR.
    #[arg(long, default_value = "ftkv,etcd,mariadb-semisync")]
    pub targets: String,
    /// Concurrent clients (sysbench `--threads`).
    #[arg(long, default_value_t = 128)]
    pub clients: u64,
    /// Length of each run (sysbench `--time`, whole seconds).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Rounds; each round runs every target once.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Tables (key prefixes `sbtest1/` .. for the key-value targets).
    #[arg(long, default_value_t = 8)]
    pub tables: u32,
    /// Rows per table of sysbench `prepare` (MariaDB), and the range of `k` for every target.
    #[arg(long, default_value_t = 10_000)]
    pub table_size: u64,
    /// Output directory.
    #[arg(long, default_value = "store/bench-sysbench")]
    pub out: PathBuf,
    /// RNG seed (sysbench `--rand-seed`; the load generator's tasks derive theirs from it).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// MariaDB targets: `innodb_buffer_pool_size` of every server.
    #[arg(long, default_value = "256M", value_parser = crate::mariadb::parse_size_flag)]
    pub mariadb_buffer_pool_size: String,
    /// MariaDB targets: `innodb_log_file_size` of every server (each server writes it out
    /// when it starts: a smoke run sets it small).
    #[arg(long, default_value = "512M", value_parser = crate::mariadb::parse_size_flag)]
    pub mariadb_log_file_size: String,
}

/// A target of this workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetKind {
    /// The ftkv playground with this engine, from the build in the directory if given.
    Ftkv {
        /// `fractal` or `sled`.
        engine: &'static str,
        /// `ftkv@DIR`.
        bin_dir: Option<PathBuf>,
    },
    /// Three etcd members.
    Etcd,
    /// MariaDB semi-sync, master and two slaves.
    MariaDb(Durability),
}

impl TargetKind {
    /// Parses a `--targets` entry.
    pub fn parse(name: &str) -> anyhow::Result<Self> {
        let (kind, bin_dir) = match name.split_once('@') {
            Some((kind, dir)) if !dir.is_empty() => (kind, Some(PathBuf::from(dir))),
            Some(_) => anyhow::bail!("target {name:?}: `@` must be followed by a directory"),
            None => (name, None),
        };
        Ok(match (kind, bin_dir) {
            ("ftkv", bin_dir) => TargetKind::Ftkv {
                engine: "fractal",
                bin_dir,
            },
            ("ftkv-sled", bin_dir) => TargetKind::Ftkv {
                engine: "sled",
                bin_dir,
            },
            ("etcd", None) => TargetKind::Etcd,
            ("mariadb-semisync", None) => TargetKind::MariaDb(Durability::Seed),
            ("mariadb-semisync-durable", None) => TargetKind::MariaDb(Durability::Full),
            _ => anyhow::bail!(
                "unknown target {name:?} (ftkv, ftkv-sled, etcd, mariadb-semisync, \
                 mariadb-semisync-durable, ftkv@DIR, ftkv-sled@DIR)"
            ),
        })
    }
}

/// One acknowledged-writes second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct WriteSecond {
    /// End of the second since the start.
    pub t: u64,
    /// Writes acknowledged in it.
    pub writes: u64,
    /// Their 95th percentile latency, ms.
    pub p95_ms: f64,
}

/// CPU a run used, summed over the target's processes.
#[derive(Debug, Clone, Serialize, Default)]
pub struct CpuUse {
    /// Server processes (nodes, members, `mariadbd`s) over the measured window, seconds.
    pub servers_s: f64,
    /// The load generator (this process, or `sysbench`), seconds.
    pub load_generator_s: f64,
    /// Both, per acknowledged write, µs.
    pub per_write_us: f64,
    /// Servers per acknowledged write, µs.
    pub servers_per_write_us: f64,
    /// Load generator per acknowledged write, µs.
    pub load_generator_per_write_us: f64,
}

impl CpuUse {
    /// From the CPU seconds and the writes they served.
    pub fn new(servers_s: f64, load_generator_s: f64, writes: u64) -> Self {
        let per = |s: f64| {
            if writes == 0 {
                0.0
            } else {
                s * 1e6 / writes as f64
            }
        };
        Self {
            servers_s,
            load_generator_s,
            per_write_us: per(servers_s + load_generator_s),
            servers_per_write_us: per(servers_s),
            load_generator_per_write_us: per(load_generator_s),
        }
    }
}

/// One run of one target.
#[derive(Debug, Clone, Serialize)]
pub struct InsertRun {
    /// Target name as given.
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// What generated the load.
    pub load_generator: String,
    /// Acknowledged writes (inserts) in the measured window.
    pub writes: u64,
    /// Writes per second.
    pub writes_per_sec: f64,
    /// Length of the measured window, s.
    pub seconds: f64,
    /// Failed requests (sysbench: ignored errors, i.e. duplicate ids).
    pub errors: u64,
    /// Latency of the acknowledged writes.
    pub latency_ms: LatencyMs,
    /// Per-second writes and p95.
    pub per_second: Vec<WriteSecond>,
    /// CPU seconds.
    pub cpu: CpuUse,
    /// Whether the run counts (MariaDB: its checks passed; all: some writes).
    pub valid: bool,
    /// Why not, when invalid.
    pub problems: Vec<String>,
    /// MariaDB: the checks after the run.
    pub mariadb: Option<Checks>,
}

/// The comma-separated `--targets` list.
pub fn target_names(targets: &str) -> Vec<String> {
    targets
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

async fn run_one(name: &str, kind: &TargetKind, args: &SysbenchArgs, run: u64) -> anyhow::Result<InsertRun> {
    let mut r = match kind {
        TargetKind::Ftkv { engine, bin_dir } => kv::run_ftkv(engine, bin_dir.as_deref(), args, run).await?,
        TargetKind::Etcd => kv::run_etcd(args, run).await?,
        TargetKind::MariaDb(durability) => {
            let binaries = crate::mariadb::ensure_installed()?;
            mariadb_run::run(&binaries, *durability, args, run)?
        }
    };
    r.target = name.to_string();
    if r.writes == 0 {
        r.valid = false;
        r.problems.push("no write was acknowledged".to_string());
    }
    Ok(r)
}

/// Runs the workload (see the module docs).
pub async fn run(args: &SysbenchArgs) -> anyhow::Result<()> {
    let names = target_names(&args.targets);
    anyhow::ensure!(!names.is_empty(), "--targets is empty");
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(args.tables > 0, "--tables must be at least 1");
    anyhow::ensure!(
        args.duration >= Duration::from_secs(1),
        "--duration must be at least 1s (sysbench --time is whole seconds)"
    );
    let kinds = names
        .iter()
        .map(|n| TargetKind::parse(n))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if kinds.iter().any(|k| matches!(k, TargetKind::MariaDb(_))) {
        // Install (or say how) before the first round, not in the middle of it.
        crate::mariadb::ensure_installed()?;
    }
    std::fs::create_dir_all(&args.out)?;
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for (name, kind) in names.iter().zip(&kinds) {
            eprintln!(
                "== round {run}/{}: {name} ({} clients, {:?})",
                args.runs, args.clients, args.duration
            );
            let r = run_one(name, kind, args, run).await?;
            eprintln!(
                "   {name}: {:.0} writes/s, p95 {:.2} ms, p99 {:.2} ms, CPU {:.1} µs/write, errors {}{}",
                r.writes_per_sec,
                r.latency_ms.p95,
                r.latency_ms.p99,
                r.cpu.per_write_us,
                r.errors,
                if r.valid {
                    String::new()
                } else {
                    format!(", INVALID: {}", r.problems.join("; "))
                }
            );
            runs.push(r);
        }
    }
    let report = report::Report::new(args, &names, runs);
    report.write(&args.out)?;
    report.print();
    let invalid: Vec<String> = report
        .runs
        .iter()
        .filter(|r| !r.valid)
        .map(|r| format!("{} run {}: {}", r.target, r.run, r.problems.join("; ")))
        .collect();
    anyhow::ensure!(
        invalid.is_empty(),
        "{} invalid run(s), left out of the medians (see {}): {}",
        invalid.len(),
        args.out.join("results.json").display(),
        invalid.join(" | ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_parse() {
        assert_eq!(
            TargetKind::parse("ftkv").ok(),
            Some(TargetKind::Ftkv {
                engine: "fractal",
                bin_dir: None
            })
        );
        assert_eq!(
            TargetKind::parse("ftkv-sled@/tmp/x").ok(),
            Some(TargetKind::Ftkv {
                engine: "sled",
                bin_dir: Some(PathBuf::from("/tmp/x"))
            })
        );
        assert_eq!(
            TargetKind::parse("mariadb-semisync-durable").ok(),
            Some(TargetKind::MariaDb(Durability::Full))
        );
        assert!(TargetKind::parse("etcd@/x").is_err());
        assert!(TargetKind::parse("ftkv@").is_err());
        assert!(TargetKind::parse("postgres").is_err());
        assert_eq!(target_names(" ftkv, ,etcd "), vec!["ftkv", "etcd"]);
    }

    #[test]
    fn cpu_per_write() {
        let c = CpuUse::new(3.0, 1.0, 100_000);
        assert!((c.per_write_us - 40.0).abs() < 1e-9);
        assert!((c.servers_per_write_us - 30.0).abs() < 1e-9);
        assert!((c.load_generator_per_write_us - 10.0).abs() < 1e-9);
        assert_eq!(CpuUse::new(1.0, 1.0, 0).per_write_us, 0.0);
    }
}
