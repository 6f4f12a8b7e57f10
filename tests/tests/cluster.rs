//! Issue 2, acceptance 1 and the operator contract: a three-node cluster of real `ftkv-node`
//! processes serves every client API round trip, linearizable reads after writes from every
//! endpoint, and `ftkvctl`'s JSON outputs carry the documented fields.
//!
//! Needs the binaries: `cargo build --workspace --bins`, then `cargo test -p ftkv-tests`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;

use ftkv_client::{decode_counter, Compare, CompareResult, Op, ScanOptions, Txn, TxnOp, UpsertOp};
use ftkv_proto::v1::{GetRequest, ReadConsistency};
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

fn txn_put(key: &str, value: &str) -> TxnOp {
    TxnOp::Put {
        key: key.into(),
        value: value.into(),
    }
}

fn txn_get(key: &str) -> TxnOp {
    TxnOp::Get { key: key.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_round_trips_on_three_nodes() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();

    // put / get / delete
    assert_eq!(client.get("rt/missing").await.unwrap(), None);
    let put = client.put("rt/a", "alpha").await.unwrap();
    assert!(put.log_index > 0, "a write reports its log index: {put:?}");
    assert_eq!(client.get("rt/a").await.unwrap().as_deref(), Some(&b"alpha"[..]));
    client.put("rt/a", "alpha2").await.unwrap();
    assert_eq!(client.get("rt/a").await.unwrap().as_deref(), Some(&b"alpha2"[..]));
    client.delete("rt/a").await.unwrap();
    assert_eq!(client.get("rt/a").await.unwrap(), None);
    client.delete("rt/never-existed").await.unwrap();

    // write (atomic batch) of 25 keys, then a paged scan with continuation
    let ops: Vec<Op> = (0..25)
        .map(|i| Op::put(format!("scan/{i:03}"), format!("value-{i}")))
        .collect();
    client.write(ops).await.unwrap();
    let mut pages = Vec::new();
    let mut cursor = b"scan/".to_vec();
    loop {
        let page = client.scan(&cursor, b"scan0", 10).await.unwrap();
        assert!(page.kvs.len() <= 10, "page over its limit: {}", page.kvs.len());
        pages.push(
            page.kvs
                .iter()
                .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                .collect::<Vec<_>>(),
        );
        if !page.more {
            break;
        }
        assert!(page.next_start > cursor, "continuation must advance");
        cursor = page.next_start;
        assert!(pages.len() < 10, "scan never ends: {pages:?}");
    }
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![10, 10, 5],
        "pages: {pages:?}"
    );
    let keys: Vec<String> = pages.concat();
    let expected: Vec<String> = (0..25).map(|i| format!("scan/{i:03}")).collect();
    assert_eq!(keys, expected, "scan returns every key once, in order");
    let all = client
        .scan_prefix(
            "scan/",
            0,
            ScanOptions {
                limit: 7,
                ..ScanOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(all.len(), 25);
    assert_eq!(all[3].value, b"value-3");
    let keys_only = client
        .scan_with(
            "scan/",
            "scan0",
            ScanOptions {
                limit: 3,
                keys_only: true,
                ..ScanOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(keys_only.kvs.len(), 3);
    assert!(
        keys_only.kvs.iter().all(|kv| kv.value.is_empty()),
        "keys_only returns empty values"
    );

    // a mixed batch applies atomically and in order
    client
        .write(vec![
            Op::put("batch/x", "1"),
            Op::put("batch/y", "2"),
            Op::delete("batch/x"),
            Op::upsert("batch/counter", UpsertOp::Add(3)),
            Op::upsert("batch/counter", UpsertOp::Add(4)),
            Op::DeleteRange {
                start: b"scan/010".to_vec(),
                end: b"scan/020".to_vec(),
            },
        ])
        .await
        .unwrap();
    assert_eq!(client.get("batch/x").await.unwrap(), None);
    assert_eq!(client.get("batch/y").await.unwrap().as_deref(), Some(&b"2"[..]));
    let counter = client.get("batch/counter").await.unwrap().unwrap();
    assert_eq!(decode_counter(&counter), Some(7));
    let left = client
        .scan_prefix("scan/", 0, ScanOptions::default())
        .await
        .unwrap();
    assert_eq!(left.len(), 15, "range delete removed scan/010..scan/019");
    assert!(left
        .iter()
        .all(|kv| !(b"scan/010".as_slice()..b"scan/020".as_slice()).contains(&kv.key.as_slice())));

    // txn: success branch (value and existence compares)
    client.put("txn/k", "v1").await.unwrap();
    let success = client
        .txn(Txn {
            compares: vec![
                Compare::value("txn/k", CompareResult::Equal, "v1"),
                Compare::exists("txn/k"),
                Compare::absent("txn/nothing"),
                Compare::value("txn/k", CompareResult::Greater, "v0"),
                Compare::value("txn/k", CompareResult::Less, "v2"),
                Compare::value("txn/k", CompareResult::NotEqual, "zzz"),
            ],
            success: vec![txn_put("txn/k", "v2"), txn_get("txn/k"), txn_get("txn/nothing")],
            failure: vec![txn_put("txn/k", "failure-ran")],
        })
        .await
        .unwrap();
    assert!(success.succeeded, "every compare holds: {success:?}");
    assert_eq!(success.results.len(), 3);
    assert!(success.results[1].found);
    assert_eq!(
        success.results[1].value, b"v2",
        "a get sees the put before it in the branch"
    );
    assert!(!success.results[2].found);
    assert_eq!(client.get("txn/k").await.unwrap().as_deref(), Some(&b"v2"[..]));

    // txn: failure branch on a value compare, then on an existence compare
    let failure = client
        .txn(Txn {
            compares: vec![Compare::value("txn/k", CompareResult::Equal, "v1")],
            success: vec![txn_put("txn/k", "success-ran")],
            failure: vec![txn_get("txn/k"), txn_put("txn/failed", "yes")],
        })
        .await
        .unwrap();
    assert!(!failure.succeeded);
    assert_eq!(failure.results.len(), 2);
    assert_eq!(failure.results[0].value, b"v2");
    assert_eq!(client.get("txn/k").await.unwrap().as_deref(), Some(&b"v2"[..]));
    assert_eq!(
        client.get("txn/failed").await.unwrap().as_deref(),
        Some(&b"yes"[..])
    );
    let absent_compare = client
        .txn(Txn {
            compares: vec![Compare::exists("txn/nothing")],
            success: vec![txn_put("txn/wrong", "1")],
            failure: vec![TxnOp::Delete {
                key: b"txn/failed".to_vec(),
            }],
        })
        .await
        .unwrap();
    assert!(!absent_compare.succeeded);
    assert_eq!(client.get("txn/wrong").await.unwrap(), None);
    assert_eq!(client.get("txn/failed").await.unwrap(), None);
    // a value compare on an absent key never matches EQUAL and always matches NOT_EQUAL
    let on_absent = client
        .txn(Txn {
            compares: vec![Compare::value("txn/nothing", CompareResult::NotEqual, "x")],
            success: vec![TxnOp::Upsert {
                key: b"txn/ctr".to_vec(),
                op: UpsertOp::Add(2),
            }],
            failure: vec![],
        })
        .await
        .unwrap();
    assert!(on_absent.succeeded);
    assert_eq!(
        decode_counter(&client.get("txn/ctr").await.unwrap().unwrap()),
        Some(2)
    );

    // upserts: add (with negatives), append, set_if_absent, max
    client.upsert("up/add", UpsertOp::Add(5)).await.unwrap();
    client.upsert("up/add", UpsertOp::Add(-2)).await.unwrap();
    assert_eq!(
        decode_counter(&client.get("up/add").await.unwrap().unwrap()),
        Some(3)
    );
    client
        .upsert("up/append", UpsertOp::Append(b"ab".to_vec()))
        .await
        .unwrap();
    client
        .upsert("up/append", UpsertOp::Append(b"cd".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        client.get("up/append").await.unwrap().as_deref(),
        Some(&b"abcd"[..])
    );
    client
        .upsert("up/sia", UpsertOp::SetIfAbsent(b"first".to_vec()))
        .await
        .unwrap();
    client
        .upsert("up/sia", UpsertOp::SetIfAbsent(b"second".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        client.get("up/sia").await.unwrap().as_deref(),
        Some(&b"first"[..])
    );
    client
        .upsert("up/max", UpsertOp::Max(b"b".to_vec()))
        .await
        .unwrap();
    client
        .upsert("up/max", UpsertOp::Max(b"a".to_vec()))
        .await
        .unwrap();
    assert_eq!(client.get("up/max").await.unwrap().as_deref(), Some(&b"b"[..]));
    client
        .upsert("up/max", UpsertOp::Max(b"c".to_vec()))
        .await
        .unwrap();
    assert_eq!(client.get("up/max").await.unwrap().as_deref(), Some(&b"c"[..]));

    // delete range
    for i in 1..=5 {
        client.put(format!("dr/{i}"), "x").await.unwrap();
    }
    client.delete_range("dr/2", "dr/4").await.unwrap();
    let remaining: Vec<Vec<u8>> = client
        .scan_prefix("dr/", 0, ScanOptions::default())
        .await
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(
        remaining,
        vec![b"dr/1".to_vec(), b"dr/4".to_vec(), b"dr/5".to_vec()]
    );

    cluster.check_no_panics().unwrap();
}

/// A write through any endpoint is visible to a linearizable read through a client of every
/// single endpoint at once. Asked directly (raw gRPC), each node serves the read itself with
/// fresh data or redirects it to the leader (`FAILED_PRECONDITION` naming the leader): never
/// stale data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_read_after_write_from_every_endpoint() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let ids = cluster.ids();
    let leader = cluster.wait_for_leader().await.unwrap();
    let mut served_locally = std::collections::BTreeSet::new();
    let mut redirected = std::collections::BTreeSet::new();
    let mut clients = BTreeMap::new();
    for &id in &ids {
        clients.insert(id, cluster.client_for(id).await.unwrap());
    }
    for round in 0..3 {
        for &writer in &ids {
            let key = format!("lin/{writer}");
            let value = format!("round-{round}-by-{writer}");
            clients[&writer].put(&key, &value).await.unwrap();
            for &reader in &ids {
                let read = clients[&reader].get(&key).await.unwrap();
                assert_eq!(
                    read.as_deref(),
                    Some(value.as_bytes()),
                    "round {round}: node {reader} missed a write made through node {writer}"
                );
                // The node itself either serves the read (fresh data, its own header) or
                // redirects it to the leader; it never answers with stale data.
                let mut raw = cluster.kv_raw(reader).await.unwrap();
                let request = GetRequest {
                    key: key.clone().into_bytes(),
                    consistency: ReadConsistency::Linearizable as i32,
                };
                match raw.get(request).await {
                    Ok(response) => {
                        let response = response.into_inner();
                        assert!(response.found, "node {reader} itself: key {key} missing");
                        assert_eq!(
                            response.value,
                            value.as_bytes(),
                            "node {reader} served stale data"
                        );
                        let header = response.header.expect("response header");
                        assert_eq!(header.node_id, reader, "the read was served by node {reader}");
                        served_locally.insert(reader);
                    }
                    Err(status) => {
                        assert_eq!(
                            status.code(),
                            tonic::Code::FailedPrecondition,
                            "node {reader}: {status:?}"
                        );
                        assert!(
                            status.message().contains(&cluster.endpoint(leader).unwrap()),
                            "a redirect names the leader's endpoint: {status:?}"
                        );
                        redirected.insert(reader);
                    }
                }
            }
        }
    }
    eprintln!("raw linearizable reads: served by nodes {served_locally:?}, redirected by {redirected:?}");
    assert!(
        served_locally.contains(&leader),
        "the leader serves linearizable reads itself"
    );
    cluster.check_no_panics().unwrap();
}

/// Contract: `ftkvctl -w json endpoint status --cluster` and `ftkvctl -w json bench put`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ftkvctl_json_contract() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();

    let out = cluster
        .ctl(&["-w", "json", "endpoint", "status", "--cluster"])
        .await
        .unwrap();
    assert!(out.success(), "endpoint status failed: {out:?}");
    let statuses: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|error| panic!("endpoint status is not JSON ({error}): {}", out.stdout));
    let statuses = statuses
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {statuses}"));
    assert_eq!(statuses.len(), 3, "one entry per node: {statuses:?}");
    let mut ids = Vec::new();
    for status in statuses {
        for field in [
            "id",
            "endpoint",
            "is_leader",
            "leader_id",
            "term",
            "commit_index",
            "applied_index",
            "engine",
        ] {
            assert!(status.get(field).is_some(), "field {field} missing in {status}");
        }
        let id = status["id"].as_u64().expect("id is a number");
        ids.push(id);
        assert_eq!(
            status["endpoint"].as_str(),
            Some(cluster.endpoint(id).unwrap().as_str()),
            "{status}"
        );
        assert_eq!(status["leader_id"].as_u64(), Some(leader), "{status}");
        assert_eq!(status["is_leader"].as_bool(), Some(id == leader), "{status}");
        assert!(status["term"].as_u64().is_some_and(|term| term >= 1), "{status}");
        assert!(status["commit_index"].as_u64().is_some(), "{status}");
        assert!(status["applied_index"].as_u64().is_some(), "{status}");
        let engine = status["engine"].as_str().expect("engine is a string");
        assert!(engine == "fractal" || engine == "sled", "engine {engine}");
    }
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3]);

    let out = cluster
        .ctl(&["-w", "json", "bench", "put", "--clients", "4", "--duration", "2s"])
        .await
        .unwrap();
    assert!(out.success(), "bench failed: {out:?}");
    let bench: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|error| panic!("bench stdout is not one JSON object ({error}): {}", out.stdout));
    assert!(bench.is_object(), "{bench}");
    let ops = bench["ops"]
        .as_u64()
        .unwrap_or_else(|| panic!("ops missing: {bench}"));
    assert!(ops > 0, "bench acknowledged nothing: {bench}");
    assert!(
        bench["ops_per_sec"].as_f64().is_some_and(|rate| rate > 0.0),
        "{bench}"
    );
    assert_eq!(bench["errors"].as_u64(), Some(0), "{bench}");
    let latency = &bench["latency_ms"];
    for field in ["min", "avg", "p50", "p95", "p99", "max"] {
        assert!(
            latency[field].as_f64().is_some(),
            "latency_ms.{field} missing: {bench}"
        );
    }
    let ordered: Vec<f64> = ["min", "p50", "p95", "p99", "max"]
        .iter()
        .map(|f| latency[*f].as_f64().unwrap_or(f64::NAN))
        .collect();
    assert!(
        ordered.windows(2).all(|pair| pair[0] <= pair[1]),
        "percentiles out of order: {latency}"
    );
    eprintln!("bench put --clients 4 --duration 2s: {bench}");

    // CLI round trip in simple output.
    let out = cluster.ctl(&["put", "cli/key", "cli-value"]).await.unwrap();
    assert!(out.success(), "{out:?}");
    let out = cluster.ctl(&["get", "cli/key"]).await.unwrap();
    assert!(out.success(), "{out:?}");
    assert!(out.stdout.contains("cli-value"), "get printed {:?}", out.stdout);
    let out = cluster.ctl(&["get", "cli/absent-key"]).await.unwrap();
    assert!(!out.stdout.contains("cli-value"), "{out:?}");
    cluster.check_no_panics().unwrap();
}

