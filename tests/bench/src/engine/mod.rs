//! `ftkv-bench engine`: the storage engines side by side (issue 3, acceptance 6).
//!
//! `ftkv-bench engine --workload W --engines fractal,sled,fjall [--rows N] [--memory-limit SIZE]
//! [--runs 3] --json FILE` runs every engine once per round, alternately (BENCH.md, "How to
//! measure honestly here"). Each engine run is a **child process** (the bench re-executes
//! itself with the hidden `engine-child` subcommand), so its peak RSS (`VmHWM`) and, with
//! `--memory-limit`, a memory cgroup (page cache included) apply to that engine alone. The
//! child reports progress through its stdout ([`child`]); an engine the OOM killer ends is
//! reported as `killed_for_memory` with the rows it reached.
//!
//! Output: FILE holds `{"workload", "results": [{"engine", "ops_per_sec", "bytes_on_disk",
//! "peak_rss_bytes", ...medians...}], "ratios", "runs": [...]}`; loading workloads also write
//! FILE with the extension `.svg`: rows/s over time for every run of every engine.

pub mod cgroup;
pub mod child;
pub mod data;
pub mod kv;
pub mod rocks;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::plot;
use child::{ChildResult, ChildSpec};
use kv::EngineName;

/// The workloads of acceptance 6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Random 16-byte keys, 100-byte half-compressible values, batches of 1,000, no fsync per
    /// batch; one checkpoint at the end, inside the time.
    RandomInsert,
    /// The same with a small cache in a memory cgroup (default 256 MiB), 4 GiB of rows by default.
    BeyondMemory,
    /// Load, then point reads of random existing keys.
    PointRead,
    /// Load, then range scans of `--scan-len` rows from random start keys.
    Scan,
    /// On-disk size of rows shaped like `timeline_1009` and `user_summary` (`--rows` each).
    Compression,
    /// Load, then time one `DeleteRange` over about half the keys and one broadcast upsert
    /// over all keys; verify reads afterwards.
    InstantDdl,
}

impl Workload {
    fn as_str(self) -> &'static str {
        match self {
            Workload::RandomInsert => "random-insert",
            Workload::BeyondMemory => "beyond-memory",
            Workload::PointRead => "point-read",
            Workload::Scan => "scan",
            Workload::Compression => "compression",
            Workload::InstantDdl => "instant-ddl",
        }
    }
}

/// Options of `ftkv-bench engine`.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Workload to run.
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// Comma-separated engines: fractal, sled, fjall, rocksdb (rocksdb: build with
    /// `--features rocksdb`).
    #[arg(long, default_value = "fractal,sled,fjall")]
    pub engines: String,
    /// Rows to load (per table for `compression`). Default 1M; `beyond-memory`: 4 GiB of rows.
    #[arg(long)]
    pub rows: Option<u64>,
    /// Memory cgroup limit per engine run, page cache included (e.g. 256MiB). Default:
    /// 256MiB for `beyond-memory`, none otherwise.
    #[arg(long, value_parser = parse_size)]
    pub memory_limit: Option<u64>,
    /// Engine cache budget (e.g. 64MiB). Default 64MiB for `beyond-memory`, 1GiB otherwise.
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// fractal: zstd level of leaves (internal nodes and spilled runs use at most -1), the
    /// node's default `engine.compression_level` being 1; rocksdb: zstd level of every level.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub zstd_level: i32,
    /// Rounds; each round runs every engine once.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Point reads or scans per run.
    #[arg(long, default_value_t = 1_000_000)]
    pub reads: u64,
    /// Rows per scan.
    #[arg(long, default_value_t = 100)]
    pub scan_len: usize,
    /// Per-phase time limit of one engine run, seconds (loading stops there and the run
    /// reports the rows it reached).
    #[arg(long, default_value_t = 1800)]
    pub max_seconds: u64,
    /// Parent directory for the engines' files (each run gets a fresh subdirectory, removed
    /// afterwards). Must be on a real disk, not tmpfs.
    #[arg(long, default_value = "store/bench-engine")]
    pub dir: PathBuf,
    /// Data seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output JSON file.
    #[arg(long)]
    pub json: PathBuf,
}

/// Parses `256MiB`, `64M`, `1GiB`, `4G`, `512k` or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}

