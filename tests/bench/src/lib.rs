//! `ftkv-bench`: side-by-side benchmarks, outside the default test build (STYLE.md, after redb).
//!
//! - `ftkv-bench cluster`: the same load generator drives a three-node ftkv cluster and a
//!   three-node etcd cluster on this machine, alternately, and reports medians and ratios
//!   (BENCH.md, "How to measure honestly here").
//! - `ftkv-bench engine`: the storage engines (fractal, sled, fjall) in-process.
//! - `ftkv-bench restart`: the write pause of a rolling restart vs a crash failover.
//! - `ftkv-bench compression`, `beyond-memory`, `instant-ddl`: issue 19's storage workloads
//!   through three-node clusters (see [`storage`]).
//! - `ftkv-bench bulk`: the bulk load (`ftkvctl load`) vs the same rows by `Put`, in the cluster.
//! - `ftkv-bench sysbench-insert`: the seed's sysbench random inserts against ftkv, etcd and
//!   MariaDB semi-sync (one master, two slaves) driven by Debian's `sysbench`.
//! - `ftkv-bench scaling`: puts over client counts and value sizes, a curve per target
//!   (see [`cluster_bench::scaling`]).
//! - `ftkv-bench reads`: linearizable and serializable point reads and 100-row range scans
//!   (see [`cluster_bench::reads`]).
//! - `ftkv-bench failover`: kill -9 of the leader under put load, ftkv vs etcd: the write
//!   pause and the killed node's catch-up (see [`cluster_bench::failover`]).
//! - `ftkv-bench all`: every workload at full size, one after another.
//! - `ftkv-bench table`: BENCHMARKS.md's opening table, generated from every workload's
//!   `summary.json`.
//!
//! Depends on ftkv's client and engine crates and on the systems it compares against; nothing
//! in ftkv depends on it.
//!
//! The load: `clients` concurrent tasks, each issuing one put at a time of a random key from
//! `key_space` keys with a `value_size`-byte value, for `duration`. Latency is recorded per
//! request in an HDR histogram, and per second for the latency-over-time plot.

pub mod all;
pub mod bulk;
pub mod cluster_bench;
pub mod cpu;
pub mod engine;
pub mod etcd;
pub mod ftkv;
pub mod mariadb;
pub mod plot;
pub mod ports;
pub mod restart;
pub mod storage;
pub mod summary;
pub mod sysbench;
pub mod table;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Live heap bytes, counted by the `count-alloc` feature's allocator (zero without it).
pub static LIVE_HEAP_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// A system under test: something that accepts puts.
#[derive(Clone)]
pub enum Target {
    /// ftkv through `ftkv-client`.
    Ftkv(ftkv_client::Client),
    /// etcd through its gRPC KV API.
    Etcd(etcd::EtcdClient),
}

impl Target {
    /// Short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Target::Ftkv(_) => "ftkv",
            Target::Etcd(_) => "etcd",
        }
    }

    async fn put(&self, key: Vec<u8>, value: Vec<u8>) -> anyhow::Result<()> {
        match self {
            Target::Ftkv(c) => {
                c.put(key, value).await?;
            }
            Target::Etcd(c) => c.put(key, value).await?,
        }
        Ok(())
    }
}

/// Load parameters.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    /// Concurrent clients (each one request at a time).
    pub clients: u64,
    /// Run length.
    #[serde(with = "humantime_secs")]
    pub duration: Duration,
    /// Value size in bytes (half random, half zeros: "half compressible").
    pub value_size: usize,
    /// Distinct keys.
    pub key_space: u64,
    /// RNG seed.
    pub seed: u64,
    /// ftkv: idle client sessions left in the session table before the run.
    pub idle_sessions: u64,
}

mod humantime_secs {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Serialize, Default)]
pub struct LatencyMs {
    /// Minimum.
    pub min: f64,
    /// Mean.
    pub avg: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl LatencyMs {
    /// From a histogram of microseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |v: u64| v as f64 / 1000.0;
        Self {
            min: ms(h.min()),
            avg: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
        }
    }
}

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    /// Seconds since the start.
    pub t: u64,
    /// Acknowledged ops in that second.
    pub ops: u64,
    /// Median latency (ms).
    pub p50_ms: f64,
    /// 95th percentile latency (ms).
    pub p95_ms: f64,
    /// 99th percentile latency (ms).
    pub p99_ms: f64,
}