/// The fixture itself: SIGTERM is a clean shutdown (exit 0), pause/resume and restart work,
/// and dropping the cluster leaves no process behind, paused ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_lifecycle_leaves_no_process_behind() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    client.put("life/k", "v").await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();

    let status = cluster.stop(follower).await.unwrap();
    assert!(
        status.success(),
        "SIGTERM should shut node {follower} down cleanly, got {status}"
    );
    assert!(!cluster.is_running(follower));
    cluster.restart(follower).unwrap();
    assert_eq!(cluster.starts(follower), 2);
    client.put("life/k", "v2").await.unwrap();
    let index = cluster.wait_all_caught_up().await.unwrap();
    let local = cluster
        .scan_node(follower, b"life/", b"life0", true)
        .await
        .unwrap();
    assert_eq!(
        local.get(b"life/k".as_slice()).map(Vec::as_slice),
        Some(&b"v2"[..]),
        "at index {index}"
    );

    cluster.pause(follower).unwrap();
    assert!(cluster.is_paused(follower));
    client.put("life/k", "v3").await.unwrap(); // a quorum remains
    cluster.resume(follower).unwrap();
    cluster.wait_all_caught_up().await.unwrap();

    let pids: Vec<u32> = cluster
        .ids()
        .into_iter()
        .filter_map(|id| cluster.pid(id))
        .collect();
    assert_eq!(pids.len(), 3);
    cluster.pause(follower).unwrap();
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived the cluster"
        );
    }
    if std::env::var_os("FTKV_KEEP_TEST_DIR").is_none() {
        assert!(
            !dir.exists(),
            "the cluster folder {} was not removed",
            dir.display()
        );
    }
}
