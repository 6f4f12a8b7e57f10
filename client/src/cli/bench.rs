//! `ftkvctl bench put`: N concurrent writers over one [`Client`] for a fixed time, random keys,
//! latencies in an HDR histogram, a progress line per second on stderr.
//!
//! Design source: etcd's `benchmark put` (clients over shared connections, random keys in a key
//! space, latency percentiles) and sysbench's closed-loop threads (each client waits for its
//! answer before sending the next write, so throughput = clients / latency).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::Client;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchConfig {
    /// Concurrent writers (tasks sharing one client).
    pub clients: usize,
    /// How long to write.
    pub duration: Duration,
    /// Bytes per value (random bytes).
    pub value_size_bytes: usize,
    /// Keys are drawn uniformly from this many distinct keys.
    pub key_space: u64,
    /// Prefix of every key (`PREFIX` + 16 hex digits).
    pub key_prefix: String,
    /// Print a progress line per second on stderr.
    pub progress: bool,
}

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatencyMs {
    /// Fastest acknowledged write.
    pub min: f64,
    /// Mean.
    pub avg: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest acknowledged write.
    pub max: f64,
}

/// Result of a run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BenchReport {
    /// Acknowledged writes.
    pub ops: u64,
    /// Failed writes (any error, ambiguous ones included).
    pub errors: u64,
    /// Of which ambiguous.
    pub ambiguous: u64,
    /// Wall time of the run, seconds.
    pub elapsed_s: f64,
    /// `ops / elapsed_s`.
    pub ops_per_sec: f64,
    /// Latency of acknowledged writes.
    pub latency_ms: LatencyMs,
    /// Writers.
    pub clients: usize,
    /// Value size, bytes.
    pub value_size_bytes: usize,
    /// Mean client ops per Raft entry on the leader after the run, when it reports it.
    pub ops_per_entry: Option<f64>,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

impl BenchReport {
    /// The JSON object printed by `-w json` (contract: `ops`, `ops_per_sec`, `errors`,
    /// `latency_ms.{min,avg,p50,p95,p99,max}`).
    pub fn to_json(&self) -> serde_json::Value {
        let l = &self.latency_ms;
        json!({
            "ops": self.ops,
            "ops_per_sec": round2(self.ops_per_sec),
            "errors": self.errors,
            "ambiguous": self.ambiguous,
            "elapsed_s": round2(self.elapsed_s),
            "clients": self.clients,
            "value_size_bytes": self.value_size_bytes,
            "latency_ms": {
                "min": round3(l.min), "avg": round3(l.avg), "p50": round3(l.p50),
                "p95": round3(l.p95), "p99": round3(l.p99), "max": round3(l.max),
            },
            "ops_per_entry": self.ops_per_entry,
            "first_error": self.first_error,
        })
    }

    /// Human-readable summary (`-w simple` / `table`).
    pub fn to_text(&self) -> String {
        let l = &self.latency_ms;
        let mut s = format!(
            "Summary:\n  clients:       {}\n  value size:    {} bytes\n  elapsed:       {:.2} s\n  \
             writes:        {}\n  errors:        {} ({} ambiguous)\n  writes/s:      {:.1}\n\
             Latency (ms):\n  min {:.3}  avg {:.3}  p50 {:.3}  p95 {:.3}  p99 {:.3}  max {:.3}",
            self.clients,
            self.value_size_bytes,
            self.elapsed_s,
            self.ops,
            self.errors,
            self.ambiguous,
            self.ops_per_sec,
            l.min,
            l.avg,
            l.p50,
            l.p95,
            l.p99,
            l.max
        );
        match self.ops_per_entry {
            Some(x) => s.push_str(&format!("\nops per Raft entry (leader): {x:.2}")),
            None => s.push_str("\nops per Raft entry (leader): not reported"),
        }
        if let Some(e) = &self.first_error {
            s.push_str(&format!("\nfirst error: {e}"));
        }
        s
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Latency histogram in microseconds, 1 us .. 10 min, 3 significant digits.
fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3).map_err(|e| anyhow::anyhow!("latency histogram: {e:?}"))
}

