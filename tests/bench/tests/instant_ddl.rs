//! Smoke run of `ftkv-bench instant-ddl`: 2,000 keys per range through ftkv (and etcd when
//! installed), two rounds: the broadcast upsert reaches every key on every node, and after the
//! DeleteRange and the one-by-one deletes no node holds a key.
#![allow(clippy::unwrap_used)]

mod storage_smoke;

#[test]
fn instant_ddl_smoke_run_leaves_no_key_on_any_node() {
    // Three targets of 20 ports each, below the ephemeral range (see ftkv_bench::ports).
    let base_port = ftkv_bench::ports::free_port_block(60).unwrap().to_string();
    let mut targets = vec!["ftkv"];
    if storage_smoke::etcd_available() {
        targets.push("etcd");
    }
    let keys = 2_000u64;
    let out = tempfile::tempdir().unwrap();
    let mut cmd = storage_smoke::bench();
    cmd.args([
        "instant-ddl",
        "--keys",
        &keys.to_string(),
        "--runs",
        "2",
        "--delete-clients",
        "16",
    ])
    .args(["--targets", &targets.join(","), "--base-port", &base_port])
    .arg("--out")
    .arg(out.path());
    let stdout = storage_smoke::run(cmd);
    assert!(stdout.contains("DeleteRange ack/vis"), "{stdout}");

    let r = storage_smoke::json(out.path(), "results.json");
    let runs = r["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|x| x["target"].as_str().unwrap()).collect();
    // Two rounds, the targets alternating: A B A B.
    assert_eq!(names, [targets.clone(), targets.clone()].concat());
    let u64s = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_u64().unwrap())
            .collect()
    };
    for run in runs {
        assert_eq!(u64s(&run["keys_per_node"]), vec![keys; 3], "{run}");
        assert_eq!(
            u64s(&run["keys_left_per_node"]),
            vec![0; 3],
            "reads after the deletes see nothing: {run}"
        );
        let dr = &run["delete_range"];
        let (ack, vis) = (dr["ack_ms"].as_f64().unwrap(), dr["visible_ms"].as_f64().unwrap());
        assert!(ack > 0.0 && vis >= ack, "{run}");
        if run["target"] == "ftkv" {
            assert_eq!(u64s(&run["upserted_per_node"]), vec![keys; 3], "{run}");
            for op in ["upsert_range", "one_by_one"] {
                let t = &run[op];
                assert!(t["ack_ms"].as_f64().unwrap() > 0.0, "{run}");
                assert!(
                    t["visible_ms"].as_f64().unwrap() >= t["ack_ms"].as_f64().unwrap(),
                    "{run}"
                );
            }
        } else {
            assert_eq!(run["etcd_deleted"].as_u64(), Some(keys), "{run}");
            assert!(run["one_by_one"].is_null());
        }
    }
    let s = storage_smoke::assert_summary(out.path(), "instant-ddl", &targets, &["ftkv"]);
    assert_eq!(s["rows"].as_array().unwrap().len(), 6);
    storage_smoke::assert_svg(out.path(), "instant_ddl.svg", "<rect");
}
