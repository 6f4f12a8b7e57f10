//! `ftkv-bench reads`: point reads, linearizable and serializable, and 100-row range scans at
//! 128 clients (issue 19, workload 3).
//!
//! `ftkv-bench reads --targets ftkv,etcd --clients 128 --duration 10s --runs 3 --out DIR`
//!
//! Each round starts every target once, in the order given, as a three-node cluster, preloads
//! `keys` keys (`bench/<12 digits>`, each value `value-size` bytes of its own index, so every
//! read is checked against what was written) by concurrent puts, then runs three phases of
//! `duration` each, `clients` tasks with one read in flight each:
//! - `linearizable-get`: ftkv's default read (`Client::get`, the leader's ReadIndex round);
//!   etcd's default `Range` of one key (linearizable);
//! - `serializable-get`: ftkv's `ReadConsistency::Serializable` (the answering node's state,
//!   no ReadIndex; the client sends it to the leader it knows); etcd's `Range` with
//!   `serializable = true` (any member's own state; requests round-robin over the members);
//! - `scan-<rows>`: `rows` consecutive keys from a random one, ftkv's `Client::scan` with limit
//!   `rows` (linearizable), etcd's `Range` with `range_end` and `limit` (linearizable).
//!
//! Every read's answer is checked (the value of its key; a scan's row count, first and last
//! key and their values): a wrong answer is counted in `wrong`. Beside each phase: CPU seconds
//! per read, servers plus this process, from `/proc` ([`super::measure_cpu`]; `per_write_us`
//! of [`CpuUse`] is per read here). Results: `DIR/results.json` (every phase of every run,
//! medians per target and phase, the first target's median over each other one's per phase),
//! `DIR/summary.json` (reads/s and p99 per phase), `DIR/reads_per_sec.svg` and
//! `DIR/latency_p99.svg` (bar charts of the medians, whiskers from the slowest to the fastest
//! run).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::etcd_ops::EtcdOps;
use super::{key_of, measure_cpu, ratios_over_first, Started};
use crate::summary::{command_line, machine_line, Summary, SummaryRow};
use crate::sysbench::CpuUse;
use crate::{plot, LatencyMs, Target};

/// `ftkv-bench reads` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ReadsArgs {
    /// Comma-separated targets: ftkv, ftkv-sled, etcd, ftkv@DIR, ftkv-sled@DIR.
    #[arg(long, default_value = "ftkv,etcd")]
    pub targets: String,
    /// Concurrent clients (one read in flight each).
    #[arg(long, default_value_t = 128)]
    pub clients: u64,
    /// Length of each phase.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Rounds; each round starts every target once and runs every phase against it.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Keys preloaded before the reads.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Value size of the preloaded keys, bytes.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Rows per range scan.
    #[arg(long, default_value_t = 100)]
    pub scan_rows: u64,
    /// Output directory.
    #[arg(long, default_value = "store/bench-reads")]
    pub out: PathBuf,
    /// First port; target i of a round uses 20 ports from base + 20 i.
    #[arg(long, default_value_t = 24200)]
    pub base_port: u16,
    /// RNG seed of the readers.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// What a phase reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// One key, linearizable (the default read of both).
    Linearizable,
    /// One key, serializable.
    Serializable,
    /// `scan_rows` consecutive keys.
    Scan,
}

impl ReadKind {
    const ALL: [ReadKind; 3] = [ReadKind::Linearizable, ReadKind::Serializable, ReadKind::Scan];

    fn name(self, scan_rows: u64) -> String {
        match self {
            ReadKind::Linearizable => "linearizable-get".into(),
            ReadKind::Serializable => "serializable-get".into(),
            ReadKind::Scan => format!("scan-{scan_rows}"),
        }
    }
}

