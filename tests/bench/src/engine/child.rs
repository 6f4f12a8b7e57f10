//! The child process of `ftkv-bench engine`: runs ONE workload against ONE engine and reports
//! to its parent through stdout, one line per event:
//!
//! - `progress <phase> <count> <elapsed_s>` about once a second (`phase` is `insert`, `read`,
//!   `scan`, ...; `count` is cumulative within the phase);
//! - `result <json>` once at the end ([`ChildResult`]).
//!
//! The parent starts the child, puts it into the memory cgroup, then writes one line to its
//! stdin; the child waits for that line before it allocates anything large.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ftkv_engine::UpsertOp;
use serde::{Deserialize, Serialize};

use super::data::{self, SeedTable};
use super::kv::{self, BenchKv, EngineName};
use super::Workload;

fn default_zstd_level() -> i32 {
    1
}

/// Everything a child needs, passed as one JSON argument.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    /// Engine to run.
    pub engine: EngineName,
    /// Workload to run.
    pub workload: Workload,
    /// Rows to load (per table for `compression`).
    pub rows: u64,
    /// Engine cache budget, bytes.
    pub cache_size_bytes: u64,
    /// fractal: zstd level of leaves.
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
    /// Fresh directory for the engine's files (the child creates it; the parent removes it).
    pub dir: PathBuf,
    /// Data seed.
    pub seed: u64,
    /// Point reads (`point-read`) or scans (`scan`) to run.
    pub reads: u64,
    /// Rows per scan (`scan`).
    pub scan_len: usize,
    /// Stop loading after this many seconds (the run reports the rows it reached).
    pub max_seconds: u64,
}

/// Point-read or scan figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReadStats {
    /// Lookups (or scans) done.
    pub ops: u64,
    /// Seconds they took.
    pub secs: f64,
    /// Lookups (or scans) per second.
    pub ops_per_sec: f64,
    /// Rows returned per second (scans).
    pub rows_per_sec: f64,
    /// Lookups of existing keys that found nothing (must be 0).
    pub misses: u64,
}

/// Instant-DDL figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DdlStats {
    /// Keys inside the deleted range.
    pub delete_range_keys: u64,
    /// Milliseconds the `DeleteRange` write call took.
    pub delete_range_ms: f64,
    /// Keys the broadcast applies to (all keys left).
    pub broadcast_keys: u64,
    /// Milliseconds the `UpsertRange` (broadcast `Append`) write call took.
    pub broadcast_ms: f64,
    /// Milliseconds of the checkpoint after both.
    pub checkpoint_after_ms: f64,
    /// Sampled keys checked after the DDL.
    pub verified_keys: u64,
    /// Sampled keys whose value was wrong (must be 0).
    pub wrong: u64,
}

/// What a child reports at the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChildResult {
    /// Rows written.
    pub rows_written: u64,
    /// Seconds spent writing batches (without the final checkpoint).
    pub insert_secs: f64,
    /// Seconds of the final checkpoint.
    pub checkpoint_secs: f64,
    /// Rows per second including the final checkpoint.
    pub insert_rows_per_sec: f64,
    /// Rows per second over the first tenth of the rows.
    pub rate_first_tenth: f64,
    /// Rows per second over the last tenth of the rows written.
    pub rate_last_tenth: f64,
    /// The workload's headline figure (inserts/s, lookups/s or scans/s).
    pub ops_per_sec: f64,
    /// Allocated bytes under the engine's directory after the final checkpoint.
    pub bytes_on_disk: u64,
    /// The engine's own size figure.
    pub engine_size_bytes: u64,
    /// Of which write-ahead journal (fjall), bytes.
    #[serde(default)]
    pub journal_bytes: u64,
    /// Key plus value bytes written.
    pub logical_bytes: u64,
    /// The child's VmHWM at the end.
    pub peak_rss_bytes: u64,
    /// User plus system CPU seconds of the child.
    pub cpu_secs: f64,
    /// Loading stopped at `max_seconds` before all rows were written.
    pub stopped_at_time_limit: bool,
    /// Point-read or scan figures.
    pub reads: Option<ReadStats>,
    /// Instant-DDL figures.
    pub ddl: Option<DdlStats>,
}

/// `VmHWM` (peak resident set) of process `pid` (`"self"` for this one), bytes.
pub fn vm_hwm_bytes(pid: &str) -> Option<u64> {
    Some(proc_status_kib(pid, "VmHWM")? * 1024)
}

