//! Issue 18: `ftkvctl load` / `Kv.BulkLoad` through a real three-node cluster. All rows of a
//! load become visible together on every node, or none: a malformed line, a duplicate under
//! `--on-duplicate error` and a leader killed mid-load leave nothing of the load visible, and a
//! rerun succeeds. The duplicate modes behave as `REPLACE INTO` and `INSERT IGNORE`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ftkv_client::rows::{begin_value, decode_value, encode_key_field, encode_value_field, ColumnType, Field};
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

const COLUMNS: &str = "id:int,name:str,visits:int,country:str";
const PREFIX: &str = "user_summary/";

/// Row `i` of the generated `user_summary` table (ids shuffled so the input is unsorted).
fn row(i: u64) -> (i64, String, i64, &'static str) {
    let id = ((i * 7_919) % 1_000_003) as i64 - 500_000;
    let countries = ["fr", "de", "jp", "br", "us"];
    (
        id,
        format!("user {i}, \"quoted\""),
        (i % 977) as i64,
        countries[(i % 5) as usize],
    )
}

fn write_csv(path: &Path, rows: impl Iterator<Item = String>) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for line in rows {
        writeln!(f, "{line}").unwrap();
    }
    f.flush().unwrap();
}

fn csv_line(i: u64) -> String {
    let (id, name, visits, country) = row(i);
    format!("{id},\"{}\",{visits},{country}", name.replace('"', "\"\""))
}

fn key_of(id: i64) -> Vec<u8> {
    let mut k = PREFIX.as_bytes().to_vec();
    encode_key_field(&mut k, ColumnType::Int, id.to_string().as_bytes()).unwrap();
    k
}

fn prefix_end() -> Vec<u8> {
    let mut end = PREFIX.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    end
}

/// Every loaded pair on node `id` (its own state, serializable).
async fn loaded_on(cluster: &Cluster, id: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    cluster
        .scan_node(id, PREFIX.as_bytes(), &prefix_end(), true)
        .await
        .unwrap()
}

async fn load(cluster: &Cluster, file: &Path, extra: &[&str]) -> ftkv_tests::fixture::CtlOutput {
    let file = file.to_str().unwrap();
    let mut args = vec![
        "load",
        file,
        "--columns",
        COLUMNS,
        "--key-columns",
        "id",
        "--prefix",
        PREFIX,
    ];
    args.extend_from_slice(extra);
    cluster.ctl(&args).await.unwrap()
}

fn options() -> ClusterOptions {
    ClusterOptions {
        ctl_timeout: Duration::from_secs(600),
        ..ClusterOptions::default()
    }
}