/// One phase of one run.
#[derive(Debug, Clone, Serialize)]
pub struct ReadRun {
    /// Target name as given.
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// `linearizable-get`, `serializable-get` or `scan-<rows>`.
    pub kind: String,
    /// Reads answered (each checked).
    pub reads: u64,
    /// Reads per second.
    pub reads_per_sec: f64,
    /// Rows returned (one per point read).
    pub rows: u64,
    /// Answers that were not what was preloaded (missing key, wrong value, short scan).
    pub wrong: u64,
    /// Failed requests.
    pub errors: u64,
    /// Latency of the answered reads.
    pub latency_ms: LatencyMs,
    /// CPU over the phase (`per_write_us`: per read).
    pub cpu: CpuUse,
}

/// Medians over the rounds of one target and phase.
#[derive(Debug, Clone, Serialize)]
pub struct ReadMedian {
    /// Target name as given.
    pub target: String,
    /// Phase.
    pub kind: String,
    /// Rounds the median is over.
    pub runs: usize,
    /// Reads per second.
    pub reads_per_sec: f64,
    /// Slowest round's reads per second.
    pub min_reads_per_sec: f64,
    /// Fastest round's reads per second.
    pub max_reads_per_sec: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// CPU per read, servers plus load generator, µs.
    pub cpu_per_read_us: f64,
    /// Wrong answers, summed over the rounds.
    pub wrong: u64,
    /// Failed requests, summed over the rounds.
    pub errors: u64,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    command: String,
    clients: u64,
    duration_s: f64,
    keys: u64,
    value_size_bytes: usize,
    scan_rows: u64,
    targets: Vec<String>,
    /// Preload time per target and round, s.
    preload_s: Vec<(String, u64, f64)>,
    runs: Vec<ReadRun>,
    medians: Vec<ReadMedian>,
    /// Per phase: the first target's median reads/s over each other one's.
    ratios: Vec<(String, Vec<(String, f64)>)>,
}

/// The preloaded value of key `i`: its 12-digit index repeated to `size` bytes.
pub fn value_of(i: u64, size: usize) -> Vec<u8> {
    format!("{i:012}")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(size)
        .collect()
}

/// A read client over a started target.
#[derive(Clone)]
enum Reader {
    Ftkv(ftkv_client::Client),
    Etcd(EtcdOps),
}

impl Reader {
    fn new(started: &Started) -> anyhow::Result<Self> {
        Ok(match &started.target {
            Target::Ftkv(c) => Reader::Ftkv(c.clone()),
            Target::Etcd(_) => Reader::Etcd(EtcdOps::connect(&started.endpoints)?),
        })
    }

    async fn get(&self, key: Vec<u8>, serializable: bool) -> anyhow::Result<Option<Vec<u8>>> {
        match self {
            Reader::Ftkv(c) => {
                let consistency = if serializable {
                    ftkv_client::ReadConsistency::Serializable
                } else {
                    ftkv_client::ReadConsistency::Linearizable
                };
                Ok(c.get_with(key, consistency).await?)
            }
            Reader::Etcd(e) => e.get(key, serializable).await,
        }
    }

    async fn scan(&self, start: Vec<u8>, end: Vec<u8>, rows: u64) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match self {
            Reader::Ftkv(c) => {
                let limit = u32::try_from(rows)?;
                let page = c.scan(start, end, limit).await?;
                Ok(page.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect())
            }
            Reader::Etcd(e) => e.scan(start, end, i64::try_from(rows)?).await,
        }
    }

    /// One read of `kind` at key `i`: `(rows returned, whether the answer is right)`.
    async fn read(&self, kind: ReadKind, i: u64, args: &ReadsArgs) -> anyhow::Result<(u64, bool)> {
        let vs = args.value_size;
        match kind {
            ReadKind::Linearizable | ReadKind::Serializable => {
                let v = self.get(key_of(i), kind == ReadKind::Serializable).await?;
                Ok((u64::from(v.is_some()), v == Some(value_of(i, vs))))
            }
            ReadKind::Scan => {
                let rows = self.scan(key_of(i), key_of(args.keys), args.scan_rows).await?;
                let last = i + args.scan_rows - 1;
                let right = rows.len() as u64 == args.scan_rows
                    && rows.first() == Some(&(key_of(i), value_of(i, vs)))
                    && rows.last() == Some(&(key_of(last), value_of(last, vs)));
                Ok((rows.len() as u64, right))
            }
        }
    }
}