/// A `KiB` field (`VmHWM`, `RssAnon`, ...) of `/proc/<pid>/status` (`pid` `"self"` for this
/// process); `None` when the process or the field is missing.
pub fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User plus system CPU seconds of this process (`/proc/self/stat`, USER_HZ = 100 on Linux).
fn cpu_secs_self() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // `rest` starts at field 3 (state), so field n is at index n - 3.
    (ticks(14 - 3) + ticks(15 - 3)) / 100.0
}

/// Prints the engine's internal counters (if any) to stderr, which the parent passes through.
fn notes(kv: &dyn BenchKv, when: &str) {
    if let Some(n) = kv.engine_notes() {
        eprintln!("   engine counters {when}: {n}");
    }
    if cfg!(feature = "count-alloc") {
        let live = crate::LIVE_HEAP_BYTES.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("   live heap {when}: {} KiB", live >> 10);
    }
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Reports `count` in `phase` once a second.
struct Ticker {
    phase: &'static str,
    start: Instant,
    next: Instant,
}

impl Ticker {
    fn new(phase: &'static str) -> Self {
        let start = Instant::now();
        Ticker {
            phase,
            start,
            next: start + Duration::from_secs(1),
        }
    }

    fn tick(&mut self, count: u64) {
        let now = Instant::now();
        if now >= self.next {
            self.next = now + Duration::from_secs(1);
            self.finish(count);
        }
    }

    fn finish(&self, count: u64) {
        emit(&format!(
            "progress {} {count} {:.3}",
            self.phase,
            self.start.elapsed().as_secs_f64()
        ));
    }
}

/// Rows per write batch (the issue: batches of 1,000).
const BATCH_ROWS: u64 = 1000;

/// Loads `rows` rows made by `row(i)` in batches of 1,000, then checkpoints.
fn load(
    kv: &dyn BenchKv,
    rows: u64,
    max_seconds: u64,
    row: &dyn Fn(u64) -> (Vec<u8>, Vec<u8>),
    out: &mut ChildResult,
) -> anyhow::Result<()> {
    let mut ticker = Ticker::new("insert");
    let start = Instant::now();
    let limit = Duration::from_secs(max_seconds);
    let tenth = (rows / 10).max(1);
    let mut t_first_tenth = None;
    // (rows, seconds) at each batch, to find the time the last tenth started.
    let mut marks: Vec<(u64, f64)> = Vec::new();
    let mut done = 0u64;
    let mut batch = Vec::with_capacity(BATCH_ROWS as usize);
    while done < rows {
        let n = BATCH_ROWS.min(rows - done);
        for i in done..done + n {
            let (k, v) = row(i);
            out.logical_bytes += (k.len() + v.len()) as u64;
            batch.push((k, v));
        }
        kv.put_batch(std::mem::replace(
            &mut batch,
            Vec::with_capacity(BATCH_ROWS as usize),
        ))?;
        done += n;
        let t = start.elapsed().as_secs_f64();
        marks.push((done, t));
        if t_first_tenth.is_none() && done >= tenth {
            t_first_tenth = Some(t);
        }
        ticker.tick(done);
        if start.elapsed() >= limit && done < rows {
            out.stopped_at_time_limit = true;
            break;
        }
    }
    ticker.finish(done);
    out.insert_secs = start.elapsed().as_secs_f64();
    let t0 = Instant::now();
    kv.checkpoint()?;
    out.checkpoint_secs = t0.elapsed().as_secs_f64();
    out.rows_written = done;
    out.insert_rows_per_sec = done as f64 / (out.insert_secs + out.checkpoint_secs).max(1e-9);
    if let Some(t) = t_first_tenth {
        out.rate_first_tenth = tenth.min(done) as f64 / t.max(1e-9);
    }
    let last_tenth_start = done.saturating_sub((done / 10).max(1));
    let (r0, t0s) = marks
        .iter()
        .rev()
        .find(|(r, _)| *r <= last_tenth_start)
        .copied()
        .unwrap_or((0, 0.0));
    out.rate_last_tenth = (done - r0) as f64 / (out.insert_secs - t0s).max(1e-9);
    Ok(())
}

fn finish_sizes(kv: &dyn BenchKv, spec: &ChildSpec, out: &mut ChildResult) -> anyhow::Result<()> {
    out.bytes_on_disk = kv::dir_allocated_bytes(&spec.dir);
    out.engine_size_bytes = kv.engine_size_bytes()?;
    out.journal_bytes = kv.journal_bytes();
    Ok(())
}

fn random_row(seed: u64) -> impl Fn(u64) -> (Vec<u8>, Vec<u8>) {
    move |i| {
        (
            data::random_key(seed, i).to_vec(),
            data::half_compressible_value(seed, i),
        )
    }
}

/// Random index below `n` number `i` of a read stream (deterministic).
fn pick(seed: u64, i: u64, n: u64) -> u64 {
    data::splitmix64(seed ^ 0x5EED ^ i.wrapping_mul(31)) % n.max(1)
}

fn point_reads(kv: &dyn BenchKv, spec: &ChildSpec, rows: u64) -> anyhow::Result<ReadStats> {
    let mut ticker = Ticker::new("read");
    let start = Instant::now();
    let limit = Duration::from_secs(spec.max_seconds);
    let mut st = ReadStats::default();
    while st.ops < spec.reads {
        let idx = pick(spec.seed, st.ops, rows);
        let key = data::random_key(spec.seed, idx);
        match kv.get(&key)? {
            Some(v) if v == data::half_compressible_value(spec.seed, idx) => {}
            _ => st.misses += 1,
        }
        st.ops += 1;
        if st.ops % 1024 == 0 {
            ticker.tick(st.ops);
            if start.elapsed() >= limit {
                break;
            }
        }
    }
    ticker.finish(st.ops);
    st.secs = start.elapsed().as_secs_f64();
    st.ops_per_sec = st.ops as f64 / st.secs.max(1e-9);
    st.rows_per_sec = st.ops_per_sec;
    Ok(st)
}

fn scans(kv: &dyn BenchKv, spec: &ChildSpec) -> anyhow::Result<ReadStats> {
    let mut ticker = Ticker::new("scan");
    let start = Instant::now();
    let limit = Duration::from_secs(spec.max_seconds);
    let mut st = ReadStats::default();
    let mut rows_read = 0u64;
    while st.ops < spec.reads {
        // A random start key (not necessarily present): the scan seeks, then streams.
        let start_key = data::random_key(spec.seed ^ 0x5CA7, st.ops);
        let n = kv.scan_count(&start_key, spec.scan_len)?;
        rows_read += n as u64;
        st.ops += 1;
        if st.ops % 64 == 0 {
            ticker.tick(st.ops);
            if start.elapsed() >= limit {
                break;
            }
        }
    }
    ticker.finish(st.ops);
    st.secs = start.elapsed().as_secs_f64();
    st.ops_per_sec = st.ops as f64 / st.secs.max(1e-9);
    st.rows_per_sec = rows_read as f64 / st.secs.max(1e-9);
    Ok(st)
}

fn instant_ddl(kv: &dyn BenchKv, spec: &ChildSpec, rows: u64) -> anyhow::Result<DdlStats> {
    let mut st = DdlStats::default();
    // Keys are uniform, so [00.., 80..) holds about half of them; count exactly.
    st.delete_range_keys = (0..rows)
        .filter(|&i| data::random_key(spec.seed, i)[0] < 0x80)
        .count() as u64;
    st.broadcast_keys = rows - st.delete_range_keys;
    let end = [0x80u8];
    let t = Instant::now();
    kv.delete_range(&[], &end)?;
    st.delete_range_ms = t.elapsed().as_secs_f64() * 1e3;
    emit("progress delete-range 1 0");
    let suffix = b"+col".to_vec();
    let t = Instant::now();
    kv.upsert_all(&UpsertOp::Append(suffix.clone()))?;
    st.broadcast_ms = t.elapsed().as_secs_f64() * 1e3;
    emit("progress broadcast 1 0");
    let t = Instant::now();
    kv.checkpoint()?;
    st.checkpoint_after_ms = t.elapsed().as_secs_f64() * 1e3;
    // Verify a sample of keys: deleted ones absent, the others carry the new column.
    let samples = rows.min(20_000);
    for i in 0..samples {
        let idx = pick(spec.seed, i, rows);
        let key = data::random_key(spec.seed, idx);
        let got = kv.get(&key)?;
        let ok = if key[0] < 0x80 {
            got.is_none()
        } else {
            let mut want = data::half_compressible_value(spec.seed, idx);
            want.extend_from_slice(&suffix);
            got.as_deref() == Some(want.as_slice())
        };
        st.verified_keys += 1;
        if !ok {
            st.wrong += 1;
        }
    }
    // And the first keys in order must all lie at or after the deleted range.
    if rows > 0 && kv.scan_count(&[], 1)? == 1 && kv.scan_count(&end, 1)? != 1 {
        st.wrong += 1;
    }
    Ok(st)
}

/// Runs the child described by `spec_json`; prints the result line. Errors end the child with
/// a message on stderr and a non-zero exit.
pub fn run_child(spec_json: &str) -> anyhow::Result<()> {
    let spec: ChildSpec = serde_json::from_str(spec_json)?;
    // Wait for the parent to put us into the memory cgroup.
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go)?;
    std::fs::create_dir_all(&spec.dir)?;
    let kv = kv::open(spec.engine, &spec.dir, spec.cache_size_bytes, spec.zstd_level)?;
    let kv = kv.as_ref();
    let mut out = ChildResult::default();
    let seed = spec.seed;
    match spec.workload {
        Workload::RandomInsert | Workload::BeyondMemory => {
            load(kv, spec.rows, spec.max_seconds, &random_row(seed), &mut out)?;
            out.ops_per_sec = out.insert_rows_per_sec;
            finish_sizes(kv, &spec, &mut out)?;
            notes(kv, "after the load");
        }
        Workload::PointRead | Workload::Scan => {
            load(kv, spec.rows, spec.max_seconds, &random_row(seed), &mut out)?;
            finish_sizes(kv, &spec, &mut out)?;
            notes(kv, "after the load");
            let st = if spec.workload == Workload::PointRead {
                point_reads(kv, &spec, out.rows_written)?
            } else {
                scans(kv, &spec)?
            };
            notes(kv, "after the reads");
            out.ops_per_sec = st.ops_per_sec;
            out.reads = Some(st);
        }
        Workload::Compression => {
            let rows = spec.rows;
            let row = move |i: u64| {
                if i.is_multiple_of(2) {
                    data::seed_table_row(SeedTable::Timeline1009, seed, i / 2)
                } else {
                    data::seed_table_row(SeedTable::UserSummary, seed, i / 2)
                }
            };
            load(kv, rows * 2, spec.max_seconds, &row, &mut out)?;
            out.ops_per_sec = out.insert_rows_per_sec;
            kv.settle()?;
            kv.checkpoint()?;
            finish_sizes(kv, &spec, &mut out)?;
        }
        Workload::InstantDdl => {
            load(kv, spec.rows, u64::MAX / 4, &random_row(seed), &mut out)?;
            let st = instant_ddl(kv, &spec, out.rows_written)?;
            out.ops_per_sec = out.insert_rows_per_sec;
            finish_sizes(kv, &spec, &mut out)?;
            out.ddl = Some(st);
        }
    }
    out.peak_rss_bytes = vm_hwm_bytes("self").unwrap_or(0);
    out.cpu_secs = cpu_secs_self();
    emit(&format!("result {}", serde_json::to_string(&out)?));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(engine: EngineName, dir: &std::path::Path, workload: Workload) -> ChildSpec {
        ChildSpec {
            engine,
            workload,
            rows: 3000,
            cache_size_bytes: 16 << 20,
            zstd_level: 1,
            dir: dir.to_path_buf(),
            seed: 9,
            reads: 2000,
            scan_len: 50,
            max_seconds: 600,
        }
    }

    /// Every engine loads, reads back every sampled key, scans in full pages, and applies the
    /// instant-DDL pair with correct reads afterwards.
    #[test]
    fn workloads_are_correct_on_every_engine() {
        let mut engines = vec![EngineName::Fractal, EngineName::Sled, EngineName::Fjall];
        if cfg!(feature = "rocksdb") {
            engines.push(EngineName::Rocksdb);
        }
        for engine in engines {
            let tmp = tempfile::tempdir().unwrap();
            let s = spec(engine, tmp.path(), Workload::InstantDdl);
            let kv = kv::open(engine, &s.dir, s.cache_size_bytes, s.zstd_level).unwrap();
            let mut out = ChildResult::default();
            load(kv.as_ref(), s.rows, s.max_seconds, &random_row(s.seed), &mut out).unwrap();
            assert_eq!(out.rows_written, 3000, "{engine:?}");
            assert_eq!(out.logical_bytes, 3000 * 116);
            assert!(out.rate_first_tenth > 0.0 && out.rate_last_tenth > 0.0);
            let reads = point_reads(kv.as_ref(), &s, s.rows).unwrap();
            assert_eq!((reads.ops, reads.misses), (2000, 0), "{engine:?}");
            // A scan from the smallest key returns a full page.
            assert_eq!(kv.scan_count(&[], 50).unwrap(), 50, "{engine:?}");
            let ddl = instant_ddl(kv.as_ref(), &s, s.rows).unwrap();
            assert_eq!(ddl.wrong, 0, "{engine:?}");
            assert_eq!(ddl.verified_keys, 3000);
            assert!(ddl.delete_range_keys > 1000 && ddl.delete_range_keys < 2000);
            // Exactly the keys outside the deleted range are left.
            assert_eq!(
                kv.scan_count(&[], 10_000).unwrap() as u64,
                ddl.broadcast_keys,
                "{engine:?}"
            );
            assert!(kv::dir_allocated_bytes(tmp.path()) > 0);
        }
    }
}
