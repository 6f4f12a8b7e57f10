//! Smoke run of `ftkv-bench sysbench-insert` (issue 19, acceptance 3): seconds of the seed's
//! random inserts against ftkv, etcd and MariaDB semi-sync, tiny tables, so the workload cannot
//! rot. Figures are not judged (the machine is shared); what is checked is that every target ran,
//! acknowledged writes, wrote its results and summary, printed sysbench's layout, and that the
//! MariaDB run passed its own validity checks (both slaves hold the master's rows, semi-sync
//! never fell back).
//!
//! The peers come from Debian (`tests/bench/install-peers.sh`, which `.ci/run` runs). A missing
//! peer is reported as `NOT RUN` and left out, unless `FTKV_BENCH_PEERS_REQUIRED=1` (set by
//! `.ci/run`), which makes it a failure. ftkv itself is never optional: the test fails when
//! `ftkv-node` is not built beside `ftkv-bench` (`cargo build --workspace --bins` builds it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn bench_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ftkv-bench"))
}

fn on_path(name: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|d| Path::new(d).join(name).is_file())
}

/// The peer targets whose programs are installed; the others are `NOT RUN` (or a failure when
/// peers are required).
fn peer_targets() -> Vec<&'static str> {
    let required = std::env::var("FTKV_BENCH_PEERS_REQUIRED").as_deref() == Ok("1");
    let mut targets = Vec::new();
    for (target, programs) in [
        ("etcd", &["etcd"][..]),
        (
            "mariadb-semisync",
            &["mariadbd", "mariadb-install-db", "sysbench"][..],
        ),
    ] {
        let missing: Vec<&str> = programs.iter().copied().filter(|p| !on_path(p)).collect();
        if missing.is_empty() {
            targets.push(target);
        } else if required {
            panic!(
                "FTKV_BENCH_PEERS_REQUIRED=1 but {target} is missing {missing:?}: \
                 run tests/bench/install-peers.sh"
            );
        } else {
            eprintln!("NOT RUN: {target} ({missing:?} not installed; tests/bench/install-peers.sh)");
        }
    }
    targets
}

#[test]
fn sysbench_insert_smoke_runs_every_target() {
    let node = bench_bin().with_file_name("ftkv-node");
    assert!(
        node.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        node.display()
    );
    let mut targets = vec!["ftkv"];
    targets.extend(peer_targets());
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(bench_bin())
        .args(["sysbench-insert", "--targets", &targets.join(",")])
        .args(["--clients", "4", "--duration", "2s", "--runs", "1"])
        .args(["--tables", "2", "--table-size", "100"])
        .args([
            "--mariadb-buffer-pool-size",
            "16M",
            "--mariadb-log-file-size",
            "16M",
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "ftkv-bench sysbench-insert failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for line in ["SQL statistics:", "95th percentile:", "99th percentile:"] {
        assert!(
            stdout.contains(line),
            "{line:?} missing from the summary:\n{stdout}"
        );
    }

    let results: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    let runs = results["runs"].as_array().unwrap();
    assert_eq!(runs.len(), targets.len(), "one run per target: {results:#}");
    for (run, target) in runs.iter().zip(&targets) {
        assert_eq!(run["target"], *target);
        assert_eq!(run["valid"], true, "{target}: {:#}", run["problems"]);
        assert!(run["writes"].as_u64().unwrap() > 0, "{target}: no write");
        assert!(run["writes_per_sec"].as_f64().unwrap() > 0.0);
        let p99 = run["latency_ms"]["p99"].as_f64().unwrap();
        assert!(p99 > 0.0 && p99 >= run["latency_ms"]["min"].as_f64().unwrap());
        assert!(
            run["cpu"]["per_write_us"].as_f64().unwrap() > 0.0,
            "{target}: no CPU measured"
        );
        assert!(!run["per_second"].as_array().unwrap().is_empty());
        if *target == "mariadb-semisync" {
            let checks = &run["mariadb"];
            let rows: Vec<u64> = checks["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap())
                .collect();
            assert_eq!(rows.len(), 3, "master and two slaves: {checks:#}");
            assert!(rows[0] >= 200, "prepare loaded 2 x 100 rows: {rows:?}");
            assert!(
                rows.iter().all(|r| *r == rows[0]),
                "slaves differ from the master: {rows:?}"
            );
            assert_eq!(checks["semi_sync_no_tx"], 0, "semi-sync fell back: {checks:#}");
            assert_eq!(checks["semi_sync_no_times"], 0, "semi-sync fell back: {checks:#}");
            assert!(checks["semi_sync_yes_tx"].as_u64().unwrap() > 0);
        }
    }

    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["workload"], "sysbench-insert");
    let rows = summary["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "writes/s, p99, CPU per write: {summary:#}");
    for row in rows {
        let values = row["values"].as_array().unwrap();
        assert_eq!(values.len(), targets.len(), "{row:#}");
        assert!(values.iter().all(|v| v[1].as_f64().unwrap() > 0.0), "{row:#}");
    }
    for chart in ["writes_per_sec.svg", "latency_p99.svg", "writes_over_time.svg"] {
        let svg = std::fs::read_to_string(out.path().join(chart)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("ftkv"), "{chart}");
    }
}
