//! Shared pieces of the storage-workload smoke tests (compression, beyond-memory,
//! instant-ddl): the real `ftkv-bench` binary (with the `ftkv-node` beside it in the same target
//! directory), etcd when installed, and reading the JSON it wrote.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

// etcd's presence is decided as for the cluster-workload smoke tests.
#[path = "../common/mod.rs"]
mod common;
#[allow(unused_imports)] // beyond-memory runs no etcd target.
pub use common::etcd_available;

/// The `ftkv-bench` binary of this build; panics with the fix when `ftkv-node` was not built
/// into the same directory (`cargo test --workspace` builds it; a lone `-p ftkv-bench` does not).
pub fn bench() -> Command {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ftkv-bench"));
    let node = bin.with_file_name("ftkv-node");
    assert!(
        node.is_file(),
        "{} not found: build it first (`cargo build -p ftkv-node --bins`)",
        node.display()
    );
    Command::new(bin)
}

/// Runs `cmd`, echoing its output, and panics unless it succeeded; returns its stdout.
pub fn run(mut cmd: Command) -> String {
    let started = std::time::Instant::now();
    let out = cmd.output().expect("cannot run ftkv-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    println!("{stdout}");
    eprintln!("{stderr}");
    eprintln!("(ran in {:.1} s)", started.elapsed().as_secs_f64());
    assert!(
        out.status.success(),
        "ftkv-bench failed ({}): {stderr}",
        out.status
    );
    stdout
}

/// `dir/name` parsed as JSON.
pub fn json(dir: &Path, name: &str) -> serde_json::Value {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Asserts `dir/name` is an SVG with at least one drawn element `element` (`<rect`, `<polyline`).
pub fn assert_svg(dir: &Path, name: &str, element: &str) {
    let path = dir.join(name);
    let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        svg.starts_with("<svg") && svg.ends_with("</svg>\n"),
        "{}",
        path.display()
    );
    assert!(svg.contains(element), "{} has no {element}", path.display());
}

/// Asserts `dir/summary.json` names `workload` and that every row has a positive value for each
/// of `every_row` and otherwise only targets of `targets`, in their order; returns it.
pub fn assert_summary(dir: &Path, workload: &str, targets: &[&str], every_row: &[&str]) -> serde_json::Value {
    let s = json(dir, "summary.json");
    assert_eq!(s["workload"], workload);
    assert!(s["machine"].as_str().unwrap().contains("cores"));
    assert!(s["command"].as_str().unwrap().starts_with("ftkv-bench "));
    let rows = s["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for row in rows {
        let values = row["values"].as_array().unwrap();
        let names: Vec<&str> = values.iter().map(|v| v[0].as_str().unwrap()).collect();
        let in_order: Vec<&str> = targets.iter().copied().filter(|t| names.contains(t)).collect();
        assert_eq!(names, in_order, "{row}");
        for t in every_row {
            assert!(names.contains(t), "{t} missing in {row}");
        }
        for v in values {
            assert!(v[1].as_f64().unwrap() > 0.0, "{row}");
        }
    }
    s
}