fn tmp_file(cluster: &Cluster, name: &str) -> PathBuf {
    cluster.dir().join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_is_visible_whole_on_every_node_and_a_bad_line_leaves_nothing() {
    let _serial = serial().await;
    let cluster = Cluster::start(options()).await.unwrap();
    let rows: u64 = std::env::var("FTKV_BULK_TEST_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);

    // A malformed line in the middle: the load fails naming it, and nothing is visible.
    let bad = tmp_file(&cluster, "bad.csv");
    let broken_at = rows / 2;
    write_csv(
        &bad,
        (0..rows).map(|i| {
            if i == broken_at {
                format!("{},x,12z,fr", i)
            } else {
                csv_line(i)
            }
        }),
    );
    let out = load(&cluster, &bad, &[]).await;
    assert!(!out.success(), "a malformed line must fail the load: {out:?}");
    let line = broken_at + 1;
    assert!(
        out.stderr.contains(&format!("line {line}"))
            && out.stderr.contains("column 3 (visits)")
            && out.stderr.contains("not an integer"),
        "the error names the line, the column and the reason: {}",
        out.stderr
    );
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        assert!(
            loaded_on(&cluster, id).await.is_empty(),
            "node {id} shows rows of a failed load"
        );
    }

    // The whole file: every row on every node, with the right columns.
    let good = tmp_file(&cluster, "good.csv");
    write_csv(&good, (0..rows).map(csv_line));
    let out = load(&cluster, &good, &[]).await;
    assert!(out.success(), "load failed: {out:?}");
    assert!(
        out.stdout.contains(&format!(
            "Records: {rows}  Written: {rows}  Replaced: 0  Skipped: 0"
        )),
        "summary: {}",
        out.stdout
    );
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        let pairs = loaded_on(&cluster, id).await;
        assert_eq!(pairs.len() as u64, rows, "node {id}");
        for i in (0..rows).step_by(997) {
            let (key_id, name, visits, country) = row(i);
            let value = pairs
                .get(&key_of(key_id))
                .unwrap_or_else(|| panic!("node {id}: row {i} missing"));
            assert_eq!(
                decode_value(value).unwrap(),
                vec![
                    Field::Bytes(name.into_bytes()),
                    Field::Int(visits),
                    Field::Bytes(country.as_bytes().to_vec())
                ],
                "node {id} row {i}"
            );
        }
    }
    cluster.check_no_panics().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_modes_are_error_replace_and_ignore() {
    let _serial = serial().await;
    let cluster = Cluster::start(options()).await.unwrap();
    let client = cluster.client().await.unwrap();
    // A stored row the loads meet (overlap with existing data).
    client.put(key_of(7), b"stored".to_vec()).await.unwrap();

    let file = tmp_file(&cluster, "dups.csv");
    write_csv(
        &file,
        ["1,first,1,fr", "2,two,2,de", "1,second,3,jp", "3,three,3,us"]
            .map(String::from)
            .into_iter(),
    );
    let out = load(&cluster, &file, &["--on-duplicate", "error"]).await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.contains("duplicate key on lines 1 and 3"),
        "{}",
        out.stderr
    );
    cluster.wait_all_caught_up().await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    assert_eq!(loaded_on(&cluster, leader).await.len(), 1, "only the stored row");

    let out = load(&cluster, &file, &["--on-duplicate", "ignore"]).await;
    assert!(out.success(), "{out:?}");
    assert!(
        out.stdout
            .contains("Records: 4  Written: 3  Replaced: 0  Skipped: 1"),
        "{}",
        out.stdout
    );
    let name =
        |pairs: &BTreeMap<Vec<u8>, Vec<u8>>, id: i64| match decode_value(pairs.get(&key_of(id)).unwrap())
            .unwrap()
            .first()
        {
            Some(Field::Bytes(b)) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("{other:?}"),
        };
    let pairs = loaded_on(&cluster, leader).await;
    assert_eq!(name(&pairs, 1), "first", "INSERT IGNORE keeps the first row");

    // Against existing rows: error names the line whose key exists; replace overwrites.
    let file2 = tmp_file(&cluster, "existing.csv");
    write_csv(
        &file2,
        ["9,nine,9,fr", "7,seven,7,de", "1,again,1,fr"]
            .map(String::from)
            .into_iter(),
    );
    let out = load(&cluster, &file2, &[]).await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.contains("the key of line 3 exists already"),
        "{}",
        out.stderr
    );
    let out = load(&cluster, &file2, &["--on-duplicate", "replace"]).await;
    assert!(out.success(), "{out:?}");
    assert!(
        out.stdout
            .contains("Records: 3  Written: 3  Replaced: 2  Skipped: 0"),
        "{}",
        out.stdout
    );
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        let pairs = loaded_on(&cluster, id).await;
        assert_eq!(pairs.len(), 5, "node {id}: ids 1, 2, 3, 7, 9");
        assert_eq!(
            name(&pairs, 1),
            "again",
            "node {id}: REPLACE INTO keeps the later row"
        );
        assert_eq!(name(&pairs, 7), "seven", "node {id}");
        assert_eq!(name(&pairs, 2), "two", "node {id}");
    }
    cluster.check_no_panics().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_load_leaves_all_or_nothing_and_a_rerun_succeeds() {
    let _serial = serial().await;
    let cluster = Cluster::start(options()).await.unwrap();
    let rows = 300_000u64;
    let file = tmp_file(&cluster, "big.csv");
    write_csv(&file, (0..rows).map(csv_line));
    let leader = cluster.wait_for_leader().await.unwrap();
    let path = file.clone();
    let endpoints = cluster.endpoints().join(",");
    let running = tokio::spawn(async move {
        let file = path.to_str().unwrap().to_string();
        ftkv_tests::fixture::run_ftkvctl(
            &[
                "--endpoints",
                &endpoints,
                "load",
                &file,
                "--columns",
                COLUMNS,
                "--key-columns",
                "id",
                "--prefix",
                PREFIX,
            ],
            None,
            Duration::from_secs(600),
        )
        .await
        .unwrap()
    });
    // FTKV_BULK_KILL_MS moves the kill point (the load of 300k rows takes 3-8 s here).
    let kill_ms = std::env::var("FTKV_BULK_KILL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500);
    tokio::time::sleep(Duration::from_millis(kill_ms)).await;
    cluster.kill(leader).unwrap();
    let out = running.await.unwrap();
    cluster.restart(leader).unwrap();
    if let Err(e) = cluster.wait_all_caught_up().await {
        panic!("{e}; restarted node {leader}:\n{}", cluster.log_tail(leader, 40));
    }
    let mut counts = Vec::new();
    for id in cluster.ids() {
        counts.push(loaded_on(&cluster, id).await.len() as u64);
    }
    assert!(
        counts.iter().all(|&c| c == counts[0]),
        "nodes disagree: {counts:?} (leader {leader} killed; ftkvctl: {out:?})\n{}",
        cluster.log_tails(400)
    );
    if out.success() {
        assert_eq!(counts[0], rows, "the load said done: {out:?}");
    } else {
        assert!(
            counts[0] == 0 || counts[0] == rows,
            "a half-visible load: {counts:?} rows; {out:?}"
        );
        assert!(
            out.stderr.contains("nothing of it was applied") || out.stderr.contains("outcome is unknown"),
            "the failure says whether it applied: {}",
            out.stderr
        );
        if counts[0] == rows {
            assert!(
                out.stderr.contains("outcome is unknown"),
                "a committed load reported as failed: {}",
                out.stderr
            );
        }
    }
    // A rerun succeeds (replace: the first run may have committed).
    let out = load(&cluster, &file, &["--on-duplicate", "replace"]).await;
    assert!(out.success(), "rerun failed: {out:?}");
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        assert_eq!(loaded_on(&cluster, id).await.len() as u64, rows, "node {id}");
    }
    cluster.check_no_panics().unwrap();
    // Nothing leaked: after a clean stop each node's engine has no unreachable node, no staged
    // chunk (of the killed load or the rerun) and no spill file.
    for id in cluster.ids() {
        cluster.stop(id).await.unwrap();
    }
    for id in cluster.ids() {
        let data = cluster.data_dir(id).unwrap();
        let out = std::process::Command::new(&cluster.binaries().node)
            .arg("check")
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(", 0 staged bulk-load chunks"),
            "node {id}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let spill = data.join("engine").join("bulk-tmp");
        let left = std::fs::read_dir(&spill).map(|d| d.count()).unwrap_or(0);
        assert_eq!(left, 0, "node {id}: spill files left in {}", spill.display());
    }
}

