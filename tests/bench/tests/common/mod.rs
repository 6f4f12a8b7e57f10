//! What the cluster-workload smoke tests share: running the real `ftkv-bench` binary (with the
//! `ftkv-node` of the same target directory, or `FTKV_BIN_DIR`) and deciding whether etcd runs.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `ftkv-bench` binary cargo built for these tests.
pub fn bench_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ftkv-bench"))
}

/// Fails with how to fix it when the `ftkv-node` the bench will start is missing (the bench
/// looks in `FTKV_BIN_DIR`, else beside itself).
pub fn require_node() {
    let dir = match std::env::var("FTKV_BIN_DIR") {
        Ok(d) => PathBuf::from(d),
        Err(_) => bench_exe().parent().unwrap().to_path_buf(),
    };
    assert!(
        dir.join("ftkv-node").is_file(),
        "{} missing: run `cargo build -p ftkv-node` (cargo test --workspace builds it) or set FTKV_BIN_DIR",
        dir.join("ftkv-node").display()
    );
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|v| v.split_whitespace().next() == Some("0"))
        })
        .unwrap_or(false)
}

fn etcd_found() -> bool {
    ftkv_bench::etcd::etcd_binary().is_ok_and(|p| p.is_file())
}

/// Whether etcd can run: found (`ETCD_BIN` or `etcd` on PATH, as the bench finds it, and the
/// file exists), else installed from Debian's `etcd-server` when root (after `apt-get update`
/// if the first try fails). When it is still missing, fails if `FTKV_BENCH_PEERS_REQUIRED=1`,
/// else prints `NOT RUN: etcd missing` and returns false.
pub fn etcd_available() -> bool {
    if !etcd_found() && is_root() {
        let install = || {
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "etcd-server"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if !install() {
            let _ = Command::new("apt-get").args(["update", "-qq"]).status();
            let _ = install();
        }
    }
    if etcd_found() {
        return true;
    }
    assert!(
        std::env::var("FTKV_BENCH_PEERS_REQUIRED").as_deref() != Ok("1"),
        "etcd is missing and FTKV_BENCH_PEERS_REQUIRED=1"
    );
    println!("NOT RUN: etcd missing");
    false
}

/// `ftkv`-family targets plus `etcd` when it can run, comma-separated.
pub fn targets_with_etcd(ftkv_targets: &[&str]) -> Vec<String> {
    let mut t: Vec<String> = ftkv_targets.iter().map(|s| s.to_string()).collect();
    if etcd_available() {
        t.push("etcd".to_string());
    }
    t
}

/// Runs `ftkv-bench ARGS`, echoing its output, and fails unless it succeeds.
pub fn run_bench(args: &[&str]) {
    require_node();
    let out = Command::new(bench_exe()).args(args).output().unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "ftkv-bench {args:?} failed: {:?}",
        out.status
    );
}

/// `dir/name` parsed as JSON.
pub fn read_json(dir: &Path, name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// A number field of a JSON object.
pub fn num(v: &serde_json::Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {v}"))
}

/// An SVG file in `dir` with at least `lines` polylines.
pub fn assert_svg(dir: &Path, name: &str, lines: usize) {
    let svg = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(svg.starts_with("<svg"), "{name} is not an SVG");
    assert!(
        svg.matches("<polyline").count() >= lines,
        "{name} has fewer than {lines} lines"
    );
}