/// One engine run as the parent saw it.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Engine.
    pub engine: EngineName,
    /// Round (1-based).
    pub run: u32,
    /// The child's result; `None` when it died before reporting.
    pub result: Option<ChildResult>,
    /// Rows the child had reported when it ended (its last progress line if it died).
    pub rows_reached: u64,
    /// Killed by SIGKILL while a memory limit was set (the OOM killer).
    pub killed_for_memory: bool,
    /// Exit description when the child failed.
    pub failure: Option<String>,
    /// Peak RSS the parent sampled from `/proc/<pid>/status` (`VmHWM`), bytes.
    pub peak_rss_bytes: u64,
    /// Peak usage of the memory cgroup (memory plus page cache), bytes.
    pub cgroup_peak_bytes: Option<u64>,
    /// Wall seconds of the whole child.
    pub wall_secs: f64,
    /// (seconds, rows/s) during loading, one point per progress line.
    pub insert_series: Vec<(f64, f64)>,
}

/// Median figures of one engine over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct EngineSummary {
    /// Engine.
    pub engine: EngineName,
    /// Median headline rate (inserts/s, lookups/s or scans/s) of the completed runs.
    pub ops_per_sec: f64,
    /// Median allocated bytes on disk.
    pub bytes_on_disk: f64,
    /// Highest peak RSS over the runs, bytes.
    pub peak_rss_bytes: u64,
    /// Median insert rate including the final checkpoint.
    pub insert_rows_per_sec: f64,
    /// Median rate over the first / last tenth of the rows.
    pub rate_first_tenth: f64,
    /// Median rate over the last tenth.
    pub rate_last_tenth: f64,
    /// Median rows reached.
    pub rows_reached: f64,
    /// Median write-ahead journal bytes inside `bytes_on_disk` (fjall).
    pub journal_bytes: f64,
    /// Median key+value bytes written.
    pub logical_bytes: f64,
    /// Median CPU seconds.
    pub cpu_secs: f64,
    /// Median `DeleteRange` / broadcast milliseconds (instant-ddl).
    pub delete_range_ms: Option<f64>,
    /// Median broadcast milliseconds (instant-ddl).
    pub broadcast_ms: Option<f64>,
    /// Wrong or missing reads over all runs (must be 0).
    pub wrong_reads: u64,
    /// Runs completed / killed for memory / failed otherwise.
    pub runs_completed: u32,
    /// Runs the OOM killer ended.
    pub runs_killed_for_memory: u32,
    /// Runs that failed otherwise.
    pub runs_failed: u32,
    /// Runs that stopped at `--max-seconds`.
    pub runs_stopped_at_time_limit: u32,
}

/// The JSON file.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Workload name.
    pub workload: &'static str,
    /// The command line.
    pub command: String,
    /// UTC start time (seconds since the epoch).
    pub started_unix_secs: u64,
    /// Machine description.
    pub machine: String,
    /// Rows per run (per table for compression).
    pub rows: u64,
    /// Engine cache budget, bytes.
    pub cache_size_bytes: u64,
    /// Memory cgroup limit, bytes.
    pub memory_limit_bytes: Option<u64>,
    /// One entry per engine: medians.
    pub results: Vec<EngineSummary>,
    /// `fractal / other` ratios of the medians (`ops_per_sec`, `bytes_on_disk`, ...).
    pub ratios: Vec<(String, f64)>,
    /// Every run.
    pub runs: Vec<RunReport>,
}

fn median(v: impl IntoIterator<Item = f64>) -> f64 {
    crate::median(&v.into_iter().collect::<Vec<_>>())
}

