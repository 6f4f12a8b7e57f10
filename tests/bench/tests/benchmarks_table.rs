//! BENCHMARKS.md opens with a table generated from `tests/bench/results/*/summary.json`
//! (`ftkv-bench table`): this fails when the committed table and the committed results differ,
//! so a figure cannot be edited by hand or left stale when results are replaced.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn benchmarks_md_table_is_generated_from_the_results() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let results = repo.join("tests/bench/results");
    let out = Command::new(env!("CARGO_BIN_EXE_ftkv-bench"))
        .arg("table")
        .arg("--results")
        .arg(&results)
        .arg("--check")
        .arg(repo.join("BENCHMARKS.md"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The table is not empty: at least one workload's figures are committed.
    let summaries = std::fs::read_dir(&results)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("summary.json").is_file())
        .count();
    assert!(summaries > 0, "no tests/bench/results/*/summary.json committed");
}