/// Result of one run against one target.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Target name.
    pub target: String,
    /// Run number (1-based).
    pub run: u64,
    /// Acknowledged ops.
    pub ops: u64,
    /// Acknowledged ops per second.
    pub ops_per_sec: f64,
    /// Failed requests.
    pub errors: u64,
    /// Latency summary.
    pub latency_ms: LatencyMs,
    /// Per-second series.
    pub seconds: Vec<Second>,
    /// ftkv only: mean client ops per Raft entry reported by the leader.
    pub ops_per_entry: Option<f64>,
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 120 s with 3 significant digits: valid constant bounds, so this cannot fail.
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

/// Runs `load` against `target`, printing a progress line per second on stderr: random keys
/// `bench/<12 digits>` from `key_space`, values of `value_size` bytes, half random.
pub async fn run_load(target: &Target, load: &Load, run: u64) -> RunResult {
    let (key_space, value_size) = (load.key_space, load.value_size);
    let make = move |rng: &mut rand::rngs::StdRng| {
        let key = format!("bench/{:012}", rng.gen_range(0..key_space)).into_bytes();
        let mut value = vec![0u8; value_size];
        rng.fill(&mut value[..value_size / 2]);
        (key, value)
    };
    run_puts(target, load.clients, load.duration, load.seed, run, make).await
}

/// Runs `clients` concurrent tasks against `target` for `duration`, each issuing one put at a
/// time of the key and value `make` draws from the task's own RNG (seeded from `seed` and the
/// task number), printing a progress line per second on stderr.
pub async fn run_puts<F>(
    target: &Target,
    clients: u64,
    duration: Duration,
    seed: u64,
    run: u64,
    make: F,
) -> RunResult
where
    F: Fn(&mut rand::rngs::StdRng) -> (Vec<u8>, Vec<u8>) + Clone + Send + 'static,
{
    let seconds = duration.as_secs().max(1) as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..clients {
        let (target, stop, done, errors) = (target.clone(), stop.clone(), done.clone(), errors.clone());
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (task + 1).wrapping_mul(0x9E37_79B9));
            let mut total = histogram();
            let mut per_second: Vec<Histogram<u64>> = (0..seconds + 1).map(|_| histogram()).collect();
            while !stop.load(Ordering::Relaxed) {
                let (key, value) = make(&mut rng);
                let t = Instant::now();
                match target.put(key, value).await {
                    Ok(()) => {
                        let us = t.elapsed().as_micros().max(1) as u64;
                        let _ = total.record(us);
                        let sec = (start.elapsed().as_secs() as usize).min(seconds);
                        if let Some(h) = per_second.get_mut(sec) {
                            let _ = h.record(us);
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (total, per_second)
        }));
    }
    let mut last = 0;
    for s in 1..=seconds {
        tokio::time::sleep_until((start + Duration::from_secs(s as u64)).into()).await;
        let d = done.load(Ordering::Relaxed);
        eprintln!(
            "  [{} run {run}] {s:>3}s {:>8} ops/s  total {d}  errors {}",
            target.name(),
            d - last,
            errors.load(Ordering::Relaxed)
        );
        last = d;
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let mut total = histogram();
    let mut per_second: Vec<Histogram<u64>> = (0..seconds + 1).map(|_| histogram()).collect();
    for t in tasks {
        if let Ok((h, ps)) = t.await {
            let _ = total.add(&h);
            for (a, b) in per_second.iter_mut().zip(ps.iter()) {
                let _ = a.add(b);
            }
        }
    }
    let ops = total.len();
    let quantile_ms = |h: &Histogram<u64>, q: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1000.0
        }
    };
    let series = per_second
        .iter()
        .take(seconds)
        .enumerate()
        .map(|(t, h)| Second {
            t: t as u64,
            ops: h.len(),
            p50_ms: quantile_ms(h, 0.5),
            p95_ms: quantile_ms(h, 0.95),
            p99_ms: quantile_ms(h, 0.99),
        })
        .collect();
    RunResult {
        target: target.name().to_string(),
        run,
        ops,
        ops_per_sec: ops as f64 / elapsed.as_secs_f64(),
        errors: errors.load(Ordering::Relaxed),
        latency_ms: LatencyMs::from_histogram(&total),
        seconds: series,
        ops_per_entry: None,
    }
}

/// Median of a non-empty slice (mean of the middle two for even lengths); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn latency_summary_in_ms() {
        let mut h = histogram();
        for us in [1000u64, 2000, 3000, 4000] {
            h.record(us).unwrap();
        }
        let l = LatencyMs::from_histogram(&h);
        assert!((l.min - 1.0).abs() < 0.01);
        assert!((l.max - 4.0).abs() < 0.01);
        assert!((l.avg - 2.5).abs() < 0.01);
    }
}