/// Summarizes a histogram of microseconds into milliseconds.
pub fn summarize(h: &Histogram<u64>) -> LatencyMs {
    if h.is_empty() {
        return LatencyMs::default();
    }
    let ms = |us: u64| us as f64 / 1000.0;
    LatencyMs {
        min: ms(h.min()),
        avg: h.mean() / 1000.0,
        p50: ms(h.value_at_quantile(0.50)),
        p95: ms(h.value_at_quantile(0.95)),
        p99: ms(h.value_at_quantile(0.99)),
        max: ms(h.max()),
    }
}

/// The key for index `i`: `prefix` + 16 hex digits (fixed width, so keys sort by index).
pub fn bench_key(prefix: &str, i: u64) -> String {
    format!("{prefix}{i:016x}")
}

struct Counters {
    ops: AtomicU64,
    errors: AtomicU64,
    ambiguous: AtomicU64,
    done: AtomicBool,
    first_error: parking_lot::Mutex<Option<String>>,
}

/// Runs the put benchmark. Write errors are counted in the report, not returned. Errors: a
/// config with zero `clients`, zero `duration` or zero `key_space` (nothing meaningful to run).
pub async fn run_put(client: &Client, cfg: &BenchConfig) -> anyhow::Result<BenchReport> {
    validate(cfg)?;
    let template = new_histogram()?;
    let counters = Arc::new(Counters {
        ops: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        ambiguous: AtomicU64::new(0),
        done: AtomicBool::new(false),
        first_error: parking_lot::Mutex::new(None),
    });
    let start = Instant::now();
    let end = start + cfg.duration;
    let key_space = cfg.key_space;
    let mut tasks = Vec::with_capacity(cfg.clients);
    for worker in 0..cfg.clients {
        let client = client.clone();
        let counters = Arc::clone(&counters);
        let prefix = cfg.key_prefix.clone();
        let value_size = cfg.value_size_bytes;
        let mut hist = Histogram::new_from(&template);
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random::<u64>() ^ worker as u64);
            let mut value = vec![0u8; value_size];
            rng.fill(value.as_mut_slice());
            while Instant::now() < end {
                let key = bench_key(&prefix, rng.gen_range(0..key_space));
                if let Some(first) = value.first_mut() {
                    *first = first.wrapping_add(1);
                }
                let t0 = Instant::now();
                match client.put(&key, &value).await {
                    Ok(_) => {
                        let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                        hist.saturating_record(us.max(1));
                        counters.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        if e.is_ambiguous() {
                            counters.ambiguous.fetch_add(1, Ordering::Relaxed);
                        }
                        counters.first_error.lock().get_or_insert_with(|| e.to_string());
                        // Do not spin on a dead cluster.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            hist
        }));
    }

    let progress = if cfg.progress {
        let counters = Arc::clone(&counters);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await; // the first tick is immediate
            let mut last_ops = 0u64;
            let mut second = 0u64;
            loop {
                tick.tick().await;
                if counters.done.load(Ordering::Relaxed) {
                    break;
                }
                second += 1;
                let ops = counters.ops.load(Ordering::Relaxed);
                let errors = counters.errors.load(Ordering::Relaxed);
                super::output::stderr_line(&format!(
                    "[{second:>4}s] {:>8} writes/s  total {ops:>10}  errors {errors}",
                    ops.saturating_sub(last_ops)
                ));
                last_ops = ops;
            }
        }))
    } else {
        None
    };

    let mut merged = Histogram::new_from(&template);
    for task in tasks {
        match task.await {
            Ok(h) => {
                if merged.add(&h).is_err() {
                    tracing::warn!("latency histogram merge failed");
                }
            }
            Err(e) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                let mut first = counters.first_error.lock();
                first.get_or_insert_with(|| format!("bench task failed: {e}"));
            }
        }
    }
    let elapsed = start.elapsed();
    counters.done.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        p.abort();
    }

    let ops = counters.ops.load(Ordering::Relaxed);
    let elapsed_s = elapsed.as_secs_f64();
    let ops_per_entry = leader_ops_per_entry(client).await;
    let first_error = counters.first_error.lock().clone();
    Ok(BenchReport {
        ops,
        errors: counters.errors.load(Ordering::Relaxed),
        ambiguous: counters.ambiguous.load(Ordering::Relaxed),
        elapsed_s,
        ops_per_sec: if elapsed_s > 0.0 {
            ops as f64 / elapsed_s
        } else {
            0.0
        },
        latency_ms: summarize(&merged),
        clients: cfg.clients,
        value_size_bytes: cfg.value_size_bytes,
        ops_per_entry,
        first_error,
    })
}

