//! Smoke run of `ftkv-bench beyond-memory`: ftkv and ftkv-sled clusters with a 4 MiB node cache,
//! each node in a 128 MiB memory cgroup, random inserts to 2x the cache, one round; the figures
//! must be present, positive and consistent. Needs root (cgroups), as the bench does.
#![allow(clippy::unwrap_used)]

mod storage_smoke;

#[test]
fn beyond_memory_smoke_run_inserts_every_row_into_confined_nodes() {
    // Three targets of 20 ports each, below the ephemeral range (see ftkv_bench::ports).
    let base_port = ftkv_bench::ports::free_port_block(60).unwrap().to_string();
    let targets = ["ftkv", "ftkv-sled"];
    let out = tempfile::tempdir().unwrap();
    let mut cmd = storage_smoke::bench();
    cmd.args([
        "beyond-memory",
        "--cache-size",
        "4MiB",
        "--data-multiple",
        "2",
        "--runs",
        "1",
    ])
    .args(["--memory-limit", "128MiB", "--clients", "4", "--stall-secs", "30"])
    .args(["--targets", &targets.join(","), "--base-port", &base_port])
    .arg("--out")
    .arg(out.path());
    let stdout = storage_smoke::run(cmd);
    assert!(stdout.contains("rows/s(med)"), "{stdout}");

    let r = storage_smoke::json(out.path(), "results.json");
    let rows = r["rows"].as_u64().unwrap();
    let row_bytes = r["row_bytes"].as_u64().unwrap();
    assert_eq!(row_bytes, 3 + 16 + 100);
    assert!(rows * row_bytes >= 2 * 4 * 1024 * 1024 && (rows - 1) * row_bytes < 2 * 4 * 1024 * 1024);
    let runs = r["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|x| x["target"].as_str().unwrap()).collect();
    assert_eq!(names, targets);
    for run in runs {
        assert_eq!(run["completed"], true, "{run}");
        assert_eq!(run["load"]["rows_acknowledged"].as_u64(), Some(rows), "{run}");
        let per_second: u64 = run["load"]["rows_per_second"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(per_second, rows, "the per-second series adds up to the rows");
        assert!(run["load"]["rows_per_sec"].as_f64().unwrap() > 0.0);
        let keys: Vec<u64> = run["keys_per_node"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_u64().unwrap())
            .collect();
        assert_eq!(keys, vec![rows; 3], "{run}");
        let nodes = run["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 3);
        for n in nodes {
            let peak = n["cgroup_peak_bytes"].as_u64().unwrap();
            assert!(peak > 0 && peak <= 128 << 20, "{n}");
            assert_eq!(n["alive"], true, "{n}");
            // The node runs with the cache asked for.
            assert_eq!(n["cache_capacity_bytes"].as_u64(), Some(4 << 20), "{n}");
        }
        for s in run["sizes"].as_array().unwrap() {
            assert!(
                s["engine_allocated_bytes"].as_u64().unwrap() + s["log_allocated_bytes"].as_u64().unwrap()
                    > 0
            );
        }
    }
    assert_eq!(r["ratios"].as_array().unwrap().len(), 2);
    storage_smoke::assert_summary(out.path(), "beyond-memory", &targets, &targets);
    storage_smoke::assert_svg(out.path(), "beyond_memory.svg", "<polyline");
    storage_smoke::assert_svg(out.path(), "beyond_memory_bars.svg", "<rect");
}
