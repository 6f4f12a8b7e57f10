//! `ftkv-bench engine --engines ...,rocksdb` through the real binary: without the `rocksdb`
//! feature it fails before any run with the message that says how to build it; with the
//! feature a tiny side-by-side run of fractal and RocksDB completes with sane figures.
//! (The adapter's model check against a BTreeMap is a unit test in `src/engine/rocks.rs`.)

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

fn engine_run(dir: &Path, workload: &str, engines: &str, json: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ftkv-bench"))
        .args(["engine", "--workload", workload, "--engines", engines])
        .args(["--rows", "3000", "--reads", "2000", "--runs", "1"])
        .args(["--cache-size", "16MiB", "--max-seconds", "120"])
        .arg("--dir")
        .arg(dir.join("engines"))
        .arg("--json")
        .arg(json)
        .output()
        .unwrap()
}

#[cfg(not(feature = "rocksdb"))]
#[test]
fn rocksdb_without_the_feature_fails_up_front_with_the_build_command() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("r.json");
    let out = engine_run(tmp.path(), "random-insert", "fractal,rocksdb", &json);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stderr: {stderr}");
    assert!(
        stderr.contains(
            "ftkv-bench was built without the `rocksdb` feature: \
             cargo build --release -p ftkv-bench --features rocksdb"
        ),
        "stderr: {stderr}"
    );
    // Refused while parsing --engines: no engine ran (not even fractal), no report written.
    assert!(!stderr.contains("== round"), "stderr: {stderr}");
    assert!(!json.exists());
}

#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_runs_beside_fractal_with_sane_figures() {
    for workload in ["random-insert", "point-read", "compression"] {
        let tmp = tempfile::tempdir().unwrap();
        let json = tmp.path().join("r.json");
        let out = engine_run(tmp.path(), workload, "fractal,rocksdb", &json);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{workload}: {stderr}");
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let results = report["results"].as_array().unwrap();
        let rocks = results.iter().find(|r| r["engine"] == "rocksdb").unwrap();
        assert_eq!(rocks["runs_completed"], 1, "{workload}: {rocks}");
        assert_eq!(rocks["wrong_reads"], 0, "{workload}: {rocks}");
        let rows = if workload == "compression" { 6000.0 } else { 3000.0 };
        assert_eq!(rocks["rows_reached"].as_f64(), Some(rows), "{workload}");
        assert!(rocks["ops_per_sec"].as_f64().unwrap() > 0.0, "{workload}");
        // The rows sit in SST files after the final flush: more than a tenth of the raw bytes,
        // less than twice them plus the 4 MiB RocksDB preallocates for its MANIFEST and 1 MiB.
        let on_disk = rocks["bytes_on_disk"].as_f64().unwrap();
        let logical = rocks["logical_bytes"].as_f64().unwrap();
        let manifest = (4u64 << 20) as f64;
        assert!(
            on_disk > logical / 10.0 && on_disk < manifest + (1 << 20) as f64 + 2.0 * logical,
            "{workload}: {rocks}"
        );
        let ratios = report["ratios"].as_array().unwrap();
        assert!(
            ratios.iter().any(|r| r[0] == "ops_per_sec: fractal / rocksdb"),
            "{workload}: {ratios:?}"
        );
        // RocksDB's own counters are printed after a load (not in the compression workload).
        assert!(
            workload == "compression" || stderr.contains("engine counters after the load: block cache"),
            "{workload}: {stderr}"
        );
    }
}