/// Runs one engine once in a child process; never fails for engine errors (they become the
/// run's `failure`), only for the bench's own setup errors.
fn run_one(spec: &ChildSpec, run: u32, memory_limit: Option<u64>) -> anyhow::Result<RunReport> {
    let exe = std::env::current_exe().context("find own executable")?;
    let started = Instant::now();
    let mut child = Command::new(exe)
        .arg("engine-child")
        .arg("--spec")
        .arg(serde_json::to_string(spec)?)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawn engine child")?;
    let pid = child.id();
    let cg = match memory_limit {
        Some(limit) => {
            let name = format!("ftkv-bench-{}-{}-{run}", std::process::id(), spec.engine.as_str());
            match cgroup::MemoryCgroup::create(&name, limit).and_then(|g| g.add(pid).map(|()| g)) {
                Ok(g) => Some(g),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
            }
        }
        None => None,
    };
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(b"go\n")?;
    }
    let stdout = child.stdout.take().context("child stdout")?;
    let mut report = RunReport {
        engine: spec.engine,
        run,
        result: None,
        rows_reached: 0,
        killed_for_memory: false,
        failure: None,
        peak_rss_bytes: 0,
        cgroup_peak_bytes: None,
        wall_secs: 0.0,
        insert_series: Vec::new(),
    };
    let pid_s = pid.to_string();
    let (mut last_rows, mut last_t) = (0u64, 0.0f64);
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        if let Some(hwm) = child::vm_hwm_bytes(&pid_s) {
            report.peak_rss_bytes = report.peak_rss_bytes.max(hwm);
        }
        let mut parts = line.splitn(4, ' ');
        match parts.next() {
            Some("progress") => {
                let phase = parts.next().unwrap_or("");
                let count: u64 = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
                let t: f64 = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0.0);
                if phase == "insert" {
                    if t > last_t {
                        let rate = (count - last_rows.min(count)) as f64 / (t - last_t);
                        report.insert_series.push((t, rate));
                    }
                    last_rows = count;
                    last_t = t;
                    report.rows_reached = count;
                }
                let cg_now = cg.as_ref().and_then(|g| g.peak_bytes());
                eprintln!(
                    "   [{:>6.1}s] {:<8} {phase:<12} {count:>11}{}  rss {:>5} MiB{}",
                    started.elapsed().as_secs_f64(),
                    spec.engine.as_str(),
                    if phase == "insert" && t > 0.0 {
                        format!(" ({:.0}/s avg)", count as f64 / t)
                    } else {
                        String::new()
                    },
                    report.peak_rss_bytes >> 20,
                    cg_now
                        .map(|b| format!(", cgroup peak {} MiB", b >> 20))
                        .unwrap_or_default()
                );
            }
            Some("result") => {
                let json = line.strip_prefix("result ").unwrap_or("");
                match serde_json::from_str::<ChildResult>(json) {
                    Ok(r) => {
                        report.rows_reached = r.rows_written;
                        report.peak_rss_bytes = report.peak_rss_bytes.max(r.peak_rss_bytes);
                        report.result = Some(r);
                    }
                    Err(e) => report.failure = Some(format!("bad result line: {e}")),
                }
            }
            _ => eprintln!("   child: {line}"),
        }
    }
    let status = child.wait()?;
    report.wall_secs = started.elapsed().as_secs_f64();
    if let Some(g) = &cg {
        report.cgroup_peak_bytes = g.peak_bytes();
        let oom = g.oom_kills().unwrap_or(0) > 0;
        if status.signal() == Some(9) || oom {
            report.killed_for_memory = true;
        }
        eprintln!(
            "   cgroup: peak {} MiB, limit hits {:?}, oom kills {:?}",
            report.cgroup_peak_bytes.unwrap_or(0) >> 20,
            g.limit_hits(),
            g.oom_kills()
        );
    }
    drop(cg);
    if !status.success() {
        report.result = None;
        report.failure = Some(match status.signal() {
            Some(sig) => format!("killed by signal {sig}"),
            None => format!("exit status {status}"),
        });
    } else if report.result.is_none() && report.failure.is_none() {
        report.failure = Some("child ended without a result".into());
    }
    Ok(report)
}

