//! Smoke run of `ftkv-bench compression`: 5,000 `timeline_1009` rows through each three-node
//! cluster (ftkv, ftkv-sled, and etcd when installed), two rounds; the figures must be present,
//! positive and consistent.
#![allow(clippy::unwrap_used)]

mod storage_smoke;

#[test]
fn compression_smoke_run_measures_every_node_of_every_target() {
    // Three targets of 20 ports each, below the ephemeral range (see ftkv_bench::ports).
    let base_port = ftkv_bench::ports::free_port_block(60).unwrap().to_string();
    let mut targets = vec!["ftkv", "ftkv-sled"];
    if storage_smoke::etcd_available() {
        targets.push("etcd");
    }
    let out = tempfile::tempdir().unwrap();
    let rows = 5_000u64;
    let mut cmd = storage_smoke::bench();
    cmd.args([
        "compression",
        "--rows",
        &rows.to_string(),
        "--runs",
        "2",
        "--clients",
        "4",
    ])
    .args(["--targets", &targets.join(","), "--base-port", &base_port])
    .arg("--out")
    .arg(out.path());
    let stdout = storage_smoke::run(cmd);
    assert!(stdout.contains("raw/store"), "{stdout}");

    let r = storage_smoke::json(out.path(), "results.json");
    let raw = rows * (14 + 8 + 18);
    let runs = r["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|x| x["target"].as_str().unwrap()).collect();
    // Two rounds, the targets alternating: A B A B.
    assert_eq!(names, [targets.clone(), targets.clone()].concat());
    for run in runs {
        let load = &run["load"];
        assert_eq!(load["rows_acknowledged"].as_u64(), Some(rows), "{run}");
        assert_eq!(
            load["raw_key_bytes"].as_u64().unwrap() + load["raw_value_bytes"].as_u64().unwrap(),
            raw
        );
        let keys: Vec<u64> = run["keys_per_node"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_u64().unwrap())
            .collect();
        assert_eq!(keys, vec![rows; 3], "{run}");
        let sizes = run["sizes"].as_array().unwrap();
        assert_eq!(sizes.len(), 3);
        for s in sizes {
            let engine = s["engine_allocated_bytes"].as_u64().unwrap();
            let log = s["log_allocated_bytes"].as_u64().unwrap();
            assert!(engine > 0 && log > 0, "{s}");
            assert!(
                s["total_allocated_bytes"].as_u64().unwrap() >= engine + log,
                "{s}"
            );
        }
        assert!(run["raw_over_engine"].as_f64().unwrap() > 0.0);
    }
    for s in r["summary"].as_array().unwrap() {
        assert_eq!(s["raw_bytes"].as_u64(), Some(raw), "{s}");
        assert!(
            s["engine_allocated_bytes"]["median"].as_f64().unwrap() > 0.0,
            "{s}"
        );
    }
    assert_eq!(
        r["ratios"].as_array().unwrap().len(),
        targets.len() * (targets.len() - 1)
    );
    storage_smoke::assert_summary(out.path(), "compression", &targets, &targets);
    storage_smoke::assert_svg(out.path(), "compression.svg", "<rect");
}
