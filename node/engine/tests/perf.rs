#![allow(clippy::unwrap_used)]
//! Quick in-process throughput figures (not a benchmark harness: ftkv-bench is). Ignored by
//! default; run with
//! `cargo test -p ftkv-engine --release --test perf -- --ignored --nocapture`
//! (`FTKV_PERF_ROWS` sets the row count, default 1,000,000; `FTKV_PERF_ENGINES=fractal,sled`;
//! `FTKV_PERF_CACHE_MB`, default 512).

use std::time::Instant;

use ftkv_engine::{open_engine, EngineKind, EngineOptions, WriteOp};

fn rows() -> u64 {
    std::env::var("FTKV_PERF_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn cache_mb() -> u64 {
    std::env::var("FTKV_PERF_CACHE_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn key(i: u64) -> Vec<u8> {
    let mut k = mix(i).to_be_bytes().to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u64) -> Vec<u8> {
    // 100 bytes, half compressible.
    let mut v = Vec::with_capacity(100);
    for j in 0..50u64 {
        v.push(mix(i * 131 + j) as u8);
    }
    v.resize(100, b'x');
    v
}

fn run(kind: EngineKind, n: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let opts = EngineOptions {
        dir: tmp.path().join("e"),
        cache_size_bytes: 512 << 20,
        compression_level: Some(1),
    };
    let e = open_engine(kind, &opts).unwrap();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let ops: Vec<WriteOp> = (i..(i + 1000).min(n))
            .map(|j| WriteOp::Put {
                key: key(j),
                value: value(j),
            })
            .collect();
        e.write(&ops, None).unwrap();
        i += 1000;
    }
    let ins = t.elapsed();
    let t = Instant::now();
    e.checkpoint().unwrap();
    let ckpt = t.elapsed();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss: Vec<&str> = status
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
        .collect();
    eprintln!(
        "{:>8}: {}",
        kind.as_str(),
        rss.join(" | ").split_whitespace().collect::<Vec<_>>().join(" ")
    );
    let reads = n.min(200_000);
    let t = Instant::now();
    for r in 0..reads {
        let j = mix(r ^ 0x5555) % n;
        assert_eq!(e.get(&key(j)).unwrap(), Some(value(j)));
    }
    let rd = t.elapsed();
    let t = Instant::now();
    let scanned = e.scan(b"", None, usize::MAX).unwrap().len();
    let sc = t.elapsed();
    assert_eq!(scanned as u64, n);
    eprintln!(
        "{:>8}: {n} random inserts {:>9.0}/s | checkpoint {:?} | {reads} point reads {:>9.0}/s | full scan {:>10.0} rows/s | {} MB on disk",
        kind.as_str(),
        n as f64 / ins.as_secs_f64(),
        ckpt,
        reads as f64 / rd.as_secs_f64(),
        n as f64 / sc.as_secs_f64(),
        e.size_on_disk_bytes().unwrap() / 1_000_000,
    );
}

#[test]
#[ignore = "throughput figures; run manually in release"]
fn random_inserts_and_point_reads_fractal_vs_sled() {
    let n = rows();
    let engines = std::env::var("FTKV_PERF_ENGINES").unwrap_or_else(|_| "fractal,sled".into());
    for name in engines.split(',') {
        match name {
            "fractal" => run(EngineKind::Fractal, n),
            "sled" => run(EngineKind::Sled, n),
            other => panic!("unknown engine {other}"),
        }
    }
}

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Cache bytes counted by the engine vs the process RSS while inserting past the budget.
#[test]
#[ignore = "memory figures; run manually in release"]
fn fractal_cache_budget_vs_rss() {
    let n = rows();
    let tmp = tempfile::tempdir().unwrap();
    let opts = EngineOptions {
        dir: tmp.path().join("e"),
        cache_size_bytes: cache_mb() << 20,
        compression_level: Some(1),
    };
    let e = ftkv_engine::fractal::FractalEngine::open(ftkv_vfs::RealVfs::new(), &opts).unwrap();
    let mut i = 0;
    while i < n {
        let ops: Vec<WriteOp> = (i..(i + 1000).min(n))
            .map(|j| WriteOp::Put {
                key: key(j),
                value: value(j),
            })
            .collect();
        ftkv_engine::Engine::write(&e, &ops, None).unwrap();
        i += 1000;
        if i % (n / 10).max(1000) == 0 {
            eprintln!(
                "{i:>9} rows: cached {:>6} KiB, RSS {:>7} KiB",
                e.cached_bytes() >> 10,
                rss_kb()
            );
        }
    }
}