fn summarize(engine: EngineName, runs: &[RunReport]) -> EngineSummary {
    let mine: Vec<&RunReport> = runs.iter().filter(|r| r.engine == engine).collect();
    let ok: Vec<&ChildResult> = mine.iter().filter_map(|r| r.result.as_ref()).collect();
    let ddl: Vec<&child::DdlStats> = ok.iter().filter_map(|r| r.ddl.as_ref()).collect();
    EngineSummary {
        engine,
        ops_per_sec: median(ok.iter().map(|r| r.ops_per_sec)),
        bytes_on_disk: median(ok.iter().map(|r| r.bytes_on_disk as f64)),
        peak_rss_bytes: mine.iter().map(|r| r.peak_rss_bytes).max().unwrap_or(0),
        insert_rows_per_sec: median(ok.iter().map(|r| r.insert_rows_per_sec)),
        rate_first_tenth: median(ok.iter().map(|r| r.rate_first_tenth)),
        rate_last_tenth: median(ok.iter().map(|r| r.rate_last_tenth)),
        rows_reached: median(mine.iter().map(|r| r.rows_reached as f64)),
        journal_bytes: median(ok.iter().map(|r| r.journal_bytes as f64)),
        logical_bytes: median(ok.iter().map(|r| r.logical_bytes as f64)),
        cpu_secs: median(ok.iter().map(|r| r.cpu_secs)),
        delete_range_ms: (!ddl.is_empty()).then(|| median(ddl.iter().map(|d| d.delete_range_ms))),
        broadcast_ms: (!ddl.is_empty()).then(|| median(ddl.iter().map(|d| d.broadcast_ms))),
        wrong_reads: ok
            .iter()
            .map(|r| r.reads.as_ref().map_or(0, |s| s.misses) + r.ddl.as_ref().map_or(0, |d| d.wrong))
            .sum(),
        runs_completed: ok.len() as u32,
        runs_killed_for_memory: mine.iter().filter(|r| r.killed_for_memory).count() as u32,
        runs_failed: mine
            .iter()
            .filter(|r| r.result.is_none() && !r.killed_for_memory)
            .count() as u32,
        runs_stopped_at_time_limit: ok.iter().filter(|r| r.stopped_at_time_limit).count() as u32,
    }
}

fn ratios(results: &[EngineSummary]) -> Vec<(String, f64)> {
    let Some(f) = results.iter().find(|s| s.engine == EngineName::Fractal) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for o in results.iter().filter(|s| s.engine != EngineName::Fractal) {
        let name = o.engine.as_str();
        let mut push = |what: &str, a: f64, b: f64| {
            if a > 0.0 && b > 0.0 {
                out.push((format!("{what}: fractal / {name}"), a / b));
            }
        };
        push("ops_per_sec", f.ops_per_sec, o.ops_per_sec);
        push(
            "insert_rows_per_sec",
            f.insert_rows_per_sec,
            o.insert_rows_per_sec,
        );
        push("bytes_on_disk", f.bytes_on_disk, o.bytes_on_disk);
        push("peak_rss_bytes", f.peak_rss_bytes as f64, o.peak_rss_bytes as f64);
        if let (Some(a), Some(b)) = (f.delete_range_ms, o.delete_range_ms) {
            push("delete_range_ms", a, b);
        }
        if let (Some(a), Some(b)) = (f.broadcast_ms, o.broadcast_ms) {
            push("broadcast_ms", a, b);
        }
    }
    out
}