/// Row `i` of load `version` as a CSV line and as the pair the model expects.
fn versioned(i: u64, version: u32) -> (String, Vec<u8>, Vec<u8>) {
    let (id, _, visits, country) = row(i);
    let name = format!("v{version} user {i}");
    let mut value = Vec::new();
    begin_value(&mut value);
    encode_value_field(&mut value, ColumnType::Str, name.as_bytes()).unwrap();
    encode_value_field(&mut value, ColumnType::Int, visits.to_string().as_bytes()).unwrap();
    encode_value_field(&mut value, ColumnType::Str, country.as_bytes()).unwrap();
    (format!("{id},{name},{visits},{country}"), key_of(id), value)
}

/// Loads rows `range` as `version` with `mode`, into the cluster and into `model`.
async fn load_into_both(
    cluster: &Cluster,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    range: std::ops::Range<u64>,
    version: u32,
    mode: &str,
) {
    let file = tmp_file(cluster, &format!("v{version}.csv"));
    let rows: Vec<(String, Vec<u8>, Vec<u8>)> = range.map(|i| versioned(i, version)).collect();
    write_csv(&file, rows.iter().map(|r| r.0.clone()));
    let out = load(cluster, &file, &["--on-duplicate", mode]).await;
    assert!(out.success(), "load v{version}: {out:?}");
    for (_, k, v) in rows {
        if mode == "replace" || !model.contains_key(&k) {
            model.insert(k, v);
        }
    }
}

/// Loads beyond the node's memory (a 2 MiB cache, 1 MiB of sort memory: every load sorts
/// unsorted input through spilled runs) into a range that already holds rows, mixed with
/// puts and deletes: each node ends equal to the model of the same operations applied row by
/// row. The first load meets little data (rebuild path), the later ones more data than they
/// bring (messages path), in both duplicate modes that overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_beyond_memory_into_stored_rows_equal_row_by_row_writes() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions {
        extra_args: ["--cache-size", "2MiB", "--engine-loader-memory-size", "1MiB"]
            .map(String::from)
            .to_vec(),
        ..options()
    })
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for i in (0..120_000u64).step_by(997) {
        let k = key_of(row(i).0);
        model.insert(k.clone(), b"stored before".to_vec());
        client.put(k, b"stored before").await.unwrap();
    }
    load_into_both(&cluster, &mut model, 0..120_000, 1, "replace").await;
    for i in (100_000..110_000u64).step_by(7) {
        let k = key_of(row(i).0);
        model.insert(k.clone(), b"put between".to_vec());
        client.put(k, b"put between").await.unwrap();
    }
    for i in (90_000..100_000u64).step_by(11) {
        let k = key_of(row(i).0);
        model.remove(&k);
        client.delete(k).await.unwrap();
    }
    load_into_both(&cluster, &mut model, 95_000..150_000, 2, "replace").await;
    load_into_both(&cluster, &mut model, 140_000..170_000, 3, "ignore").await;
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        let got = loaded_on(&cluster, id).await;
        assert_eq!(got.len(), model.len(), "node {id}: row count");
        let first_difference = got
            .iter()
            .zip(&model)
            .find(|(g, m)| g != m)
            .map(|(g, m)| format!("got {:?}={:?}, model {:?}={:?}", g.0, g.1, m.0, m.1));
        assert!(first_difference.is_none(), "node {id}: {first_difference:?}");
    }
    cluster.check_no_panics().unwrap();
}
