//! Smoke run of `ftkv-bench scaling`: two client counts, two value sizes, one second a point,
//! one round, against ftkv, ftkv-sled and (when it can run) etcd.

#![allow(clippy::unwrap_used)]

mod common;

use common::{assert_svg, num, read_json, run_bench, targets_with_etcd};

#[test]
fn scaling_runs_every_point_of_every_target() {
    // Three targets of 20 ports each, below the ephemeral range (see ftkv_bench::ports).
    let base_port = ftkv_bench::ports::free_port_block(60).unwrap().to_string();
    let targets = targets_with_etcd(&["ftkv", "ftkv-sled"]);
    let out = tempfile::tempdir().unwrap();
    let joined = targets.join(",");
    let dir = out.path().to_str().unwrap();
    run_bench(&[
        "scaling",
        "--targets",
        &joined,
        "--clients",
        "1,4",
        "--value-sizes",
        "100,1024",
        "--duration",
        "1s",
        "--runs",
        "1",
        "--key-space",
        "1000",
        "--base-port",
        &base_port,
        "--out",
        dir,
    ]);
    let r = read_json(out.path(), "results.json");
    let points = [(100, 1), (100, 4), (1024, 1), (1024, 4)];
    let medians = r["medians"].as_array().unwrap();
    assert_eq!(medians.len(), points.len() * targets.len());
    assert_eq!(r["runs"].as_array().unwrap().len(), points.len() * targets.len());
    for t in &targets {
        for (v, c) in points {
            let m = medians
                .iter()
                .find(|m| m["target"] == t.as_str() && m["clients"] == c && m["value_size_bytes"] == v)
                .unwrap_or_else(|| panic!("{t} lacks the point {c} clients, {v} B"));
            assert_eq!(m["runs"], 1, "{m}");
            assert!(num(m, "puts_per_sec") > 0.0, "{m}");
            assert!(
                num(m, "p50_ms") > 0.0 && num(m, "p99_ms") >= num(m, "p50_ms"),
                "{m}"
            );
            assert!(num(m, "cpu_per_write_us") > 0.0, "{m}");
        }
    }
    for run in r["runs"].as_array().unwrap() {
        let res = &run["result"];
        let ops = num(res, "ops");
        // At least one second of load: the rate cannot exceed the count.
        assert!(ops > 0.0 && num(res, "ops_per_sec") <= ops, "{run}");
        assert!(num(&run["cpu"], "servers_s") > 0.0, "{run}");
    }
    // Ratios: the first target's median over each other one's, at each point.
    for ratio in r["ratios"].as_array().unwrap() {
        let pairs = ratio["puts_per_sec"].as_array().unwrap();
        assert_eq!(pairs.len(), targets.len() - 1);
        let at = |t: &str| {
            let m = medians
                .iter()
                .find(|m| {
                    m["target"] == t
                        && m["clients"] == ratio["clients"]
                        && m["value_size_bytes"] == ratio["value_size_bytes"]
                })
                .unwrap();
            num(m, "puts_per_sec")
        };
        for (pair, other) in pairs.iter().zip(&targets[1..]) {
            let expected = at(&targets[0]) / at(other);
            assert!(
                (pair[1].as_f64().unwrap() - expected).abs() < 1e-6 * expected,
                "{pair}"
            );
        }
    }
    let summary = ftkv_bench::summary::Summary::read(out.path()).unwrap();
    assert_eq!(summary.workload, "scaling");
    // Puts/s and CPU per put at the largest client count (no 128 in this grid), per value size.
    assert_eq!(summary.rows.len(), 2 * 2);
    assert!(summary.rows.iter().all(|row| row.metric.contains("4 clients")));
    assert!(summary.rows.iter().all(|row| row.values.len() == targets.len()));
    for v in [100, 1024] {
        assert_svg(out.path(), &format!("scaling_{v}B.svg"), targets.len());
        assert_svg(out.path(), &format!("latency_p99_{v}B.svg"), targets.len());
    }
}