/// Runs `ftkv-bench engine`: every engine once per round, alternately, each in a child
/// process; writes the JSON report (and an SVG of rows/s over time) and prints a table.
pub fn run(args: &EngineArgs) -> anyhow::Result<()> {
    let engines: Vec<EngineName> = args
        .engines
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(EngineName::parse)
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!engines.is_empty(), "--engines is empty");
    let beyond = args.workload == Workload::BeyondMemory;
    let rows = args.rows.unwrap_or(if beyond {
        (4u64 << 30) / (data::KEY_LEN_BYTES + data::VALUE_LEN_BYTES) as u64
    } else {
        1_000_000
    });
    let memory_limit = args.memory_limit.or(beyond.then_some(256 << 20));
    let cache_size_bytes = args.cache_size.unwrap_or(if beyond { 64 << 20 } else { 1 << 30 });
    let started_unix_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    std::fs::create_dir_all(&args.dir)?;
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for &engine in &engines {
            let dir = args.dir.join(format!(
                "{}-{}-{}-{run}",
                args.workload.as_str(),
                engine.as_str(),
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            let spec = ChildSpec {
                engine,
                workload: args.workload,
                rows,
                cache_size_bytes,
                zstd_level: args.zstd_level,
                dir: dir.clone(),
                seed: args.seed.wrapping_add(u64::from(run)),
                reads: args.reads,
                scan_len: args.scan_len,
                max_seconds: args.max_seconds,
            };
            eprintln!(
                "== round {run}/{}: {} {} ({rows} rows, cache {} MiB{})",
                args.runs,
                engine.as_str(),
                args.workload.as_str(),
                cache_size_bytes >> 20,
                memory_limit
                    .map(|l| format!(", memory cgroup {} MiB", l >> 20))
                    .unwrap_or_default()
            );
            let r = run_one(&spec, run, memory_limit);
            let _ = std::fs::remove_dir_all(&dir);
            let r = r?;
            match (&r.result, &r.failure) {
                (Some(res), _) => eprintln!(
                    "   {}: {:.0} ops/s, {} rows, {:.1} MiB on disk, peak RSS {} MiB{}",
                    engine.as_str(),
                    res.ops_per_sec,
                    res.rows_written,
                    res.bytes_on_disk as f64 / 1048576.0,
                    r.peak_rss_bytes >> 20,
                    res.ddl
                        .as_ref()
                        .map(|d| format!(
                            ", delete-range {:.2} ms, broadcast {:.2} ms, wrong {}",
                            d.delete_range_ms, d.broadcast_ms, d.wrong
                        ))
                        .unwrap_or_default()
                ),
                (None, f) => eprintln!(
                    "   {}: FAILED ({}){} after {} rows",
                    engine.as_str(),
                    f.as_deref().unwrap_or("?"),
                    if r.killed_for_memory {
                        ", killed for memory"
                    } else {
                        ""
                    },
                    r.rows_reached
                ),
            }
            runs.push(r);
        }
    }
    let results: Vec<EngineSummary> = engines.iter().map(|&e| summarize(e, &runs)).collect();
    let report = Report {
        workload: args.workload.as_str(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_unix_secs,
        machine: format!(
            "{} cores, shared",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        ),
        rows,
        cache_size_bytes,
        memory_limit_bytes: memory_limit,
        ratios: ratios(&results),
        results,
        runs,
    };
    if let Some(parent) = args.json.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)?;
    let series: Vec<plot::Series> = report
        .runs
        .iter()
        .filter(|r| !r.insert_series.is_empty())
        .map(|r| plot::Series {
            label: format!(
                "{} run {}{}",
                r.engine.as_str(),
                r.run,
                if r.killed_for_memory { " (OOM)" } else { "" }
            ),
            points: r.insert_series.clone(),
        })
        .collect();
    if !series.is_empty() {
        let svg = plot::line_chart(
            &format!("{}: rows inserted per second", report.workload),
            "seconds",
            "rows/s",
            &series,
        );
        std::fs::write(args.json.with_extension("svg"), svg)?;
    }
    println!(
        "{:<8} {:>12} {:>12} {:>11} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "engine",
        "ops/s(med)",
        "ins/s(med)",
        "disk MiB",
        "RSS MiB",
        "1st 10%/s",
        "last 10%/s",
        "ok/oom",
        "ddl ms"
    );
    for s in &report.results {
        println!(
            "{:<8} {:>12.0} {:>12.0} {:>11.1} {:>10} {:>10.0} {:>10.0} {:>9} {:>9}",
            s.engine.as_str(),
            s.ops_per_sec,
            s.insert_rows_per_sec,
            s.bytes_on_disk / 1048576.0,
            s.peak_rss_bytes >> 20,
            s.rate_first_tenth,
            s.rate_last_tenth,
            format!("{}/{}", s.runs_completed, s.runs_killed_for_memory),
            match (s.delete_range_ms, s.broadcast_ms) {
                (Some(d), Some(b)) => format!("{d:.1}/{b:.1}"),
                _ => "-".into(),
            }
        );
    }
    for (name, ratio) in &report.ratios {
        println!("ratio {name}: {ratio:.2}");
    }
    println!("report: {}", args.json.display());
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn ratios_divide_fractal_by_each_other_engine() {
        let mk = |engine, ops| EngineSummary {
            engine,
            ops_per_sec: ops,
            bytes_on_disk: 100.0,
            peak_rss_bytes: 10,
            insert_rows_per_sec: ops,
            rate_first_tenth: 0.0,
            rate_last_tenth: 0.0,
            rows_reached: 0.0,
            journal_bytes: 0.0,
            logical_bytes: 0.0,
            cpu_secs: 0.0,
            delete_range_ms: None,
            broadcast_ms: None,
            wrong_reads: 0,
            runs_completed: 1,
            runs_killed_for_memory: 0,
            runs_failed: 0,
            runs_stopped_at_time_limit: 0,
        };
        let r = ratios(&[mk(EngineName::Fractal, 500.0), mk(EngineName::Sled, 100.0)]);
        assert!(r.contains(&("ops_per_sec: fractal / sled".to_string(), 5.0)));
        assert!(r.contains(&("bytes_on_disk: fractal / sled".to_string(), 1.0)));
    }
}
