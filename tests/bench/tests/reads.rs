//! Smoke run of `ftkv-bench reads`: 500 preloaded keys, 4 clients, one second a phase, one
//! round, against ftkv and (when it can run) etcd.

#![allow(clippy::unwrap_used)]

mod common;

use common::{num, read_json, run_bench, targets_with_etcd};

#[test]
fn reads_return_the_preloaded_values_and_full_scans() {
    // Three targets of 20 ports each, below the ephemeral range (see ftkv_bench::ports).
    let base_port = ftkv_bench::ports::free_port_block(60).unwrap().to_string();
    let targets = targets_with_etcd(&["ftkv"]);
    let out = tempfile::tempdir().unwrap();
    let joined = targets.join(",");
    let dir = out.path().to_str().unwrap();
    run_bench(&[
        "reads",
        "--targets",
        &joined,
        "--clients",
        "4",
        "--duration",
        "1s",
        "--runs",
        "1",
        "--keys",
        "500",
        "--scan-rows",
        "100",
        "--base-port",
        &base_port,
        "--out",
        dir,
    ]);
    let r = read_json(out.path(), "results.json");
    let kinds = ["linearizable-get", "serializable-get", "scan-100"];
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), kinds.len() * targets.len());
    for run in runs {
        let reads = num(run, "reads");
        assert!(reads > 0.0 && num(run, "reads_per_sec") > 0.0, "{run}");
        // Every answer was checked against the preloaded value (the bench also fails on any).
        assert_eq!(run["wrong"], 0, "{run}");
        let rows_per_read = if run["kind"] == "scan-100" { 100.0 } else { 1.0 };
        assert_eq!(num(run, "rows"), reads * rows_per_read, "{run}");
        assert!(
            num(&run["latency_ms"], "p99") >= num(&run["latency_ms"], "p50"),
            "{run}"
        );
        assert!(num(&run["cpu"], "per_write_us") > 0.0, "{run}");
    }
    let medians = r["medians"].as_array().unwrap();
    for t in &targets {
        for k in kinds {
            let m = medians
                .iter()
                .find(|m| m["target"] == t.as_str() && m["kind"] == k)
                .unwrap_or_else(|| panic!("{t} lacks {k}"));
            assert!(num(m, "reads_per_sec") > 0.0, "{m}");
        }
    }
    for ratio in r["ratios"].as_array().unwrap() {
        let pairs = ratio[1].as_array().unwrap();
        assert_eq!(pairs.len(), targets.len() - 1, "{ratio}");
        assert!(pairs.iter().all(|p| p[1].as_f64().unwrap() > 0.0), "{ratio}");
    }
    let summary = ftkv_bench::summary::Summary::read(out.path()).unwrap();
    assert_eq!(summary.workload, "reads");
    assert_eq!(summary.rows.len(), kinds.len() * 2);
    assert!(summary.rows.iter().all(|row| row.values.len() == targets.len()));
    for svg in ["reads_per_sec.svg", "latency_p99.svg"] {
        let text = std::fs::read_to_string(out.path().join(svg)).unwrap();
        // One bar per target and phase, plus the background.
        assert_eq!(
            text.matches("<rect").count(),
            kinds.len() * targets.len() + 1,
            "{svg}"
        );
    }
}
