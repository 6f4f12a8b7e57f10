//! Bulk-load throughput of the fractal tree alone (issue 18): N generated `user_summary`-like
//! rows (key: 8-byte big-endian id, value: ~40 bytes) into a fresh FractalEngine, sorted and
//! unsorted input, then a checkpoint; prints rows/s.
//!
//! `cargo run --release -p ftkv-engine --example bulk_load_bench -- [ROWS] [DIR]`
//! (default 2,000,000 rows in a temporary directory; zstd level 1, 256 MiB cache, 64 MiB sort
//! memory).

use std::time::Instant;

use ftkv_engine::{BulkLoadOptions, Engine, EngineOptions, FractalEngine, KeyValue, OnDuplicate};

fn row(id: u64) -> KeyValue {
    // user_id, visits, last_seen, country, plan: about 40 bytes of value.
    let value = format!(
        "{:010}|{:06}|{:013}|{}|{}",
        id.wrapping_mul(2654435761) % 10_000_000_000,
        id % 997,
        1_700_000_000_000u64 + id,
        ["DE", "US", "FR", "JP"].get((id % 4) as usize).unwrap_or(&"DE"),
        if id.is_multiple_of(2) { "free" } else { "pro" }
    );
    (id.to_be_bytes().to_vec(), value.into_bytes())
}

fn run(
    label: &str,
    n: u64,
    dir: &std::path::Path,
    order: impl Fn(u64) -> u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let opts = EngineOptions {
        dir: dir.join(label),
        cache_size_bytes: 256 << 20,
        compression_level: Some(1),
    };
    let e = FractalEngine::open(ftkv_vfs::RealVfs::new(), &opts)?;
    let load = BulkLoadOptions {
        on_duplicate: OnDuplicate::Error,
        sort_memory_bytes: 64 << 20,
    };
    let started = Instant::now();
    let mut rows = (0..n).map(|i| Ok(row(order(i))));
    let report = e.bulk_load(&mut rows, &load, &[], Some(b"bench"))?;
    let loaded = started.elapsed();
    e.checkpoint()?;
    let total = started.elapsed();
    println!(
        "{label}: {n} rows, load {:.2}s ({:.0} rows/s), with checkpoint {:.2}s ({:.0} rows/s); {} runs spilled, {} leaves, {} MB on disk",
        loaded.as_secs_f64(),
        n as f64 / loaded.as_secs_f64(),
        total.as_secs_f64(),
        n as f64 / total.as_secs_f64(),
        report.runs_spilled,
        report.leaves_built,
        e.size_on_disk_bytes()? >> 20
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2_000_000);
    let tmp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| tmp.path().to_path_buf(), std::path::PathBuf::from);
    run("sorted", n, &dir, |i| i)?;
    // A permutation of 0..n (n coprime with the multiplier for the default sizes).
    let mul = 2_654_435_761u64;
    run("unsorted", n, &dir, move |i| (i.wrapping_mul(mul)) % n)?;
    Ok(())
}
