//! Smoke run of `ftkv-bench failover`: 4 writers, one second before the kill, one second down,
//! one round, against ftkv and (when it can run) etcd.

#![allow(clippy::unwrap_used)]

mod common;

use common::{assert_svg, num, read_json, run_bench, targets_with_etcd};

#[test]
fn failover_resumes_writes_and_the_killed_leader_catches_up() {
    // Three targets of 20 ports each, below the ephemeral range (see ftkv_bench::ports).
    let base_port = ftkv_bench::ports::free_port_block(60).unwrap().to_string();
    let targets = targets_with_etcd(&["ftkv"]);
    let out = tempfile::tempdir().unwrap();
    let joined = targets.join(",");
    let dir = out.path().to_str().unwrap();
    run_bench(&[
        "failover",
        "--targets",
        &joined,
        "--clients",
        "4",
        "--runs",
        "1",
        "--settle",
        "1s",
        "--down",
        "1s",
        "--timeout",
        "40s",
        "--key-space",
        "1000",
        "--base-port",
        &base_port,
        "--out",
        dir,
    ]);
    let r = read_json(out.path(), "results.json");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), targets.len());
    for (run, t) in runs.iter().zip(&targets) {
        assert_eq!(run["target"], t.as_str());
        assert_ne!(run["killed"], run["new_leader"], "{}", run["killed"]);
        let (kill, restart, caught) = (
            num(run, "kill_at_s"),
            num(run, "restart_at_s"),
            num(run, "caught_up_at_s"),
        );
        assert!(
            kill > 0.0 && restart > kill && caught >= restart,
            "{kill} {restart} {caught}"
        );
        assert!(num(run, "write_pause_ms") > 0.0);
        assert!(num(run, "catch_up_ms") > 0.0 && num(run, "catch_up_index") > 0.0);
        let bins = run["bins"].as_array().unwrap();
        let acked_in = |from: f64, to: f64| {
            bins.iter()
                .filter(|b| num(b, "t_s") >= from && num(b, "t_s") < to)
                .map(|b| num(b, "puts_per_sec") / 10.0)
                .sum::<f64>()
        };
        // Writes before the kill, after it (resumed) and after the catch-up.
        assert!(acked_in(0.0, kill) > 0.0);
        assert!(acked_in(kill, restart) > 0.0);
        assert!(acked_in(caught, f64::MAX) > 0.0);
        assert_eq!(
            bins.iter()
                .map(|b| num(b, "puts_per_sec") / 10.0)
                .sum::<f64>()
                .round(),
            num(run, "acked")
        );
        let name = format!("{t}_run1");
        assert_svg(out.path(), &format!("over_time_{name}.svg"), 4);
        assert_svg(out.path(), &format!("latency_{name}.svg"), 4);
    }
    let medians = r["medians"].as_array().unwrap();
    assert_eq!(medians.len(), targets.len());
    assert_eq!(
        r["ratios_write_pause"].as_array().unwrap().len(),
        targets.len() - 1
    );
    let summary = ftkv_bench::summary::Summary::read(out.path()).unwrap();
    assert_eq!(summary.workload, "failover");
    assert_eq!(summary.rows.len(), 2);
    assert!(summary.rows.iter().all(|row| row.values.len() == targets.len()));
}