/// Rejects configs that cannot run: zero clients, zero duration, zero key space.
pub fn validate(cfg: &BenchConfig) -> anyhow::Result<()> {
    if cfg.clients == 0 {
        anyhow::bail!("bench put: --clients must be at least 1");
    }
    if cfg.duration.is_zero() {
        anyhow::bail!("bench put: --duration must be greater than zero");
    }
    if cfg.key_space == 0 {
        anyhow::bail!("bench put: --key-space must be at least 1");
    }
    Ok(())
}

/// `ops_per_entry` from the leader's status, if a leader answers and reports a value > 0.
async fn leader_ops_per_entry(client: &Client) -> Option<f64> {
    let all = client.status_all().await;
    all.into_iter()
        .filter_map(|(_, r)| r.ok())
        .find(|s| s.is_leader)
        .map(|s| s.ops_per_entry)
        .filter(|x| *x > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_in_milliseconds() {
        let mut h = new_histogram().unwrap();
        for us in [1000u64, 2000, 3000, 4000, 100_000] {
            h.record(us).unwrap();
        }
        let l = summarize(&h);
        assert!((l.min - 1.0).abs() < 0.01, "{l:?}");
        assert!((l.max - 100.0).abs() < 0.1, "{l:?}");
        assert!((l.p50 - 3.0).abs() < 0.01, "{l:?}");
        assert!((l.avg - 22.0).abs() < 0.1, "{l:?}");
        assert!(l.p95 >= l.p50 && l.p99 >= l.p95 && l.max >= l.p99);
        assert_eq!(summarize(&new_histogram().unwrap()), LatencyMs::default());
    }

    #[test]
    fn report_json_has_the_contract_fields() {
        let r = BenchReport {
            ops: 10,
            errors: 1,
            ops_per_sec: 5.0,
            ..Default::default()
        };
        let v = r.to_json();
        for f in ["ops", "ops_per_sec", "errors"] {
            assert!(v.get(f).is_some(), "missing {f}");
        }
        for f in ["min", "avg", "p50", "p95", "p99", "max"] {
            assert!(v["latency_ms"].get(f).is_some(), "missing latency_ms.{f}");
        }
        assert_eq!(v["ops"], 10);
        assert!(r.to_text().contains("writes/s"));
    }

    #[test]
    fn zero_clients_duration_or_key_space_are_rejected() {
        let ok = BenchConfig {
            clients: 1,
            duration: Duration::from_millis(10),
            value_size_bytes: 8,
            key_space: 1,
            key_prefix: "b/".into(),
            progress: false,
        };
        assert!(validate(&ok).is_ok());
        let e = validate(&BenchConfig {
            clients: 0,
            ..ok.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("--clients"), "{e}");
        let e = validate(&BenchConfig {
            duration: Duration::ZERO,
            ..ok.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("--duration"), "{e}");
        let e = validate(&BenchConfig { key_space: 0, ..ok }).unwrap_err();
        assert!(e.to_string().contains("--key-space"), "{e}");
    }

    #[test]
    fn keys_are_fixed_width() {
        assert_eq!(bench_key("b/", 255), "b/00000000000000ff");
    }
}