/// Puts every key `0..keys` with its value, 64 in flight; returns the time it took.
async fn preload(target: &Target, args: &ReadsArgs) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (target, next, keys, size) = (target.clone(), next.clone(), args.keys, args.value_size);
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return anyhow::Ok(());
                }
                let mut tries = 0;
                while let Err(e) = super::put(&target, key_of(i), value_of(i, size)).await {
                    tries += 1;
                    anyhow::ensure!(tries < 5, "preload of key {i} failed 5 times: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(start.elapsed())
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 120 s with 3 significant digits: valid constant bounds, so this cannot fail.
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

/// Counters the reader tasks share.
#[derive(Default)]
struct Counters {
    done: AtomicU64,
    rows: AtomicU64,
    wrong: AtomicU64,
    errors: AtomicU64,
}

/// `clients` tasks reading `kind` for `duration`, with a progress line per second.
async fn run_phase(reader: &Reader, name: &str, kind: ReadKind, args: &ReadsArgs, run: u64) -> ReadRun {
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let shared = Arc::new(args.clone());
    let start = Instant::now();
    let highest = match kind {
        ReadKind::Scan => args.keys - args.scan_rows,
        _ => args.keys - 1,
    };
    let mut tasks = Vec::new();
    for task in 0..args.clients {
        let (reader, stop, counters, args) = (reader.clone(), stop.clone(), counters.clone(), shared.clone());
        tasks.push(tokio::spawn(async move {
            let seed = args.seed.wrapping_add(run) ^ (task + 1).wrapping_mul(0x9E37_79B9);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut h = histogram();
            while !stop.load(Ordering::Relaxed) {
                let i = rng.gen_range(0..=highest);
                let t = Instant::now();
                match reader.read(kind, i, &args).await {
                    Ok((rows, right)) => {
                        let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                        counters.done.fetch_add(1, Ordering::Relaxed);
                        counters.rows.fetch_add(rows, Ordering::Relaxed);
                        counters.wrong.fetch_add(u64::from(!right), Ordering::Relaxed);
                    }
                    Err(_) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            h
        }));
    }
    let kind_name = kind.name(args.scan_rows);
    progress(name, &kind_name, run, start, args.duration, &counters).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let mut total = histogram();
    for t in tasks {
        if let Ok(h) = t.await {
            let _ = total.add(&h);
        }
    }
    ReadRun {
        target: name.to_string(),
        run,
        kind: kind_name,
        reads: total.len(),
        reads_per_sec: total.len() as f64 / elapsed.as_secs_f64(),
        rows: counters.rows.load(Ordering::Relaxed),
        wrong: counters.wrong.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        latency_ms: LatencyMs::from_histogram(&total),
        cpu: CpuUse::default(),
    }
}

/// A progress line per second until `duration` has passed.
async fn progress(name: &str, kind: &str, run: u64, start: Instant, duration: Duration, c: &Counters) {
    let mut last = 0;
    for s in 1..=duration.as_secs().max(1) {
        tokio::time::sleep_until((start + Duration::from_secs(s)).into()).await;
        let d = c.done.load(Ordering::Relaxed);
        eprintln!(
            "  [{name} {kind} run {run}] {s:>3}s {:>8} reads/s  total {d}  wrong {}  errors {}",
            d - last,
            c.wrong.load(Ordering::Relaxed),
            c.errors.load(Ordering::Relaxed)
        );
        last = d;
    }
}

/// Preloads one started target and runs every phase against it.
async fn run_target(started: &Started, args: &ReadsArgs, run: u64) -> anyhow::Result<(f64, Vec<ReadRun>)> {
    let took = preload(&started.target, args).await?;
    eprintln!(
        "   {}: preloaded {} keys of {} B in {:.1} s",
        started.name,
        args.keys,
        args.value_size,
        took.as_secs_f64()
    );
    let reader = Reader::new(started)?;
    let mut out = Vec::new();
    for kind in ReadKind::ALL {
        let (mut r, cpu) = measure_cpu(
            &started.server_pids,
            run_phase(&reader, &started.name, kind, args, run),
            |r: &ReadRun| r.reads,
        )
        .await;
        r.cpu = cpu;
        eprintln!(
            "   {} {}: {:.0} reads/s, p50 {:.2} ms, p99 {:.2} ms, CPU {:.1} µs/read, wrong {}, errors {}",
            r.target,
            r.kind,
            r.reads_per_sec,
            r.latency_ms.p50,
            r.latency_ms.p99,
            r.cpu.per_write_us,
            r.wrong,
            r.errors
        );
        out.push(r);
    }
    Ok((took.as_secs_f64(), out))
}

fn medians(targets: &[String], kinds: &[String], runs: &[ReadRun]) -> Vec<ReadMedian> {
    let mut out = Vec::new();
    for kind in kinds {
        for t in targets {
            let rs: Vec<&ReadRun> = runs
                .iter()
                .filter(|r| &r.target == t && &r.kind == kind)
                .collect();
            let vals = |f: &dyn Fn(&ReadRun) -> f64| rs.iter().map(|r| f(r)).collect::<Vec<_>>();
            let rates = vals(&|r| r.reads_per_sec);
            out.push(ReadMedian {
                target: t.clone(),
                kind: kind.clone(),
                runs: rs.len(),
                reads_per_sec: crate::median(&rates),
                min_reads_per_sec: rates.iter().copied().fold(f64::INFINITY, f64::min),
                max_reads_per_sec: rates.iter().copied().fold(0.0, f64::max),
                p50_ms: crate::median(&vals(&|r| r.latency_ms.p50)),
                p99_ms: crate::median(&vals(&|r| r.latency_ms.p99)),
                cpu_per_read_us: crate::median(&vals(&|r| r.cpu.per_write_us)),
                wrong: rs.iter().map(|r| r.wrong).sum(),
                errors: rs.iter().map(|r| r.errors).sum(),
            });
        }
    }
    out
}

/// Runs `ftkv-bench reads` (see the module docs).
pub async fn run(args: &ReadsArgs) -> anyhow::Result<()> {
    let targets = super::parse_targets(&args.targets)?;
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    anyhow::ensure!(args.scan_rows > 0, "--scan-rows must be at least 1");
    anyhow::ensure!(args.keys >= args.scan_rows, "--keys must be at least --scan-rows");
    std::fs::create_dir_all(&args.out)?;
    let (mut runs, mut preload_s) = (Vec::new(), Vec::new());
    for run in 1..=args.runs {
        for (i, (name, kind)) in targets.iter().enumerate() {
            eprintln!(
                "== round {run}/{}: {name} ({} clients, {:?} a phase)",
                args.runs, args.clients, args.duration
            );
            let port = args.base_port + super::PORTS_PER_TARGET * i as u16;
            let started = super::start(name, kind, port).await?;
            let (took, phases) = run_target(&started, args, run).await?;
            preload_s.push((name.clone(), run, took));
            runs.extend(phases);
        }
    }
    let names: Vec<String> = targets.iter().map(|(n, _)| n.clone()).collect();
    let kinds: Vec<String> = ReadKind::ALL.iter().map(|k| k.name(args.scan_rows)).collect();
    let medians = medians(&names, &kinds, &runs);
    let ratios = kinds
        .iter()
        .map(|k| {
            let values: Vec<(String, f64)> = medians
                .iter()
                .filter(|m| &m.kind == k)
                .map(|m| (m.target.clone(), m.reads_per_sec))
                .collect();
            (k.clone(), ratios_over_first(&values))
        })
        .collect();
    let report = Report {
        machine: machine_line(),
        command: command_line(),
        clients: args.clients,
        duration_s: args.duration.as_secs_f64(),
        keys: args.keys,
        value_size_bytes: args.value_size,
        scan_rows: args.scan_rows,
        targets: names,
        preload_s,
        runs,
        medians,
        ratios,
    };
    super::write_json(&args.out, "results.json", &report)?;
    summary(&report).write(&args.out)?;
    charts(&report, &args.out)?;
    print(&report);
    println!("report: {}", args.out.join("results.json").display());
    let wrong: u64 = report.runs.iter().map(|r| r.wrong).sum();
    anyhow::ensure!(
        wrong == 0,
        "{wrong} read(s) did not return what was preloaded (see results.json)"
    );
    Ok(())
}

fn summary(report: &Report) -> Summary {
    let mut rows = Vec::new();
    for (kind, _) in &report.ratios {
        let at: Vec<&ReadMedian> = report.medians.iter().filter(|m| &m.kind == kind).collect();
        let row = |metric: &str, unit: &str, higher: bool, f: &dyn Fn(&ReadMedian) -> f64| SummaryRow {
            metric: format!("{metric}, {kind}, {} clients", report.clients),
            unit: unit.to_string(),
            higher_is_better: higher,
            values: at.iter().map(|m| (m.target.clone(), f(m))).collect(),
        };
        rows.push(row("reads/s", "ops/s", true, &|m| m.reads_per_sec));
        rows.push(row("read p99", "ms", false, &|m| m.p99_ms));
    }
    Summary::new("reads", report.command.clone(), rows)
}

fn charts(report: &Report, out: &std::path::Path) -> anyhow::Result<()> {
    let note = format!(
        "{} clients, {} keys of {} B, median of {} round(s)",
        report.clients,
        report.keys,
        report.value_size_bytes,
        report.medians.first().map_or(0, |m| m.runs)
    );
    let bars = |f: &dyn Fn(&ReadMedian) -> (f64, f64, f64)| -> Vec<plot::Bar> {
        report
            .medians
            .iter()
            .map(|m| {
                let (median, min, max) = f(m);
                plot::Bar {
                    label: format!("{} {}", m.target, m.kind),
                    median,
                    min,
                    max,
                }
            })
            .collect()
    };
    std::fs::write(
        out.join("reads_per_sec.svg"),
        plot::bar_chart(
            "reads per second",
            &note,
            "reads/s",
            &bars(&|m| (m.reads_per_sec, m.min_reads_per_sec, m.max_reads_per_sec)),
        ),
    )?;
    std::fs::write(
        out.join("latency_p99.svg"),
        plot::bar_chart(
            "read latency p99",
            &note,
            "ms",
            &bars(&|m| (m.p99_ms, m.p99_ms, m.p99_ms)),
        ),
    )?;
    Ok(())
}

fn print(report: &Report) {
    let w = report.targets.iter().map(String::len).max().unwrap_or(0).max(8);
    println!(
        "{:<w$} {:<18} {:>12} {:>9} {:>9} {:>12} {:>6} {:>7}",
        "target", "phase", "reads/s(med)", "p50 ms", "p99 ms", "CPU µs/read", "wrong", "errors"
    );
    for m in &report.medians {
        println!(
            "{:<w$} {:<18} {:>12.0} {:>9.2} {:>9.2} {:>12.1} {:>6} {:>7}",
            m.target, m.kind, m.reads_per_sec, m.p50_ms, m.p99_ms, m.cpu_per_read_us, m.wrong, m.errors
        );
    }
    for (kind, ratios) in &report.ratios {
        for (name, ratio) in ratios {
            println!("ratio {name}, {kind}: {ratio:.2}x");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_carry_their_index_and_size() {
        assert_eq!(value_of(42, 15), b"000000000042000".to_vec());
        assert_eq!(value_of(7, 100).len(), 100);
        assert_ne!(value_of(1, 100), value_of(2, 100));
        assert_eq!(ReadKind::Scan.name(100), "scan-100");
    }
}
